"""A stateful QUADS 2.2.x (``/api/v3``) server for tests, on 127.0.0.1.

Follows the documented API (DESIGN §9): ``/register``, ``/login`` (HTTP Basic → token with a
lifetime; a bad or expired token gives 401, missing auth 400), ``/available`` with metadata
filters and operator suffixes, ``/available/<host>`` answering ``{"<host>": "True"}`` or
``{"<host>": "False"}`` (200, unknown hosts too), ``/assignments/self`` (201; 403 when self-scheduling is off or the per-user limit
is reached; 400 business errors; 500 when ticket auto-creation is off, like some 2.2.x
servers), ``/schedules`` (≤ 10 hosts per cloud), ``/assignments/<id>`` and
``/assignments/terminate/<id>`` (idempotent, owner only). Dates are RFC 1123 strings; errors
are ``{status_code, error, message}``.

Test controls on `QuadsState`: ``deliver(id, fail=False)`` marks an assignment provisioned and
validated (or failed validation), ``auto_deliver_after`` delivers after N polls,
``expire_tokens()``, ``fail_next(n, status)``.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlparse

from tests.servers import serve


def _now() -> str:
    return formatdate(time.time(), usegmt=True)


def _lookup(meta: Any, path: str) -> list[Any]:
    """Values at a dotted metadata path (lists are searched element by element)."""
    nodes = [meta]
    for part in path.split("."):
        nxt: list[Any] = []
        for node in nodes:
            if isinstance(node, list):
                nxt.extend(n.get(part) for n in node if isinstance(n, dict) and part in n)
            elif isinstance(node, dict) and part in node:
                nxt.append(node[part])
        nodes = nxt
    return nodes


def _compare(value: Any, op: str, wanted: str) -> bool:
    if op == "like":
        return str(wanted).strip("%") in str(value)
    if op == "ilike":
        return str(wanted).strip("%").lower() in str(value).lower()
    if op == "in":
        return str(value) in [w.strip() for w in wanted.split(",")]
    if op == "ne":
        return str(value) != wanted
    try:
        left, right = float(value), float(wanted)
    except (TypeError, ValueError):
        left, right = str(value), wanted  # type: ignore[assignment]
    return {"lt": left < right, "lte": left <= right, "gt": left > right,
            "gte": left >= right, "eq": str(value) == wanted}[op]


class QuadsState:
    """Hosts, clouds, users, tokens and assignments."""

    def __init__(self, hosts: dict[str, dict[str, Any]], *, token_lifetime_s: float = 15600,
                 per_user_limit: int = 3) -> None:
        self.lock = threading.Lock()
        self.hosts = hosts
        self.scheduled: dict[str, str] = {}  # host -> cloud
        self.users: dict[str, str] = {}
        self.tokens: dict[str, tuple[str, float]] = {}
        self.token_lifetime_s = token_lifetime_s
        self.per_user_limit = per_user_limit
        self.self_schedule = True
        self.ticket_autocreate = True
        self.assignments: dict[int, dict[str, Any]] = {}
        self.next_id = 1
        self.failures: list[int] = []
        self.auto_deliver_after: int | None = None
        self.polls: dict[int, int] = {}
        self.requests: list[tuple[str, str, int]] = []
        self.logins = 0

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status``."""
        with self.lock:
            self.failures.extend([status] * count)

    def expire_tokens(self) -> None:
        """Make every issued token expired (the next authenticated call gets 401)."""
        with self.lock:
            self.tokens = {t: (email, 0.0) for t, (email, _) in self.tokens.items()}

    def deliver(self, assignment_id: int, *, fail: bool = False) -> None:
        """Finish provisioning: validated, or a failed validation."""
        with self.lock:
            assignment = self.assignments[assignment_id]
            assignment["provisioned"] = True
            assignment["validated"] = not fail
            assignment["notification"]["fail"] = fail
            assignment["notification"]["success"] = not fail

    def revalidate(self, assignment_id: int) -> None:
        """What QUADS does after a failed validation: it validates again and passes."""
        with self.lock:
            assignment = self.assignments[assignment_id]
            assignment["validated"] = True
            assignment["notification"]["fail"] = False
            assignment["notification"]["success"] = True

    def active_for(self, user: str) -> list[dict[str, Any]]:
        """Active assignments created by ``user`` (an e-mail)."""
        return [a for a in self.assignments.values() if a["user"] == user and a["active"]]


