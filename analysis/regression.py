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

Short excursions (``excursion_z``)
----------------------------------
A regression fixed two to four runs after it landed is too short for a segment and, from
two runs, not one outlier. `change_points` adds each such excursion's first run and the
first run after it (`analysis.excursions`): every run ``excursion_z`` (3.5) noise units on
one side of the level around it, the level back after it, and noise alone unlikely to make
one as long (``excursion_alpha``: read from how often the series' own runs are that far
out, so heavy tails, mixtures, clumped or noisier stretches are not excursions). A spread
change and an excursion a few runs apart are told apart by measuring the spread again
without the excursion's runs. The verdict's levels do not include them.

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
and fewer steps explain the series better than steps alone; a series cut into steps is
tested again without its largest step, which spoils the wave's test), ``drift`` when the baseline
follows a significant drift.

Operating point: chosen on the independently designed generator families of
``benchmarks/regression/families.py`` by the false-alarm budget (at most 1 % false alarms
per stable run), spent on recall: ``verdict_z`` 2.4 (with the small-sample widening of the
noise scale), ``confirm_factor`` 0.5, ``suspect_z`` 2.7 (at most 3 % of stable runs
suspected), ``edge_z`` 4.5 (down to 0.7 x in short series), ``z_threshold`` and
``candidate_z`` 4.5, no minimum change. docs/performance.md
has the leave-one-family-out table.

Parameters are keyword arguments with documented defaults; results are deterministic.

This module holds the public entry points (`change_points`, `verdict`) and the verdict's
decision; the statistics live in `analysis.detector`, `segmentation`, `spread`,
`seasonality` and `excursions`, the explanation's numbers in `analysis.verdict_text`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from analysis.construct import constructor
from analysis.correlated import noise_correlation
from analysis.detector import (
    DEFAULTS,
    MAX_ABS,
    DetectorSettings,
    _expm1,
    _finite,
    _normal_confidence,
    _relative,
    _Shift,
    _tail_shifts,
    noise_scale,
    pooled_noise,
    usable,
    usable_repeats,
)
from analysis.exact import exact_steps
from analysis.excursions import excursions
from analysis.seasonality import MAX_PERIOD, Seasonality, deseasonalised, seasonality
from analysis.segmentation import _explains_better, _levels, _steps
from analysis.spread import SPREAD_WINDOW, _spread_changes, place_spread_changes
from analysis.verdict_text import above, below, spread_text

