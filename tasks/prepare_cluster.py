"""Prepare-phase steps on a cluster: operators through OLM (see `tasks.olm`)."""

from __future__ import annotations

from typing import Any

from tasks.artifacts import step
from tasks.k8s import Kube, api_client
from tasks.olm import RHOAI, prepare_gpu, prepare_rhoai, uninstall

__all__ = ["deploy_gpu_operator", "deploy_rhoai", "uninstall_rhoai"]


@step("rhods", timeout_seconds=3600)
def deploy_rhoai(kubeconfig: str | None, block: dict[str, Any]) -> dict[str, Any]:
    """Install service mesh + RHOAI and a DataScienceCluster (no-op when already there)."""
    return prepare_rhoai(Kube(api_client(kubeconfig)), block)


@step("gpu_operator", timeout_seconds=3600)
def deploy_gpu_operator(kubeconfig: str | None, block: dict[str, Any],
                        nfd: dict[str, Any]) -> dict[str, Any]:
    """Install NFD + the GPU operator, its ClusterPolicy, and wait for its DaemonSets."""
    return prepare_gpu(Kube(api_client(kubeconfig)), block, nfd)


@step("cleanup", timeout_seconds=600)
def uninstall_rhoai(kubeconfig: str | None) -> list[str]:
    """Remove RHOAI's Subscription and CSV (``prepare.rhoai.uninstall``)."""
    return uninstall(Kube(api_client(kubeconfig)), RHOAI)
