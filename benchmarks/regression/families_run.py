"""Leave-one-family-out benchmark of the regression detector (generalization).

    python benchmarks/regression/families_run.py [--count 40] [--tune-seed 1] [--test-seed 2]
                                                 [--grid] [--families heavy,tail,...]

Without ``--grid``: the detector's defaults scored on every family of `families.py` (seed
``--test-seed``), plus `generate.py` (the generator the detector was first tuned on) and the
real series when present.

With ``--grid``: each candidate operating point of ``GRID`` is scored on every family drawn
with ``--tune-seed``. For each family F, the operating point is chosen on the *other*
families only (the best mean score among points whose false alarms stay within the budget of
1 % per stable run), then scored on F drawn with ``--test-seed``: a family and a seed never
used for the choice. The table is docs/performance.md's leave-one-family-out table.

Scores (see ``run.py`` for the matching rules): (1) change points over a whole series:
precision, recall, F1, share of no-change series with a false change point, outliers
marked; (2) "is the newest run a regression?" asked after every run from the 4th on (history:
up to 100 runs): event recall within 5 runs, flagged (suspect or regression) at the first
bad run, per-run recall in the 5-run window, false alarms (regressions) per stable run, stable
runs suspected; (3) spread increases reported ``noisier`` within 20 runs, stable runs called
noisier.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from families import FAMILIES, draw  # noqa: E402
from generate import Series, generate  # noqa: E402
from run import WINDOW, load_real, score_whole  # noqa: E402

from analysis.regression import DEFAULTS, DetectorSettings, change_points, verdict  # noqa: E402

START = 3  # the first question is asked with 3 runs of history (the verdict's minimum)
HISTORY = 100
BUDGET = 0.01  # false alarms per stable run
SUSPECT_BUDGET = 0.03  # stable runs suspected

# Operating points tried by --grid: (name, overrides of DetectorSettings).
# The previous defaults, then looser points; "default" is DetectorSettings' own.
GRID: list[tuple[str, dict[str, float]]] = [
    ("strict", {"verdict_z": 3.5, "confirm_factor": 0.6, "edge_z": math.inf,
                "suspect_z": 3.5, "z_threshold": 5.0, "candidate_z": 5.0}),
    ("v3", {"verdict_z": 3.0, "confirm_factor": 0.6, "edge_z": 5.0, "suspect_z": 3.0,
            "z_threshold": 5.0, "candidate_z": 5.0}),
    ("v2.75", {"verdict_z": 2.75}),
    ("floor2%", {"min_magnitude": 0.02}),
    ("default", {}),
    ("s2.4", {"suspect_z": 2.4}),
    ("drift-w1", {"drift_choice_weight": 1.0}),  # the weighing before 2026-12-07
    ("v2.25-z4", {"verdict_z": 2.25, "edge_z": 4.0, "suspect_z": 2.5, "z_threshold": 4.0,
                  "candidate_z": 4.0}),
]
FLAGGED = ("regression", "suspect")
"""What counts as flagging a run at once: a confirmed regression or a suspect."""


@dataclass
class FamilyScore:
    precision: float
    recall: float
    f1: float
    false_cp_share: float
    outliers_marked: float
    event_recall: float
    first_run: float
    window_recall: float
    false_alarms: float
    suspected: float = 0.0  # stable runs judged suspect
    spread_found: float = 0.0  # spread increases reported noisier within 20 runs
    false_noisier: float = 0.0  # stable runs judged noisier

    def objective(self) -> float:
        """What the operating point is chosen for: both questions' recall at low error."""
        return (self.f1 + self.event_recall) / 2


def sequential(s: Series, settings: DetectorSettings) -> list[str]:
    """The verdict's kind after every run from START on."""
    v = s.values
    return [verdict(v[max(0, q - HISTORY):q], v[q], s.direction,  # type: ignore[arg-type]
                    settings=settings).kind for q in range(START, len(v))]


