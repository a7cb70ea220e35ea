"""Where a series changes level: segmentation, refinement, validation (the step detector).

A binary segmentation over cumulative sums proposes change points; each is refined, and kept
only when its step is significant against the series' noise and not better explained by a
drift. `_levels` gives a series' level changes (steps, and the edges of the newest runs:
`analysis.edges`), `_steps` the steps alone. See `analysis.regression` for the whole method.

One module (~570 lines): the alternatives weighed against the steps (a drift, a smooth
curve, a noise that is not white: `analysis.trend` and `analysis.correlated` hold the
models themselves) are scored with the segmentation's own candidates, validation and cost;
split, each half would import the other.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from analysis.correlated import (
    MAX_AR,
    WALK_MIN_RUNS,
    Correlated,
    around_levels,
    level_noise,
    local_level,
)
from analysis.detector import (
    DetectorSettings,
    _drift_slope,
    _expm1,
    _is_drift,
    _shield,
    _shielded_noise,
    _sigma_floor,
    _trimmed_mean,
    _winsorised_std,
    mean_of,
    median_of,
)
from analysis.edges import edge_changes
from analysis.seasonality import Seasonality, deseasonalised
from analysis.trend import needed_steps, smooth_trend, step_columns


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
    first, last = a + min_size, b - min_size + 1
    count = last - first
    t = np.arange(first, last)
    left = cs[first:last] - cs[a]  # cs[t], as a slice: t is a range
    right = cs[b] - cs[a] - left
    gain = left ** 2 / (t - a) + right ** 2 / (b - t)
    if radius > 0 and sigma > 0 and count > 1:
        weight = np.exp((gain - gain.max()) / (2 * sigma ** 2))
        mass = np.empty(count + 1)
        mass[0] = 0.0
        np.cumsum(weight, out=mass[1:])
        i = np.arange(count)
        window = mass[np.minimum(i + radius + 1, count)] - mass[np.maximum(i - radius, 0)]
        gain = window + 1e-6 * weight  # on a plateau of equal mass, the likeliest place wins
    return first + int(gain.argmax())


_ROWS = 128
"""Rows of the gain table computed at once in `_segment` (bounded memory: 128 x (n + 1))."""


def _segment(y: np.ndarray, sigma: float, s: DetectorSettings) -> list[int]:
    """Optimal partition of ``y`` by least squares plus ``(candidate_z * sigma)^2`` per change.

    Optimal partitioning (Jackson et al., 2005), exact for this cost. Unlike binary
    segmentation it places nearby changes jointly, so a misplaced first split cannot leave a
    spurious neighbour behind. Each run's best last segment is one vectorised pass over
    every earlier start: ``O(n^2)`` arithmetic but ``n`` Python steps. PELT's pruning
    (Killick et al., 2012) gives the same partition with less arithmetic, but its
    bookkeeping costs more than it saves at the lengths segmented here (at most a few
    hundred: `_candidates`).

    The gain of every last segment (``(cs[t] - cs[start])^2 / (t - start)``) is computed a
    block of rows at a time, with ``1 / (t - start)`` read from a strided view of one table,
    so each step of the loop is one subtraction and one argmin: the loop is numpy's call
    overhead, and this halves it (1.55 -> 0.93 ms at 250 runs, the same partitions and the
    same floating-point costs; benchmarks/regression/speed.py).
    """
    n, m = len(y), s.min_size
    if n < 2 * m:
        return []
    penalty = (s.candidate_z * sigma) ** 2
    cs = np.concatenate([[0.0], np.cumsum(y)])
    table = np.zeros(2 * n + 1)
    table[n + 1:] = 1.0 / np.arange(1, n + 1, dtype=float)
    # reciprocal[t, start] = 1 / (t - start) (0 when start >= t): a view, nothing copied
    reciprocal = sliding_window_view(table[::-1], n + 1)[::-1]
    best = np.full(n + 1, np.inf)  # best[t]: cost of y[:t] (sum of squares omitted)
    best[0] = -penalty  # starts 1 .. m-1 stay infinite: no segment shorter than m
    last = np.zeros(n + 1, dtype=int)
    costs = np.empty(n + 1)
    for first in range(m, n + 1, _ROWS):
        rows = slice(first, min(first + _ROWS, n + 1))
        gain = cs[rows, None] - cs[None, :]
        np.multiply(gain, gain, out=gain)
        np.multiply(gain, reciprocal[rows], out=gain)
        for t, row in zip(range(rows.start, rows.stop), gain, strict=True):
            usable = t - m + 1  # the last segment starts at 0 or at m .. t - m
            cost = np.subtract(best[:usable], row[:usable], out=costs[:usable])
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


_Means = dict[tuple[int, int], float]
"""Trimmed means of ``y[lo:hi]`` by ``(lo, hi)``, kept while one series is validated."""


def _step_stats(y: np.ndarray, i: int, bounds: Sequence[int], sigma: float,
                s: DetectorSettings, drift: tuple[float, float],
                noise: Correlated = Correlated(), means: _Means | None = None
                ) -> tuple[float, float, float]:
    """Drift-corrected step at change ``bounds[i + 1]``: (step, z, level_before).

    The step is measured between trimmed means of up to ``window`` points on each side,
    within the neighbouring segments; ``drift`` is the series' common slope (see
    `_drift_slope`). A step that passes against the series' noise is measured again
    against its surroundings' when they are noisier (`_local_sigma`); one that fails
    already is not (a larger noise would only weaken it: it saves ~3 ms a 1 000-run series).
    ``noise``: how far from white the noise is (`analysis.correlated`).
    ``means``: the windows' trimmed means already computed on ``y`` (`_validate`).
    """
    found = _measured_step(y, i, bounds, sigma, s, drift, noise, means)
    if found[1] < s.z_threshold:
        return found
    a, t, b = bounds[i], bounds[i + 1], bounds[i + 2]
    local = _local_sigma(y[max(a, t - s.window):t], y[t:min(b, t + s.window)], sigma)
    return found if local == sigma else _measured_step(y, i, bounds, local, s, drift, noise,
                                                       means)


def _measured_step(y: np.ndarray, i: int, bounds: Sequence[int], sigma: float,
                   s: DetectorSettings, drift: tuple[float, float],
                   noise: Correlated = Correlated(), means: _Means | None = None
                   ) -> tuple[float, float, float]:
    """`_step_stats` against the noise scale ``sigma`` (and its correlation, ``noise``)."""
    a, t, b = bounds[i], bounds[i + 1], bounds[i + 2]
    window = noise.window(sigma ** 2, s.window)
    lo = max(a, t - window)
    hi = min(b, t + window)
    nl, nr = t - lo, hi - t
    level_l, level_r = _window_mean(y, lo, t, means), _window_mean(y, t, hi, means)
    slope, sxx = drift
    centre_l, centre_r = (lo + t - 1) / 2, (t + hi - 1) / 2
    distance = centre_r - centre_l
    var = noise.variance(sigma ** 2, nl, nr)
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


def _window_mean(y: np.ndarray, lo: int, hi: int, means: _Means | None) -> float:
    """The trimmed mean of ``y[lo:hi]``, from ``means`` when it was computed already.

    Validation measures every step again each time it drops one, and most windows did not
    move: a long series cut into 60 candidates sorted the same windows thousands of times.
    """
    if means is None:
        return _trimmed_mean(y[lo:hi])
    found = means.get((lo, hi))
    if found is None:
        found = means[(lo, hi)] = _trimmed_mean(y[lo:hi])
    return found


LOCAL_NOISE_RUNS = 20
"""Differences around a step needed to measure its own noise (`_local_sigma`)."""
LOCAL_NOISE_RATIO = 1.5
"""How much noisier than the series a step's surroundings must be for their noise to count."""


