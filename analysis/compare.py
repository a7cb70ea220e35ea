"""Compare two sets of runs of a history, KPI by KPI, with confidence intervals.

``python -m analysis compare --history URI A B [--kpi NAME]... [--html PATH] [--json PATH]``

``A`` and ``B`` each select runs of the history:

- a run uuid (or several, comma-separated; ``run:`` may prefix them), or a run folder's id
  (``25f0bdb0``: the end of its name) or name: every cell of that run;
- a label selection, ``label=value[,label=value...]`` (``vllm=0.32.0``);
- a time window, ``START..END`` in ISO form (``2026-11-01..2026-11-08``; either side may be
  left open), start included, end excluded.

Only valid runs count (invalid and failed ones are never a measurement). Rows are grouped
by KPI and configuration (every label but those a selection names, the ignored labels, the
per-run columns and the labels whose values in A and B never meet: what tells them apart),
so a release is compared with the other on each configuration. Per group:
the change of B against A (in logs for positive values: relative, and symmetric for a
runtime and its throughput), a 95 % confidence interval (Welch's t, its quantile from the
Cornish-Fisher expansion: no scipy), Hedges' g as the effect size, and a verdict:

- ``worse`` / ``better``: the interval excludes no change (against the KPI's direction);
- ``same``: the interval lies within ±``same_within`` % (default 2 %);
- ``inconclusive``: neither — the noise is too large for the runs given, or a side has
  fewer than 2 runs (its noise is unknown).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from analysis.curve import CurveSpec, curve_kpi_rows
from analysis.history import RUN_COLUMNS, usable_rows
from analysis.kpi import BASE_COLUMNS
from core.errors import UserError

__all__ = ["Comparison", "CompareVerdict", "compare_frames", "comparison_html",
           "comparison_lines", "runs_named", "select_runs"]

CompareVerdict = Literal["better", "worse", "same", "inconclusive"]
_Z975 = 1.959963984540054
_WINDOW = re.compile(r"^(?P<start>[^.]*)\.\.(?P<end>[^.]*)$")
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,80}$")
MAX_SELECTOR = 4096


class Comparison(BaseModel):
    """One KPI of one configuration: B against A."""

    kpi: str
    configuration: str = Field(description="The labels of the group (label=value, ...).")
    unit: str
    lower_better: bool
    runs_a: int
    runs_b: int
    mean_a: float
    mean_b: float
    change_pct: float = Field(description="B against A, %.")
    ci_low_pct: float | None = Field(description="95 % interval of the change, low end, %.")
    ci_high_pct: float | None
    effect_size: float | None = Field(description="Hedges' g (in the noise's units).")
    verdict: CompareVerdict
    explanation: str


def _t975(df: float) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (Cornish-Fisher)."""
    z = _Z975
    if not math.isfinite(df) or df > 1e6:
        return z
    df = max(df, 1.0)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def _parse_time(text: str, spec: str) -> pd.Timestamp | None:
    if not text:
        return None
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        raise UserError(f"selection {spec!r}: {text!r} is not an ISO date or time") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _label_terms(spec: str) -> dict[str, str] | None:
    """``{label: value}`` of a label selection, None when ``spec`` is not one."""
    if "=" not in spec:
        return None
    terms: dict[str, str] = {}
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not _LABEL.match(name):
            raise UserError(f"selection {spec!r}: {part!r} is not label=value")
        terms[name] = value.strip()
    return terms


_FOLDER = re.compile(r"^\d{8}-\d{6}-.+-(?P<id>[0-9a-f]{8})/?$")
"""A run folder's name (`flows.cli.default_artifact_dir`): its last part is the run's id."""


