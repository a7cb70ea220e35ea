"""Is a KPI series periodic? The test the change-point detector runs before segmenting.

A wave (a weekly batch job on a shared cluster, a nightly cache flush, a rotation of test
nodes) is not a sequence of steps: segmented as it is, its crests and troughs read as a new
level every half period. So a series is first tested for a periodic component, and the
detector segments the series *less* that component (`deseasonalised`).

Method (classical decomposition, Kendall & Stuart): for each candidate period ``p`` (2 ..
``max_period``, at least ``min_cycles`` cycles in the series), the trend is the centred
moving average of ``p`` runs (``2 x p`` for an even ``p``), which removes a pattern of period
``p`` exactly and keeps levels and drifts. The residuals, winsorised at their 5-95 %
quantiles (one outlier must not make a phase), are grouped by phase ``i mod p``; a one-way
analysis of variance tests whether the phase means differ. Steps leave the phase means
alone: every phase sees both sides of a step. The F statistic is turned into a normal score
(Paulson's approximation), and the best period is kept when its score passes
``z_threshold`` (4.5: with up to 48 periods tried, a stable series passes it about once in
ten thousand). Of the periods that pass, the one with the smallest BIC is the period (a
multiple of it passes too, explaining nothing more). Noise that is autocorrelated has more
power at low frequencies, where a long period's pattern lives, so the period must also pass
in the series whitened by the noise's lag-1 autocorrelation (measured: AR(1) noise of phi 0.5
called periodic in 3 % of series, 10 % without). It is read from the residuals once the
pattern is removed, less their moving average, which takes the noise's slow part with it;
`ar_behind` reads the noise's own back (AR(1) noise of 0.7-0.95: 7 % of series called
periodic while whitened by what the average left, 3 % now).

A wave's period need not be a whole number of runs (a 33.7-run cycle: a thermal or rotation
cycle that is not the calendar's). Over 256 runs the nearest whole period still passes the
test, but its pattern, repeated over a 1 000-run history, drifts out of phase and leaves a
slow beat the segmentation cut into steps (measured: a third of pure sine waves with real
periods of 5-50 runs, 900 runs long, got 10-25 false change points). So a second candidate
is a **sine wave of any period** from `SINE_MIN_PERIOD` (4) runs (`_harmonic`; shorter
ones are the patterns' of 2 and 3 runs): the peak of the series' periodogram
(linear trend removed, Hann window, an FFT zero-padded 16-fold), tested like a pattern
(the same winsorised F test and normal score, on two harmonics) and whitened the same
way. Its period is estimated on the newest `SPAN` runs, so its phase holds over the whole
history. Of the candidates that pass, the wave is the one with the smaller BIC per run
over those `SPAN` runs (a period is one more parameter for a sine; a whole period near a
real one is told apart by the older runs, where it drifts out of phase).

Pure numpy; about 1.1 ms for 1 000 points (the newest 256 are tested; every period's pattern
test in one pass, `_scan`). Past 500 lines on purpose: the patterns, the sine waves and the
one-pass scan share the trend, the winsorised F test, its normal score and the whitening;
split apart, each module would reach into the others' internals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import analysis.blas  # noqa: F401  (numpy's BLAS on one thread: `analysis.blas` says why)

__all__ = ["Seasonality", "ar_behind", "deseasonalised", "seasonality"]

MAX_PERIOD = 48
"""Longest period tried (runs)."""
MIN_CYCLES = 3
"""A period is tried only when the series holds at least this many cycles of it."""
MIN_POINTS = 24
"""Shorter series are never called periodic (too few cycles to tell a wave from noise)."""
Z_THRESHOLD = 4.5
TESTED = 256
"""Only the newest runs are tested (bounds the cost; 5 cycles of the longest period)."""


@dataclass(frozen=True)
class Seasonality:
    """A periodic component found in a series.

    Attributes:
        period: Runs per cycle (a whole number for a pattern; any for a sine wave).
        pattern: The component at each phase, centred on zero, in the series' own units: for
            a pattern, ``pattern[i % period]`` is added to run ``i``; for a sine wave, its
            values at evenly spaced phases (what `amplitude` reads).
        z: The test's normal score (larger: clearer).
        harmonics: A sine wave's (cosine, sine) coefficients of each harmonic, run ``i``
            at phase ``2 pi h i / period``; empty for a pattern.
    """

    period: float
    pattern: tuple[float, ...]
    z: float
    harmonics: tuple[tuple[float, float], ...] = ()

    @property
    def amplitude(self) -> float:
        """Half the distance between the pattern's crest and trough."""
        return (max(self.pattern) - min(self.pattern)) / 2

    @property
    def parameters(self) -> int:
        """What the wave costs a model: its phases less one, or a sine's terms and period."""
        return 2 * len(self.harmonics) + 1 if self.harmonics else len(self.pattern) - 1

    def component(self, index: np.ndarray) -> np.ndarray:
        """The component at each run of ``index`` (integers)."""
        index = np.asarray(index)
        if not self.harmonics:
            return np.asarray(self.pattern)[index % len(self.pattern)]
        return _sines(index, self.period, len(self.harmonics)) @ np.ravel(self.harmonics)

    def at(self, index: int) -> float:
        """The component at run ``index``."""
        return float(self.component(np.array([index]))[0])


