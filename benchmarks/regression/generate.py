"""Labelled synthetic performance series for the regression benchmark.

Each series is a level (piecewise constant, optionally drifting) times (1 + noise), with
labels: the true change points (index where the new level starts), single outliers, the KPI
direction and a category. Categories:

- ``stable``      gaussian noise, CV 1-15 %;
- ``heavy_tails`` student-t noise (df 2.5-4) scaled to CV 1-10 %;
- ``bimodal``     two noise modes (gap 2-8 %, share 20-50 %, independent per run);
- ``drift``       a slow linear drift of 5-30 % over the whole series;
- ``outliers``    stable plus 1-4 single outliers of 5-12 sigma;
- ``steps``       1-4 change points, steps of 2-50 %, segments of >= 12 runs;
- ``steps_drift``, ``steps_outliers``, ``steps_heavy`` combinations.

A step is drawn no smaller than the noise CV (a 2 % step under 15 % noise is not a change a
CPT system can be asked to see); lengths are short (20-60 runs) or long (150-1000 runs).
Deterministic for a given seed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

CATEGORIES = ["stable", "heavy_tails", "bimodal", "drift", "outliers", "steps", "steps_drift",
              "steps_outliers", "steps_heavy"]
NO_CHANGE = {"stable", "heavy_tails", "bimodal", "drift", "outliers"}


@dataclass
class Series:
    """One labelled series."""

    name: str
    category: str
    direction: str
    values: list[float]
    change_points: list[int] = field(default_factory=list)
    outliers: list[int] = field(default_factory=list)
    cp_kinds: list[str] = field(default_factory=list)  # "regression" | "improvement"
    optional: list[int] = field(default_factory=list)  # real series: debatable changes


def _noise(rng: np.random.Generator, n: int, category: str) -> tuple[np.ndarray, float]:
    if "heavy" in category:
        cv = rng.uniform(0.01, 0.10)
        df = rng.uniform(2.5, 4.0)
        t = rng.standard_t(df, n) / np.sqrt(df / (df - 2))
        return cv * np.clip(t, -12, 12), cv
    if category == "bimodal":
        cv = rng.uniform(0.01, 0.05)
        gap, share = rng.uniform(0.02, 0.08), rng.uniform(0.2, 0.5)
        modes = np.where(rng.random(n) < share, gap, 0.0)
        return rng.normal(0, cv, n) + modes - gap * share, float(np.sqrt(cv**2 + gap**2 * share * (1 - share)))
    cv = rng.uniform(0.01, 0.15)
    return rng.normal(0, cv, n), cv


def make_series(rng: np.random.Generator, index: int, category: str) -> Series:
    """Draw one series of a category."""
    short_min = 36 if category.startswith("steps") else 20  # room for a 12-run segment
    n = int(rng.integers(short_min, 61)) if rng.random() < 0.35 else int(
        rng.integers(150, 1001))
    direction = "higher_better" if rng.random() < 0.5 else "lower_better"
    base = float(rng.choice([1.0, 55.0, 1200.0, 4.2e4]))
    noise, cv = _noise(rng, n, category)
    level = np.full(n, base)
    cps: list[int] = []
    kinds: list[str] = []
    if category.startswith("steps"):
        count = int(rng.integers(1, 5))
        count = min(count, max(1, n // 24))
        # segment boundaries at least 12 runs apart and 12 from the ends
        candidates = np.arange(12, n - 12)
        chosen: list[int] = []
        for _ in range(200):
            if len(chosen) == count:
                break
            c = int(rng.choice(candidates))
            if all(abs(c - o) >= 12 for o in chosen):
                chosen.append(c)
        cps = sorted(chosen)
        current = base
        for c in cps:
            size = rng.uniform(max(0.02, cv), 0.5) if cv < 0.5 else 0.5
            sign = 1 if rng.random() < 0.5 else -1
            new = current * (1 + sign * size)
            level[c:] = new
            worse = (new < current) if direction == "higher_better" else (new > current)
            kinds.append("regression" if worse else "improvement")
            current = new
    if "drift" in category:
        total = rng.uniform(0.05, 0.30) * (1 if rng.random() < 0.5 else -1)
        level = level * (1 + np.linspace(0, total, n))
    values = level * (1 + noise)
    outliers: list[int] = []
    if "outliers" in category:
        for _ in range(int(rng.integers(1, 5))):
            i = int(rng.integers(3, n - 3))
            if all(abs(i - c) > 3 for c in cps) and all(abs(i - o) > 3 for o in outliers):
                sign = 1 if rng.random() < 0.5 else -1
                values[i] = level[i] * (1 + sign * rng.uniform(5, 12) * cv)
                outliers.append(i)
    return Series(name=f"{category}-{index:04d}", category=category, direction=direction,
                  values=[float(v) for v in values], change_points=cps,
                  outliers=sorted(outliers), cp_kinds=kinds)


def generate(count_per_category: int = 40, seed: int = 7) -> list[Series]:
    """Return ``count_per_category`` series of every category."""
    rng = np.random.default_rng(seed)
    return [make_series(rng, i, cat) for cat in CATEGORIES for i in range(count_per_category)]


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("series.json")
    out.write_text(json.dumps([asdict(s) for s in generate(count)]))
    print(f"wrote {out}")
