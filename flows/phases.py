"""The phases of a run after its plan: test, validity, confirmation, post-processing, export.

- **test**: each cell of the matrix on the platform (resumed cells skipped by settings hash);
- **validity**: an invalid cell re-run up to ``analysis.invalid_reruns`` times;
- **confirm**: a suspect KPI's cell re-run at once, judged with its repeats;
- **post-processing**: parse, KPIs, history, verdicts, report (`tasks.postprocess`);
- **export**: S3, OpenSearch, Horreum, Prefect artifacts; partial results marked.

`flows.orchestration.orchestrate` runs them in order, with the lease and cleanup around.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analysis.curve import CurveResult
from analysis.fingerprint import FINGERPRINT_FILE
from analysis.history import default_history_uri
from analysis.pipeline import PostprocessOutcome
from blocks.s3 import S3Target
from core.environment import env_settings
from core.safeio import UnreadableInputError, read_text_bounded, write_text
from core.timeline import mark
from core.yamlio import dump_yaml
from flows.cli import (
    is_terminated,
)
from flows.log_bridge import _log
from flows.outcome import CellOutcome, RunOutcome
from projects.library.runs import REPEAT_FILE
from projects.matrix import Cell, settings_hash
from tasks.artifacts import next_artifact_dir
from tasks.hostwatch import watch_host
from tasks.lab import provision
from tasks.platforms.base import CellResult, Platform, RunContext
from tasks.postprocess import cell_validity, find_suspects, postprocess_results
from tasks.progress import ProgressArtifact
from tasks.publish.export import (
    append_history,
    horreum_instance,
    opensearch_instance,
    publish_horreum,
    publish_opensearch,
    s3_target,
    upload_run,
)
from tasks.publish.prefect_artifacts import publish_results
from tasks.retry import RetryPolicy

CELL_FILE = "cell.json"


_CELL_FILE_MAX = 1024 * 1024


def finished_cells(root: Path) -> dict[str, Path]:
    """Cell dirs of an earlier run into the same artifact dir: settings hash → dir (passed).

    Earlier failed attempts are kept for reading but hidden from discovery (a ``skip`` file).
    """
    finished: dict[str, Path] = {}
    for meta_file in sorted(root.glob(f"*__cell/{CELL_FILE}")):
        cell_dir = meta_file.parent
        try:
            meta = json.loads(read_text_bounded(meta_file, _CELL_FILE_MAX, what="cell file"))
            code = int(read_text_bounded(cell_dir / "exit_code", 64, what="exit code").strip())
        except (OSError, ValueError, UnreadableInputError):
            code = None
            meta = {}
        if (cell_dir / "skip").exists():
            continue
        if code == 0:
            finished[meta.get("settings_hash", "")] = cell_dir
        else:
            write_text(cell_dir / "skip", "superseded by a re-run\n")
    return finished


def _users_result(results: Sequence[CellResult], need_all: bool) -> CellResult:
    """One cell result from the users': enough successes (all, or at least one)."""
    succeeded = sum(1 for r in results if r.exit_code == 0)
    need = len(results) if need_all else 1
    failed = next((r for r in results if r.exit_code != 0), None)
    return CellResult(exit_code=0 if results and succeeded >= need else 1,
                      reason=f"{succeeded}/{len(results)} users succeeded",
                      duration_s=max((r.duration_s for r in results), default=0.0),
                      log_tail=failed.log_tail if failed and succeeded < need else None)


