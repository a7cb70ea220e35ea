"""Whole-flow runs of fine-tuning on the local platform (real training, real Prefect)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.history import HistoryStore
from projects.library.runs import FORKED
from tests.factories import cli_env, prometheus_required, wait_until

pytestmark = pytest.mark.slow

FAST = {"tests.fine_tuning.test_settings.max_steps": 12,
        "tests.fine_tuning.test_settings.dataset_replication": 1}
# Tests of the verdicts themselves: the suite's other workers make every run here a run on a
# busy machine (rightly invalid, never judged); validity has its own tests.
JUDGED = {**FAST, "analysis.validity.mode": "off",
          # the light preset re-runs a suspect (analysis.confirm_reruns: auto); these tests
          # count cells and verdicts, so only the confirmation tests ask for re-runs
          "analysis.confirm_reruns": 0}


class _Package:
    """A CPU package's RAPL zone (``intel-rapl:0``) drawing ``watts``: its counter advances
    with the clock until stopped (this machine's own is not readable). As in sysfs, one
    file whose content changes: a file replaced at each step would be refused by a reader
    that caught it between its ``lstat`` and its ``open`` (`core.safeio.open_regular`), as
    CI's once was, and the cell would have had no meter at all."""

    def __init__(self, root: Path, watts: float) -> None:
        self.zone = root / "intel-rapl:0"
        self.zone.mkdir(parents=True)
        (self.zone / "name").write_text("package-0\n")
        (self.zone / "max_energy_range_uj").write_text(f"{2**40}\n")
        self.watts, self.began, self.done = watts, time.monotonic(), threading.Event()
        self.fd = os.open(self.zone / "energy_uj", os.O_WRONLY | os.O_CREAT, 0o644)
        self._write()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        # one write of a fixed width at offset 0: never a shorter or an empty read
        value = int((time.monotonic() - self.began) * self.watts * 1e6)
        os.pwrite(self.fd, f"{value:020d}\n".encode(), 0)

    def _run(self) -> None:
        while not self.done.wait(0.02):
            self._write()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        os.close(self.fd)


def test_cli_light_preset_end_to_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # a CPU package at 40 W (RAPL's layout): the energy KPIs over the training steps
    package = _Package(tmp_path / "powercap", 40.0)
    # No wall-clock bound here: the suite must pass on a loaded machine. The light preset's
    # duration is measured in benchmarks/flow_overhead.py and recorded in docs/performance.md.
    try:
        proc = subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                               "--artifact-dir", str(run_dir)], capture_output=True, text=True,
                              env={**cli_env(tmp_path),
                                   "TELLTALE_POWERCAP_ROOT": str(tmp_path / "powercap")},
                              timeout=1200)
    finally:
        package.stop()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # layout
    for name in ("config.yaml", "plan.yaml", "presets_applied", "outcome.json", "report.html"):
        assert (run_dir / name).is_file(), name
    assert (next(run_dir.glob("*__prepare__prepare_local")) / "step.json").is_file()
    cell = next(run_dir.glob("*__cell"))
    job = next(cell.glob("*__fine_tuning__run_fine_tuning_job"))
    assert (cell / "exit_code").read_text().strip() == "0"
    assert (next(cell.glob("*__cluster__capture_environment")) / "machine.json").is_file()
    assert json.loads((job / "src" / "config_final.json").read_text())["peft_method"] == "lora"
    log = (job / "artifacts" / "pod.log").read_text()
    assert "dataset stats:" in log and "'train_runtime'" in log
    assert not (job / "scratch").exists()  # cleanup removed the trainer's scratch dir
    # the default: forked from a warm Python (this command line's, started ahead, or the
    # session's: their keys are alike), and the log says so
    launch = json.loads((job / "artifacts" / "process.json").read_text())["launch"]
    assert launch.startswith("forked from the warm python "), launch
    assert f"s, {launch}" in proc.stdout + proc.stderr  # "base finished: ... in 7.7s, forked..."
    # KPIs parsed from the log this run produced
    post = next(run_dir.glob("*__analysis__postprocess_results"))
    kpis = pd.read_parquet(post / "kpis.parquet").set_index("kpi")["value"]
    for name in ("train_tokens_per_second", "dataset_tokens_per_second", "train_runtime",
                 "train_samples_per_second"):
        assert math.isfinite(kpis[name]) and kpis[name] > 0, name
    # a CPU-only run has no GPU-named KPI (it had "1 GPU" worth of them before)
    assert not [name for name in kpis.index if "gpu" in name], list(kpis.index)
    runtime_in_log = [line for line in log.splitlines() if "'train_runtime'" in line][-1]
    # Compare numbers, not a rounded prefix ('2.2999' formats as '2.3'); values may be quoted.
    logged = float(runtime_in_log.split("'train_runtime':", 1)[1].split(",")[0].strip(" '\""))
    assert math.isclose(kpis["train_runtime"], logged, rel_tol=1e-6)
    assert (post / "report" / "index.html").is_file()
    assert "report    :" in proc.stdout
    # where its seconds went: from the process's start, phase after phase, none left out
    timeline = json.loads((run_dir / "outcome.json").read_text())["timeline"]
    phases = [moment["phase"] for moment in timeline]
    for phase in ("process start", "prefect api", "flow start", "plan", "prepare",
                  "cell base", "post-processing", "cleanup", "outcome written"):
        assert phase in phases, phases
    assert phases[0] == "process start" and timeline[0]["at_s"] == 0.0
    starts = [moment["at_s"] for moment in timeline]
    assert starts == sorted(starts)
    for moment, following in zip(timeline, timeline[1:], strict=False):
        assert moment["seconds"] == pytest.approx(following["at_s"] - moment["at_s"], abs=2e-3)
    # the suite's runs share one local Prefect API (flows.local_api): this one used it
    from flows.local_api import status

    assert status() is not None
    # energy: the package's counter sampled over the cell, integrated over the training steps
    # (the trainer's own bounds in its summary line), not over the process
    energy = pd.read_parquet(next(cell.glob("*__observe__capture_energy")) / "energy"
                             / "series.parquet")
    assert set(energy["query"]) == {"cpu_energy_joules"} and len(energy) >= 2
    assert "'train_start'" in log and "'train_end'" in log
    # 40 W; a loaded machine stalls the counter's writer and shifts the window's edges (a
    # counter in µJ read as J is far outside)
    assert 10.0 < kpis["power_watts_mean"] < 160.0
    # over the steps' own bounds (the trainer's callbacks), not the process's several
    # seconds of imports and data preparation: the energy of its logged runtime
    assert kpis["energy_joules"] == pytest.approx(kpis["power_watts_mean"] * logged, rel=0.25)
    tokens = kpis["train_tokens_per_second"] * kpis["train_runtime"]
    assert kpis["joules_per_token"] == pytest.approx(kpis["energy_joules"] / tokens)
    # resources, from the run's real Prometheus and node exporter (observe.prometheus: auto)
    if prometheus_required():
        series = pd.read_parquet(next(cell.glob("*__observe__capture_prometheus"))
                                 / "prometheus" / "series.parquet")
        assert {"cpu_cores_used", "memory_used_bytes"} <= set(series["query"])
        names = ["cpu_cores_used_mean", "cpu_cores_used_max", "memory_used_max",
                 "tokens_per_cpu_core_second"]
        if shutil.which("prometheus-process-exporter"):  # the trainer's own processes
            names += ["workload_cpu_cores_mean", "workload_memory_rss_max"]
        for name in names:
            assert math.isfinite(kpis[name]) and kpis[name] > 0, name
        assert any((run_dir / "prometheus" / "data" / "snapshots").iterdir())
        assert not list((run_dir / "prometheus").rglob("workload.pid"))  # stopped
        # the CLI started it ahead, in a hidden dir next to the run; it moved into the run
        assert (run_dir / "prometheus" / "server" / "prometheus.log").is_file()
        assert not list(run_dir.parent.glob(".prometheus-*"))


