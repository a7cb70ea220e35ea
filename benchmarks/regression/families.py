"""Generator families for the leave-one-family-out regression benchmark.

`generate.py` is one generator (the one the detector was first tuned on). A detector tuned to
one generator scores far lower on another, so these families are designed independently of
it, each around one way real CPT series misbehave. Conventions differ on purpose: steps are
drawn in units of the noise standard deviation (``0.5 σ`` .. ``8 σ``), not as percentages;
noise is additive around the level here and multiplicative there; lengths run from 5 to 400.

Families (``FAMILIES``):

- ``heavy``        Student-t (df 1.5-3) or log-normal noise, steps 1-8 σ;
- ``hetero``       the noise level itself wanders (x0.4 .. x2.5 over the series, smooth, or
                   in a jump: a jump is a spread change point, labelled ``spread``), steps
                   1-8 σ;
- ``multimodal``   every run lands in one of 2-3 modes (cache warm/cold, NUMA placement),
                   a step moves all modes, steps 1.5-8 σ of the within-mode noise;
- ``seasonal``     a weekly-like periodic pattern (period 5-9, amplitude 0.3-1.5 σ) plus
                   AR(1) noise (phi 0-0.5), steps 1-8 σ;
- ``drift``        a slow drift (5-25 % over the series, at most 0.15 σ per run on average,
                   linear, or curved by at most 1 σ) plus small steps of 1-3 σ;
- ``small_steps``  gaussian noise, steps of 0.5-2.5 σ in long segments;
- ``close``        consecutive changes 3-8 runs apart (a regression and its fix, a double
                   step), steps 2-8 σ;
- ``short``        histories of 5-15 runs, at most one change, steps 2-8 σ;
- ``tail``         the newest level began in the last 1-10 runs (the regression is news),
                   steps 1.5-8 σ, plus a few single outliers earlier;
- ``quiet``        stable benchmarks (CPU-bound microbenchmarks, counters): noise 0.1-1 % of
                   the level, half of them quantised to a timer's resolution of 0.5-2 σ,
                   steps 1-8 σ, so most steps are under 2 % of the level.
- ``spread``       the noise's SD doubles or more (x2-x4) at a steady level, or falls as
                   much (a noisy neighbour arrives or leaves): each is a change point,
                   labelled ``spread``; no level change;
- ``wave``         a pure wave (sine or a repeating pattern, period 4-40, amplitude 1-4 σ)
                   with no level change, or with one step of 3-8 σ;
- ``staircase``    three steps of 1-2 σ each in the same direction, 25-80 runs apart;
- ``fixed``        a regression of 3-8 σ fixed 2-6 runs later (a bad commit and its revert),
                   its start and its fix both labelled.
- ``sine``         a sine wave of any period (5-80 runs, not a whole number: a thermal or
                   rotation cycle), amplitude 1-4 σ, over 300-900 runs (long enough for a
                   whole-period pattern to drift out of phase), half with one step of
                   3-8 σ; added 2026-11-28, after a probe of such waves found 10-25 false
                   change points in a third of them;
- ``exact``        no noise at all (a count, a setting, a quantised size): 0-4 steps of
                   0.5-50 % of the level, a third with a lone outlier run; added with
                   ``sine`` (40-50 % of such series got extra change points, some 50).

Every family mixes no-change series (about a third) with changed ones, so each family scores
both recall and false alarms. Deterministic per (family, seed).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from generate import Series

Rng = np.random.Generator


def _length(rng: Rng, lo: int = 30, hi: int = 400) -> int:
    # log-uniform: short series are as common as long ones in a CPT history
    return int(round(np.exp(rng.uniform(np.log(lo), np.log(hi)))))


def _place(rng: Rng, n: int, count: int, gap: int, margin: int) -> list[int]:
    """``count`` change points at least ``gap`` apart and ``margin`` from the ends."""
    out: list[int] = []
    for _ in range(500):
        if len(out) == count:
            break
        c = int(rng.integers(margin, n - margin + 1))
        if all(abs(c - o) >= gap for o in out):
            out.append(c)
    return sorted(out)


def _levels(rng: Rng, n: int, cps: list[int], sizes_sigma: tuple[float, float],
            sigma: float, base: float) -> tuple[np.ndarray, list[float]]:
    """A piecewise-constant level with steps of ``sizes_sigma`` noise SDs (random sign)."""
    level = np.full(n, base)
    current = base
    signs: list[float] = []
    for c in cps:
        size = rng.uniform(*sizes_sigma) * sigma * base
        sign = 1.0 if rng.random() < 0.5 else -1.0
        if current + sign * size <= 0.2 * base:  # keep levels positive
            sign = 1.0
        current += sign * size
        level[c:] = current
        signs.append(sign)
    return level, signs


def _kinds(direction: str, signs: list[float]) -> list[str]:
    """Each change's kind from its sign (0: a spread change, labelled ``spread``)."""
    up_is_good = direction == "higher_better"
    return ["spread" if s == 0 else "improvement" if (s > 0) == up_is_good else "regression"
            for s in signs]


