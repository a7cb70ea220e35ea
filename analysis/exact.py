"""The level changes of a series without noise (a count, a setting, a quantised size)."""

from __future__ import annotations

import numpy as np

__all__ = ["exact_steps"]


def exact_steps(y: np.ndarray, min_size: int) -> list[int] | None:
    """The level changes of a series without noise: where its value changes; None if noisy.

    A noise-free KPI (a count, a setting, a quantised size) is piecewise constant, and the
    segmentation's noise floor made every run it placed one run off a "significant" slope:
    40-50 % of noise-free step series got extra change points, some 50 (a staircase read as
    a drift, cut into a sawtooth). Here the changes are exact. It applies when the value
    changes rarely (at most once in ``min_size`` runs, outliers counted twice: quantised
    noise flips more often and is segmented as noise). A lone run that differs and returns
    to the level exactly, or a lone first or last run, is one run, not a level (as the
    shield reads it).
    """
    if len(y) < 3:
        return None
    moved = np.flatnonzero(np.diff(y) != 0.0)
    if len(moved) == 0 or len(moved) > len(y) // min_size:
        return None
    changes: list[int] = []
    skip = False
    for i, at in enumerate(moved):
        if skip:
            skip = False
            continue
        if i + 1 < len(moved) and moved[i + 1] == at + 1 and y[at + 2] == y[at]:
            skip = True  # one run off and back: an outlier
            continue
        if at + 1 in (1, len(y) - 1):
            continue  # a lone first or last run
        changes.append(int(at) + 1)
    return changes
