"""A warm Python: an interpreter with a workload's heavy imports done, forking one child a run.

The local fine-tuning trainer spends ~5 s of a ~10 s process importing torch and transformers
(`docs/performance.md`), every run, before its first step. A run on the local platform
therefore leaves a *warm Python* behind (``python -m core.warm_python``): it imports the
modules the workload declares (`projects.contract.LocalWorkload.preload`), then waits on a
Unix socket. A later run asks it for the workload; it forks a child that becomes that
workload exactly as ``python -m MODULE ARGS`` would have started it:

- its own session (a process group the run's cleanup can stop), a parent-death signal (it
  dies with the warm Python), the run's environment, working directory, stdin closed and
  stdout/stderr appended to the run's log (unbuffered when the environment says so);
- its command line rewritten to the workload's (``/proc/PID/cmdline``: the process exporter
  matches the cell's step dir in it, cleanup compares it with ``workload.cmdline``), the
  module run by `runpy` as ``__main__``, Python's and NumPy's global random state reseeded
  from the OS (a fresh interpreter's would be), its exit code the workload's; it ends as
  `core.exit.exit_now` ends a command (threads joined, ``atexit`` handlers run, streams
  flushed), without tearing down the preloaded modules (1.9 s with GuideLLM's);
- when the run that asked goes away (its connection closes: a crash, a SIGKILL), the warm
  Python sends SIGTERM to the child's group, as the fresh process's parent-death signal did.

Only the heavy third-party modules are kept from the warm Python: the child drops
Telltale's own modules the warm Python imported (itself, ``core``...) and imports the
workload's module fresh, so an edited trainer runs as edited. A warm Python is
used only by a request with the same key (`core.warm_key`: the interpreter, the modules, the
working directory, this module's source and every environment variable that an import may
read). It stops after ``TELLTALE_WARM_PYTHON_MINUTES`` with no child and no request, or on
SIGTERM once its children are done.

It is **on by default** (``TELLTALE_WARM_PYTHON_MINUTES``, default 10; 0: every workload is
a fresh interpreter). A run starts its warm Python at its own start when none is there (a
command line before Prefect is even imported), so its first cell forks too, its imports done
beside the run's other start-up. What a run measures differs with the launch, measured on
the light preset (`docs/performance.md`): the resource KPIs are means over the cell, and a
forked workload's cell has no import phase — its workload CPU read 20-30 % higher and its RSS
~15 % lower than a fresh one's —, so a history must not mix the two: each run records which
it got (``process.json``: ``launch``) and a project puts it among its labels
(`projects.library.runs.launch_label`), so the two are separate configurations. Also
different from a fresh process, by design: the hash seed (``PYTHONHASHSEED``) is the warm
Python's, shared by its children; the children's memory starts as the warm Python's pages
(copy-on-write).

The interpreter is the path a workload names (a venv's ``bin/python``), not the base Python
every venv links to: llm_serving's load script runs on the serving venv's Python, whose warm
Python has GuideLLM imported (`core.warm_key`: stamps read in that venv).

This module is the warm Python and how a run finds or starts one; `core.warm_child` is the
ordering side (a child ordered, its pid, its end), which reads the order's wire format and
the socket's path from here; `core.warm_command` is a command line's side (its stdio sent
with the order).

Over 500 lines: the server's loop, the fork and the child's becoming the ordered process
(a workload's output file or a command line's stdio) share the order, the signals held
across the fork and the record; split, each half would re-read the other's invariants.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from core import warm_command
from core.cmdline import set_cmdline
from core.environment import local_services_home
from core.exit import exit_now
from core.filelock import dir_lock
from core.pids import pid_alive
from core.safeio import UnreadableInputError, open_append, read_bounded, write_text
from core.terminal import say
from core.warm_command import FORWARDED
from core.warm_key import WARM_DIR, interpreter, socket_path, workload_module

__all__ = ["WARM_DIR", "Order", "WarmPython", "acquire", "offer", "socket_path", "starting",
           "stop_warm_pythons", "warm_base"]

_RECORD = "warm.json"
_LOCK = "lock"
_CMDLINE_ROOM = 8192  # bytes of command line a child can take (the warm Python's own padding)
_MAX_ORDER = 1 << 20
# Held in a child from the fork until it has a fresh interpreter's dispositions: SIGTERM
# (its requester gone at once), and what a command line's client passes on (Ctrl-C...),
# which the warm Python's own disposition (SIGINT ignored, when it was started by a
# process that ignores it) would otherwise drop
_HELD = frozenset({signal.SIGTERM, *FORWARDED})
_SOURCE = Path(__file__).resolve()
_REPO = _SOURCE.parents[1]  # Telltale's own code: never kept from the warm Python
class WarmRecord(BaseModel):
    """``warm.json``: a warm Python, written by itself once its imports are done."""

    pid: int = Field(gt=1)
    key: str = Field(pattern=r"^[0-9a-f]{16}$")
    modules: list[str] = Field(max_length=64)
    started: float
    ready_s: float = Field(ge=0)


class Order(BaseModel):
    """What a run (or a command line) asks the warm Python for: one process.

    ``output_file`` None: the order came with the requester's stdin, stdout and stderr
    (three file descriptors over the socket: `core.warm_command`), which the child takes.
    ``keep_modules``: the child keeps Telltale's own modules the warm Python imported (a
    command line's warm Python, keyed by the code's stamps), else it imports them afresh.
    """

    argv: list[str] = Field(min_length=3, max_length=1024)
    env: dict[str, str]
    cwd: str
    output_file: str | None = None
    keep_modules: bool = False


@dataclass
class WarmPython:
    """A ready warm Python a run uses (`acquire`)."""

    pid: int
    key: str
    directory: Path

    def as_record(self) -> dict[str, object]:
        """What a run's task receives (a plain dict crosses Prefect's task boundary)."""
        return {"pid": self.pid, "key": self.key, "directory": str(self.directory)}

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> WarmPython:
        """The inverse of `as_record`."""
        return cls(pid=int(str(record["pid"])), key=str(record["key"]),
                   directory=Path(str(record["directory"])))


def warm_base() -> Path:
    """Where this user's warm Pythons live (beside the shared local Prefect API's state)."""
    return local_services_home() / WARM_DIR


def _read_record(directory: Path) -> WarmRecord | None:
    try:
        return WarmRecord.model_validate_json(read_bounded(directory / _RECORD, 8192,
                                                           what=_RECORD))
    except (UnreadableInputError, ValidationError, OSError):
        return None


def _is_warm_python(pid: int, directory: Path) -> bool:
    """``pid`` runs this module for ``directory`` (never a recycled pid)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = read_bounded(f"/proc/{pid}/cmdline", 1 << 16, what="cmdline",
                               follow_links=True).split(b"\0")
    except (UnreadableInputError, OSError):
        return False
    return b"core.warm_python" in cmdline and str(directory).encode() in cmdline


