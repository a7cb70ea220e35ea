"""The main job end to end against its own workload: ``./telltale fine_tuning --preset light``.

    python benchmarks/main_job.py [--runs 5] [--api reuse|temporary] [--no-spare] [--fresh]

Runs, alternating, the command line as a user types it (``python -m flows.fine_tuning
--preset light``) and the trainer alone with the same config (the ``config_final.json``
the first run wrote), and prints each one's median, the ratio of the medians (issue #43:
goal <= 1.6x) and the median of every phase of the runs' timelines (``outcome.json``).

The first command-line run starts the local Prefect API the others share (``--api reuse``,
the default; its own Prefect home, stopped at the end): it is reported apart, as "first
run". ``--api temporary`` gives every run a server of its own, as before #43. The runs'
history is a fresh data dir, so their verdicts (and a suspect's re-run) are what a new
user's first runs get.

Each run leaves a spare Prometheus, already scraping, that the next adopts
(`tasks.observe.spare`); ``--no-spare`` sets ``TELLTALE_SPARE_PROMETHEUS_MINUTES=0``, and
every run starts its own. The runs that adopted one are counted.

Each run forks its trainer from the warm Python (`core.warm_python`, the default: torch and
transformers imported; the first run starts it ahead, later runs find it); ``--fresh`` sets
``TELLTALE_WARM_PYTHON_MINUTES=0``: every trainer a fresh interpreter. The runs whose
trainer was forked are counted. The floor stays the trainer alone as a fresh process (what
a user would run by hand). Its own Prefect home holds the warm Python: stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cli(tmp: Path, name: str, env: dict[str, str]) -> tuple[float, Path]:
    run_dir = tmp / name
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                    "--artifact-dir", str(run_dir)], cwd=REPO, env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - start, run_dir


def _trainer(config: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "projects.fine_tuning.workload.train_local",
                    str(config)], cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _trainer_config(run_dir: Path, tmp: Path) -> Path:
    """The run's trainer config, writing its output to a scratch dir of the benchmark."""
    source = next(run_dir.glob("*__cell/*__run_fine_tuning_job/src/config_final.json"))
    config = json.loads(source.read_text())
    config["output_dir"] = str(tmp / "trainer-output")
    target = tmp / "config_final.json"
    target.write_text(json.dumps(config))
    return target


def _spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):6.2f} s  (min {min(values):.2f}, "
            f"max {max(values):.2f}, n={len(values)})")


def main() -> int:
    """Measure and print; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--api", choices=["reuse", "temporary"], default="reuse")
    parser.add_argument("--no-spare", action="store_true",
                        help="no spare Prometheus: every run starts its own")
    parser.add_argument("--fresh", action="store_true",
                        help="no warm Python: every trainer a fresh interpreter")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="telltale-main-job-") as scratch:
        tmp = Path(scratch)
        env = {**os.environ, "TELLTALE_DATA_DIR": str(tmp / "data"),
               "TELLTALE_PREFECT_API": args.api, "TELLTALE_PREFECT_API_HOME": str(tmp / "api"),
               "PREFECT_HOME": str(tmp / "prefect"),
               "TELLTALE_SPARE_PROMETHEUS_MINUTES": "0" if args.no_spare else "10",
               "TELLTALE_WARM_PYTHON_MINUTES": "0" if args.fresh else "10"}
        env.pop("PREFECT_API_URL", None)
        try:
            first, first_dir = _cli(tmp, "run-0", env)
            config = _trainer_config(first_dir, tmp)
            cli, alone, cells, adopted, forked = [], [], [], 0, 0
            phases: dict[str, list[float]] = defaultdict(list)
            for index in range(1, args.runs + 1):
                wall, run_dir = _cli(tmp, f"run-{index}", env)
                cli.append(wall)
                alone.append(_trainer(config, env))
                outcome = json.loads((run_dir / "outcome.json").read_text())
                cells.append(len(outcome["cells"]))
                adopted += (run_dir / "prometheus" / "adopted-spare.json").is_file()
                forked += all(json.loads(p.read_text()).get("launch", "").startswith("forked")
                              for p in run_dir.glob("*__cell/*/artifacts/process.json"))
                summed: dict[str, float] = defaultdict(float)
                for moment in outcome["timeline"]:  # every cell's moments as one phase
                    name = moment["phase"]
                    summed["cells" if name.startswith("cell ") else name] += \
                        moment["seconds"] or 0.0
                for name, seconds in summed.items():
                    phases[name].append(seconds)
        finally:
            subprocess.run([sys.executable, "-m", "flows.local_api", "stop"], cwd=REPO,
                           env=env, capture_output=True, check=False)
    print(f"api: {args.api}; spare prometheus: {'off' if args.no_spare else 'on'} "
          f"(adopted by {adopted} of {len(cli)} runs); warm python: "
          f"{'off' if args.fresh else 'on'} (trainers forked in {forked} of {len(cli)} runs); "
          f"{os.cpu_count()} CPU(s)")
    print(f"first run            {first:6.2f} s" + ("  (starts the shared API)"
                                                    if args.api == "reuse" else ""))
    # a run whose KPI is suspected re-runs its cell at once (the light preset confirms):
    # a second workload in the run, so its ratio to one workload is read on one-cell runs
    single = [wall for wall, count in zip(cli, cells, strict=True) if count == 1]
    print(f"command line         {_spread(cli)}  cells per run {cells}")
    print(f"trainer alone        {_spread(alone)}")
    if single:
        print(f"one-cell runs        {_spread(single)}")
        print(f"ratio (medians)      {statistics.median(single) / statistics.median(alone):6.2f}x"
              "  one-cell runs to the trainer alone (goal <= 1.6x)")
    print("timeline, median seconds per phase (a run's phases sum to its outcome's moment):")
    for name, values in phases.items():
        print(f"  {statistics.median(values):6.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
