"""The ``fine-tuning`` Prefect flow: prepare → test → post-process → cleanup.

One flow serves the CLI (``python -m flows.fine_tuning``), Prefect deployments (typed
parameters render as the UI form) and nightly schedules. The config is resolved once, saved
in the artifact dir, and frozen before any step runs. Cleanup runs in every outcome: a normal
end, a failed step, Ctrl-C (``finally``), a crash or a cancellation (flow hooks, driven by
the run's parameters since Prefect runs them in another process).

Exit code (``RunOutcome.exit_code``): 0 when every cell passed and post-processing did its
job; 1 when a cell failed, a regression gate tripped, or post-processing failed in strict
mode.

Note: no ``from __future__ import annotations`` here: ``flow.serve()`` validates parameters
from real annotations (DESIGN §12).
"""

import hashlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as runtime_flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from analysis.errors import ConfigError, TelltaleError
from analysis.history import default_history_uri
from analysis.pipeline import PostprocessOutcome
from analysis.yamlio import dump_yaml
from blocks.s3 import S3Target
from flows.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from projects.config import Config, resolve, use_config
from projects.matrix import Cell
from projects.plan import build_plan, write_plan
from projects.registry import project_dir
from projects.templates import from_config
from tasks import (
    k8s_workload,
    local_platform,
    local_users,
    prepare_cluster,
    provision,
    user_pods_steps,
)
from tasks.artifacts import next_artifact_dir, use_artifact_dir
from tasks.cluster_lock import cluster_lock
from tasks.export import opensearch_instance, publish_opensearch, s3_target, upload_run
from tasks.k8s import Kube, api_client
from tasks.platform import select_platform
from tasks.postprocess import postprocess_results
from tasks.publish import publish_results, start_progress, update_progress
from tasks.runner import run_and_catch

__all__ = ["RunOutcome", "fine_tuning", "run_from_cli"]

PROJECT = "fine_tuning"
FLOW_NAME = "fine-tuning"
CELL_FILE = "cell.json"

logger = logging.getLogger("telltale.flows.fine_tuning")


class CellOutcome(BaseModel):
    """What happened to one matrix cell."""

    name: str
    status: Literal["passed", "failed", "skipped", "resumed", "not_run"]
    exit_code: int | None = None
    dir: str | None = None
    reason: str | None = None


class RunOutcome(BaseModel):
    """The result of one fine-tuning run."""

    artifact_dir: str = Field(description="Where everything was written.")
    exit_code: int = Field(description="0 success, 1 failed cell/gate/strict post-process.")
    platform: str
    cells: list[CellOutcome] = Field(default_factory=list)
    report: str | None = Field(default=None, description="HTML report index.")
    verdict_counts: dict[str, int] = Field(default_factory=dict)
    export_url: str | None = Field(default=None, description="Where the run was exported.")
    failures: list[str] = Field(default_factory=list, description="Why the run failed.")


@dataclass(frozen=True)
class Target:
    """Where the cells run."""

    platform: str
    kubeconfig: str | None
    run_id: str


def _settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def _finished_cells(root: Path) -> dict[str, Path]:
    """Cell dirs of an earlier run into the same artifact dir: settings hash → dir (passed)."""
    finished: dict[str, Path] = {}
    for meta_file in sorted(root.glob(f"*__cell/{CELL_FILE}")):
        cell_dir = meta_file.parent
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            code = int((cell_dir / "exit_code").read_text().strip())
        except (OSError, ValueError):
            code = None
            meta = {}
        if (cell_dir / "skip").exists():
            continue
        if code == 0:
            finished[meta.get("settings_hash", "")] = cell_dir
        else:  # an earlier failed attempt: keep it for reading, hide it from discovery
            (cell_dir / "skip").write_text("superseded by a re-run\n", encoding="utf-8")
    return finished


def _default_artifact_dir() -> Path:
    run_id = str(runtime_flow_run.get_id() or uuid.uuid4())
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{PROJECT}-{run_id[:8]}"


