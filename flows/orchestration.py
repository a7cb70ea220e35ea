"""The one generic orchestration: every project's flow is a thin wrapper over `orchestrate`.

resolve config once → plan (config.yaml, plan.yaml, manifests) → freeze → lease / create a
cluster (optional) → prepare → cells under the platform's lock (resume, skip_if,
stop_on_error, multi-user fan-out; confirmation re-runs of suspected regressions) →
post-process (parse, KPIs, history, verdicts, report)
→ Prefect artifacts → export → cleanup and teardown in every outcome → ``outcome.json``.

The engine knows no project: it calls the project's contract (`projects.contract.Project`)
and the chosen `tasks.platforms.Platform`. Crash and cancellation hooks run in another
process; they read the run's saved ``config.yaml`` (never re-apply presets) to release what
the run left.

Exit code (``RunOutcome.exit_code``): 0 when every cell passed and post-processing did its
job; 1 when a cell failed, a regression gate tripped, or the KPIs were not stored
(post-processing failed, the history could not be appended); 3 (inconclusive) when nothing
failed but a cell's measurement stayed invalid after its re-runs (``analysis.invalid_reruns``)
under ``analysis.validity: enforce`` — never 1: an invalid measurement is not a regression;
``flows.cli.exit_code_for``
maps exceptions: 2 user error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, which the
CLI takes the Ctrl-C way: cleanup and lease release run).

Note: no ``from __future__ import annotations`` in flow modules: ``flow.serve()`` validates
parameters from real annotations (DESIGN §12).
"""

import contextlib
import dataclasses
import json
import logging
import subprocess
import sys
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
from core.errors import ConfigError, TelltaleError
from core.redact import RedactingFilter
from core.safeio import UnreadableInputError, read_text_bounded, write_text
from core.yamlio import dump_yaml, load_yaml
from flows.cli import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    default_artifact_dir,
    exit_code_for,
    is_terminated,
    runs_root,
    say,
)
from flows.events import emit_run_events
from flows.outcome import CellOutcome, RunOutcome, last_written, written
from projects import registry
from projects.config import resolve_once, use_config
from projects.library import ClustersBlock, SecretsBlock
from projects.library.runs import REPEAT_FILE
from projects.matrix import Cell, settings_hash
from projects.untrusted import check_untrusted, policy_for
from tasks.artifacts import next_artifact_dir, use_artifact_dir
from tasks.hostwatch import watch_host
from tasks.lab import provision
from tasks.platforms.base import CellResult, Platform, RunContext
from tasks.platforms.local import cleanup_local
from tasks.platforms.plan import plan_run
from tasks.platforms.select import make_platform, select_platform
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
from tasks.runner import run_and_catch

__all__ = ["CellOutcome", "RunFailed", "RunOutcome", "cleanup_hook", "finish", "history_note",
           "orchestrate", "outcome_of", "run_from_cli"]

CELL_FILE = "cell.json"
PlatformFactory = Callable[[str], Platform]

logger = logging.getLogger("telltale.flows")


def code_version() -> tuple[str, str | None]:
    """The directory of the Telltale code that runs, and its git commit (None outside git)."""
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=False,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return str(root), None
    commit = done.stdout.strip()
    return str(root), commit if done.returncode == 0 and len(commit) == 40 else None


class RunFailed(TelltaleError):
    """The run finished and failed (a cell, the regression gate, unstored KPIs).

    It is the data of the flow run's Failed state, so the Prefect UI, automations and
    deployments see a failed run; ``outcome`` carries everything the run recorded.
    """

    def __init__(self, outcome: RunOutcome) -> None:
        super().__init__("; ".join(outcome.failures[:3]) or "the run failed")
        self.outcome = outcome


def finish(outcome: RunOutcome) -> Any:
    """What a project's flow returns: the outcome, or a Failed state carrying it."""
    if outcome.exit_code == EXIT_OK:
        return outcome
    from prefect.states import Failed

    return Failed(message=str(RunFailed(outcome))[:1000], data=RunFailed(outcome))


