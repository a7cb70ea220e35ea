"""The report's index: the first screen answers "is anything wrong?".

One line (``2 regressions, 1 suspect, 9 unchanged, 1 not judged: busy machine``), then a
card per verdict a person must look at (regression, suspect, noisier, drift): the KPI's
history in that configuration with its baseline level, noise band and change points, the
first bad run and the latest run marked, and beside it the change with its interval, the
minimum detectable effect, what changed in the environment, the KPIs that moved with it
(each a small chart) and the commands that accept or compare. Below: the triage table,
the runs not judged, the noise budget, the pages and a headline per KPI.

The pages themselves are drawn by `analysis.report`.
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.curve import load_span
from analysis.discovery import Discovery
from analysis.project import AnalysisProject
from analysis.regression import DEFAULTS, DetectorSettings, change_points, pooled_noise
from analysis.report import REPORT_KINDS, _load_plots
from analysis.report_context import ReportContext, _shared_html
from analysis.report_history import shape_kpi_history
from analysis.report_html import (
    _VERDICT_COLOURS,
    _VERDICT_MARKS,
    PLOTLY_FILE,
    SEVERITY,
    _axis_values,
    _baseline_band,
    _figure_html,
    _page,
    _write_plotlyjs,
    time_axis,
)
from analysis.report_verdicts import _details
from core.progress import StageProgress
from core.safeio import write_text

__all__ = ["render_report", "shape_headlines", "shape_triage", "triage_headline",
           "triage_line", "verdict_cards"]


MAX_HEADLINES = 200
SPARK_POINTS = 30


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


def shape_headlines(ctx: ReportContext) -> pd.DataFrame:
    """One row per KPI and configuration of the current runs: the newest run's verdict."""
    history = shape_kpi_history(ctx)
    columns = ["kpi", "configuration", "latest", "unit", "verdict", "change_pct", "series",
               "explanation"]
    if history.empty:
        return pd.DataFrame(columns=columns)
    verdicts = {(v.run_uuid, v.kpi): v for v in ctx.verdicts}
    # grouped over plain lists: a pandas groupby's per-group slicing of the history frame
    # was ~2 ms a line (0.15 s for 64 lines of 1 000 runs), the rest of this page ~0.02 s
    kpis, configs, current, uuids, values, units = (history[c].tolist() for c in (
        "kpi", "configuration", "current", "run_uuid", "value", "unit"))
    lines: dict[tuple[Any, Any], list[int]] = {}
    for index, key in enumerate(zip(kpis, configs, strict=True)):
        lines.setdefault(key, []).append(index)
    rows = []
    for (kpi, config), members in lines.items():
        now = [i for i in members if current[i]]
        if not now:
            continue
        newest = now[-1]
        judged = verdicts.get((uuids[newest], kpi))
        rows.append({"kpi": kpi, "configuration": config, "latest": values[newest],
                     "unit": units[newest], "verdict": judged.verdict if judged else "",
                     "change_pct": judged.change_pct if judged else None,
                     "series": [values[i] for i in members],
                     "explanation": judged.explanation if judged else ""})
    rows.sort(key=lambda r: (SEVERITY.get(r["verdict"], len(SEVERITY)), r["kpi"],
                             r["configuration"]))
    return pd.DataFrame(rows[:MAX_HEADLINES], columns=columns)


def shape_triage(ctx: ReportContext) -> pd.DataFrame:
    """One row per regression (then improvement) of the current runs: what a person needs.

    Validity, size, since when, what changed in the environment, the KPIs that moved with
    it, the KPI's minimum detectable effect and the command that accepts the new level.
    """
    columns = ["kpi", "run", "verdict", "validity", "change_pct", "since", "what_changed",
               "suspects", "mde_pct", "explanation", "accept"]
    history = shlex.quote(ctx.history_uri) if ctx.history_uri else "HISTORY_URI"
    names = {str(r.run_uuid): ctx.name_of(r) for r in ctx.runs}
    rows = []
    for v in ctx.verdicts:
        if v.verdict not in TRIAGED:
            continue
        since = getattr(v, "since_runs", None)
        rows.append({
            "kpi": v.kpi, "run": names.get(str(v.run_uuid), v.cell or v.test_path),
            "verdict": v.verdict,
            "validity": getattr(v, "validity", "valid"), "change_pct": v.change_pct,
            "since": "this run" if since in (None, 1) else f"{since - 1} run(s) before it",
            "what_changed": "; ".join(getattr(v, "what_changed", [])[:4]),
            "suspects": "; ".join(getattr(v, "suspects", [])[:4]),
            "mde_pct": getattr(v, "mde_pct", None), "explanation": v.explanation,
            "accept": f"python -m analysis accept --history {history} "
                      f"{shlex.quote(v.run_uuid)} --kpi {shlex.quote(v.kpi)}"})
    rows.sort(key=lambda r: (SEVERITY.get(r["verdict"], len(SEVERITY)),
                             -abs(r["change_pct"] or 0)))
    return pd.DataFrame(rows[:MAX_HEADLINES], columns=columns)


TRIAGED = ("regression", "suspect", "noisier", "drift", "outlier", "improvement")
"""The verdicts the triage lists: what a person should look at (and what was dismissed)."""
JUDGED = ("regression", "improvement", "suspect", "outlier", "noisier", "periodic", "drift",
          "no_change")
"""The verdicts that mean a KPI was judged (not `insufficient_history`, not unjudged)."""
_SAID = {"regression": ("regression", "regressions"), "suspect": ("suspect", "suspects"),
         "noisier": ("noisier KPI", "noisier KPIs"), "drift": ("drifting KPI", "drifting KPIs"),
         "outlier": ("outlier dismissed", "outliers dismissed"),
         "improvement": ("improvement", "improvements"),
         "periodic": ("periodic KPI", "periodic KPIs"), "no_change": ("unchanged", "unchanged")}


def triage_line(ctx: ReportContext) -> str:
    """The first screen's one line, worst first.

    ``2 regressions, 1 suspect, 9 unchanged, 1 not judged: busy machine`` (the KPI verdicts
    of the newest runs).
    """
    counts: dict[str, int] = {}
    for v in ctx.verdicts:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    parts = [f"{n} {_SAID[kind][n != 1]}" for kind, n in sorted(
        counts.items(), key=lambda kv: SEVERITY.get(kv[0], len(SEVERITY))) if kind in _SAID]
    # a sweep judged as one curve: one entry per moved curve, its range named
    moved = [c for c in ctx.curves if c.verdict.kind in ("regression", "improvement")
             and c.verdict.load_range is not None]
    if moved:
        load = ctx.project.curve.load if ctx.project.curve is not None else "load"
        parts[:0] = [f"1 curve {c.verdict.kind} ({load} {load_span(c.verdict.load_range)})"
                     for c in moved]
    unjudged = counts.get("not_judged", 0) + counts.get("insufficient_history", 0)
    if unjudged or not parts:
        why = triage_headline(ctx).removeprefix("nothing judged: ")
        parts.append(f"{unjudged} not judged" + ("" if parts else f": {why}"))
    return ", ".join(parts)


def triage_headline(ctx: ReportContext) -> str:
    """What an empty triage means: nothing moved, or nothing was judged — and why."""
    if any(v.verdict in JUDGED for v in ctx.verdicts):
        return "nothing to look at: no regression, suspect or noisier KPI"
    invalid = [r for r in ctx.runs if getattr(r, "validity", None) is not None
               and r.validity.status != "valid"]
    if invalid and len(invalid) == len(ctx.runs):
        return (f"nothing judged: the {len(invalid)} run(s) are invalid measurements "
                "(listed below), never judged nor a baseline; run on a quieter machine")
    if ctx.history_uri is None:
        return "nothing judged: no history given"
    return ("nothing judged: not enough comparable valid runs in the history yet "
            "(verdicts start after analysis.regression.min_history of them)")


