"""Report pages of KPIs across runs.

``kpi_table`` (one row per run) and ``kpi_history`` (each KPI over time, one line per
configuration, change points and verdicts marked).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.history import VALIDITY
from analysis.kpi import display_value
from analysis.regression import change_points
from analysis.report_context import (
    ReportContext,
    _configuration_codes,
    _shared_html,
    _varying_settings,
    configuration_keys,
)
from analysis.report_html import (
    _VERDICT_MARKS,
    MAX_TABLE_ROWS,
    _axis_values,
    _baseline_band,
    _cap_note,
    _lines,
    _table_html,
    figure_parts,
    time_axis,
)


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
        "run": [ctx.name_of(r) for r in ctx.runs],
        "dir": [r.result.rel_path for r in ctx.runs],
        "status": [r.status for r in ctx.runs]}
    for key in varying:
        columns.setdefault(key, [f.get(key) for f in flat])
    for name in names:
        if name not in columns:
            columns[name] = [values.get(r.run_uuid, {}).get(name) for r in ctx.runs]
    return pd.DataFrame(columns)


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
        # the columns taken before the duplicates are dropped: the other way round copied
        # every column of a run's last row (~8 MB at 10 000 runs) to keep a few
        labels.append(part[["run_uuid", *(k for k in keys if k in part.columns)]]
                      .drop_duplicates("run_uuid", keep="last"))
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


def _draw_kpi_table(ctx: ReportContext, options: dict[str, Any]) -> str:
    # the newest runs only are shown: only they are shaped
    shown = replace(ctx, runs=ctx.runs[-MAX_TABLE_ROWS:], shaped={})
    note = "" if len(shown.runs) == len(ctx.runs) else _cap_note(
        len(shown.runs), len(ctx.runs), "kpis.parquet", important=False)
    return note + _table_html(shape_kpi_table(shown), "no KPI could be computed")


MAX_HISTORY_LINES = 12
"""Configurations drawn per KPI chart (the newest ones): more lines are unreadable."""


def _hover(texts: dict[tuple[str, str], str], row: Any) -> str:
    """A current run's verdict as its marker's hover text, one string for equal texts."""
    if row is None:
        return "no verdict"
    key = (row.verdict, row.explanation)
    text = texts.get(key)
    if text is None:
        text = texts[key] = f"{row.verdict}: {row.explanation}"
    return text


def _draw_kpi_history(ctx: ReportContext, options: dict[str, Any]) -> str | Iterator[str]:
    """The history page: one chart a KPI, each written as soon as it is drawn.

    At 10 000 runs the page is 8 MB: its charts held until the end, and every verdict by
    (run, KPI) rather than one KPI's at a time, made this page the post-processing's peak.
    A history with nothing to draw is one line of text (a page without plotly.js).
    """
    frame = shape_kpi_history(ctx, options.get("kpis"))
    if frame.empty:
        return "<p class='empty'>no history yet</p>"
    return _history_charts(ctx, frame)


def _history_charts(ctx: ReportContext, frame: pd.DataFrame) -> Iterator[str]:
    """The parts of `_draw_kpi_history`'s page, drawn one KPI at a time."""
    yield _shared_html(ctx)
    texts: dict[tuple[str, str], str] = {}  # one hover text for the runs with one verdict
    for kpi, group in frame.groupby("kpi", sort=False):
        verdicts = {v.run_uuid: v for v in ctx.verdicts if v.kpi == kpi}
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
        judged = [verdicts.get(r) for r in now["run_uuid"]]
        if any(judged):
            fig["data"].append({
                "type": "scatter", "x": _axis_values(now["timestamp"]),
                "y": now["value"].to_numpy(), "mode": "markers", "showlegend": False,
                "marker": {"size": 14, "symbol": "circle-open", "line": {"width": 3},
                           "color": [_VERDICT_MARKS.get(v.verdict if v else "", "#999")
                                     for v in judged]},
                "hovertext": [_hover(texts, v) for v in judged], "hoverinfo": "text"})
        # the legend beside the chart (plotly widens the margin for it): below it, a dozen
        # long configuration names ran over the axis title and the tick labels
        fig["layout"]["legend"] = {"title": {"text": "configuration"}}
        parts = figure_parts(fig)
        del fig, verdicts, group, now, judged, invalid  # not held while the parts are written
        yield from parts
