"""The fine-tuning workload on a Kubernetes/OpenShift cluster, its capture and its cleanup.

Artifact layout (what the fine_tuning parser reads, as on the local platform):

- ``*__cluster__capture_environment/``: ``nodes.json``, ``ocp_version.yml``,
  ``operators.json`` (CSV versions), ``prometheus.json`` (a snapshot, or why there is none);
- ``*__rhods__capture_state/``: ``rhods.version``, ``rhods.createdAt`` (when RHOAI is installed);
- ``*__fine_tuning__run_fine_tuning_job/``: ``src/config_final.json``, ``artifacts/pod.log``,
  ``artifacts/pod.json``, ``artifacts/pytorchjob.json``, ``manifests.json``.

Waits follow the master pod (``<job>-master-0``, the training operator's naming) through a
watch: first until it runs (image pull deadline), then until it ends; ImagePullBackOff,
ErrImagePull, CrashLoopBackOff and friends fail the step at once with the kubelet's message.
Shared infrastructure (the Namespace and the data PVC, reused by later runs so staging can be
skipped) is labelled ``managed-by=telltale`` but not with the run id, so run cleanup keeps it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel

from analysis.yamlio import dump_yaml
from projects.fine_tuning.manifests import DATA_SOURCE_LABEL, cell_manifests
from tasks.artifacts import artifact_dir, step, write_json
from tasks.k8s import MANAGED_BY, RUN_ID_LABEL, Kube, api_client

__all__ = [
    "CLEANUP_KINDS",
    "FAIL_FAST",
    "KEEP_LABEL",
    "K8sWorkloadOutcome",
    "capture_environment",
    "capture_state",
    "cleanup_cluster",
    "cleanup_k8s",
    "find_leaks",
    "pod_failure",
    "run_fine_tuning_job",
]

logger = logging.getLogger("telltale.k8s")

FAIL_FAST = {"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "InvalidImageName",
             "CreateContainerConfigError", "CreateContainerError"}
# Kinds a run creates, deleted (by run-id label) in cleanup, dependents first.
KEEP_LABEL = "telltale.io/keep"
CLEANUP_KINDS = [("kubeflow.org/v1", "PyTorchJob"), ("batch/v1", "Job"), ("v1", "Pod"),
                 ("v1", "ConfigMap")]


class K8sWorkloadOutcome(BaseModel):
    """How the cluster workload ended."""

    exit_code: int
    finish_reason: str
    duration_s: float
    job: str
    staged: bool


def pod_failure(pod: dict[str, Any]) -> str | None:
    """The reason a pod can no longer succeed (a fail-fast waiting reason), or None."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + \
            (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAIL_FAST:
            return f"{waiting['reason']}: {waiting.get('message', '').strip()}".rstrip(": ")
    return None


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return {}


@step("cluster", timeout_seconds=300)
def capture_environment(kubeconfig: str | None,
                        prometheus_url: str | None = None) -> dict[str, Any]:
    """Capture nodes, the OpenShift version, operator CSV versions (and note Prometheus)."""
    kube = Kube(api_client(kubeconfig))
    here = artifact_dir()
    nodes = kube.list("v1", "Node")
    write_json(here / "nodes.json", {"apiVersion": "v1", "kind": "List", "items": nodes})
    version = kube.get("config.openshift.io/v1", "ClusterVersion", "version")
    ocp = ((version or {}).get("status") or {}).get("desired", {}).get("version")
    (here / "ocp_version.yml").write_text(dump_yaml({"openshiftVersion": ocp}),
                                          encoding="utf-8")
    csvs = {c["metadata"]["name"]: {"namespace": c["metadata"].get("namespace"),
                                    "version": (c.get("spec") or {}).get("version"),
                                    "phase": (c.get("status") or {}).get("phase")}
            for c in kube.list("operators.coreos.com/v1alpha1", "ClusterServiceVersion")}
    write_json(here / "operators.json", csvs)
    write_json(here / "prometheus.json", {
        "captured": False,
        "reason": "tests.fine_tuning.kubernetes.prometheus_url is not set" if not
        prometheus_url else "Prometheus snapshots are not implemented yet"})
    return {"nodes": len(nodes), "ocp_version": ocp, "operators": len(csvs)}


