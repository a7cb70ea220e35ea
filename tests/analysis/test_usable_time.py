"""A run's start and end as read without pandas: the answer ``pd.Timestamp`` gives.

`analysis.run_analysis._usable_time` reads the plain ISO 8601 forms with the standard
library (the early parse analyses runs before pandas is imported) and hands everything else
to pandas (`_usable_by_pandas`: the reading as it was, every text through pandas). Generated
texts — ISO-like ones around every edge of the grammar and the
1970-2200 window, and any text at all — must get the pandas reading's answer.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.run_analysis import _usable_by_pandas as _by_pandas
from analysis.run_analysis import _usable_time


def _two(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(lambda n: f"{n:02d}")


ISO_LIKE = st.builds(
    lambda y, mo, d, sep, hm, sec, frac, zone: f"{y:04d}-{mo}-{d}" + (
        f"{sep}{hm}{sec}{frac}{zone}" if hm else zone if sep == "T" else ""),
    st.sampled_from([0, 1, 1969, 1970, 1999, 2026, 2199, 2200, 9999]),
    _two(0, 13), _two(0, 32), st.sampled_from(["T", " "]),
    st.one_of(st.just(""), st.builds(lambda h, m: f"{h}:{m}", _two(0, 25), _two(0, 61))),
    st.one_of(st.just(""), _two(0, 61).map(lambda s: f":{s}")),
    st.one_of(st.just(""), st.integers(1, 9).map(lambda n: "." + "7" * n)),
    st.sampled_from(["", "Z", "+00:00", "-05:00", "+14:00", "+23:59", "-12:30"]))


@settings(max_examples=400, deadline=None)
@given(ISO_LIKE)
def test_iso_times_read_as_pandas_reads_them(text: str) -> None:
    assert _usable_time(text) == _by_pandas(text)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=40), st.integers(), st.floats(), st.none()))
def test_any_value_reads_as_pandas_reads_it(value: Any) -> None:
    assert _usable_time(value) == _by_pandas(value)


def test_the_window_edges() -> None:
    assert _usable_time("1970-01-01T00:00:00Z") == "1970-01-01T00:00:00Z"
    assert _usable_time("1970-01-01T00:30:00+01:00") is None  # 1969 in UTC
    assert _usable_time("2199-12-31T23:59:59.999999Z") is not None
    assert _usable_time("2200-01-01") is None
    assert _usable_time("9999-12-31T00:00:00Z") is None
