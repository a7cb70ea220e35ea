"""Local fan-out with real processes: barrier, stagger, layout, abort, measured skew."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tasks.platforms.fanout import run_local_fanout, stagger_delay
from tasks.platforms.local import count_users


def test_fifty_real_processes_behind_the_barrier(tmp_path: Path) -> None:
    result = run_local_fanout(50, tmp_path, ["sleep:0.05"], batch_size=10, sleep_factor=0.1)
    assert result.success_count == 50 and result.user_count == 50
    users = result.users
    last_ready = max(u.ready_at for u in users)
    assert all(u.released_at >= last_ready for u in users)  # nobody passed before all were ready
    assert all(u.started_at >= last_ready for u in users)
    for user in users:  # the stagger: floor(index / 10) x 0.1 s after the release
        assert user.stagger_s == stagger_delay(user.index, 10, 0.1)
        assert user.started_at - user.released_at >= user.stagger_s - 0.001
    assert result.release_skew_p99_ms < 500
    assert (tmp_path / "user-049" / "exit_code").read_text().strip() == "0"
    assert count_users(tmp_path, 50) == {"pending": 0, "running": 0, "succeeded": 50, "failed": 0}


def test_command_scenario_layout_and_failures(tmp_path: Path) -> None:
    script = "import sys; i = int(sys.argv[1]); print('user', i, sys.argv[2]); sys.exit(i % 2)"
    result = run_local_fanout(4, tmp_path, [sys.executable, "-c", script, "{index}", "{users}"])
    assert result.success_count == 2
    assert (tmp_path / "user-003" / "pod.log").read_text() == "user 3 4\n"
    assert json.loads((tmp_path / "user-001" / "timings.json").read_text())["exit_code"] == 1


def test_abort_on_failure_stops_users_not_started(tmp_path: Path) -> None:
    script = "import sys; sys.exit(3 if sys.argv[1] == '0' else 0)"
    result = run_local_fanout(4, tmp_path, [sys.executable, "-c", script, "{index}"],
                              batch_size=1, sleep_factor=0.5, abort_on_failure=True)
    codes = {u.index: u.exit_code for u in result.users}
    assert codes[0] == 3
    assert all(codes[i] == 124 for i in (2, 3))  # still in their stagger when user 0 failed
    assert "aborted" in result.users[3].note


def _running(marker: str) -> list[int]:
    """Pids of the processes whose command line is exactly ``sleep <marker>``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "cmdline").read_text().split("\0")[:2] == ["sleep", marker]:
                pids.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids


def test_killed_launcher_leaves_no_user_and_no_workload(tmp_path: Path) -> None:
    """Users and their workloads are tied to the launcher (a deadline or SIGKILL kills it)."""
    import signal
    import subprocess
    import sys
    import time

    from tasks.runner import die_with_parent

    marker = "317.25"  # a sleep no other process runs
    launcher = subprocess.Popen(die_with_parent(
        [sys.executable, "-m", "tasks.platforms.fanout", "--users", "3", "--root",
         str(tmp_path / "users"), "--", "sleep", marker]), start_new_session=True)
    deadline = time.monotonic() + 600
    while len(_running(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_running(marker)) == 3, "the users' workloads never started"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=600)
    deadline = time.monotonic() + 600
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(marker)


# A user's workload that says whether its heavy import was done ahead (by a warm Python).
_USER = """
import os, sys
ahead = "preloaded_for_users" in sys.modules
import preloaded_for_users
print("user", sys.argv[1], "ahead", ahead, "parent", os.getppid(), flush=True)
"""


def test_users_fork_from_a_warm_python_and_else_start_new_interpreters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the run's warm Python every user's workload is forked from it (its imports done
    once, not once a user) and says so in its timings; a warm Python that is gone leaves
    each user a new interpreter, as without one."""
    from core.warm_key import warm_key
    from core.warm_python import acquire, offer, stop_warm_pythons
    from projects.library.runs import FORKED, FRESH
    from tests.factories import process_gone

    work = tmp_path / "work"
    work.mkdir()
    (work / "preloaded_for_users.py").write_text("LOADED = True\n")
    (work / "wl_user.py").write_text(_USER)
    monkeypatch.chdir(work)
    base, env = tmp_path / "warm", dict(os.environ)
    key = warm_key(sys.executable, ["preloaded_for_users"], work, env)
    assert offer(key, sys.executable, ["preloaded_for_users"], work, env, minutes=5, base=base)
    warm = acquire(key, base=base)
    assert warm is not None
    command = [sys.executable, "-m", "wl_user", "{index}"]
    try:
        result = run_local_fanout(3, tmp_path / "users", command, batch_size=2,
                                  sleep_factor=0.1, warm=warm)
        assert result.success_count == 3
        for user in result.users:
            assert user.launch == f"{FORKED} {warm.pid}", user
            log = (tmp_path / "users" / f"user-{user.index:03d}" / "pod.log").read_text()
            assert log == f"user {user.index} ahead True parent {warm.pid}\n"
    finally:
        stop_warm_pythons(base)
    assert process_gone(warm.pid)
    again = run_local_fanout(2, tmp_path / "again", command, warm=warm)
    assert again.success_count == 2 and {u.launch for u in again.users} == {FRESH}
    assert "ahead False" in (tmp_path / "again" / "user-001" / "pod.log").read_text()
