"""OpenShift controllers for the Kubernetes test server: the Machine API and the build API.

`MachineController` does what the machine-api operator and a cloud do: each MachineSet gets
``spec.replicas`` Machines (owned by it, labelled from its template); a Machine provisions
into a Ready Node (instance type from the provider spec, labels and taints from the
template, the allocatable the test gives) — or, in the ``fail`` scenario, ends in phase
``Failed`` with the provider's message. Scaling down deletes the newest Machines and their
nodes. `BuildController` walks each Build New → Running → Complete (an ImageStreamTag with
a digest, a log) or → Failed. Timings are tens of milliseconds; tests wait on state.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from tests.servers.fake_operators import Controller
from tests.servers.kubernetes import KubeState

MS = "machine.openshift.io/v1beta1"
SET_LABEL = "machine.openshift.io/cluster-api-machineset"
CAPACITY_ERROR = ("error launching instance: We currently do not have sufficient g5.12xlarge "
                  "capacity in the Availability Zone you requested (us-east-2a). "
                  "(InsufficientInstanceCapacity)")


def seed_machine_api(state: KubeState, *, workers: int = 2,
                     instance_type: str = "m6i.2xlarge") -> None:
    """The openshift-machine-api namespace and one worker MachineSet (AWS provider spec)."""
    state.put({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "openshift-machine-api"}})
    name = "ci-worker-us-east-2a"
    state.put({"apiVersion": MS, "kind": "MachineSet", "metadata": {
        "name": name, "namespace": "openshift-machine-api",
        "labels": {"machine.openshift.io/cluster-api-cluster": "ci"}},
        "spec": {"replicas": workers,
                 "selector": {"matchLabels": {"machine.openshift.io/cluster-api-cluster": "ci",
                                              SET_LABEL: name}},
                 "template": {
                     "metadata": {"labels": {
                         "machine.openshift.io/cluster-api-cluster": "ci",
                         "machine.openshift.io/cluster-api-machine-role": "worker",
                         "machine.openshift.io/cluster-api-machine-type": "worker",
                         SET_LABEL: name}},
                     "spec": {"metadata": {},
                              "providerSpec": {"value": {
                                  "apiVersion": "machine.openshift.io/v1beta1",
                                  "kind": "AWSMachineProviderConfig",
                                  "instanceType": instance_type,
                                  "ami": {"id": "ami-0123456789"},
                                  "placement": {"region": "us-east-2",
                                                "availabilityZone": "us-east-2a"}}}}}}})


class MachineController(Controller):
    """MachineSets → Machines → Ready Nodes (see the module docstring)."""

    def __init__(self, state: KubeState, scenario: Literal["success", "fail"] = "success",
                 allocatable: dict[str, str] | None = None) -> None:
        super().__init__(state)
        self.scenario = scenario
        self.allocatable = allocatable or {"cpu": "7500m", "memory": "30Gi", "pods": "250"}
        self.serial = 0

    def run(self) -> None:
        while not self.stopped.wait(0.03):
            for machineset in self.state.list(MS, "MachineSet"):
                self._reconcile(machineset)
            for machine in self.state.list(MS, "Machine"):
                self._provision(machine)

    def _reconcile(self, machineset: dict[str, Any]) -> None:
        meta = machineset["metadata"]
        ns, name = meta["namespace"], meta["name"]
        owned = sorted((m for m in self.state.list(MS, "Machine")
                        if (m["metadata"].get("labels") or {}).get(SET_LABEL) == name),
                       key=lambda m: m["metadata"]["creationTimestamp"] + m["metadata"]["name"])
        wanted = int(machineset["spec"].get("replicas") or 0)
        template = machineset["spec"]["template"]
        for _ in range(wanted - len(owned)):
            self.serial += 1
            self.state.put({"apiVersion": MS, "kind": "Machine", "metadata": {
                "name": f"{name}-{self.serial:05d}", "namespace": ns,
                "labels": dict(template["metadata"].get("labels") or {}),
                "ownerReferences": [{"apiVersion": MS, "kind": "MachineSet", "name": name,
                                     "uid": meta["uid"]}]},
                "spec": template["spec"], "status": {"phase": "Provisioning"}})
        for machine in owned[wanted:][::-1] if wanted < len(owned) else []:
            key = self.state.key_of(self._resource("Machine"), ns, machine["metadata"]["name"])
            self.state.delete_key(key, "Foreground")

    def _resource(self, kind: str) -> Any:
        from tests.servers.kubernetes import _BY_KIND

        return _BY_KIND[(MS, kind)] if kind == "Machine" else _BY_KIND[("v1", kind)]

    def _provision(self, machine: dict[str, Any]) -> None:
        meta, status = machine["metadata"], machine.get("status") or {}
        if status.get("phase") != "Provisioning":
            return
        if self.scenario == "fail":
            self.state.set_status(MS, "Machine", meta["name"], {
                "phase": "Failed", "errorReason": "InvalidConfiguration",
                "errorMessage": CAPACITY_ERROR}, meta["namespace"])
            return
        spec = machine.get("spec") or {}
        node = f"ip-10-0-{self.serial}-{meta['name'][-5:]}.ec2.internal"
        instance = ((spec.get("providerSpec") or {}).get("value") or {}).get("instanceType")
        self.state.put({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node,
            "labels": {"node.kubernetes.io/instance-type": str(instance),
                       "node-role.kubernetes.io/worker": "",
                       **((spec.get("metadata") or {}).get("labels") or {})},
            "ownerReferences": [{"apiVersion": MS, "kind": "Machine", "name": meta["name"],
                                 "uid": meta["uid"]}]},
            "spec": {"taints": list(spec.get("taints") or [])},
            "status": {"allocatable": dict(self.allocatable), "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
        self.state.set_status(MS, "Machine", meta["name"], {
            "phase": "Running", "nodeRef": {"kind": "Node", "name": node}}, meta["namespace"])


class BuildController(Controller):
    """Builds: New → Running → Complete (image digest, ImageStreamTag, log) or → Failed."""

    def __init__(self, state: KubeState, scenario: Literal["success", "fail"] = "success"
                 ) -> None:
        super().__init__(state)
        self.scenario = scenario

    def run(self) -> None:
        while not self.stopped.wait(0.03):
            for build in self.state.list("build.openshift.io/v1", "Build"):
                self._step(build)

    def _step(self, build: dict[str, Any]) -> None:
        meta, status = build["metadata"], dict(build.get("status") or {})
        ns, name = meta["namespace"], meta["name"]
        phase = status.get("phase")
        if phase == "New":
            status["phase"] = "Running"
            self.state.set_log(ns, name, "STEP 1/9: FROM docker.io/library/python:3.11.7\n")
        elif phase == "Running" and self.scenario == "fail":
            self.state.set_log(ns, name, "STEP 7/9: RUN pip install --requirement "
                               "requirements.lock\nERROR: No matching distribution found for "
                               "torch==2.13.0\nerror: build error: building at STEP \"RUN pip "
                               "install\": exit status 1\n")
            status.update(phase="Failed", reason="DockerBuildFailed",
                          message="Docker build strategy has failed.",
                          logSnippet="error: build error: exit status 1")
        elif phase == "Running":
            to = build["spec"]["output"]["to"]["name"]
            stream, tag = to.split(":", 1)
            digest = "sha256:" + hashlib.sha256(f"{ns}/{name}".encode()).hexdigest()
            reference = f"image-registry.openshift-image-registry.svc:5000/{ns}/{stream}:{tag}"
            self.state.put({"apiVersion": "image.openshift.io/v1", "kind": "ImageStreamTag",
                            "metadata": {"name": to, "namespace": ns},
                            "image": {"metadata": {"name": digest},
                                      "dockerImageReference":
                                          f"{reference.rsplit(':', 1)[0]}@{digest}"}})
            self.state.set_log(ns, name, "STEP 9/9: ENTRYPOINT\nPush successful\n")
            status.update(phase="Complete", outputDockerImageReference=reference,
                          output={"to": {"imageDigest": digest}})
        else:
            return
        self.state.set_status("build.openshift.io/v1", "Build", name, status, ns)
