"""The local platform's warm Python (`core.warm_python`, ``TELLTALE_WARM_PYTHON_MINUTES``).

Which one a run uses (started at the run's start when none is there; it stays for the next
runs) and how a cell's workload is launched from it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.environment import env_settings
from core.errors import ConfigError
from core.safeio import write_text
from core.timeline import mark
from core.warm_key import warm_key, workload_module
from core.warm_python import WarmPython, acquire, offer
from projects.contract import LocalWorkload
from projects.matrix import Cell
from tasks.hostwatch import count_as_run
from tasks.platforms.base import RunContext
from tasks.runner import PID_FILE, CommandTimeout, run
from tasks.warm_launch import fork_or_fresh

__all__ = ["command_warm_key", "find_warm", "offer_command", "offer_warm", "run_process",
           "wanted_warm", "warm_for", "warm_key_of"]

logger = logging.getLogger("telltale.local")


def wanted_warm(run_ctx: RunContext, cells: Sequence[Cell]) -> tuple[LocalWorkload, str] | None:
    """The run's first workload and its warm Python key; None when it takes no warm Python.

    None: the setting is 0, no cell runs, or the workload declares nothing to preload.
    """
    runnable = [c for c in cells if not c.skip_reason]
    if run_ctx.project.local is None or not runnable or \
            env_settings().warm_python_minutes <= 0:
        return None
    try:
        workload = run_ctx.project.local(run_ctx.cell_context(runnable[0], run_ctx.root))
        key = warm_key_of(workload, dict(workload.env))
    except ConfigError:  # a cell that cannot run: the project's check says why, once
        return None
    except Exception as exc:  # a broken warm Python never stops a run
        logger.warning("no warm python: %s", exc)
        return None
    return (workload, key) if key is not None else None


def find_warm(wanted: tuple[LocalWorkload, str] | None) -> WarmPython | None:
    """The warm Python the run's workloads fork from: the one there, else one started now.

    It is waited for while it imports (started ahead, its imports overlapped the run's
    start-up; otherwise they take what the first workload's own imports would have).
    None: none wanted, or none could be had (the workload is then a fresh process). A
    warm Python found is counted as the run's from now on (`count_as_run`), before any
    cell's window opens: its children's CPU time reaches the run's tree through it.
    """
    if wanted is None:
        return None
    workload, key = wanted
    try:
        mark("wait for the warm python")
        found = acquire(key)
        if found is None and offer_warm(workload, key):
            found = acquire(key)
    except Exception as exc:  # a broken warm Python never stops a run
        logger.warning("no warm python: %s", exc)
        return None
    if found is None:
        logger.info("no warm python: the workload starts as a fresh process")
        return None
    count_as_run(found.pid)
    return found


def warm_key_of(workload: LocalWorkload, env: Mapping[str, str]) -> str | None:
    """The warm Python key of a workload run with ``env`` added (None: it takes none)."""
    return command_warm_key(workload.argv, workload.preload, env)


def command_warm_key(argv: Sequence[str], preload: Sequence[str],
                     env: Mapping[str, str]) -> str | None:
    """The warm Python key of ``argv`` (``PYTHON -m MODULE ...``) run with ``env`` added.

    Its warm Python imports ``preload``; None when it takes none.
    """
    if not preload or workload_module(argv) is None:
        return None
    return warm_key(str(argv[0]), preload, os.getcwd(), {**os.environ, **env})


def warm_for(warm: Mapping[str, object] | None, workload: LocalWorkload,
             env: Mapping[str, str]) -> WarmPython | None:
    """The run's warm Python (its record) when it may serve ``workload`` run with ``env``.

    None: the run has none, or its key is not the workload's (another interpreter, other
    modules or another environment than the warm one's).
    """
    chosen = WarmPython.from_record(warm) if warm is not None else None
    return chosen if chosen is not None and chosen.key == warm_key_of(workload, env) else None


def offer_warm(workload: LocalWorkload, key: str | None = None) -> bool:
    """Start a warm Python for ``workload`` (`core.warm_python.offer`); never fails a run.

    True when one was started now (False: one runs or starts already, or none is wanted).
    """
    return offer_command(workload.argv, workload.preload, workload.env, key)


def offer_command(argv: Sequence[str], preload: Sequence[str], env: Mapping[str, str],
                  key: str | None = None) -> bool:
    """Start a warm Python importing ``preload`` for ``argv`` run with ``env`` added.

    True when one was started now; never fails a run (see `offer_warm`).
    """
    key = key or command_warm_key(argv, preload, env)
    if key is None or not Path(str(argv[0])).exists():
        return False  # not there yet (a serving venv the run's prepare builds): asked again
    try:
        return offer(key, str(argv[0]), preload, os.getcwd(), {**os.environ, **env},
                     minutes=env_settings().warm_python_minutes)
    except Exception as exc:  # the run starts a fresh process
        logger.warning("no warm python started: %s", exc)
        return False


def run_process(argv: list[str], env: dict[str, str], here: Path, log_file: Path,
                 timeout_s: float, warm: WarmPython | None) -> tuple[int, str]:
    """The workload's exit code and how it was launched; `CommandTimeout` past the deadline.

    Forked from the warm Python when there is one, else (or when it is not reached) a
    fresh process (`tasks.warm_launch.fork_or_fresh`).
    """
    def fresh() -> int:
        return run(argv, check=False, timeout=timeout_s, output_file=log_file,
                   pid_file=here / PID_FILE, env=env).returncode

    try:
        return fork_or_fresh(warm, argv, fresh, env={**os.environ, **env}, output_file=log_file,
                             timeout=timeout_s,
                             on_start=lambda pid: write_text(here / PID_FILE, f"{pid}\n"))
    except CommandTimeout:
        raise
    except TimeoutError as exc:
        raise CommandTimeout(f"the workload timed out after {timeout_s}s") from exc
