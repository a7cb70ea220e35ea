"""Generated series: the verdict and the change points never crash, and never contradict
themselves over time (issue #41's property tests)."""

from __future__ import annotations

import math
import sys

import numpy as np
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from analysis.detector import DetectorSettings
from analysis.power import minimum_detectable_effect
from analysis.regression import (
    DEFAULTS,
    NEWS,
    _shapes,
    change_points,
    spread_change_points,
    verdict,
)
from analysis.seasonality import seasonality
from analysis.spread import PLACE_RADIUS, place_spread_changes
from tests.series_checks import KINDS, assert_ordered_and_explained

# values a result tree can carry: constant, tiny, huge, negative, zero, NaN and inf holes
_value = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False),  # up to 1.8e308: a z that overflows
    st.sampled_from([0.0, 1e-300, -1e-300, 1e300, math.nan, math.inf, -math.inf, 5.0,
                     sys.float_info.max, -sys.float_info.max, 5e-324]),
)
_series = st.one_of(
    st.lists(_value, min_size=0, max_size=120),
    st.builds(lambda v, n: [v] * n, _value, st.integers(0, 80)),  # constant
    st.builds(lambda seed, n, scale: list(scale * (1 + np.random.default_rng(seed)
                                                   .normal(0, 0.02, n))),
              st.integers(0, 10_000), st.integers(1, 300),
              st.sampled_from([1e-9, 1.0, 1e9])),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a finite KPI so far from its level that its z, scaled to be rounded for the text,
# overflowed: OverflowError from the explanation (a generated probe found it)
@example(history=[49.5, 48.3, 47.9, 54.4], latest=[-1e308], direction="higher_better")
@example(history=[99.1, 102.4, 102.7, 92.6, 103.6, 104.4, 98.0], latest=[1e308, math.inf,
                                                                          -1e308],
         direction="higher_better")
@example(history=[0.0] * 3, latest=[-1e292, -sys.float_info.max], direction="higher_better")
@example(history=[5e-324] * 3, latest=[1.0, 5e-324, 5e-324, 5e-324],
         direction="higher_better")
@given(history=_series, latest=st.one_of(_value, st.lists(_value, min_size=0, max_size=4)),
       direction=st.sampled_from(["higher_better", "lower_better"]))
def test_a_verdict_never_crashes_and_always_explains(history: list[float],
                                                     latest: float | list[float],
                                                     direction: str) -> None:
    judged = verdict(history, latest, direction)  # type: ignore[arg-type]
    assert judged.kind in KINDS
    assert 0.0 <= judged.confidence <= 1.0 and judged.explanation
    assert math.isfinite(judged.magnitude)
    assert judged.suspect == (judged.kind == "suspect")
    for found in (change_points(history, direction),  # type: ignore[arg-type]
                  sorted(change_points(history, direction))):  # type: ignore[arg-type]
        assert all(0 <= c < len(history) for c in found)
    mde = minimum_detectable_effect(history)
    assert mde is None or mde >= 0 or math.isnan(mde)


# derandomized: the same examples every run, so CI never passes or fails by draw. A fresh random
# draw found a rare failing case, now fixed and pinned below (`..._found_counterexample`).
@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 100_000), n=st.integers(12, 80),
       noise=st.floats(0.002, 0.05), drop=st.floats(0.2, 0.5),
       direction=st.sampled_from(["higher_better", "lower_better"]))
