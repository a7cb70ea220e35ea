"""The index's verdict cards: one per verdict a person must look at, worst first.

A card holds the KPI's history in that configuration with its baseline level, noise band
and change points, the first bad run and the judged run marked, and beside it the change
with its 95 % interval, the minimum detectable effect, what changed in the environment, the
KPIs that moved with it (each a sparkline) and the commands that accept or compare.
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.regression import change_points, pooled_noise
from analysis.report_context import ReportContext
from analysis.report_history import shape_kpi_history
from analysis.report_html import (
    _VERDICT_MARKS,
    SEVERITY,
    _axis_values,
    _baseline_band,
    _figure_html,
    _sparkline,
    time_axis,
)
from analysis.report_verdicts import _details

__all__ = ["CARDED", "change_interval", "verdict_cards"]


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
