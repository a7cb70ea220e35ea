"""A process's life seen from another: is it running, and dying with its parent.

Shared by the warm Pythons (`core.warm_python`) and the run's long-lived children
(`tasks.process`, `tasks.runner`): the part of it that needs nothing of a run.
"""

from __future__ import annotations

import os
import signal

__all__ = ["pid_alive", "set_parent_death_signal"]


def pid_alive(pid: int) -> bool:
    """The process runs (an exited child its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's pid now
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc to ask: the signal's answer stands


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies (a forked worker).

    Returns:
        True when set (Linux), False where the call does not exist.
    """
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(1, int(sig)) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