def _run_cell(cell: Cell, config: Config, target: Target) -> CellOutcome:
    log = get_run_logger()
    with next_artifact_dir("cell") as cell_dir:
        settings = {**cell.settings, "ci_engine": os.environ.get("TELLTALE_CI_ENGINE",
                                                                 "prefect"),
                    "run_id": target.run_id}
        (cell_dir / "settings.yaml").write_text(dump_yaml(settings), encoding="utf-8")
        (cell_dir / ".uuid").write_text(f"{uuid.uuid4()}\n", encoding="utf-8")
        (cell_dir / CELL_FILE).write_text(json.dumps({
            "name": cell.name, "index": cell.index,
            "settings_hash": _settings_hash(cell.settings)}) + "\n", encoding="utf-8")
        start = datetime.now(UTC).isoformat()
        code, reason = 1, None
        try:
            if target.platform == "kubernetes":
                code, reason = _run_cell_kubernetes(cell, config, target)
                return _finish_cell(cell, cell_dir, start, code, reason)
            local_platform.capture_environment()
            multi_user = config.get("tests.fine_tuning.multi_user")
            if multi_user["enabled"]:
                users = local_users.run_fine_tuning_job(
                    config.get("tests.fine_tuning.test_settings.name"), cell.settings,
                    config.get("tests.fine_tuning.timeout_minutes"),
                    config.get("tests.fine_tuning.local_models"),
                    str(project_dir(PROJECT) / "data"), multi_user)
                return _finish_cell(cell, cell_dir, start, users.exit_code,
                                    users.finish_reason)
            args = from_config(local_platform.run_fine_tuning_job, suffix="local",
                               extra={"settings": cell.settings,
                                      "data_dir": str(project_dir(PROJECT) / "data")},
                               config=config)
            # Prefect's timeout backs up the subprocess deadline (which kills the trainer).
            job = local_platform.run_fine_tuning_job.with_options(
                timeout_seconds=args["timeout_minutes"] * 60 + 120)
            outcome = job(**args)
            code, reason = outcome.exit_code, outcome.finish_reason
        except Exception as exc:  # the cell failed; the matrix and post-processing go on
            reason = f"{type(exc).__name__}: {exc}"
            log.error("cell %s failed: %s", cell.name, reason)
        return _finish_cell(cell, cell_dir, start, code, reason)


def _run_cell_kubernetes(cell: Cell, config: Config,
                         target: Target) -> tuple[int, str | None]:
    """Capture the cluster, run the PyTorchJob; a failure is an exit code and a reason."""
    log = get_run_logger()
    block = config.get("tests.fine_tuning.kubernetes")
    try:
        k8s_workload.capture_environment(target.kubeconfig, block.get("prometheus_url"))
        k8s_workload.capture_state(target.kubeconfig)
        multi_user = config.get("tests.fine_tuning.multi_user")
        if multi_user["enabled"]:
            return _run_users_kubernetes(cell, config, target, multi_user)
        outcome = k8s_workload.run_fine_tuning_job(
            target.kubeconfig, target.run_id, config.get("tests.fine_tuning.namespace"),
            cell.settings, cell.index, block, config.get("tests.fine_tuning.timeout_minutes"))
        return outcome.exit_code, outcome.finish_reason
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        log.error("cell %s failed: %s", cell.name, reason)
        return 1, reason


def _run_users_kubernetes(cell: Cell, config: Config, target: Target,
                          multi_user: dict[str, Any]) -> tuple[int, str | None]:
    """Indexed Job of N users; collection mapped over batches (never one task per user)."""
    from prefect import unmapped

    namespace = config.get("tests.fine_tuning.namespace")
    if not multi_user.get("s3_endpoint"):
        if not multi_user.get("deploy_s3"):
            raise ConfigError("the cluster fan-out needs an S3 server reachable from the pods: "
                              "set s3_endpoint or deploy_s3",
                              key="tests.fine_tuning.multi_user.s3_endpoint")
        multi_user = {**multi_user, "s3_endpoint": f"http://telltale-s3.{namespace}.svc:9000"}
    users = int(multi_user["user_count"])
    launched = user_pods_steps.run_fine_tuning_job(
        target.kubeconfig, target.run_id, namespace, cell.settings, cell.index, multi_user,
        config.get("tests.fine_tuning.timeout_minutes"))
    status = user_pods_steps.follow(
        target.kubeconfig, namespace, launched["job"], users,
        config.get("tests.fine_tuning.timeout_minutes") * 60,
        bool(multi_user["abort_on_failure"]))
    s3 = S3Target(bucket=multi_user["s3_bucket"], endpoint_url=multi_user.get(
        "s3_external_endpoint") or multi_user["s3_endpoint"])
    size = int(multi_user["collect_batch"])
    batches = [list(range(i, min(i + size, users))) for i in range(0, users, size)]
    futures = user_pods_steps.collect_batch.map(batches, unmapped(launched["url"]),
                                                unmapped(launched["dir"]), unmapped(s3))
    collected = sum(len(f.result()) for f in futures)
    need = users if multi_user["need_all_success"] else 1
    reason = (f"{status.succeeded}/{users} users succeeded ({collected} collected)"
              + (", aborted after a failure" if status.aborted else ""))
    return (0 if status.succeeded >= need and not status.aborted else 1), reason


