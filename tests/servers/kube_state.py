"""The realistic Kubernetes API server's store: its resources, objects, selectors and patches.

`KubeState` holds the objects by (apiVersion, kind, namespace, name) with resource versions
and watch events; label and field selectors, merge and JSON patches follow the API's rules.
The HTTP side is `tests.servers.kubernetes`.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Resource:
    """One resource type: where it lives and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = [Resource(*r) for r in [
    ("", "v1", "namespaces", "Namespace", False),
    ("", "v1", "nodes", "Node", False),
    ("", "v1", "pods", "Pod", True),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "secrets", "Secret", True),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ("", "v1", "services", "Service", True),
    ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "events", "Event", True),
    ("batch", "v1", "jobs", "Job", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("apps", "v1", "daemonsets", "DaemonSet", True),
    ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", True),
    ("serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService", True),
    ("serving.kserve.io", "v1alpha1", "servingruntimes", "ServingRuntime", True),
    ("operators.coreos.com", "v1alpha1", "subscriptions", "Subscription", True),
    ("operators.coreos.com", "v1alpha1", "clusterserviceversions", "ClusterServiceVersion",
     True),
    ("operators.coreos.com", "v1alpha1", "installplans", "InstallPlan", True),
    ("operators.coreos.com", "v1alpha1", "catalogsources", "CatalogSource", True),
    ("operators.coreos.com", "v1", "operatorgroups", "OperatorGroup", True),
    ("datasciencecluster.opendatahub.io", "v1", "datascienceclusters", "DataScienceCluster",
     False),
    ("nvidia.com", "v1", "clusterpolicies", "ClusterPolicy", False),
    ("nfd.openshift.io", "v1", "nodefeaturediscoveries", "NodeFeatureDiscovery", True),
    ("config.openshift.io", "v1", "clusterversions", "ClusterVersion", False),
    ("hive.openshift.io", "v1", "clusterclaims", "ClusterClaim", True),
    ("hive.openshift.io", "v1", "clusterdeployments", "ClusterDeployment", True),
    ("machine.openshift.io", "v1beta1", "machinesets", "MachineSet", True),
    ("machine.openshift.io", "v1beta1", "machines", "Machine", True),
    ("image.openshift.io", "v1", "imagestreams", "ImageStream", True),
    ("image.openshift.io", "v1", "imagestreamtags", "ImageStreamTag", True),
    ("build.openshift.io", "v1", "buildconfigs", "BuildConfig", True),
    ("build.openshift.io", "v1", "builds", "Build", True),
]]
_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}

Key = tuple[str, str, str, str, str]  # group, version, plural, namespace, name


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code, "details": details or {}}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if op["op"] == "add":
                    parent.insert(index, op["value"])
                else:
                    parent[index] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError(f"unsupported JSON patch op {op['op']}")
    return doc


_SEL = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p for p in [*parts, current] if p.strip()]


def label_matches(labels: dict[str, str], selector: str) -> bool:
    """Evaluate a Kubernetes label selector string."""
    for term in _split_selector(selector):
        match = _SEL.match(term)
        if match is None:
            raise ValueError(f"unable to parse requirement: {term!r}")
        negate, key, op, value, set_op, values = match.groups()
        if set_op:
            options = {v.strip() for v in values.split(",")}
            ok = (labels.get(key) in options) if set_op == "in" else (
                key not in labels or labels[key] not in options)
        elif op in ("=", "=="):
            ok = labels.get(key) == value
        elif op == "!=":
            ok = labels.get(key) != value
        else:
            ok = (key in labels) != bool(negate)
        if not ok:
            return False
    return True


