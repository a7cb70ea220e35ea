"""Changes of a series' spread (its noise), not of its level.

The size of each run's deviation from its level, rank-scored and segmented like a level:
a KPI that became noisier (or steadier) at a run is a spread change. See
`analysis.regression` for how it becomes a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from analysis.detector import DetectorSettings, _shield
from analysis.segmentation import _candidates, _refine, _validate


def _spread_changes(y: np.ndarray, levels: Sequence[int], s: DetectorSettings,
                    sigma: float) -> list[int]:
    """Where the noise's spread changed by ``spread_ratio`` or more (positions in ``y``).

    The spread is read from the first differences (levels, drift and the wave cancel out of
    them) as ``t = sqrt(|diff|)``: for normal noise its mean is proportional to
    ``sqrt(sigma)`` and its distribution nearly symmetric, so a spread change is a level
    change of ``t`` (found by the same segmentation and validation, outliers shielded), about
    as detectable as by the normal likelihood ratio and far less fooled by heavy tails. A
    change within ``2 x min_size`` runs of a level change is that level change's, and one
    needs as many runs on each side.
    """
    if not math.isfinite(s.spread_ratio) or len(y) < 4 * s.min_size or sigma <= 0:
        return []
    size = np.abs(np.diff(y))
    t = _rank_scores(size)
    # a spread needs more runs than a level to be measured: steps weighed over 200 runs
    # (not lowered for short series like the level's: a spread read from few runs is the
    # first to mislead)
    tuned = replace(s, log_scale=False, min_magnitude=0.0, window=SPREAD_WINDOW,
                    drift_floor_z=0.0, candidate_z=s.spread_z, z_threshold=s.spread_z)
    # the scores' spread is known (logistic: pi / sqrt(3)), whatever the noise's tails
    scale = math.pi / math.sqrt(3) * _correlation_factor(t)
    shielded = _shield(t, scale, tuned.outlier_z)
    candidates = _candidates(shielded, scale, tuned)
    found = _validate(shielded, _refine(shielded, candidates, scale, tuned), scale, tuned,
                      False)
    out = []
    near = 2 * s.min_size  # a spread is read from more runs than a level
    for c in found:  # t[c] = |y[c + 1] - y[c]|: the first difference wholly after run c
        if c < near or c > len(t) - near or any(abs(c - level) < near for level in levels):
            continue
        ratio = _spread_ratio(size, c, SPREAD_WINDOW)
        if ratio >= s.spread_ratio or ratio <= 1 / s.spread_ratio:
            out.append(c)
    return out


SPREAD_POWER = 0.5
SPREAD_WINDOW = 200
"""The spread is read from ``|diff| ** SPREAD_POWER`` (see `_spread_changes`)."""

PLACE_RADIUS = 20
"""How far (runs) `place_spread_changes` may move a spread change found by the segmentation."""
PLACE_WINDOW = 120
"""How many runs on each side of a spread change `place_spread_changes` reads."""


def place_spread_changes(y: np.ndarray, found: Sequence[int], levels: Sequence[int],
                         min_size: int) -> list[int]:
    """Each spread change of ``found`` moved to its most likely run (positions in ``y``).

    The segmentation finds a spread change on the sizes of first differences, each of which
    spans two runs, and its rank scores blur a change further: measured on variance changes
    of x2-x4 (`benchmarks/regression/long_probe.py`'s ``variance`` class and draws of
    normal and Student-t noise), fewer than 60 % of the changes found were placed within two
    runs. Here each one is placed again by the likelihood of a change of scale in the
    residuals around a line fitted to its neighbourhood (up to `PLACE_WINDOW` runs on each
    side, never across another change): the split that minimises ``n1 log mean|r1| +
    n2 log mean|r2|`` (Laplace's scale, not the normal's squares: as sharp on normal noise,
    and far less pulled by one far-out run), within `PLACE_RADIUS` runs. Measured: 84 -> 111
    of 141 changes within two runs on normal noise, 82 -> 97 of 138 on Student-t(5) noise,
    65 -> 72 of 119 on Student-t(3) noise; the changes found are the same.
    """
    near = 2 * min_size  # as `_spread_changes` keeps a spread change from a level change
    out: list[int] = []
    for i, c in enumerate(found):
        others = [f for j, f in enumerate(found) if j != i]
        before = [b for b in (*levels, *others) if b < c]
        after = [a for a in (*levels, *others) if a > c]
        lo_data = max(max(before, default=0), c - PLACE_WINDOW)
        hi_data = min(min(after, default=len(y)), c + PLACE_WINDOW)
        lower = max(c - PLACE_RADIUS, lo_data + min_size,
                    max((b + near for b in levels if b < c), default=near))
        upper = min(c + PLACE_RADIUS, hi_data - min_size,
                    min((a - near for a in levels if a > c), default=len(y) - near))
        lower, upper = min(lower, c), max(upper, c)
        out.append(_most_likely_split(y[lo_data:hi_data], lower - lo_data,
                                      upper - lo_data, c - lo_data) + lo_data)
    return out


def _most_likely_split(segment: np.ndarray, lower: int, upper: int, default: int) -> int:
    """The ``k`` in ``[lower, upper]`` where ``segment`` most likely changed its scale.

    Residuals around the segment's least-squares line (a slow drift is no spread); ``default``
    when no split has a finite likelihood (a side with no spread at all).
    """
    n = len(segment)
    if n < 4:  # no line and two scales to fit
        return default
    x = np.arange(n, dtype=float)
    slope, intercept = np.polyfit(x, segment, 1)
    size = np.abs(segment - (slope * x + intercept))
    sums = np.concatenate([[0.0], np.cumsum(size)])
    k = np.arange(max(lower, 1), min(upper, n - 1) + 1)
    if len(k) == 0:
        return default
    first, second = sums[k] / k, (sums[n] - sums[k]) / (n - k)
    with np.errstate(divide="ignore"):
        cost = k * np.log(first) + (n - k) * np.log(second)
    if not np.any(np.isfinite(cost)):
        return default
    return int(k[int(np.nanargmin(np.where(np.isfinite(cost), cost, np.inf)))])


def _correlation_factor(t: np.ndarray, block: int = 20) -> float:
    """The factor from ``t``'s difference-based noise scale to the one its means vary by.

    Neighbouring differences share a run, so their sizes are correlated (``rho`` about +0.18
    for normal noise, +0.37 for Student-t noise of 2 degrees of freedom: one extreme run
    makes two large differences). The difference-based scale reads ``sqrt(1 - rho)`` of the
    noise, and a mean of ``n`` varies as if it had ``n / (1 + 2 rho)`` points. ``rho`` is
    measured within blocks of ``block`` runs less their means, so a change of spread (a
    level change of ``t``) does not count as correlation.
    """
    usable = len(t) - len(t) % block
    if usable < 2 * block:
        rho = 0.2
    else:
        within = t[:usable].reshape(-1, block)
        within = within - within.mean(axis=1, keepdims=True)
        denominator = float(np.sum(within * within))
        rho = float(np.sum(within[:, 1:] * within[:, :-1])) / denominator if denominator \
            else 0.0
        rho += 1 / block  # removing each block's mean biases rho down by about 1 / block
    rho = min(max(rho, 0.0), 0.6)
    return math.sqrt((1 + 2 * rho) / (1 - rho))


def _spread_ratio(size: np.ndarray, c: int, window: int) -> float:
    """The noise's standard deviation after ``c`` over before it.

    The ratio of the median sizes of the differences (proportional to the standard deviation
    for any scale family).
    """
    before = float(np.median(size[max(0, c - window):c])) if c > 0 else 0.0
    after = float(np.median(size[c:c + window]))
    if not before > 0:
        return math.inf if after > 0 else 1.0
    return after / before


def _rank_scores(size: np.ndarray) -> np.ndarray:
    """Logistic scores of the ranks of ``size`` (ties share their mean rank).

    A spread change is a level change of these, and their noise does not depend on the
    noise's tails (a rank test).
    """
    order = np.argsort(size, kind="stable")
    ranks = np.empty(len(size))
    ranks[order] = np.arange(1, len(size) + 1)
    _, inverse, counts = np.unique(size, return_inverse=True, return_counts=True)
    if len(counts) < len(size):  # ties (a quantised series): their mean rank
        ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]
    u = (ranks - 0.5) / len(size)
    return np.log(u / (1 - u))
