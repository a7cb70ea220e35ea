"""Prepare-phase steps on a cluster.

Operators through OLM (`tasks.kube.olm`), the fan-out's S3, Telltale's image built from the
PR (`tasks.kube.images`), nodes of the run's own (`tasks.kube.machinesets`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.safeio import write_json
from projects.library import GpuOperatorBlock, NfdBlock, RhoaiBlock
from projects.library.clusters import ImageBuildBlock, MachineSetBlock
from tasks.artifacts import artifact_dir, step
from tasks.kube.api import Kube, api_client
from tasks.kube.images import run_builds
from tasks.kube.machinesets import MachineSetUp, auto_replicas, bring_up, measure_fit
from tasks.kube.olm import RHOAI, prepare_gpu, prepare_rhoai, uninstall
from tasks.kube.placement import Role
from tasks.kube.users import deploy_in_cluster_s3
from tasks.progress import ProgressArtifact

__all__ = ["build_images", "deploy_gpu_operator", "deploy_rhoai", "deploy_s3",
           "scale_machineset", "uninstall_rhoai"]


@step("prepare", timeout_seconds=300)
def deploy_s3(kubeconfig: str | None, namespace: str, bucket: str) -> str:
    """Deploy the fan-out's in-cluster S3 server; returns its endpoint for the pods."""
    return deploy_in_cluster_s3(Kube(api_client(kubeconfig)), namespace, bucket)


@step("rhods", timeout_seconds=3600)
def deploy_rhoai(kubeconfig: str | None, block: RhoaiBlock) -> dict[str, Any]:
    """Install service mesh + RHOAI and a DataScienceCluster (no-op when already there)."""
    return prepare_rhoai(Kube(api_client(kubeconfig)), block)


@step("gpu_operator", timeout_seconds=3600)
def deploy_gpu_operator(kubeconfig: str | None, block: GpuOperatorBlock,
                        nfd: NfdBlock) -> dict[str, Any]:
    """Install NFD + the GPU operator, its ClusterPolicy, and wait for its DaemonSets."""
    return prepare_gpu(Kube(api_client(kubeconfig)), block, nfd)


@step("cleanup", timeout_seconds=600)
def uninstall_rhoai(kubeconfig: str | None) -> list[str]:
    """Remove RHOAI's Subscription and CSV (``prepare.rhoai.uninstall``)."""
    return uninstall(Kube(api_client(kubeconfig)), RHOAI)


@step("image", timeout_seconds=None)
def build_images(kubeconfig: str | None, block: ImageBuildBlock, namespace: str,
                 run_id: str | None) -> dict[str, str]:
    """Build Telltale's image of each target from the PR in the cluster; target → digest.

    Each build's log is saved in the step dir (a failed build's too, before it fails).
    """
    api = api_client(kubeconfig)
    return run_builds(Kube(api, run_id), Kube(api), block, namespace, run_id=run_id,
                      here=artifact_dir())


@step("machineset", timeout_seconds=None)
def scale_machineset(kubeconfig: str | None, block: MachineSetBlock, role: Role, run_id: str,
                     pods: int, requests: dict[str, float]) -> MachineSetUp:
    """Give a role nodes of its own: scale or clone its MachineSet, wait, label and taint.

    ``replicas: auto`` divides ``pods`` (the most the run starts at once on that role) by
    what one node holds: ``users_per_node``, or a Ready node's allocatable over
    ``requests`` (one pod's), measured once the set has a node.
    """
    artifact = ProgressArtifact(f"MachineSet {role}: waiting for nodes")

    def progress(ready: int, wanted: int) -> None:
        artifact.update(100 * ready / max(wanted, 1), f"{ready}/{wanted} nodes Ready")

    replicas: int | Callable[[Kube, str], int]
    if isinstance(block.replicas, int):
        replicas = block.replicas
    elif block.users_per_node is not None:
        replicas = auto_replicas(pods, block.users_per_node, block)
    else:
        def replicas(kube: Kube, name: str) -> int:
            return auto_replicas(pods, measure_fit(kube, name, block.namespace, requests),
                                 block)
    up = bring_up(Kube(api_client(kubeconfig), run_id), block, role, run_id, replicas=replicas,
                  progress=progress)
    write_json(artifact_dir() / "machineset.json", up.model_dump())
    return up
