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
