"""Self-contained HTML reports: shape a DataFrame, then draw it with plotly express.

``plots.yaml`` lists the reports (kinds below) in page order. Every page embeds plotly.js
once, so it opens offline; ``index.html`` links the pages and shows the verdict summary.

Kinds (explicit registry, no self-registration):

- ``kpi_table``: one row per run, one column per KPI, with the settings that vary;
- ``kpi_history``: each KPI over time for the current runs' configurations;
- ``loss_curve``: training loss per logging step, one line per run;
- ``regression``: the verdict table, coloured by kind;
- ``users``: per-user results of multi-user runs (time to start, runtime, throughput);
- ``errors``: failed runs, skipped dirs and parse problems.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.discovery import Discovery
from analysis.errors import ConfigError
from analysis.project import AnalysisProject
from analysis.yamlio import load_yaml

__all__ = [
    "REPORT_KINDS",
    "ReportContext",
    "render_report",
    "shape_errors",
    "shape_kpi_history",
    "shape_kpi_table",
    "shape_loss_curve",
    "shape_regression",
    "shape_users",
]


@dataclass
class ReportContext:
    """What reports draw from."""

    project: AnalysisProject
    runs: Sequence[Any]  # RunAnalysis (kept loose to avoid an import cycle)
    kpis: pd.DataFrame
    history: pd.DataFrame | None
    verdicts: Sequence[Any]
    discovery: Discovery


# -- shaping (pure, unit-tested) ----------------------------------------------------------


def _varying_settings(runs: Sequence[Any]) -> list[str]:
    from analysis.matrix_utils import flatten_settings

    flat = [flatten_settings(r.result.settings) for r in runs]
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if len({str(f.get(k)) for f in flat}) > 1]


def shape_kpi_table(ctx: ReportContext) -> pd.DataFrame:
    """One row per run: run path, status, the varying settings, then each KPI's value."""
    from analysis.matrix_utils import flatten_settings

    varying = _varying_settings(ctx.runs)
    rows = []
    for run in ctx.runs:
        flat = flatten_settings(run.result.settings)
        row: dict[str, Any] = {"run": run.result.rel_path,
                               "status": run.payload.metadata.status}
        row.update({k: flat.get(k) for k in varying})
        row.update({f"{k.name} [{k.unit}]": k.display() for k in run.kpis})
        rows.append(row)
    return pd.DataFrame(rows)


def shape_kpi_history(ctx: ReportContext, kpis: Sequence[str] | None = None) -> pd.DataFrame:
    """History rows (and the current runs) of the current configurations, tidy."""
    frames = []
    if ctx.history is not None and not ctx.history.empty:
        frames.append(ctx.history.assign(current=False))
    current = ctx.kpis.assign(current=True)
    frames.append(current)
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.drop_duplicates(subset=["run_uuid", "kpi"], keep="last")
    if kpis:
        frame = frame[frame["kpi"].isin(list(kpis))]
    columns = ["timestamp", "kpi", "value", "unit", "configuration", "run_uuid", "current"]
    if frame.empty:  # e.g. a scale test has none of the single-job KPIs
        return pd.DataFrame(columns=columns)
    config_cols = ["model_name", "tuning_method", "per_device_batch_size", "max_seq_length",
                   "accelerator_count", "platform"]
    present = [c for c in config_cols if c in frame.columns]
    frame = frame.assign(configuration=frame[present].astype("string").fillna("")
                         .agg(" / ".join, axis=1) if present else "all")
    # The configurations of this run's rows, read off the same frame: a merge with the
    # history was a cartesian join (10 000 runs: 26.8 GiB) and failed with no label columns.
    wanted = set(frame.loc[frame["current"].astype(bool), "configuration"])
    frame = frame[frame["configuration"].isin(wanted)]
    return frame.sort_values("timestamp")[columns]


def shape_loss_curve(ctx: ReportContext) -> pd.DataFrame:
    """Training loss per logging step, one series per run."""
    if ctx.project.loss_curve is None:
        return pd.DataFrame(columns=["run", "step", "loss"])
    rows = [{"run": run.result.rel_path, **point}
            for run in ctx.runs for point in ctx.project.loss_curve(run.result)]
    return pd.DataFrame(rows, columns=["run", "step", "loss"])


