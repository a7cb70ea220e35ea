"""The artifact directory tree and the `step` decorator that gives every task run its dir.

``ARTIFACT_DIR`` is a context variable, never a global or an environment variable, so
concurrent tasks (Prefect copies the context into its worker threads) never race on it.
``NNN__name`` numbers are allocated under an exclusive ``flock`` on the parent directory,
which serialises threads and processes alike.

A step dir holds:

- ``parameters.yaml``: the call's arguments, secrets redacted;
- ``step.json``: start, end, duration, attempt state (``Completed`` / ``Failed``);
- ``step.log``: every log record emitted while the step ran (in its own context);
- ``FAILURE``: the traceback, when it failed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel

from core.errors import StepError, is_transient
from core.filelock import dir_lock
from core.redact import RedactingFilter, redact
from core.safeio import open_append, output_root, write_json, write_text
from core.yamlio import dump_yaml

__all__ = [
    "ARTIFACT_DIR",
    "allocate_dir",
    "artifact_dir",
    "next_artifact_dir",
    "retry_on_transient",
    "step",
    "use_artifact_dir",
]

P = ParamSpec("P")
R = TypeVar("R")

ARTIFACT_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "telltale_artifact_dir", default=None
)
_STEP_LOG: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "telltale_step_log", default=None
)
_NUMBERED = re.compile(r"^(\d{3,})__")
_LOCK_NAME = ".telltale-dirs.lock"


def artifact_dir() -> Path:
    """Return the current artifact dir.

    Raises:
        StepError: No artifact dir is active (enter `use_artifact_dir` first).
    """
    current = ARTIFACT_DIR.get()
    if current is None:
        raise StepError("no artifact dir is active: enter use_artifact_dir(path) first")
    return current


@contextmanager
def use_artifact_dir(path: str | Path) -> Iterator[Path]:
    """Make ``path`` (created if missing) the artifact dir for this context."""
    resolved = Path(path).resolve()
    resolved.mkdir(parents=True, exist_ok=True)
    token = ARTIFACT_DIR.set(resolved)
    try:
        with output_root(resolved):  # no write goes through a link planted below it
            yield resolved
    finally:
        ARTIFACT_DIR.reset(token)


def allocate_dir(parent: str | Path, name: str) -> Path:
    """Create ``parent/NNN__name`` with the next free number, atomically.

    Numbers are unique per parent across threads and processes: the scan and the ``mkdir``
    happen under an exclusive ``flock`` of a lock file in ``parent``.

    Args:
        parent: Directory to allocate in (created if missing).
        name: Suffix after ``NNN__``; ``/`` is not allowed.

    Returns:
        The created directory.
    """
    if not name or "/" in name or name in {".", ".."}:
        raise StepError(f"invalid artifact dir name {name!r}")
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    with dir_lock(parent, _LOCK_NAME):
        highest = -1
        with os.scandir(parent) as entries:
            for entry in entries:
                match = _NUMBERED.match(entry.name)
                if match:
                    highest = max(highest, int(match.group(1)))
        path = parent / f"{highest + 1:03d}__{name}"
        path.mkdir()
        return path


@contextmanager
def next_artifact_dir(name: str) -> Iterator[Path]:
    """Allocate ``NNN__name`` in the current artifact dir and make it current inside the block."""
    path = allocate_dir(artifact_dir(), name)
    token = ARTIFACT_DIR.set(path)
    try:
        yield path
    finally:
        ARTIFACT_DIR.reset(token)


class _StepLogHandler(logging.Handler):
    """Writes each record to the log file of the step whose context emitted it."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.addFilter(RedactingFilter())

    def emit(self, record: logging.LogRecord) -> None:
        target = _STEP_LOG.get()
        if target is None:
            return
        try:
            with open_append(target) as stream:
                stream.write((self.format(record) + "\n").encode("utf-8"))
        except Exception:  # a log write must never fail the step
            self.handleError(record)


_HANDLER = _StepLogHandler()


def _install_handler() -> None:
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    ours = logging.getLogger("telltale")
    if ours.level == logging.NOTSET:  # step logs keep INFO even when the root says WARNING
        ours.setLevel(logging.INFO)


def _plain(value: Any) -> Any:
    """Turn arguments into YAML-safe data (models to dicts, paths to str, others to repr)."""
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(mode="python"))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    # Secret-bearing objects (clients, credentials) must write their own safe repr.
    return repr(value)


def retry_on_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only when the failure is transient."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception as error:  # the state could not give back its exception
        exc = error
    return isinstance(exc, BaseException) and is_transient(exc)


