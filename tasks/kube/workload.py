"""A project's workload on a Kubernetes/OpenShift cluster, its capture and its cleanup.

Artifact layout (what the project parsers read, as on the local platform):

- ``*__cluster__capture_environment/``: ``nodes.json``, ``ocp_version.yml``,
  ``operators.json`` (CSV versions), ``prometheus.json`` (a snapshot, or why there is none);
- ``*__rhods__capture_state/``: ``rhods.version``, ``rhods.createdAt`` (when RHOAI is installed);
- ``*__<project>__<workload_step>/``: the project's input files (``src/config_final.json``),
  ``artifacts/pod.log``, ``artifacts/pod.json``, the captured objects (e.g.
  ``artifacts/pytorchjob.json``), ``manifests.json``.

Waits follow the workload's pod (for a PyTorchJob ``<job>-master-0``) through a
watch: first until it runs (image pull deadline), then until it ends; ImagePullBackOff,
ErrImagePull, CrashLoopBackOff and friends fail the step at once with the kubelet's message.
Shared infrastructure (the Namespace and the data PVC, reused by later runs so staging can be
skipped) is labelled ``managed-by=telltale`` but not with the run id, so run cleanup keeps it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from core.environment import env_settings
from core.errors import StepError
from core.safeio import write_json, write_text
from core.yamlio import dump_yaml
from projects.contract import KubeGate, KubeService, KubeWorkload, Staging
from tasks.artifacts import artifact_dir, step
from tasks.kube.api import KEEP_LABEL, MANAGED_BY, RUN_ID_LABEL, Kube, api_client
from tasks.kube.images import BUILD_CONFIG, forget_output
from tasks.kube.kinds import cleanup_kinds
from tasks.kube.machinesets import give_back_run

__all__ = [
    "FAIL_FAST",
    "KEEP_LABEL",
    "capture_environment",
    "capture_state",
    "cleanup_cluster",
    "cleanup_k8s",
    "find_leaks",
    "pod_failure",
    "remove_object",
    "run_kube_workload",
    "start_service",
]

logger = logging.getLogger("telltale.k8s")

FAIL_FAST = {"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "InvalidImageName",
             "CreateContainerConfigError", "CreateContainerError"}


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
    """Capture nodes, the OpenShift version, operator CSV versions (and where Prometheus is)."""
    kube = Kube(api_client(kubeconfig))
    here = artifact_dir()
    nodes = kube.list("v1", "Node")
    write_json(here / "nodes.json", {"apiVersion": "v1", "kind": "List", "items": nodes})
    version = kube.get("config.openshift.io/v1", "ClusterVersion", "version")
    ocp = ((version or {}).get("status") or {}).get("desired", {}).get("version")
    write_text(here / "ocp_version.yml", dump_yaml({"openshiftVersion": ocp}))
    csvs = {c["metadata"]["name"]: {"namespace": c["metadata"].get("namespace"),
                                    "version": (c.get("spec") or {}).get("version"),
                                    "phase": (c.get("status") or {}).get("phase")}
            for c in kube.list("operators.coreos.com/v1alpha1", "ClusterServiceVersion")}
    write_json(here / "operators.json", csvs)
    # where Telltale itself ran: the image a worker or pod runs (Containerfile), if any
    write_json(here / "runner.json", {"telltale_image": env_settings().image})
    write_json(here / "prometheus.json", {
        "url": prometheus_url,
        "note": "each cell's window is in its *__observe__capture_prometheus/prometheus/ "
                "(range queries saved as Parquet)" if prometheus_url else
                "observe.prometheus.url is not set: no resource series"})
    return {"nodes": len(nodes), "ocp_version": ocp, "operators": len(csvs)}


@step("rhods", timeout_seconds=120)
def capture_state(kubeconfig: str | None) -> dict[str, Any]:
    """Record the RHOAI operator's version and creation date (absent: recorded as such)."""
    kube = Kube(api_client(kubeconfig))
    here = artifact_dir()
    csv = next((c for c in kube.list("operators.coreos.com/v1alpha1", "ClusterServiceVersion")
                if c["metadata"]["name"].startswith("rhods-operator")), None)
    if csv is None:
        write_text(here / "absent", "RHOAI (rhods-operator CSV) is not installed\n")
        return {"installed": False}
    write_text(here / "rhods.version", f"{csv['spec'].get('version')}\n")
    write_text(here / "rhods.createdAt", f"{csv['metadata'].get('creationTimestamp')}\n")
    return {"installed": True, "version": csv["spec"].get("version")}


