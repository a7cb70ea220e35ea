"""Controllers for the Kubernetes test server: what the training operator and kubelet do.

`TrainingOperator` watches the server's state (in-process) and, for each PyTorchJob, creates
the master pod (owned by the job, labelled like the real operator does), then walks it through
ContainerCreating → Running → Succeeded with a trainer log, or into ImagePullBackOff; staging
Jobs complete. The test decides the scenario; timings are a few hundred milliseconds.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Literal

from tasks.kube.users import PROGRAM_DIR, PROGRAM_IN_IMAGE, SCRIPT
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


class Controller(threading.Thread):
    """A reconcile loop on the test server's state, stopped by the test."""

    def __init__(self, state: KubeState) -> None:
        super().__init__(daemon=True)
        self.state = state
        self.stopped = threading.Event()
        self.handled: set[str] = set()

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)


class TrainingOperator(Controller):
    """Drives PyTorchJobs and (non-indexed) Jobs to completion or failure on the test server."""

    def __init__(self, state: KubeState, scenario: Scenario = "success",
                 tokens_per_second: float = 2500.0, step_s: float = 0.2) -> None:
        super().__init__(state)
        self.scenario = scenario
        self.tokens_per_second = tokens_per_second
        self.step_s = step_s

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for job in self.state.list("batch/v1", "Job"):
                indexed = (job.get("spec") or {}).get("completionMode") == "Indexed"
                if not job.get("status") and not indexed:
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


class OlmController(Controller):
    """What OLM and the operators do: Subscription → (InstallPlan) → CSV Succeeded; operator
    CRs become ready; the GPU operator's DaemonSets become available."""

    def __init__(self, state: KubeState, *, fail_package: str | None = None) -> None:
        super().__init__(state)
        self.fail_package = fail_package

    def _csv(self, sub: dict[str, Any]) -> str:
        return sub["spec"].get("startingCSV") or f"{sub['spec']['name']}.v1.0.0"

    def _install(self, sub: dict[str, Any]) -> None:
        ns, csv = sub["metadata"]["namespace"], self._csv(sub)
        failed = sub["spec"]["name"] == self.fail_package
        self.state.put({"apiVersion": "operators.coreos.com/v1alpha1",
                        "kind": "ClusterServiceVersion",
                        "metadata": {"name": csv, "namespace": ns},
                        "spec": {"version": csv.split(".v", 1)[-1]},
                        "status": {"phase": "Failed" if failed else "Succeeded",
                                   "message": "install strategy failed" if failed else ""}})
        self.state.set_status("operators.coreos.com/v1alpha1", "Subscription",
                              sub["metadata"]["name"], {**(sub.get("status") or {}),
                              "currentCSV": csv, "installedCSV": csv,
                              "state": "AtLatestKnown"}, ns)

    def run(self) -> None:  # noqa: C901 (one reconcile loop for a few kinds)
        while not self.stopped.wait(0.05):
            for sub in self.state.list("operators.coreos.com/v1alpha1", "Subscription"):
                status, ns = sub.get("status") or {}, sub["metadata"]["namespace"]
                if status.get("installedCSV"):
                    continue
                if sub["spec"].get("installPlanApproval") == "Manual":
                    if not status.get("installPlanRef"):
                        plan = f"install-{sub['metadata']['name'][:5]}"
                        self.state.put({"apiVersion": "operators.coreos.com/v1alpha1",
                                        "kind": "InstallPlan",
                                        "metadata": {"name": plan, "namespace": ns},
                                        "spec": {"approved": False, "approval": "Manual",
                                                 "clusterServiceVersionNames": [self._csv(sub)]}})
                        self.state.set_status("operators.coreos.com/v1alpha1", "Subscription",
                                              sub["metadata"]["name"], {
                                                  "installPlanRef": {"name": plan},
                                                  "state": "UpgradePending"}, ns)
                    else:
                        plan = self.state.get("operators.coreos.com/v1alpha1", "InstallPlan",
                                              status["installPlanRef"]["name"], ns)
                        if plan and plan["spec"].get("approved"):
                            self._install(sub)
                else:
                    self._install(sub)
            for dsc in self.state.list("datasciencecluster.opendatahub.io/v1",
                                       "DataScienceCluster"):
                if not dsc.get("status"):
                    self.state.set_status("datasciencecluster.opendatahub.io/v1",
                                          "DataScienceCluster", dsc["metadata"]["name"],
                                          {"phase": "Ready"})
            for policy in self.state.list("nvidia.com/v1", "ClusterPolicy"):
                if not policy.get("status"):
                    for name in ("nvidia-driver-daemonset", "nvidia-device-plugin-daemonset"):
                        self.state.put({"apiVersion": "apps/v1", "kind": "DaemonSet",
                                        "metadata": {"name": name,
                                                     "namespace": "nvidia-gpu-operator"},
                                        "spec": {}, "status": {"desiredNumberScheduled": 1,
                                                               "numberAvailable": 1}})
                    self.state.set_status("nvidia.com/v1", "ClusterPolicy",
                                          policy["metadata"]["name"], {"state": "ready"})


