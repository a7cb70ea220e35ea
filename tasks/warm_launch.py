"""How a workload is launched: forked from a warm Python when there is one, else fresh.

The one place that decides it, and names it as a run records it (`projects.library.runs`:
``FORKED`` with the warm Python's pid, or ``FRESH``): a cell's workload on the local
platform (`tasks.platforms.local_warm`) and each user of a local fan-out
(`tasks.platforms.fanout`) go through `fork_or_fresh`. What differs between them is only
how a fresh process is started (a cell's pid file and deadline, a user's death with its
launcher): the caller passes that as ``fresh``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from core.safeio import open_append
from core.warm_child import WarmPythonGone, run_warm
from core.warm_python import WarmPython
from projects.library.runs import FORKED, FRESH

__all__ = ["fork_or_fresh"]

logger = logging.getLogger("telltale.warm_python")


def fork_or_fresh(warm: WarmPython | None, argv: Sequence[str], fresh: Callable[[], int], *,
                  env: Mapping[str, str], output_file: Path, timeout: float | None = None,
                  on_start: Callable[[int], None] | None = None) -> tuple[int, str]:
    """Run ``argv`` forked from ``warm``, else (none, or not reached) by calling ``fresh``.

    Args:
        warm: The warm Python to fork from (`core.warm_python.acquire`), or None.
        argv: The workload's command line (``PYTHON -m MODULE ARGS``).
        fresh: Starts it as a new process and returns its exit code.
        env: Its whole environment, when forked.
        output_file: Its stdout and stderr, appended, when forked (``fresh`` writes there
            too).
        timeout: Seconds a forked workload may run (None: no deadline).
        on_start: Called with a forked workload's pid once it runs.

    Returns:
        (exit code, launch). A warm Python that dies under its workload ends it: exit 1,
        the reason appended to ``output_file`` (the workload's log says why it stops
        there) and logged; never run again fresh (it may have done part of its work).

    Raises:
        TimeoutError: A forked workload ran past ``timeout`` (its group was killed), or the
            warm Python did not answer in time: never retried fresh either.
    """
    if warm is not None:
        try:
            return (run_warm(warm, argv, env=env, output_file=output_file, timeout=timeout,
                             on_start=on_start), f"{FORKED} {warm.pid}")
        except TimeoutError:  # an OSError too, but a deadline is not "not reached"
            raise
        except WarmPythonGone as exc:
            logger.warning("%s", exc)
            with open_append(output_file) as log:
                log.write(f"{exc}\n".encode())
            return 1, f"{FORKED} {warm.pid}, which died"
        except OSError as exc:  # not reached: nothing started, a fresh process does it
            logger.info("warm python %s not reached (%s): a fresh process", warm.pid, exc)
    return fresh(), FRESH