def outcome_of(result: Any) -> RunOutcome:
    """The `RunOutcome` of a flow call made with ``return_state=True`` (or its value).

    Raises:
        BaseException: The run ended with another error (a user error before any cell
            ran, a crash): it is raised as it was.
    """
    if hasattr(result, "result") and hasattr(result, "type"):  # a Prefect State
        result = result.result(raise_on_failure=False)
    if isinstance(result, RunFailed):
        return result.outcome
    if isinstance(result, RunOutcome):
        return result
    if isinstance(result, BaseException):
        raise result
    raise TypeError(f"not a run outcome: {type(result).__name__}")


def _log() -> Any:
    """Prefect's run logger inside a run (it reaches the UI), else the module logger."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # outside a flow or task run
        return logger


class _InRunOnly(logging.Filter):
    """Pass only records made inside a Prefect flow or task run (others have no run to go to)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None


_UI_HANDLER: logging.Handler | None = None


def send_telltale_logs_to_prefect() -> None:
    """Send the ``telltale.*`` loggers' lines to the run's logs in the Prefect UI.

    Lines like "base finished: exit 0 ..." reached only the step logs and the terminal.
    Prefect sends only its own loggers to the API unless ``PREFECT_LOGGING_EXTRA_LOGGERS``
    names others before it sets logging up; attaching its `APILogHandler` here needs no
    environment variable on the worker. Idempotent; lines from outside a run are dropped
    by the filter instead of warning.
    """
    global _UI_HANDLER
    if _UI_HANDLER is not None:
        return
    from prefect.logging.handlers import APILogHandler

    handler = APILogHandler(level=logging.INFO)
    handler.addFilter(_InRunOnly())
    handler.addFilter(RedactingFilter())
    ours = logging.getLogger("telltale")
    if ours.level == logging.NOTSET:  # INFO lines are the point, whatever the root says
        ours.setLevel(logging.INFO)
    if not any(isinstance(h, APILogHandler) for h in ours.handlers):
        ours.addHandler(handler)
    _UI_HANDLER = handler


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else None


def _deployment_id() -> str | None:
    """The deployment of this run, None for a CLI run.

    Prefect's documented runtime field (``PREFECT__RUNTIME__DEPLOYMENT__ID`` sets it in tests).
    """
    from prefect.runtime import deployment

    return deployment.id or None


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
MAX_FINDINGS = 10


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


