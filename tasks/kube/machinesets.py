"""Nodes of their own for a run: scale (or clone) an OpenShift MachineSet, and give it back.

- `machineset_manifest`: the MachineSet Telltale creates, cloned from a worker MachineSet
  (its provider spec with the instance type replaced, the node label, the taint) — the plan
  writes it from the config alone, with the source's provider spec left to run time;
- `bring_up`: scale an existing MachineSet (recording what it had) or create the clone,
  wait for its Machines to become Ready nodes — failing at once on a Machine in phase
  ``Failed`` with the provider's message —, label and taint those nodes;
- `give_back`: what the run's cleanup and the leak janitor call: a MachineSet the run
  created is deleted (its Machines and nodes go with it); one it scaled is scaled back to
  its recorded count and its remaining nodes lose the run's label and taint;
- `auto_replicas`: ``replicas: auto`` — the role's pods over what one node of the instance
  type holds (its allocatable over a pod's requests), a node measured on the cluster.

A scaled MachineSet carries ``telltale.io/scaled-by-run=<run id>`` (a label, so the janitor
finds it by selector) and the annotations ``telltale.io/original-replicas`` and
``telltale.io/scaled-at``; a created one carries the run-id label like every run object.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from core.errors import ConfigError, StepError
from projects.library.clusters import MachineSetBlock
from tasks.kube.api import KEEP_LABEL, RUN_ID_LABEL, Kube
from tasks.kube.placement import COMPUTE_LABEL, Role, machineset_name, quantity, taint_of

__all__ = ["MACHINESET", "SCALED_BY_LABEL", "MachineSetUp", "auto_replicas", "bring_up",
           "find_scaled_leaks", "give_back", "give_back_run", "machineset_manifest",
           "measure_fit", "per_node", "wait_nodes"]

logger = logging.getLogger("telltale.machinesets")

MACHINESET = ("machine.openshift.io/v1beta1", "MachineSet")
MACHINE = ("machine.openshift.io/v1beta1", "Machine")
SCALED_BY_LABEL = "telltale.io/scaled-by-run"
ORIGINAL_ANNOTATION = "telltale.io/original-replicas"
SCALED_AT_ANNOTATION = "telltale.io/scaled-at"
SET_LABEL = "machine.openshift.io/cluster-api-machineset"
ROLE_LABEL = "machine.openshift.io/cluster-api-machine-role"
# where each cloud's provider spec names the machine's size
_INSTANCE_KEYS = ("instanceType", "machineType", "vmSize", "flavor")


class MachineSetUp(BaseModel):
    """What `bring_up` did: enough for cleanup to undo it."""

    name: str
    namespace: str
    role: str
    created: bool
    replicas: int
    original_replicas: int | None = None
    nodes: list[str] = []


def machineset_manifest(block: MachineSetBlock, role: Role, replicas: int,
                        source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The MachineSet to create: ``source`` (a worker MachineSet) renamed and resized.

    Without ``source`` (a plan), the provider spec holds only the instance type: the run
    takes the rest from the worker MachineSet it clones.
    """
    name = machineset_name(block, role)
    base = copy.deepcopy(dict(source)) if source is not None else {}
    spec = base.get("spec") or {}
    template = copy.deepcopy(spec.get("template") or {})
    selector_labels = dict((spec.get("selector") or {}).get("matchLabels") or {})
    selector_labels[SET_LABEL] = name
    template_meta = dict(template.get("metadata") or {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), SET_LABEL: name}
    machine_spec = dict(template.get("spec") or {})
    provider = dict((machine_spec.get("providerSpec") or {}).get("value") or {})
    if block.instance_type:
        key = next((k for k in _INSTANCE_KEYS if k in provider), "instanceType")
        provider[key] = block.instance_type
    machine_spec["providerSpec"] = {"value": provider}
    node_meta = dict(machine_spec.get("metadata") or {})
    node_meta["labels"] = {**(node_meta.get("labels") or {}), COMPUTE_LABEL: role}
    machine_spec["metadata"] = node_meta
    taint = taint_of(block, role)
    if taint is not None:
        machine_spec["taints"] = [t for t in machine_spec.get("taints") or []
                                  if t.get("key") != taint["key"]] + [taint]
    source_meta = base.get("metadata") or {}
    labels = {k: v for k, v in (source_meta.get("labels") or {}).items()
              if k not in (RUN_ID_LABEL, SCALED_BY_LABEL)}
    return {"apiVersion": MACHINESET[0], "kind": MACHINESET[1],
            "metadata": {"name": name, "namespace": block.namespace, "labels": labels,
                         "annotations": {"telltale.io/cloned-from": str(
                             source_meta.get("name") or block.source or
                             "the first worker MachineSet")}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector_labels},
                     "template": {"metadata": template_meta, "spec": machine_spec}}}