def test_successive_runs_build_history_and_verdicts(tmp_path: Path, prefect_harness,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from core.warm_python import WARM_DIR, stop_warm_pythons
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of
    from tasks.observe.spare import ADOPTED_FILE, SPARES_DIR, stop_spares

    # spares of their own (the suite's other worker takes the suite's): each run leaves one,
    # the next adopts it (tasks.observe.spare)
    monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(tmp_path / "services"))
    spares = tmp_path / "services" / SPARES_DIR
    # The light preset's 60 steps, not 12, scraped every 0.5 s, not 2: a process the
    # exporter scraped once has no CPU rate (one run of four then lacked a KPI the others
    # had). A forked 12-step trainer lives ~1.5 s; 120 steps trained in 3.5 s on a quiet
    # moment and, scraped every 2 s, once lacked workload_cpu_cores_mean (240 steps at 2 s
    # made this test 139 s of the suite).
    overrides = {**JUDGED, "tests.fine_tuning.test_settings.max_steps": 60,
                 "observe.prometheus.scrape_interval_s": 0.5,
                 "analysis.history_uri": str(tmp_path / "history")}
    outcomes = []
    try:
        # four runs forked from the warm Python, then one with TELLTALE_WARM_PYTHON_MINUTES=0
        # (a fresh process): the launch is a label, so the fifth run is another configuration
        for i, minutes in enumerate(("10", "10", "10", "10", "0")):
            monkeypatch.setenv("TELLTALE_WARM_PYTHON_MINUTES", minutes)
            outcomes.append(outcome_of(fine_tuning(
                presets=["light"], overrides=overrides, artifact_dir=str(tmp_path / f"run{i}"),
                return_state=True)))
            if prometheus_required() and i < 3:  # a condition, not a sleep: the spare is ready
                wait_until(lambda: any((d / "spare.json").exists() for d in spares.glob("*/")),
                       "a spare left by the run")
        warm = [json.loads(p.read_text()) for p in
                (tmp_path / "services" / WARM_DIR).glob("*/warm.json")]
    finally:
        stop_spares(spares)
        stopped = stop_warm_pythons(tmp_path / "services")
    assert all(o.exit_code == 0 for o in outcomes), [o.failures for o in outcomes]
    # the first run started the warm Python in its prepare; every run forked from it but the
    # fifth; it still served after the runs
    assert len(warm) == 1 and stopped == [warm[0]["pid"]]
    jobs = [next((tmp_path / f"run{i}").glob("*__cell/*__fine_tuning__run_fine_tuning_job"))
            for i in range(5)]
    assert [json.loads((j / "artifacts" / "process.json").read_text())["launch"]
            for j in jobs] == [f"forked from the warm python {warm[0]['pid']}"] * 4 + [
        "fresh process"]
    for job in jobs[3:]:  # a forked trainer trains as a fresh one: its summary line
        assert "'train_runtime'" in (job / "artifacts" / "pod.log").read_text()
        assert not (job / "scratch").exists()  # cleanup removed its scratch dir
    tables = [pd.read_parquet(next((tmp_path / f"run{i}").glob("*__analysis__*/kpis.parquet")))
              for i in (0, 4)]
    assert [set(t["launch"]) for t in tables] == [{"forked"}, {""}]
    # the fresh run is the first of its own configuration in the same history
    assert outcomes[4].history_note == (
        "verdicts start with the 4th comparable run: 3 more run(s) of this configuration")
    outcomes = outcomes[:4]
    if prometheus_required():  # the first run started its own; each later one adopted one
        assert [(tmp_path / f"run{i}" / "prometheus" / ADOPTED_FILE).is_file()
                for i in range(4)] == [False, True, True, True]
        assert all((tmp_path / f"run{i}" / "prometheus" / "data").is_dir() for i in range(4))
    # 5 workload KPIs (a CPU-only run has no GPU-named ones), and the resource KPIs where
    # the run had its Prometheus: every KPI not ignored for regression is judged
    first = pd.read_parquet(next((tmp_path / "run0").glob("*__analysis__postprocess_results")) / "kpis.parquet")
    judged_names = set(first.loc[~first["ignored_for_regression"], "kpi"])
    assert {"train_tokens_per_second", "dataset_tokens_per_second", "train_samples_per_second",
            "train_steps_per_second", "train_runtime"} <= judged_names
    assert not any("gpu" in name for name in judged_names)
    if prometheus_required():
        assert {"cpu_cores_used_mean", "cpu_cores_used_max", "memory_used_max"} <= judged_names
    judged = len(judged_names)
    assert outcomes[0].verdict_counts == {"insufficient_history": judged}
    # one plotly.js on disk for the five reports (hard links from the runs root's .telltale/):
    # each report dir still holds it (offline, exported), the disk holds it once
    copies = [next((tmp_path / f"run{i}").glob("*__analysis__*/report/plotly.min.js"))
              for i in range(5)]
    assert len({c.stat().st_ino for c in copies}) == 1
    assert copies[0].stat().st_nlink == 6  # five reports + the shared copy
    assert list((tmp_path / ".telltale").glob("plotly-*.min.js"))
    # runs 1 to 3 say when verdicts start (the 4th run, min_history 3); the 4th is judged
    assert [o.history_note for o in outcomes] == [
        f"verdicts start with the 4th comparable run: {n} more run(s) of this configuration"
        for n in (3, 2, 1)] + [None]
    last = outcomes[-1].verdict_counts
    assert last.get("insufficient_history", 0) == 0 and sum(last.values()) == judged
    history = pd.read_parquet(tmp_path / "history")
    assert history["run_uuid"].nunique() == 5  # the fresh run too
    # each run as the terminal named it: its cell ("base") and its flow run's id
    from analysis.listing import run_lines

    assert set(history["cell"]) == {"base"}
    assert all(f" {str(run_id)[:8]} base " in "\n".join(run_lines(history))
               for run_id in history["run_id"].unique())
    verdicts = json.loads(next((tmp_path / "run3").glob("*__analysis__*/regression.json"))
                          .read_text())
    assert all(v["history_used"] >= 3 for v in verdicts)


