"""Kubernetes helpers on the official client: apply, wait, logs, delete — labelled by run.

Every object Telltale creates carries ``telltale.io/run-id=<run id>`` and
``app.kubernetes.io/managed-by=telltale``, so cleanup and the leak janitor find them by
label. Calls go through ``kubernetes.client.ApiClient`` (real HTTP, the user's kubeconfig
auth) with a client-side timeout on every request; transient faults (5xx, 429, connection
errors) are retried with backoff, everything else raises at once with the API's message.

Kinds are declared once (`tasks.kube.kinds`: the engine's and the projects'); an
undeclared kind is refused before any request.

`Kube.wait` follows an object with a *watch* (not polling) until a readiness predicate holds,
a fail-fast predicate names a reason (ImagePullBackOff, CrashLoopBackOff, Error...), or the
deadline passes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.errors import PermanentServiceError, StepError, TransientServiceError
from projects.library.kinds import Kind
from tasks.kube.kinds import kind_of
from tasks.retry import RetryPolicy, call_with_retries

__all__ = [
    "KEEP_LABEL",
    "MANAGED_BY",
    "RUN_ID_LABEL",
    "Kube",
    "api_client",
    "clients_built",
    "close_clients",
    "map_api_error",
    "open_clients",
    "owned_clients",
]

logger = logging.getLogger("telltale.k8s")

RUN_ID_LABEL = "telltale.io/run-id"
KEEP_LABEL = "telltale.io/keep"
"""Objects of a run kept (``clusters.keep``): the leak janitor leaves them alone."""
MANAGED_BY = ("app.kubernetes.io/managed-by", "telltale")


def _kind(api_version: str, kind: str) -> Kind:
    found = kind_of(api_version, kind)
    if found is None:
        raise StepError(f"unknown kind {api_version}/{kind}: declare it (the engine's in "
                        "tasks.kube.kinds, a project's in its Project.kube_kinds)")
    return found


def map_api_error(exc: BaseException, what: str) -> Exception:
    """Translate a kubernetes/urllib3 error into a transient or permanent Telltale error."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(exc, ApiException):
        message = exc.reason or ""
        try:
            message = json.loads(exc.body or "{}").get("message") or message
        except (ValueError, AttributeError):
            message = (str(exc.body) or message)[:256]
        status = exc.status or None
        if status is None or status >= 500 or status == 429:
            return TransientServiceError(f"{what}: {message}", service="kubernetes",
                                         status=status)
        return PermanentServiceError(f"{what}: {message}", service="kubernetes", status=status)
    if isinstance(exc, Urllib3Error | ConnectionError | TimeoutError):
        return TransientServiceError(f"{what}: {exc}", service="kubernetes")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


KUBECONFIG_MAX_BYTES = 4 * 1024 * 1024
"""The largest kubeconfig read (real ones with embedded certificates are a few KiB)."""


def kubeconfig_path(kubeconfig: str | None) -> Path:
    """The kubeconfig file a path, ``$KUBECONFIG`` (its first entry) or the default names."""
    if kubeconfig:
        return Path(kubeconfig).expanduser()
    first = next((p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p), None)
    return Path(first or "~/.kube/config").expanduser()


