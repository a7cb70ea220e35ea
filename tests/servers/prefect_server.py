"""A real Prefect server with its services (scheduler, triggers, automations) for tests.

``prefect server start`` on 127.0.0.1 and a free port, its own home (SQLite), in its own
session; stopped with its whole process group. Used where the test harness's in-process API is
not enough: a worker in another process, automations firing from the triggers service.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from core.prefect_seed import database_file, seed
from tasks.process import free_port

T = TypeVar("T")

__all__ = ["api_call", "clean_env", "prefect_server", "wait_for"]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: PATH, a fresh HOME, Prefect's CI settings; no TELLTALE_*."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "LANG": "C.UTF-8", "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(home / ".prefect"),
            **extra}


def wait_for(what: str, predicate: Callable[[], T], process: subprocess.Popen[Any],
             limit_s: float, *, poll_s: float = 0.5) -> T:
    """Wait for an event (an answer, a file, a state) while ``process`` lives; its value.

    Not a sleep: the limit is a hang guard. Raises RuntimeError naming ``what`` when the
    process exits first or the limit passes. The event is asked once more after the exit
    is seen: a ``--run-once`` worker ends right after the state it waits for is set, and
    between the two asks the run went from CANCELLING to CANCELLED and the worker exited.
    """
    deadline = time.monotonic() + limit_s
    while not (found := predicate()):
        if process.poll() is not None:
            if found := predicate():
                break
            raise RuntimeError(f"{process.args[2:4]} exited {process.returncode} before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {limit_s:.0f} s")
        time.sleep(poll_s)
    return found


def api_call(api: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call on a Prefect API (``http://HOST:PORT/api``) through Prefect's own HTTP client;
    the answer's JSON.

    Prefect's server answers 503 while its SQLite database is busy (a loaded machine, the
    suite's shared API): its client retries that (and 429/502) with backoff, a bare httpx call
    failed a CI run on it. Raises ``httpx.HTTPStatusError`` on any other error answer.
    """
    from prefect.client.base import PrefectHttpxSyncClient

    with PrefectHttpxSyncClient(base_url=api, timeout=60) as client:
        return client.request(method, path, json=body).json()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@contextmanager
def prefect_server(home: Path, *, startup_s: float = 240.0,
                   log: Path | None = None) -> Iterator[str]:
    """Run ``prefect server start``; yields its API URL (``http://127.0.0.1:PORT/api``).

    The start-up deadline is generous (a loaded 2-core machine); the wait is on the server's
    own health answer, not on a sleep.
    """
    port = free_port()
    env = clean_env(home, PREFECT_UI_ENABLED="false", PREFECT_SERVER_API_HOST="127.0.0.1",
                    PREFECT_SERVER_API_PORT=str(port),
                    # Prefect's default, named: the file seeded below is the one it opens
                    PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:///"
                    f"{home / '.prefect' / 'prefect.db'}")
    # its new database from the migrated copy a local API kept (core.prefect_seed); a server
    # with every service on keeps none: its services may have written by the time it answers
    seed(database_file(env["PREFECT_API_DATABASE_CONNECTION_URL"]))
    out = open(log or home / "server.log", "ab")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                               "127.0.0.1", "--port", str(port)], env=env,
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_for(f"prefect server answer (see {out.name})", lambda: _healthy(url), server,
                 startup_s, poll_s=0.25)
        yield url
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.wait()
        out.close()
