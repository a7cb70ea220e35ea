"""Bare-metal lease lifecycle on QUADS: find hosts, assign, schedule, wait, release.

`leased` is a context manager that releases the assignment in every outcome — success, an
exception in the body, Ctrl-C — unless ``keep``. No assignment may be left behind:

- the *intent* is written to ``lease.json`` (state ``requesting``, with the run's marker in the
  description) before ``POST /assignments/self``; a lost answer is reconciled by looking the
  marker up among the owner's active assignments;
- ``lease.json`` is updated at every step, so a crash or cancellation hook in another process
  releases it with `release_from_file`, and a re-run into the same artifact dir *adopts* an
  active assignment it finds there (or records that it is gone) instead of orphaning it;
- the delivery wait and the release ride out QUADS outages of minutes (`tasks.lab.quads.
  PATIENT`);
- the janitor (``python -m flows.cleanup --quads``) finds assignments of dead runs by owner and
  the ``telltale:`` description prefix (`MARKER_PREFIX`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from core.errors import StepError, TransientServiceError
from core.safeio import UnreadableInputError, read_bounded, read_text_bounded, write_text
from tasks.lab.quads import Assignment, QuadsClient, QuadsError, server_time

__all__ = ["LEASE_FILE", "MARKER_PREFIX", "Lease", "LeaseRequest", "NotOurLeaseError", "Orphan",
           "acquire_lease",
           "describe", "find_orphans", "leased", "marker_of", "release_from_file",
           "release_orphan"]

logger = logging.getLogger("telltale.quads")
LEASE_FILE = "lease.json"
MARKER_PREFIX = "telltale:"
"""Descriptions of Telltale's assignments start with ``telltale:<run marker> `` (QUADS puts
``[SSM] `` before it)."""
HOST_RETRIES = 5
"""Other free hosts tried when one is taken between ``/available`` and ``/schedules``."""


class LeaseRequest(BaseModel):
    """What to lease (``clusters.sutest.lab`` in the config)."""

    count: int = Field(ge=1, le=10, description="Hosts wanted (≤ 10 per cloud).")
    filters: dict[str, Any] = Field(default_factory=dict, description="Host metadata filters.")
    description: str = Field(default="telltale CPT run", description="Assignment description.")
    wipe: bool = Field(default=True, description="Wipe the hosts before delivery.")
    ticket: str | None = Field(default=None, description="Ticket to attach.")
    cc_users: list[str] = Field(default_factory=list, description="Users copied on the "
                                "assignment's notifications.")
    wait_hosts_minutes: float = Field(default=60, ge=0, description="Wait for free hosts.")
    wait_delivery_minutes: float = Field(default=240, gt=0, description="Delivery deadline.")
    marker: str = Field(default="run", pattern=r"^[A-Za-z0-9._-]{1,64}$",
                        description="Identifies the run in the assignment's description.")


class Lease(BaseModel):
    """What was leased (saved as ``lease.json``)."""

    assignment_id: int | None = None
    cloud: str | None = None
    ticket: str | None = None
    owner: str
    url: str
    description: str = ""
    hosts: list[str] = Field(default_factory=list)
    state: str = Field(default="assigned",
                       description="requesting, assigned, scheduled, delivered, released or "
                                   "kept.")
    ends_at: str | None = Field(default=None, description="The schedules' end as QUADS states "
                                "it (server-local time, labelled GMT by 2.2.x).")
    ends_at_utc: str | None = Field(default=None, description="The same end in UTC, when the "
                                    "server's offset is known.")
    pid: int | None = Field(default=None, description="The process holding the lease.")
    hostname: str | None = Field(default=None, description="Where that process runs.")
    created_at: str
    updated_at: str | None = None


def describe(request: LeaseRequest) -> str:
    """The assignment description: the run marker first (the janitor's key), then the text."""
    return f"{MARKER_PREFIX}{request.marker} {request.description}"


def marker_of(description: str | None) -> str | None:
    """The run marker of a Telltale assignment's description (None: not Telltale's)."""
    text = (description or "").removeprefix("[SSM]").strip()
    if not text.startswith(MARKER_PREFIX):
        return None
    return text[len(MARKER_PREFIX):].split(" ", 1)[0] or None


def _save(root: Path | None, lease: Lease) -> None:
    if root is None:
        return
    lease.updated_at = datetime.now(UTC).isoformat()
    write_text(root / LEASE_FILE, lease.model_dump_json(indent=2) + "\n")  # never half a file


def _load(root: Path | None) -> Lease | None:
    path = root / LEASE_FILE if root is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return Lease.model_validate_json(read_bounded(path, 1024 * 1024, what="lease file"))
    except ValueError as exc:  # pydantic's error, a bad file: name it, never a traceback
        raise StepError(f"{path}: not a lease record ({str(exc).splitlines()[0]})") from None


def _find_hosts(client: QuadsClient, request: LeaseRequest, sleep: Callable[[float], None],
                poll_s: float, exclude: frozenset[str] | set[str] = frozenset()) -> list[str]:
    deadline = time.monotonic() + request.wait_hosts_minutes * 60
    while True:
        free = [h for h in client.available(request.filters) if h not in exclude]
        if len(free) >= request.count:
            return free
        if time.monotonic() >= deadline:
            raise StepError(f"only {len(free)} free host(s) match {request.filters} "
                            f"(need {request.count}) after waiting "
                            f"{request.wait_hosts_minutes:g} min")
        logger.info("%d/%d matching hosts free; waiting", len(free), request.count)
        sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _reconcile(client: QuadsClient, lease: Lease) -> Assignment | None:
    """The active assignment carrying this lease's marker, if the server made one."""
    marker = marker_of(lease.description)
    for assignment in client.active_assignments():
        if marker and marker_of(assignment.description) == marker:
            return assignment
    return None


def _assign(client: QuadsClient, request: LeaseRequest, lease: Lease,
            root: Path | None) -> Assignment:
    """Create the assignment; the intent is on disk first, a lost answer is reconciled."""
    lease.state = "requesting"
    _save(root, lease)
    try:
        return client.request_assignment(description=lease.description, ticket=request.ticket,
                                         wipe=request.wipe, cc_users=request.cc_users)
    except TransientServiceError as exc:  # the server may have committed it: look
        logger.warning("no answer to the assignment request (%s): looking for it", exc)
        found = _reconcile(client, lease)
        if found is None:
            raise
        logger.info("the assignment was made: %d (%s)", found.id, found.cloud.name)
        return found


def _schedule(client: QuadsClient, request: LeaseRequest, lease: Lease, hosts: list[str],
              root: Path | None, sleep: Callable[[float], None], poll_s: float) -> None:
    """Schedule ``count`` hosts; a host taken meanwhile is replaced by another free one."""
    candidates, tried = list(hosts), set(lease.hosts)
    refusals = 0
    while len(lease.hosts) < request.count:
        if not candidates:
            candidates = _find_hosts(client, request.model_copy(update={
                "count": request.count - len(lease.hosts)}), sleep, poll_s, exclude=tried)
        host = candidates.pop(0)
        if host in tried:
            continue
        tried.add(host)
        try:
            answer = client.schedule(lease.cloud or "", host)
        except QuadsError as exc:
            taken = exc.status == 400 and "not available" in str(exc).lower()
            if not taken or refusals >= HOST_RETRIES:
                raise
            refusals += 1
            logger.warning("%s was taken meanwhile (%s): trying another free host", host, exc)
            continue
        lease.hosts.append(host)
        end = server_time(answer.get("end"))
        if end is not None:
            lease.ends_at = answer.get("end")
            utc = client.to_utc(end)
            lease.ends_at_utc = utc.isoformat() if utc else None
        _save(root, lease)


def _adopt(client: QuadsClient, request: LeaseRequest, root: Path | None) -> Lease | None:
    """An earlier attempt's unreleased ``lease.json`` in the same dir: adopt it or close it."""
    old = _load(root)
    if old is None or old.state in ("released", "kept"):
        return None
    current: Assignment | None
    if old.assignment_id is None:  # the earlier attempt died around the request
        current = _reconcile(client, old)
    else:
        current = client.assignment(old.assignment_id, patient=True)
    if current is None or not current.active:
        old.state = "released"
        _save(root, old)
        logger.info("the earlier lease in %s is no longer active", root)
        return None
    if len(old.hosts) == request.count and current.id is not None:
        old.assignment_id, old.cloud = current.id, current.cloud.name
        old.pid, old.hostname = os.getpid(), socket.gethostname()
        logger.warning("adopting the earlier run's active QUADS assignment %d (%s, hosts %s)",
                       current.id, current.cloud.name, ", ".join(old.hosts))
        _save(root, old)
        return old
    logger.warning("releasing the earlier run's incomplete QUADS assignment %d", current.id)
    client.terminate(current.id)
    old.state = "released"
    _save(root, old)
    return None


def acquire_lease(client: QuadsClient, request: LeaseRequest, *, root: Path | None = None,
                  poll_s: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                  on_assigned: Callable[[Lease], None] | None = None) -> Lease:
    """Lease hosts: wait for enough free ones, create the assignment, schedule, wait delivery.

    Args:
        client: A logged-in-able QUADS client.
        request: What to lease.
        root: Artifact dir for ``lease.json`` (the intent is written before the request).
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
    lease = _adopt(client, request, root)
    if lease is None:
        hosts = _find_hosts(client, request, sleep, poll_s)
        lease = Lease(owner=client.owner, url=client.base_url, description=describe(request),
                      pid=os.getpid(), hostname=socket.gethostname(),
                      created_at=datetime.now(UTC).isoformat())
        assignment = _assign(client, request, lease, root)
        lease.assignment_id, lease.cloud = assignment.id, assignment.cloud.name
        lease.ticket, lease.state = assignment.ticket, "assigned"
        _save(root, lease)
        if on_assigned is not None:
            on_assigned(lease)
        logger.info("QUADS assignment %d: cloud %s, ticket %s", lease.assignment_id,
                    lease.cloud, lease.ticket)
        _schedule(client, request, lease, hosts, root, sleep, poll_s)
        lease.state = "scheduled"
        _save(root, lease)
        if lease.ends_at:
            logger.info("QUADS set the hosts' end: %s (server time)%s", lease.ends_at,
                        f", {lease.ends_at_utc} UTC" if lease.ends_at_utc else "")
    elif on_assigned is not None:
        on_assigned(lease)
    assert lease.assignment_id is not None

    def progress(current: Assignment, elapsed: float) -> None:
        logger.info("waiting for %s: provisioned=%s validated=%s (%.0f min)", lease.cloud,
                    current.provisioned, current.validated, elapsed / 60)

    client.wait_delivered(lease.assignment_id, deadline_s=request.wait_delivery_minutes * 60,
                          poll_s=poll_s, progress=progress, sleep=sleep)
    lease.state = "delivered"
    _save(root, lease)
    return lease


class NotOurLeaseError(StepError):
    """A ``lease.json`` (or an assignment) that is not this owner's: never terminated."""


def _check_ours(client: QuadsClient, lease: Lease) -> None:
    """Refuse to release what this owner did not lease.

    A ``lease.json`` is a file in a results tree: one copied from another run (another
    owner, another server, another assignment under a reused id) or written by hand must
    never terminate someone else's hosts. The file must carry Telltale's run marker and name
    this owner and server, and the server's assignment must be this owner's and carry the
    same marker — the marker is required on both sides.

    Raises:
        NotOurLeaseError: Saying which of these does not match.
    """
    marker = marker_of(lease.description)
    if marker is None:
        raise NotOurLeaseError("lease.json carries no Telltale run marker (its description "
                               f"does not start with {MARKER_PREFIX!r}): not released")
    if lease.owner != client.owner:
        raise NotOurLeaseError(f"lease.json names owner {lease.owner!r}, not {client.owner!r} "
                               "(these credentials): not released")
    if lease.url.rstrip("/") != client.base_url.rstrip("/"):
        raise NotOurLeaseError(f"lease.json is for QUADS at {lease.url}, not {client.base_url}: "
                               "not released")
    if lease.assignment_id is None:
        return
    current = client.assignment(lease.assignment_id, patient=True)
    if current.owner is not None and current.owner != client.owner:
        raise NotOurLeaseError(f"assignment {lease.assignment_id} belongs to "
                               f"{current.owner!r}, not {client.owner!r}: not released")
    if marker_of(current.description) != marker:
        raise NotOurLeaseError(f"assignment {lease.assignment_id} is not this run's (its "
                               f"description is not marked {marker!r}): not released")


def _release(client: QuadsClient, lease: Lease, root: Path | None) -> bool:
    """Terminate (patiently) after `_check_ours`; on failure say the assignment may be left.

    Returns True when an assignment was terminated.

    Raises:
        NotOurLeaseError: The lease is not this owner's (nothing is terminated).
        StepError: The release failed; the message says the assignment may still be active
            and gives the command that releases it.
    """
    try:
        _check_ours(client, lease)
        if lease.assignment_id is None:
            found = _reconcile(client, lease)
            if found is None:
                lease.state = "released"
                _save(root, lease)
                return False
            lease.assignment_id, lease.cloud = found.id, found.cloud.name
        client.terminate(lease.assignment_id)
    except NotOurLeaseError:
        raise
    except Exception as exc:
        where = f" --artifact-dir {root}" if root is not None else ""
        raise StepError(f"could not release QUADS assignment {lease.assignment_id} "
                        f"({lease.cloud}): {exc}. It may still be active: release it with "
                        f"`python -m flows.cleanup --quads{where}`") from exc
    lease.state = "released"
    logger.info("released QUADS assignment %d (%s)", lease.assignment_id, lease.cloud)
    _save(root, lease)
    return True


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
        current = holder.get("lease") or _load(root)
        if current is not None and current.state not in ("released", "kept"):
            if keep:
                current.state = "kept"
                logger.warning("keeping QUADS assignment %s (%s): release it with "
                               "POST /assignments/terminate/%s", current.assignment_id,
                               current.cloud, current.assignment_id)
                _save(root, current)
            else:
                _release(client, current, root)


def release_from_file(client: QuadsClient, root: Path) -> bool:
    """Release the lease recorded in ``root/lease.json`` unless released or kept.

    For crash and cancellation hooks, the teardown and the janitor, which only know the
    run's artifact dir. A lease still ``requesting`` is looked up by its marker. Returns True
    when an assignment was terminated.

    A lease file is bound to its run: while the process it names (pid on this host) is alive
    and is not this process, the file is refused — a copy of a live run's ``lease.json``
    must not release that run's hosts under it.

    Raises:
        NotOurLeaseError: Not this owner's (see `_check_ours`), or held by a live run.
    """
    lease = _load(root)
    if lease is None or lease.state in ("released", "kept"):
        return False
    if lease.pid != os.getpid() and _alive(lease):
        raise NotOurLeaseError(f"lease.json names a live run (pid {lease.pid} on "
                               f"{lease.hostname}): not released; stop that run, whose "
                               "cleanup releases it")
    return _release(client, lease, root)


# -- the janitor ------------------------------------------------------------------------------

MAX_TZ_OFFSET_S = 14 * 3600
"""2.2.x timestamps are server-local: without a known offset, an age is only known ± 14 h."""


class Orphan(BaseModel):
    """An active Telltale assignment whose run is gone."""

    assignment_id: int
    cloud: str
    marker: str
    reason: str
    root: str | None = Field(default=None, description="Artifact dir of its lease.json.")


def _alive(lease: Lease) -> bool | None:
    """Whether the lease's process still runs (None: another machine, cannot tell)."""
    if lease.pid is None or lease.hostname != socket.gethostname():
        return None
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:  # a zombie (exited, not yet reaped: a runner's killed flow process) is not alive
        stat_line = read_text_bounded(f"/proc/{lease.pid}/stat", 4096, what="process status")
        return stat_line.rsplit(")", 1)[-1].split()[0] != "Z"
    except (UnreadableInputError, IndexError):
        return True


_LEASE_MAX_BYTES = 64 * 1024  # a lease.json is a few hundred bytes


def _local_leases(roots: list[Path]) -> dict[int, tuple[Path, Lease]]:
    """Assignment id → (artifact dir, lease) of the ``lease.json`` files under ``roots``."""
    found: dict[int, tuple[Path, Lease]] = {}
    for root in roots:
        for pattern in (LEASE_FILE, f"*/{LEASE_FILE}", f"*/*/{LEASE_FILE}"):
            for path in root.glob(pattern):
                try:  # the one bounded reader: a FIFO planted as lease.json is not opened
                    lease = Lease.model_validate(json.loads(read_text_bounded(
                        path, _LEASE_MAX_BYTES, what="lease file")))
                except (OSError, ValueError, UnreadableInputError):
                    continue
                if lease.assignment_id is not None:
                    found[lease.assignment_id] = (path.parent, lease)
    return found


def find_orphans(client: QuadsClient, roots: list[Path], older_than_s: float) -> list[Orphan]:
    """Active Telltale assignments (by owner and the ``telltale:`` prefix) of dead runs.

    A run is dead when its ``lease.json`` (searched under ``roots``) names a process of this
    machine that is gone. Without a local record, an assignment counts as orphaned once it
    is surely older than ``older_than_s`` (its server-local ``created_at`` allows ± 14 h).
    Kept leases (``clusters.keep``) are never orphans.
    """
    local = _local_leases(roots)
    orphans = []
    for assignment in client.active_assignments():
        marker = marker_of(assignment.description)
        if marker is None:
            continue
        record = local.get(assignment.id)
        if record is not None:
            root, lease = record
            if lease.state == "kept":
                continue
            alive = _alive(lease)
            if alive is False:
                orphans.append(Orphan(assignment_id=assignment.id,
                                      cloud=assignment.cloud.name, marker=marker, root=str(root),
                                      reason=f"its run (pid {lease.pid} on {lease.hostname}) "
                                             "is gone"))
                continue
            if alive:
                continue
        created = assignment.created_at.replace(tzinfo=None) if assignment.created_at else None
        if created is None:
            continue
        age = (datetime.now(UTC).replace(tzinfo=None) - created).total_seconds()
        if age - MAX_TZ_OFFSET_S >= older_than_s:
            orphans.append(Orphan(assignment_id=assignment.id, cloud=assignment.cloud.name,
                                  marker=marker, root=str(record[0]) if record else None,
                                  reason=f"no live run holds it and it is over "
                                         f"{older_than_s / 3600:g} h old"))
    return orphans


def release_orphan(client: QuadsClient, orphan: Orphan) -> None:
    """Terminate an orphaned assignment and mark its ``lease.json`` released."""
    root = Path(orphan.root) if orphan.root else None
    lease = _load(root)
    if lease is not None and lease.assignment_id == orphan.assignment_id:
        _release(client, lease, root)
        return
    client.terminate(orphan.assignment_id)
