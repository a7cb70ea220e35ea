"""The detector with numpy's BLAS on one thread against its default (a thread a core).

    python benchmarks/regression/blas_threads.py [--repeat 3] [--busy 1] [--runs 816]

A smooth monthly series (816 runs: a growth whose rate wanders, a yearly pattern, small
noise; the shape whose curve and walk fits make the most and largest QR calls: it is cut
into ~75 levels, which the curve is fitted beside) segmented by
`analysis.regression.change_points`, quiet and beside ``--busy`` processes doing numpy's
linear algebra on their default threads, as the suite's other workers or a second analysis
do (bounded: each stops by itself after 120 s, and is stopped when the figures are taken). Prints the
best time of each and the ratio; `analysis.blas` explains the choice.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from analysis.blas import _numpy_blas, numpy_blas_threads  # noqa: E402
from analysis.regression import change_points  # noqa: E402

# A neighbour as the suite's other workers are: numpy's linear algebra on its default threads
BUSY = ("import time\nimport numpy as np\nx = np.random.default_rng(0).random((800, 60))\n"
        "end = time.monotonic() + 120\nwhile time.monotonic() < end: np.linalg.qr(x)\n")


def smooth_monthly(n: int = 816, seed: int = 5) -> list[float]:
    """A population-like series: growth at a slowly wandering rate, a yearly wave, noise."""
    rng = np.random.default_rng(seed)
    rate = 2e-3 + np.cumsum(rng.normal(0, 1e-4, n))
    wave = 1e-4 * np.sin(2 * np.pi * np.arange(n) / 12)
    return list(np.exp(np.log(1.5e8) + np.cumsum(rate) + wave + rng.normal(0, 1e-4, n)))


def best(values: list[float], threads: int, repeat: int) -> float:
    """The best of ``repeat`` segmentations with numpy's BLAS on ``threads`` threads."""
    for controller in _numpy_blas():
        controller.set_num_threads(threads)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        change_points(values)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside it")
    parser.add_argument("--runs", type=int, default=816,
                        help="the series' length (816: the case the figures are read on)")
    args = parser.parse_args()
    if not numpy_blas_threads():
        print("numpy links no BLAS of its own here: nothing to compare")
        return 0
    values = smooth_monthly(args.runs)
    print(f"change points found: {len(change_points(values))}")
    default = max(2, len(__import__('os').sched_getaffinity(0)))
    quiet = {t: best(values, t, args.repeat) for t in (default, 1)}
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    try:
        loaded = {t: best(values, t, args.repeat) for t in (default, 1)}
    finally:
        for process in busy:
            process.kill()
            process.wait()
    for what, figures in (("quiet", quiet), (f"beside {args.busy} busy", loaded)):
        print(f"{what:14s}: {default} BLAS threads {figures[default]:7.3f} s, one "
              f"{figures[1]:7.3f} s (x{figures[1] / figures[default]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
