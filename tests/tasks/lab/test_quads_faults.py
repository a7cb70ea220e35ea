"""QUADS as the real 2.2.6 behaves: server time, real lease ends, races, outages, lost answers,
dead runs — no assignment may be left active."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tasks.lab.lease import (
    LeaseRequest,
    NotOurLeaseError,
    acquire_lease,
    find_orphans,
    leased,
    marker_of,
    release_from_file,
    release_orphan,
)
from tasks.lab.quads import QuadsClient, QuadsError
from tasks.retry import RetryPolicy
from tests.servers.quads import QuadsState, quads_server

FAST = RetryPolicy(attempts=4, backoff_base_s=0, jitter=0)
# What the default policy is, in count: an outage longer than it must not leak.
PATIENT = RetryPolicy(attempts=12, backoff_base_s=0.01, backoff_max_s=0.05, jitter=0)
NO_SLEEP = {"sleep": lambda s: None, "poll_s": 0}


def _client(url: str, email: str = "perf@example.com") -> QuadsClient:
    return QuadsClient(url, email, SecretStr("pw"), policy=FAST, patient=PATIENT)


def _register(url: str, email: str = "perf@example.com") -> None:
    httpx.post(f"{url}/register", json={"email": email, "password": "pw"})


def _active(state: QuadsState) -> list[int]:
    return [a["id"] for a in state.assignments.values() if a["active"]]


@pytest.fixture()
def lab():
    with quads_server(tz_offset_hours=5.5) as (url, state):  # a server in India, say
        _register(url)
        state.auto_deliver_after = 2
        with _client(url) as client:
            yield client, state


def test_a_freed_host_is_seen_by_the_servers_clock_and_the_real_end_recorded(
        lab, tmp_path: Path) -> None:
    client, state = lab
    request = LeaseRequest(count=2, filters={"model": "R650"}, marker="run-1")
    with leased(client, request, root=tmp_path, **NO_SLEEP) as lease:
        taken = lease.hosts
        assert not set(taken) & set(client.available({"model": "R650"}))
    saved = json.loads((tmp_path / "lease.json").read_text())
    assert saved["state"] == "released"
    # the end QUADS set (2.8 days, its default lifetime), as it states it and in UTC
    assert saved["ends_at"].endswith("GMT")
    assert client.clock_offset == timedelta(hours=5.5)
    end_utc = datetime.fromisoformat(saved["ends_at_utc"])
    assert abs(end_utc - (datetime.now(UTC) + timedelta(days=2.8))) < timedelta(minutes=5)
    # terminate ends the schedules now: free from the next minute, by the server's clock
    # (a client asking with its own UTC clock saw them busy for 5.5 h)
    state.advance(1)
    assert set(taken) <= set(client.available({"model": "R650"}))
    assert all(client.is_available(h) for h in taken)


def test_a_host_taken_between_available_and_schedule_is_replaced(lab, tmp_path: Path) -> None:
    client, state = lab
    thief = QuadsClient(client.base_url, "other@example.com", SecretStr("pw"), policy=FAST)
    _register(client.base_url, "other@example.com")
    other = thief.request_assignment(description="someone else")

    def steal() -> None:  # another user schedules the first free host right after we look
        state.after_available = None
        thief.schedule(other.cloud.name, "host00.example.com")

    state.after_available = steal
    with leased(client, LeaseRequest(count=2, filters={"model": "R650"}), root=tmp_path,
                **NO_SLEEP) as lease:
        assert "host00.example.com" not in lease.hosts and len(lease.hosts) == 2
    assert _active(state) == [other.id]


def test_schedules_near_the_weekly_deadline_say_why(lab, tmp_path: Path) -> None:
    client, state = lab
    state.near_weekly_deadline = True
    with pytest.raises(QuadsError, match="Invalid date range.*weekly deadline"):
        with leased(client, LeaseRequest(count=1), root=tmp_path, **NO_SLEEP):
            pass
    assert not _active(state)  # the assignment made before the refusal was released


def test_an_outage_during_the_wait_and_at_release_leaves_nothing(lab, tmp_path: Path) -> None:
    client, state = lab
    polls = {"n": 0}

    def sleep(_: float) -> None:  # QUADS goes away for longer than the default policy lasts
        polls["n"] += 1
        if polls["n"] == 1:
            state.drop_next(8)

    with leased(client, LeaseRequest(count=1), root=tmp_path, sleep=sleep, poll_s=0):
        state.drop_next(8)  # ... and again when the release comes
    assert not _active(state)
    assert json.loads((tmp_path / "lease.json").read_text())["state"] == "released"


def test_a_release_that_cannot_reach_quads_says_a_lease_may_be_left(
        lab, tmp_path: Path) -> None:
    client, state = lab
    with pytest.raises(Exception, match="may still be active.*flows.cleanup --quads"):
        with leased(client, LeaseRequest(count=1), root=tmp_path, **NO_SLEEP):
            state.down = True
    state.down = False
    assert json.loads((tmp_path / "lease.json").read_text())["state"] == "delivered"


def test_a_lost_answer_to_the_assignment_request_is_reconciled(lab, tmp_path: Path) -> None:
    client, state = lab
    state.lose_next("assignments/self")
    with leased(client, LeaseRequest(count=1, marker="lost-1"), root=tmp_path,
                **NO_SLEEP) as lease:
        assert len(state.assignments) == 1 and lease.assignment_id == 1
        assert state.assignments[1]["description"] == "[SSM] telltale:lost-1 telltale CPT run"
    assert not _active(state)


def test_sigkill_then_a_rerun_into_the_same_dir_adopts_the_lease(lab, tmp_path: Path) -> None:
    client, state = lab
    first = acquire_lease(client, LeaseRequest(count=2), root=tmp_path, **NO_SLEEP)
    # ... the run is SIGKILLed here: lease.json says delivered, nothing released it
    with leased(client, LeaseRequest(count=2), root=tmp_path, **NO_SLEEP) as again:
        assert again.assignment_id == first.assignment_id and again.hosts == first.hosts
        assert len(state.assignments) == 1
    assert not _active(state)


def test_sigkill_during_the_request_then_a_rerun_finds_it(lab, tmp_path: Path) -> None:
    client, state = lab
    state.lose_next("assignments/self")
    state.drop_next(0)
    with pytest.raises(Exception):  # noqa: B017 - the reconcile finds nothing: server down
        state.after_available = lambda: setattr(state, "down", True)
        acquire_lease(client, LeaseRequest(count=1, marker="m-2"), root=tmp_path, **NO_SLEEP)
    state.after_available, state.down = None, False
    saved = json.loads((tmp_path / "lease.json").read_text())
    assert saved["state"] == "requesting" and saved["assignment_id"] is None
    with leased(client, LeaseRequest(count=1, marker="m-2"), root=tmp_path, **NO_SLEEP):
        pass
    assert not _active(state)


def test_the_janitor_releases_leases_of_dead_runs_only(lab, tmp_path: Path) -> None:
    client, state = lab
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    runs = tmp_path / "runs"
    for name, pid in (("dead", dead.pid), ("alive", os.getpid())):
        root = runs / name
        root.mkdir(parents=True)
        acquire_lease(client, LeaseRequest(count=1, marker=name), root=root, **NO_SLEEP)
        saved = json.loads((root / "lease.json").read_text())
        saved["pid"] = pid
        (root / "lease.json").write_text(json.dumps(saved))
    foreign = client.request_assignment(description="a person's own reservation")
    orphans = find_orphans(client, [runs], older_than_s=6 * 3600)
    assert [o.marker for o in orphans] == ["dead"], orphans
    release_orphan(client, orphans[0])
    assert sorted(_active(state)) == sorted([2, foreign.id])
    assert json.loads((runs / "dead" / "lease.json").read_text())["state"] == "released"
    assert marker_of("[SSM] telltale:x-1 text") == "x-1" and marker_of("[SSM] mine") is None


def _as_if_held_by(root: Path, pid: int) -> None:
    saved = json.loads((root / "lease.json").read_text())
    saved["pid"] = pid
    (root / "lease.json").write_text(json.dumps(saved))


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def test_the_janitor_cli_releases_one_runs_lease(lab, tmp_path: Path) -> None:
    client, state = lab
    root = tmp_path / "run"
    root.mkdir()
    acquire_lease(client, LeaseRequest(count=1), root=root, **NO_SLEEP)
    _as_if_held_by(root, _dead_pid())  # the run that leased is gone
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "quads.yaml").write_text(f"url: {client.base_url}\nemail: perf@example.com\n"
                                        "password: pw\n")
    env = {**os.environ, "TELLTALE_SECRET_DIR": str(secrets)}
    # a run that leased hosts and stopped before any cell: it does not say its project
    no_project = subprocess.run([sys.executable, "-m", "flows.cleanup", "--quads",
                                 "--artifact-dir", str(root)], capture_output=True, text=True,
                                env=env, timeout=1200)
    assert no_project.returncode == 2 and "--quads needs --project" in no_project.stderr
    proc = subprocess.run([sys.executable, "-m", "flows.cleanup", "--quads", "--project",
                           "fine_tuning", "--artifact-dir", str(root)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "released 1" in proc.stdout
    assert not _active(state)


def test_the_server_answers_like_2_2_6() -> None:
    hosts = {"a.example.com": {"model": "R650"},
             "b.example.com": {"model": "R650", "broken": True},
             "c.example.com": {"model": "R650", "retired": True},
             "d.example.com": {"model": "R650", "can_self_schedule": False}}
    with quads_server(hosts, ssm_host_limit=1) as (url, state):
        first = httpx.post(f"{url}/register", json={"email": "me@x.com", "password": "pw"})
        assert first.status_code == 200 and first.json()["auth_token"]
        again = httpx.post(f"{url}/register", json={"email": "me@x.com", "password": "pw"})
        assert again.status_code == 401 and "already exists" in again.json()["message"]
        login = httpx.post(f"{url}/login", auth=("me@x.com", "pw"))
        assert login.status_code == 200 and login.json()["status_code"] == 201
        bad = httpx.post(f"{url}/login", auth=("me@x.com", "nope"))
        assert bad.status_code == 401 and bad.text == "Unauthorized Access"
        assert "text/html" in bad.headers["content-type"]
        client = _client(url, "me@x.com")
        assert client.available() == ["a.example.com"]  # broken, retired, not self-schedulable
        assert httpx.get(f"{url}/assignments/99").status_code == 400
        with pytest.raises(QuadsError, match="Unauthorized Access"):
            _client(url, "me@x.com").__class__(url, "me@x.com", SecretStr("wrong"),
                                               policy=FAST).request_assignment(description="x")
        one = client.request_assignment(description="x")
        assert one.description == "[SSM] x"
        client.schedule(one.cloud.name, "a.example.com")
        state.hosts["e.example.com"] = {"model": "R650"}
        with pytest.raises(QuadsError, match="has reached the maximum number of hosts"):
            client.schedule(one.cloud.name, "e.example.com")
        # the per-user limit is keyed by the e-mail's local part
        _register(url, "me@y.org")
        twin = _client(url, "me@y.org")
        twin.request_assignment(description="y")
        twin.request_assignment(description="z")
        with pytest.raises(QuadsError, match="limit reached"):
            client.request_assignment(description="w")
        state.self_schedule = False
        with pytest.raises(QuadsError, match="Service not enabled"):
            client.request_assignment(description="v")
        # provisioned before validated
        state.self_schedule, state.auto_deliver_after = True, 1
        state.per_user_limit = 10
        two = client.request_assignment(description="u")
        first_poll = client.assignment(two.id)
        assert first_poll.provisioned and not first_poll.validated
        assert client.assignment(two.id).validated


def test_a_live_runs_lease_file_is_refused_by_another_process(lab, tmp_path: Path) -> None:
    """A copy of a live run's lease.json (pid alive on this host, not this process) must not
    release that run's hosts; the run itself, and the same file once its run is dead, do."""
    client, state = lab
    root = tmp_path / "run"
    root.mkdir()
    acquire_lease(client, LeaseRequest(count=1, marker="live-1"), root=root, **NO_SLEEP)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        _as_if_held_by(root, holder.pid)
        with pytest.raises(NotOurLeaseError, match="names a live run"):
            release_from_file(client, root)
        assert _active(state)
    finally:
        holder.communicate(b"")
    assert release_from_file(client, root)  # its holder exited: released
    assert not _active(state)


