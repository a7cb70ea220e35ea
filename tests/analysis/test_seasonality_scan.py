"""The pattern test of every period at once (`analysis.seasonality._scan`) is `_test`'s.

`_pattern` picks its period from `_scan`'s scores and BICs, then takes the chosen period's
phase means from `_test` itself: where the two agree on every period, the pattern found is
the one the period-by-period loop found. Generated series of every kind the detector sees:
noise, steps, waves, drifts, outliers, repeated values (ties in the quantiles), constants.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from analysis.seasonality import (
    MAX_PERIOD,
    MIN_CYCLES,
    TESTED,
    _pattern,
    _scan,
    _test,
    _winsorised,
)


@st.composite
def series(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(6, TESTED))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    t = np.arange(n)
    kind = draw(st.sampled_from(["noise", "wave", "step", "drift", "outliers", "ties",
                                 "constant", "pattern"]))
    y = 100 + rng.normal(0, draw(st.sampled_from([1e-6, 1.0, 50.0])), n)
    if kind == "wave":
        y += rng.uniform(0.5, 4) * np.sin(2 * np.pi * t / rng.uniform(3, 60) + rng.random())
    elif kind == "step":
        y[int(rng.integers(1, n)):] += rng.uniform(-5, 5)
    elif kind == "drift":
        y += rng.uniform(-0.1, 0.1) * t
    elif kind == "outliers":
        y[rng.integers(0, n, max(1, n // 20))] += rng.choice([-1, 1]) * 40
    elif kind == "ties":
        y = np.round(y)
    elif kind == "constant":
        y = np.full(n, 7.0)
    elif kind == "pattern":
        period = int(rng.integers(2, 30))
        y += np.tile(rng.normal(0, 2, period), n // period + 1)[:n]
    return y


def _same(a: float, b: float, tolerance: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def _conditioning(residuals: np.ndarray, means: np.ndarray, p: int) -> float:
    """How much the F statistic's two sums of squares lose to cancellation.

    Within the phases: the residuals' sum of squares less what the phase means explain;
    between them: what the means explain less the overall mean's share. Almost no noise, or
    phase means all but equal, leave a difference of two nearly equal sums, whose last bits
    depend on the order they were added in.
    """
    r = _winsorised(residuals)
    phases = (np.arange(len(r)) + p // 2) % p
    counts = np.bincount(phases, minlength=p)
    explained = float(counts @ means ** 2)
    between = explained - float(r.sum()) ** 2 / len(r)
    within = float(r @ r) - explained
    return (float(r @ r) / max(abs(within), 1e-300)
            + explained / max(abs(between), 1e-300))


@given(y=series())
def test_every_period_scores_as_its_own_test(y: np.ndarray) -> None:
    periods = np.arange(2, max(2, min(MAX_PERIOD, len(y) // MIN_CYCLES)) + 1)
    scores, bics = _scan(y, periods)
    for p, score, bic in zip(periods, scores, bics, strict=True):
        z, means, expected_bic, residuals = _test(y, int(p))
        if residuals is None:
            assert score == -math.inf, p
            continue
        # ~1e-15 a sum, times what the cancellation magnifies it by
        tolerance = 1e-9 + 1e-13 * _conditioning(residuals, means, int(p))
        assert _same(float(score), z, tolerance), (p, score, z, tolerance)
        assert _same(float(bic), expected_bic, tolerance), (p, bic, expected_bic, tolerance)


def _pattern_by_loop(y: np.ndarray, max_period: int, z_threshold: float) -> int | None:
    """The period `_pattern` chose before `_scan`: each period tested in turn."""
    best: tuple[int, float] | None = None
    for p in range(2, min(max_period, len(y) // MIN_CYCLES) + 1):
        z, _, bic, residuals = _test(y, p)
        if residuals is not None and z >= z_threshold and (best is None or bic < best[1]):
            best = (p, bic)
    return None if best is None else best[0]


@given(y=series(), threshold=st.sampled_from([2.0, 4.5]))
def test_the_period_chosen_is_the_loop_s(y: np.ndarray, threshold: float) -> None:
    found = _pattern(y, MAX_PERIOD, threshold)
    looped = _pattern_by_loop(y, MAX_PERIOD, threshold)
    if looped is None:
        assert found is None
    else:  # the whitened test may still turn the period down (`_pattern`)
        assert found is None or found.period == looped
