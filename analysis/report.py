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

import datetime
import filecmp
import html
import json
import math
import os
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.discovery import Discovery
from analysis.history import VALIDITY
from analysis.kpi import BASE_COLUMNS, display_value
from analysis.project import AnalysisProject
from analysis.regression import DEFAULTS, DetectorSettings, change_points, pooled_noise
from core.errors import ConfigError
from core.safeio import copy_file, link_file
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


@dataclass
class ReportContext:
    """What reports draw from."""

    project: AnalysisProject
    runs: Sequence[Any]  # RunAnalysis (kept loose to avoid an import cycle)
    kpis: pd.DataFrame
    history: pd.DataFrame | None
    verdicts: Sequence[Any]
    discovery: Discovery
    ignored_labels: Sequence[str] = field(default_factory=tuple)
    compared_label: str | None = None
    out_dir: Path | None = None  # where the pages are written (for relative links)
    detector: DetectorSettings = DEFAULTS  # the run's own tuning: the same change points
    shaped: dict[Any, pd.DataFrame] = field(default_factory=dict)  # shape_kpi_history cache
    history_uri: str | None = None  # for the accept command of the triage table
    shared_labels: dict[str, str] = field(default_factory=dict)  # every shown line has these
    target_mde_pct: float = 5.0  # KPIs whose minimum detectable effect is larger: flagged
    curves: Sequence[Any] = field(default_factory=tuple)  # analysis.curve.CurveResult


# -- shaping (pure, unit-tested) ----------------------------------------------------------


def run_name(run: Any) -> str:
    """A run as a person reads it: ``base · 2026-11-26 23:10 · 25f0bdb0``.

    Its cell's name (as the terminal says it), its start (UTC, to the minute) and the id its
    run folder ends with; a run without a flow's run id shows its uuid's first 8 instead.
    """
    stamp = getattr(run, "timestamp", None)
    try:
        when = pd.Timestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "?"
    except (ValueError, TypeError, OverflowError):
        when = "?"
    labels = getattr(run, "labels", None) or {}
    short = str(labels.get("run_id") or run.run_uuid)[:8]
    cell = getattr(run, "name", None)
    return f"{cell} · {when} · {short}" if cell else f"{when} · {short}"


def _varying_settings(flat: Sequence[dict[str, Any]]) -> list[str]:
    """The keys of flattened settings whose value is not the same in every run."""
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if len({str(f.get(k)) for f in flat}) > 1]


def shape_kpi_table(ctx: ReportContext) -> pd.DataFrame:
    """One row per run: run path, status, the varying settings, then each KPI's value.

    The values come from the KPI table (``ctx.kpis``), matched by run uuid, in each KPI's
    display format.
    """
    from analysis.matrix_utils import flatten_settings

    flat = [flatten_settings(r.result.settings) for r in ctx.runs]
    varying = _varying_settings(flat)
    values: dict[str, dict[str, str]] = {}
    names: dict[str, None] = {}  # the KPI columns, in order of first appearance
    frame = ctx.kpis
    if not frame.empty:
        formats = {d.name: d.format for d in ctx.project.kpis}
        frame = frame[frame["run_uuid"].isin({r.run_uuid for r in ctx.runs})]
        # lists first: iterating Arrow-backed columns goes element by element through pandas
        for uuid, kpi, unit, value in zip(*(frame[c].tolist() for c in
                                            ("run_uuid", "kpi", "unit", "value")), strict=True):
            name = f"{kpi} [{unit}]"
            names.setdefault(name)
            values.setdefault(uuid, {})[name] = display_value(
                formats.get(kpi, "{:.3f}"), value)
    # built by column: a frame from 1 000 row dicts cost more than the rows themselves
    columns: dict[str, list[Any]] = {
        "run": [run_name(r) for r in ctx.runs],
        "dir": [r.result.rel_path for r in ctx.runs],
        "status": [r.payload.metadata.status for r in ctx.runs]}
    for key in varying:
        columns.setdefault(key, [f.get(key) for f in flat])
    for name in names:
        if name not in columns:
            columns[name] = [values.get(r.run_uuid, {}).get(name) for r in ctx.runs]
    return pd.DataFrame(columns)


def configuration_keys(ctx: ReportContext) -> list[str]:
    """The labels that tell configurations apart.

    The current runs' labels, less the ignored and the compared ones: exactly what the
    regression's history query matches on.
    """
    skip = set(ctx.ignored_labels) | {ctx.compared_label} | set(BASE_COLUMNS)
    return sorted({k for run in ctx.runs for k in run.labels} - skip)