def _triage_html(ctx: ReportContext) -> str:
    """The index's first section: the triage table, the runs not judged, the noisy KPIs.

    Noisy: their minimum detectable effect is larger than ``target_mde_pct``.
    """
    frame = shape_triage(ctx)
    parts = ["<h2>Triage</h2>"]
    if frame.empty:
        parts.append(f"<p class='empty'>{html.escape(triage_headline(ctx))}</p>")
    else:
        rows = []
        for r in frame.itertuples(index=False):
            mde = "" if r.mde_pct is None or pd.isna(r.mde_pct) else f"{r.mde_pct:.1f}%"
            change = "" if r.change_pct is None or pd.isna(r.change_pct) else \
                f"{r.change_pct:+.1f}%"
            cells = [r.kpi, r.run, r.verdict, r.validity, change, r.since,
                     r.what_changed or "—", r.suspects or "none", mde]
            rows.append(f"<tr style='background-color: {_VERDICT_COLOURS.get(r.verdict)}' "
                        f"title='{html.escape(r.explanation, quote=True)}'>"
                        + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                        + f"<td><code>{html.escape(r.accept)}</code></td></tr>")
        parts.append("<div class='scroll'><table class='data'><thead><tr><th>KPI</th>"
                     "<th>run</th><th>verdict</th><th>validity</th><th>size</th>"
                     "<th>since</th><th>what changed</th><th>moved with it</th><th>MDE</th>"
                     "<th>accept the new level</th></tr></thead><tbody>" + "".join(rows)
                     + "</tbody></table></div>")
    invalid = [r for r in ctx.runs if getattr(r, "validity", None) is not None
               and r.validity.status != "valid"]
    if invalid:
        parts.append("<h2>Not judged</h2><ul>" + "".join(
            f"<li>{html.escape(r.result.rel_path)}: {html.escape(r.validity.status)} — not "
            f"judged: {html.escape('; '.join(r.validity.reasons))}</li>"
            for r in invalid[:MAX_HEADLINES]) + "</ul>")
    noisy: dict[str, float] = {}
    for v in ctx.verdicts:
        mde = getattr(v, "mde_pct", None)
        if mde is not None and mde > ctx.target_mde_pct:
            noisy[v.kpi] = max(noisy.get(v.kpi, 0.0), mde)
    if noisy:
        parts.append(f"<h2>Noise budget</h2><p>These KPIs cannot see a "
                     f"{ctx.target_mde_pct:g}% change with the repeats judged (minimum "
                     "detectable effect at the detector's false-alarm budget, 80 % power): "
                     + ", ".join(f"{html.escape(k)} {m:.1f}%" for k, m in sorted(
                         noisy.items(), key=lambda kv: -kv[1])[:40])
                     + ". More repeats (<code>analysis.confirm_reruns: auto</code>) or a "
                     "quieter machine bring it down.</p>")
    return "".join(parts)


def _headlines_html(ctx: ReportContext) -> str:
    frame = shape_headlines(ctx)
    if frame.empty:
        return "<p class='empty'>no KPI to show</p>"
    rows = []
    for row in frame.itertuples(index=False):
        colour = _VERDICT_COLOURS.get(row.verdict, "#fff")
        change = "" if row.change_pct is None or pd.isna(row.change_pct) else \
            f"{row.change_pct:+.1f}%"
        latest = f"{row.latest:.4g}" if pd.notna(row.latest) else ""
        rows.append(
            f"<tr style='background-color: {colour}' title='{html.escape(row.explanation)}'>"
            f"<td>{html.escape(str(row.kpi))}</td><td>{html.escape(str(row.configuration))}"
            f"</td><td>{html.escape(latest)} {html.escape(str(row.unit))}</td>"
            f"<td>{html.escape(row.verdict or 'no verdict')}</td><td>{change}</td>"
            f"<td>{_sparkline(row.series, _VERDICT_MARKS.get(row.verdict, '#999'))}</td></tr>")
    return (_shared_html(ctx) + "<div class='scroll'><table class='data'><thead><tr>"
            "<th>KPI</th><th>configuration</th><th>latest</th><th>verdict</th>"
            "<th>vs baseline</th><th>history</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div>")