def _finish(name: str, family: str, rng: Rng, values: np.ndarray, cps: list[int],
            signs: list[float], outliers: list[int] | None = None) -> Series:
    direction = "higher_better" if rng.random() < 0.5 else "lower_better"
    return Series(name=name, category=family, direction=direction,
                  values=[float(v) for v in values], change_points=cps,
                  outliers=sorted(outliers or []), cp_kinds=_kinds(direction, signs))


def _changes(rng: Rng, n: int, max_count: int, gap: int = 10, margin: int = 8) -> list[int]:
    if rng.random() < 0.35:
        return []
    count = int(rng.integers(1, max_count + 1))
    return _place(rng, n, min(count, max(1, n // (2 * gap))), gap, margin)


def heavy(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng), rng.uniform(0.01, 0.08), float(rng.choice([3.0, 800.0]))
    cps = _changes(rng, n, 3)
    level, signs = _levels(rng, n, cps, (1.0, 8.0), sigma, base)
    if rng.random() < 0.5:
        df = rng.uniform(1.5, 3.0)
        noise = np.clip(rng.standard_t(df, n), -30, 30) * sigma * 0.7
    else:
        s = sigma * rng.uniform(0.8, 1.5)
        noise = (rng.lognormal(0, s * 3, n) - np.exp((s * 3) ** 2 / 2)) / 3
        noise *= 1 if rng.random() < 0.5 else -1  # skewed either way
    return _finish(name, "heavy", rng, level + noise * base, cps, signs)


def hetero(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng), rng.uniform(0.01, 0.06), 100.0
    cps = _changes(rng, n, 3)
    level, signs = _levels(rng, n, cps, (1.5, 8.0), sigma, base)
    if rng.random() < 0.5:
        scale = np.exp(np.linspace(0, rng.uniform(-0.9, 0.9), n))
    else:  # a jump of the spread: a change point of its own (a spread change), 10+ runs
        # from any step
        scale = np.ones(n)
        at = int(rng.integers(n // 4, 3 * n // 4))
        scale[at:] = rng.choice([0.4, 2.5])
        if all(abs(at - c) >= 10 for c in cps):
            order = sorted([*zip(cps, signs, strict=True), (at, 0.0)])
            cps, signs = [c for c, _ in order], [g for _, g in order]
    return _finish(name, "hetero", rng, level + rng.normal(0, 1, n) * sigma * base * scale,
                   cps, signs)


def multimodal(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng), rng.uniform(0.005, 0.03), 50.0
    cps = _changes(rng, n, 3)
    level, signs = _levels(rng, n, cps, (1.5, 8.0), sigma, base)
    modes = int(rng.integers(2, 4))
    offsets = np.concatenate([[0.0], rng.uniform(1.5, 5.0, modes - 1)]) * sigma * base
    weights = rng.dirichlet(np.full(modes, 2.0))
    pick = rng.choice(modes, n, p=weights)
    values = level + offsets[pick] + rng.normal(0, sigma * base, n)
    return _finish(name, "multimodal", rng, values, cps, signs)


def seasonal(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 40, 400), rng.uniform(0.01, 0.05), 1000.0
    cps = _changes(rng, n, 3)
    level, signs = _levels(rng, n, cps, (1.0, 8.0), sigma, base)
    period = int(rng.integers(5, 10))
    pattern = rng.normal(0, 1, period)
    pattern = pattern / (np.std(pattern) or 1.0) * rng.uniform(0.3, 1.5) * sigma * base
    phi = rng.uniform(0.0, 0.5)
    e = rng.normal(0, sigma * base * np.sqrt(1 - phi ** 2), n)
    for i in range(1, n):
        e[i] += phi * e[i - 1]
    return _finish(name, "seasonal", rng, level + pattern[np.arange(n) % period] + e, cps,
                   signs)


def drift(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 40, 400), rng.uniform(0.01, 0.05), 20.0
    cps = _changes(rng, n, 2, gap=15)
    level, signs = _levels(rng, n, cps, (1.0, 3.0), sigma, base)
    # Slow: on average at most 0.15 σ per run; most drifts are linear, a curved one bends
    # at most 1 σ away from its straight line (a stronger bend is a change someone would
    # want to hear about, not noise).
    total = min(rng.uniform(0.05, 0.25), 0.15 * sigma * n) * (1 if rng.random() < 0.5 else -1)
    x = np.linspace(0, 1, n)
    shape = x
    if rng.random() < 0.3:
        shape = x ** 2 if rng.random() < 0.5 else 1 - (1 - x) ** 2
        total = float(np.sign(total)) * min(abs(total), 8 * sigma)  # bend <= total / 8
    values = level * (1 + total * shape) + rng.normal(0, sigma * base, n)
    return _finish(name, "drift", rng, values, cps, signs)


def small_steps(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 60, 400), rng.uniform(0.005, 0.04), 10.0
    cps = _changes(rng, n, 3, gap=25, margin=20)
    level, signs = _levels(rng, n, cps, (0.5, 2.5), sigma, base)
    return _finish(name, "small_steps", rng, level + rng.normal(0, sigma * base, n), cps,
                   signs)


def close(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 40, 300), rng.uniform(0.01, 0.05), 250.0
    if rng.random() < 0.3:
        cps: list[int] = []
    else:
        first = int(rng.integers(12, n - 20))
        cps = [first, first + int(rng.integers(3, 9))]
    level = np.full(n, base)
    signs: list[float] = []
    if cps:
        size = rng.uniform(2.0, 8.0) * sigma * base
        sign = 1.0 if rng.random() < 0.5 else -1.0
        back = rng.random() < 0.6  # a regression and its fix, or a double step
        level[cps[0]:] += sign * size
        second = -sign * size * rng.uniform(0.8, 1.2) if back else sign * size * rng.uniform(
            0.5, 1.5)
        level[cps[1]:] += second
        signs = [sign, float(np.sign(second))]
    return _finish(name, "close", rng, level + rng.normal(0, sigma * base, n), cps, signs)


def short(rng: Rng, name: str) -> Series:
    n, sigma, base = int(rng.integers(5, 16)), rng.uniform(0.01, 0.05), 70.0
    cps = [] if rng.random() < 0.4 or n < 8 else [int(rng.integers(3, n - 2))]
    level, signs = _levels(rng, n, cps, (2.0, 8.0), sigma, base)
    return _finish(name, "short", rng, level + rng.normal(0, sigma * base, n), cps, signs)


def tail(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 20, 200), rng.uniform(0.01, 0.06), 5.0
    cps = [] if rng.random() < 0.3 else [n - int(rng.integers(1, 11))]
    level, signs = _levels(rng, n, cps, (1.5, 8.0), sigma, base)
    values = level + rng.normal(0, sigma * base, n)
    outliers: list[int] = []
    for _ in range(int(rng.integers(0, 3))):
        i = int(rng.integers(3, max(4, n - 14)))
        if all(abs(i - o) > 3 for o in outliers) and all(abs(i - c) > 3 for c in cps):
            values[i] = level[i] * (1 + rng.choice([-1, 1]) * rng.uniform(6, 12) * sigma)
            outliers.append(i)
    return _finish(name, "tail", rng, values, cps, signs, outliers)


def quiet(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng), float(np.exp(rng.uniform(np.log(0.001), np.log(0.01)))), 40.0
    cps = _changes(rng, n, 3)
    level, signs = _levels(rng, n, cps, (1.0, 8.0), sigma, base)
    values = level + rng.normal(0, sigma * base, n)
    if rng.random() < 0.5:  # a timer's resolution: runs repeat the same few values
        resolution = rng.uniform(0.5, 2.0) * sigma * base
        values = np.round(values / resolution) * resolution
    return _finish(name, "quiet", rng, values, cps, signs)


def spread(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 60, 600), rng.uniform(0.005, 0.04), 100.0
    cps = [] if rng.random() < 0.3 else [int(rng.integers(n // 5, 4 * n // 5))]
    scale = np.ones(n)
    if cps:
        factor = rng.uniform(2.0, 4.0)
        scale[cps[0]:] = factor if rng.random() < 0.6 else 1 / factor
    values = base * (1 + rng.normal(0, sigma, n) * scale)
    return _finish(name, "spread", rng, values, cps, [0.0] * len(cps))


def wave(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 60, 600), rng.uniform(0.005, 0.04), 300.0
    period = int(rng.integers(4, 41))
    amplitude = rng.uniform(1.0, 4.0) * sigma * base
    if rng.random() < 0.5:
        shape = np.sin(2 * np.pi * (np.arange(n) / period + rng.random()))
    else:  # any repeating pattern: a batch job's load on some weekdays
        pattern = rng.normal(0, 1, period)
        shape = (pattern / (np.abs(pattern).max() or 1.0))[np.arange(n) % period]
    cps = [] if rng.random() < 0.6 else [int(rng.integers(n // 4, 3 * n // 4))]
    level, signs = _levels(rng, n, cps, (3.0, 8.0), sigma, base)
    values = level + amplitude * shape + rng.normal(0, sigma * base, n)
    return _finish(name, "wave", rng, values, cps, signs)


def staircase(rng: Rng, name: str) -> Series:
    sigma, base = rng.uniform(0.005, 0.04), 60.0
    gaps = [int(rng.integers(25, 81)) for _ in range(4)]
    n = sum(gaps)
    cps = list(np.cumsum(gaps[:3]).astype(int))
    sign = 1.0 if rng.random() < 0.5 else -1.0
    level = np.full(n, base)
    for c in cps:
        level[c:] += sign * rng.uniform(1.0, 2.0) * sigma * base
    values = level + rng.normal(0, sigma * base, n)
    return _finish(name, "staircase", rng, values, [int(c) for c in cps], [sign] * 3)


def fixed(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 40, 300), rng.uniform(0.005, 0.04), 150.0
    if rng.random() < 0.3:
        return _finish(name, "fixed", rng, base * (1 + rng.normal(0, sigma, n)), [], [])
    start = int(rng.integers(10, n - 10))
    end = start + int(rng.integers(2, 7))
    size = rng.uniform(3.0, 8.0) * sigma * base
    direction = "higher_better" if rng.random() < 0.5 else "lower_better"
    worse = -1.0 if direction == "higher_better" else 1.0
    level = np.full(n, base)
    level[start:end] += worse * size
    values = level + rng.normal(0, sigma * base, n)
    return Series(name=name, category="fixed", direction=direction,
                  values=[float(v) for v in values], change_points=[start, end],
                  outliers=[], cp_kinds=["regression", "improvement"])


def sine(rng: Rng, name: str) -> Series:
    n, sigma, base = _length(rng, 300, 900), rng.uniform(0.005, 0.04), 200.0
    period = rng.uniform(5.0, 80.0)
    amplitude = rng.uniform(1.0, 4.0) * sigma * base
    shape = np.sin(2 * np.pi * (np.arange(n) / period + rng.random()))
    cps = [] if rng.random() < 0.5 else [int(rng.integers(n // 4, 3 * n // 4))]
    level, signs = _levels(rng, n, cps, (3.0, 8.0), sigma, base)
    values = level + amplitude * shape + rng.normal(0, sigma * base, n)
    return _finish(name, "sine", rng, values, cps, signs)


def exact(rng: Rng, name: str) -> Series:
    n, base = _length(rng, 30, 400), 50.0
    cps = _place(rng, n, int(rng.integers(0, 5)), 10, 5)
    level = np.full(n, base)
    signs: list[float] = []
    for c in sorted(cps):
        sign = 1.0 if rng.random() < 0.5 else -1.0
        level[c:] *= 1 + sign * rng.uniform(0.005, 0.5)
        signs.append(sign)
    outliers: list[int] = []
    if rng.random() < 0.33:
        spot = int(rng.integers(2, n - 2))
        if all(abs(spot - c) > 1 for c in cps):
            level[spot] *= 1.3
            outliers = [spot]
    return _finish(name, "exact", rng, level, sorted(cps), signs, outliers)


FAMILIES: dict[str, Callable[[Rng, str], Series]] = {
    "heavy": heavy, "hetero": hetero, "multimodal": multimodal, "seasonal": seasonal,
    "drift": drift, "small_steps": small_steps, "close": close, "short": short, "tail": tail,
    "quiet": quiet, "spread": spread, "wave": wave, "staircase": staircase, "fixed": fixed,
    "sine": sine, "exact": exact,
}


def draw(family: str, count: int, seed: int) -> list[Series]:
    """``count`` series of one family; the seed is mixed with the family name."""
    rng = np.random.default_rng([seed, sum(map(ord, family))])
    return [FAMILIES[family](rng, f"{family}/{seed}/{i:03d}") for i in range(count)]