def run_kube_workload(kube: Kube, shared: Kube, workload: KubeWorkload, namespace: str, *,
                      here: Path, image_pull_deadline_s: float,
                      timeout_s: float) -> tuple[int, str, float, bool]:
    """Apply a project's `KubeWorkload`, follow its pod to the end, capture its artifacts.

    Shared objects are applied without the run label (they outlive the run); staging runs
    only when the volume's label says something else was staged; the pod is followed through
    a watch (image-pull deadline, then the run deadline) with fail-fast on
    ImagePullBackOff, CrashLoopBackOff and friends.

    Args:
        kube: Client labelling objects with the run id.
        shared: Client applying shared objects (no run label).
        workload: What to apply and follow.
        namespace: The workload's namespace.
        here: The step dir (``artifacts/`` and ``manifests.json`` land there).
        image_pull_deadline_s: Deadline for the pod to start.
        timeout_s: Deadline for the pod to end.

    Returns:
        (exit code, finish reason, duration in seconds, whether data was staged).

    Raises:
        StepError: A fail-fast state or a deadline, with the kubelet's reason.
    """
    (here / "artifacts").mkdir(exist_ok=True)
    write_json(here / "manifests.json", workload.all_manifests())
    for relative, text in workload.files.items():
        target = here / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, text)
    started = time.monotonic()
    for manifest in workload.shared:
        shared.apply(manifest)
    staged = False
    if workload.staging is not None:
        staged = _stage(kube, shared, workload.staging, namespace)
    for manifest in workload.manifests:
        kube.apply(manifest)
    pod: dict[str, Any] | None = None
    name = workload.pod
    try:
        for gate in workload.gates:
            _wait_gate(kube, gate, namespace)
        for manifest in workload.after:
            kube.apply(manifest)
        if workload.pod_selector:  # a Job's pod: its name is the Job controller's choice
            name = _find_pod(kube, namespace, workload.pod_selector, image_pull_deadline_s)
        kube.wait("v1", "Pod", name, namespace, fail=pod_failure,
                  ready=lambda o: (o.get("status") or {}).get("phase") in (
                      "Running", "Succeeded", "Failed"),
                  deadline_s=image_pull_deadline_s, what=f"pod {name} (image pull)")
        pod = kube.wait("v1", "Pod", name, namespace, fail=pod_failure,
                        ready=lambda o: (o.get("status") or {}).get("phase") in (
                            "Succeeded", "Failed"),
                        deadline_s=timeout_s, what=f"workload pod {name}")
    finally:
        _capture(kube, here, namespace, workload, pod, name)
    terminated = _terminated(pod or {})
    code = int(terminated.get("exitCode", 0 if (pod or {}).get("status", {}).get("phase") ==
                              "Succeeded" else 1))
    reason = str(terminated.get("reason") or (pod or {}).get("status", {}).get("phase"))
    return code, reason, time.monotonic() - started, staged


def start_service(kube: Kube, shared: Kube, service: KubeService, namespace: str) -> None:
    """Apply a fan-out's shared service and wait for its gates (fail fast, as a cell's).

    Args:
        kube: Client labelling objects with the run id (cleanup removes them).
        shared: Client applying shared objects (no run label).
        service: What to apply and wait on.
        namespace: Its namespace.

    Raises:
        StepError: A gate failed (a terminal model state, a failing pod) or timed out.
    """
    for manifest in service.shared:
        shared.apply(manifest)
    for manifest in service.manifests:
        kube.apply(manifest)
    for gate in service.gates:
        _wait_gate(kube, gate, namespace)


