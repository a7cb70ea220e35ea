"""Prometheus: a real local server and node exporter, the capture, the offline parse, and the
query client against a Prometheus-API server that misbehaves."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from analysis.parsing import FileReader
from core.errors import ConfigError, PermanentServiceError, TransientServiceError
from projects.library.resources import read_resources
from tasks.observe.prometheus import PrometheusServer
from tasks.observe.promql import LOCAL_QUERIES, capture_window
from tests.factories import prometheus_required

_EXPORTERS = 2 if shutil.which("prometheus-process-exporter") else 1


@pytest.fixture(scope="module")
def local_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    if not prometheus_required():
        pytest.skip("prometheus/prometheus-node-exporter not installed")
    home = tmp_path_factory.mktemp("prometheus")
    server = PrometheusServer.start_local(home, scrape_interval_s=0.5)
    yield server
    server.stop()


def _wait_for_samples(server: PrometheusServer, start: datetime) -> None:
    """Until the node exporter has been scraped a few times (a condition, not a sleep)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rows = server.query_range("node_load1", start, datetime.now(UTC), 0.5)
        if rows and len(rows[0].values) >= 3:
            return
        time.sleep(0.2)
    pytest.fail("no samples from the node exporter in 180 s")


def test_capture_of_a_busy_window_parses_offline(local_prometheus: PrometheusServer,
                                                 tmp_path: Path) -> None:
    start = datetime.now(UTC) - timedelta(seconds=1)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _wait_for_samples(local_prometheus, start)
    finally:
        busy.kill()
        busy.wait()
    cell = tmp_path / "000__cell"
    summary = capture_window(local_prometheus, LOCAL_QUERIES, start, datetime.now(UTC),
                             cell / "003__observe__capture_prometheus" / "prometheus")
    assert summary["errors"] == {} and summary["queries"]["cpu_cores_used"]["rows"] > 0
    assert "warning" not in summary  # a window of several scrapes
    series = pd.read_parquet(cell / "003__observe__capture_prometheus" / "prometheus"
                             / "series.parquet")
    # the machine's series; the workload's ones are empty here: no cell runs
    assert {"cpu_cores_used", "memory_used_bytes", "load1"} <= set(series["query"])
    assert str(series["timestamp"].dtype).startswith("datetime64") and series["value"].notna().all()

    # the parser reads the file alone: no server involved
    reader = FileReader(cell)
    found = read_resources(reader)
    assert found is not None and not reader.problems
    usage, timeline = found
    assert usage.cpu_cores_mean is not None and usage.cpu_cores_mean > 0.3  # a busy core
    assert usage.memory_used_max_bytes is not None and usage.memory_used_max_bytes > 1e7
    assert usage.gpu_util_mean is None and usage.samples == len(timeline) >= 3
    assert all(math.isfinite(v) for v in timeline.t_s)


def test_a_window_shorter_than_a_scrape_says_so(local_prometheus: PrometheusServer,
                                                tmp_path: Path) -> None:
    # a workload's series begins in its window: a window with no scrape may not see it
    end = datetime.now(UTC)
    summary = capture_window(local_prometheus, LOCAL_QUERIES, end - timedelta(seconds=0.3),
                             end, tmp_path / "prometheus")
    assert "a 0.3-s window is shorter than the 0.5-s scrape interval" in summary["warning"]
    assert "observe.prometheus.scrape_interval_s" in summary["warning"]
    assert json.loads((tmp_path / "prometheus" / "capture.json").read_text())["warning"] \
        == summary["warning"]


