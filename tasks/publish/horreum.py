"""Horreum export: each cell's LTS document uploaded as one Horreum run, once.

Through httpx, against Horreum's REST API (its published OpenAPI; the test server follows
it for the calls used):

- ``GET /api/test/byName/{name}``: the test's id (a test Telltale does not create: its
  schema, labels and change detection are the Horreum admin's, see docs/publishing.md);
- ``GET /api/run/list/{testId}`` (``sort=start``, ``direction=Descending``, paged): is the
  run already there? A run is known by its description, ``telltale run <run uuid>``;
- ``POST /api/run/data`` (``test``, ``start``, ``stop``, ``owner``, ``access``, ``schema``,
  ``description``; the document as the JSON body): upload it. 202 with the new run ids.

Idempotent by run uuid: a re-export (a retried step, a re-run of the flow on the same
results) finds the run by its description and uploads nothing. The lookup stops at the
first listed run older than the one uploaded (the list is sorted by start, newest first),
so its cost does not grow with the test's history. Transient faults (refused, timed out,
429, 5xx) are retried with backoff; a 4xx fails at once with Horreum's own message and,
for 401/403, what to check — never the credential.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, Field

from analysis.lts import SCHEMA_VERSION, LtsPayload
from blocks.horreum import HorreumInstance
from core.errors import PermanentServiceError, TransientServiceError
from core.redact import redact
from tasks.publish.opensearch import run_document
from tasks.retry import RetryPolicy, call_with_retries

__all__ = ["DEFAULT_SCHEMA_URI", "HorreumClient", "HorreumUpload", "marker", "upload_payloads"]

logger = logging.getLogger("telltale.horreum")

DEFAULT_SCHEMA_URI = f"urn:telltale:lts:{SCHEMA_VERSION}"  # = lts-schema's default $id
"""The ``$schema`` of an uploaded document when the config names none: the LTS payload's
schema version (``python -m analysis lts-schema`` prints the JSON schema to register)."""
PAGE = 50
MAX_PAGES = 200  # a bound on the lookup whatever the server answers


class HorreumUpload(BaseModel):
    """Where and how a run goes: the upload's query parameters (Horreum's names)."""

    test: str = Field(min_length=1, max_length=255, description="Test name in Horreum.")
    owner: str | None = Field(default=None, max_length=255,
                              description="Team that owns the run (a Horreum role).")
    access: Literal["PUBLIC", "PROTECTED", "PRIVATE"] = "PROTECTED"
    schema_uri: str = Field(default=DEFAULT_SCHEMA_URI, max_length=255)


def marker(run_uuid: str) -> str:
    """The description that identifies a Telltale run in Horreum."""
    return f"telltale run {run_uuid}"


def _epoch_ms(text: str) -> int:
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return int(stamp.timestamp() * 1000)


def _message(response: Any) -> str:
    text = response.text.strip()
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            text = str(body.get("message") or body.get("error") or body.get("details") or text)
    except ValueError:
        pass
    return (text or response.reason_phrase or "no message")[:300]


class HorreumClient:
    """The few Horreum calls an upload needs, with retries of transient faults.

    Args:
        instance: URL and credential.
        policy: Retries of each request.
        transport: An httpx transport (tests inject faults with it).
    """

    def __init__(self, instance: HorreumInstance, *, policy: RetryPolicy = RetryPolicy(),
                 transport: Any = None) -> None:
        import httpx

        verify: Any = instance.verify_certs
        if instance.verify_certs and instance.ca_bundle:
            verify = instance.ca_bundle
        self.policy = policy
        self._http = httpx.Client(base_url=instance.url.rstrip("/"), verify=verify,
                                  transport=transport, headers=instance.headers(),
                                  timeout=httpx.Timeout(instance.timeout_s, connect=10.0))

    def __enter__(self) -> HorreumClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, *, what: str, **kwargs: Any) -> Any:
        import httpx

        def once() -> httpx.Response:
            try:
                response = self._http.request(method, path, **kwargs)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                raise TransientServiceError(f"{what}: {type(exc).__name__}: {exc}",
                                            service="horreum") from exc
            status = response.status_code
            if status >= 500 or status == 429:
                raise TransientServiceError(f"{what}: HTTP {status}: {_message(response)}",
                                            service="horreum", status=status)
            if status in (401, 403):
                raise PermanentServiceError(
                    f"{what}: HTTP {status}: Horreum refused the credential (check the "
                    "instance's api_key: a key of a user in the test's owner team, with "
                    "the uploader role)", service="horreum", status=status)
            if status >= 400:
                raise PermanentServiceError(f"{what}: HTTP {status}: {_message(response)}",
                                            service="horreum", status=status)
            return response

        return call_with_retries(once, self.policy, what=f"horreum {what}")

    def test_id(self, name: str) -> int:
        """The id of the test named ``name``.

        Raises:
            PermanentServiceError: No such test (Telltale does not create tests).
        """
        what = f"find test {name!r}"
        try:
            response = self._request("GET", f"/api/test/byName/{quote(name, safe='')}",
                                     what=what)
        except PermanentServiceError as exc:
            if exc.status == 404:
                raise PermanentServiceError(
                    f"{what}: Horreum has no test {name!r}; create it (with the schema "
                    f"{DEFAULT_SCHEMA_URI} or the one configured) before exporting",
                    service="horreum", status=404) from None
            raise
        body = response.json() if response.content else None
        if not isinstance(body, dict) or not isinstance(body.get("id"), int):
            raise PermanentServiceError(f"{what}: Horreum answered no test id",
                                        service="horreum", status=response.status_code)
        return int(body["id"])

    def find_run(self, test_id: int, run_uuid: str, start_ms: int) -> int | None:
        """The id of the run uploaded for ``run_uuid``, or None when there is none."""
        wanted = marker(run_uuid)
        for page in range(1, MAX_PAGES + 1):
            response = self._request(
                "GET", f"/api/run/list/{test_id}", what=f"list runs of test {test_id}",
                params={"limit": PAGE, "page": page, "sort": "start",
                        "direction": "Descending", "trashed": "false"})
            runs = (response.json() or {}).get("runs") or []
            for run in runs:
                if run.get("description") == wanted and isinstance(run.get("id"), int):
                    return int(run["id"])
            older = [r for r in runs if isinstance(r.get("start"), int | float)
                     and r["start"] < start_ms]
            if len(runs) < PAGE or older:
                return None
        return None

    def upload(self, where: HorreumUpload, document: dict[str, Any], *, start: str,
               stop: str, description: str) -> list[int]:
        """Upload one document as a run; returns the ids Horreum created (may be empty)."""
        params = {"test": where.test, "start": start, "stop": stop, "access": where.access,
                  "schema": where.schema_uri, "description": description}
        if where.owner:
            params["owner"] = where.owner
        response = self._request("POST", "/api/run/data", what=f"upload to {where.test!r}",
                                 params=params, content=json.dumps(document, default=str),
                                 headers={"Content-Type": "application/json"})
        if response.status_code == 204:
            logger.warning("Horreum accepted the document for %r but created no run "
                           "(no dataset: check the test's transformers)", where.test)
            return []
        return [int(part) for part in response.text.replace("[", "").replace("]", "")
                .split(",") if part.strip().isdigit()]


def horreum_document(payload: LtsPayload, schema_uri: str, *, valid: bool) -> dict[str, Any]:
    """The uploaded JSON: the run's document (as OpenSearch's) under its ``$schema``, redacted."""
    body = {"$schema": schema_uri, **run_document(payload, valid=valid)}
    return redact(json.loads(json.dumps(body, default=str)))


def upload_payloads(instance: HorreumInstance, payloads: Sequence[LtsPayload],
                    where: HorreumUpload, *, valid: bool = True,
                    policy: RetryPolicy = RetryPolicy(),
                    transport: Any = None) -> dict[str, int]:
    """Upload each payload as a Horreum run unless it is there already.

    Returns:
        ``{"uploaded": n, "present": m}``.

    Raises:
        PermanentServiceError: The test does not exist, a refused credential, a refused
            document (Horreum's message).
        TransientServiceError: The server kept failing or could not be reached.
    """
    counts = {"uploaded": 0, "present": 0}
    with HorreumClient(instance, policy=policy, transport=transport) as horreum:
        test_id = horreum.test_id(where.test)
        for payload in payloads:
            meta = payload.metadata
            if not meta.run_uuid or not meta.start:
                raise PermanentServiceError(
                    f"a payload without a run uuid or a start time ({meta.test_path}) cannot "
                    "be a Horreum run", service="horreum")
            stop = meta.end or meta.start
            existing = horreum.find_run(test_id, meta.run_uuid, _epoch_ms(meta.start))
            if existing is not None:
                logger.info("run %s is already Horreum run %d", meta.run_uuid, existing)
                counts["present"] += 1
                continue
            ids = horreum.upload(where, horreum_document(payload, where.schema_uri,
                                                         valid=valid),
                                 start=meta.start, stop=stop,
                                 description=marker(meta.run_uuid))
            logger.info("run %s uploaded to Horreum test %r%s", meta.run_uuid, where.test,
                        f" as run {ids[0]}" if ids else "")
            counts["uploaded"] += 1
    return counts
