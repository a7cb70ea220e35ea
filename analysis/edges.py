"""A level that began in the newest (or oldest) few runs of a series: the edge test.

The segmentation needs ``min_size`` runs on each side of a change, so a level that began in
the last few runs is invisible to it; `edge_changes` judges such a level the way the verdict
judges the newest runs (`analysis.detector._tail_shifts`), at ``edge_z`` standard errors,
and moves a change the segmentation pinned at its limit.
"""

from __future__ import annotations

import numpy as np

from analysis.detector import DetectorSettings, _expm1, _relative, _tail_shifts

__all__ = ["edge_changes"]


def _edge_change(y: np.ndarray, cps: list[int], s: DetectorSettings,
                 log_scale: bool) -> int | None:
    """A level that began in the last ``min_size - 1`` runs of ``y`` (index), or None.

    The segmentation needs ``min_size`` runs on each side of a change, so a level that began
    in the newest few runs is invisible to it. It is judged like the verdict judges the
    newest runs (`_tail_shifts`: a cautious level of the tail against the current segment,
    the newest run on the same side), at ``edge_z`` standard errors.
    """
    n = len(y)
    longest = s.min_size - 1 if n >= 2 * s.min_size else n - s.min_history
    if longest < 2:
        return None
    shifts = _tail_shifts(y[:-1], y[-1:], s, [c for c in cps if c < n - 1],
                          log_scale=log_scale, young=0, local_drift=True)
    newest = shifts[0]
    edge = [x for x in shifts if 2 <= x.runs <= longest]
    if not edge:
        return None
    best = max(edge, key=lambda x: x.fit)
    step = best.level - best.baseline
    rel = abs(_expm1(step)) if log_scale else abs(_relative(step, best.baseline))
    if (abs(best.z) >= s.edge_z and rel >= s.min_magnitude and np.sign(newest.z) ==
            np.sign(best.z) and abs(newest.z) >= s.edge_z * s.confirm_factor):
        return n - best.runs
    return None


def edge_changes(y: np.ndarray, cps: list[int], s: DetectorSettings,
                  log_scale: bool) -> list[int]:
    """``cps`` plus a change in the newest and in the oldest few runs (`_edge_change`).

    A change the segmentation placed at its limit (``min_size`` runs from an end) is where
    it put a shorter edge level it could not place better: the edge test moves it.
    """
    n, m = len(y), s.min_size
    out = list(cps)
    pinned = bool(out) and out[-1] >= n - m
    tail = _edge_change(y, out[:-1] if pinned else out, s, log_scale)
    if tail is not None:
        if pinned and abs(tail - out[-1]) < m:
            out[-1] = tail
        elif not out or tail - out[-1] >= s.min_history:
            out.append(tail)
    pinned = bool(out) and out[0] <= m
    mirrored = sorted(n - c for c in (out[1:] if pinned else out))
    head = _edge_change(y[::-1].copy(), mirrored, s, log_scale)
    if head is not None:
        if pinned and abs((n - head) - out[0]) < m:
            out[0] = n - head
        elif not out or (n - head) <= out[0] - s.min_history:
            out.insert(0, n - head)
    return sorted(set(out))