def _earlier_runs(tmp_path: Path, count: int, *, better: float, spread: float,
                  seed: int, warm_up: bool = False) -> None:
    """A real light run (``run0``), then ``count`` earlier runs of its configuration in
    ``tmp_path/history``: its KPIs ``better`` times better, ``spread`` apart (log-normal).

    ``warm_up``: a run before it, not used (a process's first training ran ~40 % slower
    than the next ones: a level for later runs to be compared with must come after it).
    """
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    for name in (["warm", "first"] if warm_up else ["first"]):
        first = outcome_of(fine_tuning(presets=["light"], overrides={
            **JUDGED, "analysis.history_uri": str(tmp_path / name)},
            artifact_dir=str(tmp_path / f"run0-{name}"), return_state=True))
        assert first.exit_code == 0, first.failures
    rows = pd.read_parquet(tmp_path / "first")
    rng = np.random.default_rng(seed)
    fakes = []
    for i in range(count):
        fake = rows.copy()
        factor = np.where(fake["lower_better"], 1 / better, better)
        fake["value"] = fake["value"] * factor * np.exp(rng.normal(0, spread, len(fake)))
        fake["run_uuid"] = f"earlier-{i}"
        fake["timestamp"] = fake["timestamp"] - pd.Timedelta(days=10 - i)
        fakes.append(fake)
    HistoryStore(str(tmp_path / "history")).bulk_append(pd.concat(fakes, ignore_index=True))


