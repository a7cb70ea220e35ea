"""Plan mode: what a run would do, written without touching a cluster (no Prefect import).

Besides ``config.yaml`` and ``plan.yaml``, a plan for the kubernetes platform writes every
manifest the run would apply: ``manifests/prepare/`` (OLM Subscriptions, OperatorGroups,
DataScienceCluster, ClusterPolicy... from the ``prepare`` block) and
``manifests/<NNN>__cell/`` (the project's workload of each runnable cell).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.errors import ConfigError
from analysis.safeio import write_text
from analysis.yamlio import dump_yaml
from projects.config import Config
from projects.contract import CellContext, KubeUsers, Project
from projects.library import TestBlock
from projects.matrix import Cell
from projects.plan import Plan, build_plan, write_plan
from tasks.kube.olm import prepare_manifests
from tasks.kube.users import user_job_manifests
from tasks.platforms.base import RunContext

__all__ = ["check_supported", "plan_run", "users_job", "users_manifests", "users_of",
           "users_prefix", "users_s3_endpoint", "write_manifests"]


def write_manifests(directory: Path, manifests: Sequence[dict[str, Any]]) -> int:
    """Write ``<NN>-<kind>-<name>.yaml`` files; returns how many."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, manifest in enumerate(manifests):
        name = f"{index:02d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}"
        write_text(directory / f"{name}.yaml", dump_yaml(manifest))
    return len(manifests)


def users_s3_endpoint(run: RunContext) -> str:
    """The S3 endpoint the user pods reach (given, or the in-cluster one prepare deploys)."""
    multi_user = run.test.multi_user
    return multi_user.s3_endpoint or f"http://telltale-s3.{run.test.namespace}.svc:9000"


def users_prefix(run: RunContext, job: str) -> str:
    """Where a fan-out's users upload their results in the bucket (``<run id>/<job>``)."""
    return f"{run.run_id}/{job}"


def users_of(run: RunContext, context: CellContext) -> KubeUsers:
    """The project's `KubeUsers` of a cell (its cluster fan-out)."""
    if run.project.kube_users is None:
        raise ConfigError(f"project {run.project.name!r} has no cluster fan-out",
                          key=f"{run.project.test_key}.multi_user.enabled")
    return run.project.kube_users(context)


def users_job(run: RunContext, users: KubeUsers) -> list[dict[str, Any]]:
    """The ConfigMap and Indexed Job of a cluster fan-out's users."""
    multi_user = run.test.multi_user
    return user_job_manifests(
        users.name, run.test.namespace, users=multi_user.user_count, image=users.image,
        config=dict(users.config), command=list(multi_user.command or users.command),
        batch_size=multi_user.batch_size, sleep_factor=multi_user.sleep_factor,
        deadline_s=run.test.timeout_minutes * 60, s3_endpoint=users_s3_endpoint(run),
        bucket=multi_user.s3_bucket, prefix=users_prefix(run, users.name), gpus=users.gpus,
        env=users.env, files=users.files, init_containers=users.init_containers,
        volumes=users.volumes, mounts=users.mounts)


def users_manifests(run: RunContext, cell: Cell, context: CellContext) -> list[dict[str, Any]]:
    """Everything a cell's cluster fan-out applies, in order.

    The service its users share (when the project has one), then their ConfigMap and Job.
    """
    users = users_of(run, context)
    service = users.service
    before = [*service.shared, *service.manifests] if service is not None else []
    return [*before, *users_job(run, users)]


def check_supported(project: Project, test: TestBlock, platform: str) -> None:
    """Refuse, before anything runs or is planned, a setting the platform cannot honour.

    One check for every project: a setting is never ignored silently (a fan-out planned as
    single-user cells, a cluster run of a local-only project). A refusal is a user error
    (exit 2) that names the key.

    Raises:
        ConfigError: The project has no workload (or no fan-out) for this platform.
    """
    if platform == "kubernetes":
        if project.kubernetes is None:
            raise ConfigError(f"project {project.name!r} has no cluster workload: run it on "
                              "the local platform", key="clusters.platform")
        if test.multi_user.enabled and project.kube_users is None:
            raise ConfigError(
                f"project {project.name!r} has no cluster fan-out: "
                f"{project.test_key}.multi_user.enabled (user_count "
                f"{test.multi_user.user_count}) is not supported on kubernetes; run the "
                "fan-out on the local platform or set it to false",
                key=f"{project.test_key}.multi_user.enabled")
    elif platform == "local" and project.local is None:
        raise ConfigError(f"project {project.name!r} has no local workload: run it on a "
                          "cluster (--platform kubernetes)", key="clusters.platform")


def plan_run(project: Project, config: Config, platform: str, artifact_dir: Path) -> Plan:
    """Resolve the plan of a run and write it (config, plan, manifests) into ``artifact_dir``.

    Returns:
        The plan; ``extra["manifests"]`` counts the manifests written (kubernetes only).
    """
    check_supported(project, project.test_block(config.model), platform)
    plan = build_plan(config, platform, test=project.name)
    write_plan(plan, config, artifact_dir)
    if platform != "kubernetes":
        return plan
    model = config.model
    run = RunContext(project=project, config=config, model=model,
                     test=project.test_block(model), root=artifact_dir, run_id="plan")
    written = write_manifests(artifact_dir / "manifests" / "prepare",
                              prepare_manifests(model.prepare))
    for cell in plan.runnable:
        target = artifact_dir / "manifests" / f"{cell.index:03d}__cell"
        context = run.cell_context(cell, target)
        if run.test.multi_user.enabled:  # a fan-out (`check_supported`: the project has one)
            written += write_manifests(target, users_manifests(run, cell, context))
        else:
            assert project.kubernetes is not None  # `check_supported`
            written += write_manifests(target, project.kubernetes(context).all_manifests())
    plan.extra["manifests"] = written
    return plan
