"""Report pages of judgement.

``regression`` (the verdict table, coloured by kind) and ``errors`` (failed runs with their
last words and log links, skipped dirs, parse problems).
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.report_context import ReportContext
from analysis.report_html import (
    _NEWS,
    _VERDICT_COLOURS,
    _VERDICT_MARKS,
    MAX_TABLE_ROWS,
    SEVERITY,
    VERDICT_TITLES,
    _cap_note,
    _capped,
    _shown_positions,
    _table_html,
)


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
