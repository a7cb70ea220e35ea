"""The local Prefect API that command-line runs share (`flows.local_api`), for real.

Each test has a Prefect home of its own (``TELLTALE_PREFECT_API_HOME``), so it starts and
stops its own server, never the suite's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from core.pids import pid_alive
from flows.local_api import STATE_DIR, shared_api, status, stop
from tests.factories import process_gone

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_USER = """
import sys
from flows.local_api import shared_api
with shared_api() as state:
    print(state.url, state.pid, flush=True)
    sys.stdin.readline()
"""


def _env(home: Path, idle_minutes: float = 20.0) -> dict[str, str]:
    return {**os.environ, "TELLTALE_PREFECT_API_HOME": str(home),
            "TELLTALE_PREFECT_API_IDLE_MINUTES": str(idle_minutes), "PYTHONPATH": str(ROOT)}


def _user(home: Path, idle_minutes: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _USER], env=_env(home, idle_minutes),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)


def test_runs_started_together_share_one_server_which_stops_once_idle_and_unused(
        tmp_path: Path) -> None:
    idle_minutes = 0.05  # 3 s
    users = [_user(tmp_path, idle_minutes) for _ in range(2)]
    try:
        answers = [user.stdout.readline().split() for user in users]  # type: ignore[union-attr]
        assert all(len(a) == 2 for a in answers), answers
        (url, pid), (url2, pid2) = answers
        assert (url, pid) == (url2, pid2), "two servers for runs started together"
        with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
            assert response.status == 200
        with urllib.request.urlopen(url.removesuffix("/api"), timeout=30) as response:
            assert b"<html" in response.read(2000).lower()  # Prefect's UI on the same port
        # one run ends; idle far longer than its timer while the other still uses it: it
        # stays (one wait for both cases: two users alive is the same check, sooner)
        users[0].communicate("\n", timeout=120)
        time.sleep(idle_minutes * 60 + 3 * 2.0)
        assert pid_alive(int(pid)), "stopped while a run still used it"
        users[1].communicate("\n", timeout=120)
        assert process_gone(int(pid)), "still running, idle and unused"
        assert not (tmp_path / STATE_DIR / "state.json").exists()
    finally:
        for user in users:
            if user.poll() is None:
                user.kill()
        stop(tmp_path)


def test_a_stale_server_record_is_never_used_and_stop_stops_the_live_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(tmp_path))
    state = tmp_path / STATE_DIR
    state.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state / "state.json").write_text(json.dumps({
        "pid": dead.pid, "url": "http://127.0.0.1:9/api", "ui_url": "http://127.0.0.1:9",
        "python": sys.executable, "prefect_version": "0.0.1", "started": 0.0}))
    try:
        with shared_api() as used:
            assert used.pid != dead.pid and used.prefect_version != "0.0.1"
            assert (state / "users" / str(os.getpid())).exists()
            with urllib.request.urlopen(f"{used.url}/health", timeout=30) as response:
                assert response.status == 200
        assert not (state / "users" / str(os.getpid())).exists()
        assert status() == used
        # a record of another interpreter is stale too: a new server, the old one stopped
        record = json.loads((state / "state.json").read_text())
        (state / "state.json").write_text(json.dumps({**record, "python": "/other/python"}))
        with shared_api() as again:
            assert again.pid != used.pid
        assert process_gone(used.pid), "the stale, unused server was left running"
        assert stop() is True
        assert status() is None and not pid_alive(again.pid)
        assert stop() is False
    finally:
        stop(tmp_path)


def test_a_warm_up_starts_it_without_waiting_and_the_run_then_uses_that_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.local_api import _starting, warm_up

    monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(tmp_path))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(tmp_path / "no-profiles.toml"))
    try:
        warm_up()
        spawned = _starting(tmp_path / STATE_DIR)
        assert spawned is not None  # started, not waited for
        warm_up()  # a second run's warm-up while it starts: the same one
        assert _starting(tmp_path / STATE_DIR) == spawned
        with shared_api() as used:
            assert used.pid == spawned
        assert _starting(tmp_path / STATE_DIR) is None  # started: no longer "starting"
    finally:
        stop(tmp_path)


def test_no_warm_up_when_the_user_has_an_api(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.local_api import api_url_configured, warm_up

    monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(tmp_path))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    profiles = tmp_path / "profiles.toml"
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(profiles))
    assert not api_url_configured()  # no profiles file
    profiles.write_text('active = "work"\n[profiles.work]\n'
                        'PREFECT_API_URL = "http://prefect.example:4200/api"\n')
    assert api_url_configured()
    monkeypatch.setenv("PREFECT_PROFILE", "other")  # another profile is active: not set
    assert not api_url_configured()
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert api_url_configured()
    warm_up()
    assert not (tmp_path / STATE_DIR / "starting.json").exists()
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv("TELLTALE_PREFECT_API", "temporary")
    warm_up()
    assert not (tmp_path / STATE_DIR / "starting.json").exists()


def test_a_record_pointing_off_this_machine_is_never_used(tmp_path: Path) -> None:
    state = tmp_path / STATE_DIR
    state.mkdir()
    (state / "state.json").write_text(json.dumps({
        "pid": os.getpid(), "url": "http://192.0.2.1:80/api", "ui_url": "http://192.0.2.1:80",
        "python": sys.executable, "prefect_version": "3.8.8", "started": 0.0}))
    assert status(tmp_path) is None  # refused as a record: a run would start its own
