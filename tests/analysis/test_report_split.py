"""The report's pages drawn in two processes (`analysis.report_index.render_report`'s
``split``): the same files as one process draws, the other pages really drawn beside, and a
page's failure there raised here."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

from analysis.discovery import discover
from analysis.kpi import kpi_table
from analysis.parsing import parse_dirs
from analysis.project import AnalysisProject, load_project
from analysis.report import REPORT_KINDS
from analysis.report_index import render_report
from analysis.run_analysis import analyse_run
from core.forked import can_fork
from tests.factories import make_result_dir

needs_fork = pytest.mark.skipif(not can_fork(), reason="no second core to draw beside on")


def _inputs(tmp_path: Path, project: AnalysisProject) -> tuple[Any, ...]:
    results = tmp_path / "results"
    for index in range(3):
        make_result_dir(results, f"{index:03d}__cell", exit_code=1 if index == 2 else 0)
    found = discover(results)
    runs = [analyse_run(project, r) for r in parse_dirs(found.results, project.parser)]
    frame = kpi_table((r.run_uuid, r.timestamp, r.kpis) for r in runs)
    return project, runs, frame, None, [], found


def _files(report: Path) -> dict[str, str]:
    """Every file of a report, a plot's random element id made constant."""
    return {p.name: re.sub(r"plot-[0-9a-f]{32}", "plot-X", p.read_text())
            for p in sorted(report.iterdir())}


def _with_plots(tmp_path: Path, kinds: list[str]) -> AnalysisProject:
    plots = tmp_path / "plots.yaml"
    plots.write_text("reports:\n" + "".join(f"  - kind: {k}\n" for k in kinds))
    return dataclasses.replace(load_project("fine_tuning"), plots_file=plots)


@needs_fork
def test_a_report_drawn_in_two_processes_is_the_report_one_draws(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, load_project("fine_tuning"))
    one = render_report(tmp_path / "one", *inputs)
    two = render_report(tmp_path / "two", *inputs, split=True)
    assert one.name == two.name == "index.html"
    drawn = _files(tmp_path / "one")
    assert len(drawn) > 3 and any("kpi_history" in name for name in drawn)
    assert _files(tmp_path / "two") == drawn


@needs_fork
@pytest.mark.parametrize("split", [False, True])
def test_the_pages_not_reading_the_history_are_drawn_beside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: bool) -> None:
    monkeypatch.setitem(REPORT_KINDS, "pid", lambda ctx, options: f"<p>pid={os.getpid()}</p>")
    project = _with_plots(tmp_path, ["kpi_history", "pid", "errors"])
    render_report(tmp_path / "out", *_inputs(tmp_path, project), split=split)
    page = (tmp_path / "out" / "01_pid.html").read_text()
    drawn_by = int(re.search(r"pid=(\d+)", page)[1])  # type: ignore[index]
    assert (drawn_by != os.getpid()) is split
    nav = (tmp_path / "out" / "index.html").read_text()
    # the index links every page, in the plots file's order, wherever it was drawn
    assert nav.index("00_kpi_history.html") < nav.index("01_pid.html") \
        < nav.index("02_errors.html")


@needs_fork
def test_a_page_failing_beside_fails_the_report(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Any, options: Any) -> str:
        raise ValueError(f"page broke in {os.getpid()}")

    monkeypatch.setitem(REPORT_KINDS, "broken", broken)
    project = _with_plots(tmp_path, ["kpi_history", "broken"])
    with pytest.raises(ValueError, match="page broke in") as caught:
        render_report(tmp_path / "out", *_inputs(tmp_path, project), split=True)
    assert str(os.getpid()) not in str(caught.value)  # raised beside, carried here
    assert not (tmp_path / "out" / "index.html").exists()


def test_only_history_pages_or_none_draw_in_one_process(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Nothing to share between two processes: every page is drawn here."""
    monkeypatch.setitem(REPORT_KINDS, "pid", lambda ctx, options: f"<p>pid={os.getpid()}</p>")
    project = _with_plots(tmp_path, ["pid", "errors"])  # no page reads the shaped history
    render_report(tmp_path / "out", *_inputs(tmp_path, project), split=True)
    assert f"pid={os.getpid()}" in (tmp_path / "out" / "00_pid.html").read_text()