def test_a_suspected_regression_is_rerun_and_judged_with_its_repeat(
        tmp_path: Path, prefect_harness) -> None:
    """``analysis.confirm_reruns``: the newest run (the 9th of its configuration) alone is
    far slower than its history — a suspect —, so the flow re-runs the cell at once and the
    two runs are judged together: a regression confirmed *on that run* (since_runs 1)."""
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    # Eight earlier runs of the same configuration, 1000x better than this machine does:
    # beyond anything load can do to a run. Load moves these short trainings a lot: a loaded
    # CI slowed run0 ~1.5x against the re-run (a 1.5x history then hid the regression), and
    # in another, run0 ran 10x slower than the runs after it, so a 6x history was *worse*
    # than them and the verdict an improvement.
    _earlier_runs(tmp_path, 8, better=1000, spread=0.01, seed=0)

    outcome = outcome_of(fine_tuning(presets=["light"], overrides={
        **JUDGED, "analysis.history_uri": str(tmp_path / "history"),
        "analysis.confirm_reruns": 1}, artifact_dir=str(tmp_path / "run"), return_state=True))
    assert outcome.exit_code == 0, outcome.failures
    assert [c.name for c in outcome.cells] == ["base", "base~rerun1"]
    cells = sorted((tmp_path / "run").glob("*__cell"))
    original = (cells[0] / ".uuid").read_text().strip()
    assert (cells[1] / ".repeat_of").read_text().strip() == original
    verdicts = json.loads(next((tmp_path / "run").glob("*__analysis__*/regression.json"))
                          .read_text())
    tokens = [v for v in verdicts if v["kpi"] == "train_tokens_per_second"]
    assert len(tokens) == 2 and all(len(v["repeats"]) == 2 for v in tokens)
    # Judged together: a regression confirmed by both repeats. On a loaded machine the two
    # runs can differ several-fold (seen in CI under load); the detector then says that they
    # do not agree, which is the right answer too, and still a joint judgement.
    assert all((v["verdict"] == "regression" and "2 repeats" in v["explanation"]
                and v["since_runs"] == 1) or
               (v["verdict"] == "no_change" and "2 repeats" in v["explanation"] and
                "do not agree" in v["explanation"]) for v in tokens), \
        [(v["verdict"], v["explanation"]) for v in tokens]
    # the confirmed regression is one line of the terminal's findings
    assert any(line.startswith("regression  train_tokens_per_second (base)")
               for line in outcome.findings) or tokens[0]["verdict"] == "no_change"
    index = next((tmp_path / "run").glob("*__analysis__*/report/index.html")).read_text()
    assert "regression" in index
    # what the regression automation is told (flows.events): one line per regressed KPI
    regressed = [v for v in verdicts if v["verdict"] == "regression"]
    assert len(outcome.regressions) == len(regressed)
    assert all(line.startswith(f"{v['kpi']} (") for line, v in zip(
        outcome.regressions, regressed, strict=True))


