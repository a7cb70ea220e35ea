"""Every manifest any project's plan writes, for every preset, validates against the real
upstream schemas (../shared/crds; undeclared fields are errors, as the API server prunes
them), is of a declared kind, and is granted to the runner by the generated RBAC."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from core.errors import ConfigError
from core.yamlio import load_yaml
from deployments.rbac import grants, rbac_documents
from projects import registry
from projects.config import resolve
from tasks.kube.kinds import kind_of
from tasks.platforms.plan import check_supported, plan_run
from tests.upstream_schemas import validate

# what a cluster plan of each project needs besides its presets (a model the cluster serves,
# the DNS domain of a cluster Telltale creates)
CLUSTER_VARS: dict[str, dict[str, Any]] = {
    "fine_tuning": {"clusters.create.base_domain": "lab.example.com"},
    "llm_serving": {"tests.llm_serving.test_settings.model_name": "granite-3b"},
}


# nodes of their own for both roles (tainted) and the image built from a PR: every manifest
# the plan then writes (MachineSets, ImageStream, BuildConfigs, placed pods) validates too
COMPUTE_VARS: dict[str, Any] = {
    "clusters.sutest.compute.machineset.enabled": True,
    "clusters.sutest.compute.machineset.instance_type": "g5.2xlarge",
    "clusters.sutest.compute.machineset.taint": {"key": "telltale.io/compute"},
    "clusters.driver.compute.machineset.enabled": True,
    "clusters.driver.compute.machineset.replicas": "auto",
    "clusters.driver.compute.machineset.taint": {"effect": "NoExecute"},
    "clusters.image_build.pr": 12,
    "clusters.image_build.git_url": "https://github.com/org/telltale",
}


def _presets(name: str) -> list[list[str]]:
    presets = sorted(resolve(name, [], overrides={}, env={}).get("ci_presets") or {})
    return [[], *[[p] for p in presets]]


def _cases() -> list[tuple[str, list[str]]]:
    return [(name, presets) for name in registry.available() for presets in _presets(name)]


def planned(name: str, presets: list[str], tmp_path: Path,
            extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The manifests a kubernetes plan writes; [] when the preset is refused as unsupported."""
    config = resolve(name, presets, overrides={**CLUSTER_VARS.get(name, {}), **(extra or {})},
                     env={})
    try:
        plan_run(registry.load(name), config, "kubernetes", tmp_path)
    except ConfigError as exc:  # never silent: refused, with the key (test below)
        assert "not supported on kubernetes" in str(exc), exc
        return []
    return [load_yaml(f)[0] for f in sorted((tmp_path / "manifests").rglob("*.yaml"))]


@pytest.mark.parametrize("compute", [False, True], ids=["", "compute"])
@pytest.mark.parametrize(("name", "presets"), _cases(),
                         ids=lambda v: v if isinstance(v, str) else "+".join(v) or "base")
def test_every_planned_manifest_fits_its_upstream_schema_and_the_rbac(
        name: str, presets: list[str], compute: bool, tmp_path: Path) -> None:
    rules = rbac_documents()[1]["rules"]
    for manifest in planned(name, presets, tmp_path, COMPUTE_VARS if compute else None):
        validate(manifest)
        kind = kind_of(manifest["apiVersion"], manifest["kind"])
        assert kind is not None, f"{manifest['kind']} is planned but declared nowhere"
        for verb in ("get", "create", "patch"):  # what Kube.apply does
            assert grants(rules, kind.group, kind.plural, verb), (kind.kind, verb)


def test_the_plans_cover_every_kind_a_project_applies(tmp_path: Path) -> None:
    kinds = set()
    for index, (name, presets) in enumerate(_cases()):
        kinds |= {m["kind"] for m in planned(name, presets, tmp_path / str(index))}
    assert {"PyTorchJob", "InferenceService", "ServingRuntime", "Subscription",
            "OperatorGroup", "DataScienceCluster", "ClusterPolicy", "NodeFeatureDiscovery",
            "Job", "ConfigMap", "PersistentVolumeClaim", "Namespace"} <= kinds


def test_the_upstream_validation_catches_what_the_api_server_would_prune(
        tmp_path: Path) -> None:
    manifests = planned("llm_serving", ["gpu"] if ["gpu"] in _presets("llm_serving") else [],
                        tmp_path)
    isvc = next(m for m in manifests if m["kind"] == "InferenceService")
    wrong = copy.deepcopy(isvc)
    wrong["spec"]["predictor"]["minReplica"] = 1  # a typo of minReplicas
    with pytest.raises(jsonschema.ValidationError, match="minReplica"):
        validate(wrong)
    job = next(m for m in planned("fine_tuning", ["gpu"], tmp_path / "ft")
               if m["kind"] == "PyTorchJob")
    job["spec"]["runPolicy"] = {"backoffLimit": "three"}  # an integer
    with pytest.raises(jsonschema.ValidationError, match="three"):
        validate(job)
    job["spec"]["runPolicy"] = {"cleanupPolicy": "None"}  # cleanPodPolicy, misspelt
    with pytest.raises(jsonschema.ValidationError, match="cleanupPolicy"):
        validate(job)


