"""Where a run's seconds go: named moments, counted from the process's own start.

The command line and the flow `mark` the moments that bound their phases (config resolved,
the Prefect API answering, the flow started, each cell, post-processing, cleanup); the run
writes them into ``outcome.json`` (`take`), each with the seconds until the next one, so a
slow run says which phase was slow. The first moment is the process's start as the kernel
recorded it: the interpreter's own start and every import are counted too.
"""

from __future__ import annotations

import os
import threading
import time

from pydantic import BaseModel, Field

__all__ = ["Moment", "forget", "mark", "process_start", "take"]

_lock = threading.Lock()
_marks: list[tuple[str, float]] = []
_imported = time.time()


class Moment(BaseModel):
    """One moment of a run's timeline."""

    phase: str = Field(description="What begins here (the name of the moment).")
    at_s: float = Field(description="Seconds since the process started.")
    seconds: float | None = Field(default=None, description="Until the next moment (None "
                                  "for the last).")


def process_start() -> float:
    """This process's start (Unix time) from ``/proc``; the import of this module elsewhere.

    The kernel records a process's start in clock ticks since boot (``/proc/self/stat``); the
    time since then is the boot-time clock now minus that. Not ``/proc/stat``'s ``btime``
    plus the ticks: ``btime`` is whole seconds, so that start came up to a second early (0.58 s
    on one machine), and every run's first phase, "process start", read that much longer.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            # field 22 (after the parenthesised name, which may hold spaces): clock ticks
            ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, no boot-time clock
        return _imported
    now = time.time()
    # a kernel that counts the start on another clock: the import, never a start to come
    return now - since if since >= 0 else _imported


def mark(phase: str) -> None:
    """Record that ``phase`` begins now."""
    with _lock:
        _marks.append((phase, time.time()))


def forget() -> None:
    """Drop the moments marked since the last `take`: a run that ended without its timeline.

    It counts as the process's run: the next `take` starts at its own first mark.
    """
    global _first_taken
    with _lock:
        _marks.clear()
        _first_taken = True


def take(end: str = "outcome written") -> list[Moment]:
    """The moments marked since the last `take` (then forgotten), ``end`` last, as a timeline.

    The first moment is the process's start when this is the process's first run; a later
    run in the same process (a test, a served deployment) starts at its first mark.
    """
    global _first_taken
    mark(end)
    with _lock:
        marks = list(_marks)
        _marks.clear()
        first = not _first_taken
        _first_taken = True
    origin = process_start() if first else marks[0][1]
    if first:
        marks.insert(0, ("process start", origin))
    moments = []
    for index, (phase, at) in enumerate(marks):
        following = marks[index + 1][1] if index + 1 < len(marks) else None
        moments.append(Moment(phase=phase, at_s=round(at - origin, 3),
                              seconds=None if following is None else round(following - at, 3)))
    return moments


_first_taken = False
