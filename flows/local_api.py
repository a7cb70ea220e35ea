"""A local Prefect API that command-line runs share, started on first use, stopped when idle.

A command-line run needs a Prefect API. Starting one for each run cost ~6.7 s of this
project's ~22 s light run on 2 cores (4 s of it importing Prefect's server). The first run
starts this one instead; later runs find it and use it at once, and Prefect's UI on it shows
every run (``python -m flows.local_api status`` prints its address).

- **Where**: its state (``state.json``, its log, who uses it) lives in ``telltale-api/``
  under ``TELLTALE_PREFECT_API_HOME`` (default: the ``PREFECT_HOME`` variable, else
  ``~/.prefect``); the server runs with that
  Prefect home, so its database is that home's. One server per home.
- **Who may stop it**: it stops itself once no run has used it for
  ``TELLTALE_PREFECT_API_IDLE_MINUTES`` (default 20) and no process that registered as its
  user is alive; ``python -m flows.local_api stop`` stops it at once.
- **Races**: finding or starting it happens under an exclusive ``flock`` of the state
  directory, so two runs started together share one server.
- **Interrupts**: it runs in its own session, so a terminal's Ctrl-C reaches only the run,
  whose cleanup still has an API; a SIGKILLed run leaves it to its idle timer.
- **A stale one** (another interpreter or Prefect version, a dead process, a port that does
  not answer) is never used: a new one is started, and the old one, when alive and unused,
  is stopped.

``TELLTALE_PREFECT_API=temporary`` keeps the one-run server of `flows.api_server`. A
``PREFECT_API_URL`` the user set wins over both.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from core.environment import env_settings, local_services_home, prefect_home
from core.errors import StepError
from core.filelock import dir_lock
from core.loopback import LOOPBACK_HOST, LOOPBACK_URL, loopback_url
from core.pids import pid_alive
from core.prefect_seed import database_file, seed_for_start
from core.safeio import UnreadableInputError, open_append, read_bounded, write_text
from core.terminal import say
from core.warm_python import stop_warm_pythons, warm_base
from tasks.observe.spare import spare_base, spares, stop_spares
from tasks.process import free_port

__all__ = ["ServerState", "api_home", "server_database", "shared_api", "state_dir", "status",
           "stop", "warm_up"]

STATE_DIR = "telltale-api"
_CHECK_S = 2.0  # how often the server looks at its idle timer and its users


class ServerState(BaseModel):
    """``state.json``: the running server and what it was started with."""

    pid: int
    # only this machine's loopback: a record edited to point elsewhere is refused, never used
    url: str = Field(pattern=LOOPBACK_URL.removesuffix("$") + "/api$")
    ui_url: str = Field(pattern=LOOPBACK_URL)
    python: str
    prefect_version: str
    started: float


def api_home() -> Path:
    """The Prefect home of the shared server (`core.environment.local_services_home`)."""
    return local_services_home()


def api_url_configured() -> bool:
    """``PREFECT_API_URL`` is set: in the environment or in the active Prefect profile.

    Read without importing Prefect, from the profiles file Prefect reads
    (``PREFECT_PROFILES_PATH``, default ``<PREFECT_HOME>/profiles.toml``).
    """
    if os.environ.get("PREFECT_API_URL"):
        return True
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or prefect_home() / "profiles.toml")
    try:
        profiles = tomllib.loads(read_bounded(path, 1 << 20, what="Prefect profiles",
                                              follow_links=True).decode())
    except (UnreadableInputError, ValueError, UnicodeDecodeError):
        return False
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    settings = (profiles.get("profiles") or {}).get(active)
    return isinstance(settings, dict) and bool(settings.get("PREFECT_API_URL"))


def state_dir(home: Path | None = None) -> Path:
    """Where the shared server of ``home`` keeps its state."""
    return (home or api_home()) / STATE_DIR


def healthy(url: str, timeout: float = 2.0) -> bool:
    """The Prefect API at ``url`` answers its health check."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _read_state(directory: Path) -> ServerState | None:
    try:
        return ServerState.model_validate_json(
            read_bounded(directory / "state.json", 64 * 1024, what="local API state"))
    except (UnreadableInputError, ValidationError):
        return None


def _make_dir(directory: Path) -> None:
    # its own user only: the record says which server a run talks to
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)


