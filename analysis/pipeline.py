"""Post-processing of a results tree: discover → parse → KPIs → LTS → history → verdicts.

`postprocess` is what the ``python -m analysis`` CLI and the flows' post-process task call;
it writes its outputs into ``out`` and returns a `PostprocessOutcome` describing them.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, Field

from analysis.curve import CurveResult, judge_curves, lts_curve
from analysis.discovery import Discovery, SkippedDir
from analysis.fingerprint import encode
from analysis.history import (
    CELL,
    FINGERPRINT,
    IDENTITY,
    VALIDITY,
    AppendLock,
    HistorySource,
    HistoryStore,
)
from analysis.history_schema import write_parquet
from analysis.judging import VERDICT_KINDS, VerdictRow, _gate, judge_runs
from analysis.kpi import kpi_table, openmetrics_lines
from analysis.parsing import BESIDE_MAX_RUNS
from analysis.project import AnalysisProject, load_project
from analysis.run_analysis import Prepared, RunAnalysis, _analyse_tree, runs_table
from analysis.settings import AnalysisSettings, settings_for
from analysis.validity import Validity
from core.forked import Beside, at_once, beside
from core.redact import redact_bytes
from core.safeio import atomic_open, output_root, write_text
from core.yamlio import dump_yaml

__all__ = [
    "PostprocessOutcome",
    "RunAnalysis",
    "VerdictRow",
    "judge_runs",
    "postprocess",
    "runs_table",
    "suspects",
    "validity_of_tree",
]

logger = logging.getLogger("telltale.analysis")
_LTS_VERDICT = {"verdict", "baseline", "change_pct", "confidence", "history_used",
                "explanation", "validity", "what_changed", "suspects",
                "mde_pct"}  # what an LTS payload's regression block keeps of a verdict


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
    prepared: Callable[[], Prepared | None] | None = None,
    tree_read: Callable[[], None] | None = None,
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
        prepared: Gives ``results_dir``'s discovery for ``project`` when the caller made
            it, and the warm dirs it served ahead (the command line does both beside its
            imports: `analysis.run_analysis.serve_early`; they are taken in when they were
            analysed as this post-processing analyses, else served again); None from it,
            or no callable: discovered here. A callable, so no frame holds the discovery
            past the parse (~2 KB a dir).
        tree_read: Called once every file of ``results_dir`` has been read (the command
            line's memo checks the tree's stamps from then on, beside the outputs).

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
        # Each run's LTS payload goes to a spool file as it is analysed and leaves memory
        # (6 KB a run: 60 MB at 10 000 runs; the metadata it kept, 1.7 KB a run, went too:
        # the run carries the few fields the outputs read); lts_payload.json is written from
        # the spool once the verdicts are known.
        places: dict[int, tuple[int, int]] = {}  # id(run) -> (offset, length) in the spool
        # An anonymous file (no name a results tree could have planted a link under)
        with tempfile.TemporaryFile(dir=out_dir, prefix=".lts_payload.spool") as spool:
            found, runs, skipped, (failed, problems) = _analyse_tree(
                results_dir, hooks, presets, config_text, force=force,
                trust_cache=trust_cache, keep=_Spooled(spool, places, settings.mode),
                policy=settings.validity, prepared=prepared() if prepared else None)
            if tree_read is not None and len(runs) <= BESIDE_MAX_RUNS:
                tree_read()  # (a check beside: see BESIDE_MAX_RUNS)
            outcome = _write_outputs(
                out_dir, hooks, settings, found, runs, skipped, failed, problems,
                spool, places, history_uri=history_uri, history=history,
                history_filesystem=history_filesystem, history_lock=history_lock,
                shared_dir=Path(shared_dir) if shared_dir else None,
                append_history=append_history, report=report)
    return outcome


class _Spooled:
    """Each run's LTS payload in the spool (`Keep`): encoded where the run is analysed."""

    def __init__(self, spool: Any, places: dict[int, tuple[int, int]],
                 mode: Literal["investigate", "cpt"]) -> None:
        self.spool, self.places, self.mode = spool, places, mode

    def store(self, run: RunAnalysis, data: bytes) -> None:
        """Append ``data`` to the spool and note where it lies."""
        self.places[id(run)] = (self.spool.tell(), len(data))
        self.spool.write(data)


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
    frame = kpi_table(((r.run_uuid, r.timestamp, r.kpis) for r in runs), run_columns={
        IDENTITY: [r.identity for r in runs], VALIDITY: [r.validity.status for r in runs],
        FINGERPRINT: [encode(r.fingerprint) for r in runs], CELL: [r.name for r in runs]})
    # A workload that exited 0 and yielded no KPI measured nothing: never a green run.
    empty = [r for r in runs if r.result.exit_code == 0 and not r.kpis
             and not hooks.kpi_less]
    files = {"kpis": str(out_dir / "kpis.parquet"), "openmetrics": str(out_dir / "kpis.prom"),
             "runs": str(out_dir / "runs.parquet")}
    # the tables are written beside this process while it judges and writes the payloads
    # (`core.forked`); they are on disk before this returns or raises
    start = beside if len(runs) <= BESIDE_MAX_RUNS else at_once
    tables = start(_write_tables, files, frame, runs)
    report_job: Beside[str] | None = None
    try:
        store = HistoryStore(history_uri, filesystem=history_filesystem,
                             lock=history_lock) if history_uri else None
        source: HistorySource | None = history if history is not None else store
        verdicts = judge_runs(runs, source, settings) if settings.regression.enabled else []
        # the sweeps, each one curve against the earlier curves (read before this run's
        # rows are appended: its own curves are never their baseline), before the
        # payloads: each cell's payload carries its curve's verdict to OpenSearch and Horreum
        curves = _judge_curves(hooks, settings, frame, store.read() if store is not None
                               and hooks.curve is not None else None, files, out_dir)
        # From here on the KPI table holds every value (the report reads it): the runs'
        # own KPI objects go, ~4 KB a run (40 MB at 10 000: not held through the report,
        # nor copied into its child; the tables' child forked with them keeps its own)
        for run in runs:
            run.kpis = []
        drawing = settings.report if report is None else report
        appends = store is not None and append_history
        history_frame = store.read() if store is not None and not appends else None
        # the report is drawn beside the payloads' writing unless it must show the history
        # with this run appended (the append comes last: the outputs are written first)
        if drawing and not appends:
            report_job = _draw_report(out_dir, hooks, settings, runs, frame, history_frame,
                                      verdicts, found, history_uri, shared_dir, curves,
                                      start)
        with report_job or nullcontext():  # a failure below stops a report drawn beside
            curve_of = {uuid: lts_curve(c, hooks.curve) for c in curves for uuid in c.run_uuids} \
                if hooks.curve is not None else {}
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

            if appends:
                assert store is not None
                tables.result()  # this run's own outputs first, then the history's part
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
                gate_failures=_gate_failures(hooks, settings, runs, frame, verdicts, curves,
                                             empty))
    finally:
        try:
            tables.result()
        except BaseException:
            if report_job is not None:
                report_job.close()
            raise
    if drawing:
        report_job = report_job or _draw_report(
            out_dir, hooks, settings, runs, frame, history_frame, verdicts, found,
            history_uri, shared_dir, curves)
        with report_job:
            outcome.report = report_job.result()
        outcome.files["report"] = outcome.report
    return outcome


