"""``python -m tests.analysis.report_split_probe DIR``: the report drawn in one process and in
two (`analysis.report_index.render_report`'s ``split``), in a fresh interpreter — a test
process has threads by then (Prefect's, a server's), and `core.forked` never forks beside a
thread. Prints what it saw as JSON (`test_report_split`)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from analysis.discovery import discover
from analysis.kpi import kpi_table
from analysis.parsing import parse_dirs
from analysis.project import AnalysisProject, load_project
from analysis.report import REPORT_KINDS
from analysis.report_index import render_report
from analysis.run_analysis import analyse_run
from core.forked import can_fork
from tests.factories import make_result_dir


def _inputs(root: Path, project: AnalysisProject) -> tuple[Any, ...]:
    results = root / "results"
    if not results.is_dir():
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


def _with_plots(root: Path, name: str, kinds: list[str]) -> AnalysisProject:
    plots = root / f"{name}.yaml"
    plots.write_text("reports:\n" + "".join(f"  - kind: {k}\n" for k in kinds))
    return dataclasses.replace(load_project("fine_tuning"), plots_file=plots)


def _pid_page(ctx: Any, options: Any) -> str:
    return f"<p>pid={os.getpid()}</p>"


def _broken_page(ctx: Any, options: Any) -> str:
    raise ValueError(f"page broke in {os.getpid()}")


def _drawn_by(page: Path) -> int:
    found = re.search(r"pid=(\d+)", page.read_text())
    assert found is not None
    return int(found[1])


def main(root: Path) -> dict[str, Any]:
    """Every case's outcome."""
    REPORT_KINDS["pid"] = _pid_page
    REPORT_KINDS["broken"] = _broken_page
    out: dict[str, Any] = {"pid": os.getpid(), "can_fork": can_fork()}
    inputs = _inputs(root, load_project("fine_tuning"))
    render_report(root / "one", *inputs)
    render_report(root / "two", *inputs, split=True)
    out["one"], out["two"] = _files(root / "one"), _files(root / "two")
    for split in (False, True):
        project = _with_plots(root, "pid", ["kpi_history", "pid", "errors"])
        report = root / f"pid-{split}"
        render_report(report, *_inputs(root, project), split=split)
        out[f"pid_page_{split}"] = _drawn_by(report / "01_pid.html")
        out[f"pid_index_{split}"] = (report / "index.html").read_text()
    project = _with_plots(root, "no-history", ["pid", "errors"])
    render_report(root / "no-history", *_inputs(root, project), split=True)
    out["no_history_page"] = _drawn_by(root / "no-history" / "00_pid.html")
    project = _with_plots(root, "broken", ["kpi_history", "broken"])
    try:
        render_report(root / "broken", *_inputs(root, project), split=True)
    except ValueError as exc:
        out["broken"] = str(exc)
    out["broken_index"] = (root / "broken" / "index.html").exists()
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
