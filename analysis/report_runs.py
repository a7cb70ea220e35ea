"""Report pages of what happened inside runs.

``loss_curve``, ``resources``, ``users``, ``kpi_curve`` (one KPI against another) and
``distribution`` (per-request values).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import pandas as pd

from analysis.report_context import ReportContext
from analysis.report_html import _figure_html, _lines, _short, _table_html
from core.errors import ConfigError


def shape_loss_curve(ctx: ReportContext) -> pd.DataFrame:
    """Training loss per logging step, one series per run."""
    if ctx.project.loss_curve is None:
        return pd.DataFrame(columns=["run", "step", "loss"])
    rows = [{"run": ctx.name_of(run), **point}
            for run in ctx.runs for point in ctx.project.loss_curve(run.result)]
    return pd.DataFrame(rows, columns=["run", "step", "loss"])


def shape_resources(ctx: ReportContext) -> pd.DataFrame:
    """Resource usage over each run's test window: run, seconds, metric, value."""
    columns = ["run", "t_s", "metric", "value"]
    if ctx.project.resource_rows is None:
        return pd.DataFrame(columns=columns)
    rows = [{"run": ctx.name_of(run), **row}
            for run in ctx.runs[-MAX_LOSS_CURVES:] for row in ctx.project.resource_rows(
                run.result)]
    return pd.DataFrame(rows, columns=columns)


def shape_users(ctx: ReportContext) -> pd.DataFrame:
    """One row per user of multi-user runs (empty for single-user runs)."""
    if ctx.project.user_rows is None:
        return pd.DataFrame()
    rows = [{"run": ctx.name_of(run), **row} for run in ctx.runs
            for row in ctx.project.user_rows(run.result)]
    return pd.DataFrame(rows)


def shape_kpi_curve(ctx: ReportContext, x: str, y: str, point: str,
                    group: Sequence[str] = ()) -> pd.DataFrame:
    """Current runs: KPI ``x`` and KPI ``y`` per run, its ``point`` label and group, sorted.

    Rows are ordered by ``point`` (numerically when it is a number) within each group, so a
    line through them is the curve the label walks (e.g. concurrency 1, 2, 4, 8).
    """
    columns = ["run_uuid", "group", point, x, y]
    frame = ctx.kpis
    if frame.empty or not {x, y} <= set(frame["kpi"]):
        return pd.DataFrame(columns=columns)
    wide = frame[frame["kpi"].isin([x, y])].pivot_table(index="run_uuid", columns="kpi",
                                                        values="value", aggfunc="last")
    firsts = frame.drop_duplicates("run_uuid").set_index("run_uuid")
    out = wide.reset_index()
    for name in (point, *group):
        out[name] = out["run_uuid"].map(firsts[name]) if name in firsts.columns else ""
    # an empty label (a local run has no platform) leaves no dangling separator
    out["group"] = (out[list(group)].astype(str).agg(
        lambda row: " / ".join(v for v in row if v and v not in ("nan", "None")) or "all",
        axis=1) if group else "all")
    order = pd.to_numeric(out[point], errors="coerce")
    out = out.assign(_order=order.fillna(float("inf"))).sort_values(["group", "_order"])
    return out.dropna(subset=[x, y])[columns].reset_index(drop=True)


MAX_DISTRIBUTION_RUNS = 10
"""Runs drawn on the distribution page (the newest in path order)."""


def shape_distribution(ctx: ReportContext) -> pd.DataFrame:
    """Tidy per-request values (run, metric, value) of the newest runs that have them."""
    columns = ["run", "metric", "value"]
    if ctx.project.samples is None:
        return pd.DataFrame(columns=columns)
    rows = [{"run": ctx.name_of(run), "metric": metric, "value": value}
            for run in ctx.runs[-MAX_DISTRIBUTION_RUNS:]
            for metric, values in ctx.project.samples(run.result).items()
            for value in values]
    return pd.DataFrame(rows, columns=columns)


MAX_LOSS_CURVES = 40
"""Runs drawn on the loss-curve page (the last ones in path order): more is unreadable, and
plotly's cost grows per trace (1 000 curves took 6.7 s)."""


def _draw_loss_curve(ctx: ReportContext, options: dict[str, Any]) -> str:
    frame = shape_loss_curve(ctx)
    if frame.empty:
        return "<p class='empty'>no loss values in the logs</p>"
    runs = list(dict.fromkeys(frame["run"]))
    note = ""
    if len(runs) > MAX_LOSS_CURVES:
        frame = frame[frame["run"].isin(set(runs[-MAX_LOSS_CURVES:]))]
        note = (f"<p class='empty'>showing the last {MAX_LOSS_CURVES} of {len(runs)} runs; "
                "every run's values are in the LTS payload</p>")
    fig = _lines(frame, "step", "loss", "run", labels={"step": "logging step"})
    return note + _figure_html(fig)


MAX_RESOURCE_CELLS = 10
"""Cells drawn on the resources page (the newest): one row of two charts each."""


