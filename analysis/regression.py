"""Change-point detection and per-run regression verdicts for performance series.

Model
-----
A KPI series is piecewise constant plus an optional slow drift shared by all segments, times
multiplicative noise that may be heavy-tailed, bimodal or carry single outliers. A change
point is an *abrupt* level shift, large against the noise and against the drift.

Method (`change_points`)
------------------------
0. **Log scale**: a series of positive values is analysed as ``log(values)``
   (``log_scale``), so noise proportional to the level has one scale before and after a big
   step, and steps are relative.
1. **Noise scale** ``sigma`` from first differences (they cancel levels and drift): the larger
   of ``1.4826 * MAD(diff) / sqrt(2)`` and the 5-95 % winsorised standard deviation of the
   differences over ``sqrt(2)`` (`noise_scale`).
2. **Outlier shield**: a point further than ``outlier_z * sigma`` (5) from the median of its
   neighbours (window 5) is replaced by that median for detection, so a lone outlier cannot
   create a level. Outliers inflate the difference-based scale (each spoils two
   differences), so ``sigma`` is measured again on the shielded series until it stops
   falling, starting from a shield at the MAD scale when that one marks at most
   ``max_outlier_share`` (10 %) of the runs (`_shielded_noise`).
3. **Candidates**: the exact least-squares segmentation with a penalty of
   ``(candidate_z * sigma)^2`` (4.5) per change and segments of at least ``min_size`` (5) runs,
   by optimal partitioning (Jackson et al., 2005). Unlike binary
   segmentation it places nearby changes jointly, so a misplaced split leaves no spurious
   neighbour behind. When the steps validated (5.) leave a significant drift, the
   candidates are looked for again on the series less that drift: the segmentation reads a
   drift as a staircase and puts its steps where drift and noise add up, not at the step.
4. **Location**: each candidate moves to its most probable place between its neighbours
   (within ``window``): the split whose likelihood mass within ``locate_radius`` (2) runs is
   largest, after removing the series' drift.
5. **Validation**, repeated until stable: the step ``c`` between the 20%-trimmed means of up
   to ``window`` (80) points on each side must have ``|c| / se(c) >= z_threshold`` (4.5) and a
   relative size ``>= min_magnitude`` (default 0: significance alone decides). The drift is
   one slope shared by all segments (estimated within segments, so the steps do not bias
   it); when it is significant (``drift_z`` = 2 standard errors) the step is measured
   against the drift line, so a slow drift produces no step; when it is not, the step must
   still beat the drift explanation by ``drift_floor_z`` (2.5) standard errors. Weak
   candidates are removed one at a time, weakest first, and the others re-measured. Steps
   that leave no drift may have absorbed one (a staircase), and levels with one slope read a
   slow bend as steps: the drift (or a quadratic bend) with the fewer steps found on the
   series less it wins when its penalised least-squares cost is lower.
6. **Short series** (``n < short_length`` = 200) offer fewer places for a false step, so
   ``candidate_z`` and ``z_threshold`` are scaled by ``ln n / ln short_length``. Their
   difference-based ``sigma`` is off by up to 30 % at 40 runs, enough to decide a weak step
   either way, so after a first pass (steps 2-5) ``sigma`` is measured again from the
   residuals around the levels found (about twice as efficient) and steps 2-5 run again.

Cost: ``O(n^2)`` arithmetic in ``n`` vectorised steps (`_segment`), so series longer than
``COARSE_FROM`` (250) are segmented on block means first and each change placed run by run
after: with the periodic test and the spread changes, about 13 ms for 1 000 stable points
and 27 ms for one with steps and a wave on this project's 2-core machine
(benchmarks/regression/speed.py).

Edges (``edge_z``)
------------------
The segmentation needs ``min_size`` runs on each side of a change, so a level that began in
the newest (or oldest) few runs is invisible to it. Such an edge level is judged like the
verdict judges the newest runs (below), at ``edge_z`` standard errors; a change the
segmentation pinned at its limit is moved there. Series from ``min_history + 2`` runs on
are examined this way (shorter than ``2 x min_size`` runs, only this way).

Verdict (`verdict`)
-------------------
The question is whether a new level began in the last ``recent_runs`` (5) runs: the *alert
window*. Positive series are judged in log space (so mirror KPIs, a runtime and its
throughput, get the same verdict). For every possible start ``k`` runs ago (``k`` = 1 .. 2 x
``recent_runs``), the newest ``k`` runs (the tail) are compared with the runs of the history's
current segment before them, up to ``baseline_window`` (30). The current segment starts at
the last change point older than the candidate starts (a change the segmentation already
found among the newest runs is a candidate start, not the baseline: the regression stays
visible for its whole alert window), or at a level a person accepted (``accepted``). The
likeliest start is the ``k`` whose tail mean departs most from its baseline (in standard
errors); that shift is then tested with a cautious robust level of the tail (of 2 runs, the
one closer to the baseline; 3-4 runs, the median; more, the trimmed mean), so one outlier
never moves it: ``z = (level(tail) - baseline) / se``. The baseline follows the history's
drift when that drift, measured on the outlier-shielded history before the last 2 x
``recent_runs`` runs, is beyond ``verdict_drift_z`` (4) standard errors. The newest run is a
regression when the start is within ``recent_runs``, ``|z| >= verdict_z``, the shift is at
least ``min_magnitude``, against the KPI's direction, and the newest run itself deviates
the same way by ``confirm_factor`` x ``verdict_z``. A single run without repeats is never a
shift: when it alone deviates beyond ``suspect_z`` standard errors of one run (either way)
it is a ``suspect``; the flow re-runs its cell (``analysis.confirm_reruns``) and judges the
repeats together: confirmed, a regression (or improvement) at that run; not, an
``outlier``. A start further back than the alert window is the current level, not news.
Improvements are reported, never called regressions.

Shapes
------
A no-change verdict is told apart further: ``noisier`` when the spread of the recent runs
grew (`spread_change_points`: a spread change is found as a level change of the logistic
scores of the ranks of the first differences' sizes, at ``spread_z`` for a change point and
at the lower ``noisier_z`` for the verdict's question about the recent runs, and kept when
the spread moved by ``spread_ratio``), ``periodic`` when the series is a wave
(`analysis.seasonality`; the wave is taken out of the series before everything else when it
and fewer steps explain the series better than steps alone), ``drift`` when the baseline
follows a significant drift.

Operating point: chosen on the independently designed generator families of
``benchmarks/regression/families.py`` by the false-alarm budget (at most 1 % false alarms
per stable run), spent on recall: ``verdict_z`` 2.4 (with the small-sample widening of the
noise scale), ``confirm_factor`` 0.5, ``suspect_z`` 2.7 (at most 3 % of stable runs
suspected), ``edge_z`` 4.5 (down to 0.7 x in short series), ``z_threshold`` and
``candidate_z`` 4.5, no minimum change. docs/performance.md
has the leave-one-family-out table.

Parameters are keyword arguments with documented defaults; results are deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from analysis.seasonality import Seasonality, deseasonalised, seasonality

__all__ = [
    "DEFAULTS",
    "Direction",
    "DetectorSettings",
    "Verdict",
    "NEWS",
    "VerdictKind",
    "change_points",
    "spread_change_points",
    "minimum_detectable_effect",
    "noise_scale",
    "pooled_noise",
    "repeats_for",
    "shift_at",
    "verdict",
]

Direction = Literal["higher_better", "lower_better"]
VerdictKind = Literal["regression", "improvement", "suspect", "outlier", "noisier", "periodic",
                      "drift", "no_change", "insufficient_history"]
"""What a verdict says of the newest run:

