"""Judging runs: each KPI of each valid run against its own history, into verdict rows.

The KPI series of one configuration (the labels the history matches on) is cut at the
run, judged by `analysis.regression.verdict` with its repeats, and turned into a
`VerdictRow`; invalid and failed runs get `NOT_JUDGED`; the KPIs that moved with a change
are named as its suspects; the gate says what fails a run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, get_args

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from analysis.construct import constructor
from analysis.fingerprint import Fingerprint, decode, what_changed
from analysis.history import (
    ALL_KPIS,
    FINGERPRINT,
    HistorySource,
    matched_labels,
    usable_rows,
)
from analysis.kpi import Kpi
from analysis.power import minimum_detectable_effect, shift_at
from analysis.regression import DetectorSettings, VerdictKind, verdict
from analysis.run_analysis import RunAnalysis
from analysis.settings import AnalysisSettings
from core.progress import StageProgress


class VerdictRow(BaseModel):
    """One KPI of one run, judged against its history."""

    run_uuid: str
    test_path: str
    cell: str = Field(default="", description="The cell's name (its dir when it has none): "
                      "what the terminal, report and artifacts call the run.")
    kpi: str
    unit: str
    latest: float | None = Field(description="The run's value (median of its repeats).")
    repeats: list[float] = Field(default_factory=list, description="The values judged "
                                 "together: the run and its confirmation re-runs.")
    baseline: float | None
    change_pct: float | None
    verdict: str
    confidence: float
    suspect: bool = Field(default=False, description="The newest run alone looks like a "
                          "regression: a re-run would confirm or withdraw it.")
    history_used: int
    explanation: str
    validity: str = Field(default="valid", description="valid, invalid or failed: only a "
                          "valid run is judged.")
    since_runs: int | None = Field(default=None, description="A regression or improvement: "
                                   "its level began this many runs back (1: this run).")
    what_changed: list[str] = Field(default_factory=list, description="Environment "
                                    "fingerprint differences at and since the change.")
    suspects: list[str] = Field(default_factory=list, description="Other KPIs of this "
                                "configuration that moved within one run of the change.")
    mde_pct: float | None = Field(default=None, description="Minimum detectable effect, %: "
                                  "the smallest shift this KPI's noise lets the verdict see "
                                  "(80 % power) with the repeats judged.")


NOT_JUDGED = "not_judged"
"""The verdict of an invalid or failed run: kept and shown, never judged."""
VERDICT_KINDS = (*get_args(VerdictKind), NOT_JUDGED)
"""Every verdict a row can carry (`analysis.regression.VerdictKind`, then `NOT_JUDGED`)."""
_new_verdict_row = constructor(VerdictRow)


def judge_runs(runs: Sequence[RunAnalysis], store: HistorySource | None,
               settings: AnalysisSettings) -> list[VerdictRow]:
    """Judge each valid run's KPIs against the valid history of runs with matching labels.

    An invalid or failed run is not judged (its rows say why: `NOT_JUDGED`), and only valid
    history rows make a baseline. A run a person accepted as a KPI's new baseline
    (`HistoryStore.accept`) starts that KPI's history: earlier levels no longer count, and
    its shift is not news. A regression or improvement names what changed in the
    environment at its change point and the KPIs of the configuration that moved with it;
    every verdict carries the KPI's minimum detectable effect.
    """
    rows: list[VerdictRow] = []
    accepts = getattr(store, "accepted", None)
    accepted: dict[str, set[str]] = accepts() if callable(accepts) else {}
    tuning = settings.regression.detector()
    # One history query per configuration, not per run: runs of one configuration share
    # their history rows (a query per run cost ~75 ms: 77 s for 1 000 runs).
    by_configuration: dict[tuple[tuple[str, str | None], ...], _TimedSeries] = {}
    texts: dict[str, str] = {}  # one copy of each explanation ("3 historical point(s)...")
    progress = StageProgress("judge", len(runs))
    for whole in _repeat_groups(runs):
        progress.advance(len(whole))
        rows.extend(_not_judged(run) for run in whole if not run.validity.valid)
        group = [run for run in whole if run.validity.valid]
        if not group:
            continue
        first = group[0]
        by_kpi: _KpiSeries = {}
        if store is not None:
            key = tuple(sorted(matched_labels(
                first.labels, settings.comparison.compared_label,
                settings.comparison.ignored_labels).items(), key=lambda kv: kv[0]))
            series = by_configuration.get(key)
            if series is None:
                series = by_configuration[key] = _kpi_series(store.query(
                    first.labels, compared_label=settings.comparison.compared_label,
                    ignored_labels=settings.comparison.ignored_labels))
            stamps = [pd.Timestamp(r.timestamp) for r in group if r.timestamp]
            stamp = min(s if s.tzinfo else s.tz_localize("UTC") for s in stamps) \
                if stamps else None
            by_kpi = _before(series, stamp, {r.run_uuid for r in group})
        judged_kpis = _judge_group(group, by_kpi, accepted, tuning)
        for kpi_name, (kpi, repeats, judged, extra) in judged_kpis.items():
            if kpi.ignored_for_regression:
                continue
            for run in group:
                # constructed, one fields set shared: every value is typed by `verdict` or
                # the run; a validated row held its own set (80 000 rows at 10 000 runs:
                # 115 MB, 51 MB this way)
                rows.append(_new_verdict_row(
                    run_uuid=run.run_uuid,
                    test_path=run.result.rel_path, cell=run.name, kpi=kpi_name,
                    unit=kpi.unit,
                    latest=judged.latest, repeats=repeats, baseline=judged.baseline,
                    change_pct=round(judged.magnitude * 100, 3) if judged.baseline is not None
                    else None,
                    verdict=judged.kind, confidence=judged.confidence, suspect=judged.suspect,
                    history_used=judged.history_used,
                    explanation=texts.setdefault(judged.explanation, judged.explanation),
                    validity="valid", since_runs=judged.start_runs, **extra))
    progress.finish()
    return rows


def _not_judged(run: RunAnalysis) -> VerdictRow:
    """The row of an invalid or failed run: shown with its reasons, never judged."""
    return _new_verdict_row(
        run_uuid=run.run_uuid, test_path=run.result.rel_path, cell=run.name, kpi="*",
        unit="",
        latest=None, repeats=[], baseline=None, change_pct=None, verdict=NOT_JUDGED,
        confidence=0.0, suspect=False, history_used=0,
        explanation=f"not judged: {run.validity.summary()}", validity=run.validity.status,
        since_runs=None, what_changed=_NONE, suspects=_NONE, mde_pct=None)


_Judged = tuple[Kpi, list[float], Any, dict[str, Any]]
_NONE: list[str] = []
"""The empty ``what_changed`` and ``suspects`` every row without them shares (read-only by
convention: a row's list is replaced, never appended to). Two empty lists a row were
5.6 MB at 10 000 runs."""


def _judge_group(group: Sequence[RunAnalysis], by_kpi: _KpiSeries,
                 accepted: dict[str, set[str]], tuning: DetectorSettings
                 ) -> dict[str, _Judged]:
    """Every KPI of a group of repeats: (kpi, repeats, verdict, explanation fields)."""
    first = group[0]
    out: dict[str, _Judged] = {}
    data: dict[str, tuple[list[float], list[float]]] = {}
    for kpi in first.kpis:
        repeats = [k.value for r in group for k in r.kpis if k.name == kpi.name]
        values, uuids, _ = by_kpi.get(kpi.name, ([], [], []))
        start = _accepted_index(uuids, accepted, kpi.name)
        data[kpi.name] = (values[start or 0:], repeats)
        if kpi.ignored_for_regression:
            out[kpi.name] = (kpi, repeats, None, {})
            continue
        direction = "lower_better" if kpi.lower_better else "higher_better"
        judged = verdict(values, repeats, direction, settings=tuning, accepted=start)
        mde = minimum_detectable_effect(values[start or 0:], len(repeats), settings=tuning)
        out[kpi.name] = (kpi, repeats, judged, {
            "mde_pct": round(mde * 100, 3) if mde is not None else None,
            "what_changed": _NONE, "suspects": _NONE})
    for name, (_, _, judged, extra) in out.items():
        if judged is None or judged.kind not in ("regression", "improvement") \
                or not judged.start_runs:
            continue
        values, _, fingerprints = by_kpi.get(name, ([], [], []))
        finite = [fp for v, fp in zip(values, fingerprints, strict=True) if math.isfinite(v)]
        extra["what_changed"] = what_changed(
            [*(_decoded(fp) for fp in finite), first.fingerprint or None],
            len(finite) - (judged.start_runs - 1))
        extra["suspects"] = _moved_with(name, judged.start_runs, data, tuning)
    return out


@functools.lru_cache(maxsize=4096)
def _decoded(text: str | None) -> Fingerprint | None:
    return decode(text)


MAX_SUSPECTS = 8


def _moved_with(name: str, start_runs: int, data: dict[str, tuple[list[float], list[float]]],
                tuning: DetectorSettings) -> list[str]:
    """The other KPIs whose own level changed within one run of ``name``'s, strongest first."""
    found: list[tuple[float, str]] = []
    for other, (values, repeats) in data.items():
        if other == name or not repeats:
            continue
        shift = shift_at(values, repeats, start_runs, settings=tuning)
        if shift is None:
            continue
        change, z, runs = shift
        if abs(z) >= tuning.verdict_z:
            found.append((abs(z), f"{other} {change * 100:+.1f}% ({abs(z):.1f} SE, began "
                                  f"{runs} run(s) back)"))
    return [text for _, text in sorted(found, reverse=True)[:MAX_SUSPECTS]]


def _repeat_groups(runs: Sequence[RunAnalysis]) -> list[list[RunAnalysis]]:
    """Runs grouped with their confirmation re-runs (``repeat_of``), in order of first run.

    A re-run whose original is not in this batch is judged on its own.
    """
    uuids = {r.run_uuid for r in runs}
    groups: dict[str, list[RunAnalysis]] = {}
    for run in runs:
        original = getattr(run.result, "repeat_of", None)
        key = original if original in uuids else run.run_uuid
        groups.setdefault(key, []).append(run)
    return list(groups.values())


_KpiSeries = dict[str, tuple[list[float], list[str], list[str | None]]]
_TimedSeries = dict[str, tuple[Any, list[float], list[str], list[str | None]]]
HISTORY_LIMIT = 500
"""Newest history points a verdict reads per KPI: its baseline and the newest levels are
well inside, and the judging time per run stays bounded however long the history grows."""


def _kpi_series(history: pd.DataFrame) -> _TimedSeries:
    """Valid history rows per KPI, oldest first.

    Each: (timestamps as int64 ns, values, run uuids, fingerprints as stored).
    """
    out: _TimedSeries = {}
    history = usable_rows(history)
    if history.empty:
        return out
    fingerprints = history[FINGERPRINT].to_numpy() if FINGERPRINT in history.columns \
        else np.full(len(history), None, dtype=object)
    stamps = (pd.to_datetime(history["timestamp"], utc=True).dt.tz_convert(None).to_numpy()
              .astype("datetime64[ns]").astype("int64"))
    for name, rows in history.groupby("kpi", sort=False).indices.items():
        out[str(name)] = (stamps[rows], history["value"].to_numpy()[rows].tolist(),
                          history["run_uuid"].to_numpy()[rows].tolist(),
                          [fp if isinstance(fp, str) else None
                           for fp in fingerprints[rows].tolist()])
    return out


def _before(series: _TimedSeries, stamp: pd.Timestamp | None,
            exclude: set[str]) -> _KpiSeries:
    """Each KPI's history before ``stamp``, less the ``exclude`` runs (newest points only).

    At most `HISTORY_LIMIT` points per KPI.
    """
    out: _KpiSeries = {}
    for name, (stamps, values, uuids, fps) in series.items():
        end = len(values) if stamp is None else int(np.searchsorted(stamps, stamp.value))
        begin = max(0, end - HISTORY_LIMIT)
        kept = [(v, u, f) for v, u, f in zip(values[begin:end], uuids[begin:end],
                                             fps[begin:end], strict=True) if u not in exclude]
        out[name] = ([v for v, _, _ in kept], [u for _, u, _ in kept], [f for _, _, f in kept])
    return out


def _accepted_index(run_uuids: Sequence[str], accepted: dict[str, set[str]],
                    kpi: str) -> int | None:
    """Position of the newest accepted run of ``kpi`` in its history (None: none)."""
    runs = accepted.get(kpi, set()) | accepted.get(ALL_KPIS, set())
    for i in range(len(run_uuids) - 1, -1, -1):
        if run_uuids[i] in runs:
            return i
    return None


def _gate(rows: Sequence[VerdictRow], settings: AnalysisSettings) -> list[str]:
    failures = []
    for row in rows:
        if row.verdict == "regression" and settings.regression.fail_on_regression:
            failures.append(f"{row.cell or row.test_path}: {row.kpi} regressed "
                            f"({row.explanation})")
        if row.verdict == "improvement" and settings.regression.fail_on_improvement:
            failures.append(f"{row.cell or row.test_path}: {row.kpi} improved "
                            f"({row.explanation})")
    return failures
