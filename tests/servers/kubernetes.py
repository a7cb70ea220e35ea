"""A stateful Kubernetes API server for tests, on 127.0.0.1, for the official client.

It keeps objects of the kinds Telltale touches (core, batch, apps, Kubeflow PyTorchJob, OLM,
RHOAI, GPU operator, NFD, OpenShift ClusterVersion, Machine API, builds and image streams,
Hive) and implements what the real API does for them:

- create (201; 409 ``AlreadyExists``; 404 when the namespace is missing), get (404
  ``NotFound`` Status), list with ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``,
  exists, ``!``) and ``fieldSelector`` (``metadata.name``, ``metadata.namespace``,
  ``status.phase``), replace (PUT, ``resourceVersion`` conflicts → 409), patch
  (merge-patch, strategic-merge treated as merge, JSON patch), the ``status`` subresource
  (writes to the main resource keep the stored status), delete with ``propagationPolicy``
  (dependents found through ``ownerReferences``), delete-collection by selector, namespace
  deletion removing its objects;
- metadata: ``uid``, ``resourceVersion``, ``creationTimestamp``, ``generation``; list bodies
  carry ``kind``/``apiVersion``/``metadata.resourceVersion``;
- watch (``?watch=true``): chunked JSON lines, initial ``ADDED`` events when no
  ``resourceVersion`` is given, selectors honoured, ``timeoutSeconds`` honoured;
- ``pods/<name>/log`` and ``builds/<name>/log`` (text the test sets), ``/version``;
- ``buildconfigs/<name>/instantiate`` (a ``BuildRequest``): a ``Build`` named
  ``<config>-<n>``, owned by its BuildConfig, with its spec, phase ``New``, and the
  config's ``status.lastVersion`` bumped, as OpenShift's build API does;
- unknown resources answer 404, like an undeclared CRD.

Tests drive the cluster through `KubeState`: ``set_status``, ``set_log``, ``fail_next``.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.servers import serve
from tests.servers.kube_state import (
    _BY_KIND,
    _BY_PATH,
    Key,
    KubeState,
    Resource,
    _json_patch,
    _merge,
    _status,
    field_matches,
    label_matches,
)


class _Handler(BaseHTTPRequestHandler):
    state: KubeState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.state.requests.append((self.command, self.path, status))

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def _route(self) -> tuple[Resource, str | None, str | None, str | None, dict[str, str]] | None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces" and (len(rest) > 2 or False):
            namespace, rest = rest[1], rest[2:]
        plural = rest[0] if rest else ""
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        resource = _BY_PATH.get((group, version, plural))
        if resource is None or group in self.state.unserved:
            self._send(404, _status(404, "NotFound", "the server could not find the requested "
                                    f"resource ({plural})"))
            return None
        return resource, namespace, name, sub, query

    def _fault(self) -> bool:
        with self.state.lock:
            for index, (_, path) in enumerate(self.state.failures):
                if path is None or path in self.path:
                    status = self.state.failures.pop(index)[0]
                    break
            else:
                return False
        self._body()
        self._send(status, _status(status, "InternalError" if status >= 500 else "BadRequest",
                                   "injected fault"))
        return True

    # -- verbs -----------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        if self._fault():
            return
        if self.path.startswith("/version"):
            self._send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0+telltale"})
            return
        route = self._route()
        if route is None:
            if self.path in ("/api", "/apis"):
                self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
            return
        resource, namespace, name, sub, query = route
        if name is None:
            if query.get("watch") in ("true", "True", "1"):
                self._watch(resource, namespace, query)
            else:
                self._list(resource, namespace, query)
            return
        key = self.state.key_of(resource, namespace, name)
        obj = self.state.objects.get(key)
        if sub == "log":
            if obj is None:
                self._send(404, _status(404, "NotFound", f'{resource.plural} "{name}" not '
                                        "found"))
            elif (namespace, name) not in self.state.logs:
                self._send(400, _status(400, "BadRequest", f'container in {resource.kind} '
                                        f'"{name}" is waiting to start: ContainerCreating'))
            else:
                self._send(200, self.state.logs[(namespace or "", name)], "text/plain")
            return
        if obj is None:
            self._send(404, _status(404, "NotFound", f'{resource.plural} "{name}" not found',
                                    {"name": name, "kind": resource.plural}))
            return
        self._send(200, obj)

    def _selected(self, resource: Resource, namespace: str | None,
                  query: dict[str, str]) -> list[tuple[Key, dict[str, Any]]]:
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        out = []
        with self.state.lock:  # a snapshot: other request threads write meanwhile
            items = sorted(self.state.objects.items())
        for key, obj in items:
            if key[:3] != (resource.group, resource.version, resource.plural):
                continue
            if namespace and key[3] != namespace:
                continue
            if labels and not label_matches(obj["metadata"].get("labels") or {}, labels):
                continue
            if fields and not field_matches(obj, fields):
                continue
            out.append((key, obj))
        return out

    def _list(self, resource: Resource, namespace: str | None, query: dict[str, str]) -> None:
        try:
            items = [o for _, o in self._selected(resource, namespace, query)]
        except ValueError as exc:
            self._send(400, _status(400, "BadRequest", str(exc)))
            return
        self._send(200, {"kind": f"{resource.kind}List", "apiVersion": resource.api_version,
                         "metadata": {"resourceVersion": str(self.state.rv)}, "items": items})

    def _watch(self, resource: Resource, namespace: str | None, query: dict[str, str]) -> None:
        timeout = float(query.get("timeoutSeconds") or 300)
        deadline = time.monotonic() + timeout
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(kind: str, obj: dict[str, Any]) -> None:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()

        def wanted(key: Key, obj: dict[str, Any]) -> bool:
            if key[:3] != (resource.group, resource.version, resource.plural):
                return False
            if namespace and key[3] != namespace:
                return False
            labels = query.get("labelSelector")
            if labels and not label_matches(obj["metadata"].get("labels") or {}, labels):
                return False
            fields = query.get("fieldSelector")
            return not (fields and not field_matches(obj, fields))

        try:
            with self.state.lock:
                since = query.get("resourceVersion")
                if since in (None, "", "0"):
                    initial = [o for k, o in sorted(self.state.objects.items()) if wanted(k, o)]
                    position = self.state.rv
                else:
                    initial, position = [], int(since)
            for obj in initial:
                emit("ADDED", obj)
            while time.monotonic() < deadline:
                with self.state.lock:
                    pending = [e for e in self.state.events if e[0] > position]
                    if not pending:
                        self.state.lock.wait(timeout=min(0.5, max(0.0, deadline -
                                                                  time.monotonic())))
                        continue
                for rv, kind, key, obj in pending:
                    position = rv
                    if wanted(key, obj):
                        emit(kind, obj)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.state.requests.append((self.command, self.path, 200))

    def do_POST(self) -> None:  # noqa: N802
        if self._fault():
            return
        route = self._route()
        if route is None:
            return
        resource, namespace, name, sub, _ = route
        obj = self._body() or {}
        if sub is not None:
            if resource.plural == "buildconfigs" and sub == "instantiate" and name:
                self._instantiate(resource, namespace, name, obj)
            else:
                self._send(404, _status(404, "NotFound", f"{resource.plural}/{sub}: no such "
                                        "subresource"))
            return
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            else:
                self._send(422, _status(422, "Invalid", "metadata.name: Required value"))
                return
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        if resource.namespaced:
            meta["namespace"] = namespace
            ns_key = ("", "v1", "namespaces", "", namespace or "")
            if ns_key not in self.state.objects:
                self._send(404, _status(404, "NotFound", f'namespaces "{namespace}" not found'))
                return
        key = self.state.key_of(resource, namespace, meta["name"])
        with self.state.lock:
            if key in self.state.objects:
                self._send(409, _status(409, "AlreadyExists", f'{resource.plural} '
                                        f'"{meta["name"]}" already exists'))
                return
            if resource.kind == "Namespace":
                obj.setdefault("status", {"phase": "Active"})
            self.state._stamp(obj, None)
            self.state.objects[key] = obj
            self.state._event("ADDED", key, obj)
        self._send(201, obj)

    def _instantiate(self, resource: Resource, namespace: str | None, name: str,
                     request: dict[str, Any]) -> None:
        """``buildconfigs/<name>/instantiate``: a new Build of the config's spec."""
        if request.get("kind") != "BuildRequest" or \
                (request.get("metadata") or {}).get("name") != name:
            self._send(400, _status(400, "BadRequest", "expected a BuildRequest named "
                                    f"{name!r}"))
            return
        key = self.state.key_of(resource, namespace, name)
        with self.state.lock:
            config = self.state.objects.get(key)
            if config is None:
                self._send(404, _status(404, "NotFound", f'buildconfigs "{name}" not found'))
                return
            version = int((config.get("status") or {}).get("lastVersion", 0)) + 1
            updated = copy.deepcopy(config)
            updated["status"] = {**(config.get("status") or {}), "lastVersion": version}
            self.state._stamp(updated, config)
            self.state.objects[key] = updated
            self.state._event("MODIFIED", key, updated)
            spec = config.get("spec") or {}
            build = {"apiVersion": "build.openshift.io/v1", "kind": "Build",
                     "metadata": {"name": f"{name}-{version}", "namespace": namespace,
                                  "labels": {**(config["metadata"].get("labels") or {}),
                                             "buildconfig": name,
                                             "openshift.io/build-config.name": name},
                                  "ownerReferences": [{
                                      "apiVersion": "build.openshift.io/v1",
                                      "kind": "BuildConfig", "name": name,
                                      "uid": config["metadata"]["uid"]}]},
                     "spec": {k: spec[k] for k in ("source", "strategy", "output")
                              if k in spec},
                     "status": {"phase": "New", "config": {"name": name,
                                                           "namespace": namespace}}}
            build_key = self.state.key_of(_BY_KIND[("build.openshift.io/v1", "Build")],
                                          namespace, build["metadata"]["name"])
            self.state._stamp(build, None)
            self.state.objects[build_key] = build
            self.state._event("ADDED", build_key, build)
        self._send(201, build)

    def _write(self, update: Any) -> None:
        route = self._route()
        if route is None:
            return
        resource, namespace, name, sub, _ = route
        key = self.state.key_of(resource, namespace, name or "")
        with self.state.lock:
            current = self.state.objects.get(key)
            if current is None:
                self._send(404, _status(404, "NotFound", f'{resource.plural} "{name}" not found'))
                return
            try:
                new = update(copy.deepcopy(current))
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                self._send(422, _status(422, "Invalid", f"patch failed: {exc}"))
                return
            wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
            if self.command == "PUT" and wanted_rv and wanted_rv != \
                    current["metadata"]["resourceVersion"]:
                self._send(409, _status(409, "Conflict", "the object has been modified"))
                return
            if sub == "status":  # only the status changes through the subresource
                merged = copy.deepcopy(current)
                merged["status"] = new.get("status")
            else:  # the main resource never writes the status
                merged = new
                merged["status"] = current.get("status")
                if merged["status"] is None:
                    merged.pop("status")
            merged.setdefault("metadata", {})["name"] = current["metadata"]["name"]
            if "namespace" in current["metadata"]:
                merged["metadata"]["namespace"] = current["metadata"]["namespace"]
            self.state._stamp(merged, current)
            self.state.objects[key] = merged
            self.state._event("MODIFIED", key, merged)
        self._send(200, merged)

    def do_PUT(self) -> None:  # noqa: N802
        if self._fault():
            return
        body = self._body()
        self._write(lambda current: body)

    def do_PATCH(self) -> None:  # noqa: N802
        if self._fault():
            return
        body = self._body()
        kind = self.headers.get("Content-Type", "")
        if "json-patch" in kind:
            self._write(lambda current: _json_patch(current, body))
        else:
            self._write(lambda current: _merge(current, body))

    def do_DELETE(self) -> None:  # noqa: N802
        if self._fault():
            return
        body = self._body() or {}
        route = self._route()
        if route is None:
            return
        resource, namespace, name, _, query = route
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy") or \
            "Background"
        if name is None:  # delete collection
            for key, _ in self._selected(resource, namespace, query):
                self.state.delete_key(key, propagation)
            self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "metadata": {}})
            return
        deleted = self.state.delete_key(self.state.key_of(resource, namespace, name),
                                        propagation)
        if deleted is None:
            self._send(404, _status(404, "NotFound", f'{resource.plural} "{name}" not found'))
            return
        self._send(200, deleted)