def test_a_confirmed_regression_stays_reported_when_a_run_at_its_level_follows(
        seed: int, n: int, noise: float, drop: float, direction: str) -> None:
    """Confirmed at its first run (the run and its re-run agree), a regression is still a
    regression when the next run lands at the new level: adding a run never un-reports it
    while it is news. From 12 runs of history: with 8 runs of 5 % noise, the first bad run
    in the history is one large difference among eight, doubles the difference-based noise,
    and a 25 % drop confirmed at 3.4 SE read 1.9 SE (hypothesis found it: seed 313). Reading
    the noise without the tail under test fixes that case but raised false alarms on the
    benchmark families from 0.95 to 1.13 % per stable run (over the 1 % budget): not kept."""
    rng = np.random.default_rng(seed)
    history = list(100 * np.exp(rng.normal(0, noise, n)))
    worse = 1 - drop if direction == "higher_better" else 1 / (1 - drop)
    bad = [100 * worse * float(np.exp(rng.normal(0, noise))) for _ in range(3)]
    confirmed = verdict(history, bad[:2], direction)  # type: ignore[arg-type]
    assume(confirmed.kind == "regression")  # a short, noisy history may not confirm it
    assert confirmed.start_runs == 1
    later = verdict(history + [float(np.median(bad[:2]))], bad[2],
                    direction)  # type: ignore[arg-type]
    assert later.kind == "regression", later.explanation
    assert later.start_runs == 2


def test_a_confirmed_regression_stays_reported_found_counterexample() -> None:
    """Found by hypothesis (0 of 3 000 uniform draws of the same domain fail): 45 runs of
    4.9 % noise, a 20 % step confirmed at 6.3 SE, then un-reported (1.9 SE) by the next run at
    the new level: a spurious settled change point 10 runs back left a 10-run current segment
    whose noise scale held the first bad run's jump. A short segment's noise is now read
    with the runs before it (`analysis.detector._current_noise`): 4.4 SE."""
    seed, n, noise, drop = 45, 45, 0.048828125, 0.203125
    rng = np.random.default_rng(seed)
    history = list(100 * np.exp(rng.normal(0, noise, n)))
    bad = [100 / (1 - drop) * float(np.exp(rng.normal(0, noise))) for _ in range(3)]
    assert verdict(history, bad[:2], "lower_better").kind == "regression"
    later = verdict(history + [float(np.median(bad[:2]))], bad[2], "lower_better")
    assert later.kind == "regression", later.explanation


def test_pure_waves_are_called_periodic_and_rarely_news() -> None:
    """A wave (period 3-20, amplitude 1.5-4 noise SDs, at least 6 cycles) is found and named;
    a news verdict on its newest run is as rare as on a flat series (a few %)."""
    rng = np.random.default_rng(41)
    news = periodic = 0
    for _ in range(100):
        period = int(rng.integers(3, 21))
        n = int(rng.integers(6 * period, 400))
        t = np.arange(n + 1)
        values = (100 + rng.uniform(1.5, 4.0) * np.sin(2 * np.pi * t / period)
                  + rng.normal(0, 1, n + 1))
        found = seasonality(np.log(values[:n]))
        assert found is not None, (n, period)
        cycles = found.period / period  # a whole number of the wave's cycles (a pattern of k)
        assert abs(cycles - round(cycles)) < 0.02 * round(cycles), (n, period, found.period)
        judged = verdict(list(values[:n]), float(values[n]), "higher_better")
        news += judged.kind in NEWS
        periodic += judged.kind == "periodic"
    assert news <= 3 and periodic >= 85, (news, periodic)



def test_a_slow_wave_of_two_to_three_cycles_is_periodic_not_a_staircase() -> None:
    """A wave of 2-3 cycles in a 60-160-run history (a 40-80-run cycle in the 100 runs a
    verdict reads) is called periodic, has no level change and its newest run is rarely news.
    A moving-average trend needs 3 cycles; below that the sine is tested against a fitted
    line. Measured on these 150 draws: 3.8 false change points a series, 51 called periodic
    and 11 news verdicts before; 0.02, 143 and 3 after."""
    rng = np.random.default_rng(5)
    news = periodic = found = 0
    for _ in range(150):
        n = int(rng.integers(60, 160))
        period = n / rng.uniform(2.0, 3.0)
        t = np.arange(n + 1)
        values = list(100 + rng.uniform(1.5, 4.0) * np.sin(2 * np.pi * (t / period
                                                                        + rng.random()))
                      + rng.normal(0, 1, n + 1))
        judged = verdict(values[:n], values[n], "higher_better")
        news += judged.kind in NEWS
        periodic += judged.kind == "periodic"
        found += len(change_points(values[:n]))
    assert found <= 15 and periodic >= 130 and news <= 7, (found, periodic, news)

