"""The report's pages drawn in two processes (`analysis.report_index.render_report`'s
``split``): the same files as one process draws, the other pages really drawn beside, and a
page's failure there raised here.

Run in a fresh interpreter (`tests.analysis.report_split_probe`): a test process has
threads by the time it gets here, and `core.forked` never forks beside a thread — the
report would be drawn in one process and the checks below would prove nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The probe's outcome: every case drawn once, in one fresh interpreter."""
    root = tmp_path_factory.mktemp("split")
    proc = subprocess.run([sys.executable, "-m", "tests.analysis.report_split_probe",
                           str(root)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["can_fork"]:
        pytest.skip("one usable core (or TELLTALE_BESIDE=0): the report is drawn in one "
                    "process")
    return out


def test_a_report_drawn_in_two_processes_is_the_report_one_draws(probe: dict[str, Any]
                                                                 ) -> None:
    assert len(probe["one"]) > 3 and any("kpi_history" in name for name in probe["one"])
    assert "index.html" in probe["one"]
    assert probe["two"] == probe["one"]


def test_the_pages_not_reading_the_history_are_drawn_beside(probe: dict[str, Any]) -> None:
    assert probe["pid_page_False"] == probe["pid"]
    assert probe["pid_page_True"] != probe["pid"]
    for split in (False, True):  # the index links every page in the plots file's order
        nav = probe[f"pid_index_{split}"]
        assert nav.index("00_kpi_history.html") < nav.index("01_pid.html") \
            < nav.index("02_errors.html")


def test_no_page_reading_the_history_draws_every_page_here(probe: dict[str, Any]) -> None:
    """Nothing for two processes to share: every page is drawn by the report's process."""
    assert probe["no_history_page"] == probe["pid"]


def test_a_page_failing_beside_fails_the_report(probe: dict[str, Any]) -> None:
    assert probe["broken"].startswith("page broke in ")
    assert probe["broken"] != f"page broke in {probe['pid']}"  # raised beside, carried here
    assert not probe["broken_index"]
