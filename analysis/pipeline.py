"""Post-processing of a results tree: discover → parse → KPIs → LTS → history → verdicts.

`postprocess` is what the ``python -m analysis`` CLI and the flows' post-process task call;
it writes its outputs into ``out`` and returns a `PostprocessOutcome` describing them.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field, ValidationError

from analysis.construct import constructor
from analysis.curve import CurveResult, judge_curves, lts_curve
from analysis.discovery import Discovery, SkippedDir, discover
from analysis.fingerprint import Fingerprint, decode, encode, fingerprint_of, what_changed
from analysis.history import (
    ALL_KPIS,
    CELL,
    FINGERPRINT,
    IDENTITY,
    VALIDITY,
    AppendLock,
    HistorySource,
    HistoryStore,
    matched_labels,
    run_identity,
    usable_rows,
)
from analysis.kpi import Kpi, compute_kpis, kpi_table, label_strings, openmetrics_lines
from analysis.lts import LtsKpi, LtsMetadata, LtsPayload, require_complete
from analysis.parsing import ParsedResult, parse_dirs
from analysis.project import AnalysisProject, load_project
from analysis.regression import (
    DetectorSettings,
    VerdictKind,
    minimum_detectable_effect,
    shift_at,
    verdict,
)
from analysis.settings import AnalysisSettings, ValidityPolicy
from analysis.validity import Validity, judge_validity
from core.errors import ConfigError, ResultsError
from core.progress import StageProgress
from core.redact import redact, redact_bytes
from core.safeio import atomic_open, output_root, write_text
from core.yamlio import dump_yaml, load_yaml

__all__ = [
    "PostprocessOutcome",
    "RunAnalysis",
    "VerdictRow",
    "judge_runs",
    "postprocess",
    "runs_table",
    "settings_for",
    "suspects",
    "validity_of_tree",
]

logger = logging.getLogger("telltale.analysis")


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
_LTS_VERDICT = {"verdict", "baseline", "change_pct", "confidence", "history_used",
                "explanation", "validity", "what_changed", "suspects",
                "mde_pct"}  # what an LTS payload's regression block keeps of a verdict
_new_verdict_row = constructor(VerdictRow)
# Fields sets shared by every model_construct-ed instance (all fields set): the
# metadata-only copies of the spooled payloads
_PAYLOAD_FIELDS = set(LtsPayload.model_fields)
_METADATA_FIELDS = set(LtsMetadata.model_fields)


class RunAnalysis(BaseModel):
    """Everything computed for one result dir."""

    result: ParsedResult
    run_uuid: str
    timestamp: str | None
    labels: dict[str, str]
    kpis: list[Kpi]
    payload: LtsPayload
    identity: str = Field(description="Hash of the settings and start (the history refuses "
                          "another run under this uuid).")
    validity: Validity = Field(default_factory=Validity)
    fingerprint: Fingerprint = Field(default_factory=dict)
    cell: str | None = Field(default=None, description="The cell's name (its ``cell.json``).")

    @property
    def name(self) -> str:
        """The run as every output names it: its cell's name, else its dir (relative)."""
        return self.cell or self.result.rel_path


class PostprocessOutcome(BaseModel):
    """What post-processing produced."""

    out_dir: str
    runs: int = Field(description="Result dirs parsed (failed runs included).")
    failed_runs: int = Field(description="Runs whose exit code is not 0.")
    skipped: list[dict[str, str]] = Field(default_factory=list)
    problems: int = Field(description="Parse problems over all runs.")
    kpi_rows: int
    verdicts: list[VerdictRow] = Field(default_factory=list)
    verdict_counts: dict[str, int] = Field(default_factory=dict)
    history_uri: str | None = None
    report: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    gate_failures: list[str] = Field(default_factory=list,
                                     description="Why the run fails the regression gate.")
    validity: dict[str, Validity] = Field(default_factory=dict, description="Each run's "
                                          "validity by its result dir (test path).")
    curves: list[CurveResult] = Field(default_factory=list, description="This run's load "
                                      "sweeps, each judged as one curve (`analysis.curve`).")