def shape_kpi_history(ctx: ReportContext, kpis: Sequence[str] | None = None) -> pd.DataFrame:
    """History rows (and the current runs) of the current configurations, tidy."""
    full = ctx.shaped.get(None)
    if full is None:
        full = ctx.shaped[None] = _shape_kpi_history(ctx)
    if not kpis or full.empty:
        return full
    part = full[full["kpi"].isin(list(kpis))]
    # the configurations the current runs have for these KPIs
    wanted = set(part.loc[part["current"].astype(bool), "configuration"])
    return part[part["configuration"].isin(wanted)]


_HISTORY_COLUMNS = ["timestamp", "kpi", "value", "unit", "configuration", "run_uuid",
                    "current", "valid"]


def _shape_kpi_history(ctx: ReportContext) -> pd.DataFrame:
    keys = configuration_keys(ctx)
    # The tidy rows carry the drawn columns only; the configuration's labels are read once
    # per run (a run's labels are the same on each of its KPI rows): a copy of the label
    # columns for every row was ~200 MB at 10 000 runs, and ~40 MB still with only the keys.
    rows, labels = [], []
    for part, current in ((ctx.history, False), (ctx.kpis, True)):
        if part is None or part.empty:
            continue
        valid = (part[VALIDITY].isna() | (part[VALIDITY] == "valid")).to_numpy(dtype=bool) \
            if VALIDITY in part.columns else True
        rows.append(part[["timestamp", "kpi", "value", "unit", "run_uuid"]]
                    .assign(current=current, valid=valid))
        labels.append(part.drop_duplicates("run_uuid", keep="last")[
            ["run_uuid", *(k for k in keys if k in part.columns)]])
    if not rows:
        return pd.DataFrame(columns=_HISTORY_COLUMNS)
    frame = pd.concat(rows, ignore_index=True).drop_duplicates(subset=["run_uuid", "kpi"],
                                                               keep="last")
    if frame.empty:  # e.g. a scale test has none of the single-job KPIs
        return pd.DataFrame(columns=_HISTORY_COLUMNS)
    runs = pd.concat(labels, ignore_index=True).drop_duplicates("run_uuid", keep="last")
    codes, values = _configuration_codes(runs, keys)
    where = pd.Index(runs["run_uuid"]).get_indexer(frame["run_uuid"])
    row_codes = codes[where]
    # The configurations of this run's rows, read off the same frame: a merge with the
    # history was a cartesian join (10 000 runs: 26.8 GiB) and failed with no label columns.
    current = frame["current"].to_numpy(dtype=bool)
    wanted = sorted(set(row_codes[current].tolist()))
    keep = np.isin(row_codes, wanted)
    frame, row_codes = frame[keep], row_codes[keep]
    # Only the labels that tell the shown configurations apart name them (a 24-label name
    # on every line was cut off in the legends); the ones they share are said once.
    varying = [k for k in keys if len({values[c].get(k, "") for c in wanted}) > 1]
    ctx.shared_labels = {k: values[wanted[0]].get(k, "") for k in keys
                         if k not in varying} if wanted else {}
    names = np.empty(max(codes.max(initial=-1) + 1, 1), dtype=object)
    for code in wanted:
        names[code] = " / ".join(f"{k}={values[code].get(k, '')}" for k in varying) \
            or "this configuration"
    # object dtype: pandas would infer an Arrow string column, a copy of the name per row
    # (~110 MB at 10 000 runs); these rows point at one shared string per configuration
    frame = frame.assign(configuration=pd.Series(names[row_codes], index=frame.index,
                                                 dtype="object"))
    return frame.sort_values("timestamp", kind="stable")[_HISTORY_COLUMNS]


def _configuration_codes(runs: pd.DataFrame, keys: Sequence[str]
                         ) -> tuple[np.ndarray, dict[int, dict[str, str]]]:
    """Per row of ``runs``: its configuration's code; and each code's label values.

    A value per row, built row-wise, took 25 s over 130 000 rows; here only each
    configuration's first row is read.
    """
    present = [k for k in keys if k in runs.columns]
    if not present:
        return np.zeros(len(runs), dtype=np.int64), {0: {}}
    codes = runs[present].groupby(present, sort=False, dropna=False).ngroup().to_numpy()
    order, first_rows = np.unique(codes, return_index=True)
    values: dict[int, dict[str, str]] = {}
    for code, row in zip(order, runs[present].iloc[first_rows].itertuples(index=False),
                         strict=True):
        values[int(code)] = {k: ("" if pd.isna(v) else str(v))
                             for k, v in zip(present, row, strict=True)}
    return codes, values