def orchestrate(project_name: str, presets: Sequence[str], overrides: dict[str, Any] | None,
                platform: str = "auto", artifact_dir: str | None = None, *,
                platform_factory: PlatformFactory = make_platform) -> RunOutcome:
    """Run one project end to end (call it from the project's flow).

    Args:
        project_name: A registered project (``fine_tuning``).
        presets: Presets from the project's ``ci_presets``, in order.
        overrides: Dotted config key → value (typed, as given; the CLI parses --var once).
        platform: auto (a kubeconfig selects kubernetes, else local), local or kubernetes.
        artifact_dir: Where to write artifacts; reusing one resumes its passed cells.
        platform_factory: Builds the platform from its name (tests pass a fake one).

    Returns:
        The `RunOutcome`, also written to ``<artifact_dir>/outcome.json``.

    Raises:
        TelltaleError: A user error before any cell ran (config, platform, prepare).
    """
    log = _log()
    if _flow_run_id() is not None:
        send_telltale_logs_to_prefect()
    project = registry.load(project_name)
    if _deployment_id() is not None:
        # A deployment's form is filled in by anyone who can start a run in the UI: its
        # overrides are held to the PR-comment policy (allow-listed, declared, bounded),
        # and its artifact dir must be a dir of the deployed runs root.
        policy = policy_for(project_name)
        for key, value in (overrides or {}).items():
            check_untrusted(key, value, policy, source="deployment form")
        if artifact_dir:  # resolved once, against the runs root: written where checked
            artifact_dir = str(_inside_runs_root(artifact_dir, runs_root(deployed=True)))
    # the command line resolved it already (same request): not a second time
    config = resolve_once(project_name, presets=presets, overrides=overrides or {})
    model = config.model
    clusters = model.clusters
    creates = clusters.create.type is not None
    chosen, kubeconfig = select_platform(
        platform if platform != "auto" else clusters.platform, clusters.kubeconfig,
        creates_cluster=creates)
    run_id = _flow_run_id()
    root_path = Path(artifact_dir) if artifact_dir else default_artifact_dir(
        project.name, runs_root(deployed=_deployment_id() is not None), run_id=run_id)
    with use_artifact_dir(root_path) as root, use_config(config):
        plan = plan_run(project, config, chosen, root)
        config.freeze()
        log.info("artifacts in %s; %d cell(s) on %s", root, len(plan.cells), chosen)
        code_dir, code_commit = code_version()
        outcome = RunOutcome(artifact_dir=str(root), exit_code=EXIT_OK, platform=chosen,
                             code_dir=code_dir, code_commit=code_commit)
        run = RunContext(project=project, config=config, model=model,
                         test=project.test_block(model), root=root,
                         run_id=run_id or root.name, kubeconfig=kubeconfig,
                         fingerprint={"telltale_commit": code_commit} if code_commit else {})
        target = platform_factory(chosen)
        try:
            try:
                run = _provision(run, creates)
                target = platform_factory("kubernetes") if creates else target
                target.prepare(run, plan.runnable)
                with target.lock(run):
                    test_phase(plan.cells, run, target, outcome.cells)
                    validity_phase(plan.cells, run, target, outcome.cells)
                    confirm_phase(plan.cells, run, target, outcome.cells)
                _postprocess_phase(outcome, run)
            finally:
                # Every cleanup step runs even when an earlier one fails; the first error wins.
                error: BaseException | None = None
                if clusters.cleanup_on_exit:
                    error = run_and_catch(error, target.cleanup, run)
                if clusters.sutest.lab.enabled or creates:  # destroy, then release
                    teardown_error = run_and_catch(None, provision.teardown, str(root),
                                                   clusters.keep, model.secrets, kubeconfig)
                    if teardown_error is not None:  # a lease or a cluster may be left
                        outcome.leftovers.append(_leftover(teardown_error, root, project.name))
                    error = error or teardown_error
                if error is not None and not sys.exc_info()[0]:
                    raise error
        except BaseException as exc:  # interrupted or failed: say so in outcome.json too
            outcome.exit_code = exit_code_for(exc)
            outcome.failures.append(
                f"{'terminated' if is_terminated(exc) else 'interrupted'}: cleanup ran"
                + (" but left something active (see leftovers)" if outcome.leftovers else "")
                + ", partial results kept" if isinstance(exc, KeyboardInterrupt)
                or is_terminated(exc) else f"{type(exc).__name__}: {exc}")
            _write_outcome(root, outcome)
            exc.telltale_outcome = outcome  # type: ignore[attr-defined]
            raise
        failed = [c for c in outcome.cells if c.status == "failed"]
        outcome.failures = [f"cell {c.name} failed: {c.reason}" for c in failed] + \
            outcome.failures
        outcome.inconclusive = _still_invalid(outcome.cells)
        if outcome.failures:
            outcome.exit_code = EXIT_FAILED
        elif outcome.inconclusive and model.analysis.validity.mode == "enforce":
            outcome.exit_code = EXIT_INCONCLUSIVE
        _write_outcome(root, outcome)
        emit_run_events(project.name, outcome, model.notify, run_id)
    return outcome


def _inside_runs_root(artifact_dir: str, root: Path) -> Path:
    """A deployment form's artifact dir, resolved against the deployed runs root.

    A relative dir is the runs root's (not the worker's working directory, which the worker
    removes after the run); an absolute one must lie inside it.

    Returns:
        The resolved dir, the one the run writes to.

    Raises:
        ConfigError: The dir resolves elsewhere (``/etc``, ``../..``, a link out).
    """
    base = root.resolve()
    wanted = (base / artifact_dir).resolve()
    if wanted == base or not wanted.is_relative_to(base):
        raise ConfigError(f"artifact_dir {artifact_dir!r} from a deployment form must be a "
                          f"dir inside {base} (TELLTALE_RUNS_DIR)", key="artifact_dir")
    return wanted