def kinds(s: Series) -> list[str]:
    """The labelled kind of each change point (real series: from the levels around it)."""
    if len(s.cp_kinds) == len(s.change_points):
        return s.cp_kinds
    out = []
    for c in s.change_points:
        before = sorted(s.values[max(0, c - 5):c])[len(s.values[max(0, c - 5):c]) // 2]
        after = sorted(s.values[c:c + 5])[len(s.values[c:c + 5]) // 2]
        worse = (after < before) == (s.direction == "higher_better")
        out.append("regression" if worse else "improvement")
    return out


def score(series: Sequence[Series], settings: DetectorSettings) -> FamilyScore:
    # "no-change series" are those without a change point, whatever their family is called
    # (a family named like one of generate.py's no-change categories must not count whole)
    series = [dataclasses.replace(s, category="stable" if not s.change_points
                                  else f"{s.category}+steps") for s in series]
    found = [change_points(s.values, s.direction, settings=settings)  # type: ignore[arg-type]
             for s in series]
    whole = score_whole(series, found)
    events = flagged = first = in_window = window_runs = stable = alarms = 0
    suspected = noisier_false = spreads = spreads_found = 0
    for s in series:
        judged = sequential(s, settings)
        flags = [k == "regression" for k in judged]
        windows = [range(c, min(c + WINDOW, len(s.values)))
                   for c in s.change_points]
        for c, kind in zip(s.change_points, kinds(s), strict=True):
            if kind == "spread" and c >= START:
                before = np.std(np.diff(s.values[max(0, c - 50):c]))
                after = np.std(np.diff(s.values[c:c + 50]))
                if after > before:  # an increase: noisier is the news
                    spreads += 1
                    spreads_found += any(k == "noisier" for k in judged[
                        c - START:c - START + 20])
            if kind != "regression" or c < START:
                continue
            w = range(c, min(c + WINDOW, len(s.values)))
            events += 1
            flagged += any(flags[q - START] for q in w)
            first += judged[c - START] in FLAGGED
            window_runs += len(w)
            in_window += sum(flags[q - START] for q in w)
        spread_windows = [range(c, min(c + 20, len(s.values)))
                          for c, k in zip(s.change_points, kinds(s), strict=True)
                          if k == "spread"]
        for q in range(START, len(s.values)):
            if not any(q in w for w in windows):
                stable += 1
                alarms += flags[q - START]
                suspected += judged[q - START] == "suspect"
            if not any(q in w for w in spread_windows):
                noisier_false += judged[q - START] == "noisier"
    return FamilyScore(whole.precision, whole.recall, whole.f1, whole.false_cp_share,
                       whole.outliers_marked,
                       # a family without regressions has no recall of them (not zero)
                       flagged / events if events else math.nan,
                       first / events if events else math.nan,
                       in_window / window_runs if window_runs else math.nan,
                       alarms / max(stable, 1),
                       suspected / max(stable, 1), spreads_found / max(spreads, 1)
                       if spreads else math.nan, noisier_false / max(stable, 1))


def _score_job(job: tuple[str, list[Series], dict[str, float]]) -> tuple[str, FamilyScore]:
    family, series, overrides = job
    return family, score(series, replace(DEFAULTS, **overrides))


def score_all(sets: dict[str, list[Series]], overrides: dict[str, float],
              pool: ProcessPoolExecutor) -> dict[str, FamilyScore]:
    jobs = [(f, s, overrides) for f, s in sets.items()]
    return dict(pool.map(_score_job, jobs))


HEADER = (f"{'family':<12} {'prec':>6} {'recall':>6} {'F1':>6} {'noCP>0':>7} {'outl':>6} | "
          f"{'event':>6} {'first':>6} {'window':>6} {'FA/run':>7} {'susp':>6} | "
          f"{'noisy':>6} {'noisyFA':>7}")


def row(name: str, x: FamilyScore) -> str:
    def shown(value: float) -> str:
        return "     -" if math.isnan(value) else f"{value:6.3f}"

    noisy = shown(x.spread_found)
    return (f"{name:<12} {x.precision:6.3f} {x.recall:6.3f} {x.f1:6.3f} "
            f"{x.false_cp_share:7.1%} {x.outliers_marked:6.1%} | {shown(x.event_recall)} "
            f"{shown(x.first_run)} {shown(x.window_recall)} {x.false_alarms:7.2%} "
            f"{x.suspected:6.2%} | {noisy} {x.false_noisier:7.2%}")


def pooled(scores: dict[str, FamilyScore]) -> FamilyScore:
    """Unweighted mean over families (each family counts once; a family without spread
    changes does not count in the spread mean)."""
    fields = FamilyScore.__dataclass_fields__
    out = {}
    for k in fields:
        values = [getattr(x, k) for x in scores.values() if not math.isnan(getattr(x, k))]
        out[k] = sum(values) / len(values) if values else math.nan
    return FamilyScore(**out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=40, help="series per family")
    parser.add_argument("--tune-seed", type=int, default=1)
    parser.add_argument("--test-seed", type=int, default=2)
    parser.add_argument("--grid", action="store_true")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a DetectorSettings field (without --grid)")
    args = parser.parse_args()
    names = args.families.split(",")

    def sets(seed: int) -> dict[str, list[Series]]:
        out = {f: draw(f, args.count, seed) for f in names}
        legacy = generate(max(2, args.count // 9), seed=seed + 100)
        out["legacy"] = [s for s in legacy if len(s.values) <= 250] or legacy[:args.count]
        return out

    test = sets(args.test_seed)
    started = time.perf_counter()
    with ProcessPoolExecutor() as pool:
        if not args.grid:
            overrides = {k: int(v) if v.isdigit() else float(v)  # min_size is an int
                         for k, v in (x.split("=", 1) for x in args.set)}
            scores = score_all(test, overrides, pool)
            print(f"{overrides or 'defaults'}, seed {args.test_seed}, {args.count} series per "
                  f"family")
            print(HEADER)
            for name, x in scores.items():
                print(row(name, x))
            print(row("mean", pooled(scores)))
            real = load_real()
            if real:
                print(row("real (6)", score(real, replace(DEFAULTS, **overrides))))
        else:
            tune = sets(args.tune_seed)
            table = {name: score_all(tune, over, pool) for name, over in GRID}
            print(f"operating points on the tuning seed {args.tune_seed} (mean over families)")
            print(f"{'point':<12} {HEADER[13:]}")
            for name, by_family in table.items():
                print(row(name, pooled(by_family)))
            print()
            print(f"leave-one-family-out: point chosen without the family, scored on seed "
                  f"{args.test_seed}")
            print(f"{HEADER}  point")
            held: dict[str, FamilyScore] = {}
            for family in test:
                def others(point: str, family: str = family) -> FamilyScore:
                    return pooled({f: x for f, x in table[point].items() if f != family})
                allowed = [p for p, _ in GRID if others(p).false_alarms <= BUDGET
                           and others(p).suspected <= SUSPECT_BUDGET] or [
                    GRID[0][0]]
                best = max(allowed, key=lambda p: others(p).objective())
                overrides = dict(GRID)[best]
                held[family] = score(test[family], replace(DEFAULTS, **overrides))
                print(row(family, held[family]) + f"  {best}")
            print(row("mean", pooled(held)))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