class IndexedJobController(Controller):
    """The Job controller and kubelet for Indexed Jobs: one pod per index, each running the
    pod's real command locally (``python3`` → this interpreter) with the pod's environment and
    ``JOB_COMPLETION_INDEX``, then the Job's counters and conditions as Kubernetes sets them."""

    def __init__(self, state: KubeState, script_dir: str) -> None:
        super().__init__(state)
        self.script_dir = script_dir  # where the ConfigMap's files are "mounted"
        self.program_images: list[str] = []  # the images user programs were copied from

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for job in self.state.list("batch/v1", "Job"):
                spec = job.get("spec") or {}
                if spec.get("completionMode") != "Indexed":
                    continue
                if job["metadata"]["uid"] not in self.handled:
                    self.handled.add(job["metadata"]["uid"])
                    threading.Thread(target=self._drive, args=(job,), daemon=True).start()

    def _mount(self, job: dict[str, Any]) -> None:
        import os

        ns = job["metadata"]["namespace"]
        for volume in job["spec"]["template"]["spec"].get("volumes", []):
            name = (volume.get("configMap") or {}).get("name")
            configmap = self.state.get("v1", "ConfigMap", name, ns) if name else None
            for filename, text in ((configmap or {}).get("data") or {}).items():
                with open(os.path.join(self.script_dir, filename), "w") as stream:
                    stream.write(text)

    def _init_containers(self, job: dict[str, Any]) -> str:
        """Telltale's program init container: the ``user-pod`` image built from this tree
        holds ``tasks/kube/user_pod_script.py`` (the Containerfile); a copy is what the
        pods then run. Its image must be pinned by digest, as a PR build gives it."""
        import os
        import shutil

        target = os.path.join(self.script_dir, "program")
        for init in job["spec"]["template"]["spec"].get("initContainers") or []:
            if init.get("command", [""])[0] != "cp" or init["command"][1] != PROGRAM_IN_IMAGE:
                continue
            assert "@sha256:" in init["image"], f"unpinned program image {init['image']}"
            os.makedirs(target, exist_ok=True)
            shutil.copy(SCRIPT, init["command"][2].replace(PROGRAM_DIR, target))
            self.program_images.append(init["image"])
        return target

    def _drive(self, job: dict[str, Any]) -> None:
        import os
        import subprocess
        import sys

        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        users = int(job["spec"]["completions"])
        self._mount(job)
        program_dir = self._init_containers(job)
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env", [])}}
        argv = [sys.executable if a == "python3" else a.replace(
            "/etc/telltale-users", self.script_dir).replace(PROGRAM_DIR, program_dir)
            for a in container["command"]]
        counts = {"active": 0, "succeeded": 0, "failed": 0}
        lock = threading.Lock()

        def pod(index: int) -> None:
            pod_name = f"{name}-{index}"
            self.state.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod_name, "namespace": ns,
                "labels": {"job-name": name, "batch.kubernetes.io/job-completion-index":
                           str(index)},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": job["metadata"]["uid"]}]},
                "spec": job["spec"]["template"]["spec"], "status": {"phase": "Running"}})
            with lock:
                counts["active"] += 1
                self._publish(name, ns, counts)
            done = subprocess.run(argv, env={**env, "JOB_COMPLETION_INDEX": str(index)},
                                  capture_output=True, check=False)
            if self.state.get("batch/v1", "Job", name, ns) is None:
                return  # deleted (aborted)
            self.state.set_log(ns, pod_name, done.stdout.decode(errors="replace"))
            self.state.set_status("v1", "Pod", pod_name, {
                "phase": "Succeeded" if done.returncode == 0 else "Failed"}, ns)
            with lock:
                counts["active"] -= 1
                counts["succeeded" if done.returncode == 0 else "failed"] += 1
                self._publish(name, ns, counts)

        threads = [threading.Thread(target=pod, args=(i,), daemon=True) for i in range(users)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.state.get("batch/v1", "Job", name, ns) is not None:
            condition = "Complete" if counts["failed"] == 0 else "Failed"
            self._publish(name, ns, counts, condition)

    def _publish(self, name: str, ns: str, counts: dict[str, int],
                 condition: str | None = None) -> None:
        if self.state.get("batch/v1", "Job", name, ns) is None:
            return
        status: dict[str, Any] = dict(counts)
        if condition:
            status["conditions"] = [{"type": condition, "status": "True"}]
        self.state.set_status("batch/v1", "Job", name, status, ns)


ServingScenario = Literal["success", "crash"]
RECORDED_GUIDELLM = Path(__file__).resolve().parent.parent / "data" / "guidellm_light.json"
"""A result written by the real GuideLLM 0.8.1 against the local vLLM (requests trimmed)."""


class KServeController(Controller):
    """What KServe and the kubelet do with an InferenceService and the load Pod after it.

    ``success``: a predictor pod runs and the InferenceService turns Ready; the load Job's pod
    then "runs" and its log is what ``workload/load.py`` prints for a recorded real GuideLLM
    result. ``crash``: the predictor pod lands in CrashLoopBackOff and the InferenceService
    stays not Ready.
    """

    def __init__(self, state: KubeState, scenario: ServingScenario = "success",
                 step_s: float = 0.2) -> None:
        super().__init__(state)
        self.scenario = scenario
        self.step_s = step_s

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for isvc in self.state.list("serving.kserve.io/v1beta1", "InferenceService"):
                if isvc["metadata"]["uid"] not in self.handled:
                    self.handled.add(isvc["metadata"]["uid"])
                    threading.Thread(target=self._serve, args=(isvc,), daemon=True).start()
            for job in self.state.list("batch/v1", "Job"):
                if job["metadata"]["name"].endswith("-load") and \
                        job["metadata"]["uid"] not in self.handled:
                    self.handled.add(job["metadata"]["uid"])
                    threading.Thread(target=self._load, args=(job,), daemon=True).start()

    def _serve(self, isvc: dict[str, Any]) -> None:
        name, ns = isvc["metadata"]["name"], isvc["metadata"]["namespace"]
        pod = f"{name}-predictor-00001-deployment-6d9f"
        self.state.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": pod, "namespace": ns,
            "labels": {"serving.kserve.io/inferenceservice": name, "component": "predictor"}},
            "spec": {"containers": [{"name": "kserve-container", "image": "vllm"}]}})
        time.sleep(self.step_s)
        if self.scenario == "crash":
            self.state.set_status("v1", "Pod", pod, {"phase": "Running", "containerStatuses": [
                {"name": "kserve-container", "state": {"waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": "back-off 40s restarting failed container=kserve-container"}}}]},
                ns)
            self.state.set_status("serving.kserve.io/v1beta1", "InferenceService", name, {
                "conditions": [{"type": "Ready", "status": "False",
                                "reason": "RevisionMissing",
                                "message": "Revision failed: container exited"}]}, ns)
            return
        self.state.set_status("v1", "Pod", pod, {"phase": "Running", "containerStatuses": [
            {"name": "kserve-container", "state": {"running": {}}, "ready": True}]}, ns)
        self.state.set_status("serving.kserve.io/v1beta1", "InferenceService", name, {
            "url": f"http://{name}-predictor.{ns}.svc.cluster.local:8080",
            "modelStatus": {"transitionStatus": "UpToDate"},
            "conditions": [{"type": "PredictorReady", "status": "True"},
                           {"type": "Ready", "status": "True"}]}, ns)

    def _load(self, job: dict[str, Any]) -> None:
        import json

        from projects.llm_serving.workload.load import compact_result

        job_name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        name = f"{job_name}-x7k2q"  # the Job controller's generated suffix
        self.state.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": ns,
            "labels": {"job-name": job_name, "batch.kubernetes.io/job-name": job_name},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                 "uid": job["metadata"]["uid"]}]},
            "spec": job["spec"]["template"]["spec"]})
        time.sleep(self.step_s)
        self.state.set_status("v1", "Pod", name, {"phase": "Running", "containerStatuses": [
            {"name": "load", "state": {"running": {}}}]}, ns)
        benchmark = json.loads(RECORDED_GUIDELLM.read_text())["benchmarks"][0]
        totals = benchmark["metrics"]["request_totals"]
        self.state.set_log(ns, name, "\n".join([
            "$ guidellm run --backend kind=openai_http,...",
            json.dumps({"event": "guidellm", "benchmark": compact_result(benchmark)}),
            json.dumps({"event": "summary", "successful": totals["successful"],
                        "errored": totals["errored"], "warnings": [], "exit_code": 0})]) + "\n")
        time.sleep(self.step_s)
        self.state.set_status("v1", "Pod", name, {"phase": "Succeeded", "containerStatuses": [
            {"name": "load", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
            ns)
        self.state.set_status("batch/v1", "Job", job_name, {
            "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}, ns)