__all__ = [
    "DEFAULTS",
    "Direction",
    "DetectorSettings",
    "Verdict",
    "NEWS",
    "VerdictKind",
    "change_points",
    "spread_change_points",
    "noise_scale",
    "pooled_noise",
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
    period: float | None = Field(default=None, description="periodic: runs per cycle (a "
                                 "sine wave's need not be a whole number).")
    slope_pct: float | None = Field(default=None, description="drift: % of the level per run.")
    explanation: str = Field(description="One sentence a human can check.")


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
    shapes = _shapes(values, direction, settings, short=True)
    if shapes is None:
        return []
    index, levels, spreads, _ = shapes
    return sorted({int(index[t]) for t in (*levels, *spreads)})


def spread_change_points(values: Sequence[float], direction: Direction = "higher_better", *,
                         settings: DetectorSettings = DEFAULTS) -> list[int]:
    """The indices where a new spread starts (a subset of `change_points`')."""
    shapes = _shapes(values, direction, settings, short=True)
    return [int(shapes[0][t]) for t in shapes[2]] if shapes is not None else []


def _shapes(values: Sequence[float], direction: Direction, settings: DetectorSettings,
            *, spreads: bool = True, short: bool = False
            ) -> tuple[np.ndarray, list[int], list[int], Seasonality | None] | None:
    """(finite positions, level changes, spread changes, the wave) of a series.

    None: too short or constant. Changes are positions in the finite values. ``short``:
    the level changes include each short excursion's two bounds (`analysis.excursions`);
    a verdict's levels do not (its newest runs are the suspect's question, and a level of
    two runs is no baseline).
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
    exact = exact_steps(y, settings.min_size)
    if exact is not None:  # no noise: its levels change where its value does
        return index, exact, [], None
    season = seasonality(y) if settings.periodic else None
    levels, sigma, stairs = _levels(deseasonalised(y, season), settings, log_scale)
    if season is None and settings.periodic and (len(stairs) >= 2 or stairs != levels):
        # A step between two stretches of a wave spoils the wave's test (the moving-average
        # trend smears it over a period): cut into steps (or read as a walk, one step or
        # more: a wave's residuals are a walk's too), the wave is looked for again without
        # its largest step (long probe, wave and a step, 50-136 runs: 3 of 5 cut)
        season = seasonality(_without_largest_step(y, stairs))
        if season is not None:
            levels, sigma, _ = _levels(deseasonalised(y, season), settings, log_scale)
    if season is not None:
        # An evenly spaced staircase looks periodic too (steps less a moving average are a
        # sawtooth): the wave must explain the series better than the steps alone do, its
        # phases costing what BIC charges a parameter
        steps = _steps(y, settings, log_scale)
        if _explains_better(y, steps, levels, season, sigma, settings):
            y = deseasonalised(y, season)
        else:
            # a wave is there, though steps explain more: its crests are no excursions
            levels, season, short = _steps(y, settings, log_scale, correlated=True), None, False
    brief: list[int] = []
    if short:
        levels, brief = excursions(y, levels, sigma, settings)
    found = _spread_changes(y, levels, settings, sigma) if spreads else []
    if brief and found:
        # An excursion's wide differences can read as a spread change a few runs off, and
        # a new spread's far-out runs as an excursion: the spread is measured again with
        # the excursions' runs replaced by their neighbours', and an excursion within
        # 2 x min_size runs of a spread change that is still there is that spread's.
        pairs = list(zip(brief[::2], brief[1::2], strict=True))
        found = _spread_changes(_calmed(y, pairs), levels, settings, sigma)
        near = 2 * settings.min_size
        brief = [c for a, b in pairs if all(min(abs(a - f), abs(b - f)) >= near
                                            for f in found) for c in (a, b)]
    # found on the differences' rank scores, each is placed again on the runs themselves
    found = place_spread_changes(y, found, levels, settings.min_size)
    return index, sorted({*levels, *brief}), found, season


def _calmed(y: np.ndarray, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """``y`` with each excursion ``[a, b)`` replaced by the runs around it.

    Before, then after: each side has at least 3 runs and an excursion at most 4.
    """
    out = y.copy()
    for a, b in pairs:
        out[a:b] = np.concatenate([y[max(0, a - (b - a)):a], y[b:b + (b - a)]])[:b - a]
    return out


def _without_largest_step(y: np.ndarray, levels: Sequence[int]) -> np.ndarray:
    """``y`` less the step at the one of ``levels`` that is largest over wide windows.

    Over up to ``MAX_PERIOD`` runs a side a wave averages out, so the cuts a segmentation
    made along its crests measure small there and a real step measures whole.
    """
    n = len(y)

    def step(c: int) -> float:
        w = max(1, min(MAX_PERIOD, c, n - c))
        return float(np.mean(y[c:c + w]) - np.mean(y[c - w:c]))

    c = max(levels, key=lambda c: abs(step(c)) * math.sqrt(min(MAX_PERIOD, c, n - c)))
    out = y.copy()
    out[c:] -= step(c)
    return out


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
        return _too_short(latest, sum(map(usable, history)), False, settings)
    repeats = usable_repeats(latest)
    h, index = _finite(history)
    first = int(np.searchsorted(index, accepted)) if accepted is not None else 0
    if len(repeats) == 0 or len(h) - first < settings.min_history:
        return _too_short(repeats, len(h) - first, bool(first), settings)
    value = _middle(repeats.tolist())
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
        # judged against the wave: the history and the newest run less their phase of it,
        # at a higher bar (the wave at the newest runs is extrapolated, an error the shift's
        # standard error leaves out: `periodic_verdict_extra_z`)
        h = deseasonalised(h, season)
        repeats = repeats - season.at(len(h))
        settings = replace(settings,
                           verdict_z=settings.verdict_z + settings.periodic_verdict_extra_z)
    else:
        season = None
    shifts = _tail_shifts(h, repeats, settings, levels, first, log_scale,
                          ar=noise_correlation(h, levels))
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
                                f"grew {after / before:.1f}x ({spread_text(before, log_scale)}"
                                f" -> {spread_text(after, log_scale)} {unit}".rstrip()
                                + f") {len(y) - c} run(s) ago, at a steady level")})
    if season is not None:
        amplitude = _expm1(season.amplitude) * 100 if log_scale else (
            _relative(season.amplitude, abs(newest.baseline)) * 100)
        return judged.model_copy(update={
            "kind": "periodic", "period": round(float(season.period), 2),
            "explanation": (f"{judged.explanation}; periodic: a wave of {season.period:.3g} runs "
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


def _middle(values: Sequence[float]) -> float:
    """The median of a run's usable repeats, in plain Python (short histories skip NumPy).

    `usable` repeats cannot overflow their sum. Not halves summed: two halved subnormal
    repeats (5e-324) made 0, whose log failed.
    """
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _too_short(latest: float | Sequence[float] | np.ndarray, used: int, since_accepted: bool,
               s: DetectorSettings) -> Verdict:
    """The verdict of a run without enough history (or without a usable value)."""
    given = [latest] if isinstance(latest, (int, float)) else list(latest)
    values = [float(x) for x in given if usable(x)]
    if not values:
        return _insufficient(0, None, "the newest run has no usable value (none finite and "
                                      f"within ±{MAX_ABS:g})")
    return _insufficient(int(used), _middle(values),
                         f"{used} historical point(s)"
                         f"{' since the accepted baseline' if since_accepted else ''}; "
                         f"{s.min_history} needed")


_new_verdict = constructor(Verdict)


def _insufficient(used: int, latest: float | None, explanation: str) -> Verdict:
    """An ``insufficient_history`` verdict, constructed: every value is typed here.

    A first post-processing of a tree judges every KPI of every run this way (5 000
    verdicts for 1 000 runs): validating each cost ~13 ms of a 1 s command.
    """
    return _new_verdict(kind="insufficient_history", magnitude=0.0, confidence=0.0,
                        baseline=None, latest=latest, history_used=used, suspect=False,
                        start_runs=None, spread_before=None, spread_after=None, period=None,
                        slope_pct=None, explanation=explanation)


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
                       f"baseline {shown(shift.baseline):.4g} ({above(z)} noise SE; "
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
                             f"({above(abs(first_z))} SE for one run; {s.suspect_z:g} "
                             "needed); a re-run of this configuration confirms it "
                             "(analysis.confirm_reruns) or the next run will"))
        listed = ", ".join(f"{shown(x):.4g}" for x in repeats[1:6])
        return Verdict(
            kind="outlier", magnitude=float(first_mag),
            confidence=round(confidence, 4), baseline=shown(reference),
            latest=value, history_used=newest.history_used,
            explanation=(f"{first_mag * 100:+.1f}%: outlier ({side}): the run alone; its "
                         f"{len(repeats) - 1} re-run(s) ({listed}) are not: no change "
                         f"({below(abs(newest.z))} SE for the repeats together; "
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
                  f"({below(abs(newest.z))} SE for the cautious level; {s.verdict_z:g} "
                  "needed)")
    else:
        reason = f"within the noise ({below(abs(newest.z))} SE; {s.verdict_z:g} needed)"
    explanation = (f"{magnitude * 100:+.1f}%: {value:.4g} vs baseline "
                   f"{shown(newest.baseline):.4g}: "
                   f"{reason}")
    return Verdict(kind="no_change", magnitude=float(magnitude),
                   confidence=round(confidence, 4), baseline=shown(newest.baseline),
                   latest=value,
                   history_used=newest.history_used, explanation=explanation)