def acquire(key: str, *, wait_s: float = 180.0, base: Path | None = None,
            cancelled: threading.Event | None = None) -> WarmPython | None:
    """The ready warm Python for ``key``, waiting for one that is still importing; or None.

    Waiting is cheaper than the alternative: a fresh workload would import the same modules
    beside it, on the same cores. ``cancelled``, once set, ends the wait (None).
    """
    directory = (base or warm_base()) / key
    deadline = time.monotonic() + wait_s
    while True:
        record = _read_record(directory)
        if record is not None and record.key == key and _is_warm_python(record.pid, directory):
            return WarmPython(pid=record.pid, key=key, directory=directory)
        if not starting(key, base=base) or time.monotonic() > deadline:
            return None
        if cancelled is not None and cancelled.wait(0.1):
            return None
        if cancelled is None:
            time.sleep(0.1)


def starting(key: str, *, base: Path | None = None) -> bool:
    """A warm Python for ``key`` runs: importing, or ready (`acquire` finds the latter)."""
    directory = (base or warm_base()) / key
    pid = _starting_pid(directory)
    return pid is not None and _is_warm_python(pid, directory)


def _starting_pid(directory: Path) -> int | None:
    try:
        return int(read_bounded(directory / "pid", 64, what="pid").strip())
    except (UnreadableInputError, OSError, ValueError):
        return None