- ``regression`` / ``improvement``: a new level, confirmed (two runs or more agree: the
  newest and earlier ones, or the newest and its re-runs);
- ``suspect``: the newest run alone is out of line with the current level (as likely the
  first run of a new level as an outlier): a re-run decides;
- ``outlier``: a suspect its re-runs did not confirm (kept and shown, never a baseline);
- ``noisier``: the spread of the recent runs grew (at least ``spread_ratio`` x) while the
  level did not move;
- ``periodic`` / ``drift``: no news, in a series that is a wave (its period) or that drifts
  (its slope): judged against the wave or the drift line;
- ``no_change``; ``insufficient_history``.
"""
NEWS = ("regression", "improvement")
"""The kinds that are a confirmed change of level."""


@dataclass(frozen=True)
class DetectorSettings:
    """Tuning of the detector (see the module docstring for the meaning of each).

    Attributes:
        min_size: Minimum points per segment.
        window: Points on each side used to measure (and to place) a step.
        candidate_z: Penalty of one change in the segmentation, as ``(candidate_z *
            sigma)^2``.
        z_threshold: Validation threshold of a step, in standard errors.
        min_magnitude: Smallest relative step reported (0: none; a team's own floor,
            ``analysis.regression.min_change_pct``). A fixed 2 % floor was tuned to
            generators whose noise is over 1 %: on quiet benchmarks (noise 0.1-1 %) it hid
            most steps, however many noise units they were.
        outlier_z: Distance from the local median (noise units) that marks an outlier.
        max_outlier_share: Outliers are rare: a robust noise scale that marks more than
            this share of the runs reads sticky or quantised noise, not outliers.
        drift_z: The shared within-segment slope counts as drift (and is corrected for)
            beyond this many standard errors.
        drift_floor_z: Without significant drift, a step must still exceed the drift
            explanation by this many standard errors (0 disables).
        short_length: Series shorter than this get proportionally lower ``candidate_z`` and
            ``z_threshold`` (times ``ln n / ln short_length``): fewer places for a false step
            to hide, so less multiple-testing protection is needed (0 disables).
        log_scale: Analyse positive series in log space (multiplicative noise).
        locate_radius: A change is placed where the likelihood mass within this many runs
            is largest (0: the least-squares optimum).
        min_history: Historical points needed for a verdict.
        verdict_z: Threshold of the newest level's shift, in standard errors.
        baseline_window: Points of the current segment used as the verdict baseline.
        confirm_factor: The newest run must deviate the same way by this fraction of
            ``verdict_z`` for its level's shift to count.
        recent_runs: A shift is news (regression or improvement) when its level began at
            most this many runs ago.
        verdict_drift_z: The verdict's baseline follows the history's drift beyond this
            many standard errors.
        edge_z: A level that began in the last (or first) ``min_size - 1`` runs of a series,
            too short a segment for the segmentation, counts as a change point beyond this
            many standard errors (inf: never).
        edge_short_factor: Series shorter than ``short_length`` lower ``edge_z`` like the
            other thresholds, but by at most this factor: the edge test looks at a few tail
            lengths, not at every place of the series.
        suspect_z: The newest run alone (no repeats) is a ``suspect`` beyond this many
            standard errors from the current level, either way (inf: never). Chosen for at
            most 3 % of stable runs suspected (docs/performance.md).
        spread_ratio: A change of spread is reported (a change point; ``noisier`` when it
            grew) when the noise's standard deviation changed by this factor or more.
        spread_z: Validation threshold (and segmentation penalty) of a spread change, in
            standard errors of its ``|diff| ** SPREAD_POWER`` level.
        noisier_z: The ``noisier`` verdict's threshold (a spread change among the last
            ``spread_recent`` runs): lower than ``spread_z``, because it asks one question
            about the recent runs, where ``spread_z`` marks change points anywhere in a
            whole history (measured: spread increases reported 0.50 -> 0.80 at 0.07 ->
            0.47 % of stable runs, change-point F1 unchanged; docs/performance.md).
        spread_recent: ``noisier`` is the verdict while the spread's change began at most
            this many runs ago.
        periodic: Test each series for a periodic component (`analysis.seasonality`) and
            segment it without that component.
    """

    min_size: int = 5
    window: int = 80
    candidate_z: float = 4.5
    z_threshold: float = 4.5
    min_magnitude: float = 0.0
    outlier_z: float = 5.0
    max_outlier_share: float = 0.1
    drift_z: float = 2.0
    drift_floor_z: float = 2.5
    short_length: int = 200
    log_scale: bool = True
    locate_radius: int = 2
    min_history: int = 3
    verdict_z: float = 2.4
    baseline_window: int = 30
    confirm_factor: float = 0.5
    recent_runs: int = 5
    verdict_drift_z: float = 4.0
    edge_z: float = 4.5
    edge_short_factor: float = 0.7
    suspect_z: float = 2.7
    spread_ratio: float = 1.5
    spread_z: float = 3.0
    noisier_z: float = 2.3
    spread_recent: int = 20
    periodic: bool = True


DEFAULTS = DetectorSettings()


class Verdict(BaseModel):
    """The judgement of the newest run against its history."""

    kind: VerdictKind = Field(description="regression, improvement, suspect, outlier, "
                                          "noisier, periodic, drift, no_change or "
                                          "insufficient_history (see VerdictKind).")
    magnitude: float = Field(description="Relative change of the newest run vs the baseline "
                                         "(0.05 = +5%).")
    confidence: float = Field(ge=0, le=1, description="0-1 confidence in the kind.")
    baseline: float | None = Field(description="The level the newest run is compared with.")
    latest: float | None = Field(default=None, description="The newest run's value "
                                                            "(median of repeats).")
    history_used: int = Field(default=0, description="Historical points in the baseline.")
    suspect: bool = Field(default=False, description="kind is suspect: the newest run alone "
                          "(no repeats) is out of line; a re-run would confirm or withdraw it.")
    start_runs: int | None = Field(default=None, description="A regression or improvement: "
                                   "its new level began this many runs back (1: the newest).")
    spread_before: float | None = Field(default=None, description="noisier: the noise's "
                                        "standard deviation before the change (relative to "
                                        "the level for positive series).")
    spread_after: float | None = Field(default=None, description="noisier: the same, since.")
    period: int | None = Field(default=None, description="periodic: runs per cycle.")
    slope_pct: float | None = Field(default=None, description="drift: % of the level per run.")
    explanation: str = Field(description="One sentence a human can check.")


# -- helpers -------------------------------------------------------------------------------


MAX_ABS = 1e150
"""Values beyond this (either sign) are not measurements: left out like NaN (their squares
and differences overflow)."""
MAX_CHANGE = 1e12
"""The largest relative change a verdict reports (a level from ~0 is 'infinitely' larger)."""


def _finite(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    array = np.asarray(values, dtype=float).ravel()
    index = np.flatnonzero(np.isfinite(array) & (np.abs(array) <= MAX_ABS))
    return array[index], index


def noise_scale(values: Sequence[float]) -> float:
    """Robust noise standard deviation of a series (0.0 for a constant series).

    The larger of two estimates from first differences (which cancel levels and drift, so
    steps barely inflate them): the MAD (robust) and the 5-95 % winsorised standard
    deviation (efficient, and the right scale for the trimmed-mean tests under heavy tails
    or sticky two-level noise, where the MAD alone reads too small).
    """
    y, _ = _finite(values)
    return max(_difference_scales(y))


def _difference_scales(y: np.ndarray) -> tuple[float, float]:
    """(MAD, winsorised) noise standard deviations from the first differences of ``y``."""
    if len(y) < 3:
        return 0.0, 0.0
    d = np.diff(y)
    mad = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    return mad / math.sqrt(2), _winsorised_std(d) / math.sqrt(2)


def _winsorised_std(x: np.ndarray) -> float:
    """Standard deviation of ``x`` clipped to its 5-95 % quantiles."""
    lo, hi = np.quantile(x, [0.05, 0.95])
    return float(np.std(np.clip(x, lo, hi)))


def _sigma_floor(y: np.ndarray, sigma: float) -> float:
    scale = float(np.median(np.abs(y))) if len(y) else 0.0
    return max(sigma, 1e-4 * scale, 1e-12)


def _shield(y: np.ndarray, sigma: float, outlier_z: float) -> np.ndarray:
    """``y`` with each run beyond ``outlier_z * sigma`` of its 5-run median replaced by it.

    The ends are mirrored (``y[-2], y[-3]`` after the last run), so a lone first or last
    run is shielded like any other: repeating the edge value made the last run its own
    median, and one wild newest run then read as a drift that the segmentation cut into
    steps all along a flat history. A new level of two runs or more at an end is kept (it is
    its own window's median).
    """
    n = len(y)
    if n < 5:
        return y.copy()
    padded = np.pad(y, 2, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 5)
    local = np.median(windows, axis=1)
    out = y.copy()
    mask = np.abs(y - local) > outlier_z * sigma
    out[mask] = local[mask]
    return out


def _shielded_noise(y: np.ndarray, s: DetectorSettings, floor: Callable[[float], float]
                    ) -> tuple[np.ndarray, float]:
    """The series with its outliers shielded, and its noise scale measured without them.

    Outliers inflate the difference-based scale (each spoils two differences: four in a
    40-run series are a fifth of them), and an inflated scale hides them from the shield.
    So the scale is first measured on the series shielded with the (outlier-proof) MAD
    scale, unless that shield marks more than ``max_outlier_share`` of the runs (then the
    MAD reads sticky or quantised noise, not outliers); shield and scale are then
    re-measured until the scale stops falling.
    """
    mad, wins = _difference_scales(y)
    sigma, mad = floor(max(mad, wins)), floor(mad)
    if mad < sigma:
        trial = _shield(y, mad, s.outlier_z)
        marked = int(np.count_nonzero(trial != y))
        if 0 < marked <= max(1.0, s.max_outlier_share * len(y)):
            sigma = min(sigma, max(mad, floor(noise_scale(trial))))
    shielded = _shield(y, sigma, s.outlier_z)
    for _ in range(3):  # converges in one or two rounds
        again = floor(noise_scale(shielded))
        if again >= sigma * 0.999:
            break
        sigma = again
        shielded = _shield(y, sigma, s.outlier_z)
    return shielded, sigma


def _trimmed_mean(x: np.ndarray, trim: float = 0.2) -> float:
    n = len(x)
    if n == 0:
        return float("nan")
    k = int(n * trim)
    if k == 0:
        return float(np.median(x)) if n <= 4 else float(np.mean(x))
    s = np.sort(x)
    return float(np.mean(s[k:n - k]))


def _locate(cs: np.ndarray, a: int, b: int, min_size: int, sigma: float,
            radius: int) -> int:
    """Where one change in ``y[a:b]`` most probably lies, within ``radius`` runs (-1: none).

    ``cs`` is the cumulative sum of ``y``. The least-squares gain of a split at ``t`` is the
    log-likelihood of a change there (times ``2 sigma^2``); the split returned has the
    largest likelihood mass within ``radius`` runs, which is the least-squares optimum
    unless the noise leaves two places nearly equal and the runner-up has close support.
    """
    n = b - a
    if n < 2 * min_size:
        return -1
    t = np.arange(a + min_size, b - min_size + 1)
    left = cs[t] - cs[a]
    right = cs[b] - cs[a] - left
    gain = left ** 2 / (t - a) + right ** 2 / (b - t)
    if radius > 0 and sigma > 0 and len(t) > 1:
        weight = np.exp((gain - gain.max()) / (2 * sigma ** 2))
        mass = np.concatenate([[0.0], np.cumsum(weight)])
        i = np.arange(len(t))
        window = mass[np.minimum(i + radius + 1, len(t))] - mass[np.maximum(i - radius, 0)]
        gain = window + 1e-6 * weight  # on a plateau of equal mass, the likeliest place wins
    return int(t[int(np.argmax(gain))])


def _segment(y: np.ndarray, sigma: float, s: DetectorSettings) -> list[int]:
    """Optimal partition of ``y`` by least squares plus ``(candidate_z * sigma)^2`` per change.

    Optimal partitioning (Jackson et al., 2005), exact for this cost. Unlike binary
    segmentation it places nearby changes jointly, so a misplaced first split cannot leave a
    spurious neighbour behind. Each run's best last segment is one vectorised pass over
    every earlier start: ``O(n^2)`` arithmetic but ``n`` Python steps. PELT's pruning
    (Killick et al., 2012) gives the same partition with less arithmetic, but its
    bookkeeping costs more than it saves at the lengths segmented here (at most a few
    hundred: `_candidates`): 1.7 ms instead of 2.5 ms at 250 runs (benchmarks/regression/
    speed.py).
    """
    n, m = len(y), s.min_size
    if n < 2 * m:
        return []
    penalty = (s.candidate_z * sigma) ** 2
    cs = np.concatenate([[0.0], np.cumsum(y)])
    # 1 / (t - start) for start = 0 .. t - m is a reversed slice of one table, and the
    # step's arithmetic reuses two buffers: the loop is numpy's call overhead, so fewer
    # calls and no allocation are what save time (~13 % at 250 runs).
    reciprocal = 1.0 / np.arange(1, n + 1, dtype=float)
    totals, costs = np.empty(n + 1), np.empty(n + 1)
    best = np.full(n + 1, np.inf)  # best[t]: cost of y[:t] (sum of squares omitted)
    best[0] = -penalty  # starts 1 .. m-1 stay infinite: no segment shorter than m
    last = np.zeros(n + 1, dtype=int)
    for t in range(m, n + 1):
        usable = t - m + 1  # the last segment starts at 0 or at m .. t - m
        total = np.subtract(cs[t], cs[:usable], out=totals[:usable])
        np.multiply(total, total, out=total)
        np.multiply(total, reciprocal[t - 1::-1][:usable], out=total)
        cost = np.subtract(best[:usable], total, out=costs[:usable])
        k = int(cost.argmin())
        best[t] = cost[k] + penalty
        last[t] = k
    out: list[int] = []
    t = int(last[n])
    while t > 0:
        out.append(t)
        t = int(last[t])
    return out[::-1]


COARSE_FROM = 250
"""Series longer than this are segmented on block means first (`_candidates`)."""


def _candidates(y: np.ndarray, sigma: float, s: DetectorSettings) -> list[int]:
    """`_segment`'s change points, on block means in a long series.

    Blocks of 2 to 4 runs in a series longer than ``COARSE_FROM`` (at most ~250 blocks: the
    segmentation's cost grows with the square of its length, 20 ms at 1 000 runs on a
    2-core machine).

    Block boundaries are only candidates: `_refine` then places each change run by run
    within its window, and validation measures it on the runs themselves.
    """
    block = min(4, max(2, len(y) // 125)) if len(y) > COARSE_FROM else 1
    if block <= 1:
        return _segment(y, sigma, s)
    usable = len(y) - len(y) % block
    means = y[:usable].reshape(-1, block).mean(axis=1)
    coarse = replace(s, min_size=max(2, -(-s.min_size // block)))
    return [c * block for c in _segment(means, sigma / math.sqrt(block), coarse)]


def _slope_sxx(y: np.ndarray, a: int, b: int) -> tuple[float, float]:
    """OLS slope numerator/denominator pieces of y[a:b] (sum xy, sum xx), centred."""
    n = b - a
    if n < 3:
        return 0.0, 0.0
    x = np.arange(n, dtype=float) - (n - 1) / 2
    seg = y[a:b]
    return float(np.dot(x, seg - seg.mean())), float(np.dot(x, x))


def _drift_slope(y: np.ndarray, bounds: Sequence[int]) -> tuple[float, float]:
    """Common within-segment slope of all segments: (slope, sum of squared x)."""
    sxy = sxx = 0.0
    for a, b in itertools.pairwise(bounds):
        p, q = _slope_sxx(y, a, b)
        sxy += p
        sxx += q
    return (sxy / sxx if sxx > 0 else 0.0), sxx


def _is_drift(slope: float, sxx: float, sigma: float, z: float) -> bool:
    """Whether a `_drift_slope` result is beyond ``z`` standard errors of zero."""
    return sxx > 0 and abs(slope) * math.sqrt(sxx) > z * sigma


def _step_stats(y: np.ndarray, i: int, bounds: Sequence[int], sigma: float,
                s: DetectorSettings, drift: tuple[float, float]) -> tuple[float, float, float]:
    """Drift-corrected step at change ``bounds[i + 1]``: (step, z, level_before).

    The step is measured between trimmed means of up to ``window`` points on each side,
    within the neighbouring segments; ``drift`` is the series' common slope (see
    `_drift_slope`).
    """
    a, t, b = bounds[i], bounds[i + 1], bounds[i + 2]
    lo = max(a, t - s.window)
    hi = min(b, t + s.window)
    left, right = y[lo:t], y[t:hi]
    nl, nr = len(left), len(right)
    level_l, level_r = _trimmed_mean(left), _trimmed_mean(right)
    slope, sxx = drift
    centre_l, centre_r = (lo + t - 1) / 2, (t + hi - 1) / 2
    distance = centre_r - centre_l
    var = sigma ** 2 * (1.1 * (1.0 / nl + 1.0 / nr))  # 1.1: trimmed-mean efficiency
    raw_step, raw_z = level_r - level_l, abs(level_r - level_l) / math.sqrt(var)
    # The step measured against the drift line, with the slope's uncertainty.
    if sxx > 0:
        var += distance ** 2 * sigma ** 2 / sxx
    step = raw_step - slope * distance
    z = abs(step) / math.sqrt(var) if var > 0 else math.inf
    if not _is_drift(slope, sxx, sigma, s.drift_z):
        # No significant drift: correcting for a slope that is noise would only cost power,
        # so the raw step counts; it must still beat the drift explanation by drift_floor_z
        # (scaled to the z_threshold units the caller compares with).
        slope, step = 0.0, raw_step
        z = min(raw_z, z * s.z_threshold / s.drift_floor_z) if s.drift_floor_z > 0 else raw_z
    # Level just before the step, from the drift line, for the relative size.
    return step, z, level_l + slope * (t - 1 - centre_l)


def _refine(y: np.ndarray, cps: list[int], sigma: float, s: DetectorSettings) -> list[int]:
    """Move each change point to its most probable place between its neighbours (±window).

    Places are measured on ``y`` minus the segments' common drift when it is significant:
    a drift pulls a least-squares split towards the middle of its segment.
    """
    if not cps:
        return cps
    slope, sxx = _drift_slope(y, [0, *cps, len(y)])
    if _is_drift(slope, sxx, sigma, s.drift_z):
        y = y - slope * np.arange(len(y))
    cs = np.concatenate([[0.0], np.cumsum(y)])
    out = list(cps)
    for i, t in enumerate(out):
        a = out[i - 1] if i else 0
        b = out[i + 1] if i + 1 < len(out) else len(y)
        a, b = max(a, t - s.window), min(b, t + s.window)
        best = _locate(cs, a, b, min(s.min_size, (b - a) // 2), sigma, s.locate_radius)
        if best > 0:
            out[i] = best
    return sorted(set(out))


def _validate(y: np.ndarray, cps: list[int], sigma: float, s: DetectorSettings,
              log_scale: bool) -> list[int]:
    """Drop candidates whose step is too weak or too small, weakest first, until all pass.

    With ``log_scale`` the series is ``log(values)``, so a step's relative size is
    ``expm1(step)``.
    """
    cps = list(cps)
    while cps:
        bounds = [0, *cps, len(y)]
        drift = _drift_slope(y, bounds)
        scores = []
        for i in range(len(cps)):
            step, z, before = _step_stats(y, i, bounds, sigma, s, drift)
            if log_scale:
                rel = abs(_expm1(step))
            else:
                rel = abs(step) / abs(before) if before != 0 else (math.inf if step else 0.0)
            ok = z >= s.z_threshold and rel >= s.min_magnitude
            size = rel / s.min_magnitude if s.min_magnitude > 0 else math.inf  # 0: no floor
            scores.append((ok, min(z / s.z_threshold, size)))
        weak = [(score, i) for i, (ok, score) in enumerate(scores) if not ok]
        if not weak:
            break
        cps.pop(min(weak)[1])  # drop the weakest, then re-measure the rest
    return cps


def _residual_noise(y: np.ndarray, cps: Sequence[int], sigma: float,
                    s: DetectorSettings) -> float:
    """Noise scale from the residuals around the segments' levels (and the drift line).

    About twice as efficient as the difference-based scale: in a 40-run series that one is
    off by up to 30 % (90 % range), enough to decide a weak step either way. A missed step
    inflates it (cautious), the degrees of freedom of the levels are corrected for.
    """
    bounds = [0, *cps, len(y)]
    slope, sxx = _drift_slope(y, bounds)
    if not _is_drift(slope, sxx, sigma, s.drift_z):
        slope = 0.0
    r = y - slope * np.arange(len(y))
    res = np.concatenate([r[a:b] - np.median(r[a:b]) for a, b in itertools.pairwise(bounds)])
    dof = len(y) / max(len(y) - len(bounds) + 1, 1)
    return _winsorised_std(res) * math.sqrt(dof)  # winsorised like `noise_scale`


def _detect(y: np.ndarray, sigma: float, s: DetectorSettings, log_scale: bool) -> list[int]:
    """Steps 3-5 of the method on a shielded series: candidates, location, validation."""
    candidates = _refine(y, _candidates(y, sigma, s), sigma, s)
    kept = _validate(y, candidates, sigma, s, log_scale)
    slope, sxx = _drift_slope(y, [0, *kept, len(y)])
    if _is_drift(slope, sxx, sigma, s.drift_z):
        # The segmentation reads a drift as a staircase, and its least-squares steps sit
        # where drift and noise add up, not at the real step: look for candidates again
        # on the series without the drift (validation still measures the drift itself).
        flat = y - slope * np.arange(len(y))
        candidates = _refine(y, _candidates(flat, sigma, s), sigma, s)
        kept = _validate(y, candidates, sigma, s, log_scale)
    elif kept:
        # A staircase of steps can absorb a drift whole (no slope is left within its
        # segments): the drift and fewer steps may explain the series better. The cheaper
        # model wins, a drift costing what a step costs.
        slope, sxx = _drift_slope(y, [0, len(y)])
        if _is_drift(slope, sxx, sigma, s.drift_z):
            flat = y - slope * np.arange(len(y))
            other = _validate(y, _refine(y, _candidates(flat, sigma, s), sigma, s), sigma, s,
                              log_scale)
            if len(other) < len(kept) and _model_cost(y, other, sigma, s, True) < _model_cost(
                    y, kept, sigma, s, False):
                kept = other
    if kept:
        kept = _curved_alternative(y, kept, sigma, s, log_scale)
    return _refine(y, kept, sigma, s)


def _curved_alternative(y: np.ndarray, kept: list[int], sigma: float, s: DetectorSettings,
                        log_scale: bool) -> list[int]:
    """``kept``, or fewer steps found on ``y`` less a quadratic trend when that costs less.

    Levels with one shared slope read a slow bend as steps. The bend and fewer steps win when
    their penalised least-squares cost is lower, the curve's two parameters costing what two
    steps cost (`_model_cost`). Measured: no-change series with a false change point 2.8 ->
    1.8 % over the generator families (drifting ones 19 -> 8 %), F1 unchanged.
    """
    t = np.arange(len(y)) / len(y)
    bent = y - np.polyval(np.polyfit(t, y, 2), t)
    other = _validate(bent, _refine(bent, _candidates(bent, sigma, s), sigma, s), sigma, s,
                      log_scale)
    if len(other) >= len(kept):
        return kept
    drift = _is_drift(*_drift_slope(y, [0, *kept, len(y)]), sigma, s.drift_z)
    curved = _model_cost(bent, other, sigma, s, False) + 2 * s.candidate_z ** 2
    return other if curved < _model_cost(y, kept, sigma, s, drift) else kept


def _model_cost(y: np.ndarray, cps: Sequence[int], sigma: float, s: DetectorSettings,
                drift: bool) -> float:
    """Penalised least-squares cost of levels at ``cps`` (plus a shared drift when asked)."""
    bounds = [0, *cps, len(y)]
    r = y
    if drift:
        slope, _ = _drift_slope(y, bounds)
        r = y - slope * np.arange(len(y))
    rss = sum(float(np.sum((r[a:b] - r[a:b].mean()) ** 2)) for a, b in itertools.pairwise(bounds))
    return rss / sigma ** 2 + s.candidate_z ** 2 * (len(cps) + drift)


def _for_length(s: DetectorSettings, n: int) -> DetectorSettings:
    """Thresholds for a series of ``n`` points (lower below ``short_length``)."""
    if not s.short_length or n >= s.short_length:
        return s
    factor = math.log(n) / math.log(s.short_length)
    return replace(s, candidate_z=s.candidate_z * factor, z_threshold=s.z_threshold * factor,
                   edge_z=s.edge_z * max(factor, s.edge_short_factor))


def change_points(values: Sequence[float], direction: Direction = "higher_better", *,
                  settings: DetectorSettings = DEFAULTS) -> list[int]:
    """Return the indices where a new level or a new spread starts (both directions).

    A periodic series is segmented without its wave (`analysis.seasonality`): a pure wave
    has no change point. A spread change (the noise's standard deviation moved by
    ``spread_ratio`` or more at a steady level) is the first run of the new spread
    (`spread_change_points`).

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
    shapes = _shapes(values, direction, settings)
    if shapes is None:
        return []
    index, levels, spreads, _ = shapes
    return sorted({int(index[t]) for t in (*levels, *spreads)})


