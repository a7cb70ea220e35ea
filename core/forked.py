"""Work done beside the caller, on the machine's other core: a forked child, its answer piped back.

A warm ``python -m analysis`` of 1 000 result dirs used one core of two for ~1.2 s: the
memo's stamps of the tree, the warm parse and the report each waited for the work before
them, though none reads what the other writes. `beside` starts such a piece of work in a
forked child and returns at once; `Beside.result` waits for the child's answer (its return
value, or the exception it raised, pickled through a pipe) — a wait on the pipe's end, never
on a clock.

A child is forked only where that is safe and useful, else the work runs at once in the
caller (the same answer, one core):

- a POSIX ``fork`` and at least two usable CPUs;
- **one thread in the process**: a fork copies only the calling thread, so a lock another
  thread held (Prefect's API client, a log handler's queue, an executor) would stay held
  in the child forever. Inside a flow run, whose tasks run in threads, everything runs
  inline; the command line (`python -m analysis`) forks;
- ``TELLTALE_BESIDE`` is not ``0`` (`core.environment`).

The child ignores SIGINT (the caller decides: an interrupted caller kills it), dies with
its parent (``PR_SET_PDEATHSIG``), freezes the garbage collector's view of what it
inherited (a collection would otherwise touch, and copy, every inherited page), and ends
with ``os._exit``: its parent's ``atexit`` handlers (temporary dirs, log flushes) are not
its own. Whatever it printed is flushed first; whatever the parent had buffered was
flushed before the fork, so nothing is printed twice.

Standard library only, but for the setting.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import signal
import struct
import sys
import tempfile
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar

__all__ = ["Beside", "ChildDied", "Claims", "Handoff", "at_once", "beside", "can_fork"]

T = TypeVar("T")
P = ParamSpec("P")

_CHILD_FAILED = 70  # the child could not even send its answer (EX_SOFTWARE)


class ChildDied(RuntimeError):
    """The child ended without an answer (a signal, the OOM killer, a failed send)."""


def can_fork() -> bool:
    """True when `beside` would fork here and now (see the module's conditions)."""
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    if usable < 2:
        return False
    from core.environment import env_settings

    return env_settings().beside


class Beside(Generic[T]):
    """Work started by `beside`: its answer, once `result` is asked.

    A context manager: leaving the block waits for the child's answer (`result` gives it
    then), unless an exception is leaving it (the caller failed or was interrupted): then a
    child still working is killed.
    """

    def __init__(self, pid: int | None, reader: int | None,
                 answer: tuple[bool, Any] | None = None) -> None:
        self.pid, self._reader, self._answer = pid, reader, answer

    @property
    def forked(self) -> bool:
        """True when the work runs (or ran) in a child."""
        return self.pid is not None

    def result(self) -> T:
        """The work's return value; its exception raised here if it raised one.

        Raises:
            ChildDied: The child ended without an answer.
        """
        if self._answer is None:
            self._answer = self._collect()
        ok, value = self._answer
        if not ok:
            raise value if isinstance(value, BaseException) else _rebuilt(*value)
        return value  # type: ignore[no-any-return]

    def _collect(self) -> tuple[bool, Any]:
        assert self.pid is not None and self._reader is not None
        chunks = []
        try:
            while chunk := os.read(self._reader, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(self._reader)
            self._reader = None
            _, status = os.waitpid(self.pid, 0)
        data = b"".join(chunks)
        if not data:
            return False, ChildDied(f"the work beside this process (pid {self.pid}) ended "
                                    f"without an answer: {_how_it_ended(status)}")
        answer: tuple[bool, Any] = pickle.loads(data)
        return answer

    def close(self) -> None:
        """Kill the child if its answer was never collected (idempotent)."""
        if self._reader is None or self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self._reader)
        self._reader = None
        os.waitpid(self.pid, 0)

    def __enter__(self) -> Beside[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if error is not None:
            self.close()
        elif self._answer is None:
            self._answer = self._collect()


class Claims:
    """The indices of ``n`` pieces of work, claimed from both ends by a process and its child.

    A shared anonymous page, made before the fork. The child claims from the first index on
    (`front`), the parent from the last down (`back`), until the two ends meet: each writes
    only its own end and reads the other's. Both ends only move towards each other, so no
    index is ever left unclaimed; two claims made at the same moment may take the same last
    index (each read the other's end just before it moved), and the caller keeps one answer
    for it. The parent's end starts open: the child may claim every index until the parent
    starts. `stop` closes the child's side (the parent then does what it did not).
    """

    _OPEN = 2**31 - 1

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, 8)  # MAP_SHARED | MAP_ANONYMOUS: both sides, one page
        struct.pack_into("<ii", self._page, 0, 0, self._OPEN)

    def front(self, n: int, leave: int = 0) -> int | None:
        """The child's next index, claimed; None once the ends met (or `stop`).

        ``leave``: None already while no more than that many are unclaimed — left to the
        parent, which claims them from its end (a child stopping a little early sends its
        answer while its parent still works).
        """
        first = struct.unpack_from("<i", self._page, 0)[0]
        if first >= min(struct.unpack_from("<i", self._page, 4)[0], n) - max(leave, 0):
            return None
        struct.pack_into("<i", self._page, 0, first + 1)
        return first

    def back(self, n: int) -> int | None:
        """The parent's next index from the last down, claimed; None once the ends met."""
        last = min(struct.unpack_from("<i", self._page, 4)[0], n) - 1
        if last < struct.unpack_from("<i", self._page, 0)[0]:
            return None
        struct.pack_into("<i", self._page, 4, last)
        return last

    def stop(self) -> None:
        """Let the child claim nothing more (nor the parent: it does the rest its own way)."""
        struct.pack_into("<i", self._page, 4, -1)


class Handoff:
    """A value a forked child gives its parent while it works on, pickled, then announced.

    Into an anonymous file (`os.memfd_create`, else a temporary file), announced on a pipe
    (`Beside.result` gives the child's last answer); with neither, the pipe carries it (the
    child then waits for its parent to take it). Made before the fork. `take` waits for the
    announcement — or for the pipe's end, when the child ended without giving (then None).
    Where no child was forked, the caller gave it already: the same answer.

    ``to_child``: the other way, the parent gives and the child takes (only where a child
    is forked: `can_fork`); the parent closes it once given, or to say it never will.
    """

    def __init__(self, *, to_child: bool = False) -> None:
        self._owner = os.getpid()
        self._to_child = to_child
        self._given: tuple[Any] | None = None
        self._data: int | None = _anonymous_file()
        self._read: int | None
        self._write: int | None
        self._read, self._write = os.pipe()

    def give(self, value: Any) -> None:
        """Hand ``value`` over (once)."""
        if os.getpid() == self._owner and not self._to_child:  # no child was forked: kept
            self._given = (value,)
            return
        assert self._write is not None
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        size = len(data).to_bytes(8, "little")
        if self._data is not None:
            os.pwrite(self._data, data, 0)  # at 0: the offset is shared with the parent
            data = b""
        view = memoryview(size + data)
        while view:
            view = view[os.write(self._write, view):]

    def take(self) -> Any:
        """The value given; None when the child ended without giving one.

        Waits on the pipe, never on a clock: its other end closes when the child ends.
        """
        if self._write is not None:  # this side's writer: else the pipe never ends
            os.close(self._write)
            self._write = None
        if self._given is not None:
            self.close()
            return self._given[0]
        try:
            size = self._read_pipe(8)
            if len(size) < 8:
                return None
            count = int.from_bytes(size, "little")
            data = os.pread(self._data, count, 0) if self._data is not None \
                else self._read_pipe(count)
            return pickle.loads(data) if len(data) == count else None
        finally:
            self.close()

    def _read_pipe(self, count: int) -> bytes:
        assert self._read is not None
        chunks: list[bytes] = []
        left = count
        while left and (chunk := os.read(self._read, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close the pipe and the file (idempotent)."""
        for end in (self._read, self._write, self._data):
            if end is not None:
                os.close(end)
        self._read = self._write = self._data = None


def _anonymous_file() -> int | None:
    """A file descriptor of an anonymous file, or None where none can be made."""
    try:
        return os.memfd_create("telltale-handoff")
    except (AttributeError, OSError):  # not Linux (or no memfd): a temporary file
        pass
    try:
        with tempfile.TemporaryFile(prefix="telltale-handoff-") as spare:
            return os.dup(spare.fileno())
    except OSError:  # no usable temporary dir: the pipe carries the value
        return None


def beside(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Beside[T]:
    """Start ``work(*args, **kwargs)`` in a forked child when `can_fork`; else run it now.

    The work must be what a child can do alone: what it returns (or raises) travels back
    pickled, and nothing it changes in memory is seen by the caller — only what it writes
    to files.

    Returns:
        A `Beside`: ``result()`` waits for the child and gives its answer.
    """
    if not can_fork():
        return at_once(work, *args, **kwargs)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(reader)
        _child(writer, work, args, kwargs)
    os.close(writer)
    return Beside(pid, reader)


def at_once(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Beside[T]:
    """``work(*args, **kwargs)`` done now, in this process, answered as `beside` answers.

    What `beside` does where it cannot fork; a caller chooses it where a child would cost
    more than it saves (the memory a child copies of what it touches).
    """
    try:
        return Beside(None, None, (True, work(*args, **kwargs)))
    except Exception as exc:  # raised from result(), as a child's would be
        return Beside(None, None, (False, exc))


def _child(writer: int, work: Callable[..., Any], args: Any, kwargs: Any) -> None:
    status = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _die_with_parent()
        gc.freeze()
        try:
            answer: tuple[bool, Any] = (True, work(*args, **kwargs))
        except Exception as exc:
            answer = (False, _portable(exc))
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - an answer pickle cannot carry
            data = pickle.dumps((False, _portable(exc)), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(writer, view):]
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        status = _CHILD_FAILED
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)  # never the parent's atexit handlers (core.exit's audit lists why)


def _portable(exc: Exception) -> tuple[type[Exception], tuple[Any, ...], dict[str, Any]]:
    """``exc`` as its class, its ``args`` and its attributes, ready to be pickled.

    Not the exception itself: pickle rebuilds one by calling its class with its ``args``,
    which fails for the many that take other parameters (`core.errors.ParseError`'s
    ``file``, `core.safeio.UnsafeOutputError`'s ``path``). What does not pickle this way
    either (a class defined in a function, an attribute holding a lock) travels as a
    RuntimeError that names it.
    """
    state = dict(vars(exc))
    if isinstance(exc, OSError):  # slots, not attributes: set apart from its args
        state.update(errno=exc.errno, strerror=exc.strerror, filename=exc.filename,
                     filename2=exc.filename2)
    parts = (type(exc), exc.args, state)
    try:
        pickle.loads(pickle.dumps(parts))
    except Exception:  # noqa: BLE001 - any failure means: send words instead
        return RuntimeError, (f"{type(exc).__name__}: {exc}",), {}
    return parts


def _rebuilt(kind: type[Exception], args: tuple[Any, ...], state: dict[str, Any]
             ) -> Exception:
    """The child's exception again, without calling its ``__init__``.

    The same class, args and attributes; its traceback stayed in the child.
    """
    exc = kind.__new__(kind, *args)
    exc.args = args
    for name, value in state.items():
        setattr(exc, name, value)
    return exc


def _die_with_parent() -> None:
    """Linux's ``PR_SET_PDEATHSIG``: a SIGKILLed parent leaves no child working on."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(_CHILD_FAILED)


def _how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = str(number)
        return f"killed by {name}" + (" (out of memory?)" if number == signal.SIGKILL else "")
    return f"exit status {os.waitstatus_to_exitcode(status)}"