@contextlib.contextmanager
def _locked(directory: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold the state dir's lock (yields False, unheld, when not ``wait``ing and taken)."""
    _make_dir(directory)
    with dir_lock(directory, "lock", wait=wait, mode=0o600) as held:
        yield held


def _live_users(directory: Path) -> list[int]:
    """The registered users still alive; a dead one's file is removed."""
    alive = []
    for entry in (directory / "users").glob("*"):
        if entry.name.isdigit() and pid_alive(int(entry.name)):
            alive.append(int(entry.name))
        else:
            entry.unlink(missing_ok=True)
    return alive


def _prefect_version() -> str:
    # the installed distribution's version, read without importing Prefect (1.3 s): the
    # warm-up runs before the run imports it
    return importlib.metadata.version("prefect")


def _usable(state: ServerState | None) -> bool:
    return (state is not None and state.python == sys.executable
            and state.prefect_version == _prefect_version() and pid_alive(state.pid)
            and healthy(state.url))


def _spawn(directory: Path, home: Path) -> int:
    """Start the server detached; record it in ``starting.json`` (the caller holds the lock).

    Returns:
        Its pid.
    """
    idle_s = env_settings().prefect_api_idle_minutes * 60
    port = free_port()
    (directory / "state.json").unlink(missing_ok=True)
    env = {**os.environ, "PREFECT_HOME": str(home)}
    for name in ("PREFECT_API_URL", "PREFECT__SERVER_EPHEMERAL", "PREFECT__SERVER_FINAL"):
        env.pop(name, None)
    log = open_append(directory / "server.log")
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "flows.local_api", "serve", str(directory), str(port),
             str(idle_s)], env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, cwd=directory)
    finally:
        log.close()
    write_text(directory / "starting.json", json.dumps({"pid": server.pid}))
    return server.pid