def _finish_cell(cell: Cell, cell_dir: Path, start: str, code: int,
                 reason: str | None) -> CellOutcome:
    (cell_dir / "test_start_end.json").write_text(json.dumps({
        "start": start, "end": datetime.now(UTC).isoformat()}) + "\n", encoding="utf-8")
    (cell_dir / "exit_code").write_text(f"{code}\n", encoding="utf-8")
    status: Literal["passed", "failed"] = "passed" if code == 0 else "failed"
    get_run_logger().info("cell %d/%s %s (exit %d)", cell.index, cell.name, status, code)
    return CellOutcome(name=cell.name, status=status, exit_code=code, dir=str(cell_dir),
                       reason=None if code == 0 else reason)


def _cleanup_hook(flow_obj: Any, flow_run: Any, state: Any) -> None:
    """Crash/cancellation hook: stop leftovers of this run (runs in another process)."""
    params = getattr(flow_run, "parameters", {}) or {}
    target = params.get("artifact_dir")
    roots = [Path(target)] if target else sorted(
        Path("runs").glob(f"*-{PROJECT}-{str(flow_run.id)[:8]}"))
    for root in roots:
        if root.is_dir():
            local_platform.cleanup_local(root)
            if (root / "cluster.json").is_file() or (root / "lease.json").is_file():
                try:  # destroy the cluster and release the lease from what the run left
                    config = resolve(PROJECT, presets=params.get("presets") or [],
                                     overrides=params.get("overrides") or {})
                    with use_artifact_dir(root):
                        provision.teardown.fn(str(root), bool(config.get("clusters.keep")),
                                              config.get("secrets"),
                                              config.get("clusters.kubeconfig"))
                except Exception as exc:  # a hook must not raise; say what is left
                    logger.error("crash cleanup of %s incomplete: %s", root, exc)


@flow(name=FLOW_NAME, log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=4),
      on_cancellation=[_cleanup_hook], on_crashed=[_cleanup_hook])
def fine_tuning(
    presets: list[str] = ["light"],  # noqa: B006 (Prefect needs a literal default for the UI)
    overrides: dict[str, Any] | None = None,
    platform: Literal["auto", "local", "kubernetes"] = "auto",
    artifact_dir: str | None = None,
) -> RunOutcome:
    """Fine-tune a model for each cell of the test matrix and judge the KPIs.

    Args:
        presets: Presets from ``ci_presets`` of projects/fine_tuning/config.yaml, in order.
        overrides: Dotted config key → value (strings are parsed as YAML).
        platform: auto (a kubeconfig selects kubernetes, else local), local or kubernetes.
        artifact_dir: Where to write artifacts (default: runs/<date>-fine_tuning-<run id>);
            reusing one resumes its finished cells.
    """
    log = get_run_logger()
    config = resolve(PROJECT, presets=presets, overrides=overrides or {})
    creates = bool(config.get("clusters.create.type"))
    chosen, kubeconfig = select_platform(
        platform if platform != "auto" else config.get("clusters.platform"),
        config.get("clusters.kubeconfig"), creates_cluster=creates)
    root = Path(artifact_dir) if artifact_dir else _default_artifact_dir()
    run_id = str(runtime_flow_run.get_id() or root.name)
    with use_artifact_dir(root) as root, use_config(config):
        plan = build_plan(config, chosen)
        write_plan(plan, config, root)
        config.freeze()
        log.info("artifacts in %s; %d cell(s) on %s", root, len(plan.cells), chosen)
        outcome = RunOutcome(artifact_dir=str(root), exit_code=EXIT_OK, platform=chosen)
        target = Target(platform=chosen, kubeconfig=kubeconfig, run_id=run_id)
        lab = config.get("clusters.sutest.lab")
        try:
            if lab["enabled"]:
                provision.lease_hosts(str(root), config.get("secrets"), lab, lab["poll_seconds"])
            if creates:
                record = provision.create_cluster(str(root), config.get("clusters.create"),
                                                  config.get("secrets"), run_id, kubeconfig)
                target = Target(platform="kubernetes", kubeconfig=record.kubeconfig,
                                run_id=run_id)
            _prepare_phase(plan.runnable, config, target)
            with _cluster_slot(target):
                outcome.cells = _test_phase(plan.cells, config, target, root)
            _postprocess_phase(outcome, config, root)
        finally:
            # Every cleanup step runs even when an earlier one fails; the first error wins.
            keep = bool(config.get("clusters.keep"))
            error: BaseException | None = None
            if config.get("clusters.cleanup_on_exit"):
                error = run_and_catch(error, local_platform.cleanup, str(root))
                if target.platform == "kubernetes":
                    error = run_and_catch(error, k8s_workload.cleanup_k8s, target.kubeconfig,
                                          run_id, keep)
                    if config.get("prepare.rhoai.uninstall") and not keep:
                        error = run_and_catch(error, prepare_cluster.uninstall_rhoai,
                                              target.kubeconfig)
            if lab["enabled"] or creates:  # destroy, then release: in every outcome
                error = run_and_catch(error, provision.teardown, str(root), keep,
                                      config.get("secrets"), kubeconfig)
            if error is not None and not sys.exc_info()[0]:
                raise error
        failed = [c for c in outcome.cells if c.status == "failed"]
        outcome.failures = [f"cell {c.name} failed: {c.reason}" for c in failed] + \
            outcome.failures
        if outcome.failures:
            outcome.exit_code = EXIT_FAILED
        (root / "outcome.json").write_text(outcome.model_dump_json(indent=2), encoding="utf-8")
    return outcome


