"""Self-contained HTML reports: shape a DataFrame, then draw it with plotly express.

``plots.yaml`` lists the reports (kinds below) in page order. The pages share one offline
``plotly.min.js`` written beside them (one copy per report, not 4.8 MB per page);
``index.html`` links the pages and shows a headline per KPI and configuration: latest value,
verdict colour, change against the baseline and a sparkline of its history.

Kinds (explicit registry, no self-registration):

- ``kpi_table``: one row per run, one column per KPI, with the settings that vary;
- ``kpi_history``: each KPI over time, one line per configuration (the labels the
  regression compares on: every label but the ignored and the compared ones), with the
  change points found on each line and the current runs' verdicts marked;
- ``loss_curve``: training loss per logging step, one line per run;
- ``regression``: the verdict table, coloured by kind;
- ``users``: per-user results of multi-user runs (options ``x``/``y``: the columns drawn);
- ``kpi_curve``: one KPI against another for the current runs, one line per group, points
  named and ordered by a label (the serving curve: throughput vs latency by concurrency);
- ``distribution``: per-request values of the newest runs (the project's ``samples``),
  one box per run and metric;
- ``errors``: failed runs (their own last words and links to their logs), skipped dirs and
  parse problems.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from typing import Any

from analysis.project import AnalysisProject

# the page kinds' modules; their public shapers are this module's API (``__all__``)
from analysis.report_context import ReportContext, configuration_keys, run_name
from analysis.report_history import (
    _draw_kpi_history,
    _draw_kpi_table,
    shape_kpi_history,
    shape_kpi_table,
)
from analysis.report_html import _figure_html
from analysis.report_runs import (
    _draw_distribution,
    _draw_kpi_curve,
    _draw_loss_curve,
    _draw_resources,
    _draw_users,
    shape_distribution,
    shape_kpi_curve,
    shape_loss_curve,
    shape_resources,
    shape_users,
)
from analysis.report_verdicts import _draw_errors, _draw_regression, shape_errors, shape_regression
from core.errors import ConfigError
from core.yamlio import load_yaml

__all__ = [
    "REPORT_KINDS",
    "ReportContext",
    "configuration_keys",
    "shape_errors",
    "shape_distribution",
    "shape_kpi_curve",
    "shape_kpi_history",
    "shape_kpi_table",
    "shape_loss_curve",
    "shape_resources",
    "shape_regression",
    "run_name",
    "shape_users",
]


def _draw_curve_band(ctx: ReportContext, options: dict[str, Any]) -> str:
    from analysis.report_curve import curve_facts_html, curve_figures, curve_title, worst_first

    spec = ctx.project.curve
    if spec is None or not ctx.curves:
        return ("<p class='empty'>no curve: the runs hold no sweep of two loads or more "
                "with a run id (or the project declares none)</p>")
    units = ctx.kpis.drop_duplicates("kpi").set_index("kpi")["unit"].to_dict() \
        if not ctx.kpis.empty else {}
    parts = []
    for curve in worst_first(ctx.curves):
        figures = "".join(f"<div class='curve-chart'>{_figure_html(f)}</div>"
                          for f in curve_figures(curve, spec, units))
        parts.append(f"<section class='curve'><h2>{html.escape(curve_title(curve))}</h2>"
                     f"<div class='curve-charts'>{figures}</div>"
                     f"{curve_facts_html(curve)}</section>")
    return "".join(parts)


PageBody = str | Iterator[str]
"""What a report kind draws: a page's HTML, whole or in parts written as they are drawn."""

REPORT_KINDS: dict[str, Callable[[ReportContext, dict[str, Any]], PageBody]] = {
    "kpi_table": _draw_kpi_table,
    "kpi_history": _draw_kpi_history,
    "loss_curve": _draw_loss_curve,
    "resources": _draw_resources,
    "regression": _draw_regression,
    "users": _draw_users,
    "kpi_curve": _draw_kpi_curve,
    "curve_band": _draw_curve_band,
    "distribution": _draw_distribution,
    "errors": _draw_errors,
}


def _load_plots(project: AnalysisProject) -> list[dict[str, Any]]:
    if project.plots_file is None:
        return [{"kind": k, "title": k} for k in REPORT_KINDS]
    data, _ = load_yaml(project.plots_file)
    reports = (data or {}).get("reports") if isinstance(data, dict) else None
    if not isinstance(reports, list):
        raise ConfigError("expected 'reports:' with a list", file=str(project.plots_file))
    for index, entry in enumerate(reports):
        if not isinstance(entry, dict) or entry.get("kind") not in REPORT_KINDS:
            raise ConfigError(f"reports[{index}]: unknown kind; known: "
                              f"{', '.join(REPORT_KINDS)}", file=str(project.plots_file))
    return reports
