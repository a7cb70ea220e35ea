"""QUADS client and lease lifecycle against a QUADS-API test server on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from blocks.quads import QuadsCredentials
from core.errors import StepError
from tasks.lab.lease import LeaseRequest, leased, release_from_file
from tasks.lab.quads import QuadsClient, QuadsError, QuadsValidationFailed
from tasks.retry import RetryPolicy
from tests.servers.quads import quads_server

FAST = RetryPolicy(attempts=4, backoff_base_s=0, jitter=0)
NO_SLEEP = {"sleep": lambda s: None, "poll_s": 0}


@pytest.fixture()
def quads():
    with quads_server() as (url, state):
        httpx.post(f"{url}/register", json={"email": "perf@example.com", "password": "pw"})
        creds = QuadsCredentials(url=url, email="perf@example.com", password="pw")
        with QuadsClient.from_credentials(creds, policy=FAST) as client:
            yield client, state


def test_available_filters_and_operators(quads) -> None:
    client, _ = quads
    assert len(client.available()) == 10
    assert len(client.available({"model": "R650"})) == 6
    nvme_r650 = client.available({"model": "R650", "disks.disk_type": "nvme"})
    assert nvme_r650 == ["host00.example.com", "host02.example.com", "host04.example.com"]
    assert len(client.available({"model__ne": "R650"})) == 4
    assert len(client.available({"interfaces.speed__gte": 100})) == 10
    assert client.available({"interfaces.vendor__ilike": "%mellanox%"})
    with pytest.raises(QuadsError, match="unknown filter operator"):
        client.available({"model__between": "x"})
    assert client.is_available("host01.example.com") is True


def test_lease_lifecycle_releases_and_frees_hosts(quads, tmp_path: Path) -> None:
    client, state = quads
    state.auto_deliver_after = 3
    request = LeaseRequest(count=2, filters={"model": "R650"}, ticket="T-1")
    with leased(client, request, root=tmp_path, **NO_SLEEP) as lease:
        assert lease.hosts == ["host00.example.com", "host01.example.com"]
        assert client.is_available("host00.example.com") is False
        saved = json.loads((tmp_path / "lease.json").read_text())
        assert saved["state"] == "delivered" and saved["cloud"] == lease.cloud
    assert json.loads((tmp_path / "lease.json").read_text())["state"] == "released"
    assert client.is_available("host00.example.com") is True
    assert state.assignments[lease.assignment_id]["active"] is False


def test_crash_after_lease_still_terminates(quads, tmp_path: Path) -> None:
    client, state = quads
    state.auto_deliver_after = 1
    with pytest.raises(RuntimeError, match="workload exploded"):
        with leased(client, LeaseRequest(count=1), root=tmp_path, **NO_SLEEP):
            raise RuntimeError("workload exploded")
    assert all(not a["active"] for a in state.assignments.values())


def test_keep_leaves_the_assignment(quads, tmp_path: Path) -> None:
    client, state = quads
    state.auto_deliver_after = 1
    with leased(client, LeaseRequest(count=1), keep=True, root=tmp_path, **NO_SLEEP) as lease:
        pass
    assert state.assignments[lease.assignment_id]["active"] is True
    assert json.loads((tmp_path / "lease.json").read_text())["state"] == "kept"
    assert release_from_file(client, tmp_path) is False  # kept means kept


def test_relogin_on_401_during_the_wait(quads, tmp_path: Path) -> None:
    client, state = quads
    polls = {"n": 0}

    def sleep(_: float) -> None:  # the token expires in the middle of the wait
        polls["n"] += 1
        if polls["n"] == 2:
            state.expire_tokens()
        if polls["n"] == 3:
            state.deliver(1)

    with leased(client, LeaseRequest(count=1), root=tmp_path, sleep=sleep, poll_s=0):
        pass
    assert state.logins == 2  # logged in again when the expired token got a 401
    assert not state.assignments[1]["active"]


def test_503_bursts_are_retried(quads) -> None:
    client, state = quads
    state.fail_next(3, 503)
    assert len(client.available()) == 10
    state.fail_next(10, 503)
    with pytest.raises(Exception, match="503|Service"):
        client.available()


def test_a_failed_validation_notice_is_not_final(quads, tmp_path: Path) -> None:
    """QUADS' notification.fail is a one-time notice: validation goes on and may pass."""
    client, state = quads
    calls = {"n": 0}

    def sleep(_: float) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            state.deliver(1, fail=True)
        elif calls["n"] == 3:
            state.revalidate(1)

    with leased(client, LeaseRequest(count=2), root=tmp_path, sleep=sleep, poll_s=0) as lease:
        assert lease.assignment_id == 1 and calls["n"] >= 3
    assert not state.assignments[1]["active"]