def _leftover(error: BaseException, root: Path, project: str) -> str:
    """One line: what may still be active after a failed teardown, and how to remove it."""
    text = str(error)
    command = f"python -m flows.cleanup --quads --project {project}"
    if "python -m flows.cleanup --quads" in text:
        return text.replace("python -m flows.cleanup --quads", command, 1)
    return f"{text}; it may still be active: remove it with `{command} --artifact-dir {root}`"


def _write_outcome(root: Path, outcome: RunOutcome) -> None:
    written(outcome)
    try:
        write_text(root / "outcome.json", outcome.model_dump_json(indent=2))
    except OSError as exc:  # a full disk must not hide the run's real outcome
        logger.error("could not write %s/outcome.json: %s", root, exc)


CRASH_CLEANUP_FILE = "crash_cleanup.json"


def cleanup_hook(project_name: str) -> Callable[..., None]:
    """A crash/cancellation hook for a project's flow (Prefect runs it in another process).

    Prefect calls hooks two ways: its flow engine positionally, ``hook(flow, flow_run,
    state)``; a worker's or ``serve()``'s runner by keyword, ``hook(flow=..., flow_run=...,
    state=...)`` (a deployed run that crashes or is cancelled). The parameters carry exactly
    those names so both work (`tests/flows/test_hooks.py` checks every flow's hooks both ways).

    It finds the run's artifact dir from the flow run's parameters (or the default name),
    stops local leftovers, and destroys the cluster / releases the lease the run recorded
    (``cluster.json``, ``lease.json``) with the run's *saved* ``config.yaml``. What it did
    (or could not do) is written to ``crash_cleanup.json`` in the run's dir.
    """

    def hook(flow: Any, flow_run: Any, state: Any) -> None:
        del flow  # part of Prefect's hook signature; the run is found by its id
        params = getattr(flow_run, "parameters", {}) or {}
        target = params.get("artifact_dir")
        deployed = getattr(flow_run, "deployment_id", None) is not None
        roots = [Path(target)] if target else sorted(
            runs_root(deployed=deployed).glob(f"*-{project_name}-{str(flow_run.id)[:8]}"))
        for root in roots:
            if not root.is_dir():
                continue
            record: dict[str, Any] = {"state": getattr(state, "name", str(state)),
                                      "at": datetime.now(UTC).isoformat(),
                                      "local": cleanup_local(root), "errors": []}
            if (root / "cluster.json").is_file() or (root / "lease.json").is_file():
                try:
                    # only the blocks the teardown needs: the rest of a saved config (its
                    # values masked at save) must not keep a lease from being released
                    saved, _ = load_yaml(root / "config.yaml")
                    clusters = ClustersBlock.model_validate(saved.get("clusters") or {})
                    secrets = SecretsBlock.model_validate(saved.get("secrets") or {})
                    with use_artifact_dir(root):
                        provision.teardown.fn(str(root), clusters.keep, secrets,
                                              clusters.kubeconfig)
                    record["teardown"] = "done"
                except Exception as exc:  # a hook must not raise; say what is left
                    logger.error("crash cleanup of %s incomplete: %s", root, exc)
                    record["errors"].append(_leftover(exc, root, project_name))
            try:
                write_text(root / CRASH_CLEANUP_FILE, json.dumps(record, indent=2, default=str))
            except OSError as exc:
                logger.error("could not write %s/%s: %s", root, CRASH_CLEANUP_FILE, exc)

    return hook


def _leftovers_of(exc: BaseException) -> list[str]:
    """What the interrupted or failed run left active.

    From its exception, or else from the outcome this process wrote: Prefect may re-raise a
    signal as an exception of its own, without the outcome we attached.
    """
    left = getattr(exc, "telltale_outcome", None) or last_written()
    return list(left.leftovers) if left is not None else []