def _centred_average(cums: np.ndarray, p: int) -> tuple[np.ndarray, int]:
    """The centred moving average of period ``p``, and the index of its first run.

    A 2 x p average for an even ``p``, from the series' cumulative sums (``cums[0] = 0``).
    """
    plain = (cums[p:] - cums[:-p]) / p  # mean of runs i .. i + p - 1
    if p % 2:
        return plain, p // 2
    return (plain[:-1] + plain[1:]) / 2, p // 2


def _detrended(y: np.ndarray, p: int) -> tuple[np.ndarray, int]:
    """``y`` less its centred moving average of ``p`` runs: (residuals, index of the first)."""
    centred = y - np.add.reduce(y) / len(y)  # y.mean() without its call overhead
    trend, offset = _centred_average(np.concatenate([[0.0], np.cumsum(centred)]), p)
    return centred[offset:offset + len(trend)] - trend, offset


def _winsorised(residuals: np.ndarray) -> np.ndarray:
    """``residuals`` clipped to their 5-95 % quantiles (one outlier must not make a phase)."""
    n = len(residuals)
    low, high = int(0.05 * (n - 1)), int(math.ceil(0.95 * (n - 1)))
    part = np.partition(residuals, (low, high))
    return np.clip(residuals, part[low], part[high])


def _score(residuals: np.ndarray, phases: np.ndarray, p: int
           ) -> tuple[float, np.ndarray, float]:
    """(normal score of the phase means' differences, the phase means, the pattern's BIC).

    A smaller BIC is a better period.
    """
    n = len(residuals)
    r = _winsorised(residuals)
    counts = np.bincount(phases, minlength=p)
    means = np.bincount(phases, weights=r, minlength=p) / np.maximum(counts, 1)
    explained = float(counts @ means ** 2)
    total = float(r.sum())
    between = explained - total * total / n
    within = float(r @ r) - explained
    dof_within = n - p
    bic = n * math.log(max(within, 1e-300) / n) + p * math.log(n)
    if between <= 0 or dof_within <= 0:
        return 0.0, means, bic
    if within <= 0:
        return math.inf, means, bic
    k = p - 1
    return _normal_score((between / k) / (within / dof_within), k, dof_within), means, bic


