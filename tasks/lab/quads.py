"""QUADS self-scheduling client (QUADS 2.2.x, ``/api/v3``; DESIGN §9).

- Auth: ``POST /login`` with HTTP Basic gives a token (lifetime ~4 h 20 min, no refresh). A
  401 on an authenticated call logs in again once and repeats the call. GETs need no auth.
- Retries (with backoff, `tasks.retry.RetryPolicy`): connection errors, timeouts and 502/503/504
  only. Every 4xx is a `QuadsError` quoting the server's ``message``; a 500 is a server fault,
  reported as such and not retried (2.2.x answers 500 to ``/assignments/self`` when JIRA ticket
  auto-creation is off and a ticket is given, or when auto-creation is on and JIRA unreachable;
  without a ticket and auto-creation off it answers 400). Creating an assignment is never
  retried blindly: a lost answer could leave a second assignment behind (the lease writes its
  intent first and reconciles with `QuadsClient.active_assignments`).
- Patience: the long delivery wait and the release ride out an outage of minutes
  (`PATIENT`); other calls give up after seconds.
- Time: 2.2.x compares *naive server-local* times and labels them "GMT". Telltale never sends
  its own clock: ``/available`` is asked without ``start``/``end`` (the server's now), and the
  server's offset from UTC is learnt from a fresh timestamp it writes (``created_at`` of a new
  assignment against the response's ``Date`` header) to show the lease's real end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from blocks.quads import QuadsCredentials
from core.errors import PermanentServiceError, StepError, TransientServiceError
from tasks.retry import RetryPolicy, call_with_retries

__all__ = ["PATIENT", "Assignment", "QuadsClient", "QuadsError", "QuadsValidationFailed",
           "server_time"]

logger = logging.getLogger("telltale.quads")

PATIENT = RetryPolicy(attempts=10, backoff_base_s=2.0, backoff_max_s=60.0)
"""For the delivery wait's polls and the release: about 5 minutes of retries, so a QUADS
outage of a few minutes leaves no assignment behind (the default policy gives up in ~8 s)."""


def server_time(value: Any) -> datetime | None:
    """A 2.2.x timestamp as the server means it: naive server-local (the "GMT" is a label)."""
    if not isinstance(value, str):
        return None
    try:
        return parsedate_to_datetime(value).replace(tzinfo=None)
    except (TypeError, ValueError):
        return None
_OPERATORS = ("ne", "lt", "lte", "gt", "gte", "like", "ilike", "in")


class QuadsError(PermanentServiceError):
    """QUADS refused a request (4xx) or failed it (500); the message is the server's."""


class QuadsValidationFailed(StepError):
    """QUADS delivered the hosts but their validation failed (``notification.fail``)."""


class CloudRef(BaseModel):
    """The cloud an assignment lives in."""

    model_config = ConfigDict(extra="ignore")

    name: str
    id: int | None = None


