"""The report's index: the first screen answers "is anything wrong?".

One line (``2 regressions, 1 suspect, 9 unchanged, 1 not judged: busy machine``), then a
card per verdict a person must look at (regression, suspect, noisier, drift; drawn by
`analysis.report_cards`). Below: the triage table, the runs not judged, the noise budget,
the pages and a headline per KPI.

The pages themselves are drawn by `analysis.report`.
"""

from __future__ import annotations

import html
import itertools
import shlex
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.curve import load_span
from analysis.discovery import Discovery
from analysis.project import AnalysisProject
from analysis.regression import DEFAULTS, DetectorSettings
from analysis.report import REPORT_KINDS, _load_plots
from analysis.report_cards import verdict_cards
from analysis.report_context import ReportContext, _shared_html
from analysis.report_history import shape_kpi_history
from analysis.report_html import (
    _VERDICT_COLOURS,
    _VERDICT_MARKS,
    PLOTLY_FILE,
    SEVERITY,
    _page,
    _sparkline,
    _write_plotlyjs,
    page_parts,
)
from core.forked import beside
from core.progress import StageProgress
from core.safeio import write_text, write_text_parts

__all__ = ["render_report", "shape_headlines", "shape_triage", "triage_headline",
           "triage_line"]


MAX_HEADLINES = 200


_WITH_INDEX = frozenset({"kpi_history"})
"""Pages that read the shaped history the index and its cards read too
(`analysis.report_history.shape_kpi_history`, made once a context): drawn by the process
that draws the index, never beside it."""


def _page_name(index: int, entry: dict[str, Any]) -> str:
    return f"{index:02d}_{entry['kind']}.html"


def _page_title(entry: dict[str, Any]) -> str:
    return str(entry.get("title", entry["kind"]))


def _draw_pages(ctx: ReportContext, out_dir: Path, plots: Sequence[dict[str, Any]],
                which: Sequence[int], progress: StageProgress | None = None) -> bool:
    """Draw and write the pages ``which`` of ``plots``; True if one of them needs plotly.js."""
    plotly_needed = False
    for index in which:
        entry = plots[index]
        kind, title = entry["kind"], _page_title(entry)
        options = {k: v for k, v in entry.items() if k not in ("kind", "title")}
        drawn = REPORT_KINDS[kind](ctx, options)
        # a page drawn in parts is written as it is drawn, never held: it carries plotly.js
        needs_js = not isinstance(drawn, str) or "Plotly" in drawn or "plotly" in drawn
        plotly_needed = plotly_needed or needs_js
        head = f"<p><a href='index.html'>← index</a></p><h1>{html.escape(title)}</h1>"
        body = [drawn] if isinstance(drawn, str) else drawn
        write_text_parts(out_dir / _page_name(index, entry),
                         page_parts(title, itertools.chain([head], body), needs_js))
        del drawn, body
        if progress is not None:
            progress.advance()  # a page written
    return plotly_needed


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
                  curves: Sequence[Any] = (), split: bool = False) -> Path:
    """Write one HTML page per report plus ``index.html``; returns the index path.

    ``shared_dir``: where the one plotly.js copy of many reports lives (`_write_plotlyjs`).
    ``split``: the pages that do not read the shaped history are drawn by a forked child
    (`core.forked.beside`) while this process draws the others and the index (a warm
    1 000-run report: ~0.45 s of pages on one core, in two halves of ~0.23 s); the caller
    allows it where a second copy of the report's memory is affordable.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(project, runs, kpis, history, verdicts, discovery,
                        ignored_labels=tuple(ignored_labels), compared_label=compared_label,
                        out_dir=out_dir, detector=detector, history_uri=history_uri,
                        target_mde_pct=target_mde_pct, curves=tuple(curves))
    plots = _load_plots(project)
    progress = StageProgress("report", len(plots), "page(s)")
    here = [i for i, entry in enumerate(plots) if entry["kind"] in _WITH_INDEX]
    beside_pages = [i for i in range(len(plots)) if i not in here]
    if not split or not here or not beside_pages:  # nothing to share: every page drawn here
        here, beside_pages = list(range(len(plots))), []
    theirs = beside(_draw_pages, ctx, out_dir, plots, beside_pages) if beside_pages else None
    with theirs or nullcontext():
        plotly_needed = _draw_pages(ctx, out_dir, plots, here, progress)
        if theirs is not None:
            plotly_needed = theirs.result() or plotly_needed
            progress.advance(len(beside_pages))
    links = [(_page_name(i, entry), _page_title(entry)) for i, entry in enumerate(plots)]
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