# derandomized, like the property above: CI must not pass or fail by draw. A fresh draw in
# session 12's loaded run found seed=8783, n=40, noise=0.03125, factor=0.5, first=False,
# level=1e-6 (a change point in a flat 40-run history with one wild last run): open in #41.
@settings(max_examples=80, deadline=None, derandomize=True)
@given(seed=st.integers(0, 100_000), n=st.integers(40, 300), noise=st.floats(0.001, 0.05),
       factor=st.one_of(st.floats(0.05, 0.8), st.floats(1.25, 20.0)),
       first=st.booleans(), level=st.sampled_from([1e-6, 1.0, 1000.0, 1e9]))
@example(seed=3060, n=40, noise=0.03125, factor=0.5, first=False, level=1e-6)
@example(seed=69528, n=281, noise=0.015625, factor=0.5, first=True, level=1e-6)
def test_one_wild_run_at_an_end_puts_no_change_point_in_a_flat_history(
        seed: int, n: int, noise: float, factor: float, first: bool, level: float) -> None:
    """A lone newest (or oldest) run far off a flat history is one run, never a level: it
    adds no change point anywhere (it once read as a drift the segmentation cut into steps all
    along the history, in every suspect's report chart). From 40 runs: shorter histories
    lower the thresholds, and a wild run with a noise-low neighbour can still read as a
    two-run level at the edge (measured: 3 of 40 draws at 12-20 runs, 3 % noise).

    One marginal change point may flip: any change to a run moves the noise estimate and the
    ranks a little, and flat noise that nearly had a level or a spread change then has one
    (hypothesis found two: seed 3060, 40 runs, a level 7 runs before the end; seed 69528,
    281 runs, a spread change at run 49; measured over 1 966 random draws: 19 add one,
    none two). Never more than one: the bug this guards against cut the whole history into
    steps."""
    values = list(level * (1 + np.random.default_rng(seed).normal(0, noise, n)))
    assume(all(v > 0 for v in values))
    without = change_points(values)  # flat noise has its own rare false change points
    values[0 if first else -1] *= factor
    assume(abs(math.log(factor)) > 8 * noise)  # a wild run, not one within the noise
    added = set(change_points(values)) - set(without)
    assert len(added) <= 1, added


# Waves whose period is not a whole number of runs (a 33.7-run cycle), over up to 1 000 runs:
# the nearest whole period's pattern drifts out of phase over such a history and its slow
# beat was cut into 10-25 steps in a third of the series. Derandomized: CI must not pass or
# fail by draw. Periods up to 48 runs here (measured: 0 of 600 draws fail); longer ones (to
# 80) are the benchmark's `sine` family (with a step in 5-6 cycles, 1-2 % still get one
# more level change).
@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 100_000), n=st.integers(300, 1000),
       period=st.floats(5.0, 48.0), amplitude=st.floats(1.5, 4.0),
       phase=st.floats(0.0, 1.0), step=st.sampled_from([0.0, 6.0, -6.0]))
def test_a_wave_of_any_period_is_never_cut_into_steps(
        seed: int, n: int, period: float, amplitude: float, phase: float, step: float) -> None:
    """A sine wave (amplitude 1.5-4 noise SDs, at least 6 cycles in the series) has no level
    change of its own, and the analysis finds its period within 2 %; a step of 6 noise SDs in the
    middle of it is found within 2 runs, and no other level change is. (A spread change
    point can still be the noise's own: one seed's normal draws moved their run-to-run
    spread 1.8x between two 200-run windows.)"""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    values = 100 + amplitude * np.sin(2 * np.pi * (t / period + phase)) + rng.normal(0, 1, n)
    middle = n // 2
    values[middle:] += step
    series = list(values)
    # the wave the analysis finds (with a step, it looks again without the step: the
    # bare `seasonality` of a 1.5-SD wave of 7 cycles with a 6-SD step in it finds none)
    found = _shapes(series, "higher_better", DEFAULTS, short=True)[3]  # type: ignore[index]
    assert found is not None and abs(found.period / period - 1) < 0.02, found
    levels = sorted(set(change_points(series)) - set(spread_change_points(series)))
    if step:
        assert len(levels) == 1 and abs(levels[0] - middle) <= 2, levels
    else:
        assert levels == [], levels


