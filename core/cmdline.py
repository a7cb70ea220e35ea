"""This process's command line, as ``ps`` and ``/proc/PID/cmdline`` show it, set in place.

A child forked from a warm Python (`core.warm_python`) is another program than the one its
command line names: it rewrites the command line's memory (the argv area the kernel reads,
``arg_start``..``arg_end`` in ``/proc/self/stat``) so that the process exporter, cleanup's
pid checks and a user's ``ps`` see what it runs. The ``setproctitle`` library cannot title
such a process (it finds the argv area by walking back from the environment, which the
child replaced), so a program that titles its processes there uses `set_title`.

Standard library only: the serving venv's vLLM launcher imports it too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Sequence

__all__ = ["set_cmdline", "set_title"]

_PR_SET_NAME = 15
_COMM = 15  # bytes of a thread's name (comm) the kernel keeps


def set_cmdline(argv: Sequence[str]) -> bool:
    """Rewrite this process's command line in place; False when it does not fit its area.

    The area is what the process was started with (a warm Python starts with a padding
    argument, so it has room).
    """
    with open("/proc/self/stat", "rb") as stat:  # safeio-exempt: the kernel's own file
        fields = stat.read(4096).rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    text = b"\0".join(a.encode() for a in argv) + b"\0"
    if len(text) > end - start:
        return False
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)
    return True


def set_title(title: str) -> None:
    """Title this process as ``setproctitle`` does: its command line and its name (comm)."""
    set_cmdline([title])
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:_COMM]), 0, 0, 0)