@step("rhods", timeout_seconds=120)
def capture_state(kubeconfig: str | None) -> dict[str, Any]:
    """Record the RHOAI operator's version and creation date (absent: recorded as such)."""
    kube = Kube(api_client(kubeconfig))
    here = artifact_dir()
    csv = next((c for c in kube.list("operators.coreos.com/v1alpha1", "ClusterServiceVersion")
                if c["metadata"]["name"].startswith("rhods-operator")), None)
    if csv is None:
        (here / "absent").write_text("RHOAI (rhods-operator CSV) is not installed\n")
        return {"installed": False}
    (here / "rhods.version").write_text(f"{csv['spec'].get('version')}\n")
    (here / "rhods.createdAt").write_text(f"{csv['metadata'].get('creationTimestamp')}\n")
    return {"installed": True, "version": csv["spec"].get("version")}


@step("fine_tuning")
def run_fine_tuning_job(kubeconfig: str | None, run_id: str, namespace: str,
                            settings: dict[str, Any], cell_index: int, block: dict[str, Any],
                            timeout_minutes: int, poll_hint_s: float = 0) -> K8sWorkloadOutcome:
    """Run one cell as a PyTorchJob and capture its artifacts.

    Args:
        kubeconfig: Kubeconfig path (``in-cluster`` inside a pod).
        run_id: Labels every object of this run.
        namespace: Target namespace.
        settings: The cell's settings.
        cell_index: Names the job.
        block: ``tests.fine_tuning.kubernetes``.
        timeout_minutes: Deadline of the training.
        poll_hint_s: Unused on real clusters (kept for API symmetry with local).

    Returns:
        The outcome (a failed training is an outcome: exit code and reason).

    Raises:
        StepError: A fail-fast state (ImagePullBackOff...) or a deadline, with the reason.
    """
    here = artifact_dir()
    (here / "src").mkdir(exist_ok=True)
    (here / "artifacts").mkdir(exist_ok=True)
    manifests = cell_manifests(settings, namespace=namespace, block=block,
                               cell_index=cell_index)
    write_json(here / "manifests.json", manifests)
    ns_obj, pvc, staging, configmap, pytorchjob = manifests
    shared, kube = Kube(api_client(kubeconfig)), Kube(api_client(kubeconfig), run_id)
    started = time.monotonic()
    shared.apply(ns_obj)
    existing = shared.get("v1", "PersistentVolumeClaim", pvc["metadata"]["name"], namespace)
    source = pvc["metadata"]["labels"][DATA_SOURCE_LABEL]
    staged = False
    if existing is None or (existing["metadata"].get("labels") or {}).get(
            DATA_SOURCE_LABEL) != source:
        shared.apply(pvc)
        kube.apply(staging)
        job = kube.wait("batch/v1", "Job", staging["metadata"]["name"], namespace,
                        ready=lambda o: any(c.get("type") == "Complete" and
                                            c.get("status") == "True" for c in
                                            (o.get("status") or {}).get("conditions") or []),
                        fail=lambda o: next((f"staging failed: {c.get('message', '')}" for c in
                                             (o.get("status") or {}).get("conditions") or []
                                             if c.get("type") == "Failed" and
                                             c.get("status") == "True"), None),
                        deadline_s=3600, what="data staging job")
        staged = job is not None
    (here / "src" / "config_final.json").write_text(configmap["data"]["config.json"] + "\n")
    kube.apply(configmap)
    name = pytorchjob["metadata"]["name"]
    kube.apply(pytorchjob)
    master = f"{name}-master-0"
    pod: dict[str, Any] | None = None
    try:
        kube.wait("v1", "Pod", master, namespace, fail=pod_failure,
                  ready=lambda o: (o.get("status") or {}).get("phase") in (
                      "Running", "Succeeded", "Failed"),
                  deadline_s=block["image_pull_deadline_minutes"] * 60,
                  what=f"pod {master} (image pull)")
        pod = kube.wait("v1", "Pod", master, namespace, fail=pod_failure,
                        ready=lambda o: (o.get("status") or {}).get("phase") in (
                            "Succeeded", "Failed"),
                        deadline_s=timeout_minutes * 60, what=f"training pod {master}")
    finally:
        _capture_job(kube, here, namespace, name, master, pod)
    terminated = _terminated(pod or {})
    code = int(terminated.get("exitCode", 0 if (pod or {}).get("status", {}).get("phase") ==
                              "Succeeded" else 1))
    reason = str(terminated.get("reason") or (pod or {}).get("status", {}).get("phase"))
    return K8sWorkloadOutcome(exit_code=code, finish_reason=reason,
                              duration_s=time.monotonic() - started, job=name, staged=staged)


