"""Short excursions: a level held for 2 to ``min_size - 1`` runs, then undone.

The segmentation needs ``min_size`` runs a side, and its outlier shield takes a two-run
excursion for two outliers, so a regression fixed two to four runs after it landed was
missed (measured on the long probe: every two-run one, most three-run ones) or, at three or
four runs, cut as a ``min_size``-run segment whose end lands one or two runs late.

A run of consecutive runs, all beyond ``excursion_z`` noise units on the same side of the
level around them (read from up to ``_SIDE`` runs before and after), is an excursion when
noise alone would rarely make one as long: the expected number of such runs by chance,
``n * (p / 2) ** L`` with ``p`` the share of single runs that far out elsewhere in the
series (or within ``_NEAR`` runs of it, when they clump there), stays under
``excursion_alpha``. Reading ``p`` from the series itself is what keeps heavy tails,
mixtures, correlated noise and noisier stretches (whose far-out runs are common, and come
together) from reading as excursions; a pseudo-count keeps a short series from claiming
``p = 0``. A series with a wave that steps explain better is not searched (its crests are
excursions of a kind). The verdict's levels do not include them
(`analysis.regression.change_points` does).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from analysis.detector import DetectorSettings
from analysis.segmentation import _local_sigma, levels_rss

__all__ = ["excursions"]

_SIDE = 20
"""Runs read on each side of an excursion for the level around it (fewer near an end or a
level change more than ``min_size`` runs away)."""
_NEAR = 50
"""Runs a side over which an excursion's chance is also read (a noisier stretch's own)..."""
_CLUMP = 3
"""...when at least this many runs there are beyond ``excursion_z``."""
_MIN_SIDE = 3
"""An excursion needs at least this many runs of its level on each side."""


def excursions(y: np.ndarray, levels: Sequence[int], sigma: float, s: DetectorSettings
               ) -> tuple[list[int], list[int]]:
    """(level changes, excursion bounds) of ``y`` once its short excursions are known.

    ``levels`` are the segmentation's change points. Those within ``min_size`` runs of an
    excursion were where the segmentation could place its nearest level (or a noisy short
    series' reading of it): the excursion's level holds on both sides, so they give way to
    its own bounds, unless two excursions claim one (a level of its own, with a dip). Each
    excursion gives two change points: its first run and the first run after it.
    """
    n = len(y)
    if (not math.isfinite(s.excursion_z) or s.min_size <= 2 or sigma <= 0
            or n < 2 * _MIN_SIDE + 2):
        return list(levels), []
    # the levels around a short segment are measured without it: it may be the excursion
    short = {c for a, b in itertools.pairwise(levels) if b - a < 2 * s.min_size
             for c in (a, b)}
    bounds = [0, *(c for c in levels if c not in short), n]
    fit = np.empty(n)
    for a, b in itertools.pairwise(bounds):
        fit[a:b] = np.median(y[a:b])
    z = (y - fit) / sigma
    beyond = np.abs(z) >= s.excursion_z
    found: list[tuple[int, int, list[int]]] = []  # start, end, the levels it replaces
    for start, length in _same_sign_runs(z, beyond):
        if not 2 <= length < s.min_size:
            continue
        end = start + length
        lo = max((c for c in levels if c <= start - s.min_size), default=0)
        hi = min((c for c in levels if c >= end + s.min_size), default=n)
        near = [c for c in levels if lo < c < hi]
        if _undone(y, start, end, lo, hi, sigma, s.excursion_z, moved=bool(near)) and (
                not near or levels_rss(y[lo:hi], [start - lo, end - lo])
                < levels_rss(y[lo:hi], [c - lo for c in near])):
            found.append((start, end, near))
    if not found:
        return list(levels), []
    outside = beyond.copy()
    for start, end, _ in found:
        outside[start:end] = False
    follow = _follow_rate(z, outside)
    accepted = [e for e in found
                if n * _chance(outside, e[0], e[1], follow) <= s.excursion_alpha]
    claims = Counter(c for _, _, near in accepted for c in near)
    accepted = [e for e in accepted if all(claims[c] == 1 for c in e[2])]
    replaced = {c for _, _, near in accepted for c in near}
    return ([c for c in levels if c not in replaced],
            sorted({c for start, end, _ in accepted for c in (start, end)}))


_FOLLOW_PRIOR = 10.0
"""Far-out runs' worth of belief that they come alone (`_follow_rate`): one chance pair in
a white series then moves a 2-run excursion's chance by a few times, not a hundred."""


def _follow_rate(z: np.ndarray, beyond: np.ndarray) -> float:
    """How often a far-out run is followed by another on its side (outside excursions).

    Autocorrelated noise puts its far-out runs together: a run of two or three there is
    common, and counting each run's chance as independent read them as excursions (4 of 30
    series with a lag-1 correlation of 0.6, once their false levels were gone). Shrunk
    towards the independent rate (half the share of far-out runs) by `_FOLLOW_PRIOR`.
    """
    count = int(np.count_nonzero(beyond[:-1]))
    single = (float(np.count_nonzero(beyond)) + 0.5) / len(beyond) / 2
    pairs = int(np.count_nonzero(beyond[:-1] & beyond[1:] & (np.sign(z[:-1]) == np.sign(z[1:]))))
    return (pairs + _FOLLOW_PRIOR * single) / (count + _FOLLOW_PRIOR)


def _chance(beyond: np.ndarray, start: int, end: int, follow: float = 0.0) -> float:
    """The chance that noise puts ``end - start`` runs in a row there, on one side.

    A single run's chance is the share of runs beyond ``excursion_z`` elsewhere
    (``beyond``, false over the excursions) in the series, or around the excursion
    (``_NEAR`` runs a side) when ``_CLUMP`` or more are there and their share is larger (a
    noisier stretch's runs); half of it for the side. Read at the excursion's least run's
    own distance instead, fewer runs are that far out, in a noisier stretch too few:
    measured, more false excursions in `hetero` and `outliers` series, none more found.
    Each run after the first has that chance, or ``follow`` when far-out runs clump
    (`_follow_rate`).
    """
    share = (float(np.count_nonzero(beyond)) + 0.5) / len(beyond)
    a, b = max(0, start - _NEAR), min(len(beyond), end + _NEAR)
    near = int(np.count_nonzero(beyond[a:b]))
    if near >= _CLUMP:  # one or two there are chance (one cost a fifth of 8-sigma ones)
        share = max(share, near / (b - a))
    single = share / 2
    return single * max(single, follow) ** (end - start - 1)


def _same_sign_runs(z: np.ndarray, beyond: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``beyond`` positions with one sign of ``z``."""
    marked = np.where(beyond, np.sign(z), 0.0)
    change = np.flatnonzero(np.diff(marked) != 0) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(z)]])
    return [(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True) if marked[a] != 0]


def _undone(y: np.ndarray, start: int, end: int, a: int, b: int, sigma: float,
            z: float, *, moved: bool) -> bool:
    """``y[start:end]`` is beyond ``z`` of one level that holds before and after it.

    The level and the noise are read from the runs on each side within ``[a, b)``; the
    noise is theirs when it is well above the series' (`_local_sigma`), so a noisier
    stretch's swings are measured against that stretch. ``moved``: the segmentation put a
    level change beside it, so the level must be shown to be the same on both sides (with
    none, the segmentation found it the same already).
    """
    before = y[max(a, start - _SIDE):start]
    after = y[end:min(b, end + _SIDE)]
    if len(before) < _MIN_SIDE or len(after) < _MIN_SIDE:
        return False  # an excursion still under way at an end is the verdict's question
    around = np.concatenate([before, after])
    local = _local_sigma(before, after, sigma)
    level = float(np.median(around))
    shift = (y[start:end] - level) / local
    if not (np.all(shift >= z) or np.all(shift <= -z)):
        return False
    # its neighbours are at the level (a wave's crest has its flanks raised, a real
    # excursion's are noise): the two runs on each side, their mean within 3 SE of it
    flanks = np.concatenate([before[-2:], after[:2]])
    if abs(float(np.mean(flanks)) - level) > 3 * local / math.sqrt(len(flanks)):
        return False
    if not moved:
        return True
    # the level came back: its two sides agree within the noise of their medians
    spread = local * 1.25 * math.sqrt(1 / len(before) + 1 / len(after))
    return abs(float(np.median(before)) - float(np.median(after))) <= 3 * spread