def _run_in_step_dir(group: str, fn: Callable[P, R], *args: P.args,
                     _step_name: str | None = None, **kwargs: P.kwargs) -> R:
    _install_handler()
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        bound.apply_defaults()
        params = dict(bound.arguments)
    except TypeError:
        params = {"args": list(args), "kwargs": kwargs}
    name = _step_name or fn.__name__
    with next_artifact_dir(f"{group}__{name}") as path:
        write_text(path / "parameters.yaml", dump_yaml(redact(_plain(params))))
        started = time.time()
        meta: dict[str, Any] = {
            "step": f"{group}.{name}",
            "start": datetime.fromtimestamp(started, UTC).isoformat(),
            "state": "Running",
        }
        write_json(path / "step.json", meta)
        token = _STEP_LOG.set(path / "step.log")
        try:
            result = fn(*args, **kwargs)
            meta["state"] = "Completed"
            return result
        except BaseException as exc:
            meta["state"] = "Cancelled" if isinstance(exc, KeyboardInterrupt) else "Failed"
            meta["error"] = f"{type(exc).__name__}: {exc}"
            write_text(path / "FAILURE", traceback.format_exc())
            raise
        finally:
            _STEP_LOG.reset(token)
            ended = time.time()
            meta["end"] = datetime.fromtimestamp(ended, UTC).isoformat()
            meta["duration_s"] = round(ended - started, 3)
            write_json(path / "step.json", meta)


class _LazyTask:
    """A Prefect task built on first use, so importing a module of steps never imports Prefect.

    ``--plan`` and the analysis CLI import platform modules to reach pure helpers; Prefect's
    import alone costs over a second. Every attribute (``fn``, ``submit``, ``map``,
    ``with_options``...) and every call goes to the real task.
    """

    def __init__(self, build: Callable[[], Any], group: str, name: str) -> None:
        self._build = build
        self._task: Any = None
        self.telltale_group = group
        self.__name__ = name

    def _real(self) -> Any:
        if self._task is None:
            self._task = self._build()
        return self._task

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._real()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._real(), name)


def step(
    group: str,
    *,
    name: str | None = None,
    retries: int = 0,
    retry_delay_seconds: float | list[float] = 2.0,
    retry_jitter_factor: float | None = 0.5,
    timeout_seconds: float | None = None,
    prefect: bool = True,
    **task_options: Any,
) -> Callable[[Callable[P, R]], Any]:
    """Turn a function into a Telltale step: a Prefect task with its own ``NNN__group__name`` dir.

    Retries happen only on transient errors (`retry_on_transient`); each attempt gets its own
    dir. ``timeout_seconds`` marks the task failed but cannot stop a blocked thread, so every
    network or subprocess call inside a step still needs its own timeout. The Prefect task is
    built on first use (see `_LazyTask`).

    Args:
        group: Step group, the first word of the step dir name (``fine_tuning``).
        name: Step name in the dir and the task name (default: the function's name); lets one
            generic function serve as each project's own step (``run_fine_tuning_job``).
        retries: Attempts after the first, on transient errors only.
        retry_delay_seconds: Delay (or list of delays, for backoff) between attempts.
        retry_jitter_factor: Random extra delay, as a fraction of the delay.
        timeout_seconds: Prefect task timeout.
        prefect: False returns the plain wrapped function (for code that runs outside a flow,
            e.g. inside worker processes).
        **task_options: Passed to ``prefect.task``.

    Returns:
        A decorator.

    Example:
        >>> @step("cluster")  # doctest: +SKIP
        ... def capture_environment(kubeconfig: str | None = None) -> dict: ...
    """

    def decorate(fn: Callable[P, R]) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return _run_in_step_dir(group, fn, *args, _step_name=name, **kwargs)

        wrapper.telltale_group = group  # type: ignore[attr-defined]
        if not prefect:
            return wrapper

        def build() -> Any:
            from prefect import task  # heavy import, only where a step really runs
            from prefect.cache_policies import NO_CACHE

            # Steps touch the world: never skip one because an earlier call had equal inputs
            # (Prefect's default cache policy would), and never hash clients passed as
            # arguments.
            options = {"cache_policy": NO_CACHE, **task_options}
            prefect_task = task(
                wrapper,
                name=f"{group}.{name or fn.__name__}",
                retries=retries,
                retry_delay_seconds=retry_delay_seconds,
                retry_jitter_factor=retry_jitter_factor,
                retry_condition_fn=retry_on_transient,
                timeout_seconds=timeout_seconds,
                **options,
            )
            prefect_task.telltale_group = group  # type: ignore[attr-defined]
            return prefect_task

        return _LazyTask(build, group, name or fn.__name__)

    return decorate
