"""Progress of a long workload, read from its own log while it runs.

A fine-tuning run is minutes of silence otherwise. Trainers (Hugging Face's, GuideLLM, most
Python tools) draw tqdm bars: ``37%|███▋      | 74/200 [00:21<00:36,  3.47it/s]``. A
`LogProgress` watcher reads the log's tail every few seconds, takes the newest bar frame and

- logs ``base: step 74/200 (37%), ETA 00:36`` on the ``telltale.progress`` logger (the
  terminal, the step log and, inside a flow run, the run's logs in the Prefect UI) every
  10 % or every 60 s, whichever comes first;
- keeps a Prefect progress artifact per cell up to date (inside a flow run only).

Only the last 64 KiB of the log are read per look, so a multi-GB log costs nothing; the log
is untrusted text: numbers are bounded and the ETA is kept only when it looks like a time.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel

__all__ = ["LogProgress", "Progress", "ProgressArtifact", "last_progress"]

logger = logging.getLogger("telltale.progress")

_TAIL = 64 * 1024
# "74/200 [00:21<00:36" : done/total [elapsed<remaining (tqdm's default bar format)
_FRAME = re.compile(rb"(\d{1,12})/(\d{1,12}) \[([0-9:]{1,12})<([0-9:?]{1,12})")


class Progress(BaseModel):
    """Where a workload is, from its newest progress-bar frame."""

    done: int
    total: int
    elapsed: str
    eta: str | None

    @property
    def percent(self) -> float:
        """Done as a percentage of total (0 when the total is 0)."""
        return 100.0 * self.done / self.total if self.total else 0.0

    def line(self, label: str) -> str:
        """``label: step 74/200 (37%), ETA 00:36``."""
        eta = f", ETA {self.eta}" if self.eta else ""
        return f"{label}: step {self.done}/{self.total} ({self.percent:.0f}%){eta}"


def last_progress(text: bytes) -> Progress | None:
    """The newest tqdm frame in ``text`` (None when there is none or it makes no sense)."""
    found = None
    for found in _FRAME.finditer(text):  # noqa: B007 (the last one is wanted)
        pass
    if found is None:
        return None
    done, total = int(found.group(1)), int(found.group(2))
    if total <= 0 or done > total:
        return None
    eta = found.group(4).decode()
    return Progress(done=done, total=total, elapsed=found.group(3).decode(),
                    eta=None if "?" in eta else eta)


def _read_tail(path: Path) -> bytes:
    try:
        with open(path, "rb") as stream:
            stream.seek(0, 2)
            size = stream.tell()
            stream.seek(max(0, size - _TAIL))
            return stream.read(_TAIL)
    except OSError:  # not written yet, or gone
        return b""


class LogProgress:
    """Watch ``log_file`` in a thread while the ``with`` block runs (see the module doc).

    Args:
        log_file: The workload's log.
        label: What the lines name (the cell).
        interval: Seconds between looks.
        on_update: Called with each `Progress` reported (tests wait on it).
    """

    def __init__(self, log_file: Path, label: str, *, interval: float = 5.0,
                 on_update: Callable[[Progress], Any] | None = None) -> None:
        self.log_file = Path(log_file)
        self.label = label
        self.interval = interval
        self.on_update = on_update
        self.last: Progress | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._artifact: ProgressArtifact | None = None
        self._reported_percent = -100.0
        self._reported_at = 0.0

    def __enter__(self) -> LogProgress:
        self._artifact = ProgressArtifact(f"{self.label}: starting")
        # the watcher runs in this context: Prefect's run context goes with it, so its lines
        # and artifact updates belong to this run
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._watch,),
                                        name=f"progress-{self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.look()  # the final frame, so the artifact ends where the workload did

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.look()
            except Exception:  # progress must never fail the workload it watches
                logger.debug("progress look failed", exc_info=True)

    def look(self) -> Progress | None:
        """Read the log's tail once; report when the progress moved enough."""
        current = last_progress(_read_tail(self.log_file))
        if current is None or current == self.last:
            return current
        self.last = current
        now = time.monotonic()
        if current.percent - self._reported_percent >= 10 or now - self._reported_at >= 60 \
                or current.done == current.total:
            self._reported_percent, self._reported_at = current.percent, now
            logger.info("%s", current.line(self.label))
        if self._artifact is not None:
            self._artifact.update(current.percent, current.line(self.label))
        if self.on_update is not None:
            self.on_update(current)
        return current


class ProgressArtifact:
    """A Prefect progress artifact of the current run, or nothing outside a run.

    Progress is a convenience: no API, or an API error, never fails the work it describes.
    """

    def __init__(self, description: str) -> None:
        self.id: Any = None
        try:
            from prefect.artifacts import create_progress_artifact
            from prefect.context import FlowRunContext, TaskRunContext

            if FlowRunContext.get() is not None or TaskRunContext.get() is not None:
                self.id = create_progress_artifact(progress=0.0, description=description)
        except Exception:  # no API to report to: the log lines still say it
            logger.debug("no progress artifact", exc_info=True)

    def update(self, percent: float, description: str) -> None:
        """Move the bar (0-100) and say where things are."""
        if self.id is None:
            return
        try:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(artifact_id=self.id, progress=round(percent, 1),
                                     description=description)
        except Exception:
            logger.debug("progress artifact update failed", exc_info=True)