def _run_cell(cell: Cell, run: RunContext, platform: Platform,
              repeat_of: str | None = None,
              results: list[CellOutcome] | None = None) -> CellOutcome:
    with next_artifact_dir("cell") as cell_dir:
        settings = {**cell.settings, "ci_engine": env_settings().ci_engine,
                    "run_id": run.run_id}
        write_text(cell_dir / "settings.yaml", dump_yaml(settings))
        write_text(cell_dir / ".uuid", f"{uuid.uuid4()}\n")
        if repeat_of:
            write_text(cell_dir / REPEAT_FILE, f"{repeat_of}\n")
        write_text(cell_dir / CELL_FILE, json.dumps({
            "name": cell.name, "index": cell.index, "project": run.project.name,
            "settings_hash": settings_hash(cell.settings)}) + "\n")
        _write_fingerprint(cell_dir, run, platform)
        start = datetime.now(UTC).isoformat()
        watch = watch_host(cell_dir) if getattr(platform, "watches_host", False) \
            else contextlib.nullcontext()
        try:
            with watch:
                platform.capture(run)
                if run.test.multi_user.enabled:
                    result = _users_result(platform.run_users(run, cell),
                                           run.test.multi_user.need_all_success)
                else:
                    result = platform.run_cell(run, cell)
        except Exception as exc:  # the cell failed; the matrix and post-processing go on
            result = CellResult(exit_code=1, reason=f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # Ctrl-C / SIGTERM: the cell is in the outcome anyway
            if results is not None:
                results.append(CellOutcome(
                    name=cell.name, status="interrupted", dir=str(cell_dir),
                    reason=f"{'terminated' if is_terminated(exc) else 'interrupted'} while "
                           "running; its files are kept in its dir"))
            raise
        write_text(cell_dir / "test_start_end.json", json.dumps({
            "start": start, "end": datetime.now(UTC).isoformat()}) + "\n")
        write_text(cell_dir / "exit_code", f"{result.exit_code}\n")
        passed = result.exit_code == 0
        _log().log(logging.INFO if passed else logging.ERROR, "cell %d/%s %s (exit %d)%s",
                   cell.index, cell.name, "passed" if passed else "failed", result.exit_code,
                   "" if passed else f": {result.reason}")
        return CellOutcome(name=cell.name, status="passed" if passed else "failed",
                           exit_code=result.exit_code, dir=str(cell_dir),
                           reason=None if passed else result.reason,
                           log_tail=None if passed else result.log_tail)


def _write_fingerprint(cell_dir: Path, run: RunContext, platform: Platform) -> None:
    """The engine's part of the cell's environment fingerprint (`analysis.fingerprint`)."""
    facts = getattr(platform, "facts", None) or {}
    data = {**run.fingerprint}
    for key, name in (("versions", "package"), ("data", "data")):
        found = facts.get(key) if isinstance(facts, dict) else None
        if isinstance(found, dict):
            data[name] = {str(k): str(v) for k, v in found.items() if v is not None}
    write_text(cell_dir / FINGERPRINT_FILE, json.dumps(data, indent=2, sort_keys=True) + "\n")


def test_phase(cells: Sequence[Cell], run: RunContext, platform: Platform,
               results: list[CellOutcome]) -> list[CellOutcome]:
    """Walk the matrix: skip_if, resume of passed cells, stop_on_error, progress artifact.

    Outcomes are appended to ``results`` as cells end, so an interrupted run still reports
    the cells it finished.
    """
    finished = finished_cells(run.root)
    progress = ProgressArtifact(f"{len(cells)} cell(s)")
    stop = False
    for done, cell in enumerate(cells, start=1):
        if cell.skip_reason:
            results.append(CellOutcome(name=cell.name, status="skipped", reason=cell.skip_reason))
        elif stop:
            results.append(CellOutcome(name=cell.name, status="not_run",
                                       reason="stop_on_error after an earlier failure"))
        elif settings_hash(cell.settings) in finished:
            previous = finished[settings_hash(cell.settings)]
            _log().info("cell %s already passed in %s: resumed", cell.name, previous.name)
            results.append(CellOutcome(name=cell.name, status="resumed", exit_code=0,
                                       dir=str(previous)))
        else:
            mark(f"cell {cell.name}")
            result = _run_cell(cell, run, platform, results=results)
            results.append(result)
            stop = result.status == "failed" and run.test.stop_on_error
        progress.update(100.0 * done / len(cells), f"{done}/{len(cells)} cell(s) done")
    return results


def _validities(run: RunContext) -> dict[Path, dict[str, Any]]:
    """Each result dir's validity (resolved dir → status, reasons); empty when unknown."""
    settings = run.model.analysis
    try:
        found = cell_validity(str(run.root), run.project.name, settings.model_dump())
    except Exception as exc:  # unknown validity is no reason to lose the run
        _log().warning("could not check the cells' validity: %s", exc)
        return {}
    return {(run.root / rel).resolve(): item for rel, item in found.items()}


def _mark(outcome: CellOutcome, found: dict[Path, dict[str, Any]]) -> bool:
    """Set a cell outcome's validity from ``found``; True when it is invalid."""
    if outcome.dir is None:
        return False
    item = found.get(Path(outcome.dir).resolve())
    if item is None:
        return False
    outcome.validity = item["status"]
    outcome.validity_reasons = list(item["reasons"])
    return outcome.validity == "invalid"


def validity_phase(cells: Sequence[Cell], run: RunContext, platform: Platform,
                   results: list[CellOutcome]) -> None:
    """Mark each ran cell valid or invalid; re-run the invalid ones (``invalid_reruns``).

    An invalid result is kept (stored marked invalid, shown, never judged); its re-run is a
    new result of the same cell, judged on its own when valid.
    """
    settings = run.model.analysis
    if settings.validity.mode == "off":
        return
    found = _validities(run)
    by_name = {c.name: c for c in cells}
    invalid = [c for c in list(results) if c.status in ("passed", "resumed") and _mark(c, found)]
    for outcome in invalid:
        cell = by_name.get(outcome.name)
        if cell is None:
            continue
        _log().warning("cell %s is not a valid measurement (%s)%s", cell.name,
                       "; ".join(outcome.validity_reasons),
                       f": re-running it (up to {settings.invalid_reruns} time(s))"
                       if settings.invalid_reruns else "")
        for attempt in range(1, settings.invalid_reruns + 1):
            rerun = _run_cell(cell, run, platform).model_copy(
                update={"name": f"{cell.name}~valid-rerun{attempt}"})
            results.append(rerun)
            if rerun.status != "passed" or not _mark(rerun, _validities(run)):
                break


def _still_invalid(cells: Sequence[CellOutcome]) -> list[str]:
    """Cells whose last result is invalid, with why (a valid re-run settles its cell)."""
    last: dict[str, CellOutcome] = {}
    for outcome in cells:
        if outcome.status in ("passed", "resumed") and outcome.validity is not None:
            last[outcome.name.split("~valid-rerun")[0]] = outcome
    return [f"cell {name}: {'; '.join(c.validity_reasons)}" for name, c in last.items()
            if c.validity == "invalid"]


def confirm_phase(cells: Sequence[Cell], run: RunContext, platform: Platform,
                  results: list[CellOutcome]) -> None:
    """Re-run the cells whose newest run alone looks like a regression (confirm by re-run).

    ``analysis.confirm_reruns`` times each; the re-runs name the run they repeat
    (``.repeat_of``), so post-processing judges them together: a real regression is
    confirmed the same night, a one-off is withdrawn. Needs the Parquet history.
    """
    settings = run.model.analysis
    if settings.confirm_reruns == 0 or not settings.regression.enabled:
        return
    passed = {Path(c.dir).resolve(): c for c in results if c.status == "passed" and c.dir
              and c.validity != "invalid"}
    if not passed:
        return
    history = settings.history_uri or default_history_uri(run.project.name)
    try:
        found = find_suspects(str(run.root), run.project.name, history,
                              settings.model_dump(), history_target(run, history))
    except Exception as exc:  # no confirmation is no reason to lose the run
        _log().warning("could not look for regressions to confirm: %s", exc)
        return
    by_name = {c.name: c for c in cells}
    budget = settings.confirm_budget
    for rel, (why, reruns) in found.items():
        original = passed.get((run.root / rel).resolve())
        cell = by_name.get(original.name) if original else None
        if original is None or cell is None:
            continue
        if budget <= 0:
            _log().warning("cell %s has a suspect (%s), not re-run: the run's %d "
                           "confirmation re-run(s) (analysis.confirm_budget) are spent",
                           cell.name, why, settings.confirm_budget)
            continue
        reruns = min(reruns, budget)
        budget -= reruns
        uuid_text = read_text_bounded(Path(original.dir) / ".uuid", 256, what="run uuid").strip()
        _log().warning("cell %s has a suspect (%s): re-running it %d time(s) to confirm "
                       "or dismiss it", cell.name, why, reruns)
        for attempt in range(1, reruns + 1):
            rerun = _run_cell(cell, run, platform, repeat_of=uuid_text)
            results.append(rerun.model_copy(update={"name": f"{cell.name}~rerun{attempt}"}))


FINDINGS = ("regression", "suspect", "noisier", "drift", "outlier", "improvement")
"""The verdicts the terminal and ``outcome.json`` list one line each, in this order."""


SHARED_DIR = ".telltale"
"""In a runs root: files every run's report carries, kept once (plotly.js, hard-linked)."""


def history_target(run: RunContext, history_uri: str) -> S3Target | None:
    """The S3 block an ``s3://`` history goes through, or None.

    The export's (``export_artifacts.s3`` endpoint and region, credentials from the secret
    dir), so reads, appends and uploads are one S3 identity; None for a local history or
    without an S3 export block (then the AWS environment, as for ``python -m analysis``).
    """
    export = run.model.export_artifacts
    if not history_uri.startswith("s3://") or not export.s3.bucket:
        return None
    return s3_target(export, run.model.secrets)


def _postprocess_phase(outcome: RunOutcome, run: RunContext) -> None:
    log = _log()
    if all(c.status == "skipped" for c in outcome.cells):
        log.warning("every cell was skipped: nothing to post-process")
        return
    settings = run.model.analysis
    history = settings.history_uri or default_history_uri(run.project.name)
    export = run.model.export_artifacts
    instance = None
    try:
        if settings.history_source == "opensearch":
            instance = opensearch_instance(export, run.model.secrets)
        post = postprocess_results(str(run.root), run.project.name, history,
                                   settings.model_dump(), list(run.config.presets_applied),
                                   run.config.to_yaml(), instance, export.opensearch.index,
                                   history_target(run, history),
                                   str(run.root.parent / SHARED_DIR))
    except Exception as exc:  # the KPIs were not stored: the run must not look green
        message = f"post-processing failed, KPIs not stored: {type(exc).__name__}: {exc}"
        log.error(message)
        outcome.failures.append(message)
        return
    outcome.report = post.report
    outcome.verdict_counts = post.verdict_counts
    outcome.history_note = history_note(
        [v.history_used for v in post.verdicts if v.verdict == "insufficient_history"],
        settings.regression.min_history)
    outcome.regressions = [
        f"{v.kpi} ({v.cell or v.test_path}): "
        + (f"{v.change_pct:+.1f} %" if v.change_pct is not None else "changed")
        + f" — {v.explanation}"
        for v in post.verdicts if v.verdict == "regression"]
    outcome.findings = [
        f"{v.verdict:<11} {v.kpi} ({v.cell or v.test_path}): {v.explanation}"
        for v in sorted(post.verdicts, key=lambda v: FINDINGS.index(v.verdict)
                        if v.verdict in FINDINGS else len(FINDINGS))
        if v.verdict in FINDINGS]
    # name each curve by the labels that tell this run's curves apart (all: a dozen)
    differ = sorted({k for c in post.curves for k in c.group
                     if len({d.group.get(k) for d in post.curves}) > 1})
    outcome.curves = [curve_line(c, differ) for c in post.curves]
    outcome.findings[:0] = [line for c, line in zip(post.curves, outcome.curves, strict=True)
                            if c.verdict.kind in ("regression", "improvement")]
    outcome.failures.extend(post.gate_failures)
    if post.report:
        index = Path(post.report).relative_to(run.root)
        write_text(run.root / "report.html",
                   f"<!DOCTYPE html><meta http-equiv='refresh' content='0; url={index}'>"
                   f"<a href='{index}'>report</a>\n")
    try:
        publish_results(run.project.flow_name, post,
                        [c.model_dump() for c in outcome.cells], run.root)
    except Exception as exc:  # artifacts are a convenience; the files are the record
        log.warning("could not publish Prefect artifacts: %s", exc)
    _export_phase(outcome, run, post)


def curve_line(curve: CurveResult, labels: Sequence[str] = ()) -> str:
    """``curve regression (prompt_tokens=128): regression at concurrency 8–16 …; knee at 4``.

    ``labels``: the ones to name the curve by (default: none, a run with one curve).
    """
    group = " ".join(f"{k}={curve.group.get(k)}" for k in labels) or "the sweep"
    knee = curve.kpis.get("knee_load")
    return (f"curve {curve.verdict.kind:<11} ({group}): {curve.verdict.explanation}"
            + (f"; knee at {knee:g}" if knee is not None else ""))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def history_note(waiting: Sequence[int], min_history: int) -> str | None:
    """When verdicts start, for KPIs judged ``insufficient_history`` with these histories.

    The configuration with the most earlier runs decides: a run is judged once it has
    ``min_history`` earlier comparable runs, i.e. from the ``min_history + 1``-th one.
    """
    if not waiting:
        return None
    more = max(1, min_history - max(waiting))
    return (f"verdicts start with the {_ordinal(min_history + 1)} comparable run: "
            f"{more} more run(s) of this configuration")


def _export_phase(outcome: RunOutcome, run: RunContext, post: PostprocessOutcome) -> None:
    """Upload to S3, append the S3 KPI history, publish to OpenSearch — each on its own.

    A failed upload or OpenSearch publication is reported (local files stay) and fails the
    run only with ``export_artifacts.fail_on_error``; a failed KPI history append always
    fails it: those KPIs were not stored.
    """
    export = run.model.export_artifacts
    if not export.enabled:
        return
    secrets = run.model.secrets
    valid = not any(c.status == "failed" for c in outcome.cells)

    def attempt(what: str, action: Callable[[], Any], fatal: bool = False) -> None:
        try:
            action()
        except Exception as exc:
            message = (f"{what} failed: {type(exc).__name__}: {exc} "
                       f"(local artifacts kept in {run.root})")
            _log().error(message)
            if fatal or export.fail_on_error:
                outcome.failures.append(message)

    if export.s3.bucket:
        def upload() -> None:
            target = s3_target(export, secrets)
            outcome.export_url = upload_run(str(run.root), target, run.project.flow_name,
                                            run.run_id, valid).url

        attempt("S3 export", upload)
        kpis = post.files.get("kpis")
        if valid and kpis:
            attempt("KPI history append to S3 (KPIs not stored)", lambda: append_history(
                s3_target(export, secrets), kpis, run.project.name), fatal=True)
    if export.opensearch.enabled:
        attempt("OpenSearch export", lambda: publish_opensearch(
            opensearch_instance(export, secrets), post.files["lts"], export.opensearch.index,
            export.opensearch.kpi_index, valid,
            RetryPolicy(**export.opensearch.retry.model_dump())))
    if export.horreum.enabled:
        attempt("Horreum export", lambda: publish_horreum(
            horreum_instance(export, secrets), post.files["lts"], export, valid))


def _provision(run: RunContext, creates: bool) -> RunContext:
    """Lease hosts and create the cluster when the config asks; returns the run's context."""
    clusters, secrets = run.model.clusters, run.model.secrets
    if clusters.sutest.lab.enabled:
        provision.lease_hosts(str(run.root), secrets, clusters.sutest.lab, run.run_id)
    if not creates:
        return run
    record = provision.create_cluster(str(run.root), clusters.create, secrets,
                                      run.run_id, run.kubeconfig)
    return dataclasses.replace(run, kubeconfig=record.kubeconfig)