def _starting(directory: Path) -> int | None:
    """The pid of a server being started (`_spawn`) and still alive, else None."""
    try:
        pid = json.loads(read_bounded(directory / "starting.json", 1024,
                                      what="local API state")).get("pid")
    except (UnreadableInputError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid_alive(pid) else None


def _await(directory: Path, pid: int) -> ServerState:
    """Wait until the server ``pid`` answers (the caller holds the lock)."""
    limit = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60"))
    deadline = time.monotonic() + limit
    while True:
        state = _read_state(directory)
        if state is not None and state.pid == pid and healthy(state.url):
            (directory / "starting.json").unlink(missing_ok=True)
            return state
        if not pid_alive(pid):
            raise StepError(f"the local Prefect API exited before answering (its log: "
                            f"{directory / 'server.log'}); set PREFECT_API_URL to a running "
                            "server, or TELLTALE_PREFECT_API=temporary")
        if time.monotonic() > deadline:
            _terminate(pid)
            raise StepError(f"the local Prefect API did not answer within {limit:.0f} s "
                            "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS; its log: "
                            f"{directory / 'server.log'})")
        time.sleep(0.1)


def warm_up() -> None:
    """Start the shared server now when none runs or starts, without waiting for it.

    A command-line run calls it first thing, so that the server's start (~7 s on 2 cores,
    its first use only) overlaps the run's own imports; `shared_api` then waits for it.
    Never blocks: when another process holds the lock, it is starting one already.
    """
    if env_settings().prefect_api != "reuse" or api_url_configured():
        return
    directory = state_dir()
    with _locked(directory, wait=False) as held:
        if held and _starting(directory) is None and not _usable(_read_state(directory)):
            _replace_stale(directory)
            _spawn(directory, api_home())


def _replace_stale(directory: Path) -> None:
    """Stop the recorded server when it is alive but unusable and nobody uses it."""
    state = _read_state(directory)
    if state is not None and pid_alive(state.pid) and not _live_users(directory):
        _terminate(state.pid)  # stale and unused: nobody loses their API


@contextlib.contextmanager
def shared_api() -> Iterator[ServerState]:
    """Use the shared local server (started when none answers); this process is its user.

    Raises:
        StepError: The server could not be started.
    """
    home = api_home()
    directory = state_dir(home)
    user = directory / "users" / str(os.getpid())
    with _locked(directory):
        found = _read_state(directory)
        state = found if _usable(found) else None
        if state is None:
            pid = _starting(directory)
            if pid is None:
                _replace_stale(directory)
                pid = _spawn(directory, home)
            state = _await(directory, pid)
        user.parent.mkdir(exist_ok=True)
        write_text(user, "")
    try:
        yield state
    finally:
        user.unlink(missing_ok=True)


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def status(home: Path | None = None) -> ServerState | None:
    """The shared server of ``home`` when it runs and answers, else None."""
    state = _read_state(state_dir(home))
    return state if state is not None and pid_alive(state.pid) and healthy(state.url) else None


def stop(home: Path | None = None, timeout_s: float = 30.0) -> bool:
    """Stop the shared server of ``home`` now; True when one was running."""
    directory = state_dir(home)
    with _locked(directory):
        starting = _starting(directory)
        if starting is not None:  # one still starting (`warm_up`): never left behind
            _terminate(starting)
            (directory / "starting.json").unlink(missing_ok=True)
        state = _read_state(directory)
        if state is None or not pid_alive(state.pid):
            (directory / "state.json").unlink(missing_ok=True)
            return starting is not None
        _terminate(state.pid)
        deadline = time.monotonic() + timeout_s
        while pid_alive(state.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(state.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(state.pid, signal.SIGKILL)
        (directory / "state.json").unlink(missing_ok=True)
        return True


def server_database() -> Path | None:
    """The SQLite file a Prefect server started with the current settings would migrate.

    None when they name another database or do not migrate on start (`core.prefect_seed`
    then seeds nothing).
    """
    from prefect.settings import get_current_settings

    database = get_current_settings().server.database
    if not database.migrate_on_start:
        return None
    return database_file(database.connection_url.get_secret_value())


def _serve(directory: Path, port: int, idle_s: float) -> int:
    """The server process: Prefect's app (API and UI, no background services) under uvicorn.

    It writes ``state.json`` once it answers, and exits when idle with no live user.
    """
    import uvicorn

    # the UI asks /ui-settings for the API's address: it is this port, not Prefect's 4200
    os.environ["PREFECT_SERVER_API_HOST"] = LOOPBACK_HOST
    os.environ["PREFECT_SERVER_API_PORT"] = str(port)
    os.environ["PREFECT__SERVER_WEBSERVER_ONLY"] = "1"  # API and UI; no scheduler & co
    from prefect.server.api.server import create_app

    # a new home's database from the migrated copy a first server kept (core.prefect_seed)
    keep_template = seed_for_start(server_database())
    last = [time.monotonic()]
    app = create_app()

    async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            last[0] = time.monotonic()
        await app(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(recorded, host=LOOPBACK_HOST, port=port,
                                           log_level="error", lifespan="on"))
    url = loopback_url(port)

    def watch() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            keep_template()  # answering, and no client knows the address yet
            write_text(directory / "state.json", ServerState(
                pid=os.getpid(), url=f"{url}/api", ui_url=url, python=sys.executable,
                prefect_version=_prefect_version(), started=time.time()).model_dump_json())
        while not server.should_exit:
            time.sleep(_CHECK_S)
            if time.monotonic() - last[0] > idle_s and not _live_users(directory):
                server.should_exit = True

    threading.Thread(target=watch, daemon=True, name="idle-timer").start()
    try:
        server.run()
    finally:
        state = _read_state(directory)
        if state is not None and state.pid == os.getpid():
            (directory / "state.json").unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.local_api status|stop`` (``serve`` is the server's own entry)."""
    from flows.cli import make_parser

    parser = make_parser("python -m flows.local_api",
                         "The local Prefect API command-line runs share (and its UI).")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="print its API and UI addresses; exit 1 when none runs")
    commands.add_parser("stop", help="stop it now, and the spare Prometheus and warm "
                        "Pythons runs leave")
    serve = commands.add_parser("serve", help=argparse.SUPPRESS)
    serve.add_argument("directory", type=Path)
    serve.add_argument("port", type=int)
    serve.add_argument("idle_s", type=float)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args.directory, args.port, args.idle_s)
    if args.command == "stop":
        say("stopped" if stop() else "none was running")
        stopped = stop_spares(spare_base())
        if stopped:
            say(f"stopped {stopped} spare prometheus")
        warm = stop_warm_pythons(warm_base())
        if warm:
            say(f"stopped {len(warm)} warm python(s)")
        return 0
    state = status()
    if state is None:
        say(f"no local Prefect API runs for {api_home()}")
        return 1
    say(json.dumps({"api": state.url, "ui": state.ui_url, "pid": state.pid,
                    "home": str(api_home()), "spare_prometheus": len(spares(spare_base()))},
                   indent=2), keep_newlines=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
