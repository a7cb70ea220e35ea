"""Smooth trends beside the levels: the curve a staircase of false steps would stand for.

A KPI can move smoothly for a while (a cache filling, a dataset growing, a thermal state
settling): a saturating, logistic, exponential or slowly bending curve. Levels with one
shared slope read such a curve as a staircase, 3-6 false change points a series (measured:
docs/performance.md). `smooth_trend` is the cheapest curve of a few families, scored as
the segmentation scores steps (its residual sum of squares in noise units plus a penalty
per parameter), for `analysis.segmentation._curved_alternative` to weigh against the steps;
`needed_steps` picks the steps a curve needs beside it (a curve fitted alone bends into a
real step).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

import analysis.blas  # noqa: F401  (numpy's BLAS on one thread: `analysis.blas` says why)

__all__ = ["SPLINE_PARAMETERS", "natural_spline_basis", "needed_steps", "smooth_trend",
           "step_columns"]

SPLINE_PARAMETERS = (4, 5, 6)
"""Natural cubic splines tried, by their parameters (4 to 6 knots, evenly spaced or crowded
towards either end)."""

_RUNS_PER_PARAMETER = 4
"""A spline of ``k`` parameters needs ``k * _RUNS_PER_PARAMETER * min_size`` runs: shorter
series get the parabola alone (a flexible curve in a short series is a step's rival)."""


def natural_spline_basis(t: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """The natural cubic spline basis at ``t``: ``len(knots)`` columns, the constant first.

    Cubic between the knots, linear beyond the outer two (the truncated-power form of
    Hastie, Tibshirani and Friedman, *The Elements of Statistical Learning*, eq. 5.4-5.5).
    """
    def d(k: int) -> np.ndarray:
        return (np.clip(t - knots[k], 0, None) ** 3 - np.clip(t - knots[-1], 0, None) ** 3) / (
            knots[-1] - knots[k])

    last = d(len(knots) - 2)
    return np.column_stack([np.ones_like(t), t, *(d(k) - last for k in range(len(knots) - 2))])


def smooth_trend(y: np.ndarray, sigma: float, penalty: float, min_size: int,
                 log_scale: bool) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The cheapest smooth curve through ``y``: ``(curve, basis, parameters beyond a level)``.

    Candidates: a parabola (in log space also one of the values themselves: a parabola of
    values with additive noise is no parabola of their logs) and natural cubic splines of
    `SPLINE_PARAMETERS`, their knots evenly spaced or crowded towards either end (where a
    saturating or an exponential curve bends), each costing its residual sum of squares over
    ``sigma²`` plus ``penalty`` per parameter beyond a level. ``basis`` spans the curve's
    space (orthonormal columns, to fit it again beside steps), None for the parabola of the
    values (not linear in ``y``).
    """
    spaces = _spaces(len(y), min_size)
    parabola = spaces[0][1]
    curve = parabola @ (parabola.T @ y)
    basis: np.ndarray | None = parabola
    if log_scale:
        t = np.arange(len(y)) / len(y)
        raw = np.polyval(np.polyfit(t, np.exp(y), 2), t)
        if np.all(raw > 0) and float(np.sum((y - np.log(raw)) ** 2)) < float(
                np.sum((y - curve) ** 2)):
            curve, basis = np.log(raw), None
    extra = 2
    cost = float(np.sum((y - curve) ** 2)) / sigma ** 2 + extra * penalty
    for parameters, space in spaces[1:]:
        fit = space @ (space.T @ y)
        candidate = float(np.sum((y - fit) ** 2)) / sigma ** 2 + (parameters - 1) * penalty
        if candidate < cost:
            curve, basis, extra, cost = fit, space, parameters - 1, candidate
    return curve, basis, extra


@functools.lru_cache(maxsize=8)
def _spaces(n: int, min_size: int) -> list[tuple[int, np.ndarray]]:
    """The candidate curves' spaces for ``n`` runs: ``(parameters, orthonormal basis)``.

    The parabola first. Kept for the last 8 lengths (a history's KPIs share their length;
    at 1 000 runs a length's spaces take ~0.4 MB).
    """
    t = np.arange(n) / n
    spaces = [(3, np.linalg.qr(np.column_stack([np.ones_like(t), t, t * t]))[0])]
    for parameters in SPLINE_PARAMETERS:
        if n < _RUNS_PER_PARAMETER * parameters * min_size:
            break
        even = np.linspace(0.0, 1.0, parameters)
        for spacing in (even, even ** 2, 1 - (1 - even) ** 2):
            spaces.append((parameters, np.linalg.qr(natural_spline_basis(
                t, spacing * t[-1]))[0]))
    for _, space in spaces:
        space.flags.writeable = False  # shared by every caller of this length
    return spaces


def needed_steps(y: np.ndarray, basis: np.ndarray, kept: Sequence[int], sigma: float,
                 penalty: float) -> list[int]:
    """The steps of ``kept`` a curve of ``basis`` needs beside it, added one at a time.

    Each round adds the step that lowers the residual sum of squares most (every candidate
    scored at once: its column projected off the columns chosen so far), while that gain is
    over ``penalty`` noise units.
    """
    candidates = list(kept)
    steps = step_columns(len(y), candidates)
    chosen: list[int] = []
    x = basis
    while candidates:
        q, _ = np.linalg.qr(x)
        residual = y - q @ (q.T @ y)
        off = steps - q @ (q.T @ steps)
        size = np.einsum("ij,ij->j", off, off)
        gain = np.where(size > 1e-9, (residual @ off) ** 2 / np.maximum(size, 1e-9), 0.0)
        best = int(np.argmax(gain))
        if gain[best] < penalty * sigma ** 2:
            break
        chosen.append(candidates.pop(best))
        x = np.column_stack([x, steps[:, best]])
        steps = np.delete(steps, best, axis=1)
    return sorted(chosen)


def step_columns(n: int, cps: Sequence[int]) -> np.ndarray:
    """One column per change point of ``cps`` over ``n`` runs: 0 before it, 1 from it on."""
    return (np.arange(n)[:, None] >= np.asarray(cps)[None, :]).astype(float)