def spread_change_points(values: Sequence[float], direction: Direction = "higher_better", *,
                         settings: DetectorSettings = DEFAULTS) -> list[int]:
    """The indices where a new spread starts (a subset of `change_points`')."""
    shapes = _shapes(values, direction, settings)
    return [int(shapes[0][t]) for t in shapes[2]] if shapes is not None else []


def _shapes(values: Sequence[float], direction: Direction, settings: DetectorSettings,
            *, spreads: bool = True
            ) -> tuple[np.ndarray, list[int], list[int], Seasonality | None] | None:
    """(finite positions, level changes, spread changes, the wave) of a series.

    None: too short or constant. Changes are positions in the finite values.
    """
    if direction not in ("higher_better", "lower_better"):
        raise ValueError(f"direction must be higher_better or lower_better, not {direction!r}")
    y, index = _finite(values)
    edges = math.isfinite(settings.edge_z)
    shortest = settings.min_history + 2 if edges else 2 * settings.min_size
    if len(y) < shortest or float(np.ptp(y)) == 0.0:
        return None
    log_scale = settings.log_scale and bool(np.all(y > 0))
    if log_scale:  # multiplicative noise becomes additive: one noise scale for all levels
        y = np.log(y)
    season = seasonality(y) if settings.periodic else None
    levels, sigma = _levels(deseasonalised(y, season), settings, log_scale)
    if season is not None:
        # An evenly spaced staircase looks periodic too (steps less a moving average are a
        # sawtooth): the wave must explain the series better than the steps alone do, its
        # phases costing what BIC charges a parameter
        steps = _steps(y, settings, log_scale)
        if _explains_better(y, steps, levels, season, sigma, settings):
            y = deseasonalised(y, season)
        else:
            levels, season = steps, None
    found = _spread_changes(y, levels, settings, sigma) if spreads else []
    return index, levels, found, season


