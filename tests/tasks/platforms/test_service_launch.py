"""A LocalService forked from its warm Python (`tasks.platforms.service_launch`).

Real processes throughout: a warm Python of this interpreter whose preload is a module that
waits for a gate file (so a test holds it "still importing" as long as it needs), a small
HTTP server as the service, `start_service` as the run calls it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.pids import pid_alive
from core.warm_python import acquire, starting, stop_warm_pythons, warm_base
from projects.contract import LocalService
from projects.library.runs import FORKED, FRESH
from tasks import hostwatch
from tasks.platforms import service as svc
from tasks.platforms.local import cleanup_local
from tasks.platforms.service import SERVICE_FILE, start_service
from tasks.platforms.service_launch import (
    WarmServerProcess,
    launch_server,
    offer_warm_service,
    service_warm_key,
)
from tasks.runner import PID_FILE
from tests.factories import group_gone, process_gone, wait_until

GATE_MODULE = '''
import os, time
while not os.path.exists(os.environ["GATE_FILE"]):  # "importing" until the test opens it
    time.sleep(0.02)
'''
SERVER = '''
import http.server, json, os, signal, subprocess, sys
if os.path.exists("ignore-term"):  # a server that does not stop on SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "helper": helper.pid,
                  "preloaded": "gate_mod" in sys.modules}), flush=True)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working dir with the gate and the server, its own warm Pythons' home."""
    here = tmp_path / "work"
    here.mkdir()
    (here / "gate_mod.py").write_text(GATE_MODULE)
    (here / "srv_probe.py").write_text(SERVER)
    monkeypatch.chdir(here)
    monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(tmp_path / "services-home"))
    monkeypatch.setenv("TELLTALE_WARM_PYTHON_MINUTES", "5")
    monkeypatch.setenv("GATE_FILE", str(here / "gate"))
    try:
        yield here
    finally:
        stop_warm_pythons(tmp_path / "services-home")


def _spec() -> LocalService:
    return LocalService(key="probe", argv=[sys.executable, "-m", "srv_probe", "{port}"],
                        health_path="/", ready_timeout_s=120, facts={"how": "fresh"},
                        preload=["gate_mod"], forked_facts={"how": "forked"})


def _said(log: Path) -> dict[str, object]:
    """The server's own line: its pid, its parent, its helper child, what it had imported."""
    return next(json.loads(line) for line in log.read_text().splitlines()
                if line.startswith("{"))


def _open_gate(work: Path) -> None:
    (work / "gate").write_text("")


def _ready_warm() -> int:
    """Offer the service's warm Python (what a run whose cells are done does), open its
    gate, wait until ready: its pid."""
    assert offer_warm_service(_spec())
    key = service_warm_key(_spec())
    assert key is not None
    _open_gate(Path.cwd())
    found = acquire(key)
    assert found is not None
    return found.pid


def test_a_server_forks_from_the_warm_python_its_first_start_began_and_the_next_at_once(
        work: Path, tmp_path: Path) -> None:
    """None there: the first start begins the server's warm Python and forks from it once
    its imports are done (as a workload's first run does); it stays for the next runs."""
    _open_gate(work)
    key = service_warm_key(_spec())
    assert key is not None and not starting(key)
    first = start_service(_spec(), tmp_path / "run1")
    found = acquire(key, wait_s=0)
    assert found is not None
    warm_pid = found.pid
    assert first.record["launch"] == f"{FORKED} {warm_pid}" and first.record["how"] == "forked"
    first.stop()
    second = start_service(_spec(), tmp_path / "run2")
    try:
        process = second.process
        assert isinstance(process, WarmServerProcess)
        assert second.record["launch"] == f"{FORKED} {warm_pid}"
        assert second.record["how"] == "forked"  # forked_facts over facts
        said = _said(process.log_file)
        assert said == {**said, "pid": process.pid, "ppid": warm_pid, "preloaded": True}
        assert os.getpgid(process.pid) == process.pid  # its own session, as a fresh one's
        assert process.pid in hostwatch._ALSO_RUN  # counted as the run's: not its child
        home = tmp_path / "run2" / "services" / "probe"
        assert (home / PID_FILE).read_text().strip() == str(process.pid)
        saved = json.loads((home / SERVICE_FILE).read_text())
        assert saved["pid"] == process.pid and saved["launch"].startswith(FORKED)
    finally:
        second.stop()
    assert not process.running and process.returncode is not None  # its end, heard
    assert group_gone(process.pid) and process_gone(int(str(said["helper"])))
    assert process.pid not in hostwatch._ALSO_RUN
    assert not (home / PID_FILE).exists()
    assert pid_alive(warm_pid)  # it stays for the next run


def test_a_warm_python_still_importing_is_waited_for_and_the_server_forked(
        work: Path, tmp_path: Path) -> None:
    assert offer_warm_service(_spec())
    key = service_warm_key(_spec())
    assert key is not None and starting(key) and acquire(key, wait_s=0) is None
    process = launch_server("server", _spec(), [*_spec().argv[:3], "0"], tmp_path / "svc")
    try:
        assert isinstance(process, WarmServerProcess)
        assert process.running and process.pid == 0 and process.launch == FRESH  # waiting
        _open_gate(work)
        wait_until(lambda: process.pid > 0, "the server forked once its warm Python was ready")
        assert process.launch.startswith(FORKED) and process.running
        wait_until(lambda: "{" in process.tail(), "the server said what it is")
        assert _said(process.log_file)["preloaded"] is True
    finally:
        process.stop()
    assert group_gone(process.pid) and not process.running


