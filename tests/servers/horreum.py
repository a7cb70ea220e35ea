"""A Horreum REST server for tests, on 127.0.0.1, shaped by Horreum's published OpenAPI.

The operations Telltale calls — ``getByNameOrId`` (``GET /api/test/byName/{name}``),
``listTestRuns`` (``GET /api/run/list/{testId}``) and ``addRunFromData``
(``POST /api/run/data``) — are read from Horreum's published ``openapi.yaml`` (pinned in
``tests/schemas.lock.json``, found by `tests.schema_store`; the server skips its test when
the document is absent): a request
with a query parameter the operation does not declare, without one it requires, or with a
value outside its schema (``access`` is the ``Access`` enum, ``limit`` an int32...) gets
400, and every JSON answer is validated against the response schema the document gives
before it is sent (a test server that drifted from the API fails its own tests).

Authentication is Horreum's API key header (``X-Horreum-API-Key``): a missing or unknown key
gets 401. Runs are kept in memory; ``start``/``stop`` accept an ISO timestamp, epoch
milliseconds or a JSON path into the uploaded document, as Horreum does.

Tests drive it through `HorreumState`: ``add_test``, ``runs``, ``fail_next``.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from core.yamlio import load_documents
from tests import schema_store
from tests.servers import serve

OPENAPI = "apis/horreum/openapi.yaml"


@functools.cache
def openapi() -> dict[str, Any]:
    """Horreum's published OpenAPI document (pinned, never copied; parsed once)."""
    return load_documents(schema_store.require(OPENAPI).read_text(encoding="utf-8"))[0]


@dataclass
class HorreumState:
    """What the server holds, and the faults a test asks for."""

    api_key: str
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    _fail: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_test(self, name: str, owner: str = "perf-team", access: str = "PUBLIC") -> int:
        """Define a test (as a Horreum admin does in the UI); returns its id."""
        test_id = 100 + len(self.tests) + 1
        self.tests[name] = {"id": test_id, "name": name, "owner": owner, "access": access,
                            "datastoreId": 1, "notificationsEnabled": False}
        return test_id

    def fail_next(self, count: int, status: int = 503) -> None:
        """The next ``count`` requests get ``status``."""
        self._fail.extend([status] * count)

    def add_run(self, test: str, *, start_ms: int, description: str = "",
                data: Any = None) -> int:
        """Store a run (also how a test seeds a history)."""
        run_id = 1000 + len(self.runs) + 1
        meta = self.tests[test]
        self.runs.append({"id": run_id, "testid": meta["id"], "testname": test,
                          "owner": meta["owner"], "access": meta["access"],
                          "start": start_ms, "stop": start_ms, "description": description,
                          "data": data, "schema": None, "trashed": False})
        return run_id


class _Spec:
    """The operations used, their parameters and response schemas, from the OpenAPI."""

    def __init__(self, doc: dict[str, Any]) -> None:
        import jsonschema

        self.doc = doc
        self._validator = jsonschema.Draft202012Validator
        self._validators: dict[str, Any] = {}
        self.ops = {
            ("GET", "/api/test/byName/{name}"): doc["paths"]["/api/test/byName/{name}"]["get"],
            ("GET", "/api/run/list/{testId}"): doc["paths"]["/api/run/list/{testId}"]["get"],
            ("POST", "/api/run/data"): doc["paths"]["/api/run/data"]["post"],
        }

    def validate(self, schema: dict[str, Any], value: Any) -> str | None:
        """The first error of ``value`` against ``schema`` ($refs into the document)."""
        import jsonschema

        key = json.dumps(schema, sort_keys=True)
        validator = self._validators.get(key)
        if validator is None:  # $ref resolves against the whole OpenAPI document
            validator = self._validators[key] = self._validator({**self.doc, **schema})
        try:
            validator.validate(value)
        except jsonschema.ValidationError as exc:
            return exc.message
        return None

    def check_query(self, op: dict[str, Any], query: dict[str, list[str]]) -> str | None:
        """Why a request's query does not fit the operation, or None."""
        declared = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
        unknown = sorted(set(query) - set(declared))
        if unknown:
            return f"undeclared query parameter(s): {', '.join(unknown)}"
        for name, param in declared.items():
            if name not in query:
                if param.get("required"):
                    return f"missing required query parameter {name}"
                continue
            raw = query[name][0]
            schema = param.get("schema", {})
            value: Any = raw
            target = schema
            if "$ref" in schema:
                target = self.doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            if target.get("type") == "integer":
                if not re.fullmatch(r"-?\d+", raw):
                    return f"{name}: not an integer: {raw!r}"
                value = int(raw)
            elif target.get("type") == "boolean":
                if raw not in ("true", "false"):
                    return f"{name}: not a boolean: {raw!r}"
                value = raw == "true"
            error = self.validate(schema, value)
            if error:
                return f"{name}: {error}"
        return None

    def response_schema(self, op: dict[str, Any], status: int) -> dict[str, Any] | None:
        content = op["responses"].get(str(status), {}).get("content", {})
        for media in content.values():
            if "schema" in media:
                return dict(media["schema"])
        return None


@functools.cache
def _spec() -> _Spec:
    return _Spec(openapi())