def test_a_validation_that_never_passes_fails_at_the_deadline(quads) -> None:
    client, state = quads
    assignment = client.request_assignment(description="x")
    state.deliver(assignment.id, fail=True)
    with pytest.raises(QuadsValidationFailed, match="did not pass before the deadline"):
        client.wait_delivered(assignment.id, deadline_s=0, sleep=lambda _: None)


def test_business_errors_quote_the_server(quads) -> None:
    client, state = quads
    with pytest.raises(QuadsError, match="No active assignment for cloud cloud99") as info:
        client.schedule("cloud99", "host00.example.com")
    assert info.value.status == 400
    for _ in range(3):
        client.request_assignment(description="x")
    with pytest.raises(QuadsError, match="limit reached") as info:
        client.request_assignment(description="x")
    assert info.value.status == 403


def test_500_on_self_assignment_is_reported_not_retried(quads) -> None:
    """2.2.6 with JIRA auto-ticketing off: 400 without a ticket, an HTML 500 with one."""
    client, state = quads
    state.ticket_autocreate = False
    with pytest.raises(QuadsError, match="Missing Jira ticket number") as info:
        client.request_assignment(description="x")
    assert info.value.status == 400
    before = len(state.requests)
    with pytest.raises(QuadsError, match="server fault") as info:
        client.request_assignment(description="x", ticket="8001")
    assert info.value.status == 500
    message = str(info.value)
    assert "auto-creation is off and a ticket is given" in message  # the advice, not inverted
    assert "<html" not in message and "an HTML error page" in message
    assert len([r for r in state.requests[before:] if "assignments/self" in r[1]]) == 1
    state.ticket_autocreate = True
    assert client.request_assignment(description="x", ticket="T-9").ticket == "T-9"


def test_availability_of_one_host_reads_the_2_2_6_mapping(quads) -> None:
    client, _ = quads
    assert client.is_available("host01.example.com") is True
    assert client.is_available("no-such-host.example.com") is False  # 200 {"host": "False"}


def test_cc_users_go_as_a_comma_separated_string(quads) -> None:
    client, state = quads
    assignment = client.request_assignment(description="x", cc_users=["ana", "bo"])
    assert state.assignments[assignment.id]["ccuser"] == ["ana", "bo"]


def test_too_few_hosts_waits_then_fails_without_assigning(quads, tmp_path: Path) -> None:
    client, state = quads
    request = LeaseRequest(count=3, filters={"model": "R999"}, wait_hosts_minutes=0)
    with pytest.raises(StepError, match="only 0 free host"):
        with leased(client, request, root=tmp_path, **NO_SLEEP):
            pass
    assert not state.assignments and not (tmp_path / "lease.json").exists()


def test_release_from_file_after_a_crash(quads, tmp_path: Path) -> None:
    client, state = quads
    state.auto_deliver_after = 1
    from tasks.lab.lease import acquire_lease

    lease = acquire_lease(client, LeaseRequest(count=1), root=tmp_path, **NO_SLEEP)
    # ... the flow process dies here; a crash hook in another process sees only the dir:
    assert release_from_file(client, tmp_path) is True
    assert not state.assignments[lease.assignment_id]["active"]
    assert release_from_file(client, tmp_path) is False


def test_bad_credentials_and_secret_hygiene() -> None:
    with quads_server() as (url, _):
        client = QuadsClient(url, "nobody@example.com", SecretStr("hunter2"), policy=FAST)
        with pytest.raises(QuadsError) as info:
            client.request_assignment(description="x")
        assert info.value.status == 401
        assert "hunter2" not in repr(client) and "hunter2" not in str(info.value)
        assert "hunter2" not in repr(QuadsCredentials(url=url, email="a@b", password="hunter2"))


