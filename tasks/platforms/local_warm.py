"""The local platform's warm Python (`tasks.warm_python`, opt-in).

Which one a run uses, how a cell's workload is launched from it, and the one a run leaves
for the next (``TELLTALE_WARM_PYTHON_MINUTES``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.environment import env_settings
from core.safeio import write_text
from core.timeline import mark
from projects.contract import LocalWorkload
from projects.matrix import Cell
from tasks.hostwatch import count_as_run
from tasks.platforms.base import RunContext
from tasks.runner import PID_FILE, CommandTimeout, run
from tasks.warm_python import (
    WarmPython,
    WarmPythonGone,
    acquire,
    offer,
    run_warm,
    warm_key,
    workload_module,
)

__all__ = ["find_warm", "offer_warm", "run_process", "warm_key_of"]

logger = logging.getLogger("telltale.local")


def find_warm(run_ctx: RunContext, cells: Sequence[Cell]
              ) -> tuple[WarmPython | None, tuple[str, LocalWorkload] | None]:
    """The warm Python of the first cell's workload, waited for while it imports.

    Else what the run should leave for the next (its key and workload), or nothing when its
    workload takes none. A warm Python found is counted as the run's from now on
    (`count_as_run`), before any cell's window opens: its children's CPU time reaches the
    run's tree through it.
    """
    runnable = [c for c in cells if not c.skip_reason]
    if run_ctx.project.local is None or not runnable or \
            env_settings().warm_python_minutes <= 0:
        return None, None
    try:
        workload = run_ctx.project.local(run_ctx.cell_context(runnable[0], run_ctx.root))
        key = warm_key_of(workload, dict(workload.env))
        if key is None:
            return None, None
        mark("wait for the warm python")
        found = acquire(key)
    except Exception as exc:  # a broken warm Python never stops a run
        logger.warning("no warm python: %s", exc)
        return None, None
    if found is None:
        return None, (key, workload)
    count_as_run(found.pid)
    return found, None


def warm_key_of(workload: LocalWorkload, env: Mapping[str, str]) -> str | None:
    """The warm Python key of a workload run with ``env`` added (None: it takes none)."""
    if not workload.preload or workload_module(workload.argv) is None:
        return None
    return warm_key(str(workload.argv[0]), workload.preload, os.getcwd(),
                    {**os.environ, **env})


def offer_warm(workload: LocalWorkload, key: str | None = None) -> None:
    """Start a warm Python for ``workload`` (`tasks.warm_python.offer`); never fails a run."""
    key = key or warm_key_of(workload, dict(workload.env))
    if key is None:
        return
    try:
        offer(key, str(workload.argv[0]), workload.preload, os.getcwd(),
              {**os.environ, **workload.env}, minutes=env_settings().warm_python_minutes)
    except Exception as exc:  # the next run starts a fresh process
        logger.warning("no warm python left for the next run: %s", exc)


def run_process(argv: list[str], env: dict[str, str], here: Path, log_file: Path,
                 timeout_s: float, warm: WarmPython | None) -> tuple[int, str]:
    """The workload's exit code and how it was launched; `CommandTimeout` past the deadline.

    Forked from the warm Python when there is one, else (or when it is not reached) a
    fresh process.
    """
    if warm is not None:
        try:
            code = run_warm(warm, argv, env={**os.environ, **env}, output_file=log_file,
                            timeout=timeout_s,
                            on_start=lambda pid: write_text(here / PID_FILE, f"{pid}\n"))
            return code, f"forked from the warm python {warm.pid}"
        except TimeoutError as exc:
            raise CommandTimeout(f"the workload timed out after {timeout_s}s") from exc
        except WarmPythonGone as exc:
            logger.warning("%s", exc)
            return 1, f"forked from the warm python {warm.pid}, which died"
        except OSError as exc:  # not reached: nothing started, a fresh process does it
            logger.info("warm python %s not reached (%s): a fresh process", warm.pid, exc)
    result = run(argv, check=False, timeout=timeout_s, output_file=log_file,
                 pid_file=here / PID_FILE, env=env)
    return result.returncode, "fresh process"