def _status(result: ParsedResult) -> Literal["success", "failed", "partial"]:
    if result.exit_code != 0:
        return "failed"
    return "partial" if result.problems else "success"


_EARLIEST = pd.Timestamp("1970-01-01", tz="UTC")
_LATEST = pd.Timestamp("2200-01-01", tz="UTC")


def _usable_time(text: str | None) -> str | None:
    """A run's start or end as read from its tree, or None when it is not a usable time.

    Result trees are untrusted: a start in year 9999 overflowed every nanosecond timestamp
    the history and verdicts use. Times outside 1970-2200 are treated as unknown.
    """
    if text is None:
        return None
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        return None
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return text if _EARLIEST <= stamp < _LATEST else None


def _timestamp(start: str | None, result: ParsedResult) -> str:
    if start:
        return start
    try:
        mtime = (Path(result.path) / "exit_code").stat().st_mtime
    except OSError:
        mtime = datetime.now(UTC).timestamp()
    return datetime.fromtimestamp(mtime, UTC).isoformat()


def result_validity(project: AnalysisProject, result: ParsedResult,
                    policy: ValidityPolicy) -> Validity:
    """One result's validity: the engine's checks on its dir and the project's own."""
    window = None
    if project.measured_window is not None and result.exit_code == 0:
        try:
            window = project.measured_window(result)
        except (TypeError, ValueError, AttributeError, KeyError):
            window = None
    checks = project.validity
    return judge_validity(result.path, result.exit_code, policy,
                          project_reasons=(lambda: checks(result)) if checks else None,
                          measured_window_s=window, min_window_s=project.min_window_s)


def analyse_run(project: AnalysisProject, result: ParsedResult,
                presets: Sequence[str] | None = None, config_text: str | None = None,
                policy: ValidityPolicy | None = None, *, cell: str | None = None
                ) -> RunAnalysis:
    """Compute labels, KPIs, validity, fingerprint and the LTS payload of one result.

    ``cell`` is the cell's name from discovery (`ResultDir.cell`): what outputs call it.
    """
    labels = label_strings(project.labels(result))
    kpis = compute_kpis(project.kpis, result, labels)  # its KPIs share this dict
    start, end = (_usable_time(t) for t in project.timestamps(result))
    run_uuid = project.run_uuid(result)
    if not isinstance(run_uuid, str):
        raise TypeError(f"the project's run uuid is {type(run_uuid).__name__}, not a string")
    parsed_presets = getattr(result, "presets", None)
    validity = result_validity(project, result, policy or ValidityPolicy())
    fingerprint = fingerprint_of(result.path)
    metadata = LtsMetadata(
        project=project.name, run_uuid=run_uuid, start=start, end=end,
        presets=list(presets) if presets is not None else parsed_presets,
        config=config_text if config_text is not None else getattr(result, "config_text", None),
        settings=redact(result.settings), exit_code=result.exit_code, status=_status(result),
        test_path=result.rel_path, validity=validity.status,
        validity_reasons=validity.reasons, fingerprint=fingerprint,
    )
    payload = LtsPayload(
        metadata=metadata, results=project.results_summary(result),
        kpis={k.name: LtsKpi.from_kpi(k) for k in kpis},
        problems=[f"{p.file}{f':{p.line}' if p.line else ''}: {p.message}"
                  for p in result.problems],
    )
    # model_construct: validation would copy the labels its KPIs share; every value is typed
    return RunAnalysis.model_construct(
        result=result, run_uuid=run_uuid, timestamp=_timestamp(start, result), labels=labels,
        kpis=kpis, payload=payload, identity=run_identity(result.settings, start),
        validity=validity, fingerprint=fingerprint, cell=cell)


