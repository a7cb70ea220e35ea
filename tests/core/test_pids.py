"""`core.pids.stop_session`: a session-led process and all it left, ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.pids import pid_alive, stop_session

# A leader that starts a child in its session, writes the child's pid, then (as asked)
# ignores SIGTERM. The leader waits on a stdin that never closes, the child sleeps: only
# signals end them (the child's end is not tied to its leader's).
_LEADER = """
import os, signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if sys.argv[2] == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(child.pid))
sys.stdin.read()
"""


def _wait_for_file(path: Path, proc: subprocess.Popen[bytes]) -> int:
    while not path.exists() or not path.read_text():
        assert proc.poll() is None, "the leader ended before it wrote its child's pid"
        time.sleep(0.01)
    return int(path.read_text())


@pytest.mark.parametrize("leader", ["obedient", "deaf"])
def test_the_leader_and_what_it_left_in_its_session_end(tmp_path: Path, leader: str) -> None:
    pid_file = tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", _LEADER, str(pid_file), leader],
                            stdin=subprocess.PIPE, start_new_session=True)
    try:
        child = _wait_for_file(pid_file, proc)
        # the child ignores nothing, but a SIGTERM to the group reached it only if the
        # group was signalled; a deaf leader is SIGKILLed after the grace
        stop_session(proc, grace_s=0.5 if leader == "deaf" else 30)
        assert proc.returncode is not None
        deadline = time.monotonic() + 60  # the child is reparented, then reaped by init
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not pid_alive(child)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_an_ended_leader_only_has_its_leftovers_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", _LEADER, str(pid_file), "obedient"],
                            stdin=subprocess.PIPE, start_new_session=True)
    child = _wait_for_file(pid_file, proc)
    proc.kill()  # the leader alone: its child stays in the session
    proc.wait()
    assert pid_alive(child)
    stop_session(proc, grace_s=30)
    deadline = time.monotonic() + 60
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(child)