def _steps(y: np.ndarray, settings: DetectorSettings, log_scale: bool) -> list[int]:
    """The steps the segmentation reads in ``y`` as it is (candidates, placed, validated).

    What a wave would be cut into, for `_explains_better` (cheaper than `_levels`).
    """
    tuned = _for_length(settings, len(y))
    if len(y) < 2 * tuned.min_size:
        return []
    floor: Callable[[float], float] = (lambda x: max(x, 1e-4)) if log_scale else (
        lambda x: _sigma_floor(y, x))
    shielded, sigma = _shielded_noise(y, tuned, floor)
    return _validate(shielded, _refine(shielded, _candidates(shielded, sigma, tuned), sigma,
                                       tuned), sigma, tuned, log_scale)


def _explains_better(y: np.ndarray, steps: list[int], levels: list[int], season: Seasonality,
                     sigma: float, s: DetectorSettings) -> bool:
    """Whether the wave and ``levels`` explain ``y`` better than ``steps`` alone.

    Penalised costs in `_model_cost`'s units; ``steps`` were found on ``y`` as it is.
    """

    def drifts(series: np.ndarray, cps: Sequence[int]) -> bool:
        return _is_drift(*_drift_slope(series, [0, *cps, len(series)]), sigma, s.drift_z)

    flat = deseasonalised(y, season)
    waved = _model_cost(flat, levels, sigma, s, drifts(flat, levels)) + (
        season.period - 1) * math.log(len(y))
    return waved < _model_cost(y, steps, sigma, s, drifts(y, steps))