def _worker_source(kube: Kube, block: MachineSetBlock) -> dict[str, Any]:
    """The MachineSet to clone: ``block.source``, or the first worker MachineSet."""
    if block.source:
        found = kube.get(*MACHINESET, block.source, block.namespace)
        if found is None:
            raise ConfigError(f"MachineSet {block.namespace}/{block.source} does not exist",
                              key="clusters.*.compute.machineset.source")
        return found
    sets = sorted(kube.list(*MACHINESET, block.namespace), key=lambda o: o["metadata"]["name"])
    for candidate in sets:
        labels = (((candidate.get("spec") or {}).get("template") or {}).get("metadata")
                  or {}).get("labels") or {}
        if labels.get(ROLE_LABEL) == "worker" and not (candidate["metadata"].get("labels")
                                                       or {}).get(RUN_ID_LABEL):
            return candidate
    raise ConfigError(f"no worker MachineSet in {block.namespace} to clone: name one in "
                      "clusters.<role>.compute.machineset.source, or create the MachineSet "
                      "and give its name (it is then scaled)",
                      key="clusters.*.compute.machineset.source")


def _ready(node: Mapping[str, Any] | None) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((node or {}).get("status") or {}).get("conditions") or [])


def _machines(kube: Kube, name: str, namespace: str) -> list[dict[str, Any]]:
    return kube.list(*MACHINE, namespace, labels=f"{SET_LABEL}={name}")