def _field(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def field_matches(obj: dict[str, Any], selector: str) -> bool:
    """Evaluate a field selector (``=``, ``==``, ``!=`` on dotted paths)."""
    for term in _split_selector(selector):
        key, op, value = re.match(r"\s*([\w.]+)\s*(==|=|!=)\s*(.*)\s*$", term).groups()  # type: ignore[union-attr]
        current = str(_field(obj, key) or "")
        if (op == "!=") == (current == value):
            return False
    return True


class KubeState:
    """Objects, resource versions, watch events, pod logs and fault switches."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.objects: dict[Key, dict[str, Any]] = {}
        self.rv = 100
        self.events: list[tuple[int, str, Key, dict[str, Any]]] = []
        self.logs: dict[tuple[str, str], str] = {}
        self.failures: list[tuple[int, str | None]] = []
        self.requests: list[tuple[str, str, int]] = []
        self.unserved: set[str] = set()  # API groups this cluster lacks (plain Kubernetes)
        for name in ("default", "kube-system"):
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- test driver ---------------------------------------------------------------------------

    def _resource(self, obj: dict[str, Any]) -> Resource:
        return _BY_KIND[(obj["apiVersion"], obj["kind"])]

    def key_of(self, resource: Resource, namespace: str | None, name: str) -> Key:
        return (resource.group, resource.version, resource.plural,
                namespace if resource.namespaced else "", name)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object directly (bypassing the API), emitting an event."""
        resource = self._resource(obj)
        meta = obj.setdefault("metadata", {})
        key = self.key_of(resource, meta.get("namespace"), meta["name"])
        with self.lock:
            existing = self.objects.get(key)
            self._stamp(obj, existing)
            self.objects[key] = obj
            self._event("MODIFIED" if existing else "ADDED", key, obj)
        return obj

    def get(self, api_version: str, kind: str, name: str,
            namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object, or None."""
        resource = _BY_KIND[(api_version, kind)]
        with self.lock:  # the server's threads write while controllers and tests read
            return copy.deepcopy(self.objects.get(self.key_of(resource, namespace, name)))

    def list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        """Every stored object of a kind."""
        resource = _BY_KIND[(api_version, kind)]
        # under the lock: iterating while a request thread adds an object raised "dictionary
        # changed size during iteration" and killed the controller that listed (a flow then
        # waited an hour for a staging Job nobody completed)
        with self.lock:
            return [copy.deepcopy(o) for k, o in self.objects.items()
                    if k[:3] == (resource.group, resource.version, resource.plural)]

    def set_status(self, api_version: str, kind: str, name: str, status: dict[str, Any],
                   namespace: str | None = None) -> None:
        """Replace an object's status (what a controller would do), emitting MODIFIED."""
        resource = _BY_KIND[(api_version, kind)]
        key = self.key_of(resource, namespace, name)
        with self.lock:
            obj = copy.deepcopy(self.objects[key])
            obj["status"] = status
            self._stamp(obj, self.objects[key])
            self.objects[key] = obj
            self._event("MODIFIED", key, obj)

    def set_log(self, namespace: str, pod: str, text: str) -> None:
        """Set what ``pods/<pod>/log`` returns."""
        self.logs[(namespace, pod)] = text

    def fail_next(self, count: int, status: int = 503, path: str | None = None) -> None:
        """Answer the next ``count`` requests (whose path contains ``path``) with ``status``."""
        with self.lock:
            self.failures.extend([(status, path)] * count)

    # -- internals -------------------------------------------------------------------------------

    def _stamp(self, obj: dict[str, Any], existing: dict[str, Any] | None) -> None:
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        old = (existing or {}).get("metadata", {})
        meta["uid"] = old.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = old.get("creationTimestamp") or _now()
        meta["resourceVersion"] = str(self.rv)
        spec_changed = existing is None or existing.get("spec") != obj.get("spec")
        meta["generation"] = int(old.get("generation", 0)) + (1 if spec_changed else 0)

    def _event(self, kind: str, key: Key, obj: dict[str, Any]) -> None:
        self.events.append((self.rv, kind, key, copy.deepcopy(obj)))
        self.lock.notify_all()

    def delete_key(self, key: Key, propagation: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.pop(key, None)
            if obj is None:
                return None
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._event("DELETED", key, obj)
            uid = obj["metadata"]["uid"]
            dependents = [k for k, o in self.objects.items() if any(
                ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))]
            if key[2] == "namespaces":
                dependents += [k for k in self.objects if k[3] == key[4]]
        for dep in dependents:
            if propagation == "Orphan":
                with self.lock:
                    refs = self.objects[dep]["metadata"].get("ownerReferences", [])
                    self.objects[dep]["metadata"]["ownerReferences"] = [
                        r for r in refs if r.get("uid") != uid]
            else:
                self.delete_key(dep, propagation)
        return obj
