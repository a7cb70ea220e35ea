"""Checks shared by the detector's generated-series tests (`tests/analysis`)."""

from __future__ import annotations

from collections.abc import Sequence

from analysis.regression import VerdictKind, change_points, verdict

KINDS = set(VerdictKind.__args__)  # type: ignore[attr-defined]


def assert_ordered_and_explained(series: Sequence[float], direction: str) -> None:
    """Change points are increasing run indices inside ``series``; the verdict of its last
    run on the others is a known kind with an explanation."""
    found = change_points(series, direction)  # type: ignore[arg-type]
    assert found == sorted(set(found)) and all(0 < c < len(series) for c in found), found
    judged = verdict(series[:-1], series[-1], direction)  # type: ignore[arg-type]
    assert judged.kind in KINDS and judged.explanation


def step_found(series: Sequence[float], at: int, tolerance: int = 2) -> tuple[bool, int]:
    """(whether a change point lies within ``tolerance`` runs of ``at``, how many others)."""
    cps = change_points(series)
    hit = [c for c in cps if abs(c - at) <= tolerance]
    return bool(hit), len(cps) - len(hit[:1])