def shape_regression(ctx: ReportContext) -> pd.DataFrame:
    """The verdict table: run, KPI, baseline, latest, change %, verdict, confidence."""
    columns = ["test_path", "kpi", "unit", "baseline", "latest", "change_pct", "verdict",
               "confidence", "history_used", "explanation"]
    return pd.DataFrame([v.model_dump() for v in ctx.verdicts], columns=[
        "run_uuid", *columns])[columns] if ctx.verdicts else pd.DataFrame(columns=columns)


def shape_users(ctx: ReportContext) -> pd.DataFrame:
    """One row per user of multi-user runs (empty for single-user runs)."""
    if ctx.project.user_rows is None:
        return pd.DataFrame()
    rows = [{"run": run.result.rel_path, **row} for run in ctx.runs
            for row in ctx.project.user_rows(run.result)]
    return pd.DataFrame(rows)


def shape_errors(ctx: ReportContext) -> pd.DataFrame:
    """Failed runs, skipped dirs and parse problems, one row each."""
    rows = []
    for run in ctx.runs:
        if run.result.exit_code != 0:
            why = f": {run.result.failure}" if run.result.failure else ""
            rows.append({"where": run.result.rel_path, "kind": "failed run",
                         "detail": f"exit code {run.result.exit_code}{why}"})
        for problem in run.result.problems:
            where = f"{run.result.rel_path}/{problem.file}"
            rows.append({"where": where + (f":{problem.line}" if problem.line else ""),
                         "kind": "parse problem", "detail": problem.message})
    for skipped in ctx.discovery.skipped:
        rows.append({"where": skipped.path, "kind": "skipped dir", "detail": skipped.reason})
    return pd.DataFrame(rows, columns=["where", "kind", "detail"])


# -- drawing ------------------------------------------------------------------------------


def _table_html(frame: pd.DataFrame, empty: str) -> str:
    if frame.empty:
        return f"<p class='empty'>{html.escape(empty)}</p>"
    return frame.to_html(index=False, classes="data", border=0, na_rep="", escape=True)


def _figure_html(figure: Any) -> str:
    return str(figure.to_html(full_html=False, include_plotlyjs=False))


def _draw_kpi_table(ctx: ReportContext, options: dict[str, Any]) -> str:
    return _table_html(shape_kpi_table(ctx), "no KPI could be computed")


def _draw_kpi_history(ctx: ReportContext, options: dict[str, Any]) -> str:
    import plotly.express as px

    frame = shape_kpi_history(ctx, options.get("kpis"))
    if frame.empty:
        return "<p class='empty'>no history yet</p>"
    parts = []
    for kpi, group in frame.groupby("kpi", sort=False):
        unit = group["unit"].iloc[0]
        fig = px.line(group, x="timestamp", y="value", color="configuration", markers=True,
                      title=f"{kpi} [{unit}]", hover_data=["run_uuid", "current"])
        fig.update_layout(height=360, legend={"orientation": "h", "y": -0.3})
        parts.append(_figure_html(fig))
    return "\n".join(parts)


MAX_LOSS_CURVES = 40
"""Runs drawn on the loss-curve page (the last ones in path order): more is unreadable, and
plotly's cost grows per trace (1 000 curves took 6.7 s)."""


def _draw_loss_curve(ctx: ReportContext, options: dict[str, Any]) -> str:
    import plotly.express as px

    frame = shape_loss_curve(ctx)
    if frame.empty:
        return "<p class='empty'>no loss values in the logs</p>"
    runs = list(dict.fromkeys(frame["run"]))
    note = ""
    if len(runs) > MAX_LOSS_CURVES:
        frame = frame[frame["run"].isin(set(runs[-MAX_LOSS_CURVES:]))]
        note = (f"<p class='empty'>showing the last {MAX_LOSS_CURVES} of {len(runs)} runs; "
                "every run's values are in the LTS payload</p>")
    fig = px.line(frame, x="step", y="loss", color="run", markers=True,
                  labels={"step": "logging step"})
    fig.update_layout(height=420)
    return note + _figure_html(fig)