@contextmanager
def kube_server(*, rbac_audit: bool = True) -> Iterator[tuple[str, KubeState]]:
    """Run the API server on 127.0.0.1 in a thread; yields (URL, state).

    ``rbac_audit``: when the block ends without an error, every request it served must be
    granted by the runner's generated RBAC (`deployments.rbac`): each test that touches a
    cluster checks that the RBAC covers what the code asked. Tests that call what only
    tests use (``Kube.patch_status``, raw PUTs) turn it off.
    """
    state = KubeState()
    handler = type("Handler", (_Handler,), {"state": state})
    with serve(handler) as port:
        yield f"http://127.0.0.1:{port}", state
    if rbac_audit:
        from tests.kube_audit import assert_rbac_grants

        assert_rbac_grants(state)


def write_kubeconfig(path: Any, url: str, namespace: str = "default") -> str:
    """Write a kubeconfig for the test server (token auth) and return its path."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test",
                                                  "namespace": namespace}}],
    }
    path.write_text(json.dumps(config))
    return str(path)


def authorization_attributes(method: str, path: str) -> tuple[str, str, str] | None:
    """(API group, resource[/subresource], verb) of a request, as the API's authorizer sees
    it; None for discovery and ``/version`` (granted to every authenticated user)."""
    url = urlparse(path)
    query = parse_qs(url.query)
    parts = [p for p in url.path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return None
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    if method == "GET":
        if "true" in query.get("watch", []):
            verb = "watch"
        else:
            verb = "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if named else "deletecollection"}[method]
    return group, resource, verb
