"""Nodes of the run's own: MachineSets cloned or scaled, waited on, tainted, given back.

Against the Kubernetes API test server with the Machine API's controller
(`tests.servers.fake_openshift`); what Telltale creates validates against the real MachineSet
CRD (../shared/crds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError, StepError
from projects.library.clusters import MachineSetBlock, TaintBlock
from tasks.kube.api import Kube, api_client
from tasks.kube.machinesets import (
    SCALED_BY_LABEL,
    auto_replicas,
    bring_up,
    find_scaled_leaks,
    measure_fit,
    per_node,
)
from tasks.kube.placement import COMPUTE_LABEL
from tasks.kube.workload import cleanup_cluster
from tests.servers.fake_openshift import (
    CAPACITY_ERROR,
    MS,
    MachineController,
    seed_machine_api,
)
from tests.servers.kubernetes import KubeState, kube_server, write_kubeconfig
from tests.upstream_schemas import validate

NS = "openshift-machine-api"
TAINT = TaintBlock(key="telltale.io/compute", effect="NoSchedule")


@contextmanager
def cluster(tmp_path: Path, scenario: str = "success",
            allocatable: dict[str, str] | None = None) -> Iterator[tuple[str, KubeState]]:
    with kube_server() as (url, state):
        seed_machine_api(state)
        controller = MachineController(state, scenario, allocatable)  # type: ignore[arg-type]
        controller.start()
        try:
            yield write_kubeconfig(tmp_path / "kc", url), state
        finally:
            controller.stop()


def _nodes(state: KubeState, role: str) -> list[dict[str, Any]]:
    return [n for n in state.list("v1", "Node")
            if (n["metadata"].get("labels") or {}).get(COMPUTE_LABEL) == role]


def test_a_clone_gets_the_instance_type_its_nodes_the_label_and_taint_and_cleanup_deletes_it(
        tmp_path: Path) -> None:
    block = MachineSetBlock(enabled=True, instance_type="g5.2xlarge", replicas=2, taint=TAINT)
    with cluster(tmp_path) as (kubeconfig, state):
        up = bring_up(Kube(api_client(kubeconfig), "run-1"), block, "sutest", "run-1",
                      replicas=2)
        assert up.created and up.replicas == 2 and len(up.nodes) == 2
        created = state.get(MS, "MachineSet", "telltale-sutest", NS)
        provider = created["spec"]["template"]["spec"]["providerSpec"]["value"]
        # cloned from the worker MachineSet: its AMI and zone kept, the size replaced
        assert provider["instanceType"] == "g5.2xlarge" and provider["ami"]["id"]
        assert created["metadata"]["labels"]["telltale.io/run-id"] == "run-1"
        validate({k: created[k] for k in ("apiVersion", "kind", "spec")} |
                 {"metadata": {k: created["metadata"][k] for k in ("name", "namespace",
                                                                   "labels")}})
        nodes = _nodes(state, "sutest")
        assert sorted(n["metadata"]["name"] for n in nodes) == up.nodes
        assert all(n["metadata"]["labels"]["node.kubernetes.io/instance-type"] ==
                   "g5.2xlarge" for n in nodes)
        assert all({"key": "telltale.io/compute", "value": "sutest", "effect": "NoSchedule"}
                   in n["spec"]["taints"] for n in nodes)
        removed = cleanup_cluster(kubeconfig, "run-1")
        assert f"MachineSet/{NS}/telltale-sutest" in removed
        assert state.get(MS, "MachineSet", "telltale-sutest", NS) is None
        assert not _nodes(state, "sutest")  # its Machines and nodes went with it
        assert state.get(MS, "MachineSet", "ci-worker-us-east-2a", NS)  # the source stays


def test_an_existing_machineset_is_scaled_then_scaled_back_and_its_nodes_cleaned(
        tmp_path: Path) -> None:
    block = MachineSetBlock(enabled=True, name="ci-worker-us-east-2a", replicas=4, taint=TAINT)
    with cluster(tmp_path) as (kubeconfig, state):
        kube = Kube(api_client(kubeconfig), "run-2")
        # its two workers exist before the run
        bring_up(Kube(api_client(kubeconfig)), MachineSetBlock(
            enabled=True, name="ci-worker-us-east-2a", replicas=2), "sutest", "warm-up",
            replicas=2)
        Kube(api_client(kubeconfig)).patch(MS, "MachineSet", "ci-worker-us-east-2a", {
            "metadata": {"labels": {SCALED_BY_LABEL: None}}}, NS)
        for node in _nodes(state, "sutest"):
            Kube(api_client(kubeconfig)).patch("v1", "Node", node["metadata"]["name"], {
                "metadata": {"labels": {COMPUTE_LABEL: None}}})
        up = bring_up(kube, block, "sutest", "run-2", replicas=4)
        assert not up.created and up.original_replicas == 2 and len(up.nodes) == 4
        scaled = state.get(MS, "MachineSet", "ci-worker-us-east-2a", NS)
        assert scaled["spec"]["replicas"] == 4
        assert scaled["metadata"]["labels"][SCALED_BY_LABEL] == "run-2"
        assert "telltale.io/run-id" not in scaled["metadata"]["labels"]  # not the run's
        assert len(_nodes(state, "sutest")) == 4
        removed = cleanup_cluster(kubeconfig, "run-2")
        assert any("back to 2" in line for line in removed)
        back = state.get(MS, "MachineSet", "ci-worker-us-east-2a", NS)
        assert back["spec"]["replicas"] == 2
        assert SCALED_BY_LABEL not in back["metadata"]["labels"]
        assert not any(k.startswith("telltale.io/") for k in back["metadata"].get(
            "annotations") or {})
        nodes = [n for n in state.list("v1", "Node")]
        assert len(nodes) == 2
        assert not _nodes(state, "sutest")
        assert not any(t.get("key") == "telltale.io/compute" for n in nodes
                       for t in n["spec"].get("taints") or [])


def test_a_failed_machine_fails_fast_with_the_providers_message(tmp_path: Path) -> None:
    block = MachineSetBlock(enabled=True, instance_type="g5.12xlarge", replicas=1,
                            ready_minutes=24 * 60)  # a deadline never reached: it is the phase
    with cluster(tmp_path, scenario="fail") as (kubeconfig, state):
        with pytest.raises(StepError, match="InsufficientInstanceCapacity") as info:
            bring_up(Kube(api_client(kubeconfig), "run-3"), block, "sutest", "run-3",
                     replicas=1)
        assert "Machine telltale-sutest-" in str(info.value)
        assert CAPACITY_ERROR in str(info.value)
        cleanup_cluster(kubeconfig, "run-3")  # what was created still goes
        assert state.get(MS, "MachineSet", "telltale-sutest", NS) is None


def test_replicas_auto_measures_a_node_then_scales_to_the_pods(tmp_path: Path) -> None:
    block = MachineSetBlock(enabled=True, instance_type="m6i.2xlarge", replicas="auto")
    # 7.5 CPUs and 30 GiB a node; a pod asks 2 CPUs and 4 GiB: 3 a node; 7 pods: 3 nodes
    requests = {"cpu": 2.0, "memory": 4 * 2**30}
    with cluster(tmp_path) as (kubeconfig, state):
        up = bring_up(Kube(api_client(kubeconfig), "run-4"), block, "driver", "run-4",
                      replicas=lambda kube, name: auto_replicas(
                          7, measure_fit(kube, name, NS, requests), block))
        assert up.replicas == 3 and len(_nodes(state, "driver")) == 3
        assert state.get(MS, "MachineSet", "telltale-driver", NS)["spec"]["replicas"] == 3
        cleanup_cluster(kubeconfig, "run-4")


def test_the_janitor_scales_back_what_a_dead_run_scaled_and_deletes_its_clones(
        tmp_path: Path, prefect_harness) -> None:
    from flows.cleanup import janitor

    with cluster(tmp_path) as (kubeconfig, state):
        bring_up(Kube(api_client(kubeconfig), "dead"), MachineSetBlock(
            enabled=True, name="ci-worker-us-east-2a", replicas=3), "sutest", "dead",
            replicas=3)
        bring_up(Kube(api_client(kubeconfig), "dead"), MachineSetBlock(
            enabled=True, replicas=1), "driver", "dead", replicas=1)
        kube = Kube(api_client(kubeconfig))
        assert find_scaled_leaks(kube, 3600) == []  # just scaled: not a leak yet
        assert len(find_scaled_leaks(kube, 0)) == 1
        outcome = janitor.fn(older_than="0s", dry_run=True, kubeconfig=kubeconfig)
        assert any("MachineSet/openshift-machine-api/ci-worker-us-east-2a" in line
                   for line in outcome.leaks)
        assert state.get(MS, "MachineSet", "ci-worker-us-east-2a", NS)["spec"]["replicas"] == 3
        janitor.fn(older_than="0s", dry_run=False, kubeconfig=kubeconfig)
        assert state.get(MS, "MachineSet", "ci-worker-us-east-2a", NS)["spec"]["replicas"] == 2
        assert state.get(MS, "MachineSet", "telltale-driver", NS) is None


def test_auto_needs_requests_or_users_per_node_and_stays_under_max() -> None:
    with pytest.raises(ConfigError, match="users_per_node"):
        per_node({"cpu": "8"}, {})
    block = MachineSetBlock(replicas="auto", max_replicas=4)
    with pytest.raises(ConfigError, match="max_replicas 4"):
        auto_replicas(100, 5, block)
    with pytest.raises(ConfigError, match="exceed a node"):
        auto_replicas(1, 0, block)


@given(cpu_m=st.integers(1, 256_000), want_m=st.integers(1, 64_000),
       gpus=st.integers(0, 8), want_gpus=st.integers(0, 4))
def test_per_node_is_the_most_pods_a_node_holds(cpu_m: int, want_m: int, gpus: int,
                                                 want_gpus: int) -> None:
    allocatable = {"cpu": f"{cpu_m}m", "nvidia.com/gpu": str(gpus)}
    requests = {"cpu": want_m / 1000, "nvidia.com/gpu": float(want_gpus)}
    fits = per_node(allocatable, requests)
    for resource, want in requests.items():
        have = cpu_m / 1000 if resource == "cpu" else gpus
        assert fits * want <= have + 1e-9
    # one more pod would not fit on some resource
    assert any((fits + 1) * want > (cpu_m / 1000 if r == "cpu" else gpus) + 1e-9
               for r, want in requests.items() if want > 0)


def test_a_cluster_without_the_machine_api_is_a_user_error_naming_the_key(
        tmp_path: Path) -> None:
    """Plain Kubernetes serves no MachineSet: exit 2 naming the key, not a failed step."""
    with kube_server() as (url, state):
        state.unserved.add("machine.openshift.io")
        kubeconfig = write_kubeconfig(tmp_path / "kc", url)
        with pytest.raises(ConfigError, match="does not serve") as info:
            bring_up(Kube(api_client(kubeconfig), "run-5"), MachineSetBlock(enabled=True),
                     "driver", "run-5", replicas=1)
        assert info.value.key == "clusters.driver.compute.machineset.enabled"