@settings(max_examples=60, deadline=None, derandomize=True)
@given(levels=st.lists(st.floats(-50.0, 50.0).filter(lambda v: abs(v) > 0.5), min_size=1,
                       max_size=4),
       gaps=st.lists(st.integers(10, 250), min_size=5, max_size=5),
       base=st.sampled_from([1e-3, 1.0, 100.0, 1e6]),
       outlier=st.one_of(st.none(), st.floats(0.05, 0.95)))
def test_noise_free_steps_are_found_exactly(levels: list[float], gaps: list[int],
                                            base: float, outlier: float | None) -> None:
    """A series without noise (a count, a setting, a quantised size): each step exactly
    where it is, a lone run off the level is no step, and there is no wave. 40-50 % of such
    series got extra change points, some 50: the segmentation's noise floor made a run
    placed one run off a "significant" slope, a staircase read as a drift and cut into a
    sawtooth (`analysis.exact.exact_steps`)."""
    bounds = np.cumsum(gaps[:len(levels) + 1])
    values = np.full(int(bounds[-1]), base)
    for at, move in zip(bounds[:-1], levels, strict=True):
        values[at:] += base * move / 100  # a level at least 0.5 % away
    steps = [int(b) for b in bounds[:-1] if values[b - 1] != values[b]]
    if outlier is not None:
        spot = 2 + int(outlier * (len(values) - 4))
        assume(all(abs(spot - b) > 1 for b in bounds[:-1]))
        values[spot] *= 1.3
    assert change_points(list(values)) == steps
    assert verdict(list(values), float(values[-1]), "higher_better").kind == "no_change"