def _say_leftovers(exc: BaseException) -> None:
    for line in _leftovers_of(exc):
        say(f"LEFT ACTIVE: {line}", error=True)


def run_from_cli(flow_fn: Callable[..., RunOutcome], presets: list[str],
                 overrides: dict[str, Any], platform: str, artifact_dir: Path | None) -> int:
    """Run a project's flow for the command line and print where to look; returns the code."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    from flows.api_server import prefect_api

    # Heartbeats let a server notice a crashed run; with the temporary server of a CLI run,
    # which dies with this process, they only cost ~1 s at flow exit (a thread join).
    updates = {} if PREFECT_API_URL.value() else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    try:
        with prefect_api(), temporary_settings(updates=updates):
            outcome = outcome_of(flow_fn(
                presets=presets, overrides=overrides, platform=platform,
                artifact_dir=str(artifact_dir) if artifact_dir else None, return_state=True))
    except TelltaleError as exc:
        say(f"error: {exc}", error=True)
        _say_leftovers(exc)
        return exit_code_for(exc)
    except OSError as exc:  # e.g. a full artifact disk: outcome.json was attempted already
        say(f"error: {exc.strerror or exc} ({exc.filename or artifact_dir or 'runs/'})",
            error=True)
        _say_leftovers(exc)
        return EXIT_FAILED
    except BaseException as exc:  # Ctrl-C, or SIGTERM (ours or Prefect's TerminationSignal)
        if not (isinstance(exc, KeyboardInterrupt) or is_terminated(exc)):
            raise
        left = _leftovers_of(exc)
        say(f"{'terminated' if is_terminated(exc) else 'interrupted'}: the run's cleanup ran"
            + (f" but left {len(left)} thing(s) active (below)" if left else "")
            + f"; partial results are kept ({artifact_dir or 'see runs/'})", error=True)
        _say_leftovers(exc)  # the last lines a scheduler shows
        return exit_code_for(exc)
    say("")
    say(f"artifacts : {outcome.artifact_dir}")
    for cell in outcome.cells:
        say(f"  cell {cell.name:<40} {cell.status}"
            + (f" (exit {cell.exit_code})" if cell.exit_code not in (None, 0) else "")
            + (f", {cell.validity}" if cell.validity in ("valid", "invalid") else "")
            + (f": {'; '.join(cell.validity_reasons)}" if cell.validity == "invalid" else ""))
    if outcome.verdict_counts:
        say("verdicts  : " + ", ".join(f"{k}={v}" for k, v in
                                       sorted(outcome.verdict_counts.items()))
            + (f" ({outcome.history_note})" if outcome.history_note else ""))
    for line in outcome.curves:
        if not any(line == f for f in outcome.findings):  # news is said with the findings
            say(f"  {line}")
    for line in outcome.findings[:MAX_FINDINGS]:
        say(f"  {line}")
    if len(outcome.findings) > MAX_FINDINGS:
        say(f"  ... {len(outcome.findings) - MAX_FINDINGS} more in the report")
    if outcome.report:
        say(f"report    : {outcome.report}")
    if outcome.export_url:
        say(f"exported  : {outcome.export_url}")
    for failure in outcome.failures:
        say(f"FAILED    : {failure}")
    for line in outcome.inconclusive:
        say(("INCONCLUSIVE: " if outcome.exit_code == EXIT_INCONCLUSIVE else "INVALID   : ")
            + line + (" (not judged)" if outcome.exit_code != EXIT_INCONCLUSIVE else ""))
    if outcome.inconclusive:
        say("what to do: an invalid measurement is never judged nor a baseline, so verdicts "
            "wait for valid runs — run on a quieter machine (the reasons above say what was "
            "busy); for a demo only, --var analysis.validity.mode=off judges without the "
            "checks")
    for cell in outcome.cells:
        if cell.log_tail:
            say(f"--- last lines of {cell.name}'s workload log ---\n{cell.log_tail}",
                keep_newlines=True)
    for line in outcome.leftovers:
        say(f"LEFT ACTIVE: {line}", error=True)
    return outcome.exit_code
