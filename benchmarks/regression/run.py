"""Regression-detection benchmark: Telltale vs two E-Divisive implementations, side by side.

    python benchmarks/regression/run.py [--seeds 7,11,13] [--per-category 40] [--seq-series 90]
                                        [--no-anchors]

Set up the anchors once (each pins its own numpy, so each gets its own venv)::

    python3 -m venv benchmarks/.venvs/otava && benchmarks/.venvs/otava/bin/pip install apache-otava
    python3 -m venv benchmarks/.venvs/spa && benchmarks/.venvs/spa/bin/pip install signal-processing-algorithms

Two questions are scored on the labelled synthetic set (`generate.py`):

1. *Change points over a whole series*: precision, recall and F1 (a detection within ±2 runs of
   a true change point, one-to-one), the share of no-change series with any false change
   point, and the share of single outliers marked as change points (a detection within ±1).
2. *"Is the newest run a regression?"*, asked after every run (history = up to 100 previous
   runs): a "yes" inside ``[c, c+5)`` of a regression change point ``c`` is right; a
   regression is *flagged within 5 runs* when some "yes" falls there; every "yes" outside all
   change-point windows is a false alarm (per stable run). E-Divisive answers "yes" when it
   finds a change point in the last 5 runs of the window whose new level is worse.

The real series of ``../shared/bench/regression/real`` (when present) are scored on
question 1 as a sanity check. Timing: ``change_points`` on a 1 000-run series.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from generate import NO_CHANGE, Series, generate  # noqa: E402

from analysis.regression import change_points, verdict  # noqa: E402
from core.safeio import read_bounded  # noqa: E402

VENVS = REPO / "benchmarks" / ".venvs"
WINDOW = 5
SEQ_HISTORY = 100
SEQ_START = 8


def match(found: Sequence[int], truth: Sequence[int], tol: int = 2) -> int:
    """Count one-to-one matches of detections to true change points within ``tol``."""
    used: set[int] = set()
    hits = 0
    for t in truth:
        best = None
        for i, f in enumerate(found):
            if i not in used and abs(f - t) <= tol and (best is None or abs(f - t) <
                                                        abs(found[best] - t)):
                best = i
        if best is not None:
            used.add(best)
            hits += 1
    return hits


@dataclass
class WholeScore:
    precision: float
    recall: float
    f1: float
    false_cp_share: float
    outliers_marked: float


def score_whole(series: Sequence[Series], found: Sequence[Sequence[int]]) -> WholeScore:
    tp = fp = fn = 0
    quiet = quiet_false = 0
    outliers = outliers_marked = 0
    for s, f in zip(series, found, strict=True):
        hits = match(f, s.change_points)
        if s.optional:  # a detection at a debatable change is neither right nor wrong
            f = [x for x in f if not any(abs(x - o) <= 2 for o in s.optional)
                 or any(abs(x - c) <= 2 for c in s.change_points)]
        tp += hits
        fp += len(f) - hits
        fn += len(s.change_points) - hits
        if s.category in NO_CHANGE:
            quiet += 1
            quiet_false += bool(f)
        for o in s.outliers:
            outliers += 1
            outliers_marked += any(abs(x - o) <= 1 for x in f)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return WholeScore(precision, recall, f1, quiet_false / max(quiet, 1),
                      outliers_marked / max(outliers, 1))


@dataclass
class SeqScore:
    precision: float
    recall: float
    f1: float
    flagged_within_5: float
    false_alarms_per_stable_run: float


def seq_queries(s: Series, start: int = SEQ_START) -> list[int]:
    return list(range(start, len(s.values)))


def score_seq(series: Sequence[Series], flags: Sequence[Sequence[bool]],
              start: int = SEQ_START) -> SeqScore:
    right = wrong = 0
    regressions = regressions_flagged = 0
    stable_runs = false_alarms = 0
    for s, f in zip(series, flags, strict=True):
        queries = seq_queries(s, start)
        reg_windows = [range(c, c + WINDOW) for c, k in zip(s.change_points, s.cp_kinds,
                                                            strict=True) if k == "regression"]
        any_windows = [range(c, c + WINDOW) for c in s.change_points]
        for window in reg_windows:
            if window.start >= start:
                regressions += 1
                regressions_flagged += any(f[q - start] for q in window
                                           if q < len(s.values))
        for q, yes in zip(queries, f, strict=True):
            in_reg = any(q in w for w in reg_windows)
            in_any = any(q in w for w in any_windows)
            if yes:
                right += in_reg
                wrong += not in_reg
            if not in_any:
                stable_runs += 1
                false_alarms += yes
    precision = right / (right + wrong) if right + wrong else 1.0
    recall = regressions_flagged / max(regressions, 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return SeqScore(precision, recall, f1, recall, false_alarms / max(stable_runs, 1))


def pick_seq_series(series: Sequence[Series], count: int) -> list[Series]:
    """Short series (<= 250 runs) taken round-robin across categories."""
    by_cat: dict[str, list[Series]] = {}
    for s in series:
        if len(s.values) <= 250:
            by_cat.setdefault(s.category, []).append(s)
    picked: list[Series] = []
    while len(picked) < count and any(by_cat.values()):
        for group in by_cat.values():
            if group and len(picked) < count:
                picked.append(group.pop(0))
    return picked


def ours_whole(series: Sequence[Series]) -> list[list[int]]:
    return [change_points(s.values, s.direction) for s in series]  # type: ignore[arg-type]


def ours_seq(series: Sequence[Series]) -> list[list[bool]]:
    out = []
    for s in series:
        v = s.values
        out.append([verdict(v[max(0, q - SEQ_HISTORY):q], v[q], s.direction).kind  # type: ignore[arg-type]
                    == "regression" for q in seq_queries(s)])
    return out


def anchor_run(method: str, arrays: list[list[float]]) -> list[list[int]] | None:
    python = VENVS / method / "bin" / "python"
    if not python.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.json", Path(tmp) / "out.json"
        source.write_text(json.dumps(arrays))
        subprocess.run([str(python), str(HERE / "anchors.py"), method, str(source),
                        str(target)], check=True, stderr=subprocess.DEVNULL)
        return json.loads(target.read_text())


def anchor_seq(method: str, series: Sequence[Series]) -> list[list[bool]] | None:
    windows, owners = [], []
    for si, s in enumerate(series):
        for q in seq_queries(s):
            windows.append(s.values[max(0, q - SEQ_HISTORY + 1):q + 1])
            owners.append((si, q))
    found = anchor_run(method, windows)
    if found is None:
        return None
    flags: list[list[bool]] = [[] for _ in series]
    for (si, _q), window, cps in zip(owners, windows, found, strict=True):
        s = series[si]
        yes = False
        for c in cps:
            if c >= len(window) - WINDOW:
                before, after = np.mean(window[:c]), np.mean(window[c:])
                worse = after < before if s.direction == "higher_better" else after > before
                yes = yes or bool(worse)
        flags[si].append(yes)
    return flags


MAX_BESIDE = 16 * 1024 * 1024
"""Largest data file beside the repository a benchmark reads (compressed or not), in bytes."""


def read_beside(path: Path) -> str:
    """A data file kept beside the repository (``../shared``), through the one bounded reader.

    A ``.gz`` file is decompressed, up to `MAX_BESIDE` bytes too.
    """
    data = read_bounded(path, MAX_BESIDE, what="benchmark data")
    if path.suffix == ".gz":
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            data = stream.read(MAX_BESIDE + 1)
        if len(data) > MAX_BESIDE:
            raise ValueError(f"{path}: over {MAX_BESIDE} bytes once decompressed")
    return data.decode("utf-8")


def series_rows(text: str) -> dict[str, list[float]]:
    """A ``series_id,value`` CSV's values, by series, in order."""
    values: dict[str, list[float]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        values.setdefault(row["series_id"], []).append(float(row["value"]))
    return values


def load_real() -> list[Series]:
    root = REPO.parent / "shared" / "bench" / "regression" / "real"
    if not (root / "real_series.csv").exists():
        return []
    labels = json.loads(read_beside(root / "real_labels.json"))["series"]
    values = series_rows(read_beside(root / "real_series.csv"))
    out = []
    for name, vals in values.items():
        meta = labels.get(name, {})
        cps = [c["index"] if isinstance(c, dict) else c for c in meta.get("change_points", [])]
        outliers = [o["index"] if isinstance(o, dict) else o for o in meta.get("outliers", [])]
        out.append(Series(name=name, category="real", direction=meta.get(
            "direction", "higher_better"), values=vals, change_points=cps, outliers=outliers,
            optional=list(meta.get("optional_change_points", []))))
    return out


def timing() -> float:
    rng = np.random.default_rng(0)
    values = list(100 * (1 + rng.normal(0, 0.05, 1000)))
    change_points(values, "higher_better")
    runs = []
    for _ in range(20):
        start = time.perf_counter()
        change_points(values, "higher_better")
        runs.append(time.perf_counter() - start)
    return float(np.median(runs) * 1000)


def _row(name: str, w: WholeScore | None, q: SeqScore | None) -> str:
    a = (f"{w.precision:6.3f} {w.recall:6.3f} {w.f1:6.3f} {w.false_cp_share:8.1%} "
         f"{w.outliers_marked:8.1%}") if w else f"{'n/a':>40}"
    b = (f"{q.precision:6.3f} {q.recall:6.3f} {q.f1:6.3f} {q.flagged_within_5:8.1%} "
         f"{q.false_alarms_per_stable_run:8.2%}") if q else f"{'n/a':>40}"
    return f"{name:<10} {a} | {b}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-category", type=int, default=40)
    parser.add_argument("--seq-series", type=int, default=90,
                        help="series (length <= 250) asked the per-run question")
    parser.add_argument("--seeds", default="7",
                        help="comma-separated generator seeds; their sets are pooled")
    parser.add_argument("--no-anchors", action="store_true")
    args = parser.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    series: list[Series] = []
    seq_series: list[Series] = []
    for seed in seeds:
        drawn = generate(args.per_category, seed=seed)
        for s in drawn:
            s.name = f"seed{seed}/{s.name}"
        series += drawn
        seq_series += pick_seq_series(drawn, args.seq_series)
    print(f"{len(series)} synthetic series (seeds {args.seeds}, 9 categories), "
          f"{sum(len(s.values) for s in series)} runs; {len(seq_series)} series / "
          f"{sum(len(seq_queries(s)) for s in seq_series)} per-run questions")
    methods: dict[str, tuple[Callable, Callable]] = {"telltale": (ours_whole, ours_seq)}
    if not args.no_anchors:
        methods["otava"] = (lambda s: anchor_run("otava", [x.values for x in s]),
                            lambda s: anchor_seq("otava", s))
        methods["spa"] = (lambda s: anchor_run("spa", [x.values for x in s]),
                          lambda s: anchor_seq("spa", s))
    real = load_real()
    print()
    print(f"{'method':<10} {'(1) change points over a series':^40} | "
          f"{'(2) is the newest run a regression?':^40}")
    print(f"{'':<10} {'prec':>6} {'recall':>6} {'F1':>6} {'noCP>0':>8} {'outlier':>8} | "
          f"{'prec':>6} {'recall':>6} {'F1':>6} {'in 5':>8} {'FA/run':>8}")
    results = {}
    per_seed: list[tuple[str, list[list[int]] | None, list[list[bool]] | None]] = []
    for name, (whole, seq) in methods.items():
        started = time.perf_counter()
        found = whole(series)
        flags = seq(seq_series)
        w = score_whole(series, found) if found is not None else None
        q = score_seq(seq_series, flags) if flags is not None else None
        results[name] = (w, q, found)
        print(_row(name, w, q) + f"   ({time.perf_counter() - started:.0f}s)")
        if len(seeds) > 1:
            per_seed.append((name, found, flags))
    for name, found, flags in per_seed:
        cells = []
        for seed in seeds:
            tag = f"seed{seed}/"
            idx = [i for i, s in enumerate(series) if s.name.startswith(tag)]
            qdx = [i for i, s in enumerate(seq_series) if s.name.startswith(tag)]
            f1 = score_whole([series[i] for i in idx], [found[i] for i in idx]).f1 \
                if found is not None else float("nan")
            f2 = score_seq([seq_series[i] for i in qdx], [flags[i] for i in qdx]).f1 \
                if flags is not None else float("nan")
            cells.append(f"{seed}: {f1:.3f} / {f2:.3f}")
        print(f"  {name:<8} F1 (1) / (2) per seed  " + "   ".join(cells))
    print()
    print("F1 on (1) per category (recall for steps, 1 - false share for no-change):")
    cats = sorted({s.category for s in series})
    print(f"{'method':<10} " + " ".join(f"{c[:12]:>12}" for c in cats))
    for name, (_w, _q, found) in results.items():
        if found is None:
            continue
        cells = []
        for cat in cats:
            idx = [i for i, s in enumerate(series) if s.category == cat]
            sc = score_whole([series[i] for i in idx], [found[i] for i in idx])
            cells.append(sc.f1 if cat not in NO_CHANGE else 1 - sc.false_cp_share)
        print(f"{name:<10} " + " ".join(f"{c:12.3f}" for c in cells))
    if real:
        print()
        print(f"real series ({len(real)}, hand labels from shared/bench): (1) only")
        for name, (whole, _seq) in methods.items():
            found = whole(real)
            if found is not None:
                print(_row(name, score_whole(real, found), None))
    best_anchor = max((r[0].f1 for n, r in results.items() if n != "telltale" and r[0]),
                      default=None)
    ours = results["telltale"]
    print()
    print(f"change_points on a 1000-run series: {timing():.2f} ms")
    if best_anchor is not None:
        print(f"F1 (1): telltale {ours[0].f1:.3f} vs best anchor {best_anchor:.3f} "
              f"(+{ours[0].f1 - best_anchor:.3f}; target +0.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