def _local_sigma(left: np.ndarray, right: np.ndarray, sigma: float) -> float:
    """The noise a step is judged against: the series', or its surroundings' when larger.

    Levels are found against one noise scale for the whole series, so where the noise is
    several times larger (a noisy neighbour for a while, a spread change) its own
    fluctuations passed as steps (a false level in 45 of 200 series whose noise grew or
    fell x2-x4; 14 judged this way). The surroundings' scale (the differences
    within the two segments, not the one across the step) counts when it is
    `LOCAL_NOISE_RATIO` times the series' or more, beyond what 20 differences' own
    sampling spread (about ±25 %) reaches in a series of one noise.
    """
    if len(left) + len(right) < LOCAL_NOISE_RUNS + 2:
        return sigma
    sizes = np.abs(np.concatenate([np.diff(left), np.diff(right)]))
    local = median_of(sizes) / (0.6745 * math.sqrt(2))
    return local if local > LOCAL_NOISE_RATIO * sigma else sigma


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
              log_scale: bool, noise: Correlated = Correlated()) -> list[int]:
    """Drop candidates whose step is too weak or too small, weakest first, until all pass.

    With ``log_scale`` the series is ``log(values)``, so a step's relative size is
    ``expm1(step)``; ``noise``: see `_step_stats`.
    """
    cps = list(cps)
    means: _Means = {}
    while cps:
        bounds = [0, *cps, len(y)]
        drift = _drift_slope(y, bounds)
        scores = []
        for i in range(len(cps)):
            step, z, before = _step_stats(y, i, bounds, sigma, s, drift, noise, means)
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


