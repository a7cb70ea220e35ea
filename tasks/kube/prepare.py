"""Prepare-phase steps on a cluster: operators through OLM (see `tasks.kube.olm`)."""

from __future__ import annotations

from typing import Any

from projects.library import GpuOperatorBlock, NfdBlock, RhoaiBlock
from tasks.artifacts import step
from tasks.kube.api import Kube, api_client
from tasks.kube.olm import RHOAI, prepare_gpu, prepare_rhoai, uninstall
from tasks.kube.users import deploy_in_cluster_s3

__all__ = ["deploy_gpu_operator", "deploy_rhoai", "deploy_s3", "uninstall_rhoai"]


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
