"""``python -m analysis compare``: two selections of a history, KPI by KPI."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import given

from analysis.compare import compare_frames
from analysis.history import HistoryStore
from core.errors import UserError

START = datetime(2026, 11, 1, tzinfo=UTC)


def _frame(values_by_run: list[tuple[float, str, bool]], *, lower_better: bool = True,
           kpi: str = "runtime") -> pd.DataFrame:
    rows = []
    for i, (value, release, valid) in enumerate(values_by_run):
        for model in ("m1", "m2"):
            rows.append({"run_uuid": f"r{i:03d}-{model}", "timestamp": START + timedelta(hours=i),
                         "kpi": kpi, "value": value * (1.5 if model == "m2" else 1.0),
                         "unit": "s", "lower_better": lower_better,
                         "ignored_for_regression": False, "model": model, "vllm": release,
                         "validity": "valid" if valid else "invalid", "run_identity": "x",
                         "fingerprint": None})
    frame = pd.DataFrame(rows)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame


def _shifted(n: int, shift: float, noise: float, seed: int) -> list[tuple[float, str, bool]]:
    rng = np.random.default_rng(seed)
    return ([(100 * float(np.exp(rng.normal(0, noise))), "0.32.0", True) for _ in range(n)]
            + [(100 * (1 + shift) * float(np.exp(rng.normal(0, noise))), "0.33.0", True)
               for _ in range(n)])


def test_two_windows_with_a_known_8_percent_shift_at_2_percent_noise_are_worse() -> None:
    frame = _frame(_shifted(20, 0.08, 0.02, 1))
    rows = compare_frames(frame, "2026-11-01..2026-11-01T20:00", "2026-11-01T20:00..")
    assert len(rows) == 2  # one per configuration (model)
    for row in rows:
        assert row.verdict == "worse", row.explanation
        assert row.ci_low_pct < 8 < row.ci_high_pct
        assert row.effect_size > 2


def test_label_selections_compare_within_each_configuration() -> None:
    frame = _frame(_shifted(10, 0.0, 0.005, 2))
    rows = compare_frames(frame, "vllm=0.32.0", "vllm=0.33.0")
    assert {r.configuration for r in rows} == {"model=m1", "model=m2"}
    assert {r.verdict for r in rows} == {"same"}


def test_invalid_runs_are_not_compared_and_one_run_is_inconclusive() -> None:
    values = _shifted(3, 0.5, 0.01, 3)
    values[3] = (1000.0, "0.33.0", False)  # an invalid run: never a measurement
    frame = _frame(values)
    rows = compare_frames(frame, "vllm=0.32.0", "vllm=0.33.0")
    assert all(r.runs_b == 2 for r in rows)
    single = compare_frames(frame, "r000-m1", "r005-m1")
    assert single[0].verdict == "inconclusive" and "2 a side" in single[0].explanation


@given(shift=st.floats(-0.3, 0.3), seed=st.integers(0, 10_000))
def test_the_verdict_agrees_with_its_interval(shift: float, seed: int) -> None:
    rows = compare_frames(_frame(_shifted(6, shift, 0.03, seed), lower_better=False),
                          "vllm=0.32.0", "vllm=0.33.0")
    for row in rows:
        low, high = row.ci_low_pct, row.ci_high_pct
        assert low <= row.change_pct <= high
        expected = ("better" if low > 0 else "worse" if high < 0 else
                    "same" if -2 <= low and high <= 2 else "inconclusive")
        assert row.verdict == expected


@pytest.mark.parametrize("spec", ["nolabel=1", "2026-13-45..", "a=b,=c", "\x1b[2J", "r999"])
def test_bad_selections_are_one_line_user_errors(spec: str) -> None:
    with pytest.raises(UserError):
        compare_frames(_frame(_shifted(3, 0.0, 0.01, 4)), spec, "vllm=0.33.0")


def test_the_command_line_prints_writes_html_and_json(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "hist"))
    frame = _frame(_shifted(8, 0.08, 0.02, 5))
    frame["value"] = frame["value"].astype("float64")
    for column in ("run_uuid", "kpi", "unit", "model", "vllm", "validity", "run_identity",
                   "fingerprint"):
        frame[column] = frame[column].astype("string")
    store.bulk_append(frame)
    done = subprocess.run([sys.executable, "-m", "analysis", "compare", "--history",
                           str(tmp_path / "hist"), "vllm=0.32.0", "vllm=0.33.0",
                           "--html", str(tmp_path / "c" / "compare.html"),
                           "--json", str(tmp_path / "c" / "compare.json")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "worse" in done.stdout and "runtime [model=m1]" in done.stdout
    page = (tmp_path / "c" / "compare.html").read_text()
    # Perfherder-style rows: the verdict with its sign, the change, the interval as a bar
    assert "▼ worse" in page and "<svg width='240'" in page and "95 % interval +" in page
    assert "<script" not in page and not (tmp_path / "c" / "plotly.min.js").exists()
    assert {r["verdict"] for r in json.loads((tmp_path / "c" / "compare.json").read_text())} \
        == {"worse"}
    bad = subprocess.run([sys.executable, "-m", "analysis", "compare", "--history",
                          str(tmp_path / "hist"), "gpu=1", "vllm=0.33.0"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and "no run in the history has a label 'gpu'" in bad.stderr


@given(shared=st.lists(st.sampled_from(["a=1", "b=x,y", "c=", "d=2.5"]), unique=True),
       apart=st.lists(st.sampled_from(["m=1", "m=2", "n=3", "n=4"]), min_size=1, unique=True))
def test_shared_labels_are_said_once_and_rows_name_what_sets_them_apart(
        shared: list[str], apart: list[str]) -> None:
    from analysis.compare import shared_and_distinct

    configurations = [", ".join([*shared, extra]) for extra in apart]
    common, distinct = shared_and_distinct(configurations)
    if len(apart) > 1:
        assert common == ", ".join(shared)
        assert [distinct[c] for c in configurations] == apart
    else:  # one configuration: all of it is shared, nothing per row
        assert distinct[configurations[0]] == ""
