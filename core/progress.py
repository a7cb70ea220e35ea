"""Progress lines of a long post-processing: ``parse: 4 000/10 000 run(s) (40 %), 1 250/s``.

Post-processing 10 000 result dirs takes ~30 s, judging them against a history minutes:
minutes of silence otherwise. A `StageProgress` logs on the ``telltale.analysis`` logger
(``python -m analysis`` prints it on stderr; inside a flow run the Prefect UI shows it) at
every tenth of the work once the stage has run `QUIET_S` seconds (a quick stage says only its
end), and at the end with the time taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["QUIET_S", "StageProgress", "logger"]

logger = logging.getLogger("telltale.analysis")

QUIET_S = 2.0
"""A stage logs its tenths only after running this long: a quick one logs just its end."""


class StageProgress:
    """Counts a stage's items and logs each tenth of them, then the end.

    Args:
        stage: What the lines name (``parse``, ``judge``).
        total: Items the stage will count.
        unit: What an item is, for the lines (``run(s)``).
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(self, stage: str, total: int, unit: str = "run(s)",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.total, self.unit = stage, total, unit
        self.done = 0
        self._clock = clock
        self._started = clock()
        self._next = self._step()

    def _step(self) -> int:
        return self.done + max(1, self.total // 10)

    def advance(self, count: int = 1) -> None:
        """Count ``count`` more items; log when another tenth is done."""
        self.done += count
        if self.done < self._next or self.done >= self.total:
            return
        self._next = self._step()
        elapsed = self._clock() - self._started
        if elapsed >= QUIET_S:
            logger.info("%s: %s/%s %s (%d %%), %s/s", self.stage, f"{self.done:,}",
                        f"{self.total:,}", self.unit, 100 * self.done // self.total,
                        f"{self.done / elapsed:,.0f}")

    def finish(self) -> None:
        """Log the end line: items done and the time taken."""
        logger.info("%s: %s %s in %.1f s", self.stage, f"{self.done:,}", self.unit,
                    self._clock() - self._started)
