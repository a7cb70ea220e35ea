"""Measurement validity: the engine's checks, the machine watch, and what invalid runs do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hypothesis.strategies as st
import pandas as pd
import pytest
from hypothesis import given

from analysis.history import VALIDITY, HistoryStore
from analysis.judging import NOT_JUDGED
from analysis.pipeline import postprocess
from analysis.settings import AnalysisSettings, ValidityPolicy
from analysis.validity import HOST_FILE, HostWindow, engine_reasons, judge_validity
from tasks.hostwatch import HostWatch
from tests.factories import make_result_dir

POLICY = ValidityPolicy()


@given(cores=st.integers(1, 64), busy=st.floats(0, 1), run=st.floats(0, 1),
       steal=st.floats(0, 0.5), load=st.floats(0, 20), available=st.floats(0, 1),
       swap=st.integers(0, 10_000), throttled=st.floats(0, 1))
def test_each_engine_check_follows_its_threshold(cores: int, busy: float, run: float,
                                                 steal: float, load: float, available: float,
                                                 swap: int, throttled: float) -> None:
    """Generated machine windows: a check fires exactly when its number passes its bound."""
    import tempfile

    total = 100.0 * cores
    window = HostWindow(cores=cores, window_s=100.0, cpu_total_s=total,
                        cpu_busy_s=busy * total, cpu_steal_s=steal * total,
                        run_cpu_s=run * busy * total, load1_max=50.0 * cores,
                        other_runnable_mean=load * cores,
                        memory_total_bytes=10**9,
                        memory_available_min_bytes=int(available * 10**9),
                        swap_in_pages=swap, periods=1000,
                        throttled_periods=int(throttled * 1000))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / HOST_FILE).write_text(window.model_dump_json())
        reasons = " | ".join(engine_reasons(tmp, POLICY))
    assert ("busy machine" in reasons) == (window.other_cpu_share > POLICY.max_other_cpu_share)
    assert ("CPU steal" in reasons) == (steal > POLICY.max_steal_share)
    # the machine's load average counts the run's own threads: never judged by itself
    assert ("load from other processes" in reasons) == (load > POLICY.max_load_per_core)
    assert ("swapped in" in reasons) == (swap / 100.0 > POLICY.max_swap_in_per_s)
    assert ("memory available" in reasons) == (
        int(available * 10**9) / 10**9 < POLICY.min_memory_available_share)
    assert ("throttled" in reasons) == (int(throttled * 1000) / 1000 >
                                        POLICY.max_throttled_share)


@pytest.mark.parametrize("content", ["not json", '{"cores": -1}', '{"cores": "two"}', ""])
def test_an_unusable_host_file_skips_the_machine_checks(tmp_path: Path, content: str) -> None:
    (tmp_path / HOST_FILE).write_text(content)
    assert engine_reasons(tmp_path, POLICY) == []


def test_failed_and_short_windows_and_project_errors(tmp_path: Path) -> None:
    assert judge_validity(tmp_path, 4, POLICY).status == "failed"
    short = judge_validity(tmp_path, 0, POLICY, measured_window_s=0.5, min_window_s=3)
    assert short.status == "invalid" and "shorter than the 3 s" in short.reasons[0]

    def broken() -> list[str]:
        raise KeyError("concurrency")

    odd = judge_validity(tmp_path, 0, POLICY, project_reasons=broken)
    assert odd.status == "invalid" and "could not run" in odd.reasons[0]
    assert judge_validity(tmp_path, 0, ValidityPolicy(mode="off"),
                          project_reasons=broken).status == "valid"


def test_a_clusters_throttling_comes_from_its_prometheus(tmp_path: Path) -> None:
    """No host.json on a cluster: the pods' CFS throttling captured from Prometheus."""
    series = tmp_path / "002__observe__capture_prometheus" / "prometheus"
    series.mkdir(parents=True)
    pd.DataFrame({"query": ["cpu_throttled_share"] * 2, "labels": ["{}", "{}"],
                  "timestamp": pd.date_range("2026-01-01", periods=2, tz="UTC"),
                  "value": [0.1, 0.5]}).to_parquet(series / "series.parquet")
    assert any("throttled in 30%" in r for r in engine_reasons(tmp_path, POLICY))


_SPIN = "import time\nwhile time.process_time() < 1.0:\n    pass\n"


def _wait_gone(pid: int) -> None:
    """Until ``pid`` no longer exists (a process this test does not own)."""
    deadline = time.monotonic() + 600
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "the foreign process never ended"
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc only")
def test_the_watch_tells_the_runs_cpu_from_other_processes(tmp_path: Path) -> None:
    """A child's CPU second is the run's; a detached process's second is another's."""
    watch = HostWatch(interval_s=0.05)
    assert watch.start()
    subprocess.run([sys.executable, "-c", _SPIN], check=True)  # our own workload
    mine = watch.stop()
    assert mine is not None and mine.run_cpu_s >= 0.9

    watch = HostWatch(interval_s=0.05)
    assert watch.start()
    # a process that is not ours: double-forked, its parent gone (init adopts it)
    pid_file = tmp_path / "pid"
    subprocess.run([sys.executable, "-c",
                    "import os, subprocess, sys\n"
                    f"p = subprocess.Popen([sys.executable, '-c', {_SPIN!r}],"
                    " start_new_session=True)\n"
                    f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                    "os._exit(0)\n"], check=True)
    _wait_gone(int(pid_file.read_text()))
    other = watch.stop()
    assert other is not None
    assert other.cpu_busy_s - other.run_cpu_s >= 0.9  # the foreign second is "other"
    assert other.cores == os.cpu_count()
    # runnable (R) through its whole life, however loaded the machine: counted as load for at
    # least its CPU second (a running thread is runnable; waiting for a core it is too), so
    # the window's runnable-thread seconds hold that second whatever the window's length
    assert other.other_runnable_mean is not None
    assert other.other_runnable_mean * other.window_s >= 0.8


