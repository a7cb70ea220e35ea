"""Operators through OLM: a generic install, then RHOAI, NFD and the NVIDIA GPU operator.

Install = (optional CatalogSource) → OperatorGroup → Subscription (manual InstallPlan
approval when a version is pinned) → CSV phase ``Succeeded`` → the operator's CR ready
(``DataScienceCluster``, ``NodeFeatureDiscovery``, ``ClusterPolicy`` and its DaemonSets).
Every install first checks `is_installed` (at the wanted version): re-running on a prepared
cluster writes nothing. Shared cluster objects are applied without the run-id label (they
outlive the run); `uninstall` removes what `install` created when cleanup asks for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from core.errors import StepError
from projects.library import GpuOperatorBlock, NfdBlock, PrepareBlock, RhoaiBlock
from tasks.kube.api import Kube

__all__ = [
    "GPU_OPERATOR",
    "NFD",
    "OperatorSpec",
    "RHOAI",
    "SERVICE_MESH",
    "cluster_policy",
    "datasciencecluster",
    "install",
    "is_installed",
    "nfd_instance",
    "operator_manifests",
    "prepare_gpu",
    "prepare_manifests",
    "prepare_rhoai",
    "uninstall",
]

logger = logging.getLogger("telltale.olm")
_SUB = ("operators.coreos.com/v1alpha1", "Subscription")
_CSV = ("operators.coreos.com/v1alpha1", "ClusterServiceVersion")
_PLAN = ("operators.coreos.com/v1alpha1", "InstallPlan")


class OperatorSpec(BaseModel):
    """One OLM-installed operator."""

    package: str = Field(description="Package name in the catalog.")
    namespace: str = Field(description="Namespace of the Subscription (and the operator).")
    channel: str = Field(default="stable", description="OLM channel.")
    source: str = Field(default="redhat-operators", description="CatalogSource name.")
    source_namespace: str = Field(default="openshift-marketplace",
                                  description="CatalogSource namespace.")
    version: str | None = Field(default=None,
                                description="Pinned CSV name (``<package>.v<x.y.z>``).")
    all_namespaces: bool = Field(default=True,
                                 description="OperatorGroup targets every namespace.")
    catalog_image: str | None = Field(default=None, description="Custom catalog image.")

    @property
    def approval(self) -> Literal["Automatic", "Manual"]:
        """Manual when pinned: OLM must not upgrade past the pinned CSV."""
        return "Manual" if self.version else "Automatic"


SERVICE_MESH = OperatorSpec(package="servicemeshoperator", namespace="openshift-operators")
RHOAI = OperatorSpec(package="rhods-operator", namespace="redhat-ods-operator")
NFD = OperatorSpec(package="nfd", namespace="openshift-nfd", all_namespaces=False)
GPU_OPERATOR = OperatorSpec(package="gpu-operator-certified", namespace="nvidia-gpu-operator",
                            source="certified-operators", all_namespaces=False)


def operator_manifests(spec: OperatorSpec) -> list[dict[str, Any]]:
    """Namespace, (CatalogSource,) OperatorGroup and Subscription of an operator."""
    source, source_ns = spec.source, spec.source_namespace
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": spec.namespace}}]
    if spec.catalog_image:
        source = f"{spec.package}-catalog"
        out.append({"apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
                    "metadata": {"name": source, "namespace": source_ns},
                    "spec": {"sourceType": "grpc", "image": spec.catalog_image,
                             "displayName": f"{spec.package} (telltale)"}})
    if spec.namespace != "openshift-operators":  # that one ships its global OperatorGroup
        group: dict[str, Any] = {"apiVersion": "operators.coreos.com/v1", "kind": "OperatorGroup",
                                 "metadata": {"name": f"{spec.package}-group",
                                              "namespace": spec.namespace}, "spec": {}}
        if not spec.all_namespaces:
            group["spec"]["targetNamespaces"] = [spec.namespace]
        out.append(group)
    subscription: dict[str, Any] = {
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
        "metadata": {"name": spec.package, "namespace": spec.namespace},
        "spec": {"name": spec.package, "channel": spec.channel, "source": source,
                 "sourceNamespace": source_ns, "installPlanApproval": spec.approval}}
    if spec.version:
        subscription["spec"]["startingCSV"] = spec.version
    out.append(subscription)
    return out


def _installed_csv(kube: Kube, spec: OperatorSpec) -> dict[str, Any] | None:
    sub = kube.get(*_SUB, spec.package, spec.namespace)
    name = ((sub or {}).get("status") or {}).get("installedCSV")
    return kube.get(*_CSV, name, spec.namespace) if name else None


def is_installed(kube: Kube, spec: OperatorSpec) -> bool:
    """True when the operator's CSV is ``Succeeded`` (at the pinned version, when pinned)."""
    csv = _installed_csv(kube, spec)
    if csv is None or (csv.get("status") or {}).get("phase") != "Succeeded":
        return False
    return spec.version is None or csv["metadata"]["name"] == spec.version


