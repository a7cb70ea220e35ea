"""Where a run's pods go and what they run: one pass over every pod template of a manifest.

A pod template is any mapping with a ``containers`` list: a Pod's spec, a Job's or a
Deployment's ``template.spec``, each PyTorchJob replica's, an InferenceService predictor,
a ServingRuntime's spec. `shape` finds them all, so a kind a project brings tomorrow gets
the same treatment without a table to update:

- **placement**: the node selector ``telltale.io/compute=<role>`` and the toleration of the
  role's taint, when the role has a MachineSet (`clusters.<role>.compute.machineset`);
- **images**: a container image ``telltale:<target>`` is Telltale's own image of that
  Containerfile target, replaced by what the run resolved (the PR build's digest; a plan
  shows the tag it would build). An unresolved one is refused before anything is applied.

`pod_demand` reads the same templates back: how many pods of which requests a manifest
starts (``replicas: auto`` divides a node's allocatable by them).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from core.errors import ConfigError
from projects.library.clusters import ClustersBlock, MachineSetBlock

__all__ = ["COMPUTE_LABEL", "IMAGE_PREFIX", "Placement", "Role", "machineset_of",
           "machineset_name", "placements", "pod_demand", "pod_templates", "quantity",
           "shape", "shape_all", "taint_of"]

Role = Literal["sutest", "driver"]
COMPUTE_LABEL = "telltale.io/compute"
"""The node label a MachineSet's nodes carry (value: the role)."""
IMAGE_PREFIX = "telltale:"
"""A container image ``telltale:<target>`` names Telltale's own image of that target."""


@dataclass(frozen=True)
class Placement:
    """Node selector and tolerations for the pods of one role."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, str]] = ()


def machineset_of(clusters: ClustersBlock, role: Role) -> MachineSetBlock:
    """The MachineSet block of a role."""
    return (clusters.sutest if role == "sutest" else clusters.driver).compute.machineset


def machineset_name(block: MachineSetBlock, role: Role) -> str:
    """The MachineSet's name (given, or ``telltale-<role>``)."""
    return block.name or f"telltale-{role}"


def taint_of(block: MachineSetBlock, role: str) -> dict[str, str] | None:
    """The taint a role's nodes carry (its value defaults to the role), or None."""
    if block.taint is None:
        return None
    return {"key": block.taint.key, "value": block.taint.value or role,
            "effect": block.taint.effect}


def placements(clusters: ClustersBlock) -> dict[str, Placement]:
    """Role → `Placement`, from the config alone (a plan and a run place pods alike)."""
    result: dict[str, Placement] = {}
    for role in ("sutest", "driver"):
        block = machineset_of(clusters, role)  # type: ignore[arg-type]
        if not block.enabled:
            result[role] = Placement()
            continue
        taint = taint_of(block, role)
        tolerations = ({**taint, "operator": "Equal"},) if taint is not None else ()
        result[role] = Placement({COMPUTE_LABEL: role}, tolerations)
    return result


def pod_templates(obj: Any) -> Iterator[dict[str, Any]]:
    """Every pod template (a mapping with a ``containers`` list) inside ``obj``."""
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            yield obj
        for key, value in obj.items():
            if key not in ("containers", "initContainers", "status"):
                yield from pod_templates(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from pod_templates(item)


def _pin(container: dict[str, Any], images: Mapping[str, str], where: str) -> None:
    image = container.get("image")
    if not isinstance(image, str) or not image.startswith(IMAGE_PREFIX):
        return
    target = image[len(IMAGE_PREFIX):]
    if target not in images:
        raise ConfigError(f"{where}: container {container.get('name')!r} runs {image}, "
                          f"Telltale's {target!r} image, but this run builds none: give a "
                          "PR (--pr N) or set clusters.image_build.targets",
                          key="clusters.image_build.pr")
    container["image"] = images[target]


def shape(manifest: Mapping[str, Any], placement: Placement,
          images: Mapping[str, str]) -> dict[str, Any]:
    """A copy of ``manifest`` with every pod template placed and its images pinned.

    Raises:
        ConfigError: A container names Telltale's image of a target the run has not built.
    """
    obj = copy.deepcopy(dict(manifest))
    where = f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')}"
    for template in pod_templates(obj):
        for container in [*template["containers"], *(template.get("initContainers") or [])]:
            if isinstance(container, dict):
                _pin(container, images, where)
        if placement.node_selector:
            template["nodeSelector"] = {**(template.get("nodeSelector") or {}),
                                        **placement.node_selector}
        if placement.tolerations:
            present = list(template.get("tolerations") or [])
            template["tolerations"] = present + [dict(t) for t in placement.tolerations
                                                 if dict(t) not in present]
    return obj


def shape_all(manifests: Sequence[Mapping[str, Any]], placement: Placement,
              images: Mapping[str, str]) -> list[dict[str, Any]]:
    """`shape` over a list."""
    return [shape(m, placement, images) for m in manifests]


_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "P": 1e15, "E": 1e18}


def quantity(value: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2Gi``, ``1e3``, ``4``) as a number.

    Raises:
        ValueError: Not a quantity.
    """
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[:-len(suffix)]:
            return float(text[:-len(suffix)]) * _SUFFIXES[suffix]
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"not a quantity: {value!r}")
    return number


def _replicas_around(obj: Mapping[str, Any], template: Mapping[str, Any]) -> int:
    """How many pods a template starts: its Job's parallelism, its replica spec's count."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Job":
        return int(spec.get("parallelism", 1))
    if obj.get("kind") == "Deployment":
        return int(spec.get("replicas", 1))
    for replica in (spec.get("pytorchReplicaSpecs") or {}).values():
        if (replica.get("template") or {}).get("spec") is template:
            return int(replica.get("replicas", 1))
    return 1


def pod_demand(manifests: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """``(pods, requests per pod)`` of every pod template (requests: cpu, memory, GPUs).

    A container's requests default to its limits, as the API server does.
    """
    demand = []
    for manifest in manifests:
        for template in pod_templates(manifest):
            requests: dict[str, float] = {}
            for container in template["containers"]:
                resources = container.get("resources") or {}
                wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                for name, value in wanted.items():
                    requests[name] = requests.get(name, 0.0) + quantity(value)
            demand.append((_replicas_around(manifest, template), requests))
    return demand