def seasonality(values: np.ndarray, *, max_period: int = MAX_PERIOD,
                z_threshold: float = Z_THRESHOLD) -> Seasonality | None:
    """The periodic component of ``values`` (finite, oldest first), or None.

    None when no period is clear (see the module docstring).
    """
    y = np.asarray(values, dtype=float)
    n = len(y)
    if n < MIN_POINTS or float(np.ptp(y)) == 0.0:
        return None
    found = [c for c in (_pattern(y, max_period, z_threshold),
                         _harmonic(y, max_period, z_threshold)) if c is not None]
    if len(found) < 2:
        return found[0] if found else None
    # Each was tested on the newest runs, where a whole period near a real one barely
    # drifts; the older runs tell them apart (a 21-run pattern of a 20.88-run wave is a
    # fifth of a cycle off 800 runs back). Both are measured against one trend, the longer
    # period's: a short period's own moving average takes a slow wave and half the noise
    # into its trend (a 2-run pattern beat a 56-run sine that way, and the sine left in the
    # series was cut into 20 steps).
    p = max(max(2, int(round(c.period))) for c in found)
    return min(found, key=lambda c: _span_bic(y, c, p))


def _span_bic(y: np.ndarray, season: Seasonality, p: int) -> float:
    """BIC per run of ``season`` over the newest `SPAN` runs of ``y`` less their trend.

    The trend: the moving average of ``p`` runs.
    """
    span = y[-SPAN:]
    residuals, offset = _detrended(span, p)
    index = np.arange(len(residuals)) + offset + len(y) - len(span)
    left = residuals - season.component(index)
    n = len(left)
    return math.log(max(float(left @ left), 1e-300) / n) + season.parameters * math.log(n) / n