def shape_loss_curve(ctx: ReportContext) -> pd.DataFrame:
    """Training loss per logging step, one series per run."""
    if ctx.project.loss_curve is None:
        return pd.DataFrame(columns=["run", "step", "loss"])
    rows = [{"run": run_name(run), **point}
            for run in ctx.runs for point in ctx.project.loss_curve(run.result)]
    return pd.DataFrame(rows, columns=["run", "step", "loss"])


def shape_resources(ctx: ReportContext) -> pd.DataFrame:
    """Resource usage over each run's test window: run, seconds, metric, value."""
    columns = ["run", "t_s", "metric", "value"]
    if ctx.project.resource_rows is None:
        return pd.DataFrame(columns=columns)
    rows = [{"run": run_name(run), **row}
            for run in ctx.runs[-MAX_LOSS_CURVES:] for row in ctx.project.resource_rows(
                run.result)]
    return pd.DataFrame(rows, columns=columns)


def shape_regression(ctx: ReportContext) -> pd.DataFrame:
    """The verdict table: run, KPI, baseline, latest, change %, verdict, confidence."""
    columns = ["cell", "kpi", "unit", "baseline", "latest", "change_pct", "verdict",
               "validity", "confidence", "history_used", "mde_pct", "explanation",
               "what_changed", "suspects"]
    # column by column: a dict per verdict held ~30 MB over 80 000 verdicts
    # a verdict made before cells had names: its dir
    table = {c: [getattr(v, "cell", "") or v.test_path for v in ctx.verdicts] if c == "cell"
             else [_listed(getattr(v, c, None)) for v in ctx.verdicts] for c in columns}
    return pd.DataFrame(table, columns=columns)


def _listed(value: Any) -> Any:
    return "; ".join(map(str, value)) if isinstance(value, list) else value


