"""Plan mode: what a run would do, written without touching a cluster (no Prefect import).

Besides ``config.yaml`` and ``plan.yaml``, a plan for the kubernetes platform writes every
manifest the run would apply: ``manifests/prepare/`` (OLM Subscriptions, OperatorGroups,
DataScienceCluster, ClusterPolicy... from the ``prepare`` block; the PR build's ImageStream
and BuildConfigs; the MachineSets it would create, their provider spec left to the worker
MachineSet cloned at run time) and ``manifests/<NNN>__cell/`` (the project's workload of
each runnable cell).

What a run applies is built here once, for the plan and the run alike: the project's
manifests shaped by `tasks.kube.placement` (each role's node selector and toleration,
Telltale's images pinned).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.safeio import make_dirs, output_root, write_text
from core.yamlio import dump_yaml
from projects.config import Config
from projects.contract import CellContext, KubeService, KubeUsers, KubeWorkload, Project
from projects.library import EngineConfig, TestBlock
from projects.matrix import Cell
from projects.plan import Plan, build_plan, write_plan
from tasks.kube.images import build_manifests, git_url_of, tag_of
from tasks.kube.machinesets import machineset_manifest
from tasks.kube.olm import prepare_manifests
from tasks.kube.placement import (
    IMAGE_PREFIX,
    Role,
    machineset_of,
    placements,
    pod_demand,
    shape_all,
)
from tasks.kube.users import user_job_manifests
from tasks.platforms.base import RunContext

__all__ = ["check_supported", "plan_images", "plan_run", "prepare_cluster_manifests",
           "role_demand", "shape_service", "shape_workload", "users_job", "users_manifests",
           "users_of", "users_prefix", "users_s3_endpoint", "workload_of", "write_manifests"]

REGISTRY = "image-registry.openshift-image-registry.svc:5000"
"""OpenShift's internal registry, where a build's ImageStreamTag is pulled from."""


def write_manifests(directory: Path, manifests: Sequence[dict[str, Any]]) -> int:
    """Write ``<NN>-<kind>-<name>.yaml`` files; returns how many."""
    make_dirs(directory)
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


def _shaped(run: RunContext, role: Role,
            manifests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return shape_all(manifests, placements(run.model.clusters)[role], run.images)


def shape_workload(run: RunContext, workload: KubeWorkload) -> KubeWorkload:
    """A cell's workload as applied, Telltale's images pinned.

    Its objects run on the sutest's nodes, the load (``after``) on the driver's.
    """
    staging = workload.staging
    if staging is not None:
        staging = dataclasses.replace(staging, job=_shaped(run, "sutest", [staging.job])[0])
    return dataclasses.replace(
        workload, shared=_shaped(run, "sutest", workload.shared),
        manifests=_shaped(run, "sutest", workload.manifests),
        after=_shaped(run, "driver", workload.after), staging=staging)


def shape_service(run: RunContext, service: KubeService) -> KubeService:
    """A fan-out's shared service as applied (on the sutest's nodes)."""
    return dataclasses.replace(service, shared=_shaped(run, "sutest", service.shared),
                               manifests=_shaped(run, "sutest", service.manifests))


def workload_of(run: RunContext, context: CellContext) -> KubeWorkload:
    """The project's `KubeWorkload` of a cell, shaped (`shape_workload`)."""
    if run.project.kubernetes is None:
        raise ConfigError(f"project {run.project.name!r} has no cluster workload",
                          key="clusters.platform")
    return shape_workload(run, run.project.kubernetes(context))


def users_job(run: RunContext, users: KubeUsers) -> list[dict[str, Any]]:
    """The ConfigMap and Indexed Job of a cluster fan-out's users (shaped for their role)."""
    return _shaped(run, users.role, _users_job(run, users))


def _users_job(run: RunContext, users: KubeUsers) -> list[dict[str, Any]]:
    multi_user = run.test.multi_user
    return user_job_manifests(
        users.name, run.test.namespace, users=multi_user.user_count, image=users.image,
        config=dict(users.config), command=list(multi_user.command or users.command),
        batch_size=multi_user.batch_size, sleep_factor=multi_user.sleep_factor,
        deadline_s=run.test.timeout_minutes * 60, s3_endpoint=users_s3_endpoint(run),
        bucket=multi_user.s3_bucket, prefix=users_prefix(run, users.name), gpus=users.gpus,
        env=users.env, files=users.files, init_containers=users.init_containers,
        volumes=users.volumes, mounts=users.mounts,
        # the PR's user program, by digest, when the run built Telltale's user-pod image
        program_image=f"{IMAGE_PREFIX}user-pod" if "user-pod" in run.images else None)


def users_manifests(run: RunContext, cell: Cell, context: CellContext) -> list[dict[str, Any]]:
    """Everything a cell's cluster fan-out applies, in order.

    The service its users share (when the project has one), then their ConfigMap and Job.
    """
    users = users_of(run, context)
    service = shape_service(run, users.service) if users.service is not None else None
    before = [*service.shared, *service.manifests] if service is not None else []
    return [*before, *users_job(run, users)]


