"""The report pages' building blocks: tables, plotly figures, lines, bands, the page frame.

Every page kind (`analysis.report`) draws with these: bounded HTML tables (capped rows with
a note), figures embedded as JSON for the one shared offline ``plotly.min.js``, a line per
configuration on a time axis, a baseline band, the verdicts' colours, marks and titles.
"""

from __future__ import annotations

import datetime
import filecmp
import html
import json
import math
import uuid
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.regression import pooled_noise
from core.safeio import copy_file, link_file

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
    return "".join(figure_parts(figure))


def figure_parts(figure: dict[str, Any]) -> list[str]:
    """A figure dict's ``<div>`` and script (`_figure_html`), in parts.

    A page writes them one after the other: the data's JSON (MBs for 10 000 points) is one
    part per trace, never copied into one text with the rest nor escaped whole (the JSON
    and its escaped copies were 5 MB at once at 10 000 runs). The same text as one
    ``_script_json`` of the data: an array's compact JSON is its items' joined by commas.
    """
    div = f"plot-{uuid.uuid4().hex}"
    data = figure.get("data", [])
    traces = ["[", *(("," if index else "") + _script_json(trace)
                     for index, trace in enumerate(data)), "]"] \
        if isinstance(data, list) else [_script_json(data)]
    return [f"<div id='{div}' class='plotly-graph-div' style='height:100%; width:100%;'>"
            f"</div><script>Plotly.newPlot('{div}',", *traces,
            f",{_script_json(figure.get('layout', {}))},{{\"responsive\":true}});</script>"]


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


def _short(name: Any, limit: int = 48) -> str:
    """A run's name for a chart title: escaped, at most ``limit`` characters."""
    text = str(name)
    return html.escape(text if len(text) <= limit else text[:limit - 1] + "…")

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
    return "".join(page_parts(title, [body], plotly))


def page_parts(title: str, body: Iterable[str], plotly: bool) -> Iterator[str]:
    """A report page's HTML in order: the head, each part of ``body``, the end.

    Written part by part (`core.safeio.write_text_parts`), a large page is never held whole.
    """
    script = f"<script src='{PLOTLY_FILE}'></script>" if plotly else ""
    yield (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
           f"</title><style>{_STYLE}</style>{script}</head><body>")
    yield from body
    yield "</body></html>"


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


SPARK_POINTS = 30
"""Points an inline sparkline shows (the newest)."""


def _sparkline(values: Sequence[float], colour: str) -> str:
    """An inline SVG polyline of the last values (no script needed)."""
    points = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    points = points[-SPARK_POINTS:]
    if len(points) < 2:
        return ""
    lo, hi = min(points), max(points)
    span = (hi - lo) or 1.0
    width, height = 120, 24
    coords = " ".join(f"{i * width / (len(points) - 1):.1f},"
                      f"{height - 2 - (v - lo) / span * (height - 4):.1f}"
                      for i, v in enumerate(points))
    last_x, last_y = coords.rsplit(" ", 1)[-1].split(",")
    return (f"<svg width='{width}' height='{height}' role='img'><polyline fill='none' "
            f"stroke='#888' stroke-width='1.2' points='{coords}'/><circle cx='{last_x}' "
            f"cy='{last_y}' r='3' fill='{colour}'/></svg>")
