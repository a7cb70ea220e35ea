"""Every Kubernetes kind Telltale touches: the engine's own and those projects declare.

The engine declares here the kinds it uses itself (the fan-out's S3, operators through OLM,
the capture of cluster state, cluster creation on a Hive hub); each project declares the
kinds it brings in `Project.kube_kinds`. `all_kinds` joins them: the API client's REST
mapping, the cleanup order (`cleanup_kinds`) and the generated RBAC
(``python -m deployments.rbac``) all read it, so a kind is declared once.
"""

from __future__ import annotations

import functools

from projects.library.kinds import APPLY, MANAGE, READ, Kind

__all__ = ["ENGINE_KINDS", "all_kinds", "cleanup_kinds", "kind_of"]

ENGINE_KINDS: tuple[Kind, ...] = (
    Kind("v1", "Namespace", "namespaces", False, APPLY),
    Kind("v1", "Node", "nodes", False, (*READ, "patch")),  # a MachineSet's: label, taint
    Kind("v1", "Pod", "pods", True, MANAGE, cleanup=30, subresources=(("log", ("get",)),)),
    Kind("v1", "ConfigMap", "configmaps", True, MANAGE, cleanup=40),
    Kind("v1", "Secret", "secrets", True, APPLY),  # the in-cluster S3's credentials
    Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, APPLY),
    Kind("v1", "Service", "services", True, APPLY),  # the in-cluster S3
    Kind("batch/v1", "Job", "jobs", True, MANAGE, cleanup=20),
    Kind("apps/v1", "Deployment", "deployments", True, APPLY),  # the in-cluster S3
    Kind("apps/v1", "DaemonSet", "daemonsets", True, READ),  # the GPU operator's readiness
    Kind("operators.coreos.com/v1alpha1", "Subscription", "subscriptions", True, MANAGE),
    Kind("operators.coreos.com/v1alpha1", "ClusterServiceVersion", "clusterserviceversions",
         True, (*READ, "delete")),
    Kind("operators.coreos.com/v1alpha1", "InstallPlan", "installplans", True,
         (*READ, "patch")),  # approved by a merge-patch
    Kind("operators.coreos.com/v1alpha1", "CatalogSource", "catalogsources", True, APPLY),
    Kind("operators.coreos.com/v1", "OperatorGroup", "operatorgroups", True, APPLY),
    Kind("datasciencecluster.opendatahub.io/v1", "DataScienceCluster", "datascienceclusters",
         False, APPLY),
    Kind("nvidia.com/v1", "ClusterPolicy", "clusterpolicies", False, APPLY),
    Kind("nfd.openshift.io/v1", "NodeFeatureDiscovery", "nodefeaturediscoveries", True, APPLY),
    Kind("config.openshift.io/v1", "ClusterVersion", "clusterversions", False, ("get",)),
    # nodes of the run's own (clusters.<role>.compute.machineset): a clone is deleted with
    # the run (its Machines and nodes go with it); a scaled one is scaled back
    Kind("machine.openshift.io/v1beta1", "MachineSet", "machinesets", True, MANAGE,
         cleanup=90),
    Kind("machine.openshift.io/v1beta1", "Machine", "machines", True, READ),
    # Telltale's image built from the PR under test (tasks.kube.images)
    Kind("image.openshift.io/v1", "ImageStream", "imagestreams", True, APPLY),
    Kind("image.openshift.io/v1", "ImageStreamTag", "imagestreamtags", True,
         ("get", "delete")),
    Kind("build.openshift.io/v1", "BuildConfig", "buildconfigs", True, MANAGE, cleanup=8,
         subresources=(("instantiate", ("create",)),)),
    Kind("build.openshift.io/v1", "Build", "builds", True, (*READ, "delete"), cleanup=7,
         subresources=(("log", ("get",)),)),
    # on the Hive hub that creates clusters (its own kubeconfig)
    Kind("hive.openshift.io/v1", "ClusterClaim", "clusterclaims", True, MANAGE),
    Kind("hive.openshift.io/v1", "ClusterDeployment", "clusterdeployments", True, READ),
)


@functools.cache
def all_kinds() -> dict[tuple[str, str], Kind]:
    """``(apiVersion, kind)`` → `Kind`: the engine's and every registered project's.

    Raises:
        ValueError: Two declarations of one kind disagree.
    """
    from projects.registry import available, load

    table: dict[tuple[str, str], Kind] = {}
    declared = [*ENGINE_KINDS]
    for name in available():
        declared += load(name).kube_kinds
    for kind in declared:
        key = (kind.api_version, kind.kind)
        if key in table and table[key] != kind:
            raise ValueError(f"{kind.api_version}/{kind.kind} is declared twice, differently")
        table[key] = kind
    return table


def kind_of(api_version: str, kind: str) -> Kind | None:
    """The declaration of a kind, or None when nothing declares it."""
    return all_kinds().get((api_version, kind))


def cleanup_kinds() -> list[Kind]:
    """The kinds a run's cleanup and the leak janitor delete by run label, in order."""
    return sorted((k for k in all_kinds().values() if k.cleanup is not None),
                  key=lambda k: (k.cleanup, k.api_version, k.kind))