def install(kube: Kube, spec: OperatorSpec, *, deadline_s: float = 1200) -> dict[str, Any]:
    """Install (or confirm) an operator; returns its CSV.

    Raises:
        StepError: The CSV failed, or the deadline passed (with the last state).
    """
    if is_installed(kube, spec):
        logger.info("%s already installed: nothing to do", spec.package)
        csv = _installed_csv(kube, spec)
        assert csv is not None
        return csv
    for manifest in operator_manifests(spec):
        kube.apply(manifest)
    if spec.approval == "Manual":
        sub = kube.wait(*_SUB, spec.package, spec.namespace, deadline_s=deadline_s,
                        ready=lambda o: bool(((o.get("status") or {}).get("installPlanRef")
                                              or {}).get("name")),
                        what=f"install plan of {spec.package}")
        plan = sub["status"]["installPlanRef"]["name"]
        kube.apply({"apiVersion": _PLAN[0], "kind": _PLAN[1],
                    "metadata": {"name": plan, "namespace": spec.namespace},
                    "spec": {"approved": True}})
        logger.info("approved install plan %s for %s", plan, spec.version)
    sub = kube.wait(*_SUB, spec.package, spec.namespace, deadline_s=deadline_s,
                    ready=lambda o: bool((o.get("status") or {}).get("currentCSV")),
                    what=f"subscription {spec.package}")
    csv_name = sub["status"]["currentCSV"]
    return kube.wait(*_CSV, csv_name, spec.namespace, deadline_s=deadline_s,
                     ready=lambda o: (o.get("status") or {}).get("phase") == "Succeeded",
                     fail=lambda o: (f"CSV phase Failed: {o['status'].get('message', '')}"
                                     if (o.get("status") or {}).get("phase") == "Failed"
                                     else None),
                     what=f"operator {csv_name}")


def uninstall(kube: Kube, spec: OperatorSpec) -> list[str]:
    """Remove the Subscription and the CSV it installed (the namespace stays)."""
    removed = []
    csv = _installed_csv(kube, spec)
    if kube.delete(*_SUB, spec.package, spec.namespace):
        removed.append(f"Subscription/{spec.package}")
    if csv is not None and kube.delete(*_CSV, csv["metadata"]["name"], spec.namespace):
        removed.append(f"ClusterServiceVersion/{csv['metadata']['name']}")
    return removed


def cluster_policy(block: GpuOperatorBlock) -> list[dict[str, Any]]:
    """The GPU operator's ClusterPolicy (and its time-sharing ConfigMap when asked)."""
    namespace = GPU_OPERATOR.namespace
    spec: dict[str, Any] = {
        "operator": {"defaultRuntime": "crio"},
        "driver": {"enabled": True}, "toolkit": {"enabled": True},
        "devicePlugin": {"enabled": True}, "gfd": {"enabled": True},
        "dcgm": {"enabled": True}, "dcgmExporter": {"enabled": True},
        "nodeStatusExporter": {"enabled": True},
        "daemonsets": {"tolerations": list(block.tolerations)},
    }
    out: list[dict[str, Any]] = []
    replicas = block.time_sharing_replicas
    if replicas:
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "time-slicing-config", "namespace": namespace},
                    "data": {"any": ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                     f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n")}})
        spec["devicePlugin"]["config"] = {"name": "time-slicing-config", "default": "any"}
    if block.extended_dcgm_metrics:
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "dcgm-extended-metrics", "namespace": namespace},
                    "data": {"dcgm-metrics.csv": (
                        "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics "
                        "engine is active.\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of "
                        "cycles the tensor pipe is active.\nDCGM_FI_DEV_FB_USED, gauge, "
                        "Framebuffer memory used (in MiB).\n")}})
        spec["dcgmExporter"]["config"] = {"name": "dcgm-extended-metrics"}
    out.append({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                "metadata": {"name": "gpu-cluster-policy"}, "spec": spec})
    return out