def offer(key: str, python: str, modules: Sequence[str], cwd: str | Path,
          env: Mapping[str, str], *, minutes: float, base: Path | None = None) -> bool:
    """Start a warm Python for ``key`` unless one runs or starts already; True if started.

    It is detached (its own session, its log in its dir) and outlives the run that started
    it; it stops itself after ``minutes`` unused.
    """
    if minutes <= 0:
        return False
    root = base or warm_base()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)  # its dirs are named by keys, digests of an environment: not listed
    directory = root / key
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)  # whoever reaches its socket runs commands as this user
    with dir_lock(directory, _LOCK):
        if starting(key, base=root):
            return False
        (directory / _RECORD).unlink(missing_ok=True)
        (directory / "sock").unlink(missing_ok=True)
        with open_append(directory / "warm-python.log") as log:
            proc = subprocess.Popen(
                [python, "-m", "core.warm_python", str(directory), key, str(minutes * 60),
                 ",".join(modules), " " * _CMDLINE_ROOM],
                cwd=str(cwd), env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        write_text(directory / "pid", f"{proc.pid}\n")
    # never waited for: it outlives this process (a zombie until this one exits is harmless,
    # and `pid_alive` does not count a zombie as running)
    threading.Thread(target=proc.wait, daemon=True, name="warm-python-reaper").start()
    return True


def stop_warm_pythons(under: Path) -> list[int]:
    """SIGTERM every warm Python whose dir is under ``under``; their pids.

    Each ends once its running children are done (a test session's end, a janitor).
    """
    stopped = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = read_bounded(proc / "cmdline", 1 << 16, what="cmdline",
                                follow_links=True).split(b"\0")
        except (UnreadableInputError, OSError):
            continue
        if len(argv) > 3 and argv[1:3] == [b"-m", b"core.warm_python"] \
                and Path(os.fsdecode(argv[3])).is_relative_to(under):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGTERM)
                stopped.append(int(proc.name))
    return stopped


# --- the warm Python itself -------------------------------------------------------------------


@dataclass
class _Child:
    pid: int
    conn: socket.socket
    pidfd: int
    watching: bool = True  # its requester's connection is in the selector


@dataclass
class _Server:
    directory: Path
    idle_s: float
    listener: socket.socket
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    children: dict[int, _Child] = field(default_factory=dict)
    stopping: bool = False


_Ordered = tuple[Order, list[int]]  # an order and the file descriptors it came with


def _serve(directory: Path, key: str, idle_s: float, modules: Sequence[str]
           ) -> _Ordered | None:
    """Import ``modules``, then fork a child per order until idle; in a child, its order."""
    began, server_pid = time.monotonic(), os.getpid()
    for name in modules:
        importlib.import_module(name)
    # What was imported lives as long as the warm Python and every child: out of the
    # collector's sight. A child's full collection would otherwise walk every preloaded
    # object (touching, so copying, their pages): ~50 ms each in a post-processing's child
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket_path(directory) as path:
        listener.bind(path)
    listener.listen(16)
    server = _Server(directory=directory, idle_s=idle_s, listener=listener)
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "stopping", True))
    write_text(directory / _RECORD, WarmRecord(
        pid=os.getpid(), key=key, modules=list(modules), started=time.time(),
        ready_s=round(time.monotonic() - began, 3)).model_dump_json() + "\n")
    server.selector.register(listener, selectors.EVENT_READ, "accept")
    idle_since = time.monotonic()
    try:
        while True:
            if server.children:
                idle_since = time.monotonic()
            elif server.stopping or time.monotonic() - idle_since > idle_s:
                return None
            for selected, _ in server.selector.select(timeout=1.0):
                ordered = _handle(server, selected)
                if ordered is not None:
                    return ordered  # the child: it becomes the ordered process
    finally:
        if os.getpid() == server_pid:  # the warm Python ends (never a child leaving it)
            for name in (_RECORD, "sock", "pid"):
                (directory / name).unlink(missing_ok=True)


def _read_order(conn: socket.socket) -> _Ordered:
    """One order line and the file descriptors sent with it (a command line's stdio).

    Raises:
        ValueError: No whole line, one over `_MAX_ORDER`, or descriptors that do not fit
            the order (three with no ``output_file``, none with one); any received is
            closed.
    """
    data, fds = b"", []
    try:
        while b"\n" not in data:
            chunk, received, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            fds += received
            if not chunk:
                raise ValueError("the connection closed before a whole order")
            data += chunk
            if len(data) > _MAX_ORDER:
                raise ValueError(f"an order over {_MAX_ORDER} bytes")
        order = Order.model_validate_json(data.split(b"\n", 1)[0])
        if len(fds) != (3 if order.output_file is None else 0):
            raise ValueError(f"{len(fds)} file descriptor(s) sent with an order "
                             f"{'without' if order.output_file is None else 'with'} an "
                             "output file")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return order, fds


def _handle(server: _Server, selected: selectors.SelectorKey) -> _Ordered | None:
    """One ready socket or pidfd; returns an order only in a newly forked child."""
    tag = selected.data
    if tag == "accept":
        conn, _ = server.listener.accept()
        if server.stopping:
            conn.close()
            return None
        try:
            conn.settimeout(10)
            order, fds = _read_order(conn)
        except (OSError, ValidationError, ValueError) as exc:
            say(f"warm python: a bad order: {exc}", error=True)
            conn.close()
            return None
        if workload_module(order.argv) is None or \
                interpreter(order.argv[0]) != interpreter(sys.executable):
            say(f"warm python: refused an order for another interpreter or not `python -m`: "
                f"{order.argv[:3]}", error=True)
            conn.close()  # the run starts a fresh process
            for fd in fds:
                os.close(fd)
            return None
        return _fork(server, conn, order, fds)
    child: _Child = tag
    if server.children.get(child.pid) is not child:
        # A stale event of one select batch: the child's exit and its requester's hang-up
        # came together, and the exit, handled first, closed the connection this event is
        # for (unregistering a closed socket raised, and the warm Python died of it)
        return None
    if selected.fileobj == child.pidfd:  # the child exited
        _, status = os.waitpid(child.pid, 0)
        with contextlib.suppress(OSError):
            child.conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)})
                               .encode() + b"\n")
        server.selector.unregister(child.pidfd)
        if child.watching:
            server.selector.unregister(child.conn)
        os.close(child.pidfd)
        child.conn.close()
        del server.children[child.pid]
        return None
    # the requester's connection: closed means it is gone (crashed, killed)
    try:
        gone = not child.conn.recv(1, socket.MSG_DONTWAIT)
    except BlockingIOError:
        gone = False
    except OSError:
        gone = True
    if gone:
        server.selector.unregister(child.conn)
        child.watching = False
        _stop_child(child.pid)  # what its parent-death signal would send
    return None


def _stop_child(pid: int) -> None:
    """SIGTERM to a forked child's group; to the child itself while it has none yet.

    The child makes its group (`os.setsid`) a moment after the fork; until it has one the
    signal goes to its pid (never a stranger's: it is not reaped yet) and waits, held, until
    its disposition is a fresh interpreter's (`_fork`).
    """
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    except PermissionError:
        pass


def _fork(server: _Server, conn: socket.socket, order: Order, fds: list[int]
          ) -> _Ordered | None:
    sys.stdout.flush()
    sys.stderr.flush()
    # `_HELD` signals wait in the child until it is a workload (its own session, a fresh
    # interpreter's dispositions, `_become`): one sent before (its requester gone at once,
    # a Ctrl-C passed on) waits there instead of reaching the warm Python's handler or
    # disposition, or a group not made yet
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    pid = os.fork()
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    if pid == 0:  # the child: drop the server's sockets, keep nothing of it
        server.selector.close()
        server.listener.close()
        for other in server.children.values():
            other.conn.close()
            os.close(other.pidfd)
        conn.close()
        return order, fds
    for fd in fds:  # the child's now
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    child = _Child(pid=pid, conn=conn, pidfd=pidfd)
    server.children[pid] = child
    conn.setblocking(False)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        _stop_child(pid)
    server.selector.register(pidfd, selectors.EVENT_READ, child)
    server.selector.register(conn, selectors.EVENT_READ, child)
    # the module only: a command's arguments may name what its log should not hold
    say(f"warm python: child {pid} runs python -m {order.argv[2]}", error=True)
    return None


def _become(order: Order, fds: Sequence[int], warm_pid: int) -> int:
    """In the forked child: become the ordered process, run it, return its exit code."""
    from core.pids import set_parent_death_signal

    # first: the process exporter may look at any moment, and it decides a process's group
    # once, at its first sight (by pid and start time): a scan between the fork and this
    # line leaves the workload out of its group for good (its CPU and memory unmeasured;
    # measured, a process renamed after a first scan is never counted). Its ``-recheck``
    # re-reads every process each scrape: 31 ms a scrape instead of 2.3 here.
    set_cmdline(order.argv)
    os.setsid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != warm_pid:  # the warm Python died before the signal was set
        return 143
    # a fresh interpreter's dispositions (Python itself ignores SIGPIPE)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)  # held since the fork
    os.chdir(order.cwd)
    os.environ.clear()
    os.environ.update(order.env)
    if order.output_file is None:
        _take_stdio(fds)
    else:
        _take_output_file(order.output_file, unbuffered=bool(order.env.get("PYTHONUNBUFFERED")))
    _reseed()
    if not order.keep_modules:
        _forget_our_modules()
    else:  # the command line's own module checks this before it asks a warm Python
        warm_command.IN_WARM_CHILD = True
    target = workload_module(order.argv)
    assert target is not None  # checked before the fork (`_handle`)
    module, args = target
    sys.argv = [order.argv[0], *args]
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        say(code, error=True)  # what Python prints for sys.exit("message")
        return 1
    return 0


def _take_stdio(fds: Sequence[int]) -> None:
    """Take the requester's stdin, stdout and stderr, as a fresh interpreter opens them.

    The encoding is the warm Python's own (the same environment, keyed: the same locale
    and ``PYTHONIOENCODING``); stdout is line-buffered on a terminal, stderr always.
    """
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    encoding, errors = sys.__stdout__.encoding, sys.__stdout__.errors  # type: ignore[union-attr]
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding=encoding, errors=errors)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  encoding=encoding, errors=errors,
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  encoding=encoding, errors="backslashreplace",
                                  line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _take_output_file(output_file: str, *, unbuffered: bool) -> None:
    """Read /dev/null, write stdout and stderr to the end of ``output_file`` (a workload)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    with open_append(output_file) as out:  # never through a link, as the runner's
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    # the streams a fresh interpreter would open on these files (PYTHONUNBUFFERED: no
    # buffer under stdout; stderr's text layer always writes through)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8")
    out_raw = io.FileIO(1, "w", closefd=False)
    sys.stdout = io.TextIOWrapper(out_raw if unbuffered else io.BufferedWriter(out_raw),
                                  encoding="utf-8", write_through=unbuffered)
    err_raw = io.FileIO(2, "w", closefd=False)
    sys.stderr = io.TextIOWrapper(err_raw if unbuffered else io.BufferedWriter(err_raw),
                                  encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr


def _forget_our_modules() -> None:
    """Drop Telltale's own modules the warm Python imported (itself, ``core``...).

    The workload imports them afresh, so code edited since the warm Python started runs as
    edited. Only the third-party modules it preloads stay.
    """
    for name, module in list(sys.modules.items()):
        # a namespace package (``tasks``) has no file, only its path; read from the
        # module's own namespace: a lazy module's __getattr__ would import for a missing
        # name (transformers' does, and fails on what it lacks)
        namespace = getattr(module, "__dict__", None) or {}
        origin = namespace.get("__file__") or next(iter(namespace.get("__path__") or []), None)
        if not origin or name == "__main__":
            continue
        path = Path(origin).resolve()
        # a venv inside the checkout (.venv) holds the preloaded modules: they stay
        if path.is_relative_to(_REPO) and "site-packages" not in path.relative_to(_REPO).parts:
            del sys.modules[name]


def _reseed() -> None:
    """Reseed Python's and NumPy's global generators from the OS, as a fresh process would be."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def main(argv: Sequence[str]) -> int:
    """``python -m core.warm_python DIR KEY IDLE_S MODULES PADDING``."""
    directory, key, idle_s, modules = Path(argv[0]), argv[1], float(argv[2]), argv[3]
    warm_pid = os.getpid()
    ordered = _serve(directory, key, idle_s, [m for m in modules.split(",") if m])
    if ordered is None:
        return 0
    exit_now(_become(*ordered, warm_pid))  # the workload's end: no teardown of the preloads


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
