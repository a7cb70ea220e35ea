"""Controllers for the Kubernetes test server: what the training operator and kubelet do.

`TrainingOperator` watches the server's state (in-process) and, for each PyTorchJob, creates
the master pod (owned by the job, labelled like the real operator does), then walks it through
ContainerCreating → Running → Succeeded with a trainer log, or into ImagePullBackOff; staging
Jobs complete. The test decides the scenario; timings are a few hundred milliseconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

from tests.factories import train_log
from tests.servers.kubernetes import KubeState

Scenario = Literal["success", "image_pull_backoff", "crash"]


def seed_cluster(state: KubeState, *, ocp: str = "4.16.3", rhoai: str | None = "2.13.0") -> None:
    """Nodes with GPU labels, the OpenShift ClusterVersion, and (optionally) RHOAI's CSV."""
    state.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-worker-0", "labels": {
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8"}}})
    state.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "master-0", "labels": {
        "node.kubernetes.io/instance-type": "m6i.2xlarge"}}})
    state.put({"apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion",
               "metadata": {"name": "version"}, "spec": {},
               "status": {"desired": {"version": ocp}}})
    if rhoai:
        state.put({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "redhat-ods-operator"}})
        state.put({"apiVersion": "operators.coreos.com/v1alpha1",
                   "kind": "ClusterServiceVersion",
                   "metadata": {"name": f"rhods-operator.{rhoai}",
                                "namespace": "redhat-ods-operator"},
                   "spec": {"version": rhoai}, "status": {"phase": "Succeeded"}})


class TrainingOperator(threading.Thread):
    """Drives PyTorchJobs and Jobs to completion (or failure) on the test server."""

    def __init__(self, state: KubeState, scenario: Scenario = "success",
                 tokens_per_second: float = 2500.0, step_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.state = state
        self.scenario = scenario
        self.tokens_per_second = tokens_per_second
        self.step_s = step_s
        self.stopped = threading.Event()
        self.handled: set[str] = set()

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for job in self.state.list("batch/v1", "Job"):
                if not job.get("status"):
                    self.state.set_status("batch/v1", "Job", job["metadata"]["name"], {
                        "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
                        job["metadata"]["namespace"])
            for job in self.state.list("kubeflow.org/v1", "PyTorchJob"):
                uid = job["metadata"]["uid"]
                if uid not in self.handled:
                    self.handled.add(uid)
                    threading.Thread(target=self._drive, args=(job,), daemon=True).start()

    def _pod_status(self, phase: str, **state: Any) -> dict[str, Any]:
        return {"phase": phase, "containerStatuses": [{"name": "pytorch", "state": state}]}

    def _drive(self, job: dict[str, Any]) -> None:
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        pod = f"{name}-master-0"
        self.state.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": pod, "namespace": ns,
            "labels": {"training.kubeflow.org/job-name": name,
                       "training.kubeflow.org/replica-type": "master"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                 "name": name, "uid": job["metadata"]["uid"]}]},
            "spec": job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]})
        steps: list[tuple[str, dict[str, Any]]] = [
            ("Pending", {"waiting": {"reason": "ContainerCreating"}})]
        if self.scenario == "image_pull_backoff":
            steps.append(("Pending", {"waiting": {"reason": "ImagePullBackOff", "message":
                          f'Back-off pulling image "{self._image(job)}"'}}))
        elif self.scenario == "crash":
            steps += [("Running", {"running": {}}),
                      ("Pending", {"waiting": {"reason": "CrashLoopBackOff",
                                               "message": "back-off restarting failed"}})]
        else:
            steps += [("Running", {"running": {}}),
                      ("Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed"}})]
        for phase, state in steps:
            time.sleep(self.step_s)
            if self.stopped.is_set() or self.state.get("v1", "Pod", pod, ns) is None:
                return
            if phase == "Succeeded":
                self.state.set_log(ns, pod, train_log(tokens_per_second=self.tokens_per_second,
                                                      runtime=30.0, generation=4,
                                                      noise_lines=200))
            self.state.set_status("v1", "Pod", pod, self._pod_status(phase, **state), ns)
        if self.scenario == "success":
            self.state.set_status("kubeflow.org/v1", "PyTorchJob", name, {"conditions": [
                {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded"}]}, ns)

    @staticmethod
    def _image(job: dict[str, Any]) -> str:
        return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
            "containers"][0]["image"]
