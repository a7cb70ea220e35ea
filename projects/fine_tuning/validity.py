"""fine_tuning's validity checks: did the training measured behave like a training?

- a NaN or infinite loss (a diverged run's throughput is not the stack's);
- fewer optimizer steps completed than ``max_steps`` asked for;
- no step left after the warm-up (``warmup_ratio`` of the steps): the throughput would be
  all warm-up, the learning rate never at its level.
"""

from __future__ import annotations

import math

from analysis.parsing import ParsedResult
from projects.fine_tuning.parser import FineTuningResult

__all__ = ["MIN_WINDOW_S", "measured_window", "validity_reasons"]

MIN_WINDOW_S = 1.0
"""A training shorter than this is mostly start-up: its throughput is not a level."""


def _ft(result: ParsedResult) -> FineTuningResult:
    if not isinstance(result, FineTuningResult):
        raise TypeError(f"not a fine_tuning result: {type(result).__name__}")
    return result


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def validity_reasons(result: ParsedResult) -> list[str]:
    """Why this run's numbers do not measure the training stack (empty: they do)."""
    ft = _ft(result)
    reasons: list[str] = []
    # the progress lines are read for the newest runs only (bulky): first/last loss always
    losses = [x for x in (*ft.progress.loss, ft.first_loss, ft.last_loss) if x is not None]
    final = ft.summary.train_loss if ft.summary else None
    bad = [x for x in (*losses, *([final] if final is not None else [])) if not math.isfinite(x)]
    if bad:
        reasons.append(f"the loss is not finite ({bad[0]}) in {len(bad)} logged value(s): "
                       "a diverged training")
    summary = ft.summary
    steps = None
    if summary and summary.train_steps_per_second and summary.train_runtime:
        steps = summary.train_steps_per_second * summary.train_runtime
    asked = _number(ft.settings.get("max_steps"))
    if steps is not None and asked and asked > 0 and steps < 0.95 * asked:
        reasons.append(f"{steps:.0f} optimizer steps completed of the {asked:.0f} asked "
                       "(max_steps)")
    warmup = _number((ft.trainer_config or {}).get("warmup_ratio"))
    if steps is not None and warmup and warmup > 0 and steps - math.ceil(warmup * steps) < 1:
        reasons.append(f"every one of the {steps:.0f} steps is warm-up (warmup_ratio "
                       f"{warmup:g}): no steady-state throughput")
    return reasons


def measured_window(result: ParsedResult) -> float | None:
    """The trainer's own runtime in seconds."""
    summary = _ft(result).summary
    return summary.train_runtime if summary else None
