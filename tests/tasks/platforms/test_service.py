"""A project's LocalService on the local platform: real processes, real HTTP health checks."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from core.errors import StepError
from projects import registry
from projects.config import resolve
from projects.contract import CellContext, LocalService
from projects.plan import cells_of
from tasks.artifacts import use_artifact_dir
from tasks.platforms.base import RunContext
from tasks.platforms.local import LocalPlatform, cleanup_local
from tasks.platforms.service import SERVICE_FILE, start_service
from tasks.runner import PID_FILE


def _http_server(key: str = "web") -> LocalService:
    return LocalService(key=key, argv=[sys.executable, "-m", "http.server", "{port}",
                                       "--bind", "127.0.0.1"],
                        health_path="/", ready_timeout_s=120, facts={"runtime": "http.server"})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_service_starts_answers_and_stops_with_its_record(tmp_path: Path) -> None:
    service = start_service(_http_server(), tmp_path)
    record = json.loads((tmp_path / "services" / "web" / SERVICE_FILE).read_text())
    assert record["url"] == service.url and record["runtime"] == "http.server"
    assert record["startup_s"] >= 0 and (tmp_path / "services" / "web" / PID_FILE).is_file()
    pid = service.process.proc.pid
    assert _alive(pid)
    service.stop()
    assert not _alive(pid)
    assert "stopped_at" in json.loads((tmp_path / "services" / "web" / SERVICE_FILE).read_text())
    assert not (tmp_path / "services" / "web" / PID_FILE).exists()


def test_a_server_that_exits_while_starting_fails_at_once_with_its_log(tmp_path: Path) -> None:
    spec = LocalService(key="broken", argv=[sys.executable, "-c",
                                            "import sys; print('no model here'); sys.exit(3)"],
                        ready_timeout_s=3600)  # the exit is seen, not the deadline
    with pytest.raises(StepError, match="exited with 3") as caught:
        start_service(spec, tmp_path)
    assert "no model here" in str(caught.value)


def test_a_server_never_ready_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    spec = LocalService(key="silent", argv=[sys.executable, "-c", "import time; time.sleep(600)"],
                        ready_timeout_s=1)
    with pytest.raises(StepError, match="not ready after 1 s"):
        start_service(spec, tmp_path)
    assert not (tmp_path / "services" / "silent" / PID_FILE).exists()  # stopped, reaped


def test_cleanup_from_another_process_stops_a_server_left_behind(tmp_path: Path) -> None:
    """What the cancellation hook and the janitor do: pid files, checked command lines."""
    service = start_service(_http_server(), tmp_path)
    pid = service.process.proc.pid
    assert cleanup_local(tmp_path)["stopped_pids"] == [pid]
    service.process.proc.wait(30)
    assert not _alive(pid)


def _run_ctx(tmp_path: Path) -> tuple[RunContext, list]:
    """The llm_serving sweep's cells, with the server replaced by a small HTTP server whose
    key is the cell's prompt length (so the sweep's two shapes need two servers)."""
    project = registry.load("llm_serving")

    def hook(ctx: CellContext) -> LocalService:
        return _http_server(f"web-{ctx.settings.prompt_tokens}")

    project = dataclasses.replace(project, local_service=hook)
    config = resolve("llm_serving", presets=["sweep"], env={})
    test = config.model.tests.llm_serving
    cells = cells_of(config, "llm_serving")
    run = RunContext(project=project, config=config, model=config.model, test=test,
                     root=tmp_path, run_id="test-run")
    return run, cells


def test_cells_share_a_server_by_key_and_cleanup_stops_it(tmp_path: Path,
                                                          prefect_harness: None) -> None:
    run, cells = _run_ctx(tmp_path)
    platform = LocalPlatform()
    first = platform._service(run, cells[0])
    assert first is not None
    same = platform._service(run, cells[1])  # same shape, another concurrency
    assert same == first  # one server, not one per cell
    other = next(c for c in cells if c.settings["prompt_tokens"] != cells[0].settings[
        "prompt_tokens"])
    second = platform._service(run, other)
    assert second is not None and second["url"] != first["url"]
    assert not _alive(first["pid"])  # the first server was stopped for the second
    with use_artifact_dir(tmp_path):
        platform.cleanup(run)
    assert not _alive(second["pid"])
    assert sorted(p.name for p in (tmp_path / "services").iterdir()) == ["web-128", "web-256"]


def test_a_server_that_died_between_cells_is_started_again(tmp_path: Path,
                                                          prefect_harness: None) -> None:
    run, cells = _run_ctx(tmp_path)
    platform = LocalPlatform()
    first = platform._service(run, cells[0])
    assert platform.service is not None
    platform.service.process.proc.kill()
    platform.service.process.proc.wait()
    again = platform._service(run, cells[1])
    assert again is not None and again["pid"] != first["pid"] and _alive(again["pid"])
    with use_artifact_dir(tmp_path):
        platform.cleanup(run)
    assert not _alive(again["pid"])


def test_a_server_started_ahead_is_taken_by_the_run_and_moved_into_it(tmp_path: Path) -> None:
    from tasks.platforms import service as svc

    svc.start_ahead(_http_server(), tmp_path)
    hidden = next(tmp_path.glob(".service-*"))
    ahead_pid = int((hidden / PID_FILE).read_text())
    running = start_service(_http_server(), tmp_path / "run")
    try:
        assert running.process.proc.pid == ahead_pid  # taken, not started again
        assert not hidden.exists()
        assert (tmp_path / "run" / "services" / "web" / PID_FILE).is_file()
        assert running.process.log_file.is_file()  # the running server's log moved with it
    finally:
        running.stop()
    assert not _alive(ahead_pid)


def test_a_server_started_ahead_for_another_key_is_stopped_not_used(tmp_path: Path) -> None:
    from tasks.platforms import service as svc

    svc.start_ahead(_http_server("other"), tmp_path)
    hidden = next(tmp_path.glob(".service-*"))
    ahead_pid = int((hidden / PID_FILE).read_text())
    running = start_service(_http_server(), tmp_path / "run")
    try:
        assert running.process.proc.pid != ahead_pid and not _alive(ahead_pid)
        assert not hidden.exists()
    finally:
        running.stop()
    svc.start_ahead(_http_server(), tmp_path)  # one no run takes: the CLI stops it at exit
    hidden = next(tmp_path.glob(".service-*"))
    ahead_pid = int((hidden / PID_FILE).read_text())
    svc.stop_ahead()
    assert not _alive(ahead_pid) and not hidden.exists()


# Started ahead, it exits once the run has taken it (its log moved out of the hidden
# `.service-*` dir): what a first run's vLLM did when its model was built meanwhile. Any
# later start (the marker is gone) serves.
_DIES_ONCE_TAKEN = """
import os, runpy, sys, time
try:
    os.remove(sys.argv[1])
