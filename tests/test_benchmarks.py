"""Every figure in docs/performance.md comes from a script in benchmarks/: each still runs.

The benchmarks call the detector's and the pipeline's inner functions, which change with the
code; nothing else imports them, so a changed signature broke one silently once
(`benchmarks/regression/speed.py` unpacked two values of `_levels`, which returns three, for
sessions). Each script that needs no server, cluster or serving venv runs here in its
smallest mode, as a user runs it (a subprocess from the repository root), and must exit 0
with figures printed. The ones left out need what the suite's other tests start for
themselves (an S3 server, the serving venv, whole command lines) or take minutes at any size
(`families_run.py` tunes over a grid); they are run, at full size, when their figures are
taken.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

QUICK = {
    "regression/speed.py": ["--repeat", "1", "--lengths", "60,300"],
    "regression/long_probe.py": ["--count", "1"],
    "regression/ensemble.py": ["--count", "1"],
    "regression/blas_threads.py": ["--repeat", "1", "--busy", "1", "--runs", "120"],
    "regression/run.py": ["--per-category", "1", "--seq-series", "1", "--no-anchors"],
    "regression/external_probe.py": [],  # exits 0 saying so when its data is not beside
    "curve_judge.py": ["--runs", "30", "--repeat", "1"],
    "energy_sampler.py": ["--samples", "50"],
    "gpu_local.py": ["--preset", "light", "--max-steps", "1"],  # its CPU leg only, here
    "fanout.py": ["--users", "2", "--scenario-s", "0.05", "--repeat", "1"],
    "analysis_parse.py": ["--dirs", "20", "--log-mb", "0.01", "--rows", "1000", "--repeat", "1"],
}
NOT_RUN_HERE = {
    "analysis_bounds.py": "10 000 dirs and a 2 GB log at its size; its small sizes are the "
                          "pipeline tests' own",
    "export_s3.py": "needs an S3 server (tests/tasks/publish starts one for their own)",
    "flow_overhead.py": "whole flows through Prefect (the e2e tests run them)",
    "llm_serving.py": "the serving venv and a vLLM server (the e2e serving tests)",
    "main_job.py": "whole command lines (the e2e CLI tests)",
    "openmp_wait.py": "a whole command line, then trainers beside busy loops",
    "prometheus_overhead.py": "whole command lines with and without Prometheus",
    "prefect_api_start.py": "real Prefect servers, two a run (tests/flows/test_local_api.py "
                            "starts the same two, a migrated and a seeded one)",
    "regression/families_run.py": "its tuning grid takes ~30 s even at one series a family",
    "regression/anchors.py": "a helper the regression benchmark calls with arguments",
    "regression/families.py": "the families' generator (imported by the scripts above)",
    "regression/generate.py": "the categories' generator (imported by run.py)",
}


def test_every_benchmark_is_run_here_or_says_why_not() -> None:
    scripts = {str(p.relative_to(REPO / "benchmarks")) for p in
               (REPO / "benchmarks").rglob("*.py") if p.name != "__init__.py"}
    assert scripts == set(QUICK) | set(NOT_RUN_HERE), (
        "a benchmark is neither run by this test nor listed with its reason: "
        f"{sorted(scripts ^ (set(QUICK) | set(NOT_RUN_HERE)))}")


@pytest.mark.parametrize("script", sorted(QUICK))
def test_a_benchmark_runs_in_its_smallest_mode(script: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *QUICK[script]],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip(), f"{script} printed no figure"


def test_the_accelerator_figures_are_the_training_steps_own() -> None:
    """`gpu_local.py`'s accelerator leg cannot run here (no CUDA device): its NVML figures
    are checked on rows in the recorder's form — a board using 300 W at 50 % from t0 to
    t0 + 10 s, training from t0 + 2 to t0 + 8 at 1 000 tokens/s — whose window is the
    trainer's, not the process's."""
    import importlib.util
    import json
    from datetime import UTC, datetime, timedelta

    spec = importlib.util.spec_from_file_location("gpu_local", REPO / "benchmarks" /
                                                  "gpu_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t0 = datetime(2026, 12, 8, tzinfo=UTC)
    labels = json.dumps({"gpu": "0", "name": "H100"}, sort_keys=True)
    rows = []
    for i in range(41):  # every 0.25 s, as the recorder samples
        at = t0 + timedelta(seconds=i * 0.25)
        rows += [{"query": "gpu_energy_joules", "labels": labels, "timestamp": at,
                  "value": 5000.0 + 300.0 * i * 0.25},
                 {"query": "gpu_util_percent", "labels": labels, "timestamp": at,
                  "value": 50.0 if 2 <= i * 0.25 <= 8 else 0.0},
                 {"query": "gpu_memory_used_bytes", "labels": labels, "timestamp": at,
                  "value": float(2 * 2**30 if 2 <= i * 0.25 <= 8 else 2**28)}]
    summary = {"train_start": (t0 + timedelta(seconds=2)).timestamp(),
               "train_end": (t0 + timedelta(seconds=8)).timestamp(),
               "train_runtime": 6.0, "train_tokens_per_second": 1000.0}
    figures = module.gpu_figures(rows, summary)
    assert figures == pytest.approx({"energy_j": 1800.0, "power_w_mean": 300.0,
                                     "joules_per_token": 0.3, "util_pct_mean": 50.0,
                                     "memory_gib_max": 2.0})
    assert module.gpu_figures([], summary) == {}


def test_the_device_script_carries_the_locks_own_versions() -> None:
    """`gpu_device.sh` (run on a lent GPU machine) fetches each wheel at the version
    requirements.lock pins: a name the lock no longer holds would stop its `fetch`."""
    import re

    text = (REPO / "benchmarks" / "gpu_device.sh").read_text()
    names = re.search(r"WHEELS=\(([^)]*)\)", text)
    assert names is not None
    def norm(name: str) -> str:
        return name.replace("_", "-").lower()

    pinned = {norm(line.split("==")[0]) for line in
              (REPO / "requirements.lock").read_text().splitlines() if "==" in line}
    wanted = {norm(name) for name in names.group(1).split()}
    assert wanted and wanted <= pinned, sorted(wanted - pinned)
    assert {"pydantic", "transformers", "peft"} <= wanted  # the config's and trainer's own
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_device.sh")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "fetch" in done.stderr and "run" in done.stderr


@pytest.mark.parametrize("args", [["--preset", "no-such-preset"], ["--repeat", "0"],
                                  ["--max-steps", "-3"], ["--max-steps", "nan"]])
def test_the_accelerator_benchmark_refuses_a_wrong_argument_in_one_line(args: list[str]
                                                                        ) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_local.py"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines()[-1].startswith(
        "gpu_local.py: error:"), done.stderr[-2000:]
    assert done.stdout == ""  # nothing measured
