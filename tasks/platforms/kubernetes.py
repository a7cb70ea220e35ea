"""The Kubernetes/OpenShift platform, for every project.

- ``prepare``: the cluster answers; the fan-out's in-cluster S3 when asked; then,
  concurrently: operators through OLM (`tasks.kube.prepare`, independent stacks side by
  side), Telltale's image built from the PR under test, each role's MachineSet (nodes of
  their own, labelled and tainted; `tasks.kube.machinesets`);
- ``capture``: nodes, versions, operator CSVs, RHOAI state (`tasks.kube.workload`);
- ``run_cell``: the project's `KubeWorkload`, applied run-labelled and followed to its end;
- ``run_users``: the project's `KubeUsers` as one Indexed Job (barrier and stagger inside
  the pods), followed with a progress artifact, collected from S3 by tasks mapped over
  batches (never one task per user) into the local fan-out's layout;
- ``cleanup``: every object labelled with the run id (the builds with the ImageStreamTags
  they wrote, a cloned MachineSet), a scaled MachineSet scaled back (and RHOAI when asked);
- ``lock``: one run per cluster (a Prefect global concurrency limit).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from blocks.s3 import S3Target
from core.errors import ConfigError
from core.safeio import write_json, write_text
from projects.config import Config
from projects.contract import Project
from projects.matrix import Cell
from tasks.artifacts import artifact_dir, step
from tasks.kube import prepare as kube_prepare
from tasks.kube.api import Kube, api_client
from tasks.kube.lock import cluster_lock
from tasks.kube.placement import machineset_of
from tasks.kube.users import UsersJobStatus, collect_users, follow_users
from tasks.kube.workload import (
    capture_environment,
    capture_state,
    cleanup_k8s,
    run_kube_workload,
    start_service,
)
from tasks.observe.capture import capture_prometheus, cluster_prometheus, cluster_queries
from tasks.platforms.base import CellResult, RunContext, project_step, read_users, tail_lines
from tasks.platforms.plan import (
    role_demand,
    shape_service,
    users_job,
    users_of,
    users_prefix,
    users_s3_endpoint,
    workload_of,
)
from tasks.progress import ProgressArtifact

__all__ = ["KubernetesPlatform", "collect_batch", "follow"]

logger = logging.getLogger("telltale.k8s")


def _block(run_ctx: RunContext, name: str) -> dict[str, Any]:
    """A project's optional ``tests.<name>.<block>`` (e.g. ``kubernetes``) as a mapping."""
    value = getattr(run_ctx.test, name, None)
    return value.model_dump() if value is not None else {}


def run_cluster_workload(run_ctx: RunContext, cell: Cell) -> CellResult:
    """Run one cell's `KubeWorkload` (see `tasks.kube.workload.run_kube_workload`)."""
    here = artifact_dir()
    workload = workload_of(run_ctx, run_ctx.cell_context(cell, here))
    block = _block(run_ctx, "kubernetes")
    client = api_client(run_ctx.kubeconfig)
    code, reason, duration, _ = run_kube_workload(
        Kube(client, run_ctx.run_id), Kube(client), workload, run_ctx.test.namespace,
        here=here, image_pull_deadline_s=block.get("image_pull_deadline_minutes", 15) * 60,
        timeout_s=run_ctx.test.timeout_minutes * 60)
    return CellResult(exit_code=code, reason=reason, duration_s=duration,
                      log_tail=None if code == 0 else tail_lines(here / "artifacts" / "pod.log"))


def launch_users(run_ctx: RunContext, cell: Cell) -> dict[str, Any]:
    """Start the users' shared service, then their Indexed Job; returns where to collect.

    The service (if the project has one) is waited on until Ready before any user starts.
    """
    here = artifact_dir()
    users = users_of(run_ctx, run_ctx.cell_context(cell, here))
    configmap, job = users_job(run_ctx, users)
    (here / "src").mkdir(exist_ok=True)
    write_text(here / "src" / "config_final.json", configmap["data"]["config.json"] + "\n")
    client = api_client(run_ctx.kubeconfig)
    kube = Kube(client, run_ctx.run_id)
    service = shape_service(run_ctx, users.service) if users.service is not None else None
    write_json(here / "manifests.json", [*([*service.shared, *service.manifests]
                                          if service else []), configmap, job])
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": run_ctx.test.namespace}})
    if service is not None:  # the server the users share: Ready before any user starts
        start_service(kube, Kube(client), service, run_ctx.test.namespace)
    for manifest in (configmap, job):
        kube.apply(manifest)
    name = job["metadata"]["name"]
    return {"job": name, "dir": str(here),
            "url": f"s3://{run_ctx.test.multi_user.s3_bucket}/{users_prefix(run_ctx, name)}"}