@contextmanager
def _cluster_slot(target: Target) -> Iterator[None]:
    """One run per cluster at a time (a Prefect global concurrency limit)."""
    if target.platform != "kubernetes":
        yield
        return
    host = Kube(api_client(target.kubeconfig)).api.configuration.host
    with cluster_lock(host):
        yield


def _prepare_phase(cells: list[Cell], config: Config, target: Target) -> None:
    """Fail fast, before any cell runs, on what would fail every cell."""
    if target.platform == "kubernetes":
        kube = Kube(api_client(target.kubeconfig))
        if kube.get("v1", "Namespace", "default") is None:
            raise ConfigError("the cluster answers but has no 'default' namespace: is the "
                              "kubeconfig pointing at a Kubernetes API?")
        prepare = config.get("prepare")
        multi_user = config.get("tests.fine_tuning.multi_user")
        if multi_user["enabled"] and multi_user["deploy_s3"]:
            user_pods_steps.deploy_s3(target.kubeconfig,
                                      config.get("tests.fine_tuning.namespace"),
                                      multi_user["s3_bucket"])
        if not prepare["enabled"]:
            return
        # Independent stacks install concurrently; each is a no-op on a prepared cluster.
        futures = []
        if prepare["rhoai"]["enabled"]:
            futures.append(prepare_cluster.deploy_rhoai.submit(target.kubeconfig,
                                                               prepare["rhoai"]))
        if prepare["gpu_operator"]["enabled"]:
            futures.append(prepare_cluster.deploy_gpu_operator.submit(
                target.kubeconfig, prepare["gpu_operator"], prepare["nfd"]))
        for future in futures:
            future.result()  # raises the step's error
        return
    if cells:
        local_platform.prepare_local([c.settings for c in cells],
                                     config.get("tests.fine_tuning.local_models"),
                                     str(project_dir(PROJECT) / "data"))


def _test_phase(cells: list[Cell], config: Config, target: Target,
                root: Path) -> list[CellOutcome]:
    log = get_run_logger()
    finished = _finished_cells(root)
    progress = start_progress(f"{len(cells)} cell(s)")
    results: list[CellOutcome] = []
    stop = False
    for done, cell in enumerate(cells, start=1):
        if cell.skip_reason:
            results.append(CellOutcome(name=cell.name, status="skipped", reason=cell.skip_reason))
        elif stop:
            results.append(CellOutcome(name=cell.name, status="not_run",
                                       reason="stop_on_error after an earlier failure"))
        elif _settings_hash(cell.settings) in finished:
            previous = finished[_settings_hash(cell.settings)]
            log.info("cell %s already passed in %s: resumed", cell.name, previous.name)
            results.append(CellOutcome(name=cell.name, status="resumed", exit_code=0,
                                       dir=str(previous)))
        else:
            result = _run_cell(cell, config, target)
            results.append(result)
            stop = result.status == "failed" and bool(config.get(
                "tests.fine_tuning.stop_on_error"))
        update_progress(progress, done, len(cells))
    return results