def _stamp(value: str, document: Any) -> int | None:
    """Horreum's start/stop: a JSON path into the document, epoch ms, or ISO-8601."""
    if value.startswith("$."):
        node = document
        for part in value[2:].split("."):
            node = node.get(part) if isinstance(node, dict) else None
        value = str(node) if node is not None else ""
    if re.fullmatch(r"\d+", value):
        return int(value)
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return int(stamp.timestamp() * 1000)


def _handler(state: HorreumState, spec: _Spec) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any = None, *, text: bool = False,
                  op: dict[str, Any] | None = None) -> None:
            if op is not None and not text and body is not None:
                schema = spec.response_schema(op, status)
                if schema is not None:
                    error = spec.validate(schema, body)
                    assert error is None, f"test server answer breaks the OpenAPI: {error}"
            payload = b"" if body is None else (
                str(body).encode() if text else json.dumps(body).encode())
            self.send_response(status)
            if payload:
                self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _prelude(self, method: str) -> tuple[str, dict[str, list[str]]] | None:
            url = urlparse(self.path)
            with state.lock:
                state.requests.append((method, self.path))
                fault = state._fail.pop(0) if state._fail else None
            if fault is not None:
                self._drain()
                self._send(fault, "injected fault", text=True)
                return None
            if self.headers.get("X-Horreum-API-Key") != state.api_key:
                self._drain()
                self._send(401, "Unauthorized", text=True)
                return None
            return url.path, parse_qs(url.query, keep_blank_values=True)

        def _drain(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def do_GET(self) -> None:  # noqa: N802
            routed = self._prelude("GET")
            if routed is None:
                return
            path, query = routed
            if m := re.fullmatch(r"/api/test/byName/([^/]+)", path):
                op = spec.ops[("GET", "/api/test/byName/{name}")]
                if (error := spec.check_query(op, query)) is not None:
                    return self._send(400, error, text=True)
                test = state.tests.get(unquote(m.group(1)))
                if test is None:
                    return self._send(404, {"message": "No test with name "
                                            f"{unquote(m.group(1))}"})
                return self._send(200, test, op=op)
            if m := re.fullmatch(r"/api/run/list/(\d+)", path):
                op = spec.ops[("GET", "/api/run/list/{testId}")]
                if (error := spec.check_query(op, query)) is not None:
                    return self._send(400, error, text=True)
                return self._list(int(m.group(1)), query, op)
            self._send(404, "not found", text=True)

        def _list(self, test_id: int, query: dict[str, list[str]], op: dict[str, Any]) -> None:
            limit = int(query.get("limit", ["20"])[0])
            page = int(query.get("page", ["1"])[0])
            trashed = query.get("trashed", ["false"])[0] == "true"
            sort = query.get("sort", ["start"])[0]
            descending = query.get("direction", ["Descending"])[0] == "Descending"
            with state.lock:
                runs = [r for r in state.runs if r["testid"] == test_id
                        and (trashed or not r["trashed"])]
            runs.sort(key=lambda r: (r.get(sort) or 0, r["id"]), reverse=descending)
            chosen = runs[(page - 1) * limit: page * limit] if page >= 1 else []
            summary = {"total": len(runs), "runs": [{
                "id": r["id"], "testid": r["testid"], "testname": r["testname"],
                "owner": r["owner"], "access": r["access"], "start": r["start"],
                "stop": r["stop"], "trashed": r["trashed"], "hasMetadata": False,
                "description": r["description"], "datasets": [r["id"] * 10]}
                for r in chosen]}
            self._send(200, summary, op=op)

        def do_POST(self) -> None:  # noqa: N802
            routed = self._prelude("POST")
            if routed is None:
                return
            path, query = routed
            body = self._drain()
            if path != "/api/run/data":
                return self._send(404, "not found", text=True)
            op = spec.ops[("POST", "/api/run/data")]
            if (error := spec.check_query(op, query)) is not None:
                return self._send(400, error, text=True)
            if "json" not in (self.headers.get("Content-Type") or ""):
                return self._send(415, "Content-Type must be application/json", text=True)
            try:
                document = json.loads(body)
            except ValueError:
                return self._send(400, "the body is not JSON", text=True)
            name = query["test"][0]
            test = state.tests.get(name) or next(
                (t for t in state.tests.values() if str(t["id"]) == name), None)
            if test is None:
                return self._send(400, f"Cannot find test {name}", text=True)
            start, stop = (_stamp(query[k][0], document) for k in ("start", "stop"))
            if start is None or stop is None:
                return self._send(400, "Cannot parse start or stop time", text=True)
            with state.lock:
                run_id = 1000 + len(state.runs) + 1
                state.runs.append({
                    "id": run_id, "testid": test["id"], "testname": test["name"],
                    "owner": query.get("owner", [test["owner"]])[0],
                    "access": query.get("access", [test["access"]])[0],
                    "start": start, "stop": stop,
                    "description": query.get("description", [""])[0],
                    "schema": query.get("schema", [None])[0], "data": document,
                    "trashed": False})
            self._send(202, str(run_id), text=True)

    return Handler


@contextmanager
def horreum_server(api_key: str = "HUSR_00000000_0000_0000_0000_000000000000",
                   ) -> Iterator[tuple[str, HorreumState]]:
    """Serve a Horreum API on 127.0.0.1; yields (base URL, state)."""
    openapi()  # in the test's thread: skips (or fails when required) without the document
    state = HorreumState(api_key=api_key)
    with serve(_handler(state, _spec())) as port:
        yield f"http://127.0.0.1:{port}", state