def nfd_instance() -> dict[str, Any]:
    """The NodeFeatureDiscovery CR that starts NFD's workers."""
    return {"apiVersion": "nfd.openshift.io/v1", "kind": "NodeFeatureDiscovery",
            "metadata": {"name": "nfd-instance", "namespace": NFD.namespace},
            "spec": {"operand": {"servicePort": 12000}}}


def datasciencecluster(block: RhoaiBlock) -> dict[str, Any]:
    """RHOAI's DataScienceCluster with the wanted components Managed, the others Removed."""
    wanted = set(block.components)
    components = {name: {"managementState": "Managed" if name in wanted else "Removed"}
                  for name in sorted(wanted | {"dashboard", "trainingoperator",
                                               "workbenches", "kserve"})}
    return {"apiVersion": "datasciencecluster.opendatahub.io/v1",
            "kind": "DataScienceCluster", "metadata": {"name": "default-dsc"},
            "spec": {"components": components}}


def _rhoai_spec(block: RhoaiBlock) -> OperatorSpec:
    return RHOAI.model_copy(update={"channel": block.channel, "version": block.version,
                                    "catalog_image": block.catalog_image})


def _nfd_spec(nfd: NfdBlock) -> OperatorSpec:
    return NFD.model_copy(update={"channel": nfd.channel})


def _gpu_spec(block: GpuOperatorBlock) -> OperatorSpec:
    return GPU_OPERATOR.model_copy(update={"channel": block.channel, "version": block.version})


def prepare_manifests(prepare: PrepareBlock) -> list[dict[str, Any]]:
    """Everything the prepare phase would apply for a ``prepare`` block (for ``--plan``).

    Pure: the same builders the install uses, in install order (service mesh, RHOAI and
    its DataScienceCluster; NFD and its instance; the GPU operator and its ClusterPolicy).
    """
    if not prepare.enabled:
        return []
    out: list[dict[str, Any]] = []
    rhoai = prepare.rhoai
    if rhoai.enabled:
        out += operator_manifests(SERVICE_MESH) + operator_manifests(_rhoai_spec(rhoai))
        out.append(datasciencecluster(rhoai))
    gpu, nfd = prepare.gpu_operator, prepare.nfd
    if gpu.enabled:
        if nfd.enabled:
            out += operator_manifests(_nfd_spec(nfd)) + [nfd_instance()]
        out += operator_manifests(_gpu_spec(gpu)) + cluster_policy(gpu)
    return out


def _ready_daemonsets(kube: Kube, namespace: str) -> bool:
    sets = kube.list("apps/v1", "DaemonSet", namespace)
    return bool(sets) and all(
        (d.get("status") or {}).get("numberAvailable", 0) >=
        (d.get("status") or {}).get("desiredNumberScheduled", 1) for d in sets)


def prepare_gpu(kube: Kube, block: GpuOperatorBlock, nfd: NfdBlock, *,
                deadline_s: float = 1800) -> dict[str, Any]:
    """NFD + NodeFeatureDiscovery, then the GPU operator + ClusterPolicy + ready DaemonSets."""
    if nfd.enabled:
        install(kube, _nfd_spec(nfd), deadline_s=deadline_s)
        kube.apply(nfd_instance())
    csv = install(kube, _gpu_spec(block), deadline_s=deadline_s)
    for manifest in cluster_policy(block):
        kube.apply(manifest)
    kube.wait("nvidia.com/v1", "ClusterPolicy", "gpu-cluster-policy", deadline_s=deadline_s,
              ready=lambda o: (o.get("status") or {}).get("state") == "ready",
              what="GPU ClusterPolicy")
    started = time.monotonic()
    while not _ready_daemonsets(kube, GPU_OPERATOR.namespace):
        if time.monotonic() - started > deadline_s:
            raise StepError("GPU operator DaemonSets not available before the deadline")
        time.sleep(1)
    return {"csv": csv["metadata"]["name"]}


def prepare_rhoai(kube: Kube, block: RhoaiBlock, *,
                  deadline_s: float = 1800) -> dict[str, Any]:
    """Service mesh, then RHOAI, then a DataScienceCluster with the wanted components Ready."""
    install(kube, SERVICE_MESH, deadline_s=deadline_s)
    csv = install(kube, _rhoai_spec(block), deadline_s=deadline_s)
    kube.apply(datasciencecluster(block))
    kube.wait("datasciencecluster.opendatahub.io/v1", "DataScienceCluster", "default-dsc",
              deadline_s=deadline_s, what="DataScienceCluster",
              ready=lambda o: (o.get("status") or {}).get("phase") == "Ready")
    return {"csv": csv["metadata"]["name"]}
