"""Noise that is not white: a level that wanders, and autocorrelated noise.

The segmentation's levels assume white noise around them. Two common departures read as
staircases there, and are weighed against the levels (`analysis.segmentation`):

- **autocorrelated noise** (each run leans towards the one before: a thermal state, a cache,
  a shared neighbour over several runs): a mean of ``w`` runs varies
  ``(1 + phi) / (1 - phi)`` times more than white noise's, so a step between two such means
  needs that much more evidence (`Correlated.ar`, the lag-1 correlation ``phi``; measured:
  5 false change points a series at ``phi`` = 0.6, 13 at 0.85);
- **a wandering level** (below).

A verdict judges its newest runs against their baseline the same way
(`noise_correlation`, `analysis.detector.adjacent_means_factor`), with a stricter bar.

Some KPIs do not hold a level between steps: each run moves it a little (a dataset that
grows unevenly, a fleet that ages, a price). Levels with white noise read such a meander as
a staircase (measured: 12 false change points a 60-600-run series whose level moves by one
noise unit a run, 31 at 800 runs). The local-level model reads it whole:
``y_t = level_t + e_t``, ``level_t = level_{t-1} + w_t``, with ``q = var(w) / var(e)``
its one parameter beyond the level and the noise. `local_level` gives its penalised cost in
the segmentation's units (``-2 log likelihood``, the noise profiled out), so
`analysis.segmentation` can weigh it against its levels; when it wins, a step is judged as
a jump of the wandering level: between means of few runs (a longer mean wanders more than
it averages out, `step_window`) with the walk's own variance added (`walk_step_variance`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.detector import DEFAULTS, _drift_slope, _is_drift, _sigma_floor, noise_scale

__all__ = ["MAX_AR", "WALK_MIN_RUNS", "Correlated", "LevelNoise", "LocalLevel", "around_levels",
           "lag_one", "level_noise", "local_level", "noise_correlation", "step_window",
           "walk_step_variance"]

WALK_MIN_RUNS = 100
"""Series shorter than this are judged with white noise: a lag-1 correlation read from
fewer runs is uncertain by 0.1 or more, too much to discount their steps by."""
RATIOS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
"""The ``q`` the model is fitted at (a grid: the likelihood is flat across a factor ~3)."""
MAX_AR = 0.95
"""The largest lag-1 correlation used (beyond it the noise is a walk, not a level's noise)."""
_MAX_GROWTH = 1e100
"""The largest factor a block of the smoothing's powers may reach (`_smoothed`)."""


@dataclass(frozen=True)
class LocalLevel:
    """The best local-level fit.

    ``cost``: ``-2 log L`` up to a constant, the noise profiled out; ``ratio``: ``q``;
    ``noise``: ``var(e)``; `walk`: ``var(w) = q var(e)``.
    """

    cost: float
    ratio: float
    noise: float

    @property
    def walk(self) -> float:
        """The variance a run adds to the level."""
        return self.ratio * self.noise


def _smoothed(y: np.ndarray, gain: float) -> np.ndarray:
    """One-step predictions of exponential smoothing, vectorised by blocks.

    ``a_0 = y_0``, ``a_{t+1} = a_t + gain (y_t - a_t)``.

    Within a block ``a_{s+i} = r^i (a_s + gain sum_{j<i} y_{s+j} r^{-(j+1)})`` with
    ``r = 1 - gain``; blocks are short enough that ``r^-i`` stays below `_MAX_GROWTH`.
    """
    n, r = len(y), 1.0 - gain
    out = np.empty(n)
    block = n if r >= 1.0 else max(1, int(math.log(_MAX_GROWTH) / -math.log(r)))
    a = float(y[0])
    for start in range(0, n, block):
        seg = y[start:start + block]
        size = len(seg)
        inverse = r ** -np.arange(1, size + 1, dtype=float)
        running = np.cumsum(seg * inverse)
        powers = r ** np.arange(size, dtype=float)
        out[start] = a
        out[start + 1:start + size] = powers[1:] * (a + gain * running[:-1])
        a = r ** size * (a + gain * running[-1])
    return out


def local_level(y: np.ndarray) -> LocalLevel | None:
    """The local-level model fitted to ``y`` (None: too short, or no noise to profile).

    The filter's steady state is used from the start (its gain
    ``P / (P + 1)``, ``P = (q + sqrt(q^2 + 4q)) / 2``): the exact filter converges in a
    few runs at the ratios that matter and costs a Python loop a run.
    """
    n = len(y)
    if n < 3:
        return None
    centred = y - float(np.mean(y))
    best: LocalLevel | None = None
    m = n - 1
    for q in RATIOS:
        p = (q + math.sqrt(q * q + 4 * q)) / 2
        f = p + 1.0
        v = centred[1:] - _smoothed(centred, p / f)[1:]
        noise = float(v @ v) / (m * f)
        if not noise > 0:
            return None
        cost = m * math.log(noise) + m * math.log(f)
        if best is None or cost < best.cost:
            best = LocalLevel(cost, q, noise)
    return best


def step_window(noise: float, walk: float, longest: int) -> int:
    """Runs on each side that measure a step best when the level wanders by ``walk``.

    The variance of the difference of two ``w``-run means, ``2 noise / w + walk 2w / 3``,
    is smallest at ``w = sqrt(3 noise / walk)``; at least 2 runs, at most ``longest``.
    """
    if walk <= 0:
        return longest
    return int(min(longest, max(2, round(math.sqrt(3 * noise / walk)))))


def walk_step_variance(walk: float, left: int, right: int) -> float:
    """The walk's share of the variance of ``mean(right runs) - mean(left runs)``.

    Each move of the level between the two means' runs counts by the share of the right
    mean it reaches less that of the left: ``sum (m / left)^2`` over the left runs and
    ``sum (m / right)^2`` over the right's.
    """
    if walk <= 0 or left < 1 or right < 1:
        return 0.0
    return walk * ((left + 1) * (2 * left + 1) / (6 * left)
                   + (right - 1) * (2 * right - 1) / (6 * right))


@dataclass(frozen=True)
class Correlated:
    """How a step is judged in noise that is not white (both 0: white noise).

    ``walk``: the variance a run adds to a wandering level; ``ar``: the noise's lag-1
    correlation. ``noise`` variances are the segmentation's (from first differences, which
    read autocorrelated noise ``1 - ar`` times its variance).
    """

    walk: float = 0.0
    ar: float = 0.0

    def window(self, noise: float, longest: int) -> int:
        """Runs on each side of a step that measure it best (`step_window`)."""
        return step_window(noise, self.walk, longest)

    def variance(self, noise: float, left: int, right: int) -> float:
        """The variance of ``mean(right runs) - mean(left runs)`` without a step.

        White noise: ``noise (1 / left + 1 / right)``, times 1.1 (the trimmed means'
        efficiency); autocorrelated noise: times ``(1 + ar) / (1 - ar)^2`` (the long-run
        variance of a mean, on a noise read from differences); plus the walk's share.
        """
        white = noise * 1.1 * (1.0 / left + 1.0 / right)
        if self.ar > 0:
            white *= (1 + self.ar) / (1 - self.ar) ** 2
        return white + walk_step_variance(self.walk, left, right)


def around_levels(y: np.ndarray, cps: Sequence[int]) -> np.ndarray:
    """``y`` less the mean of each level that ``cps`` delimit."""
    bounds = [0, *cps, len(y)]
    return y - np.repeat([float(np.mean(y[a:b])) for a, b in itertools.pairwise(bounds)],
                         np.diff(bounds))


def lag_one(r: np.ndarray) -> float:
    """The lag-1 autocorrelation of residuals ``r`` (0 when they are all 0)."""
    power = float(r @ r)
    return float(r[1:] @ r[:-1]) / power if power > 0 else 0.0


@dataclass(frozen=True)
class LevelNoise:
    """The noise around a series' levels, as both readers of its correlation need it.

    ``flat``: the series less the drift its levels share (when that drift is significant,
    ``drift``); ``residual``: ``flat`` less each level's mean; ``power``: its sum of squares;
    ``correlation``: its lag-1 correlation, 0 when it is no noise at all (below the series'
    floor: a noise-free series' rounding dust is no correlation).
    """

    flat: np.ndarray
    residual: np.ndarray
    drift: bool
    power: float
    correlation: float


def level_noise(y: np.ndarray, cps: Sequence[int], sigma: float,
                drift_z: float) -> LevelNoise:
    """The noise of ``y`` around the levels ``cps`` delimit (`LevelNoise`).

    The one place the segmentation (`analysis.segmentation._correlated_alternative`) and a
    verdict (`noise_correlation`) read it: the drift, the residuals, the floor, the lag-1
    correlation.
    """
    n = len(y)
    slope, sxx = _drift_slope(y, [0, *cps, n])
    drift = _is_drift(slope, sxx, sigma, drift_z)
    flat = y - slope * np.arange(n) if drift else y
    residual = around_levels(flat, cps)
    power = float(residual @ residual)
    noisy = math.sqrt(power / n) > _sigma_floor(y, 0.0) if n else False
    return LevelNoise(flat, residual, drift, power, lag_one(residual) if noisy else 0.0)


VERDICT_WHITE_Z = 2.0
"""A verdict discounts its history's autocorrelation only beyond this many standard errors
(the verdict's thresholds were chosen on white noise: a chance correlation costs their
power). Measured at 3.0 against 2.0 (1 500 histories of 30-100 runs a correlation, noise of
2 %, the same draws): regressions and improvements in white histories 1.5 % both; at a lag-1
correlation of 0.2 / 0.3 / 0.4 / 0.6, 2.8 / 4.6 / 4.8 / 8.3 % at 3.0, 2.2 / 3.2 / 3.4 / 7.0 %
at 2.0 (a mild correlation in a short history passed for white noise). The families
(`benchmarks/regression/families_run.py --count 20`): false alarms 0.91 -> 0.88 % a stable
run (`seasonal`, whose noise is AR up to 0.5: 1.68 -> 1.21 %), event recall 0.884 -> 0.876
(one event of `seasonal`'s 10 and one of `staircase`'s 33 found later), first-run and
change-point figures unchanged; the real series one false alarm more (1.29 -> 1.35 %)."""
VERDICT_MIN_RUNS = 40
"""...and in a history of at least this many runs (below, its lag-1 correlation is known to
+-0.16 or worse)."""


def noise_correlation(y: np.ndarray, cps: Sequence[int]) -> float:
    """The lag-1 correlation of ``y``'s noise around its levels ``cps``, for a verdict.

    Around the levels and their shared drift when it is significant; 0 when it is within
    `VERDICT_WHITE_Z` standard errors of white noise, else as measured (at most `MAX_AR`).
    Residuals around levels already read a correlation low (the levels take some of the
    noise's slow part): shrunk by one standard error more, AR histories' verdicts called
    5.8 % of their runs regressions or improvements (4.4 % unshrunk), and the families'
    false alarms were 0.93 % a stable run (0.91 %), their recall the same.
    """
    n = len(y)
    if n < VERDICT_MIN_RUNS:
        return 0.0
    correlation = level_noise(y, cps, noise_scale(y), DEFAULTS.drift_z).correlation
    if correlation * math.sqrt(n) < VERDICT_WHITE_Z:
        return 0.0
    return min(correlation, MAX_AR)
