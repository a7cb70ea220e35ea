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

from analysis.errors import ConfigError
from analysis.yamlio import load_yaml
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


def _presets(name: str) -> list[list[str]]:
    presets = sorted(resolve(name, [], overrides={}, env={}).get("ci_presets") or {})
    return [[], *[[p] for p in presets]]


def _cases() -> list[tuple[str, list[str]]]:
    return [(name, presets) for name in registry.available() for presets in _presets(name)]


def planned(name: str, presets: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    """The manifests a kubernetes plan writes; [] when the preset is refused as unsupported."""
    config = resolve(name, presets, overrides=CLUSTER_VARS.get(name, {}), env={})
    try:
        plan_run(registry.load(name), config, "kubernetes", tmp_path)
    except ConfigError as exc:  # never silent: refused, with the key (test below)
        assert "not supported on kubernetes" in str(exc), exc
        return []
    return [load_yaml(f)[0] for f in sorted((tmp_path / "manifests").rglob("*.yaml"))]


@pytest.mark.parametrize(("name", "presets"), _cases(),
                         ids=lambda v: v if isinstance(v, str) else "+".join(v) or "base")
def test_every_planned_manifest_fits_its_upstream_schema_and_the_rbac(
        name: str, presets: list[str], tmp_path: Path) -> None:
    rules = rbac_documents()[1]["rules"]
    for manifest in planned(name, presets, tmp_path):
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