def _levels(y: np.ndarray, settings: DetectorSettings, log_scale: bool
            ) -> tuple[list[int], float]:
    """The level changes of ``y`` (analysis units, without its wave) and its noise scale."""

    def floor(sigma: float) -> float:
        return max(sigma, 1e-4) if log_scale else _sigma_floor(y, sigma)

    full = settings
    settings = _for_length(settings, len(y))
    shielded, sigma = _shielded_noise(y, settings, floor)
    segmentable = len(y) >= 2 * settings.min_size
    kept = _detect(shielded, sigma, settings, log_scale) if segmentable else []
    if segmentable and len(y) < settings.short_length:
        # Short series: measure the noise again around the levels found, and detect again.
        sigma = floor(_residual_noise(shielded, kept, sigma, settings))
        shielded = _shield(y, sigma, settings.outlier_z)
        kept = _detect(shielded, sigma, settings, log_scale)
    if math.isfinite(full.edge_z):
        kept = _edge_changes(y, kept, settings, log_scale)
    return kept, sigma


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


def _edge_change(y: np.ndarray, cps: list[int], s: DetectorSettings,
                 log_scale: bool) -> int | None:
    """A level that began in the last ``min_size - 1`` runs of ``y`` (index), or None.

    The segmentation needs ``min_size`` runs on each side of a change, so a level that began
    in the newest few runs is invisible to it. It is judged like the verdict judges the
    newest runs (`_tail_shifts`: a cautious level of the tail against the current segment,
    the newest run on the same side), at ``edge_z`` standard errors.
    """
    n = len(y)
    longest = s.min_size - 1 if n >= 2 * s.min_size else n - s.min_history
    if longest < 2:
        return None
    shifts = _tail_shifts(y[:-1], y[-1:], s, [c for c in cps if c < n - 1],
                          log_scale=log_scale, young=0)
    newest = shifts[0]
    edge = [x for x in shifts if 2 <= x.runs <= longest]
    if not edge:
        return None
    best = max(edge, key=lambda x: x.fit)
    step = best.level - best.baseline
    rel = abs(_expm1(step)) if log_scale else abs(_relative(step, best.baseline))
    if (abs(best.z) >= s.edge_z and rel >= s.min_magnitude and np.sign(newest.z) ==
            np.sign(best.z) and abs(newest.z) >= s.edge_z * s.confirm_factor):
        return n - best.runs
    return None


