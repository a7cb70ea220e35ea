"""A stateful QUADS 2.2.6 (``/api/v3``) server for tests, on 127.0.0.1.

Answers like the real 2.2.6 where Telltale depends on it (DESIGN §9, and what a real server
answered when Telltale was tried against one):

- time: the server compares *naive server-local* times and labels them "GMT" (RFC 1123);
  ``tz_offset_hours`` puts the server in another time zone than the client
  (``db_tz_offset_hours``: its database in yet another, as ``created_at`` shows);
- ``/register`` → 200 with a token, 401 "User already exists. Please Log in."; ``/login``
  (HTTP Basic) → HTTP 200 with ``status_code: 201`` in the body; bad or missing credentials
  and bad tokens → 401 ``text/html`` "Unauthorized Access";
- ``/available`` honours ``start``/``end`` (server-local, default: the server's now),
  ``can_self_schedule``, broken and retired hosts, metadata filters with operator suffixes;
  ``/available/<host>`` → ``{"<host>": "True"|"False"}`` (200, unknown hosts too);
- ``POST /assignments/self`` → 201, description prefixed ``[SSM] ``; 403 "Service not
  enabled"; per-user limit keyed by the e-mail's local part; 400 "No free clouds available";
  400 "Missing Jira ticket number ..." / HTML 500 with JIRA auto-ticketing off; HTML 500 for a
  ``cc_user`` list;
- ``POST /schedules`` → 200 with the schedule and its real end (``ssm_default_lifetime``
  days, at most the weekly deadline; close to it: 400 "Invalid date range"); no ownership
  check (real QUADS has none); host limit per cloud (``ssm_host_limit``): 400 "Cloud cloudNN
  has reached the maximum number of hosts";
- ``GET /assignments?owner=&active=&is_self_schedule=``; unknown assignment → 400;
- ``POST /assignments/terminate/<id>`` ends the schedules *now* (the hosts are free from the
  next minute); provisioning comes before validation.

Test controls on `QuadsState`: ``deliver(id, fail=False)``, ``auto_deliver_after`` (polls
before provisioned; validated one poll later), ``revalidate``, ``expire_tokens()``,
``fail_next(n, status)``, ``advance(minutes)`` (the server's clock), ``down`` (an outage:
every connection is dropped unanswered; ``drop_next(n)`` for n requests),
``after_available`` (a callback: another user takes a host) and ``lose_next(path)`` (the request is carried out,
its answer lost: the connection drops).
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlparse

from tests.servers import serve

_UNAUTHORIZED = b"Unauthorized Access"
_HTML_500 = (b"<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
             b"<h1>Internal Server Error</h1>\n<p>The server encountered an internal error and "
             b"was unable to complete your request.</p>\n")


def _rfc1123(naive: datetime) -> str:
    """How 2.2.x writes its naive server-local times: labelled GMT although they are not."""
    return format_datetime(naive.replace(tzinfo=UTC), usegmt=True)


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
    """Hosts, clouds, users, tokens, assignments, schedules and the server's clock."""

    def __init__(self, hosts: dict[str, dict[str, Any]], *, token_lifetime_s: float = 15600,
                 per_user_limit: int = 3, tz_offset_hours: float = 0.0,
                 db_tz_offset_hours: float | None = None, ssm_host_limit: int = 10, ssm_default_lifetime_days: float = 2.8) -> None:
        self.lock = threading.RLock()
        self.hosts = hosts
        self.schedules: list[dict[str, Any]] = []
        self.users: dict[str, str] = {}
        self.tokens: dict[str, tuple[str, float]] = {}
        self.token_lifetime_s = token_lifetime_s
        self.per_user_limit = per_user_limit
        self.tz_offset = timedelta(hours=tz_offset_hours)
        # the database's zone (its created_at) may differ from the app's (schedule times)
        self.db_tz_offset = timedelta(hours=tz_offset_hours if db_tz_offset_hours is None
                                      else db_tz_offset_hours)
        self.skew = timedelta(0)
        self.ssm_host_limit = ssm_host_limit
        self.ssm_default_lifetime = timedelta(days=ssm_default_lifetime_days)
        self.near_weekly_deadline = False
        self.self_schedule = True
        self.ticket_autocreate = True
        self.assignments: dict[int, dict[str, Any]] = {}
        self.next_id = 1
        self.failures: list[int] = []
        self.auto_deliver_after: int | None = None
        self.polls: dict[int, int] = {}
        self.requests: list[tuple[str, str, int]] = []
        self.logins = 0
        self.down = False
        self.down_requests = 0
        self.lose: list[str] = []
        self.after_available: Any = None  # called after answering /available (races)

    # -- clock --------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The server's naive local time (what 2.2.x compares and labels "GMT")."""
        return datetime.now(UTC).replace(tzinfo=None) + self.tz_offset + self.skew

    def db_now(self) -> datetime:
        """The database's naive local time (an assignment's ``created_at``)."""
        return datetime.now(UTC).replace(tzinfo=None) + self.db_tz_offset + self.skew

    def advance(self, minutes: float) -> None:
        """Move the server's clock forward."""
        with self.lock:
            self.skew += timedelta(minutes=minutes)

    # -- controls -----------------------------------------------------------------------------

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status``."""
        with self.lock:
            self.failures.extend([status] * count)

    def drop_next(self, count: int) -> None:
        """An outage of ``count`` requests: each connection is dropped unanswered."""
        with self.lock:
            self.down_requests += count

    def lose_next(self, path: str) -> None:
        """Carry out the next request to ``path`` (after /api/v3), then drop its answer."""
        with self.lock:
            self.lose.append(path.strip("/"))

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

    # -- queries ------------------------------------------------------------------------------

    def active_for(self, owner: str) -> list[dict[str, Any]]:
        """Active assignments of ``owner`` (the e-mail's local part, as QUADS keys them)."""
        return [a for a in self.assignments.values() if a["owner"] == owner and a["active"]]

    def busy(self, host: str, start: datetime, end: datetime) -> bool:
        """Whether a schedule of ``host`` overlaps ``[start, end]`` (server-local)."""
        return any(s["host"] == host and s["start"] <= end and s["end"] >= start
                   for s in self.schedules)

    def free_now(self, host: str) -> bool:
        now = self.now()
        return host in self.hosts and not self.busy(host, now, now)

    @property
    def scheduled(self) -> dict[str, str]:
        """Host → cloud of the schedules running now."""
        now = self.now()
        return {s["host"]: s["cloud"] for s in self.schedules
                if s["start"] <= now <= s["end"]}


class _Dropped(Exception):
    """The connection is dropped without an answer (an outage or a lost response)."""


class _Handler(BaseHTTPRequestHandler):
    state: QuadsState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _raw(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.state.requests.append((self.command, self.path, status))

    def _send(self, status: int, body: Any) -> None:
        self._raw(status, json.dumps(body).encode(), "application/json")

    def _error(self, status: int, error: str, message: str) -> None:
        self._send(status, {"status_code": status, "error": error, "message": message})

    def _unauthorized(self) -> None:
        self._raw(401, _UNAUTHORIZED, "text/html; charset=utf-8")

    def _html_500(self) -> None:
        """What a crashing QUADS answers: Flask's HTML error page, not JSON."""
        self._raw(500, _HTML_500, "text/html; charset=utf-8")

    def _json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {}

    def _basic(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        email, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return email if self.state.users.get(email) == password else None

    def _user(self) -> str | None:
        """Authenticated e-mail, or None after having answered 401."""
        header = self.headers.get("Authorization", "")
        email = None
        if header.startswith("Bearer "):
            entry = self.state.tokens.get(header[len("Bearer "):])
            if entry is not None and entry[1] >= time.time():
                email = entry[0]
        elif header.startswith("Basic "):
            email = self._basic()
        if email is None:
            self._unauthorized()
        return email

    def _before(self, path: str) -> bool:
        """Outage, injected faults; True when the request was answered (or dropped)."""
        with self.state.lock:
            dropped = self.state.down or self.state.down_requests > 0
            if self.state.down_requests > 0:
                self.state.down_requests -= 1
        if dropped:
            self._json()
            raise _Dropped
        with self.state.lock:
            status = self.state.failures.pop(0) if self.state.failures else None
        if status is None:
            return False
        self._json()
        self._error(status, "Service Unavailable", "injected fault")
        return True

    def _dispatch(self, method: Any) -> None:
        try:
            method()
        except _Dropped:
            self.close_connection = True
        except Exception:  # noqa: BLE001 - a real Flask app answers an HTML 500
            self._html_500()

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch(self._post)

    def _get(self) -> None:
        url = urlparse(self.path)
        if self._before(url.path):
            return
        parts = url.path.removeprefix("/api/v3").strip("/").split("/")
        query = dict(parse_qsl(url.query))
        if parts[0] == "available" and len(parts) == 1:
            self._available(query)
        elif parts[0] == "available" and len(parts) == 2:
            host = parts[1]  # 2.2.6: a mapping with a string value, 200 even when unknown
            self._send(200, {host: str(self.state.free_now(host))})
        elif parts[0] == "assignments" and len(parts) == 1:
            self._list_assignments(query)
        elif parts[0] == "assignments" and len(parts) == 2:
            assignment = self.state.assignments.get(int(parts[1])) if parts[1].isdigit() \
                else None
            if assignment is None:
                self._error(400, "Bad Request", f"Assignment not found: {parts[1]}")
                return
            self._poll(assignment)
            self._send(200, assignment)
        else:
            self._error(404, "Not Found", f"No route {url.path}")

    def _poll(self, assignment: dict[str, Any]) -> None:
        """auto_deliver_after: provisioned after N polls, validated one poll later."""
        state = self.state
        polls = state.polls[assignment["id"]] = state.polls.get(assignment["id"], 0) + 1
        if state.auto_deliver_after is None or not assignment["active"]:
            return
        if polls >= state.auto_deliver_after and not assignment["provisioned"]:
            assignment["provisioned"] = True
        elif polls > state.auto_deliver_after and not assignment["validated"]:
            state.deliver(assignment["id"])

    def _list_assignments(self, query: dict[str, str]) -> None:
        def keep(a: dict[str, Any]) -> bool:
            for key, wanted in query.items():
                value = a.get(key)
                if isinstance(value, bool):
                    if str(value).lower() != wanted.lower():
                        return False
                elif str(value) != wanted:
                    return False
            return True

        self._send(200, [a for a in self.state.assignments.values() if keep(a)])

    def _available(self, query: dict[str, str]) -> None:
        state = self.state
        start = end = state.now()
        try:
            if query.get("start"):
                start = datetime.strptime(query["start"], "%Y-%m-%dT%H:%M")
            if query.get("end"):
                end = datetime.strptime(query["end"], "%Y-%m-%dT%H:%M")
        except ValueError:
            self._error(400, "Bad Request", "Invalid date format for start or end, correct "
                                            "format: 'YYYY-MM-DDTHH:MM'")
            return
        if start > end:
            end = start + timedelta(minutes=1)
        self_schedule = query.get("can_self_schedule", "").lower() == "true"
        filters = {k: v for k, v in query.items()
                   if k not in ("start", "end", "can_self_schedule", "cloud")}
        hosts = []
        for name, meta in sorted(state.hosts.items()):
            if meta.get("broken") or meta.get("retired") or state.busy(name, start, end):
                continue
            if self_schedule and not meta.get("can_self_schedule", True):
                continue
            if all(any(_compare(v, op or "eq", wanted) for v in _lookup(meta, path))
                   for key, wanted in filters.items()
                   for path, _, op in [key.partition("__")]):
                hosts.append(name)
        self._send(200, hosts)
        if state.after_available is not None:
            state.after_available()

    def _post(self) -> None:
        path = urlparse(self.path).path.removeprefix("/api/v3").strip("/")
        if self._before(path):
            return
        lose = False
        with self.state.lock:
            if path in self.state.lose:
                self.state.lose.remove(path)
                lose = True
        if path == "register":
            body = self._json()
            if not body.get("email") or not body.get("password"):
                self._error(400, "Bad Request", "Missing email or password")
            elif body["email"] in self.state.users:
                self._error(401, "Unauthorized", "User already exists. Please Log in.")
            else:
                self.state.users[body["email"]] = body["password"]
                token = self._token(body["email"])
                self._send(200, {"status_code": 201, "auth_token": token,
                                 "message": "Successfully registered"})
            return
        if path == "login":
            self._json()
            email = self._basic()
            if email is None:
                self._unauthorized()
                return
            self.state.logins += 1
            self._send(200, {"status_code": 201, "auth_token": self._token(email),
                             "message": "Successfully logged in"})
            return
        body = self._json()
        user = self._user()
        if user is None:
            return
        if path == "assignments/self":
            answer = self._self_assign(user, body)
        elif path == "schedules":
            answer = self._schedule(body)
        elif path.startswith("assignments/terminate/"):
            answer = self._terminate(path.rsplit("/", 1)[1])
        else:
            answer = (404, {"status_code": 404, "error": "Not Found",
                            "message": f"No route {path}"})
        if answer is None:  # answered already (an HTML 500)
            return
        if lose and answer[0] < 400:
            raise _Dropped  # committed, but the client never hears of it
        self._send(*answer)

    def _token(self, email: str) -> str:
        token = secrets.token_hex(16)
        self.state.tokens[token] = (email, time.time() + self.state.token_lifetime_s)
        return token

    @staticmethod
    def _bad(status: int, message: str) -> tuple[int, dict[str, Any]]:
        error = {400: "Bad Request", 403: "Forbidden"}.get(status, "Error")
        return status, {"status_code": status, "error": error, "message": message}

    def _self_assign(self, user: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        state = self.state
        owner = user.split("@", 1)[0]  # 2.2.6 keys the limit by the e-mail's local part
        if not state.self_schedule:
            return self._bad(403, "Service not enabled")
        if len(state.active_for(owner)) >= state.per_user_limit:
            return self._bad(403, "Self scheduling limit reached")
        for field in ("description", "owner"):
            if not body.get(field):
                return self._bad(400, f"Missing argument: {field}")
        if "cc_user" in body and not isinstance(body["cc_user"], str):
            self._html_500()  # 2.2.6 splits a comma-separated string; a list crashes it
            return None
        if not state.ticket_autocreate:  # 2.2.6 with JIRA auto-ticketing off
            if not body.get("ticket"):
                return self._bad(400, "Missing Jira ticket number while automatic ticket "
                                      "creation is disabled")
            self._html_500()  # TypeError ... missing 'ticket' inside the server
            return None
        with state.lock:
            used = {a["cloud"]["name"] for a in state.assignments.values() if a["active"]}
            cloud = next((f"cloud{n:02d}" for n in range(2, 33) if f"cloud{n:02d}" not in used),
                         None)
            if cloud is None:
                return self._bad(400, "No free clouds available")
            now = _rfc1123(state.db_now())
            assignment = {
                "id": state.next_id, "active": True, "provisioned": False, "validated": False,
                "description": f"[SSM] {body['description']}", "owner": body["owner"],
                "ticket": str(body.get("ticket") or 1000 + state.next_id),
                "qinq": body.get("qinq", 0), "wipe": bool(body.get("wipe", True)),
                "ccuser": [u for u in str(body.get("cc_user") or "").replace(" ", ",")
                           .split(",") if u], "created_at": now,
                "cloud": {"id": int(cloud[5:]), "name": cloud, "last_redefined": now},
                "vlan": body.get("vlan"), "is_self_schedule": True,
                "notification": {"fail": False, "success": False, "initial": True,
                                 "pre": False, "pre_initial": False, "one_day": False,
                                 "three_days": False, "five_days": False, "seven_days": False},
            }
            state.assignments[state.next_id] = assignment
            state.next_id += 1
        return 201, assignment

    def _schedule(self, body: dict[str, Any]) -> tuple[int, Any]:
        state = self.state
        host, cloud = body.get("hostname"), body.get("cloud")
        assignment = next((a for a in state.assignments.values() if a["active"] and
                           a["cloud"]["name"] == cloud), None)
        if assignment is None:
            return self._bad(400, f"No active assignment for cloud {cloud}")
        if host not in state.hosts:
            return self._bad(400, f"Host not found: {host}")
        with state.lock:
            now = state.now()
            end = now + state.ssm_default_lifetime
            if state.near_weekly_deadline:
                return self._bad(400, "Invalid date range")
            if state.busy(host, now, end):
                return self._bad(400, f"Host {host} is not available for the requested "
                                      "date range")
            running = {s["host"] for s in state.schedules
                       if s["cloud"] == cloud and s["end"] >= now}
            if len(running) >= state.ssm_host_limit:
                return self._bad(400, f"Cloud {cloud} has reached the maximum number of hosts")
            schedule = {"id": len(state.schedules) + 1, "host": host, "cloud": cloud,
                        "assignment_id": assignment["id"], "start": now, "end": end}
            state.schedules.append(schedule)
        return 200, {"id": schedule["id"], "host": {"name": host},
                     "assignment_id": assignment["id"], "start": _rfc1123(now),
                     "end": _rfc1123(end), "build_start": None, "build_end": None}

    def _terminate(self, raw_id: str) -> tuple[int, Any]:
        state = self.state
        assignment = state.assignments.get(int(raw_id)) if raw_id.isdigit() else None
        if assignment is None:
            return self._bad(400, f"Assignment not found: {raw_id}")
        with state.lock:
            now = state.now()
            assignment["active"] = False
            for schedule in state.schedules:  # ends now: free from the next minute
                if schedule["assignment_id"] == assignment["id"] and schedule["end"] > now:
                    schedule["end"] = now
        return 200, {"status_code": 200, "message": "Assignment terminated"}


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


def impatient_tenant(url: str, state: QuadsState, secret_dir: Any) -> None:
    """Register perf@example.com and write its QUADS secret file with short patience (two
    attempts, no backoff), deliveries after one poll: a run that leases and, when QUADS goes
    down, gives up its release quickly (the leftovers path)."""
    import httpx
    import yaml

    httpx.post(f"{url}/register", json={"email": "perf@example.com", "password": "pw"})
    (secret_dir / "quads.yaml").write_text(yaml.safe_dump({
        "url": url, "email": "perf@example.com", "password": "pw",
        "patience_attempts": 2, "patience_backoff_max_s": 0}))
    state.auto_deliver_after = 1