class _Handler(BaseHTTPRequestHandler):
    state: QuadsState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.state.requests.append((self.command, self.path, status))

    def _error(self, status: int, error: str, message: str) -> None:
        self._send(status, {"status_code": status, "error": error, "message": message})

    def _json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return {}

    def _user(self) -> str | None:
        """Authenticated user, or None after having sent 400/401."""
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            entry = self.state.tokens.get(header[len("Bearer "):])
            if entry is None or entry[1] < time.time():
                self._error(401, "Unauthorized", "Invalid or expired token")
                return None
            return entry[0]
        if header.startswith("Basic "):
            email, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.state.users.get(email) != password:
                self._error(401, "Unauthorized", "Invalid credentials")
                return None
            return email
        self._error(400, "Bad Request", "Missing authentication")
        return None

    def _fault(self) -> bool:
        with self.state.lock:
            status = self.state.failures.pop(0) if self.state.failures else None
        if status is None:
            return False
        self._json()
        self._error(status, "Service Unavailable", "injected fault")
        return True

    def do_GET(self) -> None:  # noqa: N802
        if self._fault():
            return
        url = urlparse(self.path)
        parts = url.path.removeprefix("/api/v3").strip("/").split("/")
        if parts[0] == "available" and len(parts) == 1:
            self._available(dict(parse_qsl(url.query)))
        elif parts[0] == "available" and len(parts) == 2:
            host = parts[1]  # 2.2.6: a mapping with a string value, 200 even when unknown
            free = host in self.state.hosts and host not in self.state.scheduled
            self._send(200, {host: "True" if free else "False"})
        elif parts[0] == "assignments" and len(parts) == 2 and parts[1].isdigit():
            assignment = self.state.assignments.get(int(parts[1]))
            if assignment is None:
                self._error(404, "Not Found", f"Assignment not found: {parts[1]}")
                return
            polls = self.state.polls[assignment["id"]] = self.state.polls.get(
                assignment["id"], 0) + 1
            if self.state.auto_deliver_after is not None and polls >= \
                    self.state.auto_deliver_after and not assignment["provisioned"]:
                self.state.deliver(assignment["id"])
            self._send(200, assignment)
        else:
            self._error(404, "Not Found", f"No route {url.path}")

    def _available(self, query: dict[str, str]) -> None:
        for key in ("start", "end"):
            if key in query:
                try:
                    time.strptime(query[key], "%Y-%m-%dT%H:%M")
                except ValueError:
                    self._error(400, "Bad Request", f"Invalid date format for {key}")
                    return
        filters = {k: v for k, v in query.items()
                   if k not in ("start", "end", "can_self_schedule")}
        hosts = []
        for name, meta in sorted(self.state.hosts.items()):
            if name in self.state.scheduled:
                continue
            ok = True
            for key, wanted in filters.items():
                path, _, op = key.partition("__")
                values = _lookup(meta, path)
                if not any(_compare(v, op or "eq", wanted) for v in values):
                    ok = False
            if ok:
                hosts.append(name)
        self._send(200, hosts)

    def do_POST(self) -> None:  # noqa: N802
        if self._fault():
            return
        path = urlparse(self.path).path.removeprefix("/api/v3").strip("/")
        if path == "register":
            body = self._json()
            if not body.get("email") or not body.get("password"):
                self._error(400, "Bad Request", "Missing email or password")
                return
            self.state.users[body["email"]] = body["password"]
            self._send(201, {"status_code": 201, "message": "Successfully registered"})
            return
        if path == "login":
            self._json()
            header = self.headers.get("Authorization", "")
            if not header.startswith("Basic "):
                self._error(400, "Bad Request", "Missing authentication")
                return
            email, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.state.users.get(email) != password:
                self._error(401, "Unauthorized", "Invalid credentials")
                return
            token = secrets.token_hex(16)
            self.state.tokens[token] = (email, time.time() + self.state.token_lifetime_s)
            self.state.logins += 1
            self._send(201, {"auth_token": token, "message": "Successfully logged in",
                             "status_code": 201})
            return
        body = self._json()
        user = self._user()
        if user is None:
            return
        if path == "assignments/self":
            self._self_assign(user, body)
        elif path == "schedules":
            self._schedule(user, body)
        elif path.startswith("assignments/terminate/"):
            self._terminate(user, path.rsplit("/", 1)[1])
        else:
            self._error(404, "Not Found", f"No route {path}")

    def _self_assign(self, user: str, body: dict[str, Any]) -> None:
        state = self.state
        if not state.self_schedule:
            self._error(403, "Forbidden", "Self scheduling is disabled")
            return
        if len(state.active_for(user)) >= state.per_user_limit:
            self._error(403, "Forbidden", "Self scheduling limit reached")
            return
        for field in ("description", "owner"):
            if not body.get(field):
                self._error(400, "Bad Request", f"Missing argument: {field}")
                return
        if "cc_user" in body and not isinstance(body["cc_user"], str):
            self._html_500()  # 2.2.6 splits a comma-separated string; a list crashes it
            return
        if not state.ticket_autocreate:  # 2.2.6 with JIRA auto-ticketing off
            if not body.get("ticket"):
                self._error(400, "Bad Request", "Missing Jira ticket number while automatic "
                                                "ticket creation is disabled")
            else:  # TypeError ... missing 'ticket' inside the server
                self._html_500()
            return
        with state.lock:
            used = {a["cloud"]["name"] for a in state.assignments.values() if a["active"]}
            cloud = next((f"cloud{n:02d}" for n in range(2, 33) if f"cloud{n:02d}" not in used),
                         None)
            if cloud is None:
                self._error(400, "Bad Request", "No free cloud available")
                return
            assignment = {
                "id": state.next_id, "active": True, "provisioned": False, "validated": False,
                "description": body["description"], "owner": body["owner"],
                "ticket": body.get("ticket") or f"{1000 + state.next_id}",
                "qinq": body.get("qinq", 0), "wipe": bool(body.get("wipe", True)),
                "ccuser": [u for u in str(body.get("cc_user") or "").replace(" ", ",")
                           .split(",") if u], "created_at": _now(),
                "cloud": {"id": int(cloud[5:]), "name": cloud, "last_redefined": _now()},
                "vlan": body.get("vlan"), "is_self_schedule": True, "user": user,
                "notification": {"fail": False, "success": False, "initial": True,
                                 "pre": False, "pre_initial": False, "one_day": False,
                                 "three_days": False, "five_days": False, "seven_days": False},
            }
            state.assignments[state.next_id] = assignment
            state.next_id += 1
        self._send(201, assignment)

    def _html_500(self) -> None:
        """What a crashing QUADS answers: Flask's HTML error page, not JSON."""
        page = (b"<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
                b"<h1>Internal Server Error</h1>\n<p>The server encountered an internal error "
                b"and was unable to complete your request.</p>\n")
        self.send_response(500)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)
        self.state.requests.append((self.command, self.path, 500))

    def _schedule(self, user: str, body: dict[str, Any]) -> None:
        state = self.state
        host, cloud = body.get("hostname"), body.get("cloud")
        assignment = next((a for a in state.assignments.values() if a["active"] and
                           a["cloud"]["name"] == cloud), None)
        if assignment is None:
            self._error(400, "Bad Request", f"No active assignment for cloud {cloud}")
            return
        if assignment["user"] != user:
            self._error(403, "Forbidden", "Not the owner of this assignment")
            return
        if host not in state.hosts:
            self._error(400, "Bad Request", f"Host not found: {host}")
            return
        with state.lock:
            if host in state.scheduled:
                self._error(400, "Bad Request", f"Host {host} is not available")
                return
            if sum(1 for c in state.scheduled.values() if c == cloud) >= 10:
                self._error(400, "Bad Request", "Self schedule host limit reached")
                return
            state.scheduled[host] = cloud
        self._send(201, {"id": len(state.scheduled), "host": {"name": host},
                         "assignment_id": assignment["id"], "start": _now(), "end": _now(),
                         "build_start": None, "build_end": None})

    def _terminate(self, user: str, raw_id: str) -> None:
        state = self.state
        assignment = state.assignments.get(int(raw_id)) if raw_id.isdigit() else None
        if assignment is None:
            self._error(400, "Bad Request", f"Assignment not found: {raw_id}")
            return
        if assignment["user"] != user:
            self._error(403, "Forbidden", "Not the owner of this assignment")
            return
        with state.lock:
            assignment["active"] = False
            for host, cloud in list(state.scheduled.items()):
                if cloud == assignment["cloud"]["name"]:
                    del state.scheduled[host]
        self._send(200, {"status_code": 200, "message": "Assignment terminated"})


@contextmanager
def quads_server(hosts: dict[str, dict[str, Any]] | None = None,
                 **kwargs: Any) -> Iterator[tuple[str, QuadsState]]:
    """Run the server on 127.0.0.1 (free port) in a thread; yields (base URL, state)."""
    if hosts is None:
        hosts = {f"host{i:02d}.example.com": {
            "model": "R650" if i < 6 else "R640",
            "disks": [{"disk_type": "nvme" if i % 2 == 0 else "ssd", "size_gb": 960}],
            "interfaces": [{"vendor": "Mellanox Technologies", "speed": 100}],
        } for i in range(10)}
    state = QuadsState(hosts, **kwargs)
    handler = type("Handler", (_Handler,), {"state": state})
    with serve(handler) as port:
        yield f"http://127.0.0.1:{port}/api/v3", state