def settings_for(project: AnalysisProject, results_dir: str | Path) -> AnalysisSettings:
    """The ``analysis`` block a run used, so a re-analysis gives the verdicts the run gave.

    The run's own ``config.yaml`` at the top of ``results_dir`` (a Telltale artifact dir)
    wins; otherwise the project's defaults (`AnalysisProject.analysis_defaults`). A missing,
    linked or invalid run config falls back to the defaults with a warning.
    """
    config = Path(results_dir) / "config.yaml"
    block: object = None
    if config.is_file() and not config.is_symlink():
        try:
            data, _ = load_yaml(config, untrusted=True)
            block = data.get("analysis") if isinstance(data, dict) else None
            if block is not None:
                return AnalysisSettings.model_validate(block)
        except (ConfigError, ValidationError) as exc:
            logger.warning("%s: its analysis block is unusable (%s); using the project's "
                           "defaults", config, str(exc).splitlines()[0])
    return AnalysisSettings.model_validate(project.analysis_defaults())


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
        since_runs=None, what_changed=[], suspects=[], mde_pct=None)


_Judged = tuple[Kpi, list[float], Any, dict[str, Any]]


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
            "what_changed": [], "suspects": []})
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


def runs_table(runs: Sequence[RunAnalysis]) -> pd.DataFrame:
    """One row per run: identity, timing, status and where it lives."""
    return pd.DataFrame([{
        "run_uuid": r.run_uuid, "start": r.payload.metadata.start,
        "end": r.payload.metadata.end, "status": r.payload.metadata.status,
        "exit_code": r.result.exit_code, "test_path": r.result.rel_path, "cell": r.name,
        "presets": ",".join(r.payload.metadata.presets or []),
        "problems": len(r.result.problems), **r.labels} for r in runs])


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


def _analyse_tree(results_dir: str | Path, hooks: AnalysisProject,
                  presets: Sequence[str] | None, config_text: str | None, *, force: bool,
                  trust_cache: bool, keep: Callable[[RunAnalysis], None] | None = None,
                  policy: ValidityPolicy | None = None,
                  ) -> tuple[Discovery, list[RunAnalysis], list[SkippedDir], tuple[int, int]]:
    """Discover, parse and analyse every result dir of a tree (nothing written but caches).

    ``keep`` is called with each analysed run as it arrives (before its bulky fields are
    dropped): post-processing spools the LTS payload to disk there.

    Returns the discovery (its root and skipped dirs: the result dirs it found are the runs
    now, ~2 KB a dir with their settings), the analysed runs, the skipped dirs and (failed
    runs, parse problems) counted over every parsed dir.

    Raises:
        ResultsError: No result dir, or no usable run.
    """
    found: Discovery = discover(results_dir, project=hooks.name)
    if not found.results:
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in found.skipped[:5])
        raise ResultsError(f"no result dir (settings.yaml + exit_code) under {results_dir}"
                           + (f" (skipped: {reasons})" if reasons else ""))
    total = len(found.results)
    counts = [0, 0]
    progress = StageProgress("parse", total)

    def analyse(index: int, result: ParsedResult) -> RunAnalysis | SkippedDir:
        progress.advance()
        counts[0] += result.exit_code != 0
        counts[1] += len(result.problems)
        try:
            run = analyse_run(hooks, result, presets, config_text, policy,
                              cell=found.results[index].cell)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # Result trees are untrusted: a badly typed field (numbers for strings, a
            # scalar for a mapping) is this run's problem, never the whole analysis's.
            return SkippedDir(path=result.path, reason=(
                f"labels/KPIs could not be computed: {type(exc).__name__}: {exc}")[:300])
        if keep is not None:
            keep(run)
        if index < total - KEEP_BULKY:
            run.result = _slimmed(run.result, hooks)
        return run

    analysed = parse_dirs(found.results, hooks.parser, project=hooks.name, force=force,
                          trust_cache=trust_cache, then=analyse, apart=hooks.bulky,
                          skip_before=total - KEEP_BULKY)
    progress.finish()
    runs = [a for a in analysed if isinstance(a, RunAnalysis)]
    skipped = [*found.skipped, *(a for a in analysed if isinstance(a, SkippedDir))]
    _refuse_shared_uuids(runs)
    if not runs:
        raise ResultsError(f"no usable run under {results_dir}: "
                           + "; ".join(f"{s.path}: {s.reason}" for s in skipped[:5]))
    lean = Discovery.model_construct(root=found.root, results=[], skipped=found.skipped)
    return lean, runs, skipped, (counts[0], counts[1])