def wait_nodes(kube: Kube, name: str, namespace: str, replicas: int, *, deadline_s: float,
               progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Wait until ``replicas`` Machines of the set have Ready nodes; returns their names.

    Raises:
        StepError: A Machine reached phase ``Failed`` (with the provider's message), or the
            deadline passed (saying how many were Ready).
    """
    deadline = time.monotonic() + deadline_s
    delay, seen = 1.0, -1
    while True:
        ready: list[str] = []
        for machine in _machines(kube, name, namespace):
            status = machine.get("status") or {}
            if status.get("phase") == "Failed":
                raise StepError(
                    f"Machine {machine['metadata']['name']} of MachineSet {name} failed: "
                    f"{status.get('errorReason') or ''} {status.get('errorMessage') or ''}"
                    .strip())
            node = (status.get("nodeRef") or {}).get("name")
            if node and _ready(kube.get("v1", "Node", node)):
                ready.append(node)
        if len(ready) != seen and progress is not None:
            progress(len(ready), replicas)
        seen = len(ready)
        if len(ready) >= replicas:
            return sorted(ready)[:replicas] if replicas else []
        if time.monotonic() >= deadline:
            raise StepError(f"MachineSet {name}: {len(ready)}/{replicas} nodes Ready after "
                            f"{deadline_s:g}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 15.0)


def _node_patch(node: Mapping[str, Any], role: str, taint: Mapping[str, str] | None,
                remove: bool) -> dict[str, Any]:
    """A merge-patch adding (or removing) the run's node label and taint."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or []
              if taint is None or t.get("key") != taint["key"]]
    if taint is not None and not remove:
        taints.append(dict(taint))
    return {"metadata": {"labels": {COMPUTE_LABEL: None if remove else role}},
            "spec": {"taints": taints}}


def _mark_nodes(kube: Kube, nodes: Sequence[str], role: str, block: MachineSetBlock) -> None:
    for name in nodes:
        node = kube.get("v1", "Node", name)
        if node is not None:
            kube.patch("v1", "Node", name, _node_patch(node, role, taint_of(block, role), False))


def per_node(allocatable: Mapping[str, Any], requests: Mapping[str, float]) -> int:
    """How many pods of ``requests`` one node's ``allocatable`` holds (0: none fits).

    Raises:
        ConfigError: The pod requests nothing a node counts (cpu, memory, extended resources).
    """
    limits = []
    for resource, wanted in requests.items():
        if wanted <= 0:
            continue
        have = quantity(allocatable.get(resource, 0))
        # quantities are decimal (``11m`` over ``1m``): a float quotient of 10.999… is 11
        limits.append(math.floor(have / wanted + 1e-9))
    if not limits:
        raise ConfigError("replicas auto: the pods request no cpu, memory or GPU, so a node's "
                          "capacity says nothing: set users_per_node",
                          key="clusters.*.compute.machineset.users_per_node")
    return min(limits)


def measure_fit(kube: Kube, name: str, namespace: str, requests: Mapping[str, float]) -> int:
    """Pods of ``requests`` one Ready node of the MachineSet holds (its allocatable).

    Raises:
        StepError: The set has no Ready node to measure.
    """
    for machine in _machines(kube, name, namespace):
        node_name = ((machine.get("status") or {}).get("nodeRef") or {}).get("name")
        node = kube.get("v1", "Node", node_name) if node_name else None
        if node is not None and _ready(node):
            return per_node((node.get("status") or {}).get("allocatable") or {}, requests)
    raise StepError(f"MachineSet {name}: no Ready node to measure for replicas auto")


def auto_replicas(pods: int, fits: int, block: MachineSetBlock) -> int:
    """Nodes for ``pods`` pods at ``fits`` per node, within ``max_replicas``.

    Raises:
        ConfigError: No pod fits a node, or more nodes than ``max_replicas`` are needed.
    """
    if fits < 1:
        raise ConfigError("replicas auto: one pod's requests exceed a node's allocatable on "
                          f"instance type {block.instance_type or '(the source)'}",
                          key="clusters.*.compute.machineset.instance_type")
    wanted = math.ceil(pods / fits)
    if wanted > block.max_replicas:
        raise ConfigError(f"replicas auto: {pods} pods at {fits} per node need {wanted} nodes, "
                          f"more than max_replicas {block.max_replicas}",
                          key="clusters.*.compute.machineset.max_replicas")
    return wanted


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bring_up(kube: Kube, block: MachineSetBlock, role: Role, run_id: str, *,
             replicas: int | Callable[[Kube, str], int],
             progress: Callable[[int, int], None] | None = None) -> MachineSetUp:
    """Scale (or clone and create) the role's MachineSet and wait for its nodes.

    Args:
        kube: Client labelling what it creates with the run id (a MachineSet it only
            scales is patched, not labelled as the run's).
        block: The role's MachineSet block.
        role: ``sutest`` or ``driver``.
        run_id: The run's id.
        replicas: A count, or a function of (client, MachineSet name) computing it once one
            node of the set can be measured (``replicas: auto``).
        progress: Called with (Ready nodes, wanted).

    Raises:
        StepError: A Machine failed, or the nodes were not Ready in time.
        ConfigError: Nothing to clone, or ``auto`` cannot be computed.
    """
    name = machineset_name(block, role)
    kube.require(*MACHINESET, block.namespace, what=f"clusters.{role}.compute.machineset",
                 key=f"clusters.{role}.compute.machineset.enabled")
    existing = kube.get(*MACHINESET, name, block.namespace)
    first = replicas if isinstance(replicas, int) else 1
    labels = (existing or {}).get("metadata", {}).get("labels") or {}
    created = existing is None or bool(labels.get(RUN_ID_LABEL))
    original: int | None = None
    if existing is None:
        kube.apply(machineset_manifest(block, role, first, _worker_source(kube, block)))
    elif created:  # a clone left by this run (resumed) or a dead one: this run's now
        kube.patch(*MACHINESET, name, {"metadata": {"labels": {RUN_ID_LABEL: run_id}},
                                       "spec": {"replicas": first}}, block.namespace)
    else:
        annotations = existing["metadata"].get("annotations") or {}
        # a set still marked by an earlier run keeps the count it had before that run
        original = int(annotations[ORIGINAL_ANNOTATION]) if labels.get(SCALED_BY_LABEL) \
            and ORIGINAL_ANNOTATION in annotations else \
            int((existing.get("spec") or {}).get("replicas") or 0)
        if not isinstance(replicas, int):
            first = max(first, original)  # measure on a node it already has
        kube.patch(*MACHINESET, name, {
            "metadata": {"labels": {SCALED_BY_LABEL: run_id},
                         "annotations": {ORIGINAL_ANNOTATION: str(original),
                                         SCALED_AT_ANNOTATION: _now()}},
            "spec": {"replicas": first}}, block.namespace)
    deadline_s = block.ready_minutes * 60.0
    nodes = wait_nodes(kube, name, block.namespace, first, deadline_s=deadline_s,
                       progress=progress)
    wanted = first
    if not isinstance(replicas, int):
        wanted = replicas(kube, name)
        if wanted != first:
            kube.patch(*MACHINESET, name, {"spec": {"replicas": wanted}}, block.namespace)
            nodes = wait_nodes(kube, name, block.namespace, wanted, deadline_s=deadline_s,
                               progress=progress)
    _mark_nodes(kube, nodes, role, block)
    logger.info("MachineSet %s/%s: %d node(s) Ready%s", block.namespace, name, len(nodes),
                f", tainted {block.taint.key}" if block.taint else "")
    return MachineSetUp(name=name, namespace=block.namespace, role=role, created=created,
                        replicas=wanted, original_replicas=original, nodes=nodes)


def give_back(kube: Kube, machineset: Mapping[str, Any]) -> str:
    """Undo a run's scaling of a MachineSet it did not create; says what it did.

    The set goes back to its recorded count; its remaining nodes lose the run's
    ``telltale.io/compute`` label and the taint carrying that role as its value. (A set the
    run created is deleted with the run's other objects: `tasks.kube.kinds`.)
    """
    meta = machineset["metadata"]
    name, namespace = meta["name"], meta.get("namespace")
    original = int((meta.get("annotations") or {}).get(ORIGINAL_ANNOTATION, 0))
    kube.patch(*MACHINESET, name, {
        "metadata": {"labels": {SCALED_BY_LABEL: None},
                     "annotations": {ORIGINAL_ANNOTATION: None, SCALED_AT_ANNOTATION: None}},
        "spec": {"replicas": original}}, namespace)
    for machine in _machines(kube, name, namespace or ""):
        node_name = ((machine.get("status") or {}).get("nodeRef") or {}).get("name")
        node = kube.get("v1", "Node", node_name) if node_name else None
        role = ((node or {}).get("metadata", {}).get("labels") or {}).get(COMPUTE_LABEL)
        if node is None or role is None:
            continue
        taint = next((t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("value") == role), None)
        kube.patch("v1", "Node", node_name, _node_patch(node, role, taint, True))
    return f"scaled MachineSet {namespace}/{name} back to {original}"


def give_back_run(kube: Kube, run_id: str, *, keep: bool = False) -> list[str]:
    """Cleanup of one run: every MachineSet it scaled, given back (or marked kept)."""
    done = []
    for machineset in kube.list_served(*MACHINESET, labels=f"{SCALED_BY_LABEL}={run_id}"):
        meta = machineset["metadata"]
        if keep:
            kube.patch(*MACHINESET, meta["name"], {"metadata": {"labels": {KEEP_LABEL: "true"}}},
                       meta.get("namespace"))
            done.append(f"kept MachineSet {meta.get('namespace')}/{meta['name']} scaled")
            continue
        done.append(give_back(kube, machineset))
    return done


def find_scaled_leaks(kube: Kube, older_than_s: float,
                      now: float | None = None) -> list[dict[str, Any]]:
    """MachineSets a run scaled (not kept) longer ago than ``older_than_s``."""
    now = time.time() if now is None else now
    leaks = []
    for machineset in kube.list_served(*MACHINESET, labels=f"{SCALED_BY_LABEL},!{KEEP_LABEL}"):
        stamp = (machineset["metadata"].get("annotations") or {}).get(SCALED_AT_ANNOTATION)
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp \
            else 0.0
        if now - when >= older_than_s:
            leaks.append(machineset)
    return leaks