def role_demand(run: RunContext, context: CellContext) -> dict[str, list[
        tuple[int, dict[str, float]]]]:
    """Role → the pods a cell starts there, ``(count, requests per pod)`` (replicas auto)."""
    demand: dict[str, list[tuple[int, dict[str, float]]]] = {"sutest": [], "driver": []}
    if run.test.multi_user.enabled:
        users = users_of(run, context)
        if users.service is not None:
            demand["sutest"] += pod_demand(users.service.manifests)
        demand[users.role] += pod_demand(_users_job(run, users))
        return demand
    assert run.project.kubernetes is not None  # `check_supported`
    workload = run.project.kubernetes(context)
    demand["sutest"] += pod_demand(workload.manifests)
    demand["driver"] += pod_demand(workload.after)
    return demand


def plan_images(run: RunContext) -> dict[str, str]:
    """The images a PR build would make, by tag (a plan has no digest)."""
    block = run.model.clusters.image_build
    if block.pr is None:
        return {}
    return {target: f"{REGISTRY}/{run.test.namespace}/{block.stream}:"
                    f"{tag_of(block, target, run.run_id)}" for target in block.targets}


def prepare_cluster_manifests(run: RunContext) -> list[dict[str, Any]]:
    """What ``prepare`` applies: operators (OLM), the PR build, the MachineSets it creates.

    A MachineSet is written as it would be created (cloned: the plan cannot see the worker
    MachineSet, so its provider spec holds only the instance type); one that exists is
    scaled instead, which the plan cannot know either.
    """
    model: EngineConfig = run.model
    manifests = list(prepare_manifests(model.prepare))
    block = model.clusters.image_build
    if block.pr is not None:
        from tasks.kube.images import CONTAINERFILE

        manifests += build_manifests(block, run.test.namespace, run_id=run.run_id,
                                     git_url=git_url_of(block),
                                     containerfile=CONTAINERFILE.read_text("utf-8"))
    for role in ("sutest", "driver"):
        machineset = machineset_of(model.clusters, role)  # type: ignore[arg-type]
        if machineset.enabled:
            replicas = machineset.replicas if isinstance(machineset.replicas, int) else 1
            manifests.append(machineset_manifest(machineset, role, replicas))  # type: ignore[arg-type]
    return manifests


def check_supported(project: Project, test: TestBlock, platform: str,
                    model: EngineConfig | None = None) -> None:
    """Refuse, before anything runs or is planned, a setting the platform cannot honour.

    One check for every project: a setting is never ignored silently (a fan-out planned as
    single-user cells, a cluster run of a local-only project). A refusal is a user error
    (exit 2) that names the key.

    Raises:
        ConfigError: The project has no workload (or no fan-out) for this platform.
    """
    if platform == "kubernetes":
        if model is not None and model.clusters.driver.kubeconfig:
            raise ConfigError("a separate driver cluster is not supported yet: the load "
                              "clients reach the served model at its in-cluster address; "
                              "give the driver nodes of its own on the test cluster with "
                              "clusters.driver.compute.machineset instead",
                              key="clusters.driver.kubeconfig")
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
    elif platform == "local" and model is not None:
        asked = [key for key, on in (
            ("clusters.sutest.compute.machineset.enabled",
             model.clusters.sutest.compute.machineset.enabled),
            ("clusters.driver.compute.machineset.enabled",
             model.clusters.driver.compute.machineset.enabled),
            ("clusters.image_build.pr", model.clusters.image_build.pr is not None)) if on]
        if asked:
            raise ConfigError(f"{asked[0]} needs a cluster (the local platform has no "
                              "MachineSets and builds no images): run with --platform "
                              "kubernetes, or unset it", key=asked[0])


def plan_run(project: Project, config: Config, platform: str, artifact_dir: Path) -> Plan:
    """Resolve the plan of a run and write it (config, plan, manifests) into ``artifact_dir``.

    Every file goes under ``artifact_dir`` as its output root: a link planted below it (a
    ``manifests -> /elsewhere``) is refused, never written through.

    Returns:
        The plan; ``extra["manifests"]`` counts the manifests written (kubernetes only).
    """
    check_supported(project, project.test_block(config.model), platform, config.model)
    plan = build_plan(config, platform, test=project.name)
    with output_root(artifact_dir):
        write_plan(plan, config, artifact_dir)
        if platform == "kubernetes":
            plan.extra["manifests"] = _write_plan_manifests(project, config, plan, artifact_dir)
    return plan


def _write_plan_manifests(project: Project, config: Config, plan: Plan,
                          artifact_dir: Path) -> int:
    """Write every manifest the run would apply; returns how many."""
    model = config.model
    run = RunContext(project=project, config=config, model=model,
                     test=project.test_block(model), root=artifact_dir, run_id="plan")
    run.images.update(plan_images(run))
    written = write_manifests(artifact_dir / "manifests" / "prepare",
                              prepare_cluster_manifests(run))
    for cell in plan.runnable:
        target = artifact_dir / "manifests" / f"{cell.index:03d}__cell"
        context = run.cell_context(cell, target)
        if run.test.multi_user.enabled:  # a fan-out (`check_supported`: the project has one)
            written += write_manifests(target, users_manifests(run, cell, context))
        else:
            written += write_manifests(target, workload_of(run, context).all_manifests())
    return written