def _refuse_shared_uuids(runs: Sequence[RunAnalysis]) -> None:
    """Two result dirs of one tree with one ``.uuid`` would store one run's rows twice.

    Raises:
        ResultsError: Naming the uuid and the dirs that share it.
    """
    seen: dict[str, str] = {}
    for run in runs:
        path = run.result.rel_path or run.result.path
        first = seen.setdefault(run.run_uuid, path)
        if first != path:
            raise ResultsError(f"result dirs {first} and {path} share the run uuid "
                               f"{run.run_uuid} (.uuid): give each run its own")


KEEP_BULKY = 40
"""Runs (the last in discovery order) that keep their bulky parsed fields for the report."""


def _slimmed(result: ParsedResult, hooks: AnalysisProject) -> ParsedResult:
    """``result`` without the project's bulky and analysis-only fields.

    Its KPIs and payload are computed: ~8 KB a fine_tuning run, 80 MB over 10 000 runs.
    The emptied fields share one default value per model field (read-only by convention):
    a fresh empty loss curve, timeline... per run was still ~3 KB.
    """
    model = type(result)
    drop = {name: _empty(model, name) for name in (*hooks.bulky, *hooks.analysis_only)
            if name in model.model_fields and not model.model_fields[name].is_required()}
    return result.model_copy(update={**drop, "settings": _shared_settings(result.settings)})


_SETTINGS: dict[str, dict[str, Any]] = {}


def _shared_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """One dict for equal settings (read-only by convention).

    The runs of a configuration repeat them, ~1.3 KB a run.
    """
    try:
        key = json.dumps(settings, sort_keys=True)
    except (TypeError, ValueError):  # a value JSON has no type for (a YAML date): not shared
        return settings
    if len(_SETTINGS) > 4096:  # bounded: a long-lived process (a Prefect worker) analyses
        _SETTINGS.clear()      # many trees
    return _SETTINGS.setdefault(key, settings)


@functools.cache
def _empty(model: type[ParsedResult], name: str) -> Any:
    """The default of ``model.name``, made once (shared by every slimmed result)."""
    return model.model_fields[name].get_default(call_default_factory=True)


def suspects(results_dir: str | Path, project: str | AnalysisProject, history_uri: str,
             settings: AnalysisSettings, *,
             history_filesystem: Any = None) -> list[VerdictRow]:
    """The verdicts of a tree whose newest run alone looks like a regression (`Verdict.suspect`).

    What ``analysis.confirm_reruns`` re-runs before the run is post-processed for good;
    nothing is written but parse caches, and the history is not appended to.
    """
    hooks = load_project(project) if isinstance(project, str) else project
    _, runs, _, _ = _analyse_tree(results_dir, hooks, None, None, force=False,
                                  trust_cache=False, policy=settings.validity)
    store = HistoryStore(history_uri, filesystem=history_filesystem)
    return [row for row in judge_runs(runs, store, settings) if row.suspect]


def validity_of_tree(results_dir: str | Path, project: str | AnalysisProject,
                     settings: AnalysisSettings) -> dict[str, Validity]:
    """Each result dir's validity (by its path relative to ``results_dir``).

    What the flow reads after its cells to re-run the invalid ones
    (``analysis.invalid_reruns``); nothing is written but parse caches.
    """
    hooks = load_project(project) if isinstance(project, str) else project
    _, runs, _, _ = _analyse_tree(results_dir, hooks, None, None, force=False,
                                  trust_cache=False, policy=settings.validity)
    return {run.result.rel_path or run.run_uuid: run.validity for run in runs}


