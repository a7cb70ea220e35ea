"""The spare Prometheus a command-line run leaves for the next (`tasks.observe.spare`), for real:
a keeper process, a real Prometheus and exporters, adopters that finish or are SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.pids import pid_alive
from tasks.observe.promql import LOCAL_QUERIES, capture_window
from tasks.observe.spare import ADOPTED_FILE, SPARES_DIR, adopt, offer, spares, stop_spares
from tests.factories import process_gone, prometheus_required, wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _binaries() -> None:
    if not prometheus_required():
        pytest.skip("prometheus/prometheus-node-exporter not installed")


def _ready(directory: Path) -> int:
    """Wait for the keeper's record; the keeper's pid."""
    wait_until(lambda: (directory / "spare.json").exists(), "ready")
    return int(json.loads((directory / "spare.json").read_text())["keeper_pid"])


def _server_pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in (directory / "prometheus").rglob("*.pid")]


def test_a_spare_is_adopted_once_queried_as_the_runs_own_and_moved_into_the_run(
        tmp_path: Path) -> None:
    base = tmp_path / "spares"
    directory = offer(base, scrape_interval_s=0.5, minutes=10)
    assert directory is not None
    assert offer(base, scrape_interval_s=0.5, minutes=10) is None  # one unclaimed at a time
    keeper = _ready(directory)
    assert adopt(base, scrape_interval_s=1.0) is None  # another interval: not this one
    # nor does it keep a run of another interval from leaving its own (it kept every such
    # run from a spare until it expired); one of each at a time
    other = offer(base, scrape_interval_s=1.0, minutes=10)
    assert other is not None and offer(base, scrape_interval_s=1.0, minutes=10) is None
    server = adopt(base, scrape_interval_s=0.5)
    assert server is not None and server.local
    assert adopt(base, scrape_interval_s=0.5) is None  # claimed: never adopted twice
    pids = _server_pids(directory)
    assert pids and all(pid_alive(p) for p in pids)
    try:
        server.wait_scraped()
        start = datetime.now(UTC)
        wait_until(lambda: server._node_samples('timestamp(up{job="node"})')
               > start.timestamp() + 2, "scraped after the window's start")
        summary = capture_window(server, LOCAL_QUERIES, start, datetime.now(UTC),
                                 tmp_path / "cell")
        assert summary["queries"]["load1"]["rows"] >= 2
        # a claimed spare is the run's: stop_spares leaves it (it stops the other
        # interval's), and offer leaves another
        assert stop_spares(base) == 1 and server.alive() and not other.exists()
        second = offer(base, scrape_interval_s=0.5, minutes=10)
        assert second is not None and second != directory
    finally:
        server.relocate_to = tmp_path / "run" / "prometheus"
        server.stop()
    # stop() returns once the keeper's command line is gone: an exiting process loses it
    # (its memory is released) a moment before it is a zombie, so its end is waited for
    assert process_gone(keeper) and all(process_gone(p) for p in pids)
    assert not directory.exists()
    moved = tmp_path / "run" / "prometheus"
    assert (moved / "data").is_dir() and (moved / "prometheus.yml").is_file()
    adopted = json.loads((moved / ADOPTED_FILE).read_text())
    assert adopted["keeper_pid"] == keeper and adopted["adopted"] >= adopted["started"]
    assert server.data_dir == moved / "data"
    assert stop_spares(base) == 1 and spares(base) == []


def test_an_unadopted_spare_stops_itself_and_a_stopped_ones_dir_is_swept(
        tmp_path: Path) -> None:
    base = tmp_path / "spares"
    assert offer(base, scrape_interval_s=1.0, minutes=0) is None  # 0: none is ever left
    directory = offer(base, scrape_interval_s=1.0, minutes=0.02)  # 1.2 s
    assert directory is not None
    keeper = _ready(directory)
    pids = _server_pids(directory)
    wait_until(lambda: not pid_alive(keeper), "stopped once its minutes passed")
    assert not directory.exists() and not any(pid_alive(p) for p in pids)
    # a keeper SIGKILLed takes its server with it; the next offer removes what it left
    third = offer(base, scrape_interval_s=1.0, minutes=10)
    assert third is not None
    keeper = _ready(third)
    pids = _server_pids(third)
    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: not any(pid_alive(p) for p in pids), "gone with its keeper")
    assert adopt(base, scrape_interval_s=1.0) is None
    fourth = offer(base, scrape_interval_s=1.0, minutes=10)
    assert fourth is not None and not third.exists()
    _ready(fourth)
    assert stop_spares(base) == 1 and not fourth.exists()


_ADOPTER = """
import sys
from pathlib import Path
from tasks.observe.spare import adopt
server = adopt(Path(sys.argv[1]), scrape_interval_s=1.0)
server.relocate_to = Path(sys.argv[2])
print("adopted", flush=True)
sys.stdin.readline()
"""


def test_a_run_killed_while_it_holds_a_spare_still_gets_its_files(tmp_path: Path) -> None:
    base = tmp_path / "spares"
    directory = offer(base, scrape_interval_s=1.0, minutes=10)
    assert directory is not None
    keeper = _ready(directory)
    target = tmp_path / "run" / "prometheus"
    adopter = subprocess.Popen([sys.executable, "-c", _ADOPTER, str(base), str(target)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert adopter.stdout is not None and adopter.stdout.readline().strip() == "adopted"
        adopter.kill()
        adopter.wait()
    finally:
        if adopter.poll() is None:
            adopter.kill()
    wait_until(lambda: not pid_alive(keeper), "stopped after its adopter died")
    assert (target / "data").is_dir() and (target / ADOPTED_FILE).is_file()
    assert not directory.exists()


def test_an_edited_record_is_never_adopted(tmp_path: Path) -> None:
    base = tmp_path / "spares"
    directory = offer(base, scrape_interval_s=1.0, minutes=10)
    assert directory is not None
    _ready(directory)
    record = json.loads((directory / "spare.json").read_text())
    try:
        for url in ("http://10.0.0.1:9090", "http://127.0.0.1:9090/x", "file:///etc"):
            (directory / "spare.json").write_text(json.dumps({**record, "url": url}))
            assert adopt(base, scrape_interval_s=1.0) is None
        (directory / "spare.json").write_text(json.dumps({**record, "keeper_pid": 1}))
        assert adopt(base, scrape_interval_s=1.0) is None
        # started by other code or other binaries: not the server this code would start
        (directory / "spare.json").write_text(json.dumps({**record, "layout": "other"}))
        assert adopt(base, scrape_interval_s=1.0) is None
        (directory / "spare.json").write_text(json.dumps(record))
        server = adopt(base, scrape_interval_s=1.0)
        assert server is not None
        assert server.alive()
        server.stop()
    finally:
        stop_spares(base)
    assert spares(base) == []


def test_a_spare_still_starting_is_waited_for_not_passed_over(tmp_path: Path) -> None:
    base = tmp_path / "spares"
    directory = offer(base, scrape_interval_s=1.0, minutes=10)
    assert directory is not None and not (directory / "spare.json").exists()
    server = adopt(base, scrape_interval_s=1.0)  # at once: its keeper is still starting it
    try:
        assert server is not None and server.directory == directory
    finally:
        if server is not None:
            server.stop()
        stop_spares(base)


def test_a_local_run_leaves_its_spare_once_its_cells_are_done_never_after_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform's ``lock`` block is the run's cells: its normal end offers the spare (the
    run's post-processing and cleanup then overlap the spare's start, ~5-10 s to its first
    scrape); a block left by an exception (a failed or interrupted run) offers none."""
    from projects import registry
    from projects.config import resolve
    from tasks.platforms.base import RunContext
    from tasks.platforms.local import LocalPlatform

    monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TELLTALE_SPARE_PROMETHEUS_MINUTES", "10")
    base = tmp_path / "home" / SPARES_DIR
    project = registry.load("fine_tuning")
    config = resolve("fine_tuning", presets=["light"])
    run = RunContext(project=project, config=config, model=config.model,
                     test=project.test_block(config.model), root=tmp_path / "run", run_id="t")
    platform = LocalPlatform()
    with platform.lock(run):  # a run observed without Prometheus leaves none
        pass
    assert spares(base) == []
    platform.prometheus = object()  # type: ignore[assignment]  # the run measured with one
    with pytest.raises(KeyboardInterrupt), platform.lock(run):
        raise KeyboardInterrupt
    assert spares(base) == []
    try:
        with platform.lock(run):
            pass
        assert len(spares(base)) == 1
    finally:
        platform.prometheus = None
        stop_spares(base)