def _ready_condition(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"), {})


# A model that cannot load says so in the InferenceService's model status (KServe).
_TERMINAL_MODEL_STATES = {"InvalidSpec", "BlockedByFailedLoad", "FailedToLoad"}


def _gate_failure(kube: Kube, gate: KubeGate, namespace: str,
                  obj: dict[str, Any]) -> str | None:
    status = obj.get("status") or {}
    model = status.get("modelStatus") or {}
    if model.get("transitionStatus") in _TERMINAL_MODEL_STATES:
        failure = model.get("lastFailureInfo") or {}
        return (f"{model['transitionStatus']}: {failure.get('reason', '')} "
                f"{failure.get('message', '')}").strip()
    if gate.pods:
        for pod in kube.list("v1", "Pod", namespace, labels=gate.pods):
            reason = pod_failure(pod)
            if reason:
                return f"pod {pod['metadata']['name']}: {reason}"
    return None


def _wait_gate(kube: Kube, gate: KubeGate, namespace: str) -> None:
    """Wait for the gate's ``Ready`` condition; fail fast, or say its last condition."""
    last: dict[str, Any] = {}
    failures: list[str] = []

    def seen(obj: dict[str, Any]) -> None:
        last.update(_ready_condition(obj))

    def failure(obj: dict[str, Any]) -> str | None:
        reason = _gate_failure(kube, gate, namespace, obj)
        if reason:
            failures.append(reason)
        return reason

    try:
        kube.wait(gate.api_version, gate.kind, gate.name, namespace,
                  ready=lambda o: _ready_condition(o).get("status") == "True",
                  fail=failure, deadline_s=gate.deadline_s, what=f"{gate.kind} {gate.name}",
                  progress=seen)
    except StepError as exc:
        if last.get("message") and not failures:  # the deadline: say what it last said
            raise StepError(f"{exc}; its Ready condition: {last.get('reason', '')} "
                            f"{last['message']}".strip()) from exc
        raise


def _stage(kube: Kube, shared: Kube, staging: Staging, namespace: str) -> bool:
    """Run the staging Job unless the volume already holds the same data (by label)."""
    volume = staging.volume
    wanted = (volume["metadata"].get("labels") or {}).get(staging.label)
    existing = shared.get("v1", "PersistentVolumeClaim", volume["metadata"]["name"], namespace)
    if existing is not None and (existing["metadata"].get("labels") or {}).get(
            staging.label) == wanted:
        return False
    shared.apply(volume)
    kube.apply(staging.job)
    job = kube.wait("batch/v1", "Job", staging.job["metadata"]["name"], namespace,
                    ready=lambda o: any(c.get("type") == "Complete" and
                                        c.get("status") == "True" for c in
                                        (o.get("status") or {}).get("conditions") or []),
                    fail=lambda o: next((f"staging failed: {c.get('message', '')}" for c in
                                         (o.get("status") or {}).get("conditions") or []
                                         if c.get("type") == "Failed" and
                                         c.get("status") == "True"), None),
                    deadline_s=3600, what="data staging job")
    return job is not None


def _find_pod(kube: Kube, namespace: str, selector: str, deadline_s: float) -> str:
    """The name of the (first) pod matching ``selector``, once its controller created it."""
    deadline = time.monotonic() + deadline_s
    delay = 0.2
    while True:
        pods = kube.list("v1", "Pod", namespace, labels=selector)
        if pods:
            return str(sorted(p["metadata"]["name"] for p in pods)[0])
        if time.monotonic() >= deadline:
            raise StepError(f"no pod matching {selector} after {deadline_s:g}s")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _capture(kube: Kube, here: Path, namespace: str, workload: KubeWorkload,
             pod: dict[str, Any] | None, name: str) -> None:
    """Best effort: whatever exists is saved, even when the wait failed."""
    try:
        current = pod or (kube.get("v1", "Pod", name, namespace) if name else None)
        if current is not None:
            write_json(here / "artifacts" / "pod.json", current)
            try:
                write_text(here / "artifacts" / "pod.log", kube.pod_log(name, namespace))
            except Exception as exc:  # a pod that never started has no log
                write_text(here / "artifacts" / "pod.log.unavailable", f"{exc}\n")
        for api_version, kind, obj_name, file in workload.capture:
            obj = kube.get(api_version, kind, obj_name, namespace)
            if obj is not None:
                write_json(here / "artifacts" / Path(file).name, obj)
    except Exception as exc:
        logger.warning("capture of %s incomplete: %s", name or workload.pod_selector, exc)


def remove_object(kube: Kube, api_version: str, kind: str, name: str,
                  namespace: str | None) -> bool:
    """Delete one run object with its dependents, and what it wrote outside them.

    A BuildConfig's output ImageStreamTag is not its dependent (the registry keeps it): it
    is deleted first. False when the object was already gone.
    """
    if (api_version, kind) == BUILD_CONFIG:
        found = kube.get(api_version, kind, name, namespace)
        if found is not None:
            forget_output(kube, found)
    return kube.delete(api_version, kind, name, namespace)


def cleanup_cluster(kubeconfig: str | None, run_id: str, *, keep: bool = False,
                    dry_run: bool = False) -> list[str]:
    """Delete every object labelled with ``run_id`` (dependents too); returns what went.

    ``keep`` leaves everything in place and labels it ``telltale.io/keep=true`` so the leak
    janitor leaves it alone too. Shared objects (Namespace, PVC) are never labelled with a run
    id, so they survive for the next run. A MachineSet the run only scaled is scaled back
    (`tasks.kube.machinesets.give_back_run`); one it created is deleted like its other
    objects, after them.
    """
    kube = Kube(api_client(kubeconfig))
    removed: list[str] = []
    for declared in cleanup_kinds():  # dependents first (`Kind.cleanup`)
        api_version, kind = declared.api_version, declared.kind
        for obj in kube.list_served(api_version, kind, labels=f"{RUN_ID_LABEL}={run_id}"):
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
                remove_object(kube, api_version, kind, meta["name"], meta.get("namespace"))
            removed.append(label)
    if not dry_run:
        removed += give_back_run(kube, run_id, keep=keep)
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
    for declared in cleanup_kinds():
        api_version, kind = declared.api_version, declared.kind
        for obj in kube.list_served(api_version, kind, labels=selector):
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