def runs_named(frame: pd.DataFrame, token: str) -> pd.Series:
    """The rows of the run(s) ``token`` names.

    A run uuid; the id a run folder's name ends with (8+ characters of the flow run id:
    every cell of that run); or the folder's name.

    What ``analysis history`` lists in its ``run`` and ``uuid`` columns both work here.
    """
    by_uuid = frame["run_uuid"] == token
    folder = _FOLDER.match(token.rstrip("/").rsplit("/", 1)[-1])
    prefix = folder["id"] if folder else token
    if by_uuid.any() or len(prefix) < 8 or "run_id" not in frame.columns:
        return by_uuid
    # as objects first: a dictionary-encoded column takes no fill value it lacks
    return frame["run_id"].astype("object").fillna("").astype(str).str.startswith(prefix)


def select_runs(frame: pd.DataFrame, spec: str) -> tuple[pd.DataFrame, set[str]]:
    """The history rows ``spec`` selects, and the labels it names (not configuration).

    Raises:
        UserError: A malformed selection, an unknown label, or nothing selected.
    """
    if not spec or len(spec) > MAX_SELECTOR or any(not c.isprintable() for c in spec):
        raise UserError("a selection must be a short printable text")
    window = _WINDOW.match(spec)
    terms = None if window else _label_terms(spec)
    named: set[str] = set()
    if window:
        start, end = (_parse_time(window[k], spec) for k in ("start", "end"))
        stamps = pd.to_datetime(frame["timestamp"], utc=True)
        keep = pd.Series(True, index=frame.index)
        if start is not None:
            keep &= stamps >= start
        if end is not None:
            keep &= stamps < end
        chosen = frame[keep]
    elif terms is not None:
        keep = pd.Series(True, index=frame.index)
        for name, value in terms.items():
            if name not in frame.columns:
                raise UserError(f"selection {spec!r}: no run in the history has a label "
                                f"{name!r}")
            keep &= frame[name] == value
        chosen = frame[keep]
        named = set(terms)
    else:
        tokens = {u.strip() for u in spec.removeprefix("run:").split(",") if u.strip()}
        keep = pd.Series(False, index=frame.index)
        missing = set()
        for token in tokens:
            named_rows = runs_named(frame, token)
            if not named_rows.any():
                missing.add(token)
            keep |= named_rows
        chosen = frame[keep]
        if missing:
            raise UserError(f"selection {spec!r}: run(s) {', '.join(sorted(missing))} not in "
                            "the history (or not valid measurements)")
    if chosen.empty:
        raise UserError(f"selection {spec!r} selects no valid run of the history")
    return chosen, named


def _group_keys(frame: pd.DataFrame, skip: set[str]) -> list[str]:
    return sorted(c for c in frame.columns if c not in BASE_COLUMNS and c not in RUN_COLUMNS
                  and c not in skip and not c.startswith("_"))