def _edge_changes(y: np.ndarray, cps: list[int], s: DetectorSettings,
                  log_scale: bool) -> list[int]:
    """``cps`` plus a change in the newest and in the oldest few runs (`_edge_change`).

    A change the segmentation placed at its limit (``min_size`` runs from an end) is where
    it put a shorter edge level it could not place better: the edge test moves it.
    """
    n, m = len(y), s.min_size
    out = list(cps)
    pinned = bool(out) and out[-1] >= n - m
    tail = _edge_change(y, out[:-1] if pinned else out, s, log_scale)
    if tail is not None:
        if pinned and abs(tail - out[-1]) < m:
            out[-1] = tail
        elif not out or tail - out[-1] >= s.min_history:
            out.append(tail)
    pinned = bool(out) and out[0] <= m
    mirrored = sorted(n - c for c in (out[1:] if pinned else out))
    head = _edge_change(y[::-1].copy(), mirrored, s, log_scale)
    if head is not None:
        if pinned and abs((n - head) - out[0]) < m:
            out[0] = n - head
        elif not out or (n - head) <= out[0] - s.min_history:
            out.insert(0, n - head)
    return sorted(set(out))


def _normal_confidence(z: float) -> float:
    return float(0.5 * (1 + math.erf(z / math.sqrt(2))))


@dataclass(frozen=True)
class _Shift:
    """The newest level, measured over the last ``runs`` runs against the level before."""

    runs: int
    level: float
    baseline: float
    z: float
    history_used: int
    fit: float  # |z| of the tail's plain mean: how well this start explains the data
    unit_se: float = 0.0  # the standard error of one run against this baseline
    slope: float = 0.0  # the history's drift per run the baseline follows (0: none)


def _tail_shifts(h: np.ndarray, repeats: np.ndarray, s: DetectorSettings,
                 cps: Sequence[int], accepted: int = 0, log_scale: bool = False,
                 young: int | None = None) -> list[_Shift]:
    """Every candidate "the newest level began k runs ago", k = 1 .. 2 * recent_runs.

    The baseline of each candidate is the part of the history's current segment before the
    tail, extrapolated along the history's drift when it has a significant one; the tail is
    the last ``k - 1`` historical runs plus the repeats of the newest run. The current
    segment starts at the last change point ``cps`` of ``h`` older than the candidate starts
    (``2 x recent_runs`` runs), or at ``accepted``: a level that began inside the alert
    window is still news, so it is compared with the level before it until the window has
    passed (or a person accepted it). ``young`` overrides that horizon (the edge test of
    `change_points` trusts every change point the segmentation found: 0).
    """
    # Change points among the last 2 x recent_runs runs are candidate starts of the tail
    # (the loop below places them); the segmentation may misplace a young one by a few runs.
    young = 2 * s.recent_runs if young is None else young
    settled_cps = [c for c in cps if c <= len(h) - young]
    start = max(settled_cps[-1] if settled_cps else 0, min(max(accepted, 0), len(h)))
    current = h[start:]
    measured = current if len(current) >= 10 else h
    sigma = noise_scale(measured)
    sigma = max(sigma, 1e-4) if log_scale else _sigma_floor(h, sigma)
    # A noise scale read from few runs is itself uncertain: widen it so that ``verdict_z``
    # keeps its meaning, as Student's t widens the normal quantile (first order of the
    # Cornish-Fisher expansion, with the runs' differences as degrees of freedom). Without
    # it, histories of 3-15 runs spent most of the false-alarm budget.
    dof = 4 * max(len(measured) - 2, 1)
    # a lone run is judged at suspect_z: its quantile widened for its own threshold
    lone = sigma * (1 + (s.suspect_z ** 2 + 1) / dof) if math.isfinite(s.suspect_z) else sigma
    sigma *= 1 + (s.verdict_z ** 2 + 1) / dof
    # Extrapolate along the history's drift only when it is clear, and measure it before the
    # runs under test: at the end of a series a fresh step (or an outlier) and a drift look
    # alike, and a doubtful slope costs more than it saves.
    settled = len(h) - 2 * s.recent_runs
    slope = sxx = 0.0
    if settled >= 2 * s.min_size:
        before = _shield(h[:settled], sigma, s.outlier_z)
        slope, sxx = _drift_slope(before, [0, *[c for c in cps if 0 < c < settled], settled])
    if not _is_drift(slope, sxx, sigma, s.verdict_drift_z):
        slope = sxx = 0.0
    out = []
    for k in range(1, 2 * s.recent_runs + 1):
        end = len(h) - (k - 1)
        base = h[max(start, end - s.baseline_window):end]
        if len(base) < s.min_history or end <= start:
            break
        tail = np.concatenate([h[end:], repeats])
        # positions: history run i sits at i, the newest run at len(h)
        base_centre = end - (len(base) + 1) / 2
        tail_centre = (end + len(h)) / 2 if k > 1 else float(len(h))
        distance = tail_centre - base_centre
        baseline = _trimmed_mean(base) + slope * distance
        var = sigma ** 2 * (1.1 / len(base) + _tail_efficiency(len(tail)) / len(tail))
        if sxx > 0:
            var += (distance * sigma) ** 2 / sxx
        level = _conservative_level(tail, baseline)
        scale = math.sqrt(var)  # > 0: sigma is floored and base has min_history points
        unit = lone ** 2 * (1.1 / len(base) + 1.0) + (
            (distance * lone) ** 2 / sxx if sxx > 0 else 0.0)
        out.append(_Shift(runs=k, level=level, baseline=baseline, z=(level - baseline) / scale,
                          history_used=len(base),
                          fit=abs(float(np.mean(tail)) - baseline) / scale,
                          unit_se=math.sqrt(unit), slope=slope))
    return out


