"""`python -m analysis history`: a history's runs and KPIs, filtered, and its CSV export."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.history import HistoryStore
from analysis.listing import filter_history, kpi_lines, run_lines, to_csv_frame
from core.errors import UserError
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


# -- a run is named as its folder and the terminal name it -------------------------------

def _with_runs(frame: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    """Two cells (the two models) per flow run: ``run_id`` is the flow run's, ``cell`` the
    name its flow gave the cell."""
    by_uuid = {u: run_ids[int(u[1:4]) % len(run_ids)] for u in frame["run_uuid"]}
    return frame.assign(run_id=frame["run_uuid"].map(by_uuid),
                        cell=frame["model"].map({"m1": "base", "m2": "bigger"}))


@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.text("0123456789abcdef", min_size=32, max_size=32), min_size=2,
                    max_size=4, unique_by=lambda t: t[:8]))
def test_a_run_folder_id_or_name_selects_every_cell_of_that_run(ids: list[str]) -> None:
    from analysis.compare import runs_named

    frame = _with_runs(_runs([True] * 6), ids)
    for run_id in ids:
        mine = frame["run_id"] == run_id
        folder = f"runs/20261126-231016-fine_tuning-{run_id[:8]}/"
        for token in (run_id[:8], run_id, folder, folder.strip("/").split("/")[-1]):
            assert runs_named(frame, token).equals(mine), token
        assert set(filter_history(frame, [run_id[:8]])["run_uuid"]) == set(
            frame.loc[mine, "run_uuid"])
    # a uuid still names exactly its own rows; a short or unknown token names none
    uuid = frame["run_uuid"].iloc[0]
    assert runs_named(frame, uuid).equals(frame["run_uuid"] == uuid)
    assert not runs_named(frame, ids[0][:7]).any()
    with pytest.raises(UserError, match="not in the history"):
        filter_history(frame, ["ffffffffff"])


def test_the_listing_shows_the_run_folder_id_and_the_cell_name() -> None:
    frame = _with_runs(_runs([True, True]), ["25f0bdb0" + "0" * 24])
    lines = run_lines(frame)
    assert lines[0].split()[:5] == ["start", "(UTC)", "run", "cell", "uuid"]
    assert all(" 25f0bdb0 " in line for line in lines[1:])
    assert {line.split()[3] for line in lines[1:]} == {"base", "bigger"}
    assert all(" 25f0bdb0 " in line for line in kpi_lines(frame)[1:])
    # an older history: no run id, no cell name — the uuid's start and the dir instead
    old = _runs([True]).assign(test_path="001__cell")
    assert run_lines(old)[1].split()[2:4] == ["r000-m1", "001__cell"]


def test_the_subcommands_default_to_the_projects_own_history(tmp_path: Path) -> None:
    frame = _runs([True, True, True])
    for column in ("run_uuid", "kpi", "unit", "model", "vllm", "validity", "run_identity"):
        frame[column] = frame[column].astype("string")
    env = {**os.environ, "TELLTALE_DATA_DIR": str(tmp_path)}

    def history(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "analysis", "history", *args],
                              capture_output=True, text=True, timeout=300, env=env,
                              check=False)

    none = history()
    assert none.returncode == 2 and "no history under" in none.stderr
    HistoryStore(str(tmp_path / "history" / "fine_tuning")).bulk_append(frame)
    alone = history()  # the only one there
    assert alone.returncode == 0 and len(alone.stdout.splitlines()) == 1 + 6, alone.stderr
    HistoryStore(str(tmp_path / "history" / "llm_serving")).bulk_append(frame)
    several = history()
    assert several.returncode == 2
    assert "the histories of fine_tuning, llm_serving: give --project" in several.stderr
    named = history("--project", "llm_serving")
    assert named.returncode == 0 and named.stdout == alone.stdout
    unknown = history("--project", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr
