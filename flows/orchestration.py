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

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.safeio import write_text
from core.timeline import forget, mark, take
from flows.cli import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    default_artifact_dir,
    exit_code_for,
    is_terminated,
    runs_root,
)
from flows.cli_runner import run_from_cli
from flows.crash_hook import _leftover, cleanup_hook
from flows.events import emit_run_events
from flows.log_bridge import (
    _deployment_id,
    _flow_run_id,
    _log,
    logger,
    send_telltale_logs_to_prefect,
)
from flows.outcome import CellOutcome, RunFailed, RunOutcome, finish, outcome_of, written
from flows.phases import (
    _postprocess_phase,
    _provision,
    _still_invalid,
    confirm_phase,
    test_phase,
    validity_phase,
)
from projects import registry
from projects.config import resolve_once, use_config
from projects.untrusted import check_untrusted, policy_for
from tasks.artifacts import use_artifact_dir
from tasks.kube.api import owned_clients
from tasks.lab import provision
from tasks.platforms.base import Platform, RunContext
from tasks.platforms.plan import plan_run
from tasks.platforms.select import make_platform, select_platform
from tasks.runner import run_and_catch

# the API a project's flow and the command line use (each defined in its own module)
__all__ = ["CellOutcome", "RunFailed", "RunOutcome", "cleanup_hook", "finish", "orchestrate",
           "outcome_of", "run_from_cli"]
PlatformFactory = Callable[[str], Platform]


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
    mark("plan")
    try:
        return _orchestrate(project_name, presets, overrides, platform, artifact_dir,
                            platform_factory)
    except BaseException:
        # a run that ended before its outcome was written (a config error, say) leaves its
        # moments behind: forgotten, or the next run in this process (a served deployment)
        # would start its timeline at this one's "plan"
        forget()
        raise


def _orchestrate(project_name: str, presets: Sequence[str], overrides: dict[str, Any] | None,
                 platform: str, artifact_dir: str | None,
                 platform_factory: PlatformFactory) -> RunOutcome:
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
    # the run owns its Kubernetes clients (one per kubeconfig): closed when it ends
    with use_artifact_dir(root_path) as root, use_config(config), owned_clients():
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
                mark("prepare")
                run = _provision(run, creates)
                target = platform_factory("kubernetes") if creates else target
                target.prepare(run, plan.runnable)
                with target.lock(run):
                    test_phase(plan.cells, run, target, outcome.cells)
                    mark("validity")
                    validity_phase(plan.cells, run, target, outcome.cells)
                    mark("confirm re-runs")
                    confirm_phase(plan.cells, run, target, outcome.cells)
                mark("post-processing")
                _postprocess_phase(outcome, run)
            finally:
                mark("cleanup")
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


def _write_outcome(root: Path, outcome: RunOutcome) -> None:
    outcome.timeline = take()
    written(outcome)
    try:
        write_text(root / "outcome.json", outcome.model_dump_json(indent=2))
    except OSError as exc:  # a full disk must not hide the run's real outcome
        logger.error("could not write %s/outcome.json: %s", root, exc)