def _conservative_level(tail: np.ndarray, baseline: float) -> float:
    """Robust level of a short tail, the cautious side of it: one outlier cannot move it.

    Up to 4 points: the middle value (of the two middle ones, the closer to ``baseline``;
    so of 2 points, both must have moved). Longer tails: the 20%-trimmed mean.
    """
    n = len(tail)
    if n > 4:
        return _trimmed_mean(tail)
    ordered = np.sort(tail)
    if n % 2:
        return float(ordered[n // 2])
    lo, hi = float(ordered[n // 2 - 1]), float(ordered[n // 2])
    return lo if abs(lo - baseline) <= abs(hi - baseline) else hi


def _tail_efficiency(n: int) -> float:
    """Variance factor of `_conservative_level` against a plain mean (Gaussian noise)."""
    return {1: 1.0, 2: 1.0, 3: 1.35, 4: 1.2}.get(n, 1.1)


def _below(z: float) -> str:
    """``z`` for a text saying it is under a threshold: rounded down, never up to it."""
    return f"{math.floor(z * 100) / 100:.2f}" if math.isfinite(z) else f"{z}"


def _above(z: float) -> str:
    """``z`` for a text saying it passed a threshold: rounded down to one decimal is safe."""
    return f"{math.floor(z * 10) / 10:.1f}" if math.isfinite(z) else f"{z}"


def _relative(delta: float, baseline: float) -> float:
    if baseline != 0:
        return _bounded(delta / abs(baseline))
    return 0.0 if delta == 0 else math.copysign(1.0, delta)


def _bounded(change: float) -> float:
    """A relative change within ±``MAX_CHANGE`` (finite)."""
    return math.copysign(min(abs(change), MAX_CHANGE), change) if change == change else 0.0


def _expm1(log_change: float) -> float:
    """``expm1`` of a change in logs, bounded (`_bounded`): never an overflow."""
    return _bounded(math.expm1(min(max(log_change, -700.0), 700.0)))


def verdict(history: Sequence[float], latest: float | Sequence[float],
            direction: Direction, *, settings: DetectorSettings = DEFAULTS,
            accepted: int | None = None) -> Verdict:
    """Judge the newest run against the history of the same configuration.

    Args:
        history: Earlier values of this KPI for matching runs, ordered by time.
        latest: The newest run's value, or several repeats of it.
        direction: ``higher_better`` or ``lower_better``.
        settings: Detector tuning.
        accepted: Index into ``history`` of the first run of a level a person accepted as
            the new baseline: the verdict compares with that level only, and a shift that
            began at or before it is not news.

    Returns:
        The `Verdict`: kind, relative magnitude, confidence, baseline and an explanation.

    Example:
        >>> verdict([100, 101, 99, 100, 100, 101], [90, 91], "higher_better").kind
        'regression'
    """
    if direction not in ("higher_better", "lower_better"):
        raise ValueError(f"direction must be higher_better or lower_better, not {direction!r}")
    if accepted is None and len(history) < settings.min_history:
        # decided without numpy: a first run judges each KPI this way (8 000 verdicts for a
        # tree of 1 000 new configurations, a tenth of a second in small-array calls)
        return _too_short(latest, sum(map(math.isfinite, history)), False, settings)
    repeats = np.atleast_1d(np.asarray(latest, dtype=float))
    repeats = repeats[np.isfinite(repeats)]
    h, index = _finite(history)
    first = int(np.searchsorted(index, accepted)) if accepted is not None else 0
    if len(repeats) == 0 or len(h) - first < settings.min_history:
        return _too_short(repeats, len(h) - first, bool(first), settings)
    value = float(repeats[0]) if len(repeats) == 1 else float(np.median(repeats))
    # (the spread is judged with the newest run, in `_shape_verdict`)
    shapes = _shapes(h, direction, settings, spreads=False)
    levels, season = (shapes[1], shapes[3]) if shapes is not None else ([], None)
    # Positive series are judged in log space, like `change_points` analyses them: noise
    # proportional to the level has one scale, and mirror KPIs (a runtime and its
    # throughput) are exact negatives of each other there, so they get the same verdict.
    shapes_in_logs = settings.log_scale and bool(np.all(h > 0))
    log_scale = shapes_in_logs and bool(np.all(repeats > 0))
    if log_scale:
        h, repeats = np.log(h), np.log(repeats)
    if season is not None and log_scale == shapes_in_logs:
        # judged against the wave: the history and the newest run less their phase of it
        h = deseasonalised(h, season)
        repeats = repeats - season.at(len(h))
    else:
        season = None
    shifts = _tail_shifts(h, repeats, settings, levels, first, log_scale)
    judged = _judge(shifts, repeats, value, direction, settings, log_scale)
    if judged.kind != "no_change":
        return judged
    return _shape_verdict(judged, h, repeats, levels, season, shifts[0], settings, log_scale)


def _shape_verdict(judged: Verdict, h: np.ndarray, repeats: np.ndarray,
                   levels: Sequence[int], season: Seasonality | None, newest: _Shift,
                   s: DetectorSettings, log_scale: bool) -> Verdict:
    """A level verdict of no change, told apart.

    ``noisier`` (the spread grew), ``periodic`` (a wave), ``drift`` (a slope), else
    ``no_change`` as it is.
    """
    y = np.concatenate([h, repeats[:1]])
    spreads = _spread_changes(y, levels, replace(s, spread_z=s.noisier_z), noise_scale(y))
    if spreads and spreads[-1] >= len(y) - s.spread_recent:
        c = spreads[-1]
        size = np.abs(np.diff(y))
        before = float(np.median(size[max(0, c - SPREAD_WINDOW):c])) / HALF_NORMAL_MEDIAN
        after = float(np.median(size[c:])) / HALF_NORMAL_MEDIAN
        if before > 0 and after / before >= s.spread_ratio:
            n1, n2 = min(c, SPREAD_WINDOW), len(size) - c
            z = math.log(after / before) / math.sqrt(LOG_SIZE_VARIANCE * (1 / n1 + 1 / n2))
            unit = "of the level" if log_scale else ""
            return judged.model_copy(update={
                "kind": "noisier", "spread_before": before, "spread_after": after,
                "confidence": round(_normal_confidence(z - 2.0), 4),
                "explanation": (f"{judged.explanation}; noisier: the run-to-run spread "
                                f"grew {after / before:.1f}x ({_spread_text(before, log_scale)}"
                                f" -> {_spread_text(after, log_scale)} {unit}".rstrip()
                                + f") {len(y) - c} run(s) ago, at a steady level")})
    if season is not None:
        amplitude = _expm1(season.amplitude) * 100 if log_scale else (
            _relative(season.amplitude, abs(newest.baseline)) * 100)
        return judged.model_copy(update={
            "kind": "periodic", "period": season.period,
            "explanation": (f"{judged.explanation}; periodic: a wave of {season.period} runs "
                            f"(±{amplitude:.2g}%), judged against it")})
    if newest.slope:
        per_run = _expm1(newest.slope) * 100 if log_scale else (
            _relative(newest.slope, abs(newest.baseline)) * 100)
        return judged.model_copy(update={
            "kind": "drift", "slope_pct": round(per_run, 4),
            "explanation": (f"{judged.explanation}; drift: {per_run:+.2g}% per run, judged "
                            "against the drift line")})
    return judged


HALF_NORMAL_MEDIAN = 0.6745 * math.sqrt(2)
"""Median of ``|a - b|`` for two runs of unit normal noise: difference sizes to a spread."""
LOG_SIZE_VARIANCE = math.pi ** 2 / 8
"""Variance of ``log |x|`` for normal ``x``: how precisely a spread ratio is known."""


def _spread_text(spread: float, log_scale: bool) -> str:
    return f"{_expm1(spread) * 100:.2g}%" if log_scale else f"{spread:.3g}"


def _too_short(latest: float | Sequence[float] | np.ndarray, used: int, since_accepted: bool,
               s: DetectorSettings) -> Verdict:
    """The verdict of a run without enough history (or without a finite value)."""
    given = [latest] if isinstance(latest, (int, float)) else list(latest)
    values = [float(x) for x in given if math.isfinite(x)]
    if not values:
        return Verdict(kind="insufficient_history", magnitude=0.0, confidence=0.0,
                       baseline=None, explanation="the newest run has no finite value")
    return Verdict(kind="insufficient_history", magnitude=0.0, confidence=0.0,
                   baseline=None, history_used=used,
                   latest=values[0] if len(values) == 1 else float(np.median(values)),
                   explanation=f"{used} historical point(s)"
                               f"{' since the accepted baseline' if since_accepted else ''}; "
                               f"{s.min_history} needed")


def _judge(shifts: list[_Shift], repeats: np.ndarray, value: float, direction: Direction,
           s: DetectorSettings, log_scale: bool) -> Verdict:
    """The verdict from the candidate starts of the newest level (see `verdict`).

    ``repeats`` and the shifts are in analysis units (logs with ``log_scale``); ``value``,
    the verdict's numbers and its explanation are in the KPI's own units.
    """

    def shown(x: float) -> float:
        return math.exp(x) if log_scale else x

    def change(level: float, baseline: float) -> float:
        return _expm1(level - baseline) if log_scale else _relative(level - baseline,
                                                                    baseline)

    newest = shifts[0]  # the newest run alone against the current level
    # A shift needs two measurements: several repeats, or the newest run plus earlier ones.
    testable = [x for x in shifts if x.runs - 1 + len(repeats) >= 2]
    shift = max(testable, key=lambda x: x.fit) if testable else newest
    magnitude = change(shift.level, shift.baseline)
    same_side = np.sign(newest.z) == np.sign(shift.z) and (
        abs(newest.z) >= s.verdict_z * s.confirm_factor)
    big = abs(magnitude) >= s.min_magnitude
    significant = bool(testable) and abs(shift.z) >= s.verdict_z and big and same_side
    fresh = shift.runs <= s.recent_runs
    worse = (shift.z < 0) == (direction == "higher_better")
    z = abs(shift.z)
    if significant and fresh:
        kind: VerdictKind = "regression" if worse else "improvement"
        threshold = s.verdict_z
        confidence = min(1.0, _normal_confidence(z - threshold + 2.0))
        if shift.runs == 1:
            span = "in the newest run" + (f" ({len(repeats)} repeats)" if len(repeats) > 1
                                          else "")
        else:
            span = (f"over the last {shift.runs} runs (began {shift.runs - 1} run(s) before the "
                    f"newest)")
        explanation = (f"{magnitude * 100:+.1f}%: level {shown(shift.level):.4g} {span} vs "
                       f"baseline {shown(shift.baseline):.4g} ({_above(z)} noise SE; "
                       f"{threshold:g} needed; {shift.history_used} runs before)")
        return Verdict(kind=kind, magnitude=float(magnitude), confidence=round(confidence, 4),
                       baseline=shown(shift.baseline), latest=value,
                       history_used=shift.history_used, explanation=explanation,
                       start_runs=shift.runs)
    confidence = 1.0 - min(1.0, _normal_confidence(z - s.verdict_z + 2.0)) * 0.5
    # The explanation shows the newest run's own numbers, so its reason is about them too
    # (an earlier "-36.8%: below the 2% threshold" read as a contradiction).
    magnitude = change(math.log(value) if log_scale else value, newest.baseline)
    first = float(repeats[0])
    # the current level: the older shift's when the level changed before the alert window
    reference = shift.level if significant else newest.baseline
    first_z = (first - reference) / newest.unit_se if newest.unit_se > 0 else 0.0
    first_mag = change(first, reference)
    if abs(first_z) >= s.suspect_z and abs(first_mag) >= s.min_magnitude:
        side = "worse" if (first_z < 0) == (direction == "higher_better") else "better"
        if len(repeats) == 1:
            # One run out of line, as likely the first of a new level as an outlier: a
            # re-run (or the next run) decides.
            return Verdict(
                kind="suspect", magnitude=float(first_mag),
                confidence=round(min(1.0, _normal_confidence(abs(first_z) - s.suspect_z
                                                             + 2.0)), 4),
                baseline=shown(reference), latest=value,
                history_used=newest.history_used, suspect=True, start_runs=1,
                explanation=(f"{first_mag * 100:+.1f}%: suspect ({side}): {value:.4g} vs "
                             f"baseline {shown(reference):.4g} "
                             f"({_above(abs(first_z))} SE for one run; {s.suspect_z:g} "
                             "needed); a re-run of this configuration confirms it "
                             "(analysis.confirm_reruns) or the next run will"))
        listed = ", ".join(f"{shown(x):.4g}" for x in repeats[1:6])
        return Verdict(
            kind="outlier", magnitude=float(first_mag),
            confidence=round(confidence, 4), baseline=shown(reference),
            latest=value, history_used=newest.history_used,
            explanation=(f"{first_mag * 100:+.1f}%: outlier ({side}): the run alone; its "
                         f"{len(repeats) - 1} re-run(s) ({listed}) are not: no change "
                         f"({_below(abs(newest.z))} SE for the repeats together; "
                         f"{s.verdict_z:g} needed)"))
    if significant:
        reason = (f"the level changed {shift.runs - 1} runs ago, before the "
                  f"{s.recent_runs}-run alert window: that is the current level")
    elif testable and abs(shift.z) >= s.verdict_z and big:
        earlier = change(shift.level, shift.baseline)
        reason = f"the earlier runs' shift ({earlier * 100:+.1f}%) is not shared by the newest run"
    elif abs(magnitude) < s.min_magnitude:
        reason = f"smaller than the {s.min_magnitude * 100:g}% minimum change"
    elif len(repeats) > 1:
        listed = ", ".join(f"{shown(x):.4g}" for x in repeats[:5])
        reason = (f"the {len(repeats)} repeats ({listed}) do not agree on a shift "
                  f"({_below(abs(newest.z))} SE for the cautious level; {s.verdict_z:g} "
                  "needed)")
    else:
        reason = f"within the noise ({_below(abs(newest.z))} SE; {s.verdict_z:g} needed)"
    explanation = (f"{magnitude * 100:+.1f}%: {value:.4g} vs baseline "
                   f"{shown(newest.baseline):.4g}: "
                   f"{reason}")
    return Verdict(kind="no_change", magnitude=float(magnitude),
                   confidence=round(confidence, 4), baseline=shown(newest.baseline),
                   latest=value,
                   history_used=newest.history_used, explanation=explanation)


# -- noise budget and suspects ---------------------------------------------------------------

POWER_Z = 0.8416
"""Normal quantile of the detection power the minimum detectable effect is quoted at (80 %)."""


def _analysis_units(history: Sequence[float], settings: DetectorSettings
                    ) -> tuple[np.ndarray, bool] | None:
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


def pooled_noise(y: np.ndarray, cps: Sequence[int]) -> float:
    """The noise within every level of ``y``.

    `noise_scale`'s estimate from the first differences that do not straddle a change (a
    step is no noise).
    """
    bounds = [0, *cps, len(y)]
    d = np.concatenate([np.diff(y[a:b]) for a, b in itertools.pairwise(bounds)])
    if len(d) < 2:
        return noise_scale(y)
    mad = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    return max(mad, _winsorised_std(d)) / math.sqrt(2)


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
    repeats = np.atleast_1d(np.asarray(latest, dtype=float))
    repeats = repeats[np.isfinite(repeats)]
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