def _hog_while(cell_done: Path, stop: threading.Event, hogs: int = 4) -> None:
    """Busy processes (a noisy neighbour) until ``cell_done`` exists or ``stop`` is set.

    All on the first CPU: the trainer's threads sync every step, so one crowded core slows
    it 2-4x, and the suite's other worker keeps the other core (eight hogs on every core
    starved its temporary Prefect APIs past their 60 s start).
    """
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              preexec_fn=lambda: os.sched_setaffinity(0, {0}))
             for _ in range(hogs)]
    try:
        while not stop.is_set() and not list(cell_done.parent.glob(cell_done.name)):
            stop.wait(0.05)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_one_off_slow_run_is_rerun_and_dismissed_as_an_outlier(
        tmp_path: Path, prefect_harness) -> None:
    """A noisy neighbour slows the first run of a cell only: its KPIs are suspects, the flow
    re-runs the cell at once (the neighbour gone), and the pair is judged an ``outlier`` —
    shown, never a regression nor a baseline breaker."""
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    # Eight earlier runs at this machine's own level, 8 % apart: the re-run lands within
    # ~20 % of them (what the pair's verdict tolerates), the slowed run ~2-4x below them
    # (four busy processes on the first core; 1.4x is enough to be suspected)
    _earlier_runs(tmp_path, 8, better=1, spread=0.08, seed=1, warm_up=True)
    run = tmp_path / "run"
    stop = threading.Event()
    # the neighbour arrives with the first cell's dir and leaves when its exit code is written
    # (before the flow even looks for suspects): only that run is slowed
    watcher = threading.Thread(target=lambda: (
        _wait_for_glob(run, "001__cell", stop),
        _hog_while(run / "001__cell" / "exit_code", stop)), daemon=True)
    watcher.start()
    try:
        outcome = outcome_of(fine_tuning(presets=["light"], overrides={
            **JUDGED, "analysis.history_uri": str(tmp_path / "history"),
            "analysis.confirm_reruns": 1}, artifact_dir=str(run), return_state=True))
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert outcome.exit_code == 0, outcome.failures
    verdicts = json.loads(next(run.glob("*__analysis__*/regression.json")).read_text())
    if [c.name for c in outcome.cells] == ["base"]:
        # A loaded machine (the suite's other worker) slowed the runs the level was read
        # from as much as the neighbour slowed this one: nothing was out of line, so nothing
        # was re-run — and then no KPI may be left a suspect (a suspect is always re-run)
        assert not [v for v in verdicts if v["verdict"] == "suspect"], verdicts
        return
    assert [c.name for c in outcome.cells] == ["base", "base~rerun1"]
    tokens = [v for v in verdicts if v["kpi"] == "train_tokens_per_second"]
    assert len(tokens) == 2 and all(len(v["repeats"]) == 2 for v in tokens)
    slowed, again = tokens[0]["repeats"]
    from analysis.regression import verdict

    earlier = pd.read_parquet(tmp_path / "history").query(
        "kpi == 'train_tokens_per_second'").sort_values("timestamp")
    earlier = earlier[~earlier["run_uuid"].isin([v["run_uuid"] for v in tokens])]
    # Whatever the machine's load did to the two runs, the flow judged exactly the numbers it
    # measured, together, against the history it read: the same verdict as the analysis
    # gives them (load has moved the re-run 28 % above the level, and a slowed run barely
    # out of line: each gives its own right answer, and this is the one check of them all)
    expected = verdict(list(earlier["value"]), [slowed, again], "higher_better")
    assert all(v["verdict"] == expected.kind for v in tokens), [
        (v["verdict"], v["explanation"], expected.explanation) for v in tokens]
    level = float(np.median(earlier["value"]))
    if (verdict(list(earlier["value"]), slowed, "higher_better").kind == "suspect"
            and abs(math.log(again / level)) <= 0.2):
        # The case this test is for: the slowed run was out of line and the re-run is back
        # at the machine's level, so the slowed run was a one-off
        assert expected.kind == "outlier", expected.explanation
    if expected.kind == "outlier":
        assert "1 re-run(s)" in tokens[0]["explanation"]
        # (other KPIs are judged on their own: the resource KPIs of a first run in a process
        # differ from the later runs' for reasons of their own, and may be confirmed changes)
        assert not [line for line in outcome.regressions
                    if line.startswith("train_tokens_per_second ")]
        assert any(line.startswith("outlier") and "train_tokens_per_second" in line
                   for line in outcome.findings)