def _write_json_array(path: str, items: Iterable[bytes]) -> None:
    """Write a JSON array of already encoded items, never the whole text in memory."""
    with atomic_open(path) as stream:
        stream.write(b"[")
        for index, item in enumerate(items):
            if index:
                stream.write(b",")
            stream.write(redact_bytes(item))  # a sink: registered secrets masked
        stream.write(b"]")


def postprocess(
    results_dir: str | Path,
    project: str | AnalysisProject,
    out: str | Path,
    *,
    history_uri: str | None = None,
    settings: AnalysisSettings | None = None,
    presets: Sequence[str] | None = None,
    config_text: str | None = None,
    append_history: bool = True,
    force: bool = False,
    report: bool | None = None,
    history: HistorySource | None = None,
    trust_cache: bool = False,
    history_filesystem: Any = None,
    history_lock: AppendLock | None = None,
    shared_dir: str | Path | None = None,
) -> PostprocessOutcome:
    """Post-process a results tree and write every output into ``out``.

    Outputs: ``kpis.parquet`` (tidy table), ``kpis.prom`` (OpenMetrics), ``lts_payload.json``
    (a list: one payload per run), ``regression.json`` + ``regression_summary.yaml`` and
    ``report/index.html``.

    Args:
        results_dir: The tree to discover result dirs in.
        project: Project name (registered plugin) or its hooks.
        out: Output dir (created).
        history_uri: Parquet history (local dir or s3://); None: no history, no verdicts.
        settings: The project's ``analysis`` block (mode, comparison, regression policy).
        presets: Presets of this run, for the LTS metadata.
        config_text: The resolved config as YAML, for the LTS metadata.
        append_history: Append this run's KPI rows to the history after judging them.
        force: Re-parse, ignoring caches.
        report: Render the HTML report (default: ``settings.report``).
        history: Another history to judge against (e.g. OpenSearch); it wins over
            ``history_uri`` for verdicts, and is not appended to here.
        trust_cache: Use parse caches even when the files they came from are absent (a
            replot from exported caches only).
        history_filesystem: The ``pyarrow`` filesystem of an ``s3://`` history (the run's
            S3 block builds it with the export's endpoint and credentials: one S3 identity);
            default: one from the URI and the AWS environment.
        history_lock: The append lock of an ``s3://`` history (from the same S3 block;
            `analysis.history.AppendLock`); a local history locks itself.
        shared_dir: Where files every report carries are kept once (a runs root's
            ``.telltale/``): plotly.js is hard-linked from there into the report.

    Returns:
        The `PostprocessOutcome`.

    Raises:
        ResultsError: No result dir at all, an unusable history, or (cpt mode) an
            incomplete LTS payload.
    """
    hooks = load_project(project) if isinstance(project, str) else project
    settings = settings or settings_for(hooks, results_dir)
    out_dir = Path(out)
    with output_root(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        # Each run's LTS payload goes to a spool file as it is analysed and only its metadata
        # stays in memory (6 KB a run: 60 MB at 10 000 runs); lts_payload.json is written from
        # the spool once the verdicts are known.
        places: dict[int, tuple[int, int]] = {}  # id(run) -> (offset, length) in the spool
        # An anonymous file (no name a results tree could have planted a link under)
        with tempfile.TemporaryFile(dir=out_dir, prefix=".lts_payload.spool") as spool:
            def keep(run: RunAnalysis) -> None:
                require_complete(run.payload, settings.mode)
                data = run.payload.model_dump_json(exclude={"regression", "curve"}).encode()
                places[id(run)] = (spool.tell(), len(data))
                spool.write(data)
                # Every field given (model_construct computes a missing default through
                # inspect.signature: 0.75 ms a run) and one shared fields set: a copy's own
                # sets were ~1 KB a run.
                metadata = run.payload.metadata
                run.payload = LtsPayload.model_construct(
                    _fields_set=_PAYLOAD_FIELDS, **{
                        **run.payload.__dict__, "results": {}, "kpis": {}, "problems": [],
                        "metadata": LtsMetadata.model_construct(
                            _fields_set=_METADATA_FIELDS,
                            **{**metadata.__dict__, "settings": None, "config": None})})

            found, runs, skipped, (failed, problems) = _analyse_tree(
                results_dir, hooks, presets, config_text, force=force,
                trust_cache=trust_cache, keep=keep, policy=settings.validity)
            outcome = _write_outputs(
                out_dir, hooks, settings, found, runs, skipped, failed, problems,
                spool, places, history_uri=history_uri, history=history,
                history_filesystem=history_filesystem, history_lock=history_lock,
                shared_dir=Path(shared_dir) if shared_dir else None,
                append_history=append_history, report=report)
    return outcome


def _judge_curves(hooks: AnalysisProject, settings: AnalysisSettings, frame: pd.DataFrame,
                  history: pd.DataFrame | None, files: dict[str, str], out_dir: Path
                  ) -> list[CurveResult]:
    """The project's curves of this run against the history's (``curves.json``)."""
    if hooks.curve is None or not settings.regression.enabled:
        return []
    found = judge_curves(frame, history, hooks.curve,
                         ignored_labels=settings.comparison.ignored_labels,
                         settings=settings.regression.detector())
    if found:
        files["curves"] = str(out_dir / "curves.json")
        write_text(files["curves"], json.dumps(
            [c.model_dump(mode="json") for c in found], indent=1) + "\n")
    return found


def _write_outputs(out_dir: Path, hooks: AnalysisProject, settings: AnalysisSettings,
                   found: Discovery, runs: list[RunAnalysis], skipped: list[SkippedDir],
                   failed: int, problems: int, spool: Any, places: dict[int, tuple[int, int]],
                   *, history_uri: str | None, history: HistorySource | None,
                   append_history: bool, report: bool | None, history_filesystem: Any = None,
                   history_lock: AppendLock | None = None,
                   shared_dir: Path | None = None) -> PostprocessOutcome:
    """Judge the analysed runs and write every output of `postprocess`."""
    frame = kpi_table((r.run_uuid, r.timestamp, r.kpis) for r in runs)
    for column, per_run in ((IDENTITY, {r.run_uuid: r.identity for r in runs}),
                            (VALIDITY, {r.run_uuid: r.validity.status for r in runs}),
                            (FINGERPRINT, {r.run_uuid: encode(r.fingerprint) for r in runs}),
                            (CELL, {r.run_uuid: r.name for r in runs})):
        frame[column] = pd.array(frame["run_uuid"].map(per_run), dtype="string")
    # A workload that exited 0 and yielded no KPI measured nothing: never a green run.
    empty = [r for r in runs if r.result.exit_code == 0 and not r.kpis
             and not hooks.kpi_less]
    files: dict[str, str] = {}
    files["kpis"] = str(out_dir / "kpis.parquet")
    with atomic_open(files["kpis"]) as stream:
        frame.to_parquet(stream, index=False)
    files["openmetrics"] = str(out_dir / "kpis.prom")
    with atomic_open(files["openmetrics"], "w") as text:
        text.writelines(openmetrics_lines(k for r in runs for k in r.kpis))

    files["runs"] = str(out_dir / "runs.parquet")
    with atomic_open(files["runs"]) as stream:
        runs_table(runs).to_parquet(stream, index=False)

    store = HistoryStore(history_uri, filesystem=history_filesystem,
                         lock=history_lock) if history_uri else None
    source: HistorySource | None = history if history is not None else store
    verdicts = judge_runs(runs, source, settings) if settings.regression.enabled else []
    # the sweeps, each one curve against the earlier curves (read before this run's rows
    # are appended: its own curves are never their baseline), before the payloads: each
    # cell's payload carries its curve's verdict to OpenSearch and Horreum
    curves = _judge_curves(hooks, settings, frame, store.read() if store is not None and
                           hooks.curve is not None else None, files, out_dir)
    curve_of = {uuid: lts_curve(c, hooks.curve) for c in curves for uuid in c.run_uuids} \
        if hooks.curve is not None else {}
    # From here on the KPI table holds every value (the report reads it): the runs' own
    # KPI objects go, ~4 KB a run.
    for run in runs:
        run.kpis = []
    by_run: dict[str, list[VerdictRow]] = {}
    for row in verdicts:
        by_run.setdefault(row.run_uuid, []).append(row)
    counts = dict(Counter(v.verdict for v in verdicts))
    files["lts"] = str(out_dir / "lts_payload.json")

    def payloads() -> Iterable[bytes]:
        for run in runs:
            offset, length = places[id(run)]
            spool.seek(offset)
            data = spool.read(length)  # a JSON object without its "regression" key
            judged = {row.kpi: row.model_dump(include=_LTS_VERDICT) for row in
                      by_run.get(run.run_uuid, ())}
            curve = curve_of.get(run.run_uuid)
            # spliced in as the last keys, not parsed and encoded again (~0.2 ms a run)
            yield (data[:-1] + b',"regression":'
                   + json.dumps(judged or None, separators=(",", ":")).encode()
                   + b',"curve":' + (curve.model_dump_json().encode() if curve else b"null")
                   + b"}")

    # Compact JSON, one run at a time: an indent sends json through its pure-Python encoder
    # (2.6 s for 1 000 runs), and one dumps() of 10 000 payloads held ~600 MB at once.
    # These files are read by programs (OpenSearch export, replot), not people.
    _write_json_array(files["lts"], payloads())
    by_run.clear()  # not held through the report
    files["regression"] = str(out_dir / "regression.json")
    _write_json_array(files["regression"],
                      (VerdictRow.__pydantic_serializer__.to_json(v) for v in verdicts))
    files["regression_summary"] = str(out_dir / "regression_summary.yaml")
    write_text(files["regression_summary"], dump_yaml({
        "counts": {k: counts.get(k, 0) for k in VERDICT_KINDS},
        "runs": len(runs),
        "invalid_runs": sum(r.validity.status == "invalid" for r in runs),
    }))

    history_frame = None
    if store is not None:
        if append_history:
            store.append(frame)
        history_frame = store.read()
    outcome = PostprocessOutcome(
        out_dir=str(out_dir), runs=len(runs),
        failed_runs=failed,
        skipped=[s.model_dump() for s in skipped],
        problems=problems, kpi_rows=len(frame),
        verdicts=verdicts, verdict_counts=counts, history_uri=history_uri, files=files,
        curves=curves,
        validity={r.result.rel_path or r.run_uuid: r.validity for r in runs},
        gate_failures=_gate(verdicts, settings) + [
            f"curve {c.group_text()}: "
            f"{c.verdict.explanation}" for c in curves
            if c.verdict.kind == "regression" and settings.regression.fail_on_regression] + [
            f"run {r.result.rel_path or r.run_uuid} exited 0 but yielded no KPI: its "
            "result files are missing or empty" for r in empty[:10]] + (
            [f"no KPI at all from {len(runs)} run(s)"] if frame.empty and not empty
            and not hooks.kpi_less else []),
    )
    if settings.report if report is None else report:
        from analysis.report_index import render_report

        outcome.report = str(render_report(
            out_dir / "report", hooks, runs, frame, history_frame, verdicts, found,
            ignored_labels=settings.comparison.ignored_labels,
            compared_label=settings.comparison.compared_label,
            detector=settings.regression.detector(), history_uri=history_uri,
            target_mde_pct=settings.target_mde_pct, shared_dir=shared_dir, curves=curves))
        outcome.files["report"] = outcome.report
    return outcome