def render_report(out_dir: Path, project: AnalysisProject, runs: Sequence[Any],
                  kpis: pd.DataFrame, history: pd.DataFrame | None, verdicts: Sequence[Any],
                  discovery: Discovery, *, ignored_labels: Sequence[str] = (),
                  compared_label: str | None = None,
                  detector: DetectorSettings = DEFAULTS, history_uri: str | None = None,
                  target_mde_pct: float = 5.0, shared_dir: Path | None = None,
                  curves: Sequence[Any] = ()) -> Path:
    """Write one HTML page per report plus ``index.html``; returns the index path.

    ``shared_dir``: where the one plotly.js copy of many reports lives (`_write_plotlyjs`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(project, runs, kpis, history, verdicts, discovery,
                        ignored_labels=tuple(ignored_labels), compared_label=compared_label,
                        out_dir=out_dir, detector=detector, history_uri=history_uri,
                        target_mde_pct=target_mde_pct, curves=tuple(curves))
    links = []
    plotly_needed = False
    plots = _load_plots(project)
    progress = StageProgress("report", len(plots), "page(s)")
    for index, entry in enumerate(plots):
        kind, title = entry["kind"], str(entry.get("title", entry["kind"]))
        options = {k: v for k, v in entry.items() if k not in ("kind", "title")}
        body = REPORT_KINDS[kind](ctx, options)
        name = f"{index:02d}_{kind}.html"
        needs_js = "Plotly" in body or "plotly" in body
        plotly_needed = plotly_needed or needs_js
        write_text(out_dir / name, _page(title, f"<p><a href='index.html'>← index</a></p>"
                                                 f"<h1>{html.escape(title)}</h1>{body}",
                                          needs_js))
        links.append((name, title))
        progress.advance()  # a page written
    cards = verdict_cards(ctx)
    if plotly_needed or cards:
        _write_plotlyjs(out_dir / PLOTLY_FILE, shared_dir)
    failed = sum(1 for r in runs if r.result.exit_code != 0)
    invalid = sum(1 for r in runs if getattr(r, "validity", None) is not None
                  and r.validity.status == "invalid")
    # the first screen: the one line, then the cards (or why there is nothing to look at)
    first = (f"<p class='verdict-line'>{html.escape(triage_line(ctx))}</p>"
             + (cards or f"<p class='empty'>{html.escape(triage_headline(ctx))}</p>"))
    nav = "".join(f"<a href='{n}'>{html.escape(t)}</a>" for n, t in links)
    body = (f"<h1>{html.escape(project.name)} — results</h1>{first}"
            f"<p class='runs'>{len(runs)} run(s), {failed} failed, {invalid} invalid.</p>"
            + _triage_html(ctx) + f"<h2>Pages</h2><nav>{nav}</nav>"
            + "<h2>Every KPI</h2>" + _headlines_html(ctx))
    index_path = out_dir / "index.html"
    write_text(index_path, _page(f"{project.name} report", body, bool(cards)))
    progress.finish()
    return index_path


CARDED = ("regression", "suspect", "noisier", "drift")
"""The verdicts that get a card on the first screen: what a person must look at."""
KIND_TITLES = {"regression": "Regression", "suspect": "Suspect (a re-run confirms or "
               "dismisses it)", "noisier": "Noisier", "drift": "Drift"}
MAX_CARDS = 8
"""Cards drawn (worst first); the triage table below lists every verdict."""
CARD_RUNS = 120
"""Runs a card's chart shows (the newest): what a person reads at a glance; the history
page has them all. Bounds the cards' cost (a change-point search each) in long histories."""
CARD_HEIGHT = 300
Z95 = 1.959964


def change_interval(values: Sequence[float], changes: Sequence[int], first: int, last: int,
                    baseline_runs: int, change_pct: float) -> tuple[float, float] | None:
    """The 95 % interval of a verdict's change (``change_pct``), in %.

    ``values`` is the KPI's line, oldest first. The new level holds the runs
    ``first..last``; the baseline up to ``baseline_runs`` runs before ``first``, back to the
    change point before it. The noise is the line's pooled within-level noise
    (`pooled_noise`; relative for a positive series, whose interval is then symmetric in
    logs), so the change's standard error is ``noise * sqrt(1 / new + 1 / baseline)``
    (normal approximation). None when the line is too short or holds a non-finite value.
    """
    y = np.asarray(values, dtype=float)
    if (len(y) < 4 or not 0 < first <= last < len(y) or not np.all(np.isfinite(y))
            or not math.isfinite(change_pct) or change_pct <= -100):
        return None
    positive = bool(np.all(y > 0))
    work = np.log(y) if positive else y
    cps = sorted(c for c in changes if 0 < c < len(y))
    noise = pooled_noise(work, cps)
    start = max([0, *(c for c in cps if c < first)])
    base = work[start:first][-max(baseline_runs, 1):]
    if not len(base) or not math.isfinite(noise):
        return None
    half = Z95 * noise * math.sqrt(1 / (last - first + 1) + 1 / len(base))
    if positive:
        centre = math.log1p(change_pct / 100)
        return (math.expm1(centre - half) * 100, math.expm1(centre + half) * 100)
    level = abs(float(np.mean(base)))
    if level == 0:
        return None
    return (change_pct - half / level * 100, change_pct + half / level * 100)


def _card_rows(ctx: ReportContext) -> list[Any]:
    rows = [v for v in ctx.verdicts if v.verdict in CARDED]
    rows.sort(key=lambda v: (SEVERITY.get(v.verdict, len(SEVERITY)),
                             -abs(v.change_pct or 0)))
    return rows


