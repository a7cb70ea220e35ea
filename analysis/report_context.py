"""What every report page is drawn from: the runs, their KPIs, the verdicts, the settings."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.discovery import Discovery
from analysis.kpi import BASE_COLUMNS
from analysis.project import AnalysisProject
from analysis.regression import DEFAULTS, DetectorSettings


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
    # not an init field: a context made by `dataclasses.replace` (other runs) starts empty
    _names: dict[int, str] = field(default_factory=dict, init=False, repr=False)

    def name_of(self, run: Any) -> str:
        """`run_name` of one of this report's runs, made once per run.

        The pages name a run ~10 times and the loss curve once per logged step: 10 000
        names for 1 000 runs cost ~0.15 s when each was made afresh.
        """
        name = self._names.get(id(run))  # ids are unique: the context holds its runs
        if name is None:
            name = self._names[id(run)] = run_name(run)
        return name


# -- shaping (pure, unit-tested) ----------------------------------------------------------


def run_name(run: Any) -> str:
    """A run as a person reads it: ``base · 2026-11-26 23:10 · 25f0bdb0``.

    Its cell's name (as the terminal says it), its start (UTC, to the minute) and the id its
    run folder ends with; a run without a flow's run id shows its uuid's first 8 instead.
    """
    stamp = getattr(run, "timestamp", None)
    try:
        # a datetime formats itself (pd.Timestamp's construction was ~20 us of each of the
        # ~10 names a run gets in a report: 0.2 s of 1 000 runs)
        when = (stamp if isinstance(stamp, datetime) else pd.Timestamp(stamp)).strftime(
            "%Y-%m-%d %H:%M") if stamp else "?"
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


def configuration_keys(ctx: ReportContext) -> list[str]:
    """The labels that tell configurations apart.

    The current runs' labels, less the ignored and the compared ones: exactly what the
    regression's history query matches on.
    """
    skip = set(ctx.ignored_labels) | {ctx.compared_label} | set(BASE_COLUMNS)
    return sorted({k for run in ctx.runs for k in run.labels} - skip)


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


def _shared_html(ctx: ReportContext) -> str:
    """The labels every shown configuration shares, said once above the charts/tables."""
    if not ctx.shared_labels:
        return ""
    said = [f"{html.escape(k)}={html.escape(v)}" for k, v in ctx.shared_labels.items() if v]
    # folded: two dozen settings in one line were a wall above every chart
    return (f"<details class='shared'><summary>Every configuration here shares {len(said)} "
            "setting(s)</summary><p>" + ", ".join(said) + "</p></details>")