# -- trust: whose lease, what it says, when it ends -----------------------------------------

def _parse_utc(text: str):
    from datetime import datetime

    return datetime.fromisoformat(text)


@pytest.mark.parametrize("lost", [False, True])
def test_the_end_in_utc_comes_from_the_schedules_own_zone(tmp_path: Path, lost: bool) -> None:
    from datetime import UTC, datetime, timedelta

    from tasks.lab.lease import acquire_lease

    # the app runs 5.5 h ahead of UTC, its database in UTC: created_at misleads
    with quads_server(tz_offset_hours=5.5, db_tz_offset_hours=0) as (url, state):
        httpx.post(f"{url}/register", json={"email": "perf@example.com", "password": "pw"})
        creds = QuadsCredentials(url=url, email="perf@example.com", password="pw")
        state.auto_deliver_after = 1
        if lost:  # the assignment is made, its answer lost: reconciled by its marker
            state.lose_next("/assignments/self")
        with QuadsClient.from_credentials(creds, policy=FAST) as client:
            lease = acquire_lease(client, LeaseRequest(count=1), root=tmp_path, **NO_SLEEP)
        expected = datetime.now(UTC) + state.ssm_default_lifetime
        assert lease.ends_at_utc is not None
        assert abs(_parse_utc(lease.ends_at_utc) - expected) < timedelta(minutes=20)


def test_a_taken_host_is_not_given_the_deadline_hint(quads) -> None:
    client, state = quads
    assignment = client.request_assignment(description="telltale:a x")
    client.schedule(assignment.cloud.name, "host01.example.com")
    other = client.request_assignment(description="telltale:b y")
    with pytest.raises(QuadsError) as taken:
        client.schedule(other.cloud.name, "host01.example.com")
    assert "not available" in str(taken.value) and "weekly deadline" not in str(taken.value)
    state.near_weekly_deadline = True
    with pytest.raises(QuadsError) as deadline:
        client.schedule(other.cloud.name, "host02.example.com")
    assert "weekly deadline" in str(deadline.value)
    for error in (taken.value, deadline.value):  # one service prefix, never two
        assert str(error).count("quads (HTTP 400)") == 1


@pytest.mark.parametrize("tamper", ["owner", "url", "assignment"])
def test_a_lease_file_of_someone_else_is_never_released(quads, tmp_path: Path,
                                                        tamper: str) -> None:
    from tasks.lab.lease import NotOurLeaseError, acquire_lease

    client, state = quads
    state.auto_deliver_after = 1
    # another owner's assignment on the same server
    (tmp_path / "theirs").mkdir()
    httpx.post(f"{client.base_url}/register", json={"email": "other@example.com",
                                                    "password": "pw2"})
    with QuadsClient.from_credentials(QuadsCredentials(
            url=client.base_url, email="other@example.com", password="pw2"),
            policy=FAST) as other:
        theirs = acquire_lease(other, LeaseRequest(count=1, marker="theirs"),
                               root=tmp_path / "theirs", **NO_SLEEP)
    # a lease.json replayed into our run dir, pointing at their assignment
    ours = tmp_path / "ours"
    ours.mkdir()
    record = json.loads((tmp_path / "theirs" / "lease.json").read_text())
    if tamper == "owner":
        pass  # as it was: their owner name
    elif tamper == "url":
        record["owner"] = client.owner
        record["url"] = "http://127.0.0.1:1/api/v3"
    else:  # our owner and server written in, their assignment id kept
        record["owner"] = client.owner
    (ours / "lease.json").write_text(json.dumps(record))
    with pytest.raises(NotOurLeaseError, match="not released"):
        release_from_file(client, ours)
    assert state.assignments[theirs.assignment_id]["active"]


def test_cc_users_come_from_the_config(quads, tmp_path: Path) -> None:
    from tasks.lab.lease import acquire_lease

    client, state = quads
    state.auto_deliver_after = 1
    lease = acquire_lease(client, LeaseRequest(count=1, cc_users=["alice", "bob"]),
                          root=tmp_path, **NO_SLEEP)
    assert state.assignments[lease.assignment_id]["ccuser"] == ["alice", "bob"]