_VERDICT_COLOURS = {"regression": "#f8d7da", "improvement": "#d1e7dd",
                    "no_change": "#ffffff", "insufficient_history": "#eeeeee"}


def _draw_regression(ctx: ReportContext, options: dict[str, Any]) -> str:
    frame = shape_regression(ctx)
    if frame.empty:
        return "<p class='empty'>no verdicts (no history configured?)</p>"
    # Written directly, every cell escaped: result dir names and labels are untrusted (a dir
    # named <img src=x onerror=...> reached the page through Styler, which escapes nothing by
    # default), and Styler took 8 s for 8 000 rows.
    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "<td></td>"
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return f"<td>{html.escape(text)}</td>"

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = "".join(
        f"<tr style='background-color: {_VERDICT_COLOURS.get(str(verdict), '#fff')}'>"
        + "".join(cell(v) for v in values) + "</tr>"
        for verdict, values in zip(frame["verdict"], frame.itertuples(index=False, name=None),
                                   strict=True))
    return (f"<table class='data'><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _draw_users(ctx: ReportContext, options: dict[str, Any]) -> str:
    import plotly.express as px

    frame = shape_users(ctx)
    if frame.empty:
        return "<p class='empty'>no multi-user run</p>"
    figure = px.scatter(frame, x="time_to_start_s", y="runtime_s", color="run",
                        hover_data=list(frame.columns),
                        labels={"time_to_start_s": "time to start (s)",
                                "runtime_s": "runtime (s)"})
    figure.update_layout(height=420)
    return _figure_html(figure) + _table_html(frame, "")


def _draw_errors(ctx: ReportContext, options: dict[str, Any]) -> str:
    return _table_html(shape_errors(ctx), "no failed run, no parse problem")


REPORT_KINDS: dict[str, Callable[[ReportContext, dict[str, Any]], str]] = {
    "kpi_table": _draw_kpi_table,
    "kpi_history": _draw_kpi_history,
    "loss_curve": _draw_loss_curve,
    "regression": _draw_regression,
    "users": _draw_users,
    "errors": _draw_errors,
}

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4} .empty{color:#888} nav a{margin-right:1em}
"""


def _page(title: str, body: str, plotly_js: str | None) -> str:
    script = f"<script>{plotly_js}</script>" if plotly_js else ""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_STYLE}</style>{script}</head><body>{body}</body></html>")


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


def render_report(out_dir: Path, project: AnalysisProject, runs: Sequence[Any],
                  kpis: pd.DataFrame, history: pd.DataFrame | None, verdicts: Sequence[Any],
                  discovery: Discovery) -> Path:
    """Write one HTML page per report plus ``index.html``; returns the index path."""
    from plotly.offline import get_plotlyjs

    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(project, runs, kpis, history, verdicts, discovery)
    plotly_js = get_plotlyjs()
    links = []
    for index, entry in enumerate(_load_plots(project)):
        kind, title = entry["kind"], str(entry.get("title", entry["kind"]))
        options = {k: v for k, v in entry.items() if k not in ("kind", "title")}
        body = REPORT_KINDS[kind](ctx, options)
        name = f"{index:02d}_{kind}.html"
        needs_js = "Plotly" in body or "plotly" in body
        (out_dir / name).write_text(_page(title, f"<p><a href='index.html'>← index</a></p>"
                                                 f"<h1>{html.escape(title)}</h1>{body}",
                                          plotly_js if needs_js else None), encoding="utf-8")
        links.append((name, title))
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.verdict] = counts.get(verdict.verdict, 0) + 1
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no verdicts"
    failed = sum(1 for r in runs if r.result.exit_code != 0)
    body = (f"<h1>{html.escape(project.name)} — results</h1>"
            f"<p>{len(runs)} run(s), {failed} failed. Verdicts: {html.escape(summary)}.</p>"
            "<ul>" + "".join(f"<li><a href='{n}'>{html.escape(t)}</a></li>" for n, t in links)
            + "</ul>")
    index_path = out_dir / "index.html"
    index_path.write_text(_page(f"{project.name} report", body, None), encoding="utf-8")
    return index_path