def shape_users(ctx: ReportContext) -> pd.DataFrame:
    """One row per user of multi-user runs (empty for single-user runs)."""
    if ctx.project.user_rows is None:
        return pd.DataFrame()
    rows = [{"run": run_name(run), **row} for run in ctx.runs
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
    rows = [{"run": run_name(run), "metric": metric, "value": value}
            for run in ctx.runs[-MAX_DISTRIBUTION_RUNS:]
            for metric, values in ctx.project.samples(run.result).items()
            for value in values]
    return pd.DataFrame(rows, columns=columns)


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


MAX_TABLE_ROWS = 2000
"""Rows a report table shows (10 000 runs x 8 KPIs made an 80 000-row page); the files
(``kpis.parquet``, ``regression.json``) hold every row."""


def _capped(frame: pd.DataFrame, where: str, first: pd.Series | None = None
            ) -> tuple[pd.DataFrame, str]:
    """At most `MAX_TABLE_ROWS` rows, and a note saying where the rest is.

    The ``first`` rows (e.g. regressions) come first, then the last ones.
    """
    if len(frame) <= MAX_TABLE_ROWS:
        return frame, ""
    important = (np.flatnonzero(first.fillna(False).to_numpy(dtype=bool))
                 if first is not None else [])
    shown = frame.iloc[_shown_positions(len(frame), important)]
    return shown, _cap_note(len(shown), len(frame), where, important=first is not None)


def _shown_positions(total: int, first: Sequence[int]) -> list[int]:
    """Which of ``total`` rows a capped table shows.

    The ``first`` positions (at most `MAX_TABLE_ROWS`), then the last of the others, up to
    `MAX_TABLE_ROWS` rows in all.
    """
    kept = [int(i) for i in first[:MAX_TABLE_ROWS]]
    room = MAX_TABLE_ROWS - len(kept)
    chosen = set(kept)
    rest = [i for i in range(total) if i not in chosen][-room:] if room else []
    return kept + rest


def _cap_note(shown: int, total: int, where: str, *, important: bool) -> str:
    return (f"<p class='empty'>showing {shown} of {total} rows"
            f"{' (every regression and improvement first)' if important else ''}; "
            f"all of them are in {html.escape(where)}</p>")


def _cell_text(value: Any, digits: int) -> str:
    """A table cell's escaped text: blank for a missing value, a float to ``digits``."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return html.escape(str(value))


def _table_html(frame: pd.DataFrame, empty: str, *, digits: int = 6,
                row_styles: Sequence[str] | None = None,
                markup: Collection[str] = ()) -> str:
    """An HTML table of ``frame``, every cell escaped (result trees are untrusted).

    ``markup`` names the columns whose cells are HTML this module built from escaped text
    (`_details`, `_change_html`): they go in as they are.

    Written directly: ``DataFrame.to_html`` took 70 ms for the report's 1 000-row KPI table
    (a tenth of that here), ``Styler`` 8 s for 8 000 verdict rows and escaped nothing.
    """
    if frame.empty:
        return f"<p class='empty'>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    opens = (f"<tr style='{html.escape(style)}'>" for style in row_styles) if row_styles \
        is not None else ("<tr>" for _ in range(len(frame)))
    # columns as lists, zipped: itertuples walks Arrow-backed columns element by element
    columns = [frame.iloc[:, i].tolist() for i in range(frame.shape[1])]
    raw = [str(c) in markup for c in frame.columns]
    rows = "".join(opener + "".join(
        f"<td>{v if is_raw else _cell_text(v, digits)}</td>"
        for v, is_raw in zip(values, raw, strict=True))
        + "</tr>" for opener, values in zip(opens, zip(*columns, strict=True), strict=True))
    # in a scrolling box: a wide table scrolls instead of being cut at the page's edge
    return (f"<div class='scroll'><table class='data'><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


def _figure_html(figure: Any) -> str:
    """A figure's ``<div>`` and script: a plotly figure, or a figure dict (see `_lines`).

    A dict (built from typed frames, nothing to validate) is written here as plotly.js's
    own ``Plotly.newPlot`` call: ``plotly.io.to_html`` imports its validators and narwhals
    (~50 ms, a twentieth of a warm post-processing) to skip the validation anyway.
    """
    if not isinstance(figure, dict):
        return str(figure.to_html(full_html=False, include_plotlyjs=False))
    div = f"plot-{uuid.uuid4().hex}"
    return (f"<div id='{div}' class='plotly-graph-div' style='height:100%; width:100%;'>"
            f"</div><script>Plotly.newPlot('{div}',{_script_json(figure.get('data', []))},"
            f"{_script_json(figure.get('layout', {}))},{{\"responsive\":true}});</script>")


def _script_json(value: Any) -> str:
    """``value`` as JSON safe inside a ``<script>``: ``<``, ``>`` and ``&`` escaped.

    Escaped like plotly's encoder does, so a name from an untrusted result tree cannot close
    the script; numpy arrays and scalars become lists and numbers, NaN stays NaN (plotly.js
    draws it as a gap).
    """
    text = json.dumps(value, separators=(",", ":"), default=_json_value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _json_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, datetime.date):  # datetimes (and pandas Timestamps) included
        return value.isoformat()
    raise TypeError(f"a figure value of type {type(value).__name__} has no JSON form")


# plotly express's default colours (plotly.colors.qualitative.Plotly), so the pages drawn
# from dicts look like the ones drawn by plotly express
_COLORWAY = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692",
             "#B6E880", "#FF97FF", "#FECB52"]


_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross", "triangle-down",
            "star", "pentagon", "hexagon"]
"""Marker symbols, one per line of a chart (with the colours): told apart without colour."""


def _axis_values(values: pd.Series) -> Any:
    """Values for a figure dict's axis: timestamps as ISO strings, made in one numpy call.

    A tz-aware column became one Timestamp object a point, then one JSON clean-up each.
    """
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
    if pd.api.types.is_datetime64_dtype(values.dtype):
        return np.datetime_as_string(values.to_numpy(), unit="s").tolist()
    return values.to_numpy()


SHORTEST_TIME_AXIS = pd.Timedelta(minutes=1)
"""A time axis spanning less than this is widened (`time_axis`)."""


def time_axis(values: pd.Series) -> dict[str, Any]:
    """Layout of a time axis: widened to two hours around runs that span under a minute.

    Runs made within one second (a batch of cells, a fixture) gave plotly a range of
    milliseconds: ticks at both edges with two-line labels (``04:22:25.999 / Nov 27, 2026``)
    that ran into the y axis's labels. Otherwise plotly's own range.
    """
    stamps = pd.to_datetime(values, utc=True, errors="coerce").dropna()
    if stamps.empty or stamps.max() - stamps.min() >= SHORTEST_TIME_AXIS:
        return {}
    middle = stamps.min() + (stamps.max() - stamps.min()) / 2
    return {"range": [(middle - pd.Timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S"),
                      (middle + pd.Timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")]}


def _lines(frame: pd.DataFrame, x: str, y: str, color: str, *, hover: Sequence[str] = (),
           title: str | None = None, labels: dict[str, str] | None = None,
           height: int = 420) -> dict[str, Any]:
    """A line chart with markers, one line per ``color`` group, as a plotly figure dict.

    What ``plotly.express.line(..., markers=True)`` draws, without its cost: the two pages
    every run draws over its whole history (KPI history, loss curves) spent ~0.5 s of a
    1 000-run report in plotly express and figure validation. Hover shows the group, x, y
    and each ``hover`` column.
    """
    labels = labels or {}
    template = "<br>".join([f"{html.escape(labels.get(color, color))}=%{{fullData.name}}",
                            f"{html.escape(labels.get(x, x))}=%{{x}}",
                            f"{html.escape(labels.get(y, y))}=%{{y}}",
                            *(f"{html.escape(name)}=%{{customdata[{i}]}}"
                              for i, name in enumerate(hover))]) + "<extra></extra>"
    data = []
    for index, (name, group) in enumerate(frame.groupby(color, sort=False)):
        # each line its own marker too: readable without colour (and printed grey)
        trace = {"type": "scatter", "mode": "lines+markers", "name": str(name),
                 "legendgroup": str(name), "showlegend": True, "x": _axis_values(group[x]),
                 "y": group[y].to_numpy(), "hovertemplate": template,
                 "marker": {"symbol": _SYMBOLS[index % len(_SYMBOLS)]}}
        if hover:
            trace["customdata"] = group[list(hover)].astype(str).to_numpy()
        data.append(trace)
    # automargin: an axis title moves out of the way of long or slanted tick labels
    time = time_axis(frame[x]) if pd.api.types.is_datetime64_any_dtype(frame[x].dtype) \
        else {}
    layout: dict[str, Any] = {
        "height": height, "colorway": _COLORWAY, "legend": {"title": {"text": color}},
        "xaxis": {"title": {"text": labels.get(x, x)}, "automargin": True, **time},
        "yaxis": {"title": {"text": labels.get(y, y)}, "automargin": True}}
    if title:
        layout["title"] = {"text": title}
    return {"data": data, "layout": layout}


def _draw_kpi_table(ctx: ReportContext, options: dict[str, Any]) -> str:
    # the newest runs only are shown: only they are shaped
    shown = replace(ctx, runs=ctx.runs[-MAX_TABLE_ROWS:], shaped={})
    note = "" if len(shown.runs) == len(ctx.runs) else _cap_note(
        len(shown.runs), len(ctx.runs), "kpis.parquet", important=False)
    return note + _table_html(shape_kpi_table(shown), "no KPI could be computed")


MAX_HISTORY_LINES = 12
"""Configurations drawn per KPI chart (the newest ones): more lines are unreadable."""


def _draw_kpi_history(ctx: ReportContext, options: dict[str, Any]) -> str:
    frame = shape_kpi_history(ctx, options.get("kpis"))
    if frame.empty:
        return "<p class='empty'>no history yet</p>"
    verdicts = {(v.run_uuid, v.kpi): v for v in ctx.verdicts}
    parts = [_shared_html(ctx)]
    for kpi, group in frame.groupby("kpi", sort=False):
        unit = group["unit"].iloc[0]
        shown = list(dict.fromkeys(group["configuration"]))[-MAX_HISTORY_LINES:]
        group = group[group["configuration"].isin(shown)]
        invalid = group[~group["valid"].astype(bool)]
        group = group[group["valid"].astype(bool)]  # a line of valid measurements only
        fig = _lines(group, "timestamp", "value", "configuration", hover=["run_uuid"],
                     title=f"{kpi} [{unit}]", height=360)
        # the axis spans every point drawn, the invalid ones too
        fig["layout"]["xaxis"].pop("range", None)
        fig["layout"]["xaxis"].update(time_axis(pd.concat([group["timestamp"],
                                                           invalid["timestamp"]])))
        if not invalid.empty:
            fig["data"].append({
                "type": "scatter", "x": _axis_values(invalid["timestamp"]),
                "y": invalid["value"].to_numpy(), "mode": "markers",
                "name": "invalid (not judged)", "marker": {"symbol": "x", "color": "#aaa"},
                "hovertext": [f"{r}: invalid measurement, not judged"
                              for r in invalid["run_uuid"]], "hoverinfo": "text"})
        for config, line in group.groupby("configuration", sort=False):
            found = change_points(line["value"].tolist(), settings=ctx.detector)
            fig["data"].extend(_baseline_band(line, found, str(config)))
            if found:
                at = line.iloc[found]
                fig["data"].append({
                    "type": "scatter", "x": _axis_values(at["timestamp"]),
                    "y": at["value"].to_numpy(), "mode": "markers", "showlegend": False,
                    "marker": {"symbol": "line-ns-open", "size": 22, "color": "#555"},
                    "hovertext": ["change point: a new level starts here"] * len(at),
                    "hoverinfo": "text"})
        now = group[group["current"].astype(bool)]
        judged = [verdicts.get((r, kpi)) for r in now["run_uuid"]]
        if any(judged):
            fig["data"].append({
                "type": "scatter", "x": _axis_values(now["timestamp"]),
                "y": now["value"].to_numpy(), "mode": "markers", "showlegend": False,
                "marker": {"size": 14, "symbol": "circle-open", "line": {"width": 3},
                           "color": [_VERDICT_MARKS.get(v.verdict if v else "", "#999")
                                     for v in judged]},
                "hovertext": [f"{v.verdict}: {v.explanation}" if v else "no verdict"
                              for v in judged], "hoverinfo": "text"})
        # the legend beside the chart (plotly widens the margin for it): below it, a dozen
        # long configuration names ran over the axis title and the tick labels
        fig["layout"]["legend"] = {"title": {"text": "configuration"}}
        parts.append(_figure_html(fig))
    return "\n".join(parts)


def level_band(values: Sequence[float], changes: Sequence[int]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each run's level and the noise band around it.

    The level is the median of the run's segment between change points; the band ± 2 noise
    SDs, pooled within segments (relative for positive series). What a history chart draws
    behind the runs: where a run lands against its level's noise is readable without a
    table.
    """
    y = np.asarray(values, dtype=float)
    positive = bool(len(y)) and bool(np.all(y > 0))
    work = np.log(y) if positive else y
    cps = sorted(c for c in changes if 0 < c < len(y))
    level = np.empty(len(y))
    for a, b in zip([0, *cps], [*cps, len(y)], strict=True):
        level[a:b] = np.median(work[a:b])
    noise = pooled_noise(work, cps) if len(y) > len(cps) + 2 else 0.0
    low, high = level - 2 * noise, level + 2 * noise
    if positive:
        return np.exp(level), np.exp(low), np.exp(high)
    return level, low, high


def _baseline_band(line: pd.DataFrame, changes: Sequence[int], name: str
                   ) -> list[dict[str, Any]]:
    """The level line and the ± 2-noise-SD band of one configuration's history (traces)."""
    if len(line) < 3:
        return []
    level, low, high = level_band(line["value"].tolist(), changes)
    x = _axis_values(line["timestamp"])
    x = list(x) if not isinstance(x, list) else x
    return [
        {"type": "scatter", "x": x + x[::-1], "y": np.concatenate([high, low[::-1]]),
         "fill": "toself", "fillcolor": "rgba(120,120,120,0.15)", "line": {"width": 0},
         "hoverinfo": "skip", "legendgroup": name, "showlegend": False,
         "name": f"{name}: noise band"},
        {"type": "scatter", "x": x, "y": level, "mode": "lines", "legendgroup": name,
         "line": {"dash": "dot", "width": 1, "shape": "hv", "color": "#666"},
         "name": "baseline level ± 2 noise SD", "showlegend": False,
         "hovertemplate": "baseline level %{y:.4g}<extra></extra>"}]


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


_VERDICT_COLOURS = {"regression": "#f8d7da", "improvement": "#d1e7dd", "suspect": "#fff3cd",
                    "noisier": "#fde2c8", "outlier": "#f2f2f2", "drift": "#e8e4f3",
                    "periodic": "#ffffff", "no_change": "#ffffff",
                    "insufficient_history": "#eeeeee"}
_VERDICT_MARKS = {"regression": "#c0392b", "improvement": "#1e8449", "suspect": "#b7950b",
                  "noisier": "#ca6f1e", "outlier": "#7f8c8d", "drift": "#6c3483",
                  "periodic": "#7f8c8d", "no_change": "#7f8c8d",
                  "insufficient_history": "#bbbbbb"}


VERDICT_TITLES = {
    "cell": "cell", "kpi": "KPI", "unit": "unit", "baseline": "baseline",
    "latest": "this run", "change_pct": "change", "verdict": "verdict",
    "validity": "validity", "confidence": "confidence", "history_used": "runs in baseline",
    "mde_pct": "smallest detectable change (%)", "explanation": "why",
    "what_changed": "what changed in the environment", "suspects": "KPIs that moved with it",
}
"""The verdict table's column titles: what a person reads (the JSON keeps the field names)."""
SEVERITY = {"regression": 0, "suspect": 1, "noisier": 2, "drift": 3, "improvement": 4,
            "outlier": 5, "periodic": 6, "no_change": 7, "insufficient_history": 8,
            "not_judged": 9}
"""The verdict table's order: what needs a person first."""
_NEWS = ("regression", "improvement")


def _details(text: Any, limit: int = 90) -> str:
    """A long text as its first ``limit`` characters, the whole on demand (escaped)."""
    full = "" if text is None or text is pd.NA else str(text)
    if len(full) <= limit:
        return html.escape(full)
    return (f"<details><summary>{html.escape(full[:limit].rstrip())}…</summary>"
            f"{html.escape(full)}</details>")


def _change_html(verdict: str, change: Any, mde: Any) -> str:
    """The change in %, coloured by direction only when it is a verdict.

    A move inside the noise is grey and says so.
    """
    if change is None or change is pd.NA or (isinstance(change, float) and math.isnan(change)):
        return ""
    text = f"{float(change):+.1f} %"
    if verdict in (*_NEWS, "suspect", "outlier"):  # moves beyond the noise (a suspect's
        colour = _VERDICT_MARKS[verdict]          # and an outlier's are one run's)
        return f"<b style='color:{colour}'>{html.escape(text)}</b>"
    noise = "" if mde is None or mde is pd.NA or (isinstance(mde, float) and math.isnan(mde)) \
        else f" (MDE {float(mde):.3g} %)"
    return f"<span style='color:#888'>{html.escape(text)} · within noise{noise}</span>"


TABLE_LEFT_OUT = ("unit", "baseline", "latest", "validity", "confidence", "history_used")
"""Verdict fields the page's table folds into the change (values and unit) or leaves to
``regression.json`` (validity shows as ``not_judged`` with its reason)."""


def _values_html(latest: Any, baseline: Any, unit: Any) -> str:
    """``802.5 vs 1000 tokens/s · `` (this run against the baseline), escaped."""
    def shown(value: Any) -> str:
        return "–" if value is None or pd.isna(value) else f"{float(value):.4g}"

    if (latest is None or pd.isna(latest)) and (baseline is None or pd.isna(baseline)):
        return ""
    return html.escape(f"{shown(latest)} vs {shown(baseline)} {unit or ''}".rstrip()) + " · "


def _short(name: Any, limit: int = 48) -> str:
    """A run's name for a chart title: escaped, at most ``limit`` characters."""
    text = str(name)
    return html.escape(text if len(text) <= limit else text[:limit - 1] + "…")


def _draw_regression(ctx: ReportContext, options: dict[str, Any]) -> str:
    if not ctx.verdicts:
        return "<p class='empty'>no verdicts (no history configured?)</p>"
    # Only the rows shown are shaped (80 000 verdicts made a ~20 MB frame for 1 000 rows):
    # every regression and improvement first, then the newest of the rest.
    if len(ctx.verdicts) <= MAX_TABLE_ROWS:
        shown, note = list(ctx.verdicts), ""
    else:
        news = [i for i, v in enumerate(ctx.verdicts) if v.verdict in _NEWS]
        shown = [ctx.verdicts[i] for i in _shown_positions(len(ctx.verdicts), news)]
        note = _cap_note(len(shown), len(ctx.verdicts), "regression.json", important=True)
    # by severity (a stable sort: the runs' own order within a kind)
    shown.sort(key=lambda v: SEVERITY.get(str(v.verdict), len(SEVERITY)))
    frame = shape_regression(replace(ctx, verdicts=shown, shaped={}))
    # every cell escaped: result dir names and labels are untrusted (a dir named
    # <img src=x onerror=...> reached the page through Styler, which escapes nothing by
    # default), and Styler took 8 s for 8 000 rows
    styles = [f"background-color: {_VERDICT_COLOURS.get(str(v), '#fff')}"
              for v in frame["verdict"]]
    frame["change_pct"] = [_values_html(latest, baseline, unit) + _change_html(str(v), c, m)
                           for v, c, m, latest, baseline, unit in zip(
                               frame["verdict"], frame["change_pct"], frame["mde_pct"],
                               frame["latest"], frame["baseline"], frame["unit"],
                               strict=True)]
    for column in ("explanation", "what_changed", "suspects"):
        frame[column] = [_details(t) for t in frame[column]]
    # prose, not a dump: the values read inside the change, the rest is in regression.json
    frame = frame.drop(columns=list(TABLE_LEFT_OUT)).rename(columns=VERDICT_TITLES)
    markup = {VERDICT_TITLES[c] for c in ("change_pct", "explanation", "what_changed",
                                          "suspects")}
    return note + _table_html(frame, "", digits=4, row_styles=styles, markup=markup)


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


MAX_LOG_LINKS = 5


def _log_links(run_path: str, out_dir: Path | None) -> list[tuple[str, str]]:
    """(relative href, name) of a failed run's log files: never through a symlink."""
    root = Path(run_path)
    if out_dir is None or not root.is_dir():
        return []
    found: list[Path] = []
    for pattern in ("*.log", "*/*.log", "*/*/*.log"):
        for path in sorted(root.glob(pattern)):
            if len(found) >= MAX_LOG_LINKS:
                break
            if not any(p.is_symlink() for p in (path, *path.parents) if root in p.parents
                       or p == path) and path.is_file():
                found.append(path)
    return [(os.path.relpath(p, out_dir), str(p.relative_to(root))) for p in found]


def _draw_errors(ctx: ReportContext, options: dict[str, Any]) -> str:
    frame = shape_errors(ctx)
    if frame.empty:
        return "<p class='empty'>no failed run, no parse problem</p>"
    frame, note = _capped(frame, "the LTS payloads' problems",
                          frame["kind"] == "failed run")
    logs = {run.result.rel_path: _log_links(run.result.path, ctx.out_dir)
            for run in ctx.runs if run.result.exit_code != 0}
    rows = []
    for where, kind, detail in frame.itertuples(index=False, name=None):
        links = " ".join(f"<a href='{html.escape(href, quote=True)}'>{html.escape(name)}</a>"
                         for href, name in logs.get(where, []) if kind == "failed run")
        rows.append(f"<tr><td>{html.escape(str(where))}</td><td>{html.escape(str(kind))}</td>"
                    f"<td><pre>{html.escape(str(detail))}</pre></td><td>{links}</td></tr>")
    return (f"{note}<table class='data'><thead><tr><th>where</th><th>kind</th><th>detail</th>"
            f"<th>logs</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


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


REPORT_KINDS: dict[str, Callable[[ReportContext, dict[str, Any]], str]] = {
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

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4} .empty{color:#888} nav a{margin-right:1em}
.scroll{overflow-x:auto;max-width:100%} code{font-size:12px;overflow-wrap:anywhere}
.verdict-line{font-size:20px;font-weight:600;margin:.3em 0 .6em}
.card{border:1px solid #ddd;border-left:6px solid #999;border-radius:4px;padding:.4em .8em;
margin:.6em 0} .card h3{margin:.2em 0;font-size:16px} .card .why{margin:.2em 0;color:#444}
.why summary{cursor:pointer}
.card-body{display:flex;flex-wrap:wrap;gap:1em}
.card .chart{flex:3 1 480px;min-width:0;order:-1}
.card .facts{flex:2 1 320px;min-width:0;margin:0;font-size:13px;overflow-wrap:anywhere}
.facts dt{font-weight:600;margin-top:.4em} .facts dd{margin:0}
.moved svg{vertical-align:middle} .config{color:#666;font-weight:normal}
td:has(> details){min-width:18em}
.curve-charts{display:flex;flex-wrap:wrap;gap:1em}
.curve-chart{flex:1 1 480px;min-width:0} .curve-verdict{font-size:15px}
"""


def _page(title: str, body: str, plotly: bool) -> str:
    script = f"<script src='{PLOTLY_FILE}'></script>" if plotly else ""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_STYLE}</style>{script}</head><body>{body}</body></html>")


PLOTLY_FILE = "plotly.min.js"
"""The one offline copy of plotly.js the pages of a report share."""


def _plotlyjs() -> Path:
    """Plotly's bundled plotly.js file (what ``plotly.offline.get_plotlyjs`` reads)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _write_plotlyjs(path: Path, shared_dir: Path | None = None) -> None:
    """Put plotly.js beside a report's pages (they open offline).

    A third-party asset, copied byte for byte (`copy_file`): not our data, so not passed
    through secret redaction, which once masked a registered value that happened to occur
    in the library's code and broke every report's plots.

    With ``shared_dir`` (a runs root's): one copy there, per plotly version, hard-linked
    into each report — every report dir holds the file, the disk holds it once (it was
    4.8 MB of each run's 5.3 MB). A filesystem without hard links gets a copy.
    """
    if shared_dir is None:
        copy_file(_plotlyjs(), path)
        return
    import plotly

    shared = Path(shared_dir) / f"plotly-{plotly.__version__}.min.js"
    # a copy an earlier version masked (or anyone altered) is replaced, not linked on
    if shared.is_symlink() or not shared.is_file() or not filecmp.cmp(
            shared, _plotlyjs(), shallow=False):
        shared.parent.mkdir(parents=True, exist_ok=True)
        copy_file(_plotlyjs(), shared)
    if not link_file(shared, path):
        copy_file(shared, path)


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


def _shared_html(ctx: ReportContext) -> str:
    """The labels every shown configuration shares, said once above the charts/tables."""
    if not ctx.shared_labels:
        return ""
    said = [f"{html.escape(k)}={html.escape(v)}" for k, v in ctx.shared_labels.items() if v]
    # folded: two dozen settings in one line were a wall above every chart
    return (f"<details class='shared'><summary>Every configuration here shares {len(said)} "
            "setting(s)</summary><p>" + ", ".join(said) + "</p></details>")
