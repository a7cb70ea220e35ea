"""A project's `LocalService` on this machine: started once, shared by cells, always stopped.

The server lives in ``<run>/services/<key>/`` (``server.log``, ``service.json``, the pid and
command-line files `cleanup_local` knows), so a Ctrl-C, a failed cell or a SIGKILL of
Telltale never leaves it behind. Readiness is its health endpoint answering 200; a server
that exits while starting fails at once with the end of its log, not at the deadline.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from core.errors import StepError
from core.loopback import loopback_url
from core.safeio import write_text
from projects.contract import LocalService
from projects.library.runs import FORKED
from tasks.platforms.service_launch import WarmServerProcess, launch_server
from tasks.process import ManagedProcess, free_port

__all__ = ["RunningService", "SERVICE_FILE", "start_ahead", "start_service", "stop_ahead",
           "take_ahead"]

logger = logging.getLogger("telltale.service")

SERVICE_FILE = "service.json"
"""What a started server was: key, URL, start-up time, the project's facts."""
_POLL_S = 0.1  # a refused connection costs ~1 ms; a ready server waits 50 ms on average
_SAY_EVERY_S = 15.0


@dataclass
class RunningService:
    """A server this run started (see `start_service`)."""

    spec: LocalService
    url: str
    process: ManagedProcess | WarmServerProcess
    startup_s: float
    record: dict[str, Any]

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL) and record when."""
        self.process.stop(grace_s=30.0)
        self.record["stopped_at"] = datetime.now(UTC).isoformat()
        _write(self.process.home, self.record)


def _write(home: Path, record: dict[str, Any]) -> None:
    write_text(home / SERVICE_FILE, json.dumps(record, indent=2) + "\n")


def service_home(root: Path, key: str) -> Path:
    """``<run>/services/<key as a file name>``."""
    return root / "services" / (re.sub(r"[^A-Za-z0-9_.-]+", "-", key).strip("-.")[:80]
                                or "service")


@dataclass
class _Launched:
    """A server process started, not yet known to be ready."""

    spec: LocalService
    url: str
    process: ManagedProcess | WarmServerProcess
    started_at: datetime
    began: float


def _launch(spec: LocalService, home: Path) -> _Launched:
    port = free_port()
    argv = [str(a).replace("{port}", str(port)) for a in spec.argv]
    url = loopback_url(port)
    logger.info("starting %s server on %s (up to %.0f s)", spec.key, url, spec.ready_timeout_s)
    started_at, began = datetime.now(UTC), time.monotonic()
    return _Launched(spec, url, launch_server("server", spec, argv, home), started_at, began)


class _ExitedWhileStarting(StepError):
    """The server process ended before its health endpoint answered."""


def _ready(launched: _Launched, root: Path) -> RunningService:
    process, spec = launched.process, launched.spec
    try:
        _wait_healthy(process, launched.url + spec.health_path, spec.ready_timeout_s,
                      launched.began)
    except BaseException:
        process.stop(grace_s=10.0)
        raise
    startup = time.monotonic() - launched.began
    record = {"key": spec.key, "url": launched.url, "pid": process.pid,
              "started_at": launched.started_at.isoformat(), "startup_s": round(startup, 3),
              "log": str(process.log_file.relative_to(root)), "launch": process.launch,
              **dict(spec.facts),
              **(dict(spec.forked_facts) if process.launch.startswith(FORKED) else {})}
    _write(process.home, record)
    logger.info("%s server ready in %.1f s", spec.key, startup)
    return RunningService(spec=spec, url=launched.url, process=process, startup_s=startup,
                          record=record)


def start_service(spec: LocalService, root: Path) -> RunningService:
    """Start ``spec`` on a free port and wait until its health endpoint answers 200.

    A server started ahead for this key (`start_ahead`) is taken instead: its dir moves into
    the run (the running server keeps its open log) and its start-up time counts from its
    real start. One taken that then exits while starting is started again, once, here.

    Args:
        spec: What to run.
        root: The run's artifact dir.

    Returns:
        The running server.

    Raises:
        StepError: It exited while starting, or was not ready within its timeout (it is
            stopped; the message quotes the end of its log).
    """
    home = service_home(root, spec.key)
    launched = take_ahead(spec, home)
    if launched is not None:
        try:
            return _ready(launched, root)
        except _ExitedWhileStarting as exc:
            # Started ahead is best effort: one that dies after it was taken (what it reads
            # changed under it, a first run's model built meanwhile) never fails a cell a
            # fresh start passes. Its log stays above the fresh one's (the log appends).
            logger.warning("the %s server started ahead exited while starting: starting "
                           "it again (%s)", spec.key, str(exc).splitlines()[0])
    return _ready(_launch(spec, home), root)


_AHEAD: list[_Launched] = []  # started by a CLI before its run exists (one per process)


def start_ahead(spec: LocalService, parent: Path) -> None:
    """Start a run's first server before the run does, in a hidden dir of ``parent``.

    A CLI run spends ~12 s starting Prefect's temporary API; a model server started then
    loads meanwhile. The run takes it (`start_service` → `take_ahead`) when its first cell
    asks for the same key and argv; `stop_ahead` stops one no run took.
    """
    parent.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=".service-", dir=parent))
    _AHEAD.append(_launch(spec, home))


def take_ahead(spec: LocalService, home: Path) -> _Launched | None:
    """The server started ahead for ``spec``, moved to ``home``; None when there is none.

    One started for another key or command, or one that already died (e.g. its model was
    not built yet on a first run), is stopped and removed instead.
    """
    while _AHEAD:
        launched = _AHEAD.pop()
        same = launched.spec.key == spec.key and list(launched.spec.argv) == list(spec.argv)
        if same and launched.process.running:
            home.parent.mkdir(parents=True, exist_ok=True)
            if home.exists():  # a resumed run's earlier server: keep its files aside
                # safeio-exempt: renames a directory of this run (the server's home)
                os.replace(home, home.with_name(f"{home.name}.before-{int(time.time())}"))
            launched.process.move_home(home)  # same file system: its open log follows
            return launched
        _discard(launched)
    return None


def _discard(launched: _Launched) -> None:
    launched.process.stop(grace_s=10.0)
    shutil.rmtree(launched.process.home, ignore_errors=True)


def stop_ahead() -> None:
    """Stop a server started ahead that no run took, and remove its dir."""
    while _AHEAD:
        _discard(_AHEAD.pop())


def _wait_healthy(process: ManagedProcess | WarmServerProcess, health: str, timeout_s: float,
                  began: float) -> None:
    said = began
    with httpx.Client(timeout=5.0) as client:
        while True:
            if not process.running:
                raise _ExitedWhileStarting(
                    f"the server exited with {process.returncode} while starting; end "
                    f"of {process.log_file}:\n{process.tail(1500).strip()}")
            try:
                if client.get(health).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            now = time.monotonic()
            if now - began > timeout_s:
                raise StepError(f"the server was not ready after {timeout_s:.0f} s "
                                f"({health}); end of {process.log_file}:\n"
                                f"{process.tail(1000).strip()}")
            if now - said >= _SAY_EVERY_S:
                logger.info("waiting for the server: %.0f s", now - began)
                said = now
            time.sleep(_POLL_S)