def _postprocess_phase(outcome: RunOutcome, config: Config, root: Path) -> None:
    log = get_run_logger()
    settings = config.get("analysis")
    strict = settings.get("strict") or settings.get("mode") == "cpt"
    history = settings.get("history_uri") or default_history_uri(PROJECT)
    export = config.get("export_artifacts")
    instance = None
    try:
        if settings.get("history_source") == "opensearch":
            instance = opensearch_instance(export, config.get("secrets"))
        post = postprocess_results(str(root), PROJECT, history, settings,
                                   list(config.presets_applied), config.to_yaml(),
                                   instance, export["opensearch"]["index"])
    except Exception as exc:
        message = f"post-processing failed: {type(exc).__name__}: {exc}"
        log.error(message)
        if strict:
            outcome.failures.append(message)
        return
    outcome.report = post.report
    outcome.verdict_counts = post.verdict_counts
    outcome.failures.extend(post.gate_failures)
    if post.report:
        index = Path(post.report)
        (root / "report.html").write_text(
            "<!DOCTYPE html><meta http-equiv='refresh' content='0; url="
            f"{index.relative_to(root)}'><a href='{index.relative_to(root)}'>report</a>\n",
            encoding="utf-8")
    try:
        publish_results(FLOW_NAME, post, [c.model_dump() for c in outcome.cells], root)
    except Exception as exc:  # artifacts are a convenience; the files are the record
        log.warning("could not publish Prefect artifacts: %s", exc)
    _export_phase(outcome, config, root, post)


def _export_phase(outcome: RunOutcome, config: Config, root: Path,
                  post: PostprocessOutcome) -> None:
    """Upload to S3 and publish to OpenSearch; a failure is reported, local files stay."""
    log = get_run_logger()
    export = config.get("export_artifacts")
    if not export.get("enabled"):
        return
    secrets = config.get("secrets")
    valid = not any(c.status == "failed" for c in outcome.cells)
    run_id = str(runtime_flow_run.get_id() or root.name)
    try:
        if (export.get("s3") or {}).get("bucket"):
            result = upload_run(str(root), s3_target(export, secrets), FLOW_NAME, run_id,
                                valid, post.files.get("kpis"), PROJECT)
            outcome.export_url = result.url
        if (export.get("opensearch") or {}).get("enabled"):
            publish_opensearch(opensearch_instance(export, secrets), post.files["lts"],
                               export["opensearch"]["index"], export["opensearch"]["kpi_index"],
                               valid)
    except Exception as exc:
        message = f"export failed: {type(exc).__name__}: {exc} (local artifacts kept in {root})"
        log.error(message)
        if export.get("fail_on_error"):
            outcome.failures.append(message)


def run_from_cli(presets: list[str], overrides: dict[str, Any], platform: str,
                 artifact_dir: Path | None) -> int:
    """Run the flow for the command line and print where to look; returns the exit code."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    # Heartbeats let a server notice a crashed run; with the temporary server of a CLI run,
    # which dies with this process, they only cost ~1 s at flow exit (a thread join).
    updates = {} if PREFECT_API_URL.value() else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    try:
        with temporary_settings(updates=updates):
            outcome = fine_tuning(presets=presets, overrides=overrides, platform=platform,
                                  artifact_dir=str(artifact_dir) if artifact_dir else None)
    except TelltaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED
    print()
    print(f"artifacts : {outcome.artifact_dir}")
    for cell in outcome.cells:
        print(f"  cell {cell.name:<40} {cell.status}"
              + (f" (exit {cell.exit_code})" if cell.exit_code not in (None, 0) else ""))
    if outcome.verdict_counts:
        print("verdicts  : " + ", ".join(f"{k}={v}" for k, v in
                                         sorted(outcome.verdict_counts.items())))
    if outcome.report:
        print(f"report    : {outcome.report}")
    if outcome.export_url:
        print(f"exported  : {outcome.export_url}")
    for failure in outcome.failures:
        print(f"FAILED    : {failure}")
    return outcome.exit_code