def _pattern(y: np.ndarray, max_period: int, z_threshold: float) -> Seasonality | None:
    """The best whole-period pattern of ``y``, or None."""
    # the newest TESTED runs are enough (5 cycles of the longest period) and bound the cost
    skip = max(len(y) - TESTED, 0)
    y = y[skip:]
    # Of the periods whose test passes, the one with the smallest BIC: a multiple of the
    # true period passes too (with a larger score), but explains nothing more for its
    # extra phases.
    periods = np.arange(2, min(max_period, len(y) // MIN_CYCLES) + 1)
    if not len(periods):
        return None
    scores, bics = _scan(y, periods)
    passed = np.flatnonzero(scores >= z_threshold)
    if not len(passed):
        return None
    p = int(periods[passed[np.argmin(bics[passed])]])  # the first of equal BICs, as before
    # the chosen period's own test: its phase means (and score) exactly as `_test` has them
    z, means, _, residuals = _test(y, p)
    # Autocorrelated noise has more power at low frequencies, where a long period's pattern
    # lives: its phase means differ more than white noise's would (an AR(1) noise of phi 0.5
    # was called periodic in 6 % of series). The period must also stand out in the series
    # whitened by the lag-1 autocorrelation left once the pattern is removed.
    phi = _lag_one(residuals, p, means)
    if phi > 0.05:
        z = min(z, _test(y[1:] - phi * y[:-1], p, start=1)[0])
        if z < z_threshold:
            return None
    pattern = means - float(np.mean(means))
    pattern = np.roll(pattern, skip % p)  # phases of the whole series, not of its tail
    return Seasonality(period=p, pattern=tuple(float(x) for x in pattern),
                       z=float(min(z, 1e6)))


SPAN = 2048
"""Newest runs a sine wave's period is estimated on (bounds the cost; its phase then holds
over that many runs)."""
SINE_MAX_PERIOD = 2 * MAX_PERIOD
"""Longest period of a sine wave (a sine is 5 parameters at any period; a pattern of 96
phases would be 95). At least `MIN_CYCLES` cycles must still be in the tested runs."""
SINE_MIN_CYCLES = 2
"""A sine wave is tried with as few as this many cycles in the tested runs (a pattern needs
`MIN_CYCLES`). Below `MIN_CYCLES` cycles a moving-average trend would leave too little of the
wave, so the trend is a fitted line instead (`_sine_test`)."""
LINE_EXTRA_Z = 1.5
"""What a wave tested against a line must score above the threshold. A line follows slow
movement that is no wave less well than a moving average, and a random walk's meander has
its power at 1-3 cycles of the series: measured on walks of 50-200 runs, 18 of 300 passed
at the plain threshold, 6 with this margin; of 300 waves of 2-3 cycles, 290 and 285."""
SINE_MIN_PERIOD = 4.0
"""Shortest sine period tried. Below it the moving-average trend of 2-3 runs is a high-pass
filter: the residuals' power near those periods is up to twice their mean, and the
periodogram's peak there passed the test in 9 % of white-noise series (measured, 200
series of 100-500 runs; 18 of 18 false waves at 2.0-4.2 runs). Whole periods of 2 and 3
runs are the pattern's (`_pattern`), whose phase means are tested without a peak search."""
HARMONICS = 2
"""Harmonics of a sine wave (a wave that is not quite a sine: a sharper crest)."""
DISPLAY_PHASES = 64
"""Phases a sine wave's `Seasonality.pattern` is drawn at."""


def _sines(index: np.ndarray, period: float, harmonics: int) -> np.ndarray:
    """Columns cos, sin of each harmonic at runs ``index`` (rows)."""
    angle = 2 * np.pi * np.asarray(index, dtype=float)[:, None] / period
    h = np.arange(1, harmonics + 1)
    return np.stack([np.cos(angle * h), np.sin(angle * h)], axis=2).reshape(len(angle), -1)


def _peak_period(y: np.ndarray, max_period: int) -> float | None:
    """The period of the strongest sine in ``y`` (2 .. ``max_period`` runs), or None."""
    n = len(y)
    t = np.arange(n, dtype=float)
    detrended = y - np.polyval(np.polyfit(t, y, 1), t)  # a drift's power is at low frequency
    # zero-padded 16-fold: the peak's frequency within 1/(32 n), a phase error of at most
    # 1/32 cycle over the n runs
    size = 1 << int(math.ceil(math.log2(16 * n)))
    power = np.abs(np.fft.rfft(detrended * np.hanning(n), size)) ** 2
    freqs = np.arange(len(power)) / size
    usable = (freqs >= max(1 / max_period, SINE_MIN_CYCLES / n)) & (
        freqs <= 1 / SINE_MIN_PERIOD)
    if not usable.any():
        return None
    return 1 / float(freqs[usable][int(np.argmax(power[usable]))])


def _harmonic(y: np.ndarray, max_period: int, z_threshold: float) -> Seasonality | None:
    """The strongest sine wave of ``y`` (any period from `SINE_MIN_PERIOD`), or None."""
    span = y[-SPAN:]
    period = _peak_period(span, max(max_period, min(SINE_MAX_PERIOD, TESTED // SINE_MIN_CYCLES)))
    if period is None:
        return None
    skip = max(len(y) - TESTED, 0)
    window = y[skip:]
    if _against_a_line(len(window), period):
        z_threshold += LINE_EXTRA_Z
    tested = _sine_test(window, period, skip)
    if tested is None or tested[0] < z_threshold:
        return None
    z, coefficients, phi = tested
    if phi > 0.05:  # as `_pattern` does: autocorrelated noise makes slow waves
        whitened = _sine_test(window[1:] - phi * window[:-1], period, skip + 1)
        if whitened is None or whitened[0] < z_threshold:
            return None
        z = min(z, whitened[0])
    harmonics = tuple((float(a), float(b)) for a, b in coefficients.reshape(-1, 2))
    phases = np.arange(DISPLAY_PHASES) * period / DISPLAY_PHASES
    drawn = _sines(phases, period, len(harmonics)) @ coefficients
    return Seasonality(period=period, pattern=tuple(float(v) for v in drawn),
                       z=float(min(z, 1e6)), harmonics=harmonics)


def _sine_test(y: np.ndarray, period: float, start: int
               ) -> tuple[float, np.ndarray, float] | None:
    """A sine wave of ``period`` in ``y`` (whose first run is run ``start``), tested.

    Returns (score, coefficients, lag-1 autocorrelation left); None: too few runs.

    The trend is the centred moving average of the nearest whole period (it keeps ~4 % of
    the wave at most); the residuals are winsorised and regressed on the harmonics, and the
    F test is scored as `_score` scores a pattern's.
    """
    harmonics = HARMONICS if 2 * HARMONICS / period < 1 else 1  # below Nyquist
    if _against_a_line(len(y), period):
        return _sine_test_on_a_line(y, period, start, harmonics)
    p = max(2, int(round(period)))
    k = 2 * harmonics
    residuals, offset = _detrended(y, p)
    n = len(residuals)
    if n < max(2 * p, 4 * k):
        return None
    r = _winsorised(residuals)
    r = r - r.mean()
    x = _sines(np.arange(n) + offset + start, period, harmonics)
    coefficients = np.linalg.lstsq(x, r, rcond=None)[0]
    fitted = x @ coefficients
    explained = float(fitted @ fitted)
    z, coefficients, phi = _sine_score(coefficients, r - fitted, explained, harmonics, n - k - 1)
    return z, coefficients, ar_behind(phi, p)  # the noise's own, not what the average left


def _against_a_line(n: int, period: float) -> bool:
    """Whether a sine of ``period`` in ``n`` runs is tested against a line (`LINE_EXTRA_Z`).

    So it is under `MIN_CYCLES` cycles of its moving average's whole period.
    """
    return n < MIN_CYCLES * max(2, int(round(period)))


def _sine_test_on_a_line(y: np.ndarray, period: float, start: int, harmonics: int
                         ) -> tuple[float, np.ndarray, float] | None:
    """`_sine_test` for a wave of fewer than `MIN_CYCLES` cycles in ``y``: the trend is a line.

    The wave and the line are fitted together to the winsorised residuals of a line, and
    the F test asks what the wave adds to the line alone.
    """
    n = len(y)
    k = 2 * harmonics
    if n < SINE_MIN_CYCLES * period or n < 4 * k:
        return None
    t = np.linspace(-1.0, 1.0, n)
    line = np.stack([np.ones(n), t], axis=1)
    r = _winsorised(y - line @ np.linalg.lstsq(line, y, rcond=None)[0])
    base = r - line @ np.linalg.lstsq(line, r, rcond=None)[0]
    x = np.concatenate([line, _sines(np.arange(n) + start, period, harmonics)], axis=1)
    beta = np.linalg.lstsq(x, r, rcond=None)[0]
    left = r - x @ beta
    explained = float(base @ base) - float(left @ left)
    return _sine_score(beta[2:], left, explained, harmonics, n - k - 2)


def _sine_score(coefficients: np.ndarray, left: np.ndarray, explained: float, harmonics: int,
                dof_within: int) -> tuple[float, np.ndarray, float]:
    """(score, coefficients padded to `HARMONICS`, lag-1 autocorrelation of ``left``).

    ``left``: the residuals once the wave is fitted; ``explained``: what the wave took of
    their sum of squares.
    """
    k = 2 * harmonics
    within = float(left @ left)
    if harmonics < HARMONICS:
        coefficients = np.concatenate([coefficients, np.zeros(2 * (HARMONICS - harmonics))])
    phi = float(np.clip((left[1:] @ left[:-1]) / within, -0.9, 0.9)) if within > 0 else 0.0
    if explained <= 0 or dof_within <= 0:
        return 0.0, coefficients, phi
    if within <= 0:
        return math.inf, coefficients, phi
    return _normal_score(explained / k / (within / dof_within), k, dof_within), \
        coefficients, phi


def _normal_score(f: float, k: int, dof_within: int) -> float:
    """Paulson's normal approximation of an F statistic with (k, dof_within) dof.

    Wilson-Hilferty for both (chi-squared alone read short series 10 x too often).
    """
    a, b = 2 / (9 * k), 2 / (9 * dof_within)
    cube = f ** (1 / 3)
    return ((1 - b) * cube - (1 - a)) / math.sqrt(a + b * cube * cube)


def _test(y: np.ndarray, p: int, start: int = 0
          ) -> tuple[float, np.ndarray, float, np.ndarray | None]:
    """(score, phase means, BIC, residuals) of period ``p``; residuals None: too few runs.

    ``start`` is the index of ``y[0]`` in the series (its phase).
    """
    residuals, offset = _detrended(y, p)
    if len(residuals) < 2 * p:
        return 0.0, np.zeros(p), math.inf, None
    z, means, bic = _score(residuals, (np.arange(len(residuals)) + offset + start) % p, p)
    return z, means, bic, residuals


def _scan(y: np.ndarray, periods: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_test`'s score and BIC of each of ``periods`` at once (``start`` 0).

    A period with too few runs scores ``-inf``. The same arithmetic as `_test` on a matrix,
    one row a period (padded past each row's own residuals), instead of ~15 small numpy
    calls a period: a series' 2-48 periods cost ~1 ms that way, a fifth of a verdict.
    Sums run in another order, so a score may differ from `_test`'s in its last bits.
    """
    n = len(y)
    centred = y - np.add.reduce(y) / n
    cums = np.concatenate([[0.0], np.cumsum(centred)])
    p = periods[:, None]
    even = p % 2 == 0
    offset = p // 2
    lengths = n + 1 - periods - (periods % 2 == 0)  # the trend's: `_centred_average`
    j = np.arange(n)[None, :]
    valid = j < lengths[:, None]
    # plain[k] = mean of runs k .. k + p - 1; a 2 x p average for an even p
    ends = np.minimum(j + p, n)
    plain = (cums[ends] - cums[j]) / p
    plain_next = (cums[np.minimum(ends + 1, n)] - cums[np.minimum(j + 1, n)]) / p
    trend = np.where(even, (plain + plain_next) / 2, plain)
    residuals = np.where(valid, centred[np.minimum(j + offset, n - 1)] - trend, np.nan)
    # winsorised at each row's own 5-95 % quantiles (`_winsorised`)
    ordered = np.sort(residuals, axis=1)  # the padding (NaN) sorts last
    rows = np.arange(len(periods))
    low = ordered[rows, (0.05 * (lengths - 1)).astype(int)][:, None]
    high = ordered[rows, np.ceil(0.95 * (lengths - 1)).astype(int)][:, None]
    r = np.where(valid, np.clip(residuals, low, high), 0.0)
    # phase means by one bincount over (row, phase)
    width = int(periods.max())
    cells = (rows[:, None] * width + (j + offset) % p)[valid]
    counts = np.bincount(cells, minlength=len(periods) * width).reshape(-1, width)
    sums = np.bincount(cells, weights=r[valid],
                       minlength=len(periods) * width).reshape(-1, width)
    means = sums / np.maximum(counts, 1)
    explained = (counts * means ** 2).sum(axis=1)
    total = r.sum(axis=1)
    size = lengths.astype(float)
    between = explained - total * total / size
    within = (r * r).sum(axis=1) - explained
    dof_within = size - periods
    with np.errstate(divide="ignore", invalid="ignore"):
        bics = size * np.log(np.maximum(within, 1e-300) / size) + periods * np.log(size)
        f = (between / (periods - 1)) / (within / dof_within)
        scores = _normal_scores(f, periods - 1, dof_within)
    scores = np.where((between <= 0) | (dof_within <= 0), 0.0,
                      np.where(within <= 0, np.inf, scores))
    scores[lengths < 2 * periods] = -np.inf  # too few runs: never a period
    return scores, bics


def _normal_scores(f: np.ndarray, k: np.ndarray, dof_within: np.ndarray) -> np.ndarray:
    """`_normal_score` of each F statistic (non-finite where it is undefined)."""
    a, b = 2 / (9 * k), 2 / (9 * dof_within)
    cube = np.cbrt(f)
    return ((1 - b) * cube - (1 - a)) / np.sqrt(a + b * cube * cube)


def _lag_one(residuals: np.ndarray | None, p: int, means: np.ndarray) -> float:
    """Lag-1 autocorrelation of a series less its trend and its pattern of period ``p``.

    ``residuals``: the series less its trend, as `_test` gave them with ``means``.
    """
    if residuals is None or len(residuals) < 3:
        return 0.0
    offset = p // 2  # `_centred_average`'s, for odd and even periods
    r = residuals - means[(np.arange(len(residuals)) + offset) % p]
    r = r - r.mean()
    denominator = float(r @ r)
    return ar_behind(float(r[1:] @ r[:-1]) / denominator, p) if denominator else 0.0


MAX_WHITENING = 0.95
"""The largest lag-1 autocorrelation a test is whitened by."""
_PHI_GRID = np.linspace(0.0, MAX_WHITENING, 96)
INFORMATIVE_SPAN = 0.6
"""`ar_behind` reads the noise's correlation back only where the residuals' moves this much
over its range (averages of 11 runs or more: 0.17 at 2-3 runs, 0.5 at 8, 0.63 at 12)."""


@lru_cache(maxsize=256)
def _detrended_lag_one(p: int) -> np.ndarray:
    """What AR(1) noise's lag-1 autocorrelation becomes once its average is taken off.

    For each `_PHI_GRID` value, the centred moving average of ``p`` runs (`_detrended`).
    """
    if p % 2:
        average = np.full(p, 1.0 / p)
    else:  # the 2 x p average: half weights at both ends
        average = np.concatenate([[0.5 / p], np.full(p - 1, 1.0 / p), [0.5 / p]])
    kernel = -average
    kernel[len(kernel) // 2] += 1.0  # the run itself less its trend
    reach = len(kernel) - 1
    own = np.correlate(kernel, kernel, mode="full")  # lags -reach .. reach
    lags = np.arange(-reach, reach + 1)
    phi = _PHI_GRID[:, None]
    # the filtered noise's autocovariance at lag k: sum over m of own(m) phi^|k + m|
    at0 = (phi ** np.abs(lags)) @ own
    at1 = (phi ** np.abs(lags + 1)) @ own
    return at1 / at0


def ar_behind(observed: float, p: int) -> float:
    """The noise's own lag-1 autocorrelation, from its residuals' (``observed``).

    The residuals: the noise less its centred moving average of ``p`` runs. The average
    takes the noise's slow part with it: AR(1) noise of 0.85 kept 0.49 once a 12-run average
    was taken off, and whitened by that, its slow swings passed as waves (16 of 200 series
    of 60-400 runs called periodic; 8 whitened by the noise's own). The residuals of white
    noise correlate slightly negatively (-0.1 at 12 runs): 0. Below `INFORMATIVE_SPAN`, the
    residuals' own correlation (the slow swings that pass as waves are long ones).
    """
    if not math.isfinite(observed):
        return 0.0
    curve = _detrended_lag_one(p)
    if curve[-1] - curve[0] < INFORMATIVE_SPAN:
        # a short average leaves a correlation that barely depends on the noise's: the
        # residuals' own, as measured (read back, a sampling error of 0.01 moved it by 0.07)
        return float(np.clip(observed, -0.9, 0.9))
    if observed <= curve[0]:
        return 0.0
    if observed >= curve[-1]:
        return MAX_WHITENING
    return float(np.interp(observed, curve, _PHI_GRID))


def deseasonalised(values: np.ndarray, season: Seasonality | None,
                   start: int = 0) -> np.ndarray:
    """``values`` less the periodic component (unchanged without one).

    ``start`` is the index of ``values[0]`` in the series the component was found in.
    """
    y = np.asarray(values, dtype=float)
    if season is None:
        return y
    return y - season.component(np.arange(len(y)) + start)