def _wait_for_glob(root: Path, pattern: str, stop: threading.Event) -> None:
    """Return once ``root`` holds a path matching ``pattern`` (or ``stop`` is set)."""
    while not stop.is_set() and not (root.is_dir() and list(root.glob(pattern))):
        stop.wait(0.05)


def test_failing_cell_does_not_stop_the_matrix_and_cleanup_runs(tmp_path: Path,
                                                                prefect_harness) -> None:
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    overrides = {**FAST, "analysis.history_uri": str(tmp_path / "history"),
                 "tests.fine_tuning.test_extra_settings": [
                     {"hyper_parameters.peft_method": "pt"},  # not supported locally: exits 1
                     {"hyper_parameters.peft_method": "lora"}]}
    outcome = outcome_of(fine_tuning(presets=["light"], overrides=overrides,
                          artifact_dir=str(tmp_path / "run"), return_state=True))
    assert [c.status for c in outcome.cells] == ["failed", "passed"]
    assert outcome.exit_code == 1 and "failed" in outcome.failures[0]
    root = tmp_path / "run"
    first_cell = sorted(root.glob("*__cell"))[0]
    failed_log = (next(first_cell.glob("*__run_fine_tuning_job")) / "artifacts"
                  / "pod.log").read_text()
    assert "not supported locally" in failed_log
    cleanup = next(root.glob("*__cleanup__cleanup"))
    assert json.loads((cleanup / "step.json").read_text())["state"] == "Completed"
    payloads = json.loads(next(root.glob("*__analysis__*/lts_payload.json")).read_text())
    assert [p["metadata"]["status"] for p in payloads] == ["failed", "success"]

    stop = outcome_of(fine_tuning(presets=["light"], overrides={
        **overrides, "tests.fine_tuning.stop_on_error": True},
        artifact_dir=str(tmp_path / "stop"), return_state=True))
    assert [c.status for c in stop.cells] == ["failed", "not_run"]