class Assignment(BaseModel):
    """A QUADS assignment as the API returns it (fields Telltale uses)."""

    model_config = ConfigDict(extra="ignore")

    id: int
    cloud: CloudRef
    active: bool = True
    provisioned: bool = False
    validated: bool = False
    ticket: str | None = None
    description: str | None = None
    owner: str | None = None
    notification: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None

    @field_validator("created_at", mode="before")
    @classmethod
    def _rfc1123(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
        return value

    @field_validator("ticket", mode="before")
    @classmethod
    def _ticket_text(cls, value: Any) -> Any:
        return None if value is None else str(value)

    @property
    def failed(self) -> bool:
        """True when QUADS reported a failed validation."""
        return bool(self.notification.get("fail"))


def _filter_params(filters: Mapping[str, Any]) -> dict[str, str]:
    params: dict[str, str] = {}
    for key, value in filters.items():
        path, _, op = key.partition("__")
        if op and op not in _OPERATORS:
            raise QuadsError(f"unknown filter operator {op!r} in {key!r}; use one of "
                             f"{', '.join('__' + o for o in _OPERATORS)}", service="quads")
        if isinstance(value, list | tuple):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = str(value).lower()
        params[f"{path}__{op}" if op else path] = str(value)
    return params


class QuadsClient:
    """A QUADS API session for one user.

    Args:
        base_url: e.g. ``https://quads.example.com/api/v3``.
        email: The user's e-mail.
        password: The user's password.
        verify: TLS verification (bool or CA bundle path).
        timeout_s: Per-request timeout.
        policy: Retry policy for transient faults.
        transport: An httpx transport (tests inject faults with it).
        patient: Retry policy of the delivery wait and the release (`PATIENT`).
    """

    def __init__(self, base_url: str, email: str, password: SecretStr, *,
                 verify: bool | str = True, timeout_s: float = 30.0,
                 policy: RetryPolicy = RetryPolicy(), transport: Any = None,
                 patient: RetryPolicy = PATIENT) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.email = email
        self._password = password
        self.policy = policy
        self.patient = patient
        self._token: str | None = None
        self.clock_offset: timedelta | None = None  # server-local naive time minus UTC
        self._last_date: str | None = None  # the last answer's HTTP Date (true UTC)
        self._http = httpx.Client(base_url=self.base_url, verify=verify, transport=transport,
                                  timeout=httpx.Timeout(timeout_s, connect=10.0))

    def __repr__(self) -> str:
        return f"QuadsClient({self.base_url!r}, email={self.email!r})"

    @classmethod
    def from_credentials(cls, credentials: QuadsCredentials, **kwargs: Any) -> QuadsClient:
        """Build a client from a `blocks.quads.QuadsCredentials` block."""
        return cls(credentials.url, credentials.email, credentials.password,
                   verify=credentials.verify_tls, timeout_s=credentials.timeout_s, **kwargs)

    def close(self) -> None:
        """Close the HTTP session."""
        self._http.close()

    def __enter__(self) -> QuadsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def owner(self) -> str:
        """The owner name QUADS expects: the e-mail's local part."""
        return self.email.split("@", 1)[0]

    # -- transport ---------------------------------------------------------------------------

    def _send(self, method: str, path: str, *, auth: bool, json: Any = None,
              params: Mapping[str, str] | None = None, retry: bool = True,
              policy: RetryPolicy | None = None) -> Any:
        import httpx

        def once() -> httpx.Response:
            headers = {}
            if auth:
                if self._token is None:
                    self.login()
                headers["Authorization"] = f"Bearer {self._token}"
            try:
                response = self._http.request(method, path, json=json, params=params,
                                              headers=headers)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                raise TransientServiceError(f"{method} {path}: {exc}", service="quads") from exc
            if response.status_code in (502, 503, 504):
                raise TransientServiceError(f"{method} {path}: {_message(response)}",
                                            service="quads", status=response.status_code)
            return response

        def call() -> Any:
            response = once()
            if response.status_code == 401 and auth:
                logger.info("QUADS token refused (expired?): logging in again")
                self._token = None
                response = once()
            return response

        chosen = (policy or self.policy) if retry else RetryPolicy(attempts=1)
        response = call_with_retries(call, chosen, what=f"quads {method} {path}")
        self._last_date = response.headers.get("date")
        if response.status_code == 500:
            hint = _SELF_SCHEDULE_500 if path == "/assignments/self" else ""
            raise QuadsError(f"{method} {path}: server fault (HTTP 500): {_message(response)}"
                             f" — not retried{hint}", service="quads", status=500)
        if response.status_code >= 400:
            raise QuadsError(f"{method} {path}: {_message(response)}", service="quads",
                             status=response.status_code)
        return response.json()

    # -- API ---------------------------------------------------------------------------------

    def login(self) -> None:
        """Get a token with HTTP Basic credentials."""
        import httpx

        try:
            response = self._http.post("/login", auth=httpx.BasicAuth(
                self.email, self._password.get_secret_value()))
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise TransientServiceError(f"login: {exc}", service="quads") from exc
        if response.status_code >= 400:
            error = TransientServiceError if response.status_code in (502, 503, 504) else \
                QuadsError
            raise error(f"login as {self.email}: {_message(response)}", service="quads",
                        status=response.status_code)
        try:
            token = response.json()["auth_token"]  # 2.2.6: HTTP 200, status_code 201 inside
        except (ValueError, KeyError, TypeError):
            raise QuadsError(f"login as {self.email}: no token in the answer "
                             f"({_message(response)})", service="quads") from None
        self._token = str(token)

    def available(self, filters: Mapping[str, Any] | None = None, *,
                  start: datetime | None = None, end: datetime | None = None) -> list[str]:
        """Hosts free for self-scheduling matching ``filters``: now, by the server's clock.

        ``start``/``end``, when given, are naive *server-local* times (see `server_now`);
        without them the server uses its own now, so a host freed a minute ago is seen
        whatever the time zones of client and server.

        Filters are host metadata paths with optional operator suffixes:
        ``{"model": "R650", "disks.disk_type": "nvme", "interfaces.speed__gte": 100}``.
        """
        params = {"can_self_schedule": "true", **_filter_params(filters or {})}
        if start is not None:
            params["start"] = start.strftime("%Y-%m-%dT%H:%M")
        if end is not None:
            params["end"] = end.strftime("%Y-%m-%dT%H:%M")
        return list(self._send("GET", "/available", auth=False, params=params))

    def server_now(self) -> datetime | None:
        """The server's naive local now, once its offset is known (None before)."""
        if self.clock_offset is None:
            return None
        return datetime.now(UTC).replace(tzinfo=None) + self.clock_offset

    def to_utc(self, server_local: datetime) -> datetime | None:
        """A naive server-local time as UTC, once the server's offset is known."""
        if self.clock_offset is None:
            return None
        return (server_local - self.clock_offset).replace(tzinfo=UTC)

    def _learn_clock(self, fresh: Any, *, replace: bool = False) -> None:
        """Learn the server's offset from a timestamp it just wrote (vs the HTTP ``Date``).

        ``replace``: a schedule's own start (the zone its end is in) wins over a first guess
        from an assignment's ``created_at``.
        """
        if self.clock_offset is not None and not replace:
            return
        stamp, date = server_time(fresh), self._last_date
        if stamp is None or not date:
            return
        try:
            utc = parsedate_to_datetime(date).astimezone(UTC).replace(tzinfo=None)
        except (TypeError, ValueError):
            return
        quarter = 15 * 60  # time zones are whole quarters of an hour
        seconds = round((stamp - utc).total_seconds() / quarter) * quarter
        self.clock_offset = timedelta(seconds=seconds)

    def active_assignments(self) -> list[Assignment]:
        """This owner's active self-scheduled assignments (for reconciling and the janitor)."""
        answer = self._send("GET", "/assignments", auth=False, params={
            "owner": self.owner, "active": "true", "is_self_schedule": "true"})
        return [Assignment.model_validate(a) for a in answer if isinstance(a, dict)]

    def is_available(self, host: str) -> bool:
        """Whether ``host`` is free now.

        QUADS 2.2.6 answers ``{"<host>": "True"}`` (a string value), and
        ``{"<host>": "False"}`` with HTTP 200 for a host it does not know.
        """
        answer = self._send("GET", f"/available/{host}", auth=False)
        if isinstance(answer, dict):
            answer = answer.get(host, False)
        return str(answer).strip().lower() == "true"

    def request_assignment(self, *, description: str, ticket: str | None = None,
                           wipe: bool = True, qinq: int = 0, vlan: int | None = None,
                           cc_users: list[str] | None = None) -> Assignment:
        """Create a self-scheduled assignment (a cloud); never retried blindly."""
        body: dict[str, Any] = {"description": description, "owner": self.owner,
                                "wipe": wipe, "qinq": qinq}
        if cc_users:  # the server splits a comma-separated string (a list crashes it)
            body["cc_user"] = ",".join(cc_users)
        if ticket:
            body["ticket"] = ticket
        if vlan is not None:
            body["vlan"] = vlan
        answer = self._send("POST", "/assignments/self", auth=True, json=body, retry=False)
        if isinstance(answer, dict):
            self._learn_clock(answer.get("created_at"))
        return Assignment.model_validate(answer)

    def schedule(self, cloud: str, hostname: str) -> dict[str, Any]:
        """Add one host to the assignment's cloud; the answer holds the schedule's real end.

        Raises:
            QuadsError: e.g. 400 "Invalid date range" (self-scheduling closes before the
                lab's weekly deadline: try after it), the host is taken, or the cloud is full.
        """
        try:
            answer = dict(self._send("POST", "/schedules", auth=True,
                                     json={"cloud": cloud, "hostname": hostname}))
        except QuadsError as exc:
            # only the deadline refusal ("Invalid date range"): a taken host's message
            # ("Host is not available for the specified date range") says "date range" too
            if "invalid date range" in exc.detail.lower():
                raise QuadsError(f"{exc.detail} — QUADS sets the end of a self-scheduled host "
                                 "itself (its default lifetime, at most the lab's weekly "
                                 "deadline); close to that deadline it refuses new schedules: "
                                 "try again after it", service="quads",
                                 status=exc.status) from None
            raise
        # The schedule's times are in the app's zone, the one its end is stated in (an
        # assignment's created_at is the database's, which may differ): learn it here.
        self._learn_clock(answer.get("start"), replace=True)
        return answer

    def assignment(self, assignment_id: int, *, patient: bool = False) -> Assignment:
        """Read an assignment (``patient``: ride out an outage of minutes, `PATIENT`)."""
        return Assignment.model_validate(self._send(
            "GET", f"/assignments/{assignment_id}", auth=False,
            policy=self.patient if patient else None))

    def terminate(self, assignment_id: int) -> None:
        """Release an assignment (idempotent on the server); patient, like a release must be."""
        self._send("POST", f"/assignments/terminate/{assignment_id}", auth=True,
                   policy=self.patient)

    def wait_delivered(self, assignment_id: int, *, deadline_s: float, poll_s: float = 60.0,
                       progress: Callable[[Assignment, float], None] | None = None,
                       sleep: Callable[[float], None] = time.sleep) -> Assignment:
        """Poll until provisioned and validated.

        ``notification.fail`` is a one-time notice in QUADS (validation goes on, and later
        answers can read ``validated: true, fail: false``): it is logged, and the wait goes
        on until the deadline.

        Raises:
            QuadsValidationFailed: The deadline passed after QUADS reported a failed
                validation.
            StepError: The deadline passed otherwise.
        """
        started = time.monotonic()
        noticed: float | None = None
        while True:
            current = self.assignment(assignment_id, patient=True)
            elapsed = time.monotonic() - started
            if progress is not None:
                progress(current, elapsed)
            if current.provisioned and current.validated:
                return current
            if current.failed and noticed is None:
                noticed = elapsed
                logger.warning("QUADS reports a failed validation of assignment %d (%s): "
                               "waiting, validation goes on", assignment_id,
                               current.cloud.name)
            if elapsed >= deadline_s:
                if noticed is not None:
                    raise QuadsValidationFailed(
                        f"QUADS validation of assignment {assignment_id} "
                        f"({current.cloud.name}, ticket {current.ticket}) failed at "
                        f"{noticed / 60:.0f} min and did not pass before the deadline "
                        f"({elapsed / 60:.0f} min)")
                raise StepError(f"assignment {assignment_id} ({current.cloud.name}) not "
                                f"delivered after {elapsed / 60:.0f} min "
                                f"(provisioned={current.provisioned}, "
                                f"validated={current.validated})")
            sleep(min(poll_s, max(0.0, deadline_s - elapsed)))


_SELF_SCHEDULE_500 = (
    ". On QUADS 2.2.x a self-schedule request fails this way when JIRA ticket auto-creation "
    "is off and a ticket is given (without a ticket the server answers 400 'Missing Jira "
    "ticket number'), and when auto-creation is on but JIRA is unreachable: ask the lab "
    "admins to enable auto-ticketing and check the JIRA connection")


def _message(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        if "html" in response.headers.get("content-type", "").lower() and (
                "<" in text or len(text) > 120):
            return f"HTTP {response.status_code}: an HTML error page (no details)"
        # plain words (2.2.6 answers 401 "Unauthorized Access" as text/html)
        return f"HTTP {response.status_code}: {text[:120]}"
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)[:256]
    return str(body)[:256]