def test_a_cluster_fan_out_a_project_lacks_is_refused_naming_the_key(tmp_path: Path) -> None:
    """A project without `kube_users` asked for a cluster fan-out: refused before anything
    is planned or run (exit 2 through the CLI's ConfigError), never planned as single-user
    cells."""
    project = dataclasses.replace(registry.load("llm_serving"), kube_users=None)
    config = resolve("llm_serving", ["scale_test"], overrides=CLUSTER_VARS["llm_serving"],
                     env={})
    with pytest.raises(ConfigError, match="not supported on kubernetes") as info:
        plan_run(project, config, "kubernetes", tmp_path)
    assert info.value.key == "tests.llm_serving.multi_user.enabled"
    assert not (tmp_path / "manifests").exists()
    local_only = dataclasses.replace(registry.load("fine_tuning"), kubernetes=None)
    with pytest.raises(ConfigError, match="no cluster workload"):
        check_supported(local_only, local_only.test_block(
            resolve("fine_tuning", [], overrides={}, env={}).model), "kubernetes")


def test_the_serving_fan_out_plans_the_server_then_the_clients(tmp_path: Path) -> None:
    manifests = planned("llm_serving", ["scale_test"], tmp_path)
    kinds = [m["kind"] for m in manifests]
    assert "InferenceService" in kinds and kinds.index("InferenceService") < kinds.index("Job")
    job = next(m for m in manifests if m["kind"] == "Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 3
    pod = job["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "storage-initializer"  # the tokenizer
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert "{dir}" in json.loads(env["TELLTALE_COMMAND"])


def test_each_role_s_pods_go_to_its_nodes_and_the_builds_are_planned(tmp_path: Path) -> None:
    """Serving fan-out: the model server on the sutest's nodes, the load clients on the
    driver's; the plan writes the MachineSets and one BuildConfig per target."""
    manifests = planned("llm_serving", ["scale_test"], tmp_path, COMPUTE_VARS)
    kinds = [m["kind"] for m in manifests]
    assert kinds.count("MachineSet") == 2 and kinds.count("BuildConfig") == 2
    runtime = next(m for m in manifests if m["kind"] == "ServingRuntime")
    assert runtime["spec"]["nodeSelector"] == {"telltale.io/compute": "sutest"}
    assert runtime["spec"]["tolerations"] == [{"key": "telltale.io/compute",
                                               "operator": "Equal", "value": "sutest",
                                               "effect": "NoSchedule"}]
    clients = next(m for m in manifests if m["kind"] == "Job")["spec"]["template"]["spec"]
    assert clients["nodeSelector"] == {"telltale.io/compute": "driver"}
    assert clients["tolerations"][0]["effect"] == "NoExecute"
    trainer = planned("fine_tuning", ["gpu"], tmp_path / "ft", COMPUTE_VARS)
    job = next(m for m in trainer if m["kind"] == "PyTorchJob")
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["nodeSelector"] == {"telltale.io/compute": "sutest"}


@pytest.mark.parametrize(("key", "value"), [
    ("clusters.sutest.compute.machineset.enabled", True),
    ("clusters.driver.compute.machineset.enabled", True),
    ("clusters.image_build.pr", 7)])
def test_cluster_only_settings_are_refused_on_the_local_platform(
        key: str, value: Any, tmp_path: Path) -> None:
    config = resolve("fine_tuning", [], overrides={key: value}, env={})
    with pytest.raises(ConfigError, match="needs a cluster") as info:
        plan_run(registry.load("fine_tuning"), config, "local", tmp_path)
    assert info.value.key == key


def test_a_separate_driver_cluster_is_refused_naming_the_key(tmp_path: Path) -> None:
    config = resolve("llm_serving", ["scale_test"], overrides={
        **CLUSTER_VARS["llm_serving"], "clusters.driver.kubeconfig": "/tmp/driver"}, env={})
    with pytest.raises(ConfigError, match="driver cluster is not supported") as info:
        plan_run(registry.load("llm_serving"), config, "kubernetes", tmp_path)
    assert info.value.key == "clusters.driver.kubeconfig"
