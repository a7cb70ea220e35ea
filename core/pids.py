"""A process's life seen from another: running, dying with its parent, ending its session.

Shared by the warm Pythons (`core.warm_python`), the run's long-lived children
(`tasks.process`, `tasks.runner`) and the temporary Prefect API (`flows.api_server`): the
part of it that needs nothing of a run. `tests/core/test_session_audit.py` holds every
module that starts a session to `kill_leftovers` or `stop_session`.
"""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["kill_leftovers", "pid_alive", "set_parent_death_signal", "stop_session"]


def kill_leftovers(leader: int) -> None:
    """SIGKILL what is left of the session ``leader`` led, once the leader has ended.

    A workload ran in its own session; whatever in it outlived the leader is the workload's
    and nobody's to wait for: GuideLLM's worker processes outlived a finished load by
    minutes (one of them a torch data-loader worker whose own check of its parent never
    fired), and a later cleanup no longer knows them (its pid file names the leader).
    Called right after the leader was reaped, as `tasks.process.ManagedProcess.stop` does.
    """
    _signal_group(leader, signal.SIGKILL)


def stop_session(proc: subprocess.Popen[bytes] | subprocess.Popen[str],
                 grace_s: float) -> None:
    """End the session ``proc`` leads: SIGTERM, SIGKILL after ``grace_s``, then the rest.

    ``proc`` was started with ``start_new_session=True``; the rest is what outlived the
    leader (`kill_leftovers`). One already ended only has its leftovers killed.
    """
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    kill_leftovers(proc.pid)


def _signal_group(leader: int, sig: signal.Signals) -> None:
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