def _capture_job(kube: Kube, here: Any, namespace: str, name: str, master: str,
                 pod: dict[str, Any] | None) -> None:
    """Best effort: whatever exists is saved, even when the wait failed."""
    try:
        current = pod or kube.get("v1", "Pod", master, namespace)
        if current is not None:
            write_json(here / "artifacts" / "pod.json", current)
            try:
                (here / "artifacts" / "pod.log").write_text(kube.pod_log(master, namespace),
                                                            encoding="utf-8")
            except Exception as exc:  # a pod that never started has no log
                (here / "artifacts" / "pod.log.unavailable").write_text(f"{exc}\n")
        job = kube.get("kubeflow.org/v1", "PyTorchJob", name, namespace)
        if job is not None:
            write_json(here / "artifacts" / "pytorchjob.json", job)
    except Exception as exc:
        logger.warning("capture of %s incomplete: %s", name, exc)


def cleanup_cluster(kubeconfig: str | None, run_id: str, *, keep: bool = False,
                    dry_run: bool = False) -> list[str]:
    """Delete every object labelled with ``run_id`` (dependents too); returns what went.

    ``keep`` leaves everything in place and labels it ``telltale.io/keep=true`` so the leak
    janitor leaves it alone too. Shared objects (Namespace, PVC) are never labelled with a run
    id, so they survive for the next run.
    """
    kube = Kube(api_client(kubeconfig))
    removed: list[str] = []
    for api_version, kind in CLEANUP_KINDS:
        for obj in kube.list(api_version, kind, labels=f"{RUN_ID_LABEL}={run_id}"):
            meta = obj["metadata"]
            label = f"{kind}/{meta.get('namespace', '')}/{meta['name']}"
            if keep:
                marked = {"name": meta["name"], "labels": {KEEP_LABEL: "true"}}
                if meta.get("namespace"):
                    marked["namespace"] = meta["namespace"]
                kube.apply({"apiVersion": api_version, "kind": kind, "metadata": marked})
                logger.info("keeping %s (clusters.keep)", label)
                continue
            if not dry_run:
                kube.delete(api_version, kind, meta["name"], meta.get("namespace"))
            removed.append(label)
    return removed


def find_leaks(kubeconfig: str | None, older_than_s: float,
               now: float | None = None) -> list[tuple[str, str, str, str | None, str]]:
    """Objects of any run (not kept) older than ``older_than_s``.

    Returns:
        ``(api_version, kind, name, namespace, run id)`` for each leak.
    """
    from datetime import datetime

    kube = Kube(api_client(kubeconfig))
    now = time.time() if now is None else now
    selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]},{RUN_ID_LABEL},!{KEEP_LABEL}"
    leaks = []
    for api_version, kind in CLEANUP_KINDS:
        for obj in kube.list(api_version, kind, labels=selector):
            meta = obj["metadata"]
            created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
            if now - created.timestamp() >= older_than_s:
                leaks.append((api_version, kind, meta["name"], meta.get("namespace"),
                              meta["labels"][RUN_ID_LABEL]))
    return leaks


@step("cleanup", timeout_seconds=600)
def cleanup_k8s(kubeconfig: str | None, run_id: str, keep: bool) -> list[str]:
    """Cleanup phase on a cluster (see `cleanup_cluster`)."""
    removed = cleanup_cluster(kubeconfig, run_id, keep=keep)
    if removed:
        logger.info("deleted %d object(s) of run %s", len(removed), run_id)
    return removed