@pytest.mark.parametrize("description", ["", "my own hosts", "[SSM] run-1 cpt",
                                         "telltale: no marker", "Telltale:x y"])
def test_a_lease_file_without_the_marker_releases_nothing(lab, tmp_path: Path,
                                                          description: str) -> None:
    client, state = lab
    root = tmp_path / "run"
    root.mkdir()
    acquire_lease(client, LeaseRequest(count=1, marker="m-9"), root=root, **NO_SLEEP)
    saved = json.loads((root / "lease.json").read_text())
    saved["description"] = description  # a hand-written file, or one of another tool
    (root / "lease.json").write_text(json.dumps(saved))
    with pytest.raises(NotOurLeaseError, match="marker"):
        release_from_file(client, root)
    assert _active(state)


def test_an_unmarked_assignment_is_not_released_by_a_marked_file(lab, tmp_path: Path) -> None:
    """The marker is required on the server's side too: a lease file pointing at a person's
    own (unmarked) assignment of the same owner is refused."""
    client, state = lab
    root = tmp_path / "run"
    root.mkdir()
    acquire_lease(client, LeaseRequest(count=1, marker="m-3"), root=root, **NO_SLEEP)
    mine = client.request_assignment(description="a person's own reservation")
    saved = json.loads((root / "lease.json").read_text())
    saved["assignment_id"] = mine.id
    (root / "lease.json").write_text(json.dumps(saved))
    with pytest.raises(NotOurLeaseError, match="not this run's"):
        release_from_file(client, root)
    assert mine.id in _active(state)