def test_rerun_into_same_dir_resumes_finished_cells(tmp_path: Path, prefect_harness) -> None:
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    overrides = {**FAST, "analysis.history_uri": str(tmp_path / "history")}
    first = outcome_of(fine_tuning(presets=["light"], overrides=overrides, artifact_dir=str(tmp_path / "r"), return_state=True))
    assert [c.status for c in first.cells] == ["passed"]
    second = outcome_of(fine_tuning(presets=["light"], overrides=overrides, artifact_dir=str(tmp_path / "r"), return_state=True))
    assert [c.status for c in second.cells] == ["resumed"]
    assert len(list((tmp_path / "r").glob("*__cell"))) == 1


def test_missing_dataset_fails_in_prepare_with_exit_2(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                           "--var", "tests.fine_tuning.test_settings.dataset_name=nope.jsonl",
                           "--artifact-dir", str(run_dir)], capture_output=True, text=True,
                          env=cli_env(tmp_path), timeout=1200)
    assert proc.returncode == 2
    assert "error: tests.fine_tuning.test_settings.dataset_name: dataset 'nope.jsonl' not found" \
        in proc.stderr
    # what starts ahead (the warm Python) leaves the user error to the run's check: said once
    assert "warm python" not in proc.stdout + proc.stderr
    assert not list(run_dir.glob("*__cell"))  # nothing ran
    assert list(run_dir.glob("*__cleanup__cleanup"))  # cleanup still did
    assert (run_dir / "config.yaml").is_file()  # what was made is kept


def test_scale_test_preset_fans_out_real_users(tmp_path: Path, prefect_harness) -> None:
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    outcome = outcome_of(fine_tuning(presets=["scale_test"], overrides={
        "tests.fine_tuning.test_settings.dataset_replication": 1,
        "analysis.history_uri": str(tmp_path / "history")}, artifact_dir=str(tmp_path / "run"), return_state=True))
    assert outcome.exit_code == 0, outcome.failures
    assert outcome.cells[0].reason is None
    job = next((tmp_path / "run").glob("*__cell/*__fine_tuning__run_fine_tuning_job"))
    assert sorted(p.name for p in (job / "users").iterdir() if p.is_dir()) == [
        "user-000", "user-001", "user-002", "user-003"]
    timings = [json.loads((job / "users" / f"user-{i:03d}" / "timings.json").read_text())
               for i in range(4)]
    assert min(t["started_at"] for t in timings[2:]) - max(t["released_at"] for t in timings) \
        >= -0.01  # users 2-3 start a stagger step (1 s) after the release
    assert timings[2]["stagger_s"] == 1.0 and timings[0]["stagger_s"] == 0.0
    # each user's trainer forked from the run's warm Python (torch imported once, not four
    # times), and the run is a forked one: another configuration than fresh users'
    assert all(t["launch"].startswith(FORKED) for t in timings), timings
    kpis = pd.read_parquet(next((tmp_path / "run").glob("*__analysis__*/kpis.parquet")))
    values = kpis.set_index("kpi")["value"]
    assert values["users_success_ratio"] == 1.0
    assert values["user_train_tokens_per_second_p50"] > 0
    assert values["user_time_to_start_max"] >= 1.0  # the last batch waited its stagger
    assert set(kpis["user_count"]) == {"4"} and set(kpis["launch"]) == {"forked"}
    page = next((tmp_path / "run").glob("*__analysis__*/report/*_users.html")).read_text()
    assert "time_to_start_s" in page and page.count("<tr") >= 5  # header + 4 users