def _residual_noise(y: np.ndarray, cps: Sequence[int], sigma: float, s: DetectorSettings,
                    trend: np.ndarray | None = None, trend_parameters: int = 0) -> float:
    """Noise scale from the residuals around the segments' levels (and a drift line).

    Or around the levels and the smooth ``trend`` they were found beside
    (`_curved_alternative`, ``trend_parameters`` beyond a level). About twice as efficient
    as the difference-based scale: in a 40-run series that one is off by up to 30 % (90 %
    range), enough to decide a weak step either way. A missed step inflates it (cautious),
    the degrees of freedom of the levels are corrected for.
    """
    bounds = [0, *cps, len(y)]
    if trend is not None:
        r = y - trend
    else:
        slope, sxx = _drift_slope(y, bounds)
        r = y - (slope if _is_drift(slope, sxx, sigma, s.drift_z) else 0.0) * np.arange(len(y))
    res = np.concatenate([r[a:b] - median_of(r[a:b]) for a, b in itertools.pairwise(bounds)])
    dof = len(y) / max(len(y) - len(bounds) + 1 - trend_parameters, 1)
    return _winsorised_std(res) * math.sqrt(dof)  # winsorised like `noise_scale`


@dataclass(frozen=True)
class _Found:
    """Level changes, and the smooth trend they were found beside.

    ``trend`` None: levels and at most one shared drift (`_detect`); else the curve of
    `_curved_alternative`, with ``trend_parameters`` beyond a level. ``stairs``: the levels
    that a correlated noise replaced (`_correlated_alternative`), None when it did not.
    """

    cps: list[int]
    trend: np.ndarray | None = None
    trend_parameters: int = 0
    stairs: list[int] | None = None


