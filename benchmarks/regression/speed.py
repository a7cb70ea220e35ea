"""How long `change_points` and `verdict` take per series length (the 1 000-point budget is
20 ms: issue #41).

    python benchmarks/regression/speed.py [--repeat 20] [--lengths 100,300,1000,5000]

Prints the median time of each step of `change_points` (the periodic test, the levels, the
spread changes) and of a whole verdict, for stable series (the worst case of the
segmentation: PELT prunes little) and for series with two steps and a wave.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from analysis import regression, segmentation, spread  # noqa: E402
from analysis.seasonality import seasonality  # noqa: E402


def _median_ms(call: Callable[[], object], repeat: int) -> float:
    call()  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--lengths", default="100,300,1000,5000",
                        help="series lengths, comma-separated")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'series':<16} {'n':>5} {'periodic':>9} {'levels':>8} {'spreads':>8} "
          f"{'change_points':>14} {'verdict':>8}  (ms, median of {args.repeat})")
    for n in (int(text) for text in args.lengths.split(",")):
        stable = 100 * np.exp(rng.normal(0, 0.02, n))
        shaped = stable * np.exp(0.03 * np.sin(2 * np.pi * np.arange(n) / 12))
        shaped[n // 3:] *= 0.9
        shaped[2 * n // 3:] *= 1.15
        for name, values in (("stable", stable), ("steps + wave", shaped)):
            y = np.log(values)
            levels, sigma, _stairs = segmentation._levels(y, regression.DEFAULTS, True)
            figures = [
                _median_ms(lambda y=y: seasonality(y), args.repeat),
                _median_ms(lambda y=y: segmentation._levels(y, regression.DEFAULTS, True),
                           args.repeat),
                _median_ms(lambda y=y, lv=levels, sg=sigma: spread._spread_changes(
                    y, lv, regression.DEFAULTS, sg), args.repeat),
                _median_ms(lambda v=values: regression.change_points(v), args.repeat),
                _median_ms(lambda v=values: regression.verdict(v[:-1][-500:], v[-1],
                                                               "higher_better"), args.repeat),
            ]
            print(f"{name:<16} {n:>5} " + " ".join(f"{f:>{w}.1f}" for f, w in zip(
                figures, (9, 8, 8, 14, 8), strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