def _configuration(keys: Sequence[str], values: Sequence[object]) -> str:
    shown = [f"{k}={v}" for k, v in zip(keys, values, strict=True)
             if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return ", ".join(shown) or "(all)"


def compare_frames(history: pd.DataFrame, a: str, b: str, *, kpis: Iterable[str] = (),
                   ignored_labels: Iterable[str] = (), same_within_pct: float = 2.0,
                   curve: CurveSpec | None = None) -> list[Comparison]:
    """Compare the runs ``a`` selects with those ``b`` selects (see the module docstring).

    ``curve``: the project's sweep; its curve KPIs (knee, frontier) are compared too, one
    value per selected run's curve (`analysis.curve.curve_kpi_rows`).

    Raises:
        UserError: A selection is malformed or selects nothing, or they share no KPI.
    """
    frame = usable_rows(history)
    wanted = set(kpis)
    rows_a, named_a = select_runs(frame, a)
    rows_b, named_b = select_runs(frame, b)
    if curve is not None:
        rows_a, rows_b = (pd.concat([rows, curve_kpi_rows(rows, curve, ignored_labels)],
                                    ignore_index=True) for rows in (rows_a, rows_b))
    if wanted:
        rows_a, rows_b = (rows[rows["kpi"].isin(wanted)] for rows in (rows_a, rows_b))
        frame = frame[frame["kpi"].isin(wanted)]
    skip = named_a | named_b | set(ignored_labels) | {"run_uuid", "run_id", "test_path"}
    # a label whose values in A and B never meet is what tells A from B (the release of a
    # time window), not a configuration
    skip |= {c for c in _group_keys(frame, skip) if not set(
        rows_a[c].astype("object").fillna("")) & set(rows_b[c].astype("object").fillna(""))}
    keys = _group_keys(frame, skip)
    out: list[Comparison] = []
    group_by = ["kpi", *keys]
    grouped_b = {k if isinstance(k, tuple) else (k,): g for k, g in
                 rows_b.groupby(group_by, dropna=False, sort=True)}
    for key, group_a in rows_a.groupby(group_by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        group_b = grouped_b.get(key)
        if group_b is None:
            continue
        out.append(_compare(str(key[0]), _configuration(keys, key[1:]), group_a, group_b,
                            same_within_pct))
    if not out:
        raise UserError(f"{a!r} and {b!r} share no KPI of one configuration")
    return out


def _per_run(group: pd.DataFrame) -> np.ndarray:
    """One value per run (the runs' repeats are separate runs already)."""
    values = group.groupby("run_uuid")["value"].mean().to_numpy(dtype=float)
    return values[np.isfinite(values)]


def _compare(kpi: str, configuration: str, group_a: pd.DataFrame, group_b: pd.DataFrame,
             same_within_pct: float) -> Comparison:
    va, vb = _per_run(group_a), _per_run(group_b)
    lower_better = bool(group_a["lower_better"].iloc[0])
    unit = str(group_a["unit"].iloc[0])
    logs = bool(len(va) and len(vb) and np.all(va > 0) and np.all(vb > 0))
    ya, yb = (np.log(va), np.log(vb)) if logs else (va, vb)
    mean_a = float(np.mean(va)) if len(va) else math.nan
    mean_b = float(np.mean(vb)) if len(vb) else math.nan
    diff = float(np.mean(yb) - np.mean(ya)) if len(ya) and len(yb) else math.nan
    scale = 1.0 if logs else (abs(float(np.mean(ya))) or 1.0)

    def relative(x: float) -> float:
        return 100 * (math.expm1(x) if logs else x / scale)

    change = relative(diff)
    low = high = effect = None
    verdict: CompareVerdict = "inconclusive"
    if len(ya) >= 2 and len(yb) >= 2:
        sa, sb = float(np.var(ya, ddof=1)), float(np.var(yb, ddof=1))
        se = math.sqrt(sa / len(ya) + sb / len(yb))
        if se > 0:
            df = se ** 4 / ((sa / len(ya)) ** 2 / (len(ya) - 1)
                            + (sb / len(yb)) ** 2 / (len(yb) - 1))
        else:
            df = math.inf
        half = _t975(df) * se
        low, high = relative(diff - half), relative(diff + half)
        pooled = math.sqrt(((len(ya) - 1) * sa + (len(yb) - 1) * sb)
                           / (len(ya) + len(yb) - 2))
        correction = 1 - 3 / (4 * (len(ya) + len(yb)) - 9)
        effect = diff / pooled * correction if pooled > 0 else (
            0.0 if diff == 0 else math.copysign(math.inf, diff))
        if low > 0 or high < 0:
            up = low > 0
            verdict = "worse" if up == lower_better else "better"
        elif -same_within_pct <= low and high <= same_within_pct:
            verdict = "same"
    if low is None:
        why = (f"{change:+.1f}%: {len(va)} vs {len(vb)} run(s); 2 a side are needed to know "
               "the noise")
    else:
        why = (f"{change:+.1f}% (95 % interval {low:+.1f}% .. {high:+.1f}%, Hedges' g "
               f"{effect:+.2f}; {len(va)} vs {len(vb)} runs): "
               + {"worse": "the interval excludes no change, against the KPI's direction",
                  "better": "the interval excludes no change, in the KPI's direction",
                  "same": f"the interval lies within ±{same_within_pct:g}%",
                  "inconclusive": f"the interval holds no change and reaches past "
                                  f"±{same_within_pct:g}%: more runs would tell"}[verdict])
    return Comparison(kpi=kpi, configuration=configuration, unit=unit,
                      lower_better=lower_better, runs_a=len(va), runs_b=len(vb),
                      mean_a=mean_a, mean_b=mean_b, change_pct=round(change, 4),
                      ci_low_pct=None if low is None else round(low, 4),
                      ci_high_pct=None if high is None else round(high, 4),
                      effect_size=None if effect is None else round(effect, 4),
                      verdict=verdict, explanation=why)


def _pairs(configuration: str) -> list[str]:
    # label=value pairs joined by ", " (a value may hold a bare comma: q_proj,v_proj)
    return [p for p in configuration.split(", ") if p]


def shared_and_distinct(configurations: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The labels every configuration shares (said once), and what sets each apart."""
    unique = list(dict.fromkeys(configurations))
    if not unique:
        return "", {}
    shared = set(_pairs(unique[0])).intersection(*(set(_pairs(c)) for c in unique[1:]))
    return (", ".join(p for p in _pairs(unique[0]) if p in shared),
            {c: ", ".join(p for p in _pairs(c) if p not in shared) for c in unique})


def comparison_lines(rows: Sequence[Comparison], a: str, b: str) -> list[str]:
    """The terminal table: one line per KPI and configuration, worst first.

    The labels all configurations share are printed once, above the table; a row names
    only what sets its configuration apart.
    """
    order = {"worse": 0, "inconclusive": 1, "better": 2, "same": 3}
    shared, distinct = shared_and_distinct([r.configuration for r in rows])
    lines = [f"B = {b}  against  A = {a}"]
    if shared:
        lines.append(f"configuration: {shared}")
    lines.append(f"{'verdict':<13} {'change':>8} {'95% interval':>19} {'g':>6}  KPI"
                 + (" [configuration]" if any(distinct.values()) else ""))
    for row in sorted(rows, key=lambda r: (order[r.verdict], r.kpi, r.configuration)):
        interval = "" if row.ci_low_pct is None else \
            f"{row.ci_low_pct:+.1f}% .. {row.ci_high_pct:+.1f}%"
        effect = "" if row.effect_size is None else f"{row.effect_size:+.2f}"
        apart = distinct.get(row.configuration)
        lines.append(f"{row.verdict:<13} {row.change_pct:>+7.1f}% {interval:>19} "
                     f"{effect:>6}  {row.kpi}" + (f" [{apart}]" if apart else ""))
    return lines


_COMPARE_COLOURS = {"worse": "#c0392b", "better": "#1e8449", "same": "#7f8c8d",
                    "inconclusive": "#b7950b"}
_COMPARE_SIGNS = {"worse": "▼ worse", "better": "▲ better", "same": "= same",
                  "inconclusive": "? inconclusive"}
"""The verdict's word with a sign: told apart without colour."""
BAR_WIDTH = 240


def interval_bar(row: Comparison, span: float, same_within_pct: float) -> str:
    """An inline SVG: the change (a tick) and its 95 % interval (a bar) on a shared scale.

    ``span`` is the largest change any row of the page shows (each row is drawn on the
    same ±``span`` % axis); the grey band is the ``same`` zone, the line no change.
    """
    half = BAR_WIDTH / 2

    def x(value: float) -> float:
        return half + max(-1.0, min(1.0, value / span)) * (half - 4)

    colour = _COMPARE_COLOURS[row.verdict]
    parts = [f"<rect x='{x(-same_within_pct):.1f}' y='2' height='16' "
             f"width='{x(same_within_pct) - x(-same_within_pct):.1f}' fill='#eee'/>",
             f"<line x1='{half}' x2='{half}' y1='0' y2='20' stroke='#999'/>"]
    if row.ci_low_pct is not None and row.ci_high_pct is not None:
        parts.append(f"<rect x='{x(row.ci_low_pct):.1f}' y='7' height='6' rx='2' "
                     f"width='{max(x(row.ci_high_pct) - x(row.ci_low_pct), 1):.1f}' "
                     f"fill='{colour}' opacity='0.55'/>")
    parts.append(f"<line x1='{x(row.change_pct):.1f}' x2='{x(row.change_pct):.1f}' y1='3' "
                 f"y2='17' stroke='{colour}' stroke-width='3'/>")
    label = (f"{row.change_pct:+.1f} %" + ("" if row.ci_low_pct is None else
             f", 95 % interval {row.ci_low_pct:+.1f} .. {row.ci_high_pct:+.1f} %"))
    return (f"<svg width='{BAR_WIDTH}' height='20' role='img' aria-label='{label}'>"
            f"<title>{label}</title>{''.join(parts)}</svg>")


def comparison_html(rows: Sequence[Comparison], a: str, b: str, *,
                    same_within_pct: float = 2.0) -> str:
    """A self-contained page, Perfherder-style: a row per KPI and configuration, worst first.

    Each row: A's and B's means (and runs), the change, its 95 % interval drawn as a bar on
    one scale shared by every row (with the ``same`` zone and no change marked), Hedges' g
    and the verdict. Static (inline SVG, no script): it opens offline and from S3.
    """
    from analysis.report_html import _page

    body = (f"<h1>Compare</h1><p>B = <code>{html.escape(b)}</code> against A = "
            f"<code>{html.escape(a)}</code>; valid runs only. Bars: the change of B against "
            f"A with its 95 % interval; grey: within ±{same_within_pct:g} % (the same).</p>")
    if not rows:
        return _page("compare", body + "<p class='empty'>no comparison</p>", False)
    shared, distinct = shared_and_distinct([r.configuration for r in rows])
    if shared:
        body += f"<p>Configuration: <code>{html.escape(shared)}</code></p>"
    order = {"worse": 0, "inconclusive": 1, "better": 2, "same": 3}
    ordered = sorted(rows, key=lambda r: (order[r.verdict], -abs(r.change_pct), r.kpi))
    ends = [abs(v) for r in ordered for v in (r.change_pct, r.ci_low_pct, r.ci_high_pct)
            if v is not None and math.isfinite(v)]
    span = max([same_within_pct * 2, *ends]) * 1.1
    lines = []
    for r in ordered:
        apart = distinct.get(r.configuration)
        name = html.escape(r.kpi) + (f" <span class='config'>[{html.escape(apart)}]</span>"
                                     if apart else "")
        effect = "" if r.effect_size is None else f"{r.effect_size:+.2f}"
        unit = html.escape(r.unit)
        lines.append(
            f"<tr title='{html.escape(r.explanation, quote=True)}'><td>{name}</td>"
            f"<td>{r.mean_a:.4g} {unit} ({r.runs_a})</td>"
            f"<td>{r.mean_b:.4g} {unit} ({r.runs_b})</td>"
            f"<td style='color:{_COMPARE_COLOURS[r.verdict]}'><b>{r.change_pct:+.1f} %</b></td>"
            f"<td>{interval_bar(r, span, same_within_pct)}</td><td>{effect}</td>"
            f"<td>{_COMPARE_SIGNS[r.verdict]}</td></tr>")
    body += ("<div class='scroll'><table class='data'><thead><tr><th>KPI</th>"
             "<th>A: mean (runs)</th><th>B: mean (runs)</th><th>change</th>"
             f"<th>95 % interval (axis ±{span:.3g} %)</th><th>Hedges' g</th><th>verdict</th>"
             "</tr></thead><tbody>" + "".join(lines) + "</tbody></table></div>")
    return _page("compare", body, False)
