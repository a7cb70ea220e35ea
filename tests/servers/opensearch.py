"""A small stateful OpenSearch-compatible HTTP server for tests (127.0.0.1 only).

Implements the endpoints Telltale uses, with OpenSearch's status codes and body shapes:

- ``GET /``: cluster info;
- ``HEAD /<index>``: 200 or 404;  ``PUT /<index>``: create with mappings (400
  ``resource_already_exists_exception`` when it exists);
- ``POST /_bulk``: NDJSON ``index`` actions (same ``_id`` overwrites, ``result``
  created/updated), auto-creating the index, refusing a non-numeric value for a field mapped
  ``double``/``integer`` (``mapper_parsing_exception``, per item);
- ``POST|GET /<index>/_search``: ``bool.filter`` of ``term``/``exists``, ``sort`` (asc/desc on
  dotted fields), ``size`` (max 10 000), ``search_after``; 404 for a missing index;
- ``GET /<index>/_doc/<id>``.

Faults: ``fail_next(n, status)`` answers the next ``n`` requests with ``status``; basic auth
is required when the server is built with a user.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.servers import serve


def _get(source: dict[str, Any], path: str) -> Any:
    node: Any = source
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _field_type(mappings: dict[str, Any], path: str) -> str | None:
    node = mappings
    for part in path.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
    return node.get("type")


class OpenSearchState:
    """Indices, documents and fault switches shared by the request handlers."""

    def __init__(self, user: str | None = None, password: str | None = None) -> None:
        self.indices: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.failures: list[int] = []
        self.requests: list[tuple[str, str]] = []
        self.user, self.password = user, password

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status``."""
        with self.lock:
            self.failures.extend([status] * count)


