"""A command line served by a warm Python: ``python -m analysis`` without its imports.

``python -m analysis`` spends ~0.6 s of a warm 1 000-dir post-processing (~1.1 s) importing
pandas, pyarrow, pydantic and its own modules, every time (`docs/performance.md`). A
command line that ran in full therefore leaves a warm Python behind (`core.warm_python`,
the workloads' mechanism): an interpreter with those modules imported, Telltale's own
included, waiting on a Unix socket. The next command line with the same key asks it
(`served_warm`, before it imports anything of its own): it forks a child that takes this
process's stdin, stdout and stderr (sent over the socket), its working directory, its
environment and its arguments, runs the module as ``__main__`` as a fresh interpreter
would, and answers with its exit code, which this process exits with. Ctrl-C, SIGTERM,
SIGHUP and SIGQUIT sent to this process are passed on to the child's process group; if
this process dies, the warm Python stops the child (its connection closed).

Kept modules must never be stale: the key (`core.warm_key.warm_key` with ``code``) holds
the stamps of Telltale's code and of the installed packages, the interpreter, the working
directory and every environment variable but the shell's bookkeeping. An edited file, a
``pip install``, another variable: another key, a fresh interpreter (which then leaves a
warm Python for the new key); the old warm Python stops after its idle time. A command
line with interpreter options (``python -O -m ...``: `plain_command`) is never served.

Where the warm Pythons live: ``TELLTALE_PREFECT_API_HOME``, else ``PREFECT_HOME``, else
``~/.prefect`` (as `core.environment.local_services_home` reads them, here read raw: this
module imports nothing but the standard library and `core.warm_key`, ~10 ms), then
``telltale-warm-python/<key>``. ``TELLTALE_WARM_COMMAND_MINUTES`` (default 10; 0: every
command line is a fresh interpreter) sets how long one waits unused; the suite sets 0 but
for the tests of this path.

A warm Python still importing (the previous command line just started it) is waited for, up
to `_STARTING_WAIT_S`: it imports the same modules on the same cores a fresh interpreter
would. Anything else that goes wrong before the child runs (no warm Python, a stale
socket, a refused order) returns None: the caller runs the command itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from core.warm_key import WARM_DIR, code_locations, socket_path, warm_key

__all__ = ["FORWARDED", "IN_WARM_CHILD", "command_base", "command_key", "plain_command",
           "served_warm"]

IN_WARM_CHILD = False
"""True in a warm Python's child serving a command line (set by `core.warm_python`): the
command runs here, never asks again."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals this process passes on to the child serving it."""
_STARTING_WAIT_S = 5.0
_LINE = 4096


def command_base() -> Path:
    """Where this user's command-line warm Pythons live (see the module's docstring)."""
    home = os.environ.get("TELLTALE_PREFECT_API_HOME") or os.environ.get("PREFECT_HOME") \
        or "~/.prefect"
    return Path(home).expanduser() / WARM_DIR


def plain_command(module: str) -> bool:
    """This process was started as ``python -m module ...``, with no interpreter option.

    ``-O``, ``-W error``, ``-X dev``, ``-u``, ``-I``...: a warm Python, started without
    them, would run the command otherwise (its flags come from its environment alone), so
    such a command line is never served warm, nor leaves a warm Python.
    """
    return sys.orig_argv[1:3] == ["-m", module]


def command_key(preload: Sequence[str]) -> str:
    """This process's key for a command line with ``preload`` imported ahead."""
    return warm_key(sys.executable, preload, os.getcwd(), os.environ, code=code_locations())


def served_warm(key: str, module: str, args: Sequence[str]) -> int | None:
    """Run ``python -m module args`` in the warm Python for ``key``; its exit code, or None.

    None: no warm Python for this key could take it (nothing was run; the caller runs
    the command itself, and leaves one). ``key``: `command_key`.
    """
    directory = command_base() / key
    conn = _connect(directory)
    if conn is None:
        return None
    with conn, _forwarding() as name_child:
        order = {"argv": [sys.executable, "-m", module, *args], "env": dict(os.environ),
                 "cwd": os.getcwd(), "output_file": None, "keep_modules": True}
        try:
            conn.settimeout(30)
            data = json.dumps(order).encode("utf-8", "surrogateescape") + b"\n"
            sent = socket.send_fds(conn, [data], [0, 1, 2])
            if sent < len(data):  # never an empty send: a child that ran and ended at once
                conn.sendall(data[sent:])  # has had its connection closed (EPIPE)
            lines = _lines(conn)
            # the warm Python sends the pid first thing after the fork: no pid line, no
            # child (an order refused, a warm Python stopping), and the caller may run the
            # command itself; once the pid came, the command ran here, whatever follows
            name_child(int(json.loads(next(lines))["pid"]))
        except (OSError, ValueError, KeyError, TypeError, StopIteration, UnicodeError):
            return None
        conn.settimeout(None)
        try:
            code = int(json.loads(next(lines))["exit"])
        except (OSError, ValueError, KeyError, TypeError, StopIteration):
            from core.terminal import say  # only now: its redaction imports pydantic

            # the warm Python ended under its child (which dies with it)
            say("error: the warm Python serving this command ended; run it again",
                error=True)
            return 1
    return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it


def _connect(directory: Path) -> socket.socket | None:
    """A connection to ``directory``'s warm Python; waits for one still importing."""
    deadline = time.monotonic() + _STARTING_WAIT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with socket_path(directory) as path:
                conn.connect(path)
            return conn
        except OSError:
            conn.close()
        if not _importing(directory) or time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _importing(directory: Path) -> bool:
    """A warm Python for ``directory`` runs and has not bound its socket yet."""
    try:
        pid = int((directory / "pid").read_text(encoding="ascii").strip())
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read(1 << 16).split(b"\0")
    except (OSError, ValueError):
        return False
    return b"core.warm_python" in argv and str(directory).encode() in argv


def _lines(conn: socket.socket) -> Iterator[bytes]:
    """The connection's lines, read by hand (a buffered reader could hold the next one)."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            data = conn.recv(_LINE)
            if not data:
                return
            buffer += data
            if len(buffer) > _LINE:
                raise ValueError("the warm Python sent no line")
        line, buffer = buffer.split(b"\n", 1)
        yield line


def _forward(pid: int, signum: int) -> None:
    """Send ``signum`` to the child's group; to the child while it has none yet.

    The child makes its own session a moment after the fork.
    """
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    except PermissionError:
        pass


@contextlib.contextmanager
def _forwarding() -> Iterator[Callable[[int], None]]:
    """Pass `FORWARDED` signals on to the child's process group while it runs.

    Yields the call that names the child once its pid came: a signal that came before
    (the order sent, no answer yet) is passed on at that call, not later (a command that
    waits would never end: CI saw a Ctrl-C held for 600 s); with no child named, it is
    raised here once the handlers are restored.
    """
    child: list[int] = []
    early: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            _forward(child[0], signum)
        else:
            early.append(signum)

    def known(pid: int) -> None:
        child.append(pid)  # from here on the handler forwards itself; a signal it takes
        while early:  # between these lines finds the child named and never waits in early
            _forward(pid, early.pop(0))

    before = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        yield known
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if early and not child:  # no child took it: this process takes it, as it would have
        signal.raise_signal(early[0])