def _detect(y: np.ndarray, sigma: float, s: DetectorSettings, log_scale: bool) -> _Found:
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
        # model wins, a drift costing what a step costs, each at `drift_choice_weight` of
        # the segmentation's penalty (every step of ``kept`` passed validation already).
        slope, sxx = _drift_slope(y, [0, len(y)])
        if _is_drift(slope, sxx, sigma, s.drift_z):
            flat = y - slope * np.arange(len(y))
            other = _validate(y, _refine(y, _candidates(flat, sigma, s), sigma, s), sigma, s,
                              log_scale)
            weight = s.drift_choice_weight
            if len(other) < len(kept) and _model_cost(y, other, sigma, s, True, weight) < \
                    _model_cost(y, kept, sigma, s, False, weight):
                kept = other
    if kept:
        curved = _curved_alternative(y, kept, sigma, s, log_scale)
        if curved is not None and curved.trend is not None and curved.cps:
            # a meander about a curve: the same weighing on the series less the curve
            jumps = _correlated_alternative(y - curved.trend, curved.cps, sigma, s, log_scale)
            return replace(curved, cps=jumps,
                           stairs=curved.cps if jumps != curved.cps else None)
        if curved is not None:
            return curved
        jumps = _correlated_alternative(y, kept, sigma, s, log_scale)
        if jumps != kept:
            return _Found(jumps, stairs=kept)
    return _Found(_refine(y, kept, sigma, s))


WALK_PARAMETERS = 2
"""What the local-level model costs, in steps. Its ratio is one parameter; the second is the
choice of a walk over the steps, drift, curve and wave the segmentation weighs already: a
staircase of three 1-2 SD steps read as a walk by a margin of 0-11 (a step costs 20), while
walks of 0.3-1 noise SDs a run won by 16-350 (long probe, 2026-11-28)."""
WHITE_Z = 1.0
"""Residuals around the levels whose lag-1 correlation is under this many standard errors
(~1/sqrt(n) each) are white: the levels stand, and no other noise is fitted (a walk's fit
costs ~1.5 ms at 1 000 runs; measured: walks this lets through raise their false change
points 0.78 -> 0.88 a series at 0.3 SD a run)."""


def _correlated_alternative(y: np.ndarray, kept: list[int], sigma: float,
                            s: DetectorSettings, log_scale: bool) -> list[int]:
    """``kept``, or fewer of them when the noise around the levels is not white.

    Three models, each with its penalised ``-2 log likelihood`` (the noise profiled out, a
    parameter costing what a step costs): the levels of ``kept`` with white noise; levels
    with autocorrelated noise (`analysis.correlated.Correlated.ar`: the steps validated
    again against means that vary more; its correlation one parameter); a wandering level
    with the steps that stand out of it as jumps (`analysis.correlated.local_level`,
    `WALK_PARAMETERS`). Each keeps the drift the levels share. The cheapest wins.

    Its steps are placed (the levels' ``_refine`` once the others are known, for
    autocorrelated noise; a walk's jumps stay where the levels put them: a least-squares
    split of a walk lands in the middle of a meander, 20-35 runs from the jump).
    """
    n = len(y)
    if n < WALK_MIN_RUNS:
        return kept  # its correlation too uncertain to discount steps by
    noise = level_noise(y, kept, sigma, s.drift_z)
    if noise.correlation * math.sqrt(n) < WHITE_Z:
        return kept  # white, or no noise at all
    flat, drift, power, correlation = noise.flat, noise.drift, noise.power, noise.correlation
    penalty = s.candidate_z ** 2
    best = (n - 1) * math.log(max(power, 1e-300) / n) + penalty * (len(kept) + drift)
    chosen = kept
    ar = min(correlation, MAX_AR)
    steps = _validate(y, kept, sigma, s, log_scale, Correlated(ar=ar))
    if len(steps) < len(kept):
        left = around_levels(flat, steps)
        innovations = left[1:] - ar * left[:-1]
        cost = (n - 1) * math.log(max(float(innovations @ innovations), 1e-300) / (n - 1)) + (
            penalty * (len(steps) + 1 + drift))
        if cost < best:
            best, chosen = cost, _refine(y, steps, sigma, s)
    walk = local_level(flat)
    if walk is None:
        return chosen
    jumps = _validate(y, kept, sigma, s, log_scale, Correlated(walk=walk.walk))
    if len(jumps) >= len(chosen):
        return chosen
    if jumps:  # the walk fitted again without its jumps, each its measured size
        bounds = [0, *jumps, n]
        moved = _drift_slope(y, bounds)
        sizes = [_step_stats(y, i, bounds, sigma, s, moved, Correlated(walk=walk.walk))[0]
                 for i in range(len(jumps))]
        walk = local_level(flat - step_columns(n, jumps) @ np.asarray(sizes)) or walk
    cost = walk.cost + penalty * (WALK_PARAMETERS + drift + len(jumps))
    return jumps if cost < best else chosen