class _Handler(BaseHTTPRequestHandler):
    state: OpenSearchState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _guard(self) -> bool:
        self.state.requests.append((self.command, self.path))
        with self.state.lock:
            status = self.state.failures.pop(0) if self.state.failures else None
        if status is not None:
            self._body()
            self._send(status, {"error": {"type": "injected", "reason": f"injected {status}"},
                                "status": status})
            return False
        if self.state.user is not None:
            expected = base64.b64encode(f"{self.state.user}:{self.state.password}".encode())
            if self.headers.get("Authorization", "") != f"Basic {expected.decode()}":
                self._body()
                self._send(401, {"error": {"type": "security_exception",
                                           "reason": "missing authentication credentials"},
                                 "status": 401})
                return False
        return True

    def do_GET(self) -> None:  # noqa: N802
        if not self._guard():
            return
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if not parts:
            self._send(200, {"name": "telltale-test", "version": {
                "distribution": "opensearch", "number": "2.15.0"}})
        elif len(parts) == 2 and parts[1] == "_search":
            self._search(parts[0])
        elif len(parts) == 3 and parts[1] == "_doc":
            index = self.state.indices.get(parts[0])
            doc = index["docs"].get(parts[2]) if index else None
            if doc is None:
                self._send(404, {"_index": parts[0], "_id": parts[2], "found": False})
            else:
                self._send(200, {"_index": parts[0], "_id": parts[2], "found": True,
                                 "_source": doc})
        else:
            self._send(400, {"error": {"type": "illegal_argument_exception",
                                       "reason": f"unsupported GET {self.path}"}})

    def do_HEAD(self) -> None:  # noqa: N802
        if not self._guard():
            return
        name = self.path.strip("/")
        self._send(200 if name in self.state.indices else 404)

    def do_PUT(self) -> None:  # noqa: N802
        if not self._guard():
            return
        name = self.path.strip("/")
        body = json.loads(self._body() or b"{}")
        with self.state.lock:
            if name in self.state.indices:
                self._send(400, {"error": {"type": "resource_already_exists_exception",
                                           "reason": f"index [{name}] already exists"},
                                 "status": 400})
                return
            self.state.indices[name] = {"mappings": body.get("mappings", {}), "docs": {}}
        self._send(200, {"acknowledged": True, "index": name})

    def do_POST(self) -> None:  # noqa: N802
        if not self._guard():
            return
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if parts == ["_bulk"]:
            self._bulk()
        elif len(parts) == 2 and parts[1] == "_search":
            self._search(parts[0])
        else:
            self._body()
            self._send(400, {"error": {"type": "illegal_argument_exception",
                                       "reason": f"unsupported POST {self.path}"}})

    def _bulk(self) -> None:
        lines = [line for line in self._body().decode().splitlines() if line.strip()]
        items, errors = [], False
        for action_line, doc_line in zip(lines[::2], lines[1::2], strict=False):
            action = json.loads(action_line)["index"]
            doc = json.loads(doc_line)
            name, doc_id = action["_index"], action["_id"]
            with self.state.lock:
                index = self.state.indices.setdefault(name, {"mappings": {}, "docs": {}})
                bad = self._mapping_error(index["mappings"], doc)
                if bad:
                    errors = True
                    items.append({"index": {"_index": name, "_id": doc_id, "status": 400,
                                            "error": {"type": "mapper_parsing_exception",
                                                      "reason": bad}}})
                    continue
                existed = doc_id in index["docs"]
                index["docs"][doc_id] = doc
            items.append({"index": {"_index": name, "_id": doc_id, "status": 200 if existed
                                    else 201, "result": "updated" if existed else "created"}})
        self._send(200, {"took": 1, "errors": errors, "items": items})

    @staticmethod
    def _mapping_error(mappings: dict[str, Any], doc: dict[str, Any]) -> str | None:
        def walk(source: Any, prefix: str) -> Iterator[tuple[str, Any]]:
            if isinstance(source, dict):
                for key, value in source.items():
                    yield from walk(value, f"{prefix}{key}.")
            else:
                yield prefix[:-1], source

        for path, value in walk(doc, ""):
            kind = _field_type(mappings, path)
            if kind in ("double", "integer") and value is not None and not isinstance(
                    value, int | float):
                return f"failed to parse field [{path}] of type [{kind}]"
        return None

    def _search(self, name: str) -> None:
        body = json.loads(self._body() or b"{}")
        index = self.state.indices.get(name)
        if index is None:
            self._send(404, {"error": {"type": "index_not_found_exception",
                                       "reason": f"no such index [{name}]"}, "status": 404})
            return
        size = int(body.get("size", 10))
        if size > 10_000:
            self._send(400, {"error": {"type": "illegal_argument_exception",
                                       "reason": "Result window is too large"}})
            return
        filters = ((body.get("query") or {}).get("bool") or {}).get("filter") or []
        sort = [next(iter(s.items())) for s in body.get("sort", [])]
        hits = []
        for doc_id, doc in list(index["docs"].items()):
            if all(self._matches(doc, f) for f in filters):
                keys = [_get(doc, field) for field, _ in sort]
                hits.append({"_index": name, "_id": doc_id, "_source": doc, "sort": keys})
        for position in reversed(range(len(sort))):
            hits.sort(key=lambda h: (h["sort"][position] is None, h["sort"][position] or ""),
                      reverse=sort[position][1] == "desc")
        after = body.get("search_after")
        if after is not None:  # the hits that come after it in this sort order
            hits = [h for h in hits if _after(h["sort"], after, [d for _, d in sort])]
        self._send(200, {"took": 1, "timed_out": False,
                         "hits": {"total": {"value": len(hits), "relation": "eq"},
                                  "hits": hits[:size]}})

    @staticmethod
    def _matches(doc: dict[str, Any], clause: dict[str, Any]) -> bool:
        if "term" in clause:
            field, value = next(iter(clause["term"].items()))
            if isinstance(value, dict):
                value = value.get("value")
            return _get(doc, field) == value
        if "exists" in clause:
            return _get(doc, clause["exists"]["field"]) is not None
        if "bool" in clause:  # OpenSearch's compound query: every part a list or one clause
            parts = {k: v if isinstance(v, list) else [v] for k, v in clause["bool"].items()
                     if k in ("filter", "must", "should", "must_not")}
            match = _Handler._matches
            if not all(match(doc, c) for c in [*parts.get("filter", []),
                                                 *parts.get("must", [])]):
                return False
            if any(match(doc, c) for c in parts.get("must_not", [])):
                return False
            should = parts.get("should", [])
            wanted = int(clause["bool"].get("minimum_should_match", 1 if should else 0))
            return sum(match(doc, c) for c in should) >= wanted
        raise ValueError(f"unsupported clause {clause}")


@contextmanager
def opensearch_server(user: str | None = None,
                      password: str | None = None) -> Iterator[tuple[str, OpenSearchState]]:
    """Run the server on 127.0.0.1 (free port) in a thread; yields (url, state)."""
    state = OpenSearchState(user, password)
    handler = type("Handler", (_Handler,), {"state": state})
    with serve(handler) as port:
        yield f"http://127.0.0.1:{port}", state


def _after(keys: list[Any], after: list[Any], directions: list[str]) -> bool:
    """Whether sort ``keys`` come strictly after ``after``, key by key in each direction."""
    for key, mark, direction in zip(keys, after, directions, strict=False):
        if key == mark:
            continue
        return (key < mark) if direction == "desc" else (key > mark)
    return False