def _draw_resources(ctx: ReportContext, options: dict[str, Any]) -> str:
    """Per cell, the workload's own timeline (loss per logging step) next to its resources.

    The two do not share an axis: the trainer logs steps, Prometheus seconds. Cores and %
    are on the right chart's left axis, GB on its right axis.
    """
    frame = shape_resources(ctx)
    if frame.empty:
        return ("<p class='empty'>no resource series: the local platform records them when "
                "<code>prometheus</code> and <code>prometheus-node-exporter</code> are "
                "installed (<code>observe.prometheus</code>)</p>")
    from plotly.subplots import make_subplots  # only when there is something to draw

    runs = list(dict.fromkeys(frame["run"]))[-MAX_RESOURCE_CELLS:]
    # the workload's own timeline only for a project that has one (a serving report showed
    # an empty "loss per logging step" panel)
    loss = shape_loss_curve(ctx) if ctx.project.loss_curve is not None else None
    col = 2 if loss is not None else 1
    fig = make_subplots(rows=len(runs), cols=col, horizontal_spacing=0.12,
                        vertical_spacing=min(0.08, 0.5 / len(runs)),
                        specs=[[*([{}] if loss is not None else []), {"secondary_y": True}]
                               for _ in runs],
                        # each panel titled above it: row titles sat on the right axis's
                        # labels (the GB axis) at every width
                        subplot_titles=[title for r in runs for title in (
                            [f"{_short(r)}: loss per logging step"] if loss is not None
                            else []) + [f"{_short(r)}: resources, s into the test window"]])
    for row, run in enumerate(runs, start=1):
        if loss is not None:
            own = loss[loss["run"] == run]
            fig.add_scatter(x=own["step"], y=own["loss"], mode="lines", name="loss",
                            line={"color": "#555"}, showlegend=row == 1, legendgroup="loss",
                            row=row, col=1)
        mine = frame[frame["run"] == run]
        for metric, values in mine.groupby("metric", sort=False):
            in_gb = "(GB)" in str(metric)
            fig.add_scatter(x=values["t_s"], y=values["value"], mode="lines+markers",
                            name=str(metric), legendgroup=str(metric), showlegend=row == 1,
                            row=row, col=col, secondary_y=in_gb)
        fig.update_yaxes(title_text="cores / %", row=row, col=col, secondary_y=False)
        fig.update_yaxes(title_text="GB", row=row, col=col, secondary_y=True)
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    fig.update_layout(height=280 * len(runs) + 120)
    note = "" if len(runs) == frame["run"].nunique() else (
        f"<p class='empty'>the newest {len(runs)} cells; every cell's series are in its "
        "<code>prometheus/series.parquet</code></p>")
    return note + _figure_html(fig)


def _draw_users(ctx: ReportContext, options: dict[str, Any]) -> str:
    frame = shape_users(ctx)
    if frame.empty:
        return "<p class='empty'>no multi-user run</p>"
    import plotly.express as px  # only when there is something to draw: ~0.2 s to import

    x, y = str(options.get("x", "time_to_start_s")), str(options.get("y", "runtime_s"))
    if not {x, y} <= set(frame.columns):
        return (f"<p class='empty'>the users' rows have no {x!r} or {y!r}</p>"
                + _table_html(frame, ""))
    figure = px.scatter(frame, x=x, y=y, color="run", hover_data=list(frame.columns))
    figure.update_layout(height=420)
    return _figure_html(figure) + _table_html(frame, "")


def _draw_kpi_curve(ctx: ReportContext, options: dict[str, Any]) -> str:
    import plotly.express as px

    missing = [k for k in ("x", "y", "point") if not options.get(k)]
    if missing:
        raise ConfigError(f"kpi_curve needs {', '.join(missing)}",
                          file=str(ctx.project.plots_file))
    x, y, point = str(options["x"]), str(options["y"]), str(options["point"])
    group = [str(g) for g in options.get("group") or []]
    frame = shape_kpi_curve(ctx, x, y, point, group)
    if frame.empty:
        return f"<p class='empty'>no run has both {html.escape(x)} and {html.escape(y)}</p>"
    units = ctx.kpis.drop_duplicates("kpi").set_index("kpi")["unit"]
    figure = px.line(frame, x=x, y=y, color="group", text=point, markers=True,
                     hover_data=["run_uuid"],
                     labels={x: f"{x} [{units.get(x, '')}]", y: f"{y} [{units.get(y, '')}]",
                             "group": " / ".join(group) or "group"})
    figure.update_traces(textposition="top center")
    figure.update_layout(height=480)
    return _figure_html(figure) + _table_html(frame, "")


def _draw_distribution(ctx: ReportContext, options: dict[str, Any]) -> str:
    frame = shape_distribution(ctx)
    if frame.empty:
        return "<p class='empty'>no per-request values</p>"
    import plotly.express as px

    parts = []
    for metric, rows in frame.groupby("metric", sort=True):
        figure = px.box(rows, x="run", y="value", points="outliers",
                        labels={"value": str(metric), "run": "run"}, title=str(metric))
        figure.update_layout(height=380)
        parts.append(_figure_html(figure))
    return "".join(parts)