def _fast_vars() -> list[str]:
    return [arg for key, value in FAST.items() for arg in ("--var", f"{key}={value}")]


def test_a_run_beside_busy_loops_is_invalid_not_judged_and_exits_0(tmp_path: Path) -> None:
    """Two busy loops that are not the run's: the light preset records the cell invalid
    (busy machine), stores it marked so, judges nothing, and still exits 0 (record).

    The loops start once the cell's dir exists and stop once the cell has ended (its
    ``exit_code``): the cell's window is what validity reads, and the run's post-processing,
    report and export after it need no loop beside them (four loops for the whole run
    slowed the suite's other worker to a third of the machine for ~90 s)."""
    run_dir = tmp_path / "run"
    out, err = (tmp_path / "cli.out").open("w"), (tmp_path / "cli.err").open("w")
    cli = subprocess.Popen([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                            *_fast_vars(), "--var",
                            f"analysis.history_uri={tmp_path / 'history'}",
                            "--artifact-dir", str(run_dir)],
                           stdout=out, stderr=err, text=True, env=cli_env(tmp_path))
    loops: list[subprocess.Popen[bytes]] = []
    try:
        wait_until(lambda: cli.poll() is not None or any(run_dir.glob("*__cell")),
                   "the cell's dir", timeout_s=900)
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                  start_new_session=True) for _ in range(2)]
        wait_until(lambda: cli.poll() is not None or any(run_dir.glob("*__cell/exit_code")),
                   "the cell's end", timeout_s=1200)
        for loop in loops:
            loop.kill()
        cli.wait(timeout=1200)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        cli.kill()
        cli.wait()
        out.close()
        err.close()
    proc = subprocess.CompletedProcess(cli.args, cli.returncode, (tmp_path / "cli.out")
                                       .read_text(), (tmp_path / "cli.err").read_text())
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    outcome = json.loads((run_dir / "outcome.json").read_text())
    cell = outcome["cells"][0]
    assert cell["validity"] == "invalid", output
    assert any("busy machine" in r for r in cell["validity_reasons"]), cell
    assert "invalid: busy machine" in proc.stdout
    assert outcome["verdict_counts"] == {"not_judged": 1}
    stored = HistoryStore(str(tmp_path / "history")).read()
    assert set(stored["validity"]) == {"invalid"}


def test_a_nightly_run_that_stays_invalid_ends_inconclusive_with_exit_3(
        tmp_path: Path) -> None:
    """validity: enforce (nightly): the invalid cell is re-run once, stays invalid (a window
    shorter than a declared minimum of a day), and the run ends with exit 3, never 1."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "nightly",
                           *_fast_vars(), "--var", "analysis.validity.min_window_s=86400",
                           "--var", f"analysis.history_uri={tmp_path / 'history'}",
                           "--artifact-dir", str(run_dir)],
                          capture_output=True, text=True, env=cli_env(tmp_path), timeout=1200)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 3, output
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert [c["name"] for c in outcome["cells"]] == ["base", "base~valid-rerun1"]
    assert {c["validity"] for c in outcome["cells"]} == {"invalid"}
    assert outcome["failures"] == [] and len(outcome["inconclusive"]) == 1
    assert "shorter than the 86400 s declared minimum" in outcome["inconclusive"][0]
    assert "INCONCLUSIVE: cell base" in proc.stdout
    # "View at <URL>" points at the shared local API's UI, which outlives the command (a
    # temporary API's link would point at a server gone when the command ends: none then)
    from flows.local_api import status

    shared = status()
    assert shared is not None and f"View at {shared.ui_url}/runs/" in proc.stdout + proc.stderr
    assert len(list(run_dir.glob("*__cell"))) == 2  # both results kept
