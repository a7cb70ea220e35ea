"""KPI windows from a result's untrusted numbers: one helper (`projects.library.energy.
kpi_window`) that never raises, and no parser that does the time arithmetic itself."""

from __future__ import annotations

import ast
import math
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from projects.library.energy import kpi_window

ROOT = Path(__file__).resolve().parents[2]
_NUMBERS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                     st.integers(-10**30, 10**30).map(float),
                     st.datetimes(timezones=st.just(UTC)), st.datetimes())


@given(start=_NUMBERS, end=_NUMBERS,
       seconds=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_a_window_from_any_numbers_is_a_window_or_unknown(start: object, end: object,
                                                          seconds: float | None) -> None:
    first, last = kpi_window(start, end, seconds=seconds)  # type: ignore[arg-type]
    assert (first is None) == (last is None)
    if first is not None and last is not None:
        assert first.tzinfo is not None and last.tzinfo is not None
        if seconds is not None and (start is None) != (end is None):
            assert math.isclose((last - first).total_seconds(), seconds, rel_tol=1e-6,
                                abs_tol=1e-3)


def test_the_overflows_a_result_tree_held_give_no_window() -> None:
    finished = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert kpi_window(end=finished, seconds=1e40) == (None, None)  # train_runtime 1e40
    assert kpi_window(1e30, seconds=10) == (None, None)  # a start in year 3e22
    assert kpi_window(float("nan"), 5.0) == (None, None)
    assert kpi_window(end=finished, seconds=-1) == (None, None)
    assert kpi_window(end=datetime(2026, 1, 1), seconds=1) == (None, None)  # naive
    assert kpi_window(0.0, 60.0) == (datetime(1970, 1, 1, tzinfo=UTC),
                                     datetime(1970, 1, 1, 0, 1, tzinfo=UTC))


def _time_arithmetic(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr in (
            "fromtimestamp", "utcfromtimestamp"))
        or (isinstance(node.func, ast.Name) and node.func.id == "timedelta")
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "timedelta"))]


def test_no_project_builds_a_window_around_the_helper() -> None:
    """A parser's times come from its result tree: built by `kpi_window`, never by hand (a
    ``train_runtime`` of 1e40 overflowed ``timedelta`` and stopped a whole analysis)."""
    offenders = [f"{path.relative_to(ROOT)}:{line}"
                 for path in sorted((ROOT / "projects").rglob("*.py"))
                 if path != ROOT / "projects/library/energy.py"
                 and "workload" not in path.parts  # programs that run, not parsers
                 for line in _time_arithmetic(path)]
    assert not offenders, f"build windows with projects.library.energy.kpi_window: {offenders}"
