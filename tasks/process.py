"""Long-lived children of a run (Prometheus, a model server): started, found, stopped.

A `ManagedProcess` runs in its own session (a terminal's Ctrl-C reaches Telltale, which then
stops it in cleanup), dies with Telltale even on SIGKILL (`tasks.runner.die_with_parent`), and
leaves beside its log the pid and command-line files `tasks.platforms.local.cleanup_local` and
the janitor know, so another process can stop it and never a recycled pid.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.loopback import LOOPBACK_HOST
from core.pids import stop_session
from core.safeio import open_append, write_text
from tasks.runner import CMDLINE_FILE, PID_FILE, die_with_parent

__all__ = ["ManagedProcess", "free_port", "free_ports", "log_tail"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now (children bind them a moment later).

    The one way Telltale picks a port for a child. All are held open until all are chosen:
    picked one after the other, each socket closed before the next ``bind(0)``, the kernel
    may hand the same port out twice (a random start in the range each time: about 1 in
    14 000 a pair), and a Prometheus given its node exporter's port never starts (the
    likeliest cause of a spare's keeper gone at once, seen once in a suite run).
    """
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                 for _ in range(count)]
        for sock in socks:
            sock.bind((LOOPBACK_HOST, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    """One port of `free_ports` (a child that needs several asks for them together)."""
    return free_ports(1)[0]


class ManagedProcess:
    """A long-lived child of the run, with the files cleanup knows it by.

    Args:
        name: Its log is ``<home>/<name>.log``.
        argv: The command (no shell).
        home: Its directory (log, pid and command-line files).
        env: Extra environment variables.
    """

    def __init__(self, name: str, argv: Sequence[str], home: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        argv = [str(a) for a in argv]
        write_text(home / CMDLINE_FILE, "\0".join(argv))
        with open_append(self.log_file) as log:
            self.proc = subprocess.Popen(die_with_parent(argv), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         env={**os.environ, **(env or {})})
        write_text(home / PID_FILE, f"{self.proc.pid}\n")

    @property
    def launch(self) -> str:
        """How it was started (`projects.library.runs`): a fresh process."""
        # imported here: the runs' module brings the parser's models, and this module is
        # imported by every warm Python and spare Prometheus keeper at their start
        from projects.library.runs import FRESH

        return FRESH

    @property
    def log_file(self) -> Path:
        """Its stdout and stderr."""
        return self.home / f"{self.name}.log"

    @property
    def pid(self) -> int:
        """Its pid (its process group's id too)."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code once it ended and was reaped, else None."""
        return self.proc.returncode

    @property
    def running(self) -> bool:
        """It has not exited."""
        return self.proc.poll() is None

    def move_home(self, home: Path) -> None:
        """Move its directory to ``home`` (same file system; its open log follows)."""
        # safeio-exempt: renames a directory of this run (the process's home)
        os.replace(self.home, home)
        self.home = home

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to its session (it and its children), SIGKILL after ``grace_s``.

        The session, not only the leader: a model server's engine runs in a child process.
        """
        stop_session(self.proc, grace_s)  # children that outlived the leader too
        (self.home / PID_FILE).unlink(missing_ok=True)

    def tail(self, size: int = 2000) -> str:
        """The end of its log."""
        return log_tail(self.log_file, size)


def log_tail(path: Path, size: int = 2000) -> str:
    """The last ``size`` bytes of a process's log, as text ("" when unreadable)."""
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, stream.seek(0, os.SEEK_END) - size))
            return stream.read().decode("utf-8", "replace")
    except OSError:
        return ""
