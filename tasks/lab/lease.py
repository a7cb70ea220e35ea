"""Bare-metal lease lifecycle on QUADS: find hosts, assign, schedule, wait, release.

`leased` is a context manager that releases the assignment in every outcome — success, an
exception in the body, Ctrl-C — unless ``keep``. ``lease.json`` is written in the artifact dir
as soon as the assignment exists (before scheduling and the long wait), so a crash or
cancellation hook running in another process can still release it with `release_from_file`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from analysis.errors import StepError
from tasks.lab.quads import Assignment, QuadsClient

__all__ = ["LEASE_FILE", "Lease", "LeaseRequest", "acquire_lease", "leased",
           "release_from_file"]

logger = logging.getLogger("telltale.quads")
LEASE_FILE = "lease.json"


class LeaseRequest(BaseModel):
    """What to lease (``clusters.sutest.lab`` in the config)."""

    count: int = Field(ge=1, le=10, description="Hosts wanted (≤ 10 per cloud).")
    filters: dict[str, Any] = Field(default_factory=dict, description="Host metadata filters.")
    description: str = Field(default="telltale CPT run", description="Assignment description.")
    wipe: bool = Field(default=True, description="Wipe the hosts before delivery.")
    ticket: str | None = Field(default=None, description="Ticket to attach.")
    wait_hosts_minutes: float = Field(default=60, ge=0, description="Wait for free hosts.")
    wait_delivery_minutes: float = Field(default=240, gt=0, description="Delivery deadline.")
    lease_days: int = Field(default=5, ge=1, description="How long the hosts are asked for.")


class Lease(BaseModel):
    """What was leased (saved as ``lease.json``)."""

    assignment_id: int
    cloud: str
    ticket: str | None = None
    owner: str
    url: str
    hosts: list[str] = Field(default_factory=list)
    state: str = Field(default="assigned",
                       description="assigned, scheduled, delivered, released or kept.")
    created_at: str
    updated_at: str | None = None


def _save(root: Path | None, lease: Lease) -> None:
    if root is None:
        return
    lease.updated_at = datetime.now(UTC).isoformat()
    (root / LEASE_FILE).write_text(lease.model_dump_json(indent=2) + "\n", encoding="utf-8")


def _find_hosts(client: QuadsClient, request: LeaseRequest, sleep: Callable[[float], None],
                poll_s: float) -> list[str]:
    deadline = time.monotonic() + request.wait_hosts_minutes * 60
    while True:
        start = datetime.now(UTC)
        free = client.available(start, start + timedelta(days=request.lease_days),
                                request.filters)
        if len(free) >= request.count:
            return free[: request.count]
        if time.monotonic() >= deadline:
            raise StepError(f"only {len(free)} free host(s) match {request.filters} "
                            f"(need {request.count}) after waiting "
                            f"{request.wait_hosts_minutes:g} min")
        logger.info("%d/%d matching hosts free; waiting", len(free), request.count)
        sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def acquire_lease(client: QuadsClient, request: LeaseRequest, *, root: Path | None = None,
                  poll_s: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                  on_assigned: Callable[[Lease], None] | None = None) -> Lease:
    """Lease hosts: wait for enough free ones, create the assignment, schedule, wait delivery.

    Args:
        client: A logged-in-able QUADS client.
        request: What to lease.
        root: Artifact dir for ``lease.json`` (written as soon as the assignment exists).
        poll_s: Polling period while waiting.
        sleep: Injected for tests.
        on_assigned: Called with the lease once the assignment exists (before the wait).

    Returns:
        The delivered `Lease`.

    Raises:
        StepError: Too few hosts before the deadline, or delivery too slow.
        QuadsValidationFailed: QUADS reported a failed validation.
        QuadsError: QUADS refused a request (the message is the server's).
    """
    hosts = _find_hosts(client, request, sleep, poll_s)
    assignment: Assignment = client.request_assignment(description=request.description,
                                                       ticket=request.ticket, wipe=request.wipe)
    lease = Lease(assignment_id=assignment.id, cloud=assignment.cloud.name,
                  ticket=assignment.ticket, owner=client.owner, url=client.base_url,
                  created_at=datetime.now(UTC).isoformat())
    _save(root, lease)
    if on_assigned is not None:
        on_assigned(lease)
    logger.info("QUADS assignment %d: cloud %s, ticket %s", lease.assignment_id, lease.cloud,
                lease.ticket)
    for host in hosts:
        client.schedule(lease.cloud, host)
        lease.hosts.append(host)
        _save(root, lease)
    lease.state = "scheduled"
    _save(root, lease)

    def progress(current: Assignment, elapsed: float) -> None:
        logger.info("waiting for %s: provisioned=%s validated=%s (%.0f min)", lease.cloud,
                    current.provisioned, current.validated, elapsed / 60)

    client.wait_delivered(lease.assignment_id, deadline_s=request.wait_delivery_minutes * 60,
                          poll_s=poll_s, progress=progress, sleep=sleep)
    lease.state = "delivered"
    _save(root, lease)
    return lease


@contextmanager
def leased(client: QuadsClient, request: LeaseRequest, *, keep: bool = False,
           root: Path | None = None, poll_s: float = 60.0,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[Lease]:
    """Lease hosts for the duration of the block; release them in every outcome unless keep.

    A failure while acquiring (scheduling, validation, deadline) releases what was assigned too.
    """
    holder: dict[str, Lease] = {}
    try:
        lease = acquire_lease(client, request, root=root, poll_s=poll_s, sleep=sleep,
                              on_assigned=lambda value: holder.setdefault("lease", value))
        yield lease
    finally:
        current = holder.get("lease")
        if current is not None:
            if keep:
                current.state = "kept"
                logger.warning("keeping QUADS assignment %d (%s): release it with "
                               "POST /assignments/terminate/%d", current.assignment_id,
                               current.cloud, current.assignment_id)
            else:
                client.terminate(current.assignment_id)
                current.state = "released"
                logger.info("released QUADS assignment %d (%s)", current.assignment_id,
                            current.cloud)
            _save(root, current)


def release_from_file(client: QuadsClient, root: Path) -> bool:
    """Release the lease recorded in ``root/lease.json`` unless released or kept.

    For crash and cancellation hooks, which run in another process and only know the run's
    artifact dir. Returns True when an assignment was terminated.
    """
    path = root / LEASE_FILE
    if not path.is_file():
        return False
    lease = Lease.model_validate(json.loads(path.read_text(encoding="utf-8")))
    if lease.state in ("released", "kept"):
        return False
    client.terminate(lease.assignment_id)
    lease.state = "released"
    _save(root, lease)
    return True
