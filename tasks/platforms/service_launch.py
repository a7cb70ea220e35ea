"""How a `LocalService`'s process starts: forked from its warm Python when there is one.

A model server's start is mostly its imports (vLLM's API server: 8 s on a quiet 2-core
machine, ~18 s beside a run's other start-up). A service that declares ``preload`` gets a
warm Python of its own (`core.warm_python`), as a workload does: a run that finds none
starts it when it starts its server, and forks the server from it once its imports are
done (`launch_server`: the imports the fresh server would have made, once); it stays for
the next runs, which fork theirs at once. A run whose cells are done offers it again
(`offer_warm_service`: one that expired or died mid-run is started beside the run's
post-processing, never beside a measurement). With ``TELLTALE_WARM_PYTHON_MINUTES=0`` every
server is a fresh process. What a forked server shares with a fresh one, and what it does
not (its memory starts as the warm Python's pages), is `core.warm_python`'s; the server's
record says which it was (``launch``), and a project makes it part of its runs' identity.

A warm Python still importing when the server is asked for is waited for in a thread (the
run's start goes on meanwhile): importing a second copy beside it would slow both. If it
never gets ready, the server starts fresh from the next `WarmServerProcess.running` check:
in the thread that asks, which is the thread that would have started it (a fresh process's
parent-death signal is tied to the thread that started it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.environment import env_settings
from core.safeio import open_append, write_text
from core.warm_child import WarmChild, WarmPythonGone, start_warm
from core.warm_python import WarmPython, acquire, starting
from projects.contract import LocalService
from projects.library.runs import FORKED, FRESH
from tasks.hostwatch import count_as_run, uncount
from tasks.platforms.local_warm import command_warm_key, offer_command
from tasks.process import ManagedProcess, log_tail
from tasks.runner import CMDLINE_FILE, PID_FILE

__all__ = ["WarmServerProcess", "launch_server", "offer_warm_service", "service_warm_key"]

logger = logging.getLogger("telltale.service")

_WAIT_S = 180.0  # for a warm Python still importing (as a workload waits: `acquire`)


def service_warm_key(spec: LocalService) -> str | None:
    """The key of ``spec``'s warm Python; None when it takes none.

    None: nothing to preload, or warm Pythons are off (``TELLTALE_WARM_PYTHON_MINUTES=0``).
    """
    if not spec.preload or env_settings().warm_python_minutes <= 0:
        return None
    return command_warm_key(spec.argv, spec.preload, spec.env)


def offer_warm_service(spec: LocalService) -> bool:
    """Leave a warm Python for ``spec``'s next start (`core.warm_python.offer`).

    True when one was started now; never fails a run (False, the reason logged).
    """
    key = service_warm_key(spec)
    return key is not None and offer_command(spec.argv, spec.preload, spec.env, key)


def launch_server(name: str, spec: LocalService, argv: Sequence[str],
                  home: Path) -> ManagedProcess | WarmServerProcess:
    """Start ``argv`` (``spec``'s command, its port filled in) for ``spec``, in ``home``.

    Forked from ``spec``'s warm Python: the one ready, or importing, or one started now
    when there is none (its imports are what the fresh server's would have been, once);
    a fresh process when warm Pythons are off or none could be started.
    """
    try:
        key = service_warm_key(spec)
        if key is not None:
            ready = acquire(key, wait_s=0)
            if ready is None and not starting(key):
                offer_command(spec.argv, spec.preload, spec.env, key)
            if ready is not None or starting(key):
                return WarmServerProcess(name, argv, home, spec.env, key, ready)
    except Exception as exc:  # a broken warm Python never stops a run: a fresh server
        logger.warning("no warm python for the %s server: %s", spec.key, exc)
    return ManagedProcess(name, argv, home, env=spec.env)


class WarmServerProcess:
    """A server forked from its warm Python, with `ManagedProcess`'s interface.

    It has the same files (log, pid, command line: cleanup and the janitor find it as they
    find a fresh one), runs in its own session, and is counted as the run's
    (`tasks.hostwatch.count_as_run`: it is not a descendant of the run). Where the warm
    Python was still importing, a thread waits for it and orders the fork; a warm Python
    that never got ready leaves the start to a fresh `ManagedProcess` (see the module).
    """

    def __init__(self, name: str, argv: Sequence[str], home: Path, env: Mapping[str, str],
                 key: str, ready: WarmPython | None) -> None:
        self.name = name
        self.home = home
        self._argv = [str(a) for a in argv]
        self._env = dict(env)  # beside this process's environment when it starts
        self._key = key
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._child: WarmChild | None = None
        self._fresh: ManagedProcess | None = None
        self._thread: threading.Thread | None = None
        home.mkdir(parents=True, exist_ok=True)
        write_text(home / CMDLINE_FILE, "\0".join(self._argv))
        open_append(self.log_file).close()
        if ready is not None:
            self._order(ready)
        else:
            self._thread = threading.Thread(target=self._wait_and_order, daemon=True,
                                            name=f"warm-{name}")
            self._thread.start()

    @property
    def log_file(self) -> Path:
        """Its stdout and stderr."""
        return self.home / f"{self.name}.log"

    @property
    def launch(self) -> str:
        """How it was started (`projects.library.runs`): forked, its warm Python's pid."""
        if self._child is not None:
            return f"{FORKED} {self._child.warm.pid}"
        return FRESH

    @property
    def pid(self) -> int:
        """Its pid once it runs (0 while its warm Python imports)."""
        if self._fresh is not None:
            return self._fresh.pid
        return self._child.pid if self._child is not None else 0

    @property
    def returncode(self) -> int | None:
        """Its exit code once it ended, else None."""
        if self._fresh is not None:
            return self._fresh.returncode
        return self._child.poll() if self._child is not None else None

    @property
    def running(self) -> bool:
        """It runs, or waits for its warm Python to fork it.

        A wait that ended without one starts it fresh here (see the module): this is the
        check the thread that asked for the server makes while it waits for its health.
        """
        if self._fresh is not None:
            return self._fresh.running
        if self._child is not None:
            return self._child.poll() is None
        if self._thread is not None and self._thread.is_alive():
            return True
        if self._cancelled.is_set():
            return False
        with self._lock:
            if self._child is None:  # the thread ended without a child
                logger.info("no warm python for the %s server: a fresh process", self.name)
                self._fresh = ManagedProcess(self.name, self._argv, self.home,
                                             env=self._env)
        return self.running

    def _wait_and_order(self) -> None:
        try:
            ready = acquire(self._key, wait_s=_WAIT_S, cancelled=self._cancelled)
            if ready is not None:
                self._order(ready)
        except Exception as exc:  # a fresh start follows (`running`)
            logger.warning("the warm python did not start the %s server: %s", self.name, exc)

    def _order(self, warm: WarmPython) -> None:
        with self._lock:  # never beside a stop or a move of its home
            if self._cancelled.is_set():
                return
            try:
                child = start_warm(warm, self._argv, env={**os.environ, **self._env},
                                   output_file=self.log_file)
            except OSError as exc:  # not reached: a fresh start follows (`running`)
                logger.info("warm python %s not reached (%s)", warm.pid, exc)
                return
            count_as_run(child.pid)
            write_text(self.home / PID_FILE, f"{child.pid}\n")
            self._child = child  # last: whoever sees its pid finds its pid file

    def move_home(self, home: Path) -> None:
        """Move its directory to ``home`` (same file system; its open log follows)."""
        with self._lock:
            # safeio-exempt: renames a directory of this run (the server's home)
            os.replace(self.home, home)
            self.home = home
            if self._fresh is not None:
                self._fresh.home = home

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to its session, SIGKILL after ``grace_s``; a wait for its fork ends."""
        self._cancelled.set()
        if self._thread is not None:
            self._thread.join()  # `acquire` sees the event within 0.1 s; an order takes ms
        if self._fresh is not None:
            self._fresh.stop(grace_s)
            return
        child = self._child
        if child is not None:
            child.signal_group(signal.SIGTERM)
            with contextlib.suppress(TimeoutError, WarmPythonGone):  # gone: it died with it
                child.wait(grace_s)
            child.signal_group(signal.SIGKILL)  # what outlived the leader
            with contextlib.suppress(TimeoutError, WarmPythonGone):  # its exit code, heard
                child.wait(10.0)
            child.close()
            uncount(child.pid)
        (self.home / PID_FILE).unlink(missing_ok=True)

    def tail(self, size: int = 2000) -> str:
        """The end of its log."""
        return log_tail(self.log_file, size)