def test_a_noisier_stretch_is_no_level_change() -> None:
    """The noise's SD x2-x4 from a run on, or until one, at a steady level: its own
    fluctuations are not level changes. Levels were validated against one noise scale for
    the whole series, so the noisier stretch's swings passed as steps (measured: 45 of 200
    draws had a false level change; judged against the noise around each step, 14)."""
    rng = np.random.default_rng(7)
    false_levels = 0
    for i in range(60):
        n = int(rng.integers(100, 1000))
        at = int(rng.integers(n // 4, 3 * n // 4))
        noise = rng.normal(0, 1, n)
        if i % 2:
            noise[at:] *= rng.uniform(2, 4)
        else:
            noise[:at] *= rng.uniform(2, 4)
        series = list(100 + noise)
        false_levels += bool(set(change_points(series)) - set(spread_change_points(series)))
    assert false_levels <= 8, false_levels


def test_a_spread_change_is_placed_on_its_run() -> None:
    """The noise's SD x2-x4 from a run on (or until one), normal and Student-t(5) noise: a
    spread change found is placed within two runs of where it happened in most draws. Found
    on the differences' rank scores alone, 45 of these 77 were (`place_spread_changes`
    places them again on the runs: 57)."""
    rng = np.random.default_rng(2027)
    placed = found = 0
    for i in range(80):
        n = int(rng.integers(150, 900))
        at = int(rng.integers(n // 4, 3 * n // 4))
        noise = rng.normal(0, 1, n) if i % 2 else rng.standard_t(5, n)
        factor = rng.uniform(2, 4)
        if i % 4 < 2:
            noise[at:] *= factor
        else:
            noise[:at] *= factor
        near = [c for c in spread_change_points(list(50 + noise)) if abs(c - at) <= 30]
        found += bool(near)
        placed += any(abs(c - at) <= 2 for c in near)
    assert found >= 70, found
    assert placed >= 52, (placed, found)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(values=st.lists(st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.just(0.0)),
                       min_size=30, max_size=200),
       picks=st.lists(st.floats(0, 1), min_size=1, max_size=4),
       levels=st.lists(st.floats(0, 1), max_size=3))
def test_placing_a_spread_change_keeps_it_apart_and_near(values: list[float],
                                                         picks: list[float],
                                                         levels: list[float]) -> None:
    """Whatever the runs (constant stretches, zeros, huge values): each spread change stays
    within `PLACE_RADIUS` runs of where it was found, inside the series, on its own side of
    every other change, and none is lost or merged."""
    y = np.asarray(values)
    n = len(y)
    found = sorted({int(10 + p * (n - 20)) for p in picks})
    level_cps = sorted({int(p * n) for p in levels} - set(found))
    placed = place_spread_changes(y, found, level_cps, 5)
    assert len(placed) == len(found)
    for before, after in zip(found, placed, strict=True):
        assert 0 < after < n and abs(after - before) <= PLACE_RADIUS
        assert not any(min(before, after) < c < max(before, after) or c == after
                       for c in (*level_cps, *(f for f in found if f != before)))


def test_a_wave_s_turns_are_seldom_regressions_and_a_step_on_it_is_still_caught() -> None:
    """Sine waves of 15-45 runs, 1.5-3 noise SDs, a history of 100 runs, every newest run
    judged: the wave at the newest runs is an extrapolation, so a periodic history needs
    `periodic_verdict_extra_z` more standard errors for a regression. Measured on these
    draws: 16 false regressions of 1 600 verdicts at the plain bar, 5 with it; a 6-SD drop
    on the wave is flagged (suspect or regression) within 6 runs in all 40 either way."""
    rng = np.random.default_rng(4343)
    false = caught = 0
    for _ in range(40):
        n, period, amplitude = 140, rng.uniform(15, 45), rng.uniform(1.5, 3.0)
        t = np.arange(n)
        values = 100 + amplitude * np.sin(2 * np.pi * (t / period + rng.random())) + \
            rng.normal(0, 1, n)
        false += sum(verdict(list(values[q - 100:q]), float(values[q]), "higher_better").kind
                     == "regression" for q in range(100, n))
        dropped = values.copy()
        dropped[120:] -= 6
        caught += any(verdict(list(dropped[q - 100:q]), float(dropped[q]),
                              "higher_better").kind in ("regression", "suspect")
                      for q in range(120, 126))
    assert false <= 9, false
    assert caught == 40, caught


def test_a_low_staircase_keeps_each_step_on_its_own_evidence() -> None:
    """Three same-sign steps of 1.2-2 noise SDs, 30-80 runs apart: a line through them
    explains the series almost as well, and when the line won every step went with it (all
    three or none). Measured on these draws: with each model's parameters at the
    segmentation's full penalty (``drift_choice_weight`` 1), 13 of 60 staircases lost every
    step and 135 of 180 steps were found; at the default 0.5, 4 and 159."""
    rng = np.random.default_rng(4041)
    lost = found = 0
    for _ in range(60):
        gaps = [int(rng.integers(30, 81)) for _ in range(4)]
        steps = [int(c) for c in np.cumsum(gaps[:3])]
        level = np.full(sum(gaps), 100.0)
        sign = rng.choice([-1.0, 1.0])
        for c in steps:
            level[c:] += sign * rng.uniform(1.2, 2.0)
        cps = change_points(list(level + rng.normal(0, 1, len(level))))
        hits = sum(any(abs(x - c) <= 3 for x in cps) for c in steps)
        lost += hits == 0
        found += hits
    assert lost <= 8, lost
    assert found >= 150, found


def test_a_regression_fixed_a_few_runs_later_is_two_change_points() -> None:
    """2-4 runs at 6-12 sigma, then the level back: its first run and the first run after.
    The segmentation needs 5 runs a side and its shield took two such runs for outliers
    (long probe, class ``fixed``: every two-run one missed). A rate, not every draw: the
    test is statistical (measured: 4 % of 6-sigma ones missed, 1 % of 8-sigma ones, where
    the series' noise reads low or a chance far-out run lies near)."""
    rng = np.random.default_rng(2026)
    found_both = 0
    draws = 150
    for _ in range(draws):
        n, length = int(rng.integers(60, 900)), int(rng.integers(2, 5))
        values = 100 + rng.normal(0, 1, n)
        start = int(rng.uniform(0.1, 0.9) * (n - 40)) + 20
        values[start:start + length] += rng.choice([-1.0, 1.0]) * rng.uniform(6.0, 12.0)
        found = change_points(list(values))
        assert len(found) <= 3, found  # never more than its two and one chance level
        found_both += all(any(abs(c - bound) <= 1 for c in found)
                          for bound in (start, start + length))
    assert found_both >= 0.93 * draws, found_both


def test_heavy_tailed_or_clumped_noise_makes_no_excursions() -> None:
    """Runs far out come often, and together, in heavy-tailed (Student t, 2-4 degrees of
    freedom) and autocorrelated noise: the excursion test reads how often from the series
    itself, so their chance clumps are not regressions fixed later (counted: series given
    more change points by the excursion test; in autocorrelated noise it may still place
    the segmentation's false short levels more tightly)."""
    rng = np.random.default_rng(11)
    off = DetectorSettings(excursion_z=math.inf)
    changed = 0
    for i in range(60):
        n = int(rng.integers(100, 1000))
        if i % 2:
            noise = rng.standard_t(2 + i % 3, n)
        else:
            noise = np.empty(n)
            noise[0] = rng.normal()
            for k in range(1, n):  # AR(1), phi 0.6
                noise[k] = 0.6 * noise[k - 1] + rng.normal()
        series = list(100 + noise)
        changed += len(change_points(series)) > len(change_points(series, settings=off))
    assert changed <= 3, changed


def test_isolated_outliers_are_no_excursion() -> None:
    """Five lone runs at 8 sigma, each apart, in a flat series: no change point."""
    values = 100 + np.random.default_rng(3).normal(0, 1, 400)
    for spot in (50, 120, 121 + 40, 250, 330):
        values[spot] += 8.0
    assert change_points(list(values)) == []


def test_a_short_wave_with_a_step_is_one_level_change() -> None:
    """80-200 runs, a sine of at least 4 cycles (1.5-3 noise SDs) and a 4-10 SD step: the
    step is the one level change. The step spoils the wave's test (the moving-average trend
    smears it over a period), so the wave is looked for again without the largest step
    (measured on these 150 draws: 122 right without, 133 with)."""
    rng = np.random.default_rng(41)
    right = 0
    for _ in range(150):
        n = int(rng.integers(80, 200))
        period = rng.uniform(5, n / 4)
        t = np.arange(n)
        values = 100 + rng.uniform(1.5, 3) * np.sin(2 * np.pi * (t / period + rng.uniform()))
        values += rng.normal(0, 1, n)
        at = int(rng.integers(n // 4, 3 * n // 4))
        values[at:] += rng.choice([-1.0, 1.0]) * rng.uniform(4, 10)
        series = list(values)
        levels = sorted(set(change_points(series)) - set(spread_change_points(series)))
        right += len(levels) == 1 and abs(levels[0] - at) <= 2
    assert right >= 128, right


def test_a_bend_of_the_values_is_no_change_point() -> None:
    """A parabola of the values with additive noise (their range 10-100 noise SDs): no
    change point, in most series. Its logs are no parabola, and a bend's slope at an end is
    not its mean slope: the curve is also fitted to the values themselves, and the edge
    test extrapolates the slope of the runs near the edge (measured on these 30 draws:
    2.2 false change points a series before, 0.4 after)."""
    rng = np.random.default_rng(6)
    found = 0
    for _ in range(30):
        n = int(rng.integers(100, 500))
        t = np.arange(n)
        values = 50 + 0.2 * t - 0.0004 * t ** 2 * rng.uniform(0.5, 2) + rng.normal(0, 1, n)
        found += len(change_points(list(values)))
    assert found <= 15, found


def _smooth_curve(kind: int, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A smooth monotone curve over ``t`` in [0, 1], from 0 to about 1.

    A hyperbolic saturation, a tanh turn, a power or a logarithm: other formulas than the
    benchmark's probe draws (`benchmarks/regression/long_probe.py`).
    """
    if kind == 0:
        return 1 - 1 / (1 + t / rng.uniform(0.05, 0.3)) ** 2
    if kind == 1:
        return 0.5 + 0.5 * np.tanh((t - rng.uniform(0.3, 0.7)) / rng.uniform(0.1, 0.3))
    if kind == 2:
        return t ** rng.uniform(1.5, 3.0)
    tau = rng.uniform(0.02, 0.2)
    return np.log1p(t / tau) / np.log1p(1 / tau)


def test_a_smooth_trend_is_not_cut_into_a_staircase_and_a_step_on_it_is_found() -> None:
    """Saturating, tanh, power and logarithmic curves over 80-500 runs (a range of 10-40
    noise SDs): few change points, and a 5-10 SD step on such a curve is found within 2
    runs. A parabola could not follow them, and the levels read each as a staircase; a
    natural spline of 3-5 parameters beyond the level is now the curve beside the steps,
    fitted again beside the steps it needs (so it does not bend into a real one), the steps
    placed on the series less it. Measured on these draws, whose formulas the detector was
    not tuned on: 263 false change points on the 80 curves before, 47 after; steps found
    78 -> 80 of 80."""
    rng = np.random.default_rng(11)
    false = found = 0
    for i in range(80):
        n = int(rng.integers(80, 500))
        t = np.arange(n) / n
        values = 100 + rng.uniform(10, 40) * rng.choice([-1.0, 1.0]) * _smooth_curve(
            i % 4, t, rng) + rng.normal(0, 1, n)
        false += len(change_points(list(values)))
    for i in range(80):
        n = int(rng.integers(80, 500))
        t = np.arange(n) / n
        values = 100 + rng.uniform(10, 40) * rng.choice([-1.0, 1.0]) * _smooth_curve(
            i % 4, t, rng) + rng.normal(0, 1, n)
        at = int(rng.integers(n // 5, 4 * n // 5))
        values[at:] += rng.choice([-1.0, 1.0]) * rng.uniform(5, 10)
        found += any(abs(c - at) <= 2 for c in change_points(list(values)))
    assert false <= 100, false
    assert found >= 76, found


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.integers(0, 3), seed=st.integers(0, 100_000), n=st.integers(10, 500),
       scale=st.sampled_from([1e-9, 1e-3, 1.0, 1e6, 1e12]),
       noise=st.sampled_from([0.0, 1e-6, 0.01, 0.2]), amplitude=st.floats(-0.9, 5.0),
       step=st.floats(-0.5, 0.5), holes=st.integers(0, 5),
       direction=st.sampled_from(["higher_better", "lower_better"]))
def test_a_curve_at_any_scale_gives_ordered_change_points_and_a_verdict(
        kind: int, seed: int, n: int, scale: float, noise: float, amplitude: float,
        step: float, holes: int, direction: str) -> None:
    """Smooth curves of any size and noise (none included), a step or not, NaN holes:
    change points are increasing run indices inside the series, the verdict explains."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / n
    values = scale * (1 + amplitude * _smooth_curve(kind, t, rng)) * (
        1 + rng.normal(0, noise, n))
    values[int(rng.integers(1, n)):] *= 1 + step
    values[rng.integers(0, n, holes)] = math.nan
    assert_ordered_and_explained([float(v) for v in values], direction)


def test_noise_and_smooth_trends_are_not_periodic() -> None:
    """White noise, a line or a parabola, 100-500 runs: no wave. The sine candidate searched
    periods down to 2 runs, where a 2-3-run moving-average trend is a high-pass filter, and
    called 9 % of white-noise series periodic (18 of 200, waves of 2.0-4.2 runs)."""
    rng = np.random.default_rng(1)
    shapes = (lambda t: 0 * t, lambda t: 0.3 * t, lambda t: 0.5 * t - 0.6 * t ** 2)
    called = 0
    for i in range(150):
        n = int(rng.integers(100, 500))
        t = np.arange(n) / n
        called += seasonality(shapes[i % 3](t) + rng.normal(0, 0.01, n)) is not None
    assert called <= 4, called
