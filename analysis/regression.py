"""Change-point detection and per-run regression verdicts for performance series.

Model
-----
A KPI series is piecewise *linear-with-common-slope* plus noise: between change points the
level is constant or drifts slowly, and the noise may be heavy-tailed, bimodal or carry
single outliers. A change point is an *abrupt* level shift, large against the noise and
against the local drift.

Method (`change_points`)
------------------------
1. **Noise scale** ``sigma``: the robust spread of first differences
   (``1.4826 * MAD(diff) / sqrt(2)``), floored by a winsorised spread for sticky bimodal
   noise. Differences cancel levels and drift, so steps do not inflate it.
2. **Outlier shield**: a point further than ``outlier_z * sigma`` (4) from the median of its
   neighbours (window 5) is replaced by that median for detection, so a lone outlier cannot
   create a level.
3. **Candidates**: binary segmentation of the shielded series with the least-squares
   mean-shift cost (cumulative sums, ``O(n log n)``), minimum segment ``min_size`` (5),
   splitting while the gain exceeds ``(candidate_z * sigma)^2`` (``candidate_z`` 4).
4. **Validation** of each candidate against its neighbours, repeated until stable: the step
   ``c`` between the 20%-trimmed means of up to ``window`` (60) points on each side must
   have ``|c| / se(c) >= z_threshold`` (5) and a relative size ``>= min_magnitude`` (2%).
   When the adjacent segments show a significant slope (beyond ``drift_z`` = 2 standard
   errors), the step is measured against that drift line, so a slow drift produces no step.
   Weak candidates are removed one at a time, weakest first; each survivor is then moved to
   the best split between its neighbours (least squares, within ``window``).

Cost: ``O(n log n)``; a 1 000-point series takes well under a millisecond.

Verdict (`verdict`)
-------------------
The baseline is the robust level (20%-trimmed mean of up to ``baseline_window`` = 30 points)
of the last segment of the history, after its last change point, so an old level never
pollutes it. The newest run is a regression when it moves against the KPI's direction by at
least ``min_magnitude`` (2%) and ``verdict_z`` (3) standard errors, and the previous run
confirms it (same side, at least ``confirm_factor`` = 0.6 of both thresholds): one outlier
never raises an alarm on its own, and a real shift is reported one run later. Several repeats
of the newest run confirm each other instead. Improvements are reported, never called
regressions.

Tuned on the labelled synthetic set of ``benchmarks/regression`` (see the README's
performance section for the scores against the E-Divisive implementations).

Parameters are keyword arguments with documented defaults; results are deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

__all__ = [
    "DEFAULTS",
    "Direction",
    "DetectorSettings",
    "Verdict",
    "VerdictKind",
    "change_points",
    "noise_scale",
    "verdict",
]

Direction = Literal["higher_better", "lower_better"]
VerdictKind = Literal["regression", "improvement", "no_change", "insufficient_history"]


@dataclass(frozen=True)
class DetectorSettings:
    """Tuning of the detector (see the module docstring for the meaning of each).

    Attributes:
        min_size: Minimum points per segment.
        window: Points on each side used to measure a step.
        candidate_z: Binary-segmentation split threshold, in noise units.
        z_threshold: Validation threshold of a step, in standard errors.
        min_magnitude: Smallest relative step reported.
        outlier_z: Distance from the local median (noise units) that marks an outlier.
        full_z_threshold: Threshold of a step measured over the whole neighbouring segments
            (used when they are longer than ``window``; 0 disables).
        drift_z: A within-segment slope counts as drift (and is corrected for) beyond this
            many standard errors.
        min_history: Historical points needed for a verdict.
        verdict_z: Threshold of the newest run's deviation, in standard errors.
        baseline_window: Points of the last segment used as the verdict baseline.
        confirm_factor: The previous run confirms a shift when it deviates the same way by
            this fraction of the thresholds.
    """

    min_size: int = 5
    window: int = 60
    candidate_z: float = 4.0
    z_threshold: float = 5.0
    min_magnitude: float = 0.02
    outlier_z: float = 4.0
    drift_z: float = 2.0
    full_z_threshold: float = 8.0
    min_history: int = 3
    verdict_z: float = 3.0
    baseline_window: int = 30
    confirm_factor: float = 0.6


DEFAULTS = DetectorSettings()


class Verdict(BaseModel):
    """The judgement of the newest run against its history."""

    kind: VerdictKind = Field(description="regression, improvement, no_change or "
                                          "insufficient_history.")
    magnitude: float = Field(description="Relative change of the newest run vs the baseline "
                                         "(0.05 = +5%).")
    confidence: float = Field(ge=0, le=1, description="0-1 confidence in the kind.")
    baseline: float | None = Field(description="The level the newest run is compared with.")
    latest: float | None = Field(default=None, description="The newest run's value "
                                                            "(median of repeats).")
    history_used: int = Field(default=0, description="Historical points in the baseline.")
    explanation: str = Field(description="One sentence a human can check.")


# -- helpers -------------------------------------------------------------------------------


def _finite(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    array = np.asarray(values, dtype=float).ravel()
    index = np.flatnonzero(np.isfinite(array))
    return array[index], index


def noise_scale(values: Sequence[float]) -> float:
    """Robust noise standard deviation of a series (0.0 for a constant series).

    Uses the MAD of first differences (insensitive to steps and drift), floored by a
    winsorised standard deviation of the differences so sticky two-level noise is not
    mistaken for zero noise.
    """
    y, _ = _finite(values)
    if len(y) < 3:
        return 0.0
    d = np.diff(y)
    med = np.median(d)
    mad = 1.4826 * float(np.median(np.abs(d - med))) / math.sqrt(2)
    lo, hi = np.quantile(d, [0.05, 0.95])
    wins = float(np.std(np.clip(d, lo, hi))) / math.sqrt(2)
    return max(mad, 0.5 * wins)


def _sigma_floor(y: np.ndarray, sigma: float) -> float:
    scale = float(np.median(np.abs(y))) if len(y) else 0.0
    return max(sigma, 1e-4 * scale, 1e-12)


def _shield(y: np.ndarray, sigma: float, outlier_z: float) -> np.ndarray:
    n = len(y)
    if n < 5:
        return y.copy()
    padded = np.concatenate([np.full(2, y[0]), y, np.full(2, y[-1])])
    windows = np.lib.stride_tricks.sliding_window_view(padded, 5)
    local = np.median(windows, axis=1)
    out = y.copy()
    mask = np.abs(y - local) > outlier_z * sigma
    out[mask] = local[mask]
    return out


def _trimmed_mean(x: np.ndarray, trim: float = 0.2) -> float:
    n = len(x)
    if n == 0:
        return float("nan")
    k = int(n * trim)
    if k == 0:
        return float(np.median(x)) if n <= 4 else float(np.mean(x))
    s = np.sort(x)
    return float(np.mean(s[k:n - k]))


def _best_split(cs: np.ndarray, cs2: np.ndarray, a: int, b: int,
                min_size: int) -> tuple[int, float]:
    """Best single split of y[a:b] by least squares; returns (index, gain)."""
    n = b - a
    if n < 2 * min_size:
        return -1, 0.0
    t = np.arange(a + min_size, b - min_size + 1)
    left_n = t - a
    right_n = b - t
    total = cs[b] - cs[a]
    left = cs[t] - cs[a]
    right = total - left
    gain = left ** 2 / left_n + right ** 2 / right_n - total ** 2 / n
    best = int(np.argmax(gain))
    return int(t[best]), float(gain[best])


def _binseg(y: np.ndarray, sigma: float, s: DetectorSettings) -> list[int]:
    cs = np.concatenate([[0.0], np.cumsum(y)])
    cs2 = np.concatenate([[0.0], np.cumsum(y * y)])
    threshold = (s.candidate_z * sigma) ** 2
    found: list[int] = []
    stack = [(0, len(y))]
    while stack:
        a, b = stack.pop()
        t, gain = _best_split(cs, cs2, a, b, s.min_size)
        if t < 0 or gain < threshold:
            continue
        found.append(t)
        stack.append((a, t))
        stack.append((t, b))
    return sorted(found)


def _slope_sxx(y: np.ndarray, a: int, b: int) -> tuple[float, float]:
    """OLS slope numerator/denominator pieces of y[a:b] (sum xy, sum xx), centred."""
    n = b - a
    if n < 3:
        return 0.0, 0.0
    x = np.arange(n, dtype=float) - (n - 1) / 2
    seg = y[a:b]
    return float(np.dot(x, seg - seg.mean())), float(np.dot(x, x))


def _step_stats(y: np.ndarray, t: int, a: int, b: int, sigma: float,
                s: DetectorSettings) -> tuple[float, float, float]:
    """Drift-corrected step at t between neighbours a and b: (step, z, level_before)."""
    lo = max(a, t - s.window)
    hi = min(b, t + s.window)
    left, right = y[lo:t], y[t:hi]
    nl, nr = len(left), len(right)
    level_l, level_r = _trimmed_mean(left), _trimmed_mean(right)
    sxy_l, sxx_l = _slope_sxx(y, a, t)
    sxy_r, sxx_r = _slope_sxx(y, t, b)
    sxx = sxx_l + sxx_r
    slope = (sxy_l + sxy_r) / sxx if sxx > 0 else 0.0
    centre_l, centre_r = (lo + t - 1) / 2, (t + hi - 1) / 2
    distance = centre_r - centre_l
    var = sigma ** 2 * (1.1 * (1.0 / nl + 1.0 / nr))  # 1.1: trimmed-mean efficiency
    # Correct for drift only when the segments show one: a slope within 2 standard errors
    # of zero is noise, and correcting for it would only cost power.
    if sxx > 0 and abs(slope) * math.sqrt(sxx) > s.drift_z * sigma:
        var += distance ** 2 * sigma ** 2 / sxx
    else:
        slope = 0.0
    step = (level_r - level_l) - slope * distance
    z = abs(step) / math.sqrt(var) if var > 0 else math.inf
    # Level just before the step, from the drift line, for the relative size.
    return step, z, level_l + slope * (t - 1 - centre_l)


def _refine(y: np.ndarray, cps: list[int], s: DetectorSettings) -> list[int]:
    """Move each change point to the best split between its neighbours (±window)."""
    if not cps:
        return cps
    cs = np.concatenate([[0.0], np.cumsum(y)])
    out = list(cps)
    for i, t in enumerate(out):
        a = out[i - 1] if i else 0
        b = out[i + 1] if i + 1 < len(out) else len(y)
        a, b = max(a, t - s.window), min(b, t + s.window)
        best, _ = _best_split(cs, cs, a, b, min(s.min_size, (b - a) // 2))
        if best > 0:
            out[i] = best
    return sorted(set(out))


def _validate(y: np.ndarray, cps: list[int], sigma: float, s: DetectorSettings) -> list[int]:
    cps = list(cps)
    whole = replace(s, window=len(y))
    while cps:
        bounds = [0, *cps, len(y)]
        scores = []
        for i, t in enumerate(cps):
            step, z, before = _step_stats(y, t, bounds[i], bounds[i + 2], sigma, s)
            # A small step between long segments shows only over the whole segments: accept
            # it there too, against a stricter threshold.
            if s.full_z_threshold and (t - bounds[i] > s.window or bounds[i + 2] - t > s.window):
                full_step, full_z, full_before = _step_stats(y, t, bounds[i], bounds[i + 2],
                                                             sigma, whole)
                if full_z / s.full_z_threshold > z / s.z_threshold:
                    step, before = full_step, full_before
                    z = full_z * s.z_threshold / s.full_z_threshold
            rel = abs(step) / abs(before) if before != 0 else (math.inf if step else 0.0)
            ok = z >= s.z_threshold and rel >= s.min_magnitude
            scores.append((ok, min(z / s.z_threshold, rel / s.min_magnitude)))
        weak = [(score, i) for i, (ok, score) in enumerate(scores) if not ok]
        if not weak:
            break
        cps.pop(min(weak)[1])  # drop the weakest, then re-measure its neighbours
    return cps


def change_points(values: Sequence[float], direction: Direction = "higher_better", *,
                  settings: DetectorSettings = DEFAULTS) -> list[int]:
    """Return the indices where a new level starts (both directions of change).

    Args:
        values: The series, oldest first. NaN/inf entries are ignored (indices refer to
            ``values`` as given).
        direction: The KPI's direction; accepted for API symmetry: change points are found
            in both directions, and `verdict` tells regressions from improvements.
        settings: Detector tuning.

    Returns:
        Sorted indices into ``values``; empty for short, constant or stable series.

    Example:
        >>> change_points([10.0] * 20 + [12.0] * 20)
        [20]
    """
    if direction not in ("higher_better", "lower_better"):
        raise ValueError(f"direction must be higher_better or lower_better, not {direction!r}")
    y, index = _finite(values)
    if len(y) < 2 * settings.min_size:
        return []
    sigma = noise_scale(y)
    if sigma == 0.0 and float(np.ptp(y)) == 0.0:
        return []
    sigma = _sigma_floor(y, sigma)
    shielded = _shield(y, sigma, settings.outlier_z)
    candidates = _binseg(shielded, sigma, settings)
    kept = _validate(shielded, _refine(shielded, candidates, settings), sigma, settings)
    return [int(index[t]) for t in _refine(shielded, kept, settings)]


def _normal_confidence(z: float) -> float:
    return float(0.5 * (1 + math.erf(z / math.sqrt(2))))


def verdict(history: Sequence[float], latest: float | Sequence[float],
            direction: Direction, *, settings: DetectorSettings = DEFAULTS) -> Verdict:
    """Judge the newest run against the history of the same configuration.

    Args:
        history: Earlier values of this KPI for matching runs, ordered by time.
        latest: The newest run's value, or several repeats of it.
        direction: ``higher_better`` or ``lower_better``.
        settings: Detector tuning.

    Returns:
        The `Verdict`: kind, relative magnitude, confidence, baseline and an explanation.

    Example:
        >>> verdict([100, 101, 99, 100, 100, 101], [90, 91], "higher_better").kind
        'regression'
    """
    if direction not in ("higher_better", "lower_better"):
        raise ValueError(f"direction must be higher_better or lower_better, not {direction!r}")
    repeats = np.atleast_1d(np.asarray(latest, dtype=float))
    repeats = repeats[np.isfinite(repeats)]
    h, _ = _finite(history)
    if len(repeats) == 0:
        return Verdict(kind="insufficient_history", magnitude=0.0, confidence=0.0,
                       baseline=None, explanation="the newest run has no finite value")
    value = float(np.median(repeats))
    if len(h) < settings.min_history:
        return Verdict(kind="insufficient_history", magnitude=0.0, confidence=0.0,
                       baseline=None, latest=value, history_used=len(h),
                       explanation=f"{len(h)} historical point(s); "
                                   f"{settings.min_history} needed")
    confirm_with_previous = len(repeats) == 1 and len(h) >= settings.min_history + 1
    reference = h[:-1] if confirm_with_previous else h
    cps = change_points(reference, direction, settings=settings)
    start = cps[-1] if cps else 0
    segment = reference[start:]
    if len(segment) < settings.min_history:  # a fresh level with too few points: widen
        segment = reference[max(0, len(reference) - settings.min_history):]
    segment = segment[-settings.baseline_window:]
    baseline = _trimmed_mean(segment)
    sigma = _sigma_floor(reference, noise_scale(reference))
    if len(reference) < 3 or noise_scale(reference) == 0.0:
        sigma = _sigma_floor(reference, 0.0)
    se = sigma * math.sqrt(1.0 / len(repeats) + 1.1 / len(segment))
    delta = value - baseline
    z = abs(delta) / se if se > 0 else math.inf
    magnitude = delta / abs(baseline) if baseline != 0 else (0.0 if delta == 0 else
                                                             math.copysign(1.0, delta))
    worse = delta < 0 if direction == "higher_better" else delta > 0
    significant = z >= settings.verdict_z and abs(magnitude) >= settings.min_magnitude
    confirmed = True
    if significant and confirm_with_previous:
        previous = float(h[-1])
        prev_delta = previous - baseline
        prev_z = abs(prev_delta) / (sigma * math.sqrt(1.0 + 1.1 / len(segment)))
        prev_mag = prev_delta / abs(baseline) if baseline != 0 else math.copysign(1.0, prev_delta)
        confirmed = (np.sign(prev_delta) == np.sign(delta)
                     and prev_z >= settings.verdict_z * settings.confirm_factor
                     and abs(prev_mag) >= settings.min_magnitude * settings.confirm_factor)
    pct = f"{magnitude * 100:+.1f}%"
    if significant and confirmed:
        kind: VerdictKind = "regression" if worse else "improvement"
        confidence = min(1.0, _normal_confidence(z - settings.verdict_z + 2.0))
        explanation = (f"{value:.4g} vs baseline {baseline:.4g} ({pct}, {z:.1f} noise SE) "
                       f"over the last {len(segment)} comparable runs")
        if confirm_with_previous:
            explanation += "; confirmed by the previous run"
    else:
        kind = "no_change"
        confidence = 1.0 - min(1.0, _normal_confidence(z - settings.verdict_z + 2.0)) * 0.5
        reason = "not confirmed by the previous run (a single outlier?)" if significant else (
            f"below the {settings.min_magnitude:.0%} / {settings.verdict_z:.1f} SE threshold")
        explanation = (f"{value:.4g} vs baseline {baseline:.4g} ({pct}, {z:.1f} noise SE): "
                       f"{reason}")
    return Verdict(kind=kind, magnitude=float(magnitude), confidence=round(confidence, 4),
                   baseline=baseline, latest=value, history_used=len(segment),
                   explanation=explanation)