def _gate_failures(hooks: AnalysisProject, settings: AnalysisSettings,
                   runs: list[RunAnalysis], frame: pd.DataFrame, verdicts: list[VerdictRow],
                   curves: list[CurveResult], empty: list[RunAnalysis]) -> list[str]:
    """What fails the regression gate: the KPIs' and curves' regressions, runs with no KPI."""
    return _gate(verdicts, settings) + [
        f"curve {c.group_text()}: {c.verdict.explanation}" for c in curves
        if c.verdict.kind == "regression" and settings.regression.fail_on_regression] + [
        f"run {r.result.rel_path or r.run_uuid} exited 0 but yielded no KPI: its result "
        "files are missing or empty" for r in empty[:10]] + (
        [f"no KPI at all from {len(runs)} run(s)"] if frame.empty and not empty
        and not hooks.kpi_less else [])


def _write_tables(files: dict[str, str], frame: pd.DataFrame, runs: list[RunAnalysis]
                  ) -> None:
    """``kpis.parquet``, ``kpis.prom`` and ``runs.parquet``: what the runs measured."""
    with atomic_open(files["kpis"]) as stream:
        write_parquet(frame, stream)
    with atomic_open(files["openmetrics"], "w") as text:
        text.writelines(openmetrics_lines(k for r in runs for k in r.kpis))
    with atomic_open(files["runs"]) as stream:
        write_parquet(runs_table(runs), stream)


def _draw_report(out_dir: Path, hooks: AnalysisProject, settings: AnalysisSettings,
                 runs: list[RunAnalysis], frame: pd.DataFrame,
                 history_frame: pd.DataFrame | None, verdicts: list[VerdictRow],
                 found: Discovery, history_uri: str | None, shared_dir: Path | None,
                 curves: list[CurveResult], start: Callable[..., Beside[str]] = at_once
                 ) -> Beside[str]:
    """The HTML report, drawn by ``start`` (`core.forked`): its index page's path."""
    from analysis.report_index import render_report

    def draw() -> str:
        return str(render_report(
            out_dir / "report", hooks, runs, frame, history_frame, verdicts, found,
            ignored_labels=settings.comparison.ignored_labels,
            compared_label=settings.comparison.compared_label,
            detector=settings.regression.detector(), history_uri=history_uri,
            target_mde_pct=settings.target_mde_pct, shared_dir=shared_dir, curves=curves,
            split=len(runs) <= BESIDE_MAX_RUNS))

    return start(draw)
