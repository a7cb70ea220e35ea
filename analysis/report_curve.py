"""The curve page: each sweep of this run over the band of its history (`analysis.curve`).

Figures are plotly figure dicts (drawn by `analysis.report_html._figure_html`): per curve, its
latency and its throughput against the load, the history's median and ±2 pooled-noise band
at each load, this run's points, and the loads the verdict names shaded. Beside them: the
verdict, the curve KPIs with theirs, and each moved load's change with its 95 % interval.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from analysis.curve import CURVE_KPIS, CurveResult, CurveSpec

__all__ = ["curve_facts_html", "curve_figures", "curve_title", "worst_first"]

_NEWS = {"regression": "#c62828", "improvement": "#2e7d32"}


def curve_title(curve: CurveResult) -> str:
    """``model_name=tiny · prompt_tokens=128 · … — regression at concurrency 8–16``."""
    return f"{curve.group_text() or 'curve'} — {curve.verdict.explanation or curve.verdict.kind}"


def curve_figures(curve: CurveResult, spec: CurveSpec, units: dict[str, str]
                  ) -> list[dict[str, Any]]:
    """One figure dict per KPI of the curve (latency, throughput)."""
    figures = []
    for kpi in (spec.latency, spec.throughput):
        band = sorted((b for b in curve.band if b.kpi == kpi), key=lambda b: b.load)
        points = [(p["load"], p.get(kpi)) for p in curve.points if p.get(kpi) is not None]
        data: list[dict[str, Any]] = []
        if band:
            loads = [b.load for b in band]
            data += [
                {"type": "scatter", "x": loads, "y": [b.high for b in band], "mode": "lines",
                 "line": {"width": 0}, "showlegend": False, "hoverinfo": "skip"},
                {"type": "scatter", "x": loads, "y": [b.low for b in band], "mode": "lines",
                 "line": {"width": 0}, "fill": "tonexty", "fillcolor": "rgba(96,125,139,0.2)",
                 "name": "history ±2 noise SD"},
                {"type": "scatter", "x": loads, "y": [b.median for b in band],
                 "mode": "lines", "line": {"dash": "dash", "color": "#607d8b"},
                 "name": f"history median ({curve.verdict.history_curves} runs)"}]
        data.append({"type": "scatter", "x": [x for x, _ in points],
                     "y": [y for _, y in points], "mode": "lines+markers",
                     "marker": {"symbol": "star", "size": 10}, "line": {"color": "#1565c0"},
                     "name": "this run"})
        shapes = []
        if curve.verdict.load_range is not None:
            low, high = curve.verdict.load_range
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": low * 0.85,
                           "x1": high * 1.15, "y0": 0, "y1": 1, "line": {"width": 0},
                           "fillcolor": _NEWS.get(curve.verdict.kind, "#999"),
                           "opacity": 0.12, "layer": "below"})
        unit = units.get(kpi, "")
        figures.append({"data": data, "layout": {
            "height": 320, "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
            "title": {"text": kpi, "font": {"size": 14}},
            "xaxis": {"title": {"text": spec.load}, "type": "log",
                      "tickvals": [p["load"] for p in curve.points]},
            "yaxis": {"title": {"text": f"{kpi} [{unit}]" if unit else kpi}},
            "legend": {"orientation": "v", "x": 1.02, "y": 1}, "shapes": shapes}})
    return figures


def curve_facts_html(curve: CurveResult) -> str:
    """The verdict, the curve KPIs with theirs, each moved load's change and interval."""
    kind = curve.verdict.kind
    colour = _NEWS.get(kind, "#555")
    rows = []
    for name, value in curve.kpis.items():
        if value is None:
            continue
        judged = curve.kpi_verdicts.get(name, {})
        change = judged.get("change_pct")
        mde = judged.get("mde_pct")
        rows.append(f"<tr><td title='{html.escape(CURVE_KPIS.get(name, ''), quote=True)}'>"
                    f"{html.escape(name)}</td><td>{value:,.4g}</td>"
                    f"<td>{html.escape(str(judged.get('kind', '')))}</td>"
                    f"<td>{'' if change is None else f'{change:+.1f} %'}</td>"
                    f"<td>{'' if mde is None else f'{mde:.1f} %'}</td></tr>")
    moved = set(curve.verdict.loads)
    changes = [p for p in curve.verdict.points if p.load in moved]
    change_rows = "".join(
        f"<tr><td>{p.load:g}</td><td>{html.escape(p.kpi)}</td><td>{p.latest:,.4g}</td>"
        f"<td>{p.baseline:,.4g}</td><td>{p.change_pct:+.1f} %</td>"
        f"<td>[{p.low_pct:+.1f}, {p.high_pct:+.1f}] %</td></tr>" for p in changes)
    return (f"<p class='curve-verdict' style='color:{colour}'><b>{html.escape(kind)}</b>: "
            f"{html.escape(curve.verdict.explanation)}"
            + (f" (pooled noise {curve.verdict.noise_pct:.1f} %)"
               if curve.verdict.noise_pct is not None else "") + "</p>"
            + ("<table class='data'><thead><tr><th>curve KPI</th><th>this run</th>"
               "<th>verdict</th><th>change</th><th>MDE</th></tr></thead>"
               f"<tbody>{''.join(rows)}</tbody></table>" if rows else "")
            + ("<table class='data'><thead><tr><th>load</th><th>KPI</th><th>this run</th>"
               "<th>history median</th><th>change</th><th>95 % interval</th></tr></thead>"
               f"<tbody>{change_rows}</tbody></table>" if change_rows else ""))


def worst_first(curves: Sequence[CurveResult]) -> list[CurveResult]:
    """Regressions, then improvements, then the rest."""
    order = {"regression": 0, "improvement": 1}
    return sorted(curves, key=lambda c: order.get(c.verdict.kind, 2))