_CLIENTS: dict[tuple[str, int, int], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_BUILT = 0


def _client_key(kubeconfig: str | None) -> tuple[str, int, int]:
    """A kubeconfig's identity: its path, size and time (a rewritten file is a new client)."""
    if kubeconfig == "in-cluster":
        return "in-cluster", 0, 0
    path = kubeconfig_path(kubeconfig)
    try:
        facts = path.stat()
    except OSError:
        return str(path), -1, -1  # the loader says why it cannot be used
    return str(path), facts.st_mtime_ns, facts.st_size


def api_client(kubeconfig: str | None) -> Any:
    """The run's ``ApiClient`` for a kubeconfig path, ``"in-cluster"``, or the default one.

    One client per kubeconfig, shared by every step of the process (its connection pool
    too): built on first use, closed by `close_clients` — which `owned_clients` calls when
    the run that owns them ends. Never build ``kubernetes.client.ApiClient`` elsewhere (an
    audit test fails on it).

    The file is read through the one bounded reader (`core.safeio.read_text_bounded`: a
    FIFO or a device is refused, never opened for a blocking read; a size cap) and parsed
    with the one YAML loader, then handed to the client as a mapping (relative certificate
    paths still resolve against the file's folder).

    Raises:
        ConfigError: The kubeconfig cannot be used (unreadable, empty, not a kubeconfig, no
            current context, not in a pod): a user error naming ``clusters.kubeconfig``, for
            every caller (a run, the janitor, ``--rebuild-image``).
    """
    global _BUILT
    key = _client_key(kubeconfig)
    with _CLIENTS_LOCK:  # built under the lock: concurrent steps get the one client
        found = _CLIENTS.get(key)
        if found is None:
            found = _CLIENTS[key] = _build_client(kubeconfig)
            _BUILT += 1
        return found


def clients_built() -> int:
    """How many clients this process has built (each kubeconfig once per run)."""
    return _BUILT


def open_clients() -> int:
    """How many clients are open (built and not yet closed)."""
    with _CLIENTS_LOCK:
        return len(_CLIENTS)


def close_clients() -> int:
    """Close every open client (their pools and connections); returns how many."""
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
    for built in clients:
        try:
            built.close()
        except Exception as exc:  # a client that will not close must not stop the others
            logger.warning("closing a Kubernetes client failed: %s", exc)
    return len(clients)


_OWNERS = 0


@contextmanager
def owned_clients() -> Iterator[None]:
    """The Kubernetes clients built inside are the run's: closed when it ends, however.

    Runs of one process (tests, a thread per run) share the clients: the last one to end
    closes them, so no run loses its client to another's end.
    """
    global _OWNERS
    with _CLIENTS_LOCK:
        _OWNERS += 1
    try:
        yield
    finally:
        with _CLIENTS_LOCK:
            _OWNERS -= 1
            last = _OWNERS == 0
        if last:
            close_clients()


def _build_client(kubeconfig: str | None) -> Any:
    """Build an ``ApiClient`` (see `api_client`, the only caller)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader
    from yaml import YAMLError

    from core.errors import ConfigError, TelltaleError
    from core.safeio import read_text_bounded
    from core.yamlio import load_yaml_text

    where = kubeconfig or "the default kubeconfig"
    try:
        if kubeconfig == "in-cluster":
            config.load_incluster_config()
            return client.ApiClient()
        path = kubeconfig_path(kubeconfig)
        text = read_text_bounded(path, KUBECONFIG_MAX_BYTES, what="kubeconfig",
                                 follow_links=True)
        data, _ = load_yaml_text(text, source=str(path))
        if not isinstance(data, dict):
            raise ConfigException("Invalid kube-config file. No configuration found.")
        configuration = type.__call__(client.Configuration)
        KubeConfigLoader(config_dict=data, config_base_path=str(path.parent)).load_and_set(
            configuration)
        return client.ApiClient(configuration=configuration)
    except (ConfigException, YAMLError, TypeError, ValueError, AttributeError, KeyError,
            OSError, TelltaleError) as exc:  # the client reads the file as it finds it
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(f"kubeconfig {where} cannot be used: {reason}",
                          key="clusters.kubeconfig") from None


class Kube:
    """Typed-enough access to the API for Telltale's steps.

    Args:
        api: A ``kubernetes.client.ApiClient``.
        run_id: Labels every applied object (``telltale.io/run-id``).
        request_timeout_s: Client-side timeout of every request.
        policy: Retries of transient faults.
    """

    def __init__(self, api: Any, run_id: str | None = None, *, request_timeout_s: float = 30.0,
                 policy: RetryPolicy = RetryPolicy()) -> None:
        self.api = api
        self.run_id = run_id
        self.request_timeout_s = request_timeout_s
        self.policy = policy

    def __repr__(self) -> str:
        return f"Kube(host={self.api.configuration.host!r}, run_id={self.run_id!r})"

    # -- transport ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, body: Any = None,
              query: Iterable[tuple[str, Any]] = (), content_type: str = "application/json",
              what: str, preload: bool = True, timeout: float | None = None) -> Any:
        def once() -> Any:
            from kubernetes.client.exceptions import ApiException

            try:
                verb, url, headers, payload, post = self.api.param_serialize(
                    method=method, resource_path=path, query_params=list(query),
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body, auth_settings=["BearerToken"])
                response = self.api.call_api(verb, url, header_params=headers, body=payload,
                                             post_params=post,
                                             _request_timeout=timeout or self.request_timeout_s)
                if response.status >= 400:
                    response.read()
                    raise ApiException(http_resp=response)
                if not preload:
                    return response.response  # urllib3 response, for streaming
                data = response.read()
                if "json" not in (response.getheader("Content-Type") or ""):
                    return data.decode("utf-8", errors="replace")
                return json.loads(data) if data else None
            except Exception as exc:
                raise map_api_error(exc, what) from exc

        return call_with_retries(once, self.policy, what=what)

    # -- verbs -------------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, name: str,
            namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        info = _kind(api_version, kind)
        try:
            return self._call("GET", info.path(namespace, name), what=f"get {kind} {name}")
        except PermanentServiceError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None, *,
             labels: str | None = None, fields: str | None = None) -> list[dict[str, Any]]:
        """Objects of a kind (in a namespace, or all of them), filtered by selectors."""
        info = _kind(api_version, kind)
        path = info.path(namespace) if (namespace or not info.namespaced) else \
            info.all_namespaces_path()
        query = [(k, v) for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v]
        body = self._call("GET", path, query=query, what=f"list {kind}")
        return list(body.get("items") or [])

    def list_served(self, api_version: str, kind: str, namespace: str | None = None, *,
                    labels: str | None = None) -> list[dict[str, Any]]:
        """`list`, but none when the cluster does not serve the kind.

        No KServe, no OpenShift Machine API: nothing of that kind can be there.
        """
        try:
            return self.list(api_version, kind, namespace, labels=labels)
        except PermanentServiceError as exc:
            if exc.status == 404:
                return []
            raise

    def require(self, api_version: str, kind: str, namespace: str | None, *, what: str,
                key: str) -> None:
        """Refuse, naming the config key, a feature whose API the cluster does not serve.

        A cluster without OpenShift's Machine or build API answers 404 for the kind's
        collection: that is a user error (exit 2), not a failed step.

        Raises:
            ConfigError: The cluster does not serve ``api_version``/``kind``.
        """
        from core.errors import ConfigError

        try:
            self.list(api_version, kind, namespace)
        except PermanentServiceError as exc:
            if exc.status != 404:
                raise
            raise ConfigError(f"{what} needs {api_version} {kind}, which this cluster does "
                              "not serve (OpenShift's API): unset it on this cluster",
                              key=key) from None

    def _labelled(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        obj = json.loads(json.dumps(manifest))
        labels = obj.setdefault("metadata", {}).setdefault("labels", {})
        labels.setdefault(*MANAGED_BY)
        if self.run_id:
            labels[RUN_ID_LABEL] = self.run_id
        return obj

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object, or merge-patch it when it exists (idempotent); labelled by run.

        Returns:
            The object as the API stored it.
        """
        obj = self._labelled(manifest)
        info = _kind(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        namespace = meta.get("namespace")
        what = f"apply {info.kind} {meta['name']}"
        if self.get(info.api_version, info.kind, meta["name"], namespace) is None:
            try:
                return self._call("POST", info.path(namespace), body=obj, what=what)
            except PermanentServiceError as exc:
                if exc.status != 409:  # created meanwhile: patch it below
                    raise
        patch = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
        return self._call("PATCH", info.path(namespace, meta["name"]), body=patch,
                          content_type="application/merge-patch+json", what=what)

    def patch(self, api_version: str, kind: str, name: str, body: Mapping[str, Any],
              namespace: str | None = None) -> dict[str, Any]:
        """Merge-patch an object as it is; a ``None`` value removes the key.

        No Telltale label is added: for objects the run does not own (a node, a
        MachineSet it only scales).
        """
        info = _kind(api_version, kind)
        return self._call("PATCH", info.path(namespace, name), body=dict(body),
                          content_type="application/merge-patch+json",
                          what=f"patch {kind} {name}")

    def create_subresource(self, api_version: str, kind: str, name: str, sub: str,
                           body: Mapping[str, Any],
                           namespace: str | None = None) -> dict[str, Any]:
        """POST to a subresource (a BuildConfig's ``instantiate``); returns the answer."""
        info = _kind(api_version, kind)
        return self._call("POST", info.path(namespace, name, sub), body=dict(body),
                          what=f"{sub} {kind} {name}")

    def patch_status(self, api_version: str, kind: str, name: str, status: Mapping[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        """Merge-patch an object's status subresource."""
        info = _kind(api_version, kind)
        return self._call("PATCH", info.path(namespace, name, "status"),
                          body={"status": dict(status)},
                          content_type="application/merge-patch+json",
                          what=f"patch status of {kind} {name}")

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
               propagation: str = "Foreground") -> bool:
        """Delete an object and (by default) its dependents; False when it was already gone."""
        info = _kind(api_version, kind)
        try:
            self._call("DELETE", info.path(namespace, name),
                       body={"kind": "DeleteOptions", "apiVersion": "v1",
                             "propagationPolicy": propagation}, what=f"delete {kind} {name}")
        except PermanentServiceError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def pod_log(self, name: str, namespace: str, container: str | None = None) -> str:
        """A pod's log (text)."""
        return self.log("v1", "Pod", name, namespace, container=container)

    def log(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
            container: str | None = None) -> str:
        """The ``log`` subresource of an object (a pod's, a build's), as text."""
        query = [("container", container)] if container else []
        return str(self._call("GET", _kind(api_version, kind).path(namespace, name, "log"),
                              query=query, what=f"log of {kind} {name}"))

    def wait(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
             ready: Callable[[dict[str, Any]], bool],
             fail: Callable[[dict[str, Any]], str | None] = lambda obj: None,
             deadline_s: float, what: str | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Follow an object through a watch until ``ready`` holds.

        Args:
            api_version: The object's apiVersion.
            kind: Its kind.
            name: Its name.
            namespace: Its namespace (namespaced kinds).
            ready: True when done.
            fail: A reason string when the object can no longer become ready.
            deadline_s: Give up after this many seconds.
            what: Description for errors and logs.
            progress: Called with every version of the object seen.

        Returns:
            The object, ready.

        Raises:
            StepError: ``fail`` gave a reason, or the deadline passed.
        """
        info = _kind(api_version, kind)
        label = what or f"{kind} {namespace + '/' if namespace else ''}{name}"
        deadline = time.monotonic() + deadline_s
        last: dict[str, Any] | None = None

        def check(obj: dict[str, Any] | None) -> dict[str, Any] | None:
            if obj is None:
                return None
            if progress is not None:
                progress(obj)
            reason = fail(obj)
            if reason:
                raise StepError(f"{label} failed: {reason}")
            return obj if ready(obj) else None

        while True:
            current = self.get(api_version, kind, name, namespace)
            last = current or last
            done = check(current)
            if done is not None:
                return done
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                state = json.dumps((last or {}).get("status"))[:300]
                raise StepError(f"{label} not ready after {deadline_s:g}s (last status: {state})")
            version = (current or {}).get("metadata", {}).get("resourceVersion", "")
            watch_seconds = max(1, min(int(remaining), 60))
            response = self._call(
                "GET", info.path(namespace), preload=False, what=f"watch {label}",
                query=[("watch", "true"), ("fieldSelector", f"metadata.name={name}"),
                       ("resourceVersion", version), ("timeoutSeconds", watch_seconds),
                       ("allowWatchBookmarks", "false")],
                timeout=watch_seconds + 10)
            try:
                for line in _lines(response):
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        break  # e.g. 410 Gone: re-read and watch again
                    obj = event.get("object") or {}
                    if event.get("type") == "DELETED":
                        continue
                    last = obj
                    done = check(obj)
                    if done is not None:
                        return done
                    if time.monotonic() >= deadline:
                        break
            finally:
                response.release_conn()


def _lines(response: Any) -> Iterable[str]:
    buffer = b""
    for chunk in response.stream(4096, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line.decode("utf-8")
    if buffer.strip():
        yield buffer.decode("utf-8")