def _card_chart(line: pd.DataFrame, at: int, first_bad: int, found: Sequence[int],
                kpi: str, unit: str, verdict: str) -> dict[str, Any]:
    """The KPI's history in one configuration, its level and noise band, the marks.

    Marks differ by symbol as well as colour (readable without colour): runs are dots, a
    change point a vertical bar, the first bad run a triangle, the judged run a star.
    """
    x = list(_axis_values(line["timestamp"]))
    values = line["value"].to_numpy()
    data: list[dict[str, Any]] = [
        *_baseline_band(line, found, "level"),
        {"type": "scatter", "mode": "lines+markers", "x": x, "y": values, "name": "runs",
         "line": {"color": "#9aa5b1", "width": 1}, "marker": {"color": "#52606d", "size": 5},
         "customdata": line["run_uuid"].astype(str).to_numpy(),
         "hovertemplate": "%{x}<br>%{y:.4g}<br>%{customdata}<extra></extra>"}]
    if found:
        data.append({"type": "scatter", "mode": "markers", "name": "change point",
                     "x": [x[c] for c in found], "y": [values[c] for c in found],
                     "marker": {"symbol": "line-ns-open", "size": 24, "color": "#333",
                                "line": {"width": 2}},
                     "hovertemplate": "a new level starts here<extra></extra>"})
    colour = _VERDICT_MARKS.get(verdict, "#c0392b")
    if 0 <= first_bad < at:
        data.append({"type": "scatter", "mode": "markers", "name": "first bad run",
                     "x": [x[first_bad]], "y": [values[first_bad]],
                     "marker": {"symbol": "triangle-down", "size": 14, "color": colour},
                     "hovertemplate": "first run of the new level<extra></extra>"})
    data.append({"type": "scatter", "mode": "markers", "name": "this run",
                 "x": [x[at]], "y": [values[at]],
                 "marker": {"symbol": "star", "size": 18, "color": colour,
                            "line": {"color": "#222", "width": 1}},
                 "hovertemplate": "this run: %{y:.4g}<extra></extra>"})
    layout = {"height": CARD_HEIGHT, "margin": {"l": 10, "r": 10, "t": 10, "b": 10},
              "showlegend": True,
              # one row (grouped traces would each start a row of their own)
              "legend": {"orientation": "h", "y": -0.2, "x": 0, "font": {"size": 11},
                         "traceorder": "normal"},
              "xaxis": {"automargin": True, **time_axis(line["timestamp"])},
              # the KPI is named in the card's title: the axis says the unit
              "yaxis": {"title": {"text": unit or kpi}, "automargin": True}}
    return {"data": data, "layout": layout}


def _moved_kpis(suspects: Sequence[str], known: set[str]) -> list[tuple[str, str]]:
    """(KPI, its line of text) for each co-moving KPI a verdict names."""
    out = []
    for text in suspects:
        kpi = str(text).split(" ", 1)[0]
        if kpi in known:
            out.append((kpi, str(text)))
    return out


def verdict_cards(ctx: ReportContext) -> str:
    """One card per regression, suspect, noisier or drift verdict (worst first), as HTML."""
    rows = _card_rows(ctx)
    if not rows:
        return ""
    history = shape_kpi_history(ctx)
    if history.empty:
        return ""
    valid = history[history["valid"].astype(bool)]
    by_line = {key: group for key, group in valid.groupby(["kpi", "configuration"], sort=False)}
    where = {(r, k): c for r, k, c in zip(valid["run_uuid"], valid["kpi"],
                                          valid["configuration"], strict=True)}
    history_arg = shlex.quote(ctx.history_uri) if ctx.history_uri else "HISTORY_URI"
    names = {str(r.run_uuid): ctx.name_of(r) for r in ctx.runs}
    repeats_of: dict[str, set[str]] = {}
    for run in ctx.runs:
        original = getattr(run.result, "repeat_of", None)
        if original:
            repeats_of.setdefault(str(original), set()).add(str(run.run_uuid))
    known = set(valid["kpi"])
    cards = []
    for v in rows[:MAX_CARDS]:
        configuration = where.get((v.run_uuid, v.kpi))
        if configuration is None:
            continue
        line = by_line[(v.kpi, configuration)].iloc[-CARD_RUNS:].reset_index(drop=True)
        at = int(np.flatnonzero(line["run_uuid"].to_numpy() == v.run_uuid)[-1])
        found = change_points(line["value"].tolist(), settings=ctx.detector)
        first_bad = max(at - (v.since_runs or 1) + 1, 0)
        # the run's confirmation re-runs are points of the same new level
        reruns = repeats_of.get(str(v.run_uuid), set())
        last = at + int(line["run_uuid"].iloc[at + 1:].astype(str).isin(reruns).sum())
        interval = change_interval(line["value"].tolist(), found, first_bad, last,
                                   v.history_used, v.change_pct) \
            if v.change_pct is not None else None
        chart = _figure_html(_card_chart(line, at, first_bad, found, v.kpi, v.unit,
                                         v.verdict))
        # compare: the baseline level's runs (from the change point before the first bad
        # run up to it) against the new level's
        stamps = line["timestamp"]
        level_start = max([0, *(c for c in found if c < first_bad)])
        window = (f"{_stamp(stamps.iloc[level_start]) if level_start else ''}.."
                  f"{_stamp(stamps.iloc[first_bad])}")
        # B: the new level's runs (a lone suspect's compare says it needs a second run)
        selected = ",".join(dict.fromkeys(
            line["run_uuid"].astype(str).iloc[first_bad:last + 1]))
        cards.append(_card_html(v, names.get(str(v.run_uuid), v.cell or v.test_path),
                                str(configuration), chart, interval, history_arg,
                                (window, selected), _moved_kpis(v.suspects, known),
                                by_line, configuration))
    return "".join(cards)


