"""What a KPI's history can see: its minimum detectable effect, repeats, shift from a run.

The detector's power at its own false-alarm budget (`analysis.regression`): the smallest
shift its noise lets a verdict see with 80 % power (`minimum_detectable_effect`), how many
repeats bring it under a target (`repeats_for`, used by the confirmation re-runs), and the
size of a level shift starting at a given run (`shift_at`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from analysis.detector import (
    DEFAULTS,
    DetectorSettings,
    _expm1,
    _finite,
    _relative,
    _sigma_floor,
    _tail_efficiency,
    _tail_shifts,
    _trimmed_mean,
    noise_scale,
    pooled_noise,
    usable_repeats,
)
from analysis.regression import _shapes
from analysis.seasonality import deseasonalised

# -- noise budget and suspects ---------------------------------------------------------------

POWER_Z = 0.8416
"""Normal quantile of the detection power the minimum detectable effect is quoted at (80 %)."""


def _analysis_units(history: Sequence[float], settings: DetectorSettings
                    ) -> tuple[np.ndarray, bool] | None:
    if len(history) < settings.min_history:  # fewer finite ones still (no array made)
        return None
    h, _ = _finite(history)
    if len(h) < settings.min_history:
        return None
    log_scale = settings.log_scale and bool(np.all(h > 0))
    return (np.log(h) if log_scale else h), log_scale


def minimum_detectable_effect(history: Sequence[float], repeats: int = 1, *,
                              settings: DetectorSettings = DEFAULTS,
                              power_z: float = POWER_Z) -> float | None:
    """The smallest relative shift of the newest run the verdict detects, at 80 % power.

    The verdict calls a shift when it is ``verdict_z`` standard errors from the baseline
    (its false-alarm budget); a real shift of ``(verdict_z + power_z) * se`` passes that
    threshold 80 % of the time. ``se`` is the verdict's own: the noise pooled within every
    level of the history (widened for short histories as the verdict widens it), a baseline of
    up to ``baseline_window`` runs and ``repeats`` runs of the newest configuration
    (confirmation re-runs). Relative to the level (positive series are judged in logs).

    Returns:
        The MDE as a fraction (0.05 = 5 %), or None with fewer than ``min_history`` points.
    """
    found = _analysis_units(history, settings)
    if found is None:
        return None
    y, log_scale = found
    shapes = _shapes(np.exp(y) if log_scale else y, "higher_better", settings, spreads=False)
    cps = shapes[1] if shapes is not None else []
    if shapes is not None and shapes[3] is not None:
        y = deseasonalised(y, shapes[3])
    current = y[cps[-1]:] if cps else y
    # The noise pooled within every level (around each level and the drift line), not the
    # newest level's alone: three runs after a step read an MDE in the thousands of %
    sigma = pooled_noise(y, cps) if len(y) > len(cps) + 2 else noise_scale(y)
    sigma = max(sigma, 1e-4) if log_scale else _sigma_floor(y, sigma)
    sigma *= 1 + (settings.verdict_z ** 2 + 1) / (4 * max(len(y) - len(cps) - 2, 1))
    base = min(len(current), settings.baseline_window)
    if base < settings.min_history:
        base = min(len(y), settings.baseline_window)
    runs = max(int(repeats), 1)
    se = sigma * math.sqrt(1.1 / base + _tail_efficiency(runs) / runs)
    delta = (settings.verdict_z + power_z) * se
    if log_scale:
        return _expm1(delta)
    level = abs(_trimmed_mean(current))
    return delta / level if level > 0 else None


def repeats_for(mde_one_run: float, baseline_runs: int, target: float, *,
                limit: int = 5) -> int:
    """Runs of the newest configuration (1 + re-runs) that bring the MDE under ``target``.

    ``mde_one_run`` is `minimum_detectable_effect` with one run and ``baseline_runs`` the
    baseline it was measured against: repeats shrink only the newest level's share of the
    standard error. At most ``limit``: a KPI too noisy even then gets ``limit`` (and stays
    flagged).
    """
    base = 1.1 / max(baseline_runs, 1)
    one = math.log1p(max(mde_one_run, 0.0))
    for runs in range(1, limit + 1):
        scale = math.sqrt((base + _tail_efficiency(runs) / runs) / (base + 1.0))
        if math.expm1(one * scale) <= target:
            return runs
    return limit


def shift_at(history: Sequence[float], latest: float | Sequence[float], start_runs: int, *,
             settings: DetectorSettings = DEFAULTS, within: int = 1
             ) -> tuple[float, float, int] | None:
    """The shift of a KPI whose new level began ``start_runs`` runs back (± ``within``).

    Used to find the KPIs that moved with a regression: for each start within ``within``
    runs of ``start_runs``, the tail is compared with the baseline before it like the
    verdict compares them; the strongest start is returned as (relative change, z in
    noise standard errors, its start in runs back), or None without enough history.
    """
    found = _analysis_units(history, settings)
    repeats = usable_repeats(latest)
    if found is None or not len(repeats):
        return None
    y, log_scale = found
    if log_scale:
        if not np.all(repeats > 0):
            return None
        repeats = np.log(repeats)
    shifts = [x for x in _tail_shifts(y, repeats, settings, [], 0, log_scale, young=0)
              if abs(x.runs - start_runs) <= within]
    if not shifts:
        return None
    best = max(shifts, key=lambda x: abs(x.z))
    change = _expm1(best.level - best.baseline) if log_scale else _relative(
        best.level - best.baseline, best.baseline)
    return change, best.z, best.runs