def test_a_warm_python_that_dies_importing_leaves_the_start_to_a_fresh_server(
        work: Path, tmp_path: Path) -> None:
    assert offer_warm_service(_spec())
    key = service_warm_key(_spec())
    assert key is not None
    warm_pid = int((warm_base() / key / "pid").read_text())
    process = launch_server("server", _spec(), [*_spec().argv[:3], "0"], tmp_path / "svc")
    try:
        assert isinstance(process, WarmServerProcess) and process.running
        os.kill(warm_pid, 9)
        wait_until(lambda: process.running and process.pid > 0,
                   "a fresh server started from the running check")
        assert process.launch == FRESH
        wait_until(lambda: "{" in process.tail(), "the server said what it is")
        said = _said(process.log_file)
        assert said["preloaded"] is False and said["ppid"] != warm_pid
    finally:
        process.stop()
    assert group_gone(process.pid)


def test_a_server_stopped_while_its_warm_python_imports_is_never_forked(
        work: Path, tmp_path: Path) -> None:
    assert offer_warm_service(_spec())
    key = service_warm_key(_spec())
    assert key is not None
    process = launch_server("server", _spec(), [*_spec().argv[:3], "0"], tmp_path / "svc")
    assert isinstance(process, WarmServerProcess) and process.running
    process.stop()  # its waiting thread is joined: no order can follow
    assert not process.running and process.pid == 0
    _open_gate(work)
    found = acquire(key)
    assert found is not None
    children = Path(f"/proc/{found.pid}/task/{found.pid}/children").read_text().split()
    assert children == []  # nothing was forked for the stopped server
    assert not (tmp_path / "svc" / PID_FILE).exists()


def test_a_server_taken_from_ahead_while_its_warm_python_imports_logs_in_the_run(
        work: Path, tmp_path: Path) -> None:
    """The command line's start ahead moves the server's dir into the run while its warm
    Python still imports: the fork, ordered after the move, writes where the run looks."""
    assert offer_warm_service(_spec())
    svc.start_ahead(_spec(), tmp_path)
    taken = svc.take_ahead(_spec(), tmp_path / "run" / "services" / "probe")
    assert taken is not None and not list(tmp_path.glob(".service-*"))
    _open_gate(work)
    try:
        wait_until(lambda: taken.process.pid > 0, "forked")
        wait_until(lambda: "{" in taken.process.tail(), "the server said what it is")
        log = tmp_path / "run" / "services" / "probe" / "server.log"
        assert _said(log)["pid"] == taken.process.pid
        assert (log.parent / PID_FILE).read_text().strip() == str(taken.process.pid)
    finally:
        taken.process.stop()


def test_cleanup_from_another_process_stops_a_forked_server(work: Path,
                                                            tmp_path: Path) -> None:
    """The cancellation hook and the janitor find a forked server as they find a fresh one:
    its pid file, its command line."""
    _ready_warm()
    running = start_service(_spec(), tmp_path)
    try:
        pid = running.process.pid
        assert running.record["launch"].startswith(FORKED)
        assert cleanup_local(tmp_path)["stopped_pids"] == [pid]
        wait_until(lambda: not running.process.running, "the server stopped")
    finally:
        running.stop()
    assert group_gone(pid)


def test_with_warm_pythons_off_a_server_is_always_fresh(work: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _ready_warm()
    monkeypatch.setenv("TELLTALE_WARM_PYTHON_MINUTES", "0")
    assert service_warm_key(_spec()) is None and not offer_warm_service(_spec())
    running = start_service(_spec(), tmp_path)
    try:
        assert running.record["launch"] == FRESH and running.record["how"] == "fresh"
    finally:
        running.stop()


def test_a_forked_server_deaf_to_sigterm_is_killed_and_its_end_heard(work: Path,
                                                                    tmp_path: Path) -> None:
    (work / "ignore-term").write_text("")
    _ready_warm()
    running = start_service(_spec(), tmp_path)
    process = running.process
    assert isinstance(process, WarmServerProcess)
    process.stop(grace_s=0.5)  # SIGTERM ignored: SIGKILL after the grace
    assert not process.running and process.returncode == -9
    assert group_gone(process.pid)


def test_a_warm_python_that_cannot_import_its_preload_leaves_a_fresh_server(
        work: Path, tmp_path: Path) -> None:
    """A broken warm Python never stops a run: its server starts as a fresh process."""
    import dataclasses

    spec = dataclasses.replace(_spec(), preload=["no_such_module_here"])
    running = start_service(spec, tmp_path)
    try:
        assert running.record["launch"] == FRESH and running.record["how"] == "fresh"
        assert _said(running.process.log_file)["preloaded"] is False
    finally:
        running.stop()