_SPIN_THEN_WAIT = ("import os, sys, time\n"
                   "while time.process_time() < 1.0:\n    pass\n"
                   "open(sys.argv[1], 'w').close()\n"
                   "while not os.path.exists(sys.argv[2]):\n    time.sleep(0.05)\n")


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc only")
def test_a_tree_counted_as_the_runs_is_the_runs_cpu(tmp_path: Path) -> None:
    """An adopted spare Prometheus is not a descendant of the run: `count_as_run` makes its
    keeper's tree the run's, as a Prometheus the run started was."""
    from tasks.hostwatch import count_as_run, uncount

    spun, leave, pid_file = tmp_path / "spun", tmp_path / "leave", tmp_path / "pid"
    # not ours by descent: double-forked, its parent gone (init adopts it)
    subprocess.run([sys.executable, "-c",
                    "import os, subprocess, sys\n"
                    f"p = subprocess.Popen([sys.executable, '-c', {_SPIN_THEN_WAIT!r}, "
                    f"{str(spun)!r}, {str(leave)!r}], start_new_session=True)\n"
                    f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                    "os._exit(0)\n"], check=True)
    pid = int(pid_file.read_text())
    watch = HostWatch(interval_s=0.05)
    count_as_run(pid)
    try:
        assert watch.start()
        while not spun.exists():
            time.sleep(0.05)
        counted = watch.stop()
    finally:
        uncount(pid)
        leave.touch()
        _wait_gone(pid)
    assert counted is not None and counted.run_cpu_s >= 0.9


def _busy_host(cell: Path) -> None:
    (cell / HOST_FILE).write_text(HostWindow(
        cores=2, window_s=40, cpu_total_s=80, cpu_busy_s=78, run_cpu_s=20,
        load1_max=6.0, other_runnable_mean=4.0).model_dump_json())


def test_invalid_and_failed_runs_are_stored_marked_and_never_a_baseline(
        tmp_path: Path) -> None:
    """Quiet runs, then a busy one (a wild value) and a failed one: both kept in the history,
    marked, not judged, and the next quiet run's baseline holds only the quiet runs."""
    hist = str(tmp_path / "hist")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(6):
        make_result_dir(tmp_path / f"q{i}", start=start + timedelta(days=i),
                        tokens_per_second=1000 + (i % 3), seed=i)
        postprocess(tmp_path / f"q{i}", "fine_tuning", tmp_path / f"qo{i}", history_uri=hist,
                    report=False)
    busy = make_result_dir(tmp_path / "busy", start=start + timedelta(days=7),
                           tokens_per_second=150, runtime=270, seed=50)
    _busy_host(busy)
    outcome = postprocess(tmp_path / "busy", "fine_tuning", tmp_path / "bo", history_uri=hist)
    assert {v.verdict for v in outcome.verdicts} == {NOT_JUDGED}
    assert "busy machine" in outcome.verdicts[0].explanation
    assert outcome.validity["000__cell"].status == "invalid"
    payload = json.loads((tmp_path / "bo" / "lts_payload.json").read_text())[0]
    assert payload["metadata"]["validity"] == "invalid"
    assert "not judged" in (tmp_path / "bo" / "report" / "index.html").read_text()
    make_result_dir(tmp_path / "failed", start=start + timedelta(days=8), exit_code=1,
                    tokens_per_second=50, seed=51)
    postprocess(tmp_path / "failed", "fine_tuning", tmp_path / "fo", history_uri=hist,
                report=False)
    stored = HistoryStore(hist).read()
    assert set(stored[VALIDITY]) == {"valid", "invalid", "failed"}

    make_result_dir(tmp_path / "next", start=start + timedelta(days=9),
                    tokens_per_second=1001, seed=52)
    outcome = postprocess(tmp_path / "next", "fine_tuning", tmp_path / "no",
                          history_uri=hist, report=False)
    tps = next(v for v in outcome.verdicts if v.kpi == "train_tokens_per_second")
    assert tps.history_used == 6 and tps.verdict == "no_change"
    assert 990 < tps.baseline < 1010  # the busy and failed values never entered it


def test_validity_off_judges_everything(tmp_path: Path) -> None:
    busy = make_result_dir(tmp_path / "busy")
    _busy_host(busy)
    settings = AnalysisSettings.model_validate({"validity": "off"})
    outcome = postprocess(tmp_path / "busy", "fine_tuning", tmp_path / "out",
                          history_uri=str(tmp_path / "h"), settings=settings, report=False)
    assert NOT_JUDGED not in {v.verdict for v in outcome.verdicts}


@pytest.mark.parametrize(("value", "ok"), [("auto", True), (0, True), (5, True), (6, False),
                                           ("always", False), (-1, False), (1.5, False)])
def test_confirm_reruns_is_a_bounded_count_or_auto(value: object, ok: bool) -> None:
    from pydantic import ValidationError

    if ok:
        assert AnalysisSettings.model_validate({"confirm_reruns": value}).confirm_reruns == value
    else:
        with pytest.raises(ValidationError):
            AnalysisSettings.model_validate({"confirm_reruns": value})


@pytest.mark.parametrize("short", ["record", "enforce", "off"])
def test_validity_takes_its_mode_alone(short: str) -> None:
    assert AnalysisSettings.model_validate({"validity": short}).validity.mode == short