@step("users", timeout_seconds=None)
def follow(kubeconfig: str | None, namespace: str, job: str, users: int, deadline_s: float,
           abort_on_failure: bool) -> UsersJobStatus:
    """Follow the users to the end, with a progress artifact of their counts."""
    artifact = ProgressArtifact(f"{users} users pending")

    def progress(status: UsersJobStatus) -> None:
        artifact.update(100 * (status.succeeded + status.failed) / users,
                        f"pending: {status.pending}, running: {status.running}, "
                        f"succeeded: {status.succeeded}, failed: {status.failed}")

    return follow_users(Kube(api_client(kubeconfig)), job, namespace, users,
                        deadline_s=deadline_s, abort_on_failure=abort_on_failure,
                        progress=progress)


@step("users", retries=2, retry_delay_seconds=[5, 20], timeout_seconds=1800)
def collect_batch(indices: list[int], url: str, dest: str, target: S3Target) -> list[int]:
    """Download one batch of users' results (mapped over batches by the platform)."""
    return collect_users(indices, url, dest, target)


class KubernetesPlatform:
    """A cluster reached through a kubeconfig (see the module docstring)."""

    name = "kubernetes"

    @classmethod
    def ahead(cls, project: Project, config: Config,
              artifact_dir: Path | None) -> AbstractContextManager[None]:
        """Nothing to start before the flow: the cluster is there, or the run creates it."""
        return nullcontext()

    def prepare(self, run_ctx: RunContext, cells: Sequence[Cell]) -> None:
        """Check the API, deploy the fan-out's S3 when asked, install operators."""
        kube = Kube(api_client(run_ctx.kubeconfig))
        if kube.get("v1", "Namespace", "default") is None:
            raise ConfigError("the cluster answers but has no 'default' namespace: is the "
                              "kubeconfig pointing at a Kubernetes API?")
        multi_user = run_ctx.test.multi_user
        if multi_user.enabled and multi_user.deploy_s3:
            kube_prepare.deploy_s3(run_ctx.kubeconfig, run_ctx.test.namespace,
                                   multi_user.s3_bucket)
        prepare = run_ctx.model.prepare
        # Independent stacks install concurrently; each is a no-op on a prepared cluster.
        futures = []
        build = run_ctx.model.clusters.image_build
        images = None
        if build.pr is not None:
            images = kube_prepare.build_images.submit(run_ctx.kubeconfig, build,
                                                      run_ctx.test.namespace, run_ctx.run_id)
            futures.append(images)
        futures += self._machinesets(run_ctx, cells)
        if prepare.enabled and prepare.rhoai.enabled:
            futures.append(kube_prepare.deploy_rhoai.submit(run_ctx.kubeconfig, prepare.rhoai))
        if prepare.enabled and prepare.gpu_operator.enabled:
            futures.append(kube_prepare.deploy_gpu_operator.submit(
                run_ctx.kubeconfig, prepare.gpu_operator, prepare.nfd))
        for future in futures:
            future.result()  # raises the step's error
        if images is not None:
            run_ctx.images.update(images.result())

    @staticmethod
    def _machinesets(run_ctx: RunContext, cells: Sequence[Cell]) -> list[Any]:
        """Submit each role's MachineSet step (with what ``replicas: auto`` needs)."""
        futures = []
        for role in ("sutest", "driver"):
            block = machineset_of(run_ctx.model.clusters, role)  # type: ignore[arg-type]
            if not block.enabled:
                continue
            pods, requests = 1, dict[str, float]()
            if block.replicas == "auto":  # the busiest cell of the run, its largest pod
                counts = []
                for cell in cells:
                    demand = role_demand(run_ctx, run_ctx.cell_context(cell, run_ctx.root))
                    counts.append(sum(n for n, _ in demand[role]))
                    for _, wanted in demand[role]:
                        for resource, amount in wanted.items():
                            requests[resource] = max(amount, requests.get(resource, 0.0))
                pods = max(counts or [1]) or 1
            futures.append(kube_prepare.scale_machineset.submit(
                run_ctx.kubeconfig, block, role, run_ctx.run_id, pods, requests))
        return futures

    def capture(self, run_ctx: RunContext) -> None:
        """Nodes, versions, operators; RHOAI's state."""
        capture_environment(run_ctx.kubeconfig, run_ctx.model.observe.prometheus.url)
        capture_state(run_ctx.kubeconfig)

    def run_cell(self, run_ctx: RunContext, cell: Cell) -> CellResult:
        """Apply and follow the cell's workload; then its window from the cluster's Prometheus."""
        start = datetime.now(UTC)
        try:
            result: CellResult = project_step(run_ctx, run_cluster_workload)(run_ctx, cell)
        finally:
            self._capture(run_ctx, start)
        return result

    def _snapshot(self, run_ctx: RunContext) -> None:
        block = run_ctx.model.observe.prometheus
        if not block.snapshot:
            return
        try:
            prometheus = cluster_prometheus(block, run_ctx.model.secrets)
        except Exception as exc:  # a missing token was said at capture already
            logger.warning("prometheus snapshot skipped: %s", exc)
            return
        if prometheus is None:
            return
        try:
            name = prometheus.snapshot_name()
        finally:
            prometheus.stop()
        target = run_ctx.root / "prometheus"
        target.mkdir(parents=True, exist_ok=True)
        write_text(target / "cluster_snapshot.json", json.dumps({
            "url": block.url, "snapshot": name,
            "note": "in the Prometheus pod's data dir, under snapshots/" if name else
                    "refused (admin API off): each cell's range queries are the record"},
            indent=2) + "\n")

    def _capture(self, run_ctx: RunContext, start: datetime) -> None:
        prometheus = cluster_prometheus(run_ctx.model.observe.prometheus,
                                        run_ctx.model.secrets)
        if prometheus is None:
            return
        try:
            capture_prometheus(prometheus, cluster_queries(run_ctx.test.namespace), start,
                               datetime.now(UTC))
        except Exception as exc:  # no resource KPIs is not a failed cell
            logger.warning("prometheus capture failed: %s", exc)
        finally:
            prometheus.stop()

    def run_users(self, run_ctx: RunContext, cell: Cell) -> list[CellResult]:
        """Indexed Job of N users; collection mapped over batches."""
        from prefect import unmapped

        multi_user = run_ctx.test.multi_user
        if not multi_user.s3_endpoint and not multi_user.deploy_s3:
            raise ConfigError("the cluster fan-out needs an S3 server reachable from the "
                              "pods: set s3_endpoint or deploy_s3",
                              key=f"{run_ctx.project.test_key}.multi_user.s3_endpoint")
        endpoint = users_s3_endpoint(run_ctx)
        users = multi_user.user_count
        launched = project_step(run_ctx, launch_users, timeout_seconds=300)(run_ctx, cell)
        status = follow(run_ctx.kubeconfig, run_ctx.test.namespace, launched["job"], users,
                        run_ctx.test.timeout_minutes * 60, multi_user.abort_on_failure)
        s3 = S3Target(bucket=multi_user.s3_bucket,
                      endpoint_url=multi_user.s3_external_endpoint or endpoint)
        size = multi_user.collect_batch
        batches = [list(range(i, min(i + size, users))) for i in range(0, users, size)]
        futures = collect_batch.map(batches, unmapped(launched["url"]),
                                    unmapped(launched["dir"]), unmapped(s3))
        collected = sum(len(f.result()) for f in futures)
        logger.info("%d/%d users succeeded, %d collected%s", status.succeeded, users, collected,
                    ", aborted after a failure" if status.aborted else "")
        return read_users(Path(launched["dir"]) / "users", users)

    def cleanup(self, run_ctx: RunContext) -> None:
        """Delete the run's objects (or mark them kept); uninstall RHOAI when asked.

        A cluster Prometheus whose admin API is open is asked for a TSDB snapshot first; it
        stays in the Prometheus pod's volume: its name is recorded in
        ``<run>/prometheus/cluster_snapshot.json``.
        """
        if run_ctx.kubeconfig is None or (run_ctx.kubeconfig != "in-cluster"
                                          and not Path(run_ctx.kubeconfig).is_file()):
            # the run stopped before its cluster existed (creation failed, or a Ctrl-C)
            logger.info("no cluster to clean up: the run has no kubeconfig yet")
            return
        self._snapshot(run_ctx)
        keep = run_ctx.model.clusters.keep
        cleanup_k8s(run_ctx.kubeconfig, run_ctx.run_id, keep)
        if run_ctx.model.prepare.rhoai.uninstall and not keep:
            kube_prepare.uninstall_rhoai(run_ctx.kubeconfig)

    @contextmanager
    def lock(self, run_ctx: RunContext) -> Iterator[None]:
        """One run per cluster at a time."""
        host = Kube(api_client(run_ctx.kubeconfig)).api.configuration.host
        with cluster_lock(host):
            yield
