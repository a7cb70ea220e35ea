"""Run an E-Divisive anchor over many series, inside that anchor's own venv.

    <venv>/bin/python anchors.py otava|spa IN.json OUT.json

IN.json is a list of series (lists of floats); OUT.json the list of change-point index lists.
Anchors and their settings (the field's standard where the library allows it):

- ``otava``: apache-otava ``compute_change_points`` (E-Divisive means with a t-test),
  window 50, p <= 0.001, magnitude >= 5 %;
- ``spa``: MongoDB signal-processing-algorithms ``e_divisive`` (permutation test) at its
  defaults (p 0.05, 100 permutations), then the 5 % magnitude filter the field applies.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def _otava(values: list[float]) -> list[int]:
    from otava.analysis import compute_change_points

    points, _ = compute_change_points([float(v) for v in values], window_len=50,
                                      max_pvalue=0.001, min_magnitude=0.05)
    return sorted(int(p.index) for p in points)


def _spa(values: list[float]) -> list[int]:
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    series = np.asarray(values, dtype=float)
    found = sorted(int(c) for c in e_divisive(series, pvalue=0.05, permutations=100))
    kept = []
    bounds = [0, *found, len(series)]
    for i, c in enumerate(found):
        before = series[bounds[i]:c].mean()
        after = series[c:bounds[i + 2]].mean()
        if before and abs(after - before) / abs(before) >= 0.05:
            kept.append(c)
    return kept


def main() -> int:
    method, source, target = sys.argv[1:4]
    detect = {"otava": _otava, "spa": _spa}[method]
    with open(source) as stream:
        series = json.load(stream)
    out = []
    for values in series:
        try:
            out.append(detect(values) if len(values) >= 4 else [])
        except Exception as exc:  # an anchor failure counts as "no change point found"
            print(f"{method}: {type(exc).__name__}: {exc}", file=sys.stderr)
            out.append([])
    with open(target, "w") as stream:
        json.dump(out, stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