except FileNotFoundError:
    sys.argv = ["http.server", sys.argv[2], "--bind", "127.0.0.1"]
    runpy.run_module("http.server", run_name="__main__")
else:
    while ".service-" in os.readlink("/proc/self/fd/1"):
        time.sleep(0.05)
    print("ahead: what it read changed under it", flush=True)
    sys.exit(3)
"""


def test_a_server_started_ahead_that_exits_once_taken_is_started_again(tmp_path: Path) -> None:
    from tasks.platforms import service as svc

    marker = tmp_path / "first-start"
    marker.touch()
    spec = LocalService(key="web", argv=[sys.executable, "-c", _DIES_ONCE_TAKEN, str(marker),
                                         "{port}"], health_path="/", ready_timeout_s=120)
    svc.start_ahead(spec, tmp_path)
    ahead_pid = int((next(tmp_path.glob(".service-*")) / PID_FILE).read_text())
    running = start_service(spec, tmp_path / "run")
    try:
        assert running.process.proc.pid != ahead_pid and not _alive(ahead_pid)
        assert running.process.running and not marker.exists()
        # the first one's last words stay in the one log, above the fresh start's
        assert "ahead: what it read changed under it" in running.process.log_file.read_text()
        assert [p.name for p in (tmp_path / "run" / "services").iterdir()] == ["web"]
    finally:
        running.stop()


def test_a_server_that_needs_what_a_first_run_builds_is_not_started_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llm_serving's vLLM reads the tiny model the prepare builds: none ahead before it is."""
    from tasks.platforms import service as svc
    from tasks.platforms.local_ahead import _service_ahead

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no model built here
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    project = registry.load("llm_serving")
    config = resolve("llm_serving", presets=["light"],
                     overrides={"tests.llm_serving.local.venv": str(venv)}, env={})
    runs = tmp_path / "runs"
    _service_ahead(project, config, runs / "run")
    assert not list(runs.glob(".service-*"))  # the model is missing: nothing started
    context = CellContext(settings=cells_of(config, "llm_serving")[0].typed_as(
        project.settings_model), test=project.test_block(config.model), index=1, name="c",
        workdir=tmp_path, data_dir=project.data_dir, run_id="t")
    needs = project.local_service(context).needs
    assert needs and all(str(tmp_path / "cache") in n for n in needs)
    for need in needs:  # as the prepare leaves it
        Path(need).parent.mkdir(parents=True, exist_ok=True)
        Path(need).write_text("{}")
    try:
        _service_ahead(project, config, runs / "run")
        assert len(list(runs.glob(".service-*"))) == 1  # now it starts ahead
    finally:
        svc.stop_ahead()
    assert not list(runs.glob(".service-*"))
