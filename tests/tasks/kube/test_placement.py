"""Every pod template of any manifest is placed and pinned by one pass (generated manifests)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError
from projects.library.clusters import ClustersBlock
from tasks.kube.placement import (
    COMPUTE_LABEL,
    Placement,
    placements,
    pod_demand,
    pod_templates,
    quantity,
    shape,
)

PLACED = Placement({COMPUTE_LABEL: "sutest"},
                   ({"key": "telltale.io/compute", "operator": "Equal", "value": "sutest",
                     "effect": "NoSchedule"},))
IMAGES = {"user-pod": "registry/ns/telltale@sha256:" + "a" * 64}

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
containers = st.lists(st.fixed_dictionaries({
    "name": names, "image": st.sampled_from(["quay.io/x/y:1", "telltale:user-pod"])}),
    min_size=1, max_size=3)
pod_spec = st.fixed_dictionaries(
    {"containers": containers},
    optional={"initContainers": containers,
              "nodeSelector": st.dictionaries(names, names, max_size=2),
              "tolerations": st.lists(st.fixed_dictionaries({"key": names, "effect": st.just(
                  "NoSchedule")}), max_size=2)})


def _nest(spec: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The same pod template where the kinds Telltale applies keep it."""
    return st.sampled_from([
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
         "spec": {"parallelism": 3, "template": {"spec": spec}}},
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "t"},
         "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {
             "spec": spec}}, "Worker": {"replicas": 2, "template": {"spec": spec}}}}},
        {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
         "metadata": {"name": "r"}, "spec": {"multiModel": False, **spec}},
        {"apiVersion": "rayproject.io/v1", "kind": "RayJob", "metadata": {"name": "r"},
         "spec": {"rayClusterSpec": {"workerGroupSpecs": [{"template": {"spec": spec}}]}}},
    ])


manifests = pod_spec.flatmap(_nest)


@given(manifest=manifests)
def test_every_pod_template_is_placed_and_pinned_and_nothing_else_changes(
        manifest: dict[str, Any]) -> None:
    before = json.dumps(manifest, sort_keys=True)
    shaped = shape(manifest, PLACED, IMAGES)
    assert json.dumps(manifest, sort_keys=True) == before  # the input is not changed
    templates = list(pod_templates(shaped))
    assert templates and len(templates) == len(list(pod_templates(manifest)))
    for template in templates:
        assert template["nodeSelector"][COMPUTE_LABEL] == "sutest"
        assert list(PLACED.tolerations)[0] in template["tolerations"]
        assert sum(t == PLACED.tolerations[0] for t in template["tolerations"]) == 1
        for container in [*template["containers"], *template.get("initContainers", [])]:
            assert not container["image"].startswith("telltale:")
    assert shape(shaped, PLACED, IMAGES) == shaped  # idempotent


@given(manifest=manifests)
def test_telltales_image_without_a_build_is_refused(manifest: dict[str, Any]) -> None:
    uses = any(c["image"].startswith("telltale:") for t in pod_templates(manifest)
               for c in [*t["containers"], *t.get("initContainers", [])])
    if uses:
        with pytest.raises(ConfigError, match="builds none") as info:
            shape(manifest, Placement(), {})
        assert info.value.key == "clusters.image_build.pr"
    else:
        assert shape(manifest, Placement(), {}) == manifest


def test_roles_are_placed_from_the_config_alone() -> None:
    clusters = ClustersBlock.model_validate({
        "sutest": {"compute": {"machineset": {"enabled": True, "taint": {}}}},
        "driver": {"compute": {"machineset": {"enabled": True}}}})
    roles = placements(clusters)
    assert roles["sutest"] == PLACED
    assert roles["driver"] == Placement({COMPUTE_LABEL: "driver"}, ())
    assert placements(ClustersBlock())["sutest"] == Placement()


def test_pod_demand_counts_replicas_and_requests() -> None:
    spec = {"containers": [{"name": "a", "image": "x", "resources": {
        "requests": {"cpu": "500m"}, "limits": {"memory": "2Gi", "nvidia.com/gpu": 1}}},
        {"name": "b", "image": "y", "resources": {"requests": {"cpu": "1.5"}}}]}
    job = {"kind": "Job", "spec": {"parallelism": 4, "template": {"spec": spec}}}
    assert pod_demand([job]) == [(4, {"cpu": 2.0, "memory": 2 * 2**30, "nvidia.com/gpu": 1.0})]
    assert quantity("1e3") == 1000 and quantity("250M") == 250e6
    with pytest.raises(ValueError):
        quantity("lots")
