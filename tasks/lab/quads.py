"""QUADS self-scheduling client (QUADS 2.2.x, ``/api/v3``; DESIGN §9).

- Auth: ``POST /login`` with HTTP Basic gives a token (lifetime ~4 h 20 min, no refresh). A
  401 on an authenticated call logs in again once and repeats the call. GETs need no auth.
- Retries (with backoff, `tasks.retry.RetryPolicy`): connection errors, timeouts and 502/503/504
  only. Every 4xx is a `QuadsError` quoting the server's ``message``; a 500 is a server fault,
  reported as such and not retried (2.2.x answers 500 to ``/assignments/self`` when JIRA ticket
  auto-creation is off and a ticket is given, or when auto-creation is on and JIRA unreachable;
  without a ticket and auto-creation off it answers 400). Creating an assignment is never
  retried blindly: a lost answer could leave a second assignment behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from analysis.errors import PermanentServiceError, StepError, TransientServiceError
from blocks.quads import QuadsCredentials
from tasks.retry import RetryPolicy, call_with_retries

__all__ = ["Assignment", "QuadsClient", "QuadsError", "QuadsValidationFailed"]

logger = logging.getLogger("telltale.quads")
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
    """

    def __init__(self, base_url: str, email: str, password: SecretStr, *,
                 verify: bool | str = True, timeout_s: float = 30.0,
                 policy: RetryPolicy = RetryPolicy(), transport: Any = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.email = email
        self._password = password
        self.policy = policy
        self._token: str | None = None
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
              params: Mapping[str, str] | None = None, retry: bool = True) -> Any:
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

        response = call_with_retries(call, self.policy if retry else RetryPolicy(attempts=1),
                                     what=f"quads {method} {path}")
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
        self._token = response.json()["auth_token"]

    def available(self, start: datetime, end: datetime,
                  filters: Mapping[str, Any] | None = None) -> list[str]:
        """Hosts free for self-scheduling between ``start`` and ``end`` matching ``filters``.

        Filters are host metadata paths with optional operator suffixes:
        ``{"model": "R650", "disks.disk_type": "nvme", "interfaces.speed__gte": 100}``.
        """
        params = {"can_self_schedule": "true", "start": start.strftime("%Y-%m-%dT%H:%M"),
                  "end": end.strftime("%Y-%m-%dT%H:%M"), **_filter_params(filters or {})}
        return list(self._send("GET", "/available", auth=False, params=params))

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
        return Assignment.model_validate(self._send("POST", "/assignments/self", auth=True,
                                                    json=body, retry=False))

    def schedule(self, cloud: str, hostname: str) -> dict[str, Any]:
        """Add one host to the assignment's cloud."""
        return dict(self._send("POST", "/schedules", auth=True,
                               json={"cloud": cloud, "hostname": hostname}))

    def assignment(self, assignment_id: int) -> Assignment:
        """Read an assignment."""
        return Assignment.model_validate(self._send("GET", f"/assignments/{assignment_id}",
                                                    auth=False))

    def terminate(self, assignment_id: int) -> None:
        """Release an assignment (idempotent on the server)."""
        self._send("POST", f"/assignments/terminate/{assignment_id}", auth=True)

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
            current = self.assignment(assignment_id)
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
        if "html" in response.headers.get("content-type", "").lower():
            return f"HTTP {response.status_code}: an HTML error page (no details)"
        return f"HTTP {response.status_code}: {response.text[:256]}"
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)[:256]
    return str(body)[:256]
