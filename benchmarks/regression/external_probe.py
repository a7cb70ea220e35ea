"""Change points on the human-labelled series of ``../shared/bench/regression/external``.

    python benchmarks/regression/external_probe.py [--per-series]

The TCPD split (Turing change-point dataset: 26 non-performance series with trends and
seasons, five annotators each) that sits beside the repository when the workplace provides
it; absent, the script says so and exits 0. Scored as TCPD scores it (van den Burg and
Williams, 2020): the first run counts as a change point for the detector and for every
annotator, a detection within 5 runs of an annotation is a hit (each used once); precision
against the annotators' union, recall the mean of each annotator's; F1 averaged over the
series. Also the F1 on the split's required change points (two annotators or more), within 5
runs and within 2 (the families' tolerance).

It measures; nothing is tuned on it (issue #41: tune for the classes, not for a dataset).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import read_beside, series_rows  # noqa: E402

from analysis.regression import change_points  # noqa: E402

ROOT = Path(__file__).resolve().parents[3] / "shared" / "bench" / "regression" / "external"
MARGIN = 5


def _hits(truth: list[int], found: list[int], margin: int = MARGIN) -> int:
    """Annotations with a detection within ``margin`` runs, each detection used once."""
    used: set[int] = set()
    hits = 0
    for t in truth:
        near = [f for f in found if abs(f - t) <= margin and f not in used]
        if near:
            used.add(min(near, key=lambda f: abs(f - t)))
            hits += 1
    return hits


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def tcpd_f1(annotations: list[list[int]], found: list[int]) -> float:
    """TCPD's F1 of ``found`` against each annotator's change points (0 added to all)."""
    found = sorted({0, *found})
    annotators = [sorted({0, *a}) for a in annotations] or [[0]]
    union = sorted({c for a in annotators for c in a})
    precision = _hits(found, union) / len(found)
    recall = sum(_hits(a, found) / len(a) for a in annotators) / len(annotators)
    return _f1(precision, recall)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-series", action="store_true")
    args = parser.parse_args()
    if not (ROOT / "tcpd_labels.json").exists():
        print(f"no external series at {ROOT}: nothing to measure")
        return 0
    labels = json.loads(read_beside(ROOT / "tcpd_labels.json"))["series"]
    values = series_rows(read_beside(ROOT / "tcpd_series.csv.gz"))
    scores, required_f1, close_f1 = [], [], []
    total_found, seconds = 0, 0.0
    for name, series in values.items():
        meta = labels[name]
        start = time.perf_counter()
        found = change_points(series)
        seconds += time.perf_counter() - start
        total_found += len(found)
        score = tcpd_f1(list(meta.get("annotations", {}).values()), found)
        required = [c["index"] if isinstance(c, dict) else c for c in meta["change_points"]]
        for margin, kept in ((MARGIN, required_f1), (2, close_f1)):
            hits = _hits(required, found, margin)
            precision = hits / len(found) if found else 1.0
            recall = hits / len(required) if required else 1.0
            kept.append(_f1(precision, recall))
        scores.append(score)
        if args.per_series:
            print(f"{name:28s} n {len(series):4d} required {len(required):2d} found "
                  f"{len(found):3d}  TCPD F1 {score:.3f}")
    print(f"{len(scores)} series: TCPD F1 {sum(scores) / len(scores):.3f}, F1 on the required "
          f"change points {sum(required_f1) / len(required_f1):.3f} (within 2 runs: "
          f"{sum(close_f1) / len(close_f1):.3f}), change points found "
          f"{total_found}, {seconds * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