def _stamp(value: Any) -> str:
    """A timestamp as a compare selection's bound: ISO, to the second, UTC."""
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _card_html(v: Any, name: str, configuration: str, chart: str,
               interval: tuple[float, float] | None, history_arg: str,
               selections: tuple[str, str], moved: Sequence[tuple[str, str]],
               lines: dict[tuple[str, str], pd.DataFrame], config_key: Any) -> str:
    """One verdict card: the chart, and beside it what a person needs to act."""
    title = KIND_TITLES.get(v.verdict, v.verdict)
    facts = []
    if v.change_pct is not None and math.isfinite(v.change_pct):
        change = f"{v.change_pct:+.1f}%"
        if interval is not None:
            change += f" (95 % interval {interval[0]:+.1f}% .. {interval[1]:+.1f}%)"
        facts.append(("change", html.escape(change)))
    if v.mde_pct is not None and math.isfinite(v.mde_pct):
        facts.append(("smallest change this KPI can show (MDE)",
                      html.escape(f"{v.mde_pct:.1f}%")))
    since = v.since_runs or 1
    facts.append(("since", "this run" if since == 1 else f"{since - 1} run(s) before it"))
    facts.append(("what changed in the environment", html.escape(
        "; ".join(v.what_changed[:4])) or "nothing recorded"))
    if moved:
        charts = "".join(
            f"<div class='moved'>{_sparkline(lines[(kpi, config_key)]['value'].tolist(), '#555')}"
            f" {html.escape(text)}</div>" if (kpi, config_key) in lines else
            f"<div class='moved'>{html.escape(text)}</div>" for kpi, text in moved)
        facts.append(("moved with it", charts))
    else:
        facts.append(("moved with it", "no other KPI of this configuration"))
    accept = (f"python -m analysis accept --history {history_arg} "
              f"{shlex.quote(str(v.run_uuid))} --kpi {shlex.quote(v.kpi)}")
    compare = (f"python -m analysis compare --history {history_arg} --kpi "
               f"{shlex.quote(v.kpi)} {shlex.quote(selections[0])} "
               f"{shlex.quote(selections[1])}")
    if v.verdict == "suspect":
        facts.append(("to confirm", "re-run this cell (<code>analysis.confirm_reruns</code> "
                                    "does it at once in a flow), or wait for the next run"))
    facts.append(("accept the new level", f"<code>{html.escape(accept)}</code>"))
    facts.append(("compare", f"<code>{html.escape(compare)}</code>"))
    items = "".join(f"<dt>{k}</dt><dd>{value}</dd>" for k, value in facts)
    where = "" if configuration == "this configuration" else \
        f" <span class='config'>({html.escape(configuration)})</span>"
    return (f"<section class='card' style='border-left-color:"
            f"{_VERDICT_MARKS.get(v.verdict, '#999')}'>"
            f"<h3>{html.escape(title)}: {html.escape(v.kpi)} — {html.escape(name)}{where}</h3>"
            f"<div class='why'>{_details(v.explanation, 140)}</div>"
            # the facts come first in the page, the chart is shown first (CSS order): when
            # the chart's script runs, the facts already take their share of the width
            f"<div class='card-body'><dl class='facts'>{items}</dl>"
            f"<div class='chart'>{chart}</div></div></section>")