def _curved_alternative(y: np.ndarray, kept: list[int], sigma: float, s: DetectorSettings,
                        log_scale: bool) -> _Found | None:
    """Fewer steps than ``kept`` found on ``y`` less a smooth trend, when that costs less.

    Levels with one shared slope read a bend or a smooth trend (a saturating, logistic or
    exponential curve) as a staircase. A curve (`analysis.trend.smooth_trend`) and fewer
    steps win when their penalised least-squares cost is lower, each of the curve's
    parameters beyond a level costing what a step costs (`_model_cost`). The curve is fitted
    again beside the steps it needs (`analysis.trend.needed_steps`), and the steps are
    placed on the series less the curve. None: the levels of ``kept`` stay.
    """
    curve, basis, extra = smooth_trend(y, sigma, s.candidate_z ** 2, s.min_size, log_scale)

    def steps_beside(trend: np.ndarray) -> tuple[list[int], float, np.ndarray]:
        bent = y - trend
        found = _validate(bent, _refine(bent, _candidates(bent, sigma, s), sigma, s), sigma,
                          s, log_scale)
        return found, _model_cost(bent, found, sigma, s, False) + extra * s.candidate_z ** 2, \
            bent

    def joint(cps: Sequence[int]) -> np.ndarray:
        # the curve fitted with steps beside it: a curve fitted alone bends towards a real
        # step and hides part of it
        assert basis is not None
        coef = np.linalg.lstsq(np.hstack([basis, step_columns(len(y), cps)]), y,
                               rcond=None)[0]
        return basis @ coef[:basis.shape[1]]

    other, curved, bent = steps_beside(curve)
    if basis is not None:
        starts = [other] if other and len(other) < len(kept) else []
        chosen = needed_steps(y, basis, kept, sigma, s.candidate_z ** 2)
        # (when the curve needs every step of kept beside it, no model with fewer is left)
        if chosen and chosen != other and len(chosen) < len(kept):
            starts.append(chosen)
        for start in starts:
            found, cost, flat = steps_beside(joint(start))
            if cost < curved:
                other, curved, bent = found, cost, flat
    if len(other) >= len(kept):
        return None
    drift = _is_drift(*_drift_slope(y, [0, *kept, len(y)]), sigma, s.drift_z)
    if curved >= _model_cost(y, kept, sigma, s, drift):
        return None
    return _Found(_refine(bent, other, sigma, s), y - bent, extra)


def _model_cost(y: np.ndarray, cps: Sequence[int], sigma: float, s: DetectorSettings,
                drift: bool, weight: float = 1.0) -> float:
    """Penalised least-squares cost of levels at ``cps`` (plus a shared drift when asked).

    Each parameter costs ``weight`` times the segmentation's penalty.
    """
    r = y
    if drift:
        slope, _ = _drift_slope(y, [0, *cps, len(y)])
        r = y - slope * np.arange(len(y))
    return levels_rss(r, cps) / sigma ** 2 + weight * s.candidate_z ** 2 * (len(cps) + drift)


def levels_rss(y: np.ndarray, cps: Sequence[int]) -> float:
    """Residual sum of squares of ``y`` as levels changing at ``cps`` (each its mean)."""
    bounds = [0, *cps, len(y)]
    return sum(float(np.sum((y[a:b] - mean_of(y[a:b])) ** 2))
               for a, b in itertools.pairwise(bounds) if b > a)