def test_snapshot_and_stop_leave_a_tsdb_and_no_process(tmp_path: Path) -> None:
    if not prometheus_required():
        pytest.skip("prometheus/prometheus-node-exporter not installed")
    server = PrometheusServer.start_local(tmp_path / "prometheus", scrape_interval_s=0.5)
    pids = [int(p.read_text()) for p in (tmp_path / "prometheus").rglob("workload.pid")]
    try:
        _wait_for_samples(server, datetime.now(UTC) - timedelta(seconds=1))
        snapshot = server.snapshot()
    finally:
        server.stop()
    assert snapshot is not None and snapshot.is_dir()
    assert any(snapshot.iterdir())  # the head block, written as a block
    assert len(pids) == _EXPORTERS + 1
    assert not list((tmp_path / "prometheus").rglob("workload.pid"))
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_missing_binaries_say_how_to_install(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as raised:
        PrometheusServer.start_local(tmp_path / "prometheus")
    assert "apt-get install prometheus prometheus-node-exporter" in str(raised.value)
    assert raised.value.key == "observe.prometheus.mode"


def test_broken_capture_is_a_parse_problem(tmp_path: Path) -> None:
    step = tmp_path / "001__observe__capture_prometheus" / "prometheus"
    step.mkdir(parents=True)
    (step / "series.parquet").write_bytes(b"PAR1 not really")
    reader = FileReader(tmp_path)
    assert read_resources(reader) is None
    assert any("unreadable Parquet" in p.message for p in reader.problems)
    assert read_resources(FileReader(tmp_path / "001__observe__capture_prometheus")) is None


# --- the query client against a Prometheus-API server (a cluster's Thanos querier) --------

def test_cluster_query_sends_the_token_and_validates_answers(tmp_path: Path) -> None:
    from tasks.observe.capture import cluster_queries
    from tests.servers.prometheus import prometheus_api

    with prometheus_api(token="sa-token-123") as api:
        client = PrometheusServer(api.url, token="sa-token-123", scrape_interval_s=15)
        start = datetime.fromtimestamp(1_700_000_000, UTC)
        end = start + timedelta(seconds=60)
        out = tmp_path / "001__observe__capture_prometheus" / "prometheus"
        summary = capture_window(client, cluster_queries("fine-tuning-testing"), start, end,
                                 out)
        assert summary["errors"] == {}
        assert all(r["authorization"] == "Bearer sa-token-123" for r in api.requests)
        assert 'namespace="fine-tuning-testing"' in api.requests[0]["query"]["query"]
        found = read_resources(FileReader(tmp_path))
        assert found is not None
        usage, _ = found
        assert usage.cpu_cores_mean == pytest.approx(7.5)
        assert usage.memory_used_max_bytes == pytest.approx(24e9)
        assert usage.gpu_util_mean == pytest.approx(70.0)  # the mean of the two GPUs
        assert usage.gpu_memory_max_bytes == pytest.approx(50_000 * 1048576)  # summed
        assert "sa-token-123" not in (out / "capture.json").read_text()

        assert client.snapshot_name() is None  # admin API off: 403, recorded as refused
        api.admin = True
        assert client.snapshot_name() == "20260101T000000Z-0123456789abcdef"
        assert client.snapshot() is None  # not ours: no local dir to point at
        api.mode = "503"
        with pytest.raises(TransientServiceError):
            client.query_range("up", start, end, 15)
        api.mode = "garbage"
        with pytest.raises(PermanentServiceError, match="malformed"):
            client.query_range("up", start, end, 15)
        client.stop()
        with pytest.raises(PermanentServiceError, match="HTTP 401"):
            PrometheusServer(api.url).query_range("up", start, end, 15)  # no token


def test_namespace_is_checked_before_it_enters_a_query() -> None:
    from tasks.observe.capture import cluster_queries

    with pytest.raises(ConfigError, match="DNS label"):
        cluster_queries('x"}) or vector(1) or up{a="')


def test_unreachable_prometheus_is_transient_and_recorded(tmp_path: Path) -> None:
    client = PrometheusServer("http://127.0.0.1:9")  # discard port: nothing listens
    start = datetime.now(UTC)
    summary = capture_window(client, {"cpu_cores_used": "up"}, start,
                             start + timedelta(seconds=5), tmp_path)
    assert "cpu_cores_used" in summary["errors"]
    assert pd.read_parquet(tmp_path / "series.parquet").empty
    client.stop()
    assert os.path.exists(tmp_path / "capture.json")


def _run_context(tmp_path: Path, mode: str) -> Any:
    from projects import registry
    from projects.config import resolve
    from tasks.platforms.base import RunContext

    project = registry.load("fine_tuning")
    config = resolve("fine_tuning", presets=["light"],
                     overrides={"observe.prometheus.mode": mode})
    return RunContext(project=project, config=config, model=config.model,
                      test=project.test_block(config.model), root=tmp_path, run_id="t")


def test_local_platform_auto_goes_on_without_prometheus_and_on_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.platforms.local import LocalPlatform

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing installed
    platform = LocalPlatform()
    platform._start_prometheus(_run_context(tmp_path, "auto"))
    assert platform.prometheus is None  # no resource KPIs, no error: the embedded default
    with pytest.raises(ConfigError, match="apt-get install"):
        platform._start_prometheus(_run_context(tmp_path, "on"))
    platform._start_prometheus(_run_context(tmp_path, "off"))
    assert platform.prometheus is None


def test_bare_yaml_on_and_off_are_modes() -> None:
    from projects.config import resolve

    for text, mode in (("on", "on"), ("off", "off"), ("auto", "auto")):
        config = resolve("fine_tuning", presets=["light"],
                         overrides={"observe.prometheus.mode": __import__("yaml").safe_load(
                             text)})
        assert config.model.observe.prometheus.mode == mode


def test_series_rebuilt_from_a_real_tsdb_snapshot(tmp_path: Path) -> None:
    """A run's snapshot, taken by a real Prometheus, answers the cell's window again."""
    import json

    if not prometheus_required():
        pytest.skip("prometheus/prometheus-node-exporter not installed")
    run = tmp_path / "run"
    cell = run / "000__cell"
    cell.mkdir(parents=True)
    server = PrometheusServer.start_local(run / "prometheus", scrape_interval_s=0.5)
    try:
        start = datetime.now(UTC)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            _wait_for_samples(server, start)
            server.wait_sample_after(datetime.now(UTC))
        finally:
            busy.kill()
            busy.wait()
        end = datetime.now(UTC)
        snapshot = server.snapshot()
    finally:
        server.stop()
    assert snapshot is not None
    (cell / "test_start_end.json").write_text(json.dumps(
        {"start": start.isoformat(), "end": end.isoformat()}))
    before = sorted(p.relative_to(snapshot) for p in snapshot.rglob("*"))

    proc = subprocess.run([sys.executable, "-m", "flows.requery_prometheus", str(run),
                           "--scrape-interval", "0.5"], capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr
    assert "1 cell(s) captured again" in proc.stdout
    found = read_resources(FileReader(cell))
    assert found is not None
    usage, _ = found
    assert usage.cpu_cores_mean is not None and usage.cpu_cores_mean > 0.3
    assert usage.memory_used_max_bytes is not None and usage.memory_used_max_bytes > 1e7
    assert sorted(p.relative_to(snapshot) for p in snapshot.rglob("*")) == before  # a copy
    again = subprocess.run([sys.executable, "-m", "flows.requery_prometheus", str(run)],
                           capture_output=True, text=True, timeout=1200)
    assert "0 cell(s)" in again.stdout  # captures that exist are kept without --force
    missing = subprocess.run([sys.executable, "-m", "flows.requery_prometheus",
                              str(tmp_path / "nothing")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no such directory" in missing.stderr


def test_started_ahead_moves_into_the_run_or_is_stopped(tmp_path: Path) -> None:
    from tasks.observe.prometheus import start_ahead, stop_ahead, take_ahead

    if not prometheus_required():
        pytest.skip("prometheus/prometheus-node-exporter not installed")
    start_ahead(tmp_path, scrape_interval_s=0.5, ready_timeout_s=120)
    (ahead,) = tmp_path.glob(".prometheus-*")
    server = take_ahead(tmp_path / "run" / "prometheus", 0.5)
    assert server is not None and take_ahead(tmp_path / "other", 0.5) is None
    server.wait_scraped()
    name = server.snapshot()
    server.stop()
    assert not ahead.exists()  # moved, TSDB and snapshot included
    assert name is not None and (tmp_path / "run" / "prometheus" / "data" / "snapshots"
                                 / name.name).is_dir()

    start_ahead(tmp_path, scrape_interval_s=0.5, ready_timeout_s=120)  # never taken
    pids = [int(p.read_text()) for p in tmp_path.glob(".prometheus-*/*/workload.pid")]
    stop_ahead()
    assert len(pids) == _EXPORTERS + 1 and not list(tmp_path.glob(".prometheus-*"))
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_workload_process_group_takes_cells_not_the_cli() -> None:
    import re

    from tasks.observe.prometheus import _PROCESS_GROUPS

    (pattern,) = _PROCESS_GROUPS["process_names"][0]["cmdline"]
    workload = ("/venv/bin/python -m projects.fine_tuning.workload.train_local "
                "/runs/r1/001__cell/001__fine_tuning__run_fine_tuning_job/src/config_final.json")
    cli = "/venv/bin/python -m flows.fine_tuning --preset light --artifact-dir /runs/r1"
    assert re.search(pattern, workload) and not re.search(pattern, cli)


def test_the_workload_group_is_there_before_any_workload_so_one_scrape_gives_a_rate(
        tmp_path: Path) -> None:
    """A workload's CPU is a rate of the process exporter's group counter: it needs a sample
    of the group before the workload's first. A fresh exporter made the group only when it
    first saw a workload, and a ~3-s trainer scraped every 2 s had no CPU rate one run in
    two; the primer makes the group at the exporter's start, gone before Prometheus scrapes."""
    import re

    from tasks.observe.prometheus import _PRIMER_DIR, _PROCESS_GROUPS

    if not prometheus_required() or not shutil.which("prometheus-process-exporter"):
        pytest.skip("prometheus, its node exporter and process exporter not installed")
    (pattern,) = _PROCESS_GROUPS["process_names"][0]["cmdline"]
    assert re.search(pattern, f"python -c ... /x/{_PRIMER_DIR}/")  # the primer is a member
    server = PrometheusServer.start_local(tmp_path / "prometheus", scrape_interval_s=0.5)
    try:
        # this start's primer (the suite's other workers prime their own exporters meanwhile)
        ours = f"{tmp_path}/".encode()
        primers = [p for p in Path("/proc").glob("[0-9]*/cmdline")
                   if _PRIMER_DIR.encode() in (line := _read(p)) and ours in line]
        assert primers == []  # gone before Prometheus started
        server.wait_scraped()
        # the group's series, before this test's workload (its value is not asserted: the
        # group is every cell's workload on this machine, and the suite's other tests run
        # theirs meanwhile)
        query = 'namedprocess_namegroup_num_procs{groupname="workload"}'
        found = server._client.get("/api/v1/query", params={"query": query}).json()
        assert len(found["data"]["result"]) == 1, found
        # a busy workload in a cell's step dir, until Prometheus has seen it once
        start = datetime.now(UTC)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass",
                                 str(tmp_path / "001__cell" / "001__p__train") + "/"])
        try:
            _wait_until(lambda: _instant(server, 'namedprocess_namegroup_num_procs'
                                         '{groupname="workload"}') >= 1)
        finally:
            busy.kill()
            busy.wait()
        end = datetime.now(UTC)
        summary = capture_window(server, LOCAL_QUERIES, start, end, tmp_path / "capture")
        assert summary["queries"]["workload_cpu_cores"]["rows"] >= 1, summary
    finally:
        server.stop()
    series = pd.read_parquet(tmp_path / "capture" / "series.parquet")
    rates = series[series["query"] == "workload_cpu_cores"]["value"]
    assert (rates > 0).any()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process gone meanwhile
        return b""


def _instant(server: PrometheusServer, query: str) -> float:
    found = server._client.get("/api/v1/query", params={"query": query}).json()
    return max((float(r["value"][1]) for r in found["data"]["result"]), default=0.0)


def _wait_until(done: Callable[[], bool]) -> None:
    """Until ``done`` (a condition, not a sleep; the limit is a hang guard)."""
    deadline = time.monotonic() + 600
    while not done():
        assert time.monotonic() < deadline, "no sample of the workload in 600 s"
        time.sleep(0.1)


def test_a_ctrl_c_while_the_group_is_primed_leaves_no_exporter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted while it waits for the exporter's answer, the start stops what it
    started (the exporters) and no primer is left."""
    import tasks.observe.prometheus as prometheus
    from tasks.observe.prometheus import _PRIMER_DIR
    from tests.factories import process_gone

    if not prometheus_required() or not shutil.which("prometheus-process-exporter"):
        pytest.skip("prometheus, its node exporter and process exporter not installed")
    started: list[int] = []

    class Recorded(prometheus.ManagedProcess):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self.proc.pid)

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    # this module's names only: the exporter asked where nothing listens, so the wait goes
    # on, and its first pause is a Ctrl-C
    monkeypatch.setattr(prometheus, "ManagedProcess", Recorded)
    monkeypatch.setattr(prometheus, "loopback_url", lambda port: "http://127.0.0.1:9")
    monkeypatch.setattr(prometheus, "time", SimpleNamespace(monotonic=time.monotonic,
                                                            sleep=interrupted))
    with pytest.raises(KeyboardInterrupt):
        PrometheusServer.start_local(tmp_path / "prometheus", scrape_interval_s=0.5)
    assert len(started) == 2 and all(process_gone(pid, 60) for pid in started)
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                if str(tmp_path / "prometheus" / _PRIMER_DIR).encode() in _read(p)]
