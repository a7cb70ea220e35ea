"""One child of a warm Python, seen from the process that ordered it: its pid, its end.

`core.warm_python` forks a child per order and writes two lines on the order's connection:
the child's pid once it runs, its exit code once it ends. A workload is waited for at once
(`run_warm`); a server is ordered, then polled while it serves (`start_warm` →
`WarmChild`). The connection is the child's lifeline: when the process that ordered it goes
(the connection closes: a crash, a SIGKILL), the warm Python stops the child's group — what
a fresh process's parent-death signal does.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from core.pids import kill_leftovers
from core.warm_python import Order, WarmPython, socket_path

__all__ = ["WarmChild", "WarmPythonGone", "run_warm", "start_warm"]

_LINE = 4096


class WarmPythonGone(RuntimeError):
    """The warm Python ended while its child ran (the child dies with it)."""


class WarmChild:
    """A child a warm Python forked for this process (see `start_warm`).

    Its two lines are read from the socket by hand, not through a file object: a buffered
    reader can take the exit line with the pid's, where a poll of the socket no longer
    sees it, and a socket file refuses every read after one timed out.
    """

    def __init__(self, warm: WarmPython, conn: socket.socket) -> None:
        self.warm = warm
        self.pid = 0  # known once the warm Python answered the order (`start_warm`)
        self.returncode: int | None = None
        self.gone = False  # the warm Python ended under it
        self._conn = conn
        self._buffer = b""
        self._eof = False

    def poll(self) -> int | None:
        """Its exit code once it ended, else None; never blocks.

        A warm Python that died under it reads as exit 1 (`gone` says so); a child whose
        connection was closed before its end was heard of, as -1 (it is not followed any
        more: the warm Python stopped it).
        """
        if self._conn.fileno() < 0:
            return self.returncode if self.returncode is not None else -1
        while self.returncode is None and b"\n" not in self._buffer and not self._eof \
                and select.select([self._conn], [], [], 0)[0]:
            self._receive()
        if self.returncode is None and (b"\n" in self._buffer or self._eof):
            self._read_end()
        return self.returncode

    def wait(self, timeout: float | None) -> int:
        """Its exit code, waiting up to ``timeout`` seconds (None: no limit).

        Raises:
            TimeoutError: It still runs (it is not stopped here; wait again or signal it).
            WarmPythonGone: The warm Python died; so did the child.
        """
        if self.returncode is None:
            self._conn.settimeout(timeout)
            self._read_end()
        if self.gone:
            raise WarmPythonGone(f"the warm Python (pid {self.warm.pid}) ended while its "
                                 f"child {self.pid} ran")
        assert self.returncode is not None
        return self.returncode

    def _receive(self) -> None:
        data = self._conn.recv(_LINE)
        self._eof = not data
        self._buffer += data
        if len(self._buffer) > _LINE:
            raise ConnectionError(f"the warm Python (pid {self.warm.pid}) sent no line")

    def _line(self) -> bytes:
        """The next line; empty at the connection's end."""
        while b"\n" not in self._buffer and not self._eof:
            self._receive()
        if b"\n" not in self._buffer:
            return b""
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _read_end(self) -> None:
        line = self._line()  # TimeoutError past a wait's deadline
        if not line:
            self.gone, self.returncode = True, 1
            return
        self.returncode = int(json.loads(line)["exit"])

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to its process group (its session: it and its children).

        Only while it runs, but for SIGKILL, which also reaches children that outlived it.
        """
        if self.pid > 0 and (self.returncode is None or sig == signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def close(self) -> None:
        """Close the connection: a child still running is then stopped by the warm Python."""
        self._conn.close()


def start_warm(warm: WarmPython, argv: Sequence[str], *, env: Mapping[str, str],
               output_file: Path) -> WarmChild:
    """Order ``argv`` (``PYTHON -m MODULE ARGS``) from the warm Python; the running child.

    Args:
        warm: From `core.warm_python.acquire`.
        argv: The command line a fresh process would have run.
        env: Its whole environment.
        output_file: Its stdout and stderr, appended (opened by the child when it starts).

    Raises:
        OSError: The warm Python could not be reached or took no order (nothing started).
    """
    order = Order(argv=[str(a) for a in argv], env=dict(env), cwd=os.getcwd(),
                  output_file=str(output_file))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    child = WarmChild(warm, conn)
    try:
        conn.settimeout(30)
        with socket_path(warm.directory) as path:
            conn.connect(path)
        conn.sendall(order.model_dump_json().encode() + b"\n")
        try:  # no answer: a warm Python stopping (SIGTERM) takes no more orders
            child.pid = int(json.loads(child._line())["pid"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConnectionRefusedError(f"the warm Python (pid {warm.pid}) took no order: "
                                         f"{exc}") from None
    except BaseException:
        conn.close()
        raise
    return child


def run_warm(warm: WarmPython, argv: Sequence[str], *, env: Mapping[str, str],
             output_file: Path, timeout: float | None,
             on_start: Callable[[int], None] | None = None) -> int:
    """Run ``argv`` (``PYTHON -m MODULE ARGS``) as a child of the warm Python; its exit code.

    Args:
        warm: From `core.warm_python.acquire`.
        argv: The workload's command line (what a fresh process would have run).
        env: Its whole environment.
        output_file: Its stdout and stderr, appended.
        timeout: Seconds before its process group is killed (`TimeoutError`).
        on_start: Called with the child's pid once it runs (the run's pid file).

    Raises:
        TimeoutError: The deadline passed (the group was killed).
        WarmPythonGone: The warm Python died; so did the child.
        OSError: The warm Python could not be reached (nothing was started).
    """
    child = start_warm(warm, argv, env=env, output_file=output_file)
    try:
        if on_start is not None:
            on_start(child.pid)
        code = child.wait(timeout)
        kill_leftovers(child.pid)  # its session's processes that outlived it
        return code
    except BaseException:  # Ctrl-C, cancellation, a deadline: never leave the child running
        child.signal_group(signal.SIGKILL)
        raise
    finally:
        child.close()
