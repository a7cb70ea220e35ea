"""Prefect artifacts of a run: markdown summary, KPI/verdict table, report link.

Progress bars are `tasks.progress.ProgressArtifact`.

Artifact keys allow lowercase letters, digits and dashes only; tables stay small (one row
per KPI and run) and link to the full data in the artifact dir.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.compare import Comparison, comparison_lines
from analysis.curve import CurveResult, load_span
from analysis.pipeline import PostprocessOutcome
from core.redact import redact, redact_text

__all__ = ["artifact_key", "publish_comparison", "publish_results"]


def artifact_key(*parts: str) -> str:
    """Build a valid Prefect artifact key from free text."""
    key = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100] or "telltale"


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _validity(cell: dict[str, Any]) -> str:
    """A cell's validity for a table: ``valid``, ``invalid: reasons`` or empty."""
    status = cell.get("validity") or ""
    reasons = cell.get("validity_reasons") or []
    return f"{status}: {'; '.join(reasons)}" if status == "invalid" and reasons else status


def _curve_row(curve: CurveResult) -> str:
    """A curve's markdown row: its labels, verdict, moved loads, knee, history used."""
    moved = curve.verdict.load_range
    knee = curve.kpis.get("knee_load")
    return (f"| {curve.group_text()} | {curve.verdict.kind} | "
            f"{'' if moved is None else load_span(moved)} | "
            f"{'' if knee is None else f'{knee:g}'} | {curve.verdict.history_curves} |")


def publish_results(flow: str, outcome: PostprocessOutcome, cells: Sequence[dict[str, Any]],
                    artifact_dir: Path) -> None:
    """Publish the markdown summary, the KPI table with verdicts, and the report link."""
    from prefect.artifacts import (
        create_link_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    rows = [{"run": v.cell or v.test_path, "kpi": v.kpi, "value": _fmt(v.latest), "unit": v.unit,
             "baseline": _fmt(v.baseline), "change %": _fmt(v.change_pct, 3),
             "verdict": v.verdict, "validity": v.validity, "MDE %": _fmt(v.mde_pct, 2),
             "what changed": "; ".join(v.what_changed[:3]),
             "moved with it": "; ".join(v.suspects[:3]),
             "confidence": _fmt(v.confidence, 2)}
            for v in outcome.verdicts]
    rows = redact(rows)  # a sink: secrets masked by key and by value
    create_table_artifact(table=rows, key=artifact_key(flow, "kpis"),
                          description=f"KPIs and regression verdicts ({len(rows)} rows)")
    counts = ", ".join(f"{k}: {n}" for k, n in sorted(outcome.verdict_counts.items())) or "none"
    lines = [f"# {flow} — {artifact_dir.name}", "",
             f"- cells: {len(cells)} "
             f"({sum(1 for c in cells if c['status'] == 'failed')} failed, "
             f"{sum(1 for c in cells if c['status'] in ('skipped', 'resumed'))} skipped/resumed)",
             f"- runs parsed: {outcome.runs}, parse problems: {outcome.problems}",
             f"- verdicts: {counts}",
             f"- artifacts: `{artifact_dir}`",
             f"- report: `{outcome.report}`" if outcome.report else "- report: (not rendered)",
             "", "| cell | status | exit code | validity |", "|---|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c.get('exit_code', '')} | "
              f"{_validity(c)} |" for c in cells]
    if outcome.curves:  # each load sweep judged as one curve
        lines += ["", "## Curves", "", "| curve | verdict | loads moved | knee | history |",
                  "|---|---|---|---|---|", *[_curve_row(c) for c in outcome.curves]]
    if outcome.gate_failures:
        lines += ["", "## Gate failures", *[f"- {f}" for f in outcome.gate_failures]]
    create_markdown_artifact(markdown=redact_text("\n".join(lines)),
                             key=artifact_key(flow, "summary"),
                             description="Run summary")
    if outcome.report:
        create_link_artifact(link=Path(outcome.report).resolve().as_uri(),
                             link_text="HTML report", key=artifact_key(flow, "report"),
                             description="Plotly report (open from the machine that ran it)")


def publish_comparison(rows: Sequence[Comparison], a: str, b: str, key: str) -> None:
    """Publish a `analysis.compare` result: a table artifact and its terminal summary."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    table = redact([{"kpi": r.kpi, "configuration": r.configuration, "verdict": r.verdict,
                     "change %": _fmt(r.change_pct, 3),
                     "95 % interval": "" if r.ci_low_pct is None else
                     f"{r.ci_low_pct:+.1f} .. {r.ci_high_pct:+.1f}",
                     "effect size": _fmt(r.effect_size, 3), "runs": f"{r.runs_a} / {r.runs_b}"}
                    for r in rows])
    create_table_artifact(table=table, key=artifact_key(key, "compare"),
                          description=f"B = {b} against A = {a}")
    create_markdown_artifact(markdown=redact_text("```\n" + "\n".join(
        comparison_lines(rows, a, b)) + "\n```"), key=artifact_key(key, "compare-summary"),
        description="Comparison, worst first")
