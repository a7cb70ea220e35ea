"""OLM installs against the API test server with a fake OLM controller."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import StepError
from projects.library import GpuOperatorBlock, NfdBlock, RhoaiBlock
from tasks.kube.api import Kube, api_client
from tasks.kube.olm import (
    GPU_OPERATOR,
    RHOAI,
    SERVICE_MESH,
    cluster_policy,
    install,
    is_installed,
    prepare_gpu,
    prepare_rhoai,
    uninstall,
)
from tasks.retry import RetryPolicy
from tests.servers.fake_operators import OlmController
from tests.servers.kubernetes import kube_server, write_kubeconfig


@pytest.fixture()
def cluster(tmp_path: Path):
    with kube_server() as (url, state):
        controller = OlmController(state, fail_package="broken-operator")
        controller.start()
        kube = Kube(api_client(write_kubeconfig(tmp_path / "kc", url)),
                    policy=RetryPolicy(attempts=3, backoff_base_s=0))
        yield kube, state
        controller.stop()


def writes(state) -> int:
    return sum(1 for method, _, _ in state.requests if method in ("POST", "PATCH", "PUT"))


def test_install_is_idempotent(cluster) -> None:
    kube, state = cluster
    csv = install(kube, SERVICE_MESH, deadline_s=300)
    assert csv["status"]["phase"] == "Succeeded" and is_installed(kube, SERVICE_MESH)
    before = writes(state)
    install(kube, SERVICE_MESH, deadline_s=300)
    assert writes(state) == before  # a prepared cluster is left untouched


def test_pinned_version_needs_and_gets_manual_approval(cluster) -> None:
    kube, state = cluster
    pinned = RHOAI.model_copy(update={"version": "rhods-operator.2.13.0"})
    csv = install(kube, pinned, deadline_s=300)
    assert csv["metadata"]["name"] == "rhods-operator.2.13.0"
    sub = state.get("operators.coreos.com/v1alpha1", "Subscription", "rhods-operator",
                    "redhat-ods-operator")
    assert sub["spec"]["installPlanApproval"] == "Manual"
    plan = state.list("operators.coreos.com/v1alpha1", "InstallPlan")[0]
    assert plan["spec"]["approved"] is True
    assert not is_installed(kube, pinned.model_copy(update={"version": "rhods-operator.2.14.0"}))
    assert uninstall(kube, pinned) == ["Subscription/rhods-operator",
                                       "ClusterServiceVersion/rhods-operator.2.13.0"]
    assert not is_installed(kube, pinned)


def test_failed_csv_fails_fast(cluster) -> None:
    kube, _ = cluster
    broken = GPU_OPERATOR.model_copy(update={"package": "broken-operator"})
    with pytest.raises(StepError, match="CSV phase Failed: install strategy failed"):
        install(kube, broken, deadline_s=300)


def test_rhoai_and_gpu_stacks(cluster) -> None:
    kube, state = cluster
    prepare_rhoai(kube, RhoaiBlock(channel="fast", components=["trainingoperator"]),
                  deadline_s=300)
    dsc = state.get("datasciencecluster.opendatahub.io/v1", "DataScienceCluster", "default-dsc")
    assert dsc["spec"]["components"]["trainingoperator"]["managementState"] == "Managed"
    assert dsc["spec"]["components"]["kserve"]["managementState"] == "Removed"
    assert is_installed(kube, SERVICE_MESH)  # the dependency came first
    block = GpuOperatorBlock.model_validate({"time_sharing_replicas": 4,
                                             "extended_dcgm_metrics": True,
                                             "tolerations": [{"key": "nvidia.com/gpu",
                                                              "operator": "Exists",
                                                              "effect": "NoSchedule"}]})
    prepare_gpu(kube, block, NfdBlock(enabled=True), deadline_s=300)
    policy = state.get("nvidia.com/v1", "ClusterPolicy", "gpu-cluster-policy")
    assert policy["spec"]["devicePlugin"]["config"] == {"name": "time-slicing-config",
                                                        "default": "any"}
    assert policy["spec"]["daemonsets"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "replicas: 4" in state.get("v1", "ConfigMap", "time-slicing-config",
                                      "nvidia-gpu-operator")["data"]["any"]
    assert state.get("nfd.openshift.io/v1", "NodeFeatureDiscovery", "nfd-instance",
                     "openshift-nfd") is not None


def test_cluster_policy_without_options() -> None:
    manifests = cluster_policy(GpuOperatorBlock())
    assert [m["kind"] for m in manifests] == ["ClusterPolicy"]
    assert "config" not in manifests[0]["spec"]["devicePlugin"]