def _for_length(s: DetectorSettings, n: int) -> DetectorSettings:
    """Thresholds for a series of ``n`` points (lower below ``short_length``)."""
    if not s.short_length or n >= s.short_length:
        return s
    factor = math.log(n) / math.log(s.short_length)
    return replace(s, candidate_z=s.candidate_z * factor, z_threshold=s.z_threshold * factor,
                   edge_z=s.edge_z * max(factor, s.edge_short_factor))


def _steps(y: np.ndarray, settings: DetectorSettings, log_scale: bool,
           correlated: bool = False) -> list[int]:
    """The steps the segmentation reads in ``y`` as it is (candidates, placed, validated).

    What a wave would be cut into, for `_explains_better` (cheaper than `_levels`).
    ``correlated``: weighed against a noise that is not white too (`_correlated_alternative`),
    for steps that are a series' levels (its wave lost); not for the comparison, where a
    wave's own residuals would pay for a walk's fit (~1.5 ms at 1 000 runs) every time.
    """
    tuned = _for_length(settings, len(y))
    if len(y) < 2 * tuned.min_size:
        return []
    floor: Callable[[float], float] = (lambda x: max(x, 1e-4)) if log_scale else (
        lambda x: _sigma_floor(y, x))
    shielded, sigma = _shielded_noise(y, tuned, floor)
    kept = _validate(shielded, _refine(shielded, _candidates(shielded, sigma, tuned), sigma,
                                       tuned), sigma, tuned, log_scale)
    if correlated and kept:
        other = _correlated_alternative(shielded, kept, sigma, tuned, log_scale)
        if other != kept:
            return other
    # placed again once the others are known, as `_detect` places them: one run off costs
    # the step's whole size squared, which in a noise-free series outweighs any wave
    return _refine(shielded, kept, sigma, tuned)


def _explains_better(y: np.ndarray, steps: list[int], levels: list[int], season: Seasonality,
                     sigma: float, s: DetectorSettings) -> bool:
    """Whether the wave and ``levels`` explain ``y`` better than ``steps`` alone.

    Penalised costs in `_model_cost`'s units; ``steps`` were found on ``y`` as it is.
    """

    def drifts(series: np.ndarray, cps: Sequence[int]) -> bool:
        return _is_drift(*_drift_slope(series, [0, *cps, len(series)]), sigma, s.drift_z)

    flat = deseasonalised(y, season)
    waved = _model_cost(flat, levels, sigma, s, drifts(flat, levels)) + (
        season.parameters * math.log(len(y)))
    return waved < _model_cost(y, steps, sigma, s, drifts(y, steps))


def _levels(y: np.ndarray, settings: DetectorSettings, log_scale: bool
            ) -> tuple[list[int], float, list[int]]:
    """The level changes of ``y`` (analysis units, without its wave), its noise, its stairs.

    The stairs are the levels that a correlated noise replaced (`_Found.stairs`; the level
    changes otherwise): a wave beside a step reads as correlated noise as well as a
    staircase, and the caller looks for the wave again in the stairs (`analysis.regression`).
    """

    def floor(sigma: float) -> float:
        return max(sigma, 1e-4) if log_scale else _sigma_floor(y, sigma)

    full = settings
    settings = _for_length(settings, len(y))
    shielded, sigma = _shielded_noise(y, settings, floor)
    segmentable = len(y) >= 2 * settings.min_size
    found = _detect(shielded, sigma, settings, log_scale) if segmentable else _Found([])
    if segmentable and len(y) < settings.short_length:
        # Short series: measure the noise again around the levels found, and detect again.
        sigma = floor(_residual_noise(shielded, found.cps, sigma, settings, found.trend,
                                      found.trend_parameters))
        shielded = _shield(y, sigma, settings.outlier_z)
        found = _detect(shielded, sigma, settings, log_scale)
    kept = found.cps
    if math.isfinite(full.edge_z):
        kept = edge_changes(y, kept, settings, log_scale)
    return kept, sigma, found.stairs if found.stairs is not None else kept
