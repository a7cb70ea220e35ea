"""`python -m analysis history`: a history's runs and KPIs, filtered, and its CSV export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.errors import UserError
from analysis.history import HistoryStore
from analysis.listing import filter_history, kpi_lines, run_lines, to_csv_frame
from tests.analysis.test_compare import _frame


def _runs(valid: list[bool]) -> pd.DataFrame:
    return _frame([(100.0 + i, "0.32.0" if i < 3 else "0.33.0", ok)
                   for i, ok in enumerate(valid)])


@settings(max_examples=30, deadline=None)
@given(valid=st.lists(st.booleans(), min_size=1, max_size=8),
       cut=st.integers(min_value=0, max_value=8))
def test_filters_intersect_and_every_run_is_listed_once_newest_first(
        valid: list[bool], cut: int) -> None:
    frame = _runs(valid)
    window = f"2026-11-01T{min(cut, 8):02d}:00.."
    try:
        chosen = filter_history(frame, [window, "model=m1"])
    except UserError:  # the window is past the last run: nothing is selected, and it says so
        assert cut >= len(valid)
        return
    assert set(chosen["model"]) == {"m1"}
    assert (pd.to_datetime(chosen["timestamp"]) >= pd.Timestamp(window[:-2], tz="UTC")).all()
    lines = run_lines(chosen)[1:]
    assert len(lines) == chosen["run_uuid"].nunique() == len(valid) - cut
    stamps = [line[:19] for line in lines]
    assert stamps == sorted(stamps, reverse=True)
    # invalid runs are listed, marked (the history keeps them; they are never a baseline)
    assert sum("invalid" in line for line in lines) == sum(not v for v in valid[cut:])


def test_unknown_kpis_and_empty_selections_say_what_exists() -> None:
    frame = _runs([True, True])
    with pytest.raises(UserError, match="no KPI nope .* they have: runtime"):
        filter_history(frame, kpis=["nope"])
    with pytest.raises(UserError, match="selects no valid run"):
        filter_history(frame, ["vllm=9.9"])
    assert len(kpi_lines(filter_history(frame, kpis=["runtime"]))) == 1 + 4


def test_the_command_lists_and_writes_csv(tmp_path: Path) -> None:
    frame = _runs([True, False, True, True])
    frame["fingerprint"] = '{"package:torch": "2.13.0"}'
    for column in ("run_uuid", "kpi", "unit", "model", "vllm", "validity", "run_identity",
                   "fingerprint"):
        frame[column] = frame[column].astype("string")
    HistoryStore(str(tmp_path / "hist")).bulk_append(frame)
    csv = tmp_path / "out" / "rows.csv"
    (tmp_path / "out").mkdir()
    done = subprocess.run([sys.executable, "-m", "analysis", "history", "--history",
                           str(tmp_path / "hist"), "--select", "model=m2", "--kpis",
                           "--csv", str(csv)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("runtime") == 4 and "invalid" in done.stdout
    written = pd.read_csv(csv)
    assert len(written) == 4 and set(written["model"]) == {"m2"}
    assert written["fingerprint"].str.contains("package:torch").all()
    bad = subprocess.run([sys.executable, "-m", "analysis", "history", "--history",
                          str(tmp_path / "hist"), "--select", "nolabel=1"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and "no run in the history has a label 'nolabel'" in bad.stderr
    assert to_csv_frame(frame).shape[0] == len(frame)
    # the data dir's history root holds one folder a project: it names them
    root = subprocess.run([sys.executable, "-m", "analysis", "history", "--history",
                           str(tmp_path)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert root.returncode == 2
    assert f"the histories of hist: give one, e.g. --history {tmp_path / 'hist'}" in root.stderr
