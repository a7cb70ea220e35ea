"""Does a vote of detectors find change points better than Telltale's detector alone? (#41)

    python benchmarks/regression/ensemble.py [--count 20] [--tune-seed 1] [--test-seed 2]

Three detectors, each a different idea of a change:

- **telltale**: `analysis.regression.change_points` (penalised least squares on the log
  scale, each step validated on its own evidence; levels and spreads).
- **rank**: a robust-cost segmentation: the same exact penalised least-squares partition
  (`analysis.segmentation._segment`) on the series' *ranks*, so tails and outliers weigh no
  more than any other run (the cost of a rank-based CUSUM); the noise scale is that of
  uniform ranks. Its penalty multiplier is tuned.
- **window**: a windowed two-sample test: at each run, the Mann-Whitney z of the ``w`` runs
  before against the ``w`` runs after (``w`` = 10), local maxima of ``|z|`` at least ``w``
  runs apart above a tuned threshold.

Votes tried: each detector alone, ``2 of 3`` (a change point kept where at least two
detectors put one within ±2 runs, at the telltale's place when it has one), and
``telltale confirmed`` (telltale's points, each kept only when another detector agrees), and
``telltale or both`` (telltale's points plus those both others agree on). Scored with `run.score_whole` (F1 at ±2 runs).

Leave-one-family-out, as in `families_run.py`: the thresholds of ``rank`` and ``window``
(a grid) are chosen for each vote on the *other* families with the tuning seed, then the
vote is scored on the held-out family drawn with the test seed. The table is in
docs/performance.md ("An ensemble where it pays"); the vote is kept in the detector only if
it beats ``telltale`` alone there.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from families import FAMILIES, draw  # noqa: E402
from generate import Series  # noqa: E402
from run import score_whole  # noqa: E402

from analysis.regression import DEFAULTS, change_points  # noqa: E402
from analysis.segmentation import _segment  # noqa: E402

WINDOW = 10
RANK_GRID = (0.75, 1.0, 1.5)  # multiplier of the rank segmentation's penalty
WINDOW_GRID = (3.0, 3.5, 4.0)  # |z| threshold of the windowed test
TOLERANCE = 2


def rank_points(values: Sequence[float], multiplier: float) -> list[int]:
    """Change points of the exact penalised partition of the series' ranks."""
    y = np.asarray(values, dtype=float)
    y = y[np.isfinite(y)]
    if len(y) < 2 * DEFAULTS.min_size:
        return []
    ranks = (np.argsort(np.argsort(y)) + 0.5) / len(y)
    sigma = 1 / math.sqrt(12)  # uniform ranks' standard deviation
    penalty_z = DEFAULTS.candidate_z * multiplier
    settings = DEFAULTS.__class__(**{**DEFAULTS.__dict__, "candidate_z": penalty_z})
    return _segment(ranks, sigma, settings)


def window_points(values: Sequence[float], threshold: float) -> list[int]:
    """Local maxima of the Mann-Whitney |z| of ``WINDOW`` runs before vs after each run."""
    y = np.asarray(values, dtype=float)
    y = y[np.isfinite(y)]
    n, w = len(y), WINDOW
    if n < 2 * w:
        return []
    z = np.zeros(n)
    mean, sd = w * w / 2, math.sqrt(w * w * (2 * w + 1) / 12)
    for t in range(w, n - w + 1):
        before, after = y[t - w:t], y[t:t + w]
        u = (after[:, None] > before[None, :]).sum() + 0.5 * (
            after[:, None] == before[None, :]).sum()
        z[t] = (u - mean) / sd
    size = np.abs(z)
    out: list[int] = []
    for t in np.argsort(-size):
        if size[t] < threshold:
            break
        if all(abs(int(t) - o) >= w for o in out):
            out.append(int(t))
    return sorted(out)


def agree(points: Sequence[int], others: Sequence[int]) -> list[int]:
    """The ``points`` with one of ``others`` within the tolerance."""
    return [p for p in points if any(abs(p - o) <= TOLERANCE for o in others)]


def merge(points: Sequence[int]) -> list[int]:
    """Sorted points, a point within the tolerance of an earlier one dropped."""
    out: list[int] = []
    for p in sorted(points):
        if not out or p - out[-1] > TOLERANCE:
            out.append(p)
    return out


Votes = Callable[[list[int], list[int], list[int]], list[int]]
VOTES: dict[str, Votes] = {
    "telltale": lambda t, r, w: t,
    "rank": lambda t, r, w: r,
    "window": lambda t, r, w: w,
    "2 of 3": lambda t, r, w: merge([*agree(t, [*r, *w]), *agree(r, w)]),
    "telltale confirmed": lambda t, r, w: agree(t, [*r, *w]),
    "telltale or both": lambda t, r, w: merge([*t, *agree(r, w)]),
}


def _points(job: tuple[list[Series], float, float]) -> list[tuple[list[int], list[int],
                                                                  list[int]]]:
    series, rank_m, window_z = job
    return [(change_points(s.values, s.direction),  # type: ignore[arg-type]
             rank_points(s.values, rank_m), window_points(s.values, window_z))
            for s in series]


def f1_by_family(sets: dict[str, list[Series]], pool: ProcessPoolExecutor
                 ) -> dict[tuple[float, float], dict[str, dict[str, float]]]:
    """F1 of every vote, per family, for each grid point (rank multiplier, window z)."""
    grid = list(itertools.product(RANK_GRID, WINDOW_GRID))
    jobs = [(sets[f], m, z) for m, z in grid for f in sets]
    found = iter(pool.map(_points, jobs))
    out: dict[tuple[float, float], dict[str, dict[str, float]]] = {}
    for point in grid:
        out[point] = {}
        for family, series in sets.items():
            detected = next(found)
            out[point][family] = {
                vote: score_whole(series, [rule(*d) for d in detected]).f1
                for vote, rule in VOTES.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--tune-seed", type=int, default=1)
    parser.add_argument("--test-seed", type=int, default=2)
    args = parser.parse_args()
    tune = {f: draw(f, args.count, args.tune_seed) for f in FAMILIES}
    test = {f: draw(f, args.count, args.test_seed) for f in FAMILIES}
    with ProcessPoolExecutor() as pool:
        tuned = f1_by_family(tune, pool)
        tested = f1_by_family(test, pool)
    print(f"leave-one-family-out F1 (±{TOLERANCE} runs), {args.count} series per family; "
          f"grid point chosen on the other families (seed {args.tune_seed}), scored on "
          f"seed {args.test_seed}")
    print(f"{'family':<12} " + " ".join(f"{v:>20}" for v in VOTES))
    held: dict[str, list[float]] = {v: [] for v in VOTES}
    for family in FAMILIES:
        cells = []
        for vote in VOTES:
            def others(point: tuple[float, float], vote: str = vote,
                       family: str = family) -> float:
                return float(np.mean([x[vote] for f, x in tuned[point].items()
                                      if f != family]))
            point = max(tuned, key=others)
            score = tested[point][family][vote]
            held[vote].append(score)
            cells.append(f"{score:20.3f}")
        print(f"{family:<12} " + " ".join(cells))
    print(f"{'mean':<12} " + " ".join(f"{np.mean(held[v]):20.3f}" for v in VOTES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
