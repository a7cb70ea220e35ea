"""The Prefect API of a command-line run: the user's, the shared local one, or a temporary one.

By default a run uses the local API runs share (`flows.local_api`: started on first use,
stopped when idle, with Prefect's UI). ``TELLTALE_PREFECT_API=temporary`` gives the run a
server of its own, described here:

Without ``PREFECT_API_URL`` Prefect starts a temporary server as a child in the CLI's
process group: a terminal's Ctrl-C killed it together with the run, and the run then spent
minutes printing connection errors and exited 1 instead of 130 (measured: 76 s, 130 lines).
Here the CLI starts the same server (Prefect's own ASGI app under uvicorn, on 127.0.0.1) in
its own session, so Ctrl-C reaches only the run, whose cleanup then still has an API; the
server is tied to the CLI's life (`tasks.runner.die_with_parent`), so even a SIGKILLed CLI
leaves no server behind; and it is stopped when the run ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.environment import env_settings
from core.errors import StepError
from core.loopback import LOOPBACK_HOST, loopback_url
from core.pids import stop_session
from core.prefect_seed import seed_for_start
from core.safeio import open_append
from core.timeline import mark
from flows.local_api import healthy, server_database
from tasks.process import free_port
from tasks.runner import die_with_parent

__all__ = ["drain_prefect_workers", "prefect_api"]


def drain_prefect_workers(timeout_s: float = 10.0) -> None:
    """Send Prefect's queued logs and events while the API still answers.

    Otherwise they are flushed at interpreter exit, against a stopped server: a minute of
    retries and connection-error lines after an interrupted run.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout_s)
        except Exception:  # best effort: the run's own outcome is already decided
            pass


@contextmanager
def prefect_api(log_file: Path | None = None) -> Iterator[str | None]:
    """Use ``PREFECT_API_URL`` when set; else the shared local API, or a temporary one.

    The shared one is `flows.local_api`'s; with ``TELLTALE_PREFECT_API=temporary`` a server
    runs for the block's duration only.

    Args:
        log_file: Where the server's own output goes (default: discarded).

    Yields:
        The API URL of the server used, or None when ``PREFECT_API_URL`` was set.

    Raises:
        StepError: The server did not answer within
            ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` (default 60 s).
    """
    import prefect
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_UI_URL,
        get_current_settings,
        temporary_settings,
    )

    if PREFECT_API_URL.value():
        yield None
        return
    mark("prefect api")
    if env_settings().prefect_api == "reuse":
        from flows.local_api import shared_api

        try:
            with shared_api() as state, temporary_settings(
                    updates={PREFECT_API_URL: state.url, PREFECT_UI_URL: state.ui_url}):
                mark("flow start")
                yield state.url
        finally:
            drain_prefect_workers()
        return
    port = free_port()
    url = f"{loopback_url(port)}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    argv = die_with_parent([sys.executable, "-m", "uvicorn", "--app-dir",
                            str(Path(prefect.__file__).parent.parent), "--factory",
                            "prefect.server.api.server:create_app", "--host", LOOPBACK_HOST,
                            "--port", str(port), "--log-level", "error", "--lifespan", "on"])
    out = open_append(log_file) if log_file is not None else subprocess.DEVNULL
    # a new home's database from the migrated copy a first server kept (core.prefect_seed)
    keep_template = seed_for_start(server_database())
    server = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        limit = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60"))
        deadline = time.monotonic() + limit
        while not healthy(url):
            if server.poll() is not None:
                raise StepError(f"the temporary Prefect API exited with {server.returncode} "
                                "before answering; set PREFECT_API_URL to a running server")
            if time.monotonic() > deadline:
                raise StepError(f"the temporary Prefect API did not answer within {limit:.0f}"
                                " s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
            time.sleep(0.2)
        keep_template()  # answering, and no client has used it yet
        # no UI link: Prefect's "View at http://127.0.0.1:<port>/runs/..." would point at an
        # API that is gone when the command ends (and this server serves no UI)
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_UI_URL: ""}):
            mark("flow start")
            yield url
    finally:
        drain_prefect_workers()
        stop_session(server, 10)  # and whatever it started in its session
        if out is not subprocess.DEVNULL:
            out.close()
