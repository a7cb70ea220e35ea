"""Session-wide test settings: isolated Prefect home, no telemetry, no network."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The temporary dirs the session's controller makes here go when its process exits, after
# `pytest_sessionfinish` stopped what used them (a run left three under /tmp, ~700 after a
# day's runs). A dir the environment already names is the caller's (CI's, `./telltale
# test`'s): used, never made nor removed. The xdist workers inherit the controller's.


def _made_dir(prefix: str) -> str:
    """A new temporary dir that goes when this process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Must be set before Prefect is imported anywhere in the session.
if not os.environ.get("PREFECT_HOME"):
    os.environ["PREFECT_HOME"] = _made_dir("telltale-prefect-home-")
# Every command-line run of the session (both xdist workers: set before they start) shares
# one local Prefect API (flows.local_api) instead of starting its own (~7 s each, far more
# under load); `pytest_sessionfinish` stops it. Tests of the temporary API ask for it.
# Never the user's own: the suite stops it at the end.
if not os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["TELLTALE_PREFECT_API_HOME"] = _made_dir("telltale-prefect-api-")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    # pytest-xdist runs the suite in several processes: each gets its own Prefect home (its
    # SQLite database and temporary API servers) and data dir under the ones CI gave, so
    # two workers never share a database or a history.
    for _name in ("PREFECT_HOME", "TELLTALE_DATA_DIR"):
        if os.environ.get(_name):
            _own = Path(os.environ[_name]) / f"xdist-{_WORKER}"
            _own.mkdir(parents=True, exist_ok=True)
            os.environ[_name] = str(_own)
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# generous, like the harness's own 240 s: the suite must pass at load 6 on 2 cores, where a
# CLI run's temporary Prefect API beside busy loops once took over 60 s to answer
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "240")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
if not os.environ.get("TELLTALE_DATA_DIR"):
    os.environ["TELLTALE_DATA_DIR"] = _made_dir("telltale-data-")
# The runs' warm Pythons (core.warm_python, ~375 MB each): the session's shared one serves
# test after test; one a test's own services home started is never asked again, so it goes
# after 5 unused minutes instead of 10 (`pytest_sessionfinish` stops whatever is left).
os.environ.setdefault("TELLTALE_WARM_PYTHON_MINUTES", "5")
# A command line's warm Python (core.warm_command) is keyed by the whole environment, and
# the suite's command lines differ in theirs (a test's dirs, its variables): each would leave
# one more idle interpreter. They run fresh, but in tests/analysis/test_warm_cli.py.
os.environ.setdefault("TELLTALE_WARM_COMMAND_MINUTES", "0")
# The suite runs four workers on two cores, so the trainers and vLLM servers it starts (every
# child inherits this) always share the CPU. libgomp's default lets an idle OpenMP thread spin
# for a while before it sleeps: on a quiet machine that is the fastest (the light trainer's 60
# steps in 0.8 s against 2 s passive), beside busy processes it burns the cores the others need
# (the same steps took 16-23 s beside six busy loops, 3-6 s passive; session 37,
# docs/performance.md). The product keeps the default: a measurement is only valid on a quiet
# machine, where spinning wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
for name in list(os.environ):
    if name.startswith("TELLTALE__"):
        del os.environ[name]
# pytest rewrites each test module's asserts and keeps the result beside it, unless
# PYTHONDONTWRITEBYTECODE=1 (CI machines and many containers set it): then every worker
# parsed and rewrote all 113 again, every run — a collection of 7.3-9.8 CPU-s instead of
# 4.0-4.4 s, 13-22 core-seconds of a suite run (docs/performance.md, session 45).
# As `./telltale` writes the project's own bytecode ahead, the suite writes this cache (in
# this process only: its children keep the variable). An unwritable tree is no error.
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parent.parent

# Property-based tests: no per-example deadline (the suite must pass at load 6 on 2 cores, so
# no test hinges on wall-clock time), a fixed number of examples, and no example database
# written into the checkout.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("telltale", deadline=None, max_examples=150, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "telltale"))


@pytest.fixture(autouse=True)
def _secrets_stay_in_their_test() -> Iterator[None]:
    """A secret a test registers masks only that test's output (the registry is process-wide:
    a plotly token registered by one test turned another's manifest key into ``***``)."""
    from core.redact import known_secrets, restore_secrets

    before = known_secrets()
    yield
    restore_secrets(before)


@pytest.fixture()
def python() -> str:
    """The interpreter running the tests (for CLI subprocess tests)."""
    return sys.executable


@pytest.fixture(autouse=True)
def _no_temporary_prefect_server() -> Iterator[None]:
    """Fail a test in which Prefect started its own temporary server in this process.

    That server is what a flow or a Prefect client gets without an API setting: code that
    went around `flows.api_server.prefect_api` (or a test around `prefect_harness`, e.g.
    from a bare thread). It cost 20 s to minutes a time under load, and failed outright.
    """
    server_module = sys.modules.get("prefect.server.api.server")
    before = dict(server_module.SubprocessASGIServer._instances) if server_module else {}
    yield
    server_module = sys.modules.get("prefect.server.api.server")
    if server_module is None:
        return
    started = {key: server for key, server in server_module.SubprocessASGIServer._instances
               .items() if before.get(key) is not server and server.running}
    for server in started.values():
        server.stop()
    assert not started, ("Prefect started a temporary API server in this test: a flow or "
                         "client ran without the session's API (use prefect_harness; in a "
                         "thread, run it in contextvars.copy_context())")


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[str]:
    """The session's one Prefect API for the flows tests run in-process; yields its URL.

    The shared local API the command-line runs of the session use too (`flows.local_api`,
    under ``TELLTALE_PREFECT_API_HOME``), as a user of it: Prefect's own test harness started
    one more server per xdist worker (8-10 s each quiet; 74 s under load 9).
    """
    # Prefect sets logging up (`logging.config.dictConfig`: the root logger's handlers
    # replaced) when `prefect.main` is first imported — lazily, by the first `from prefect
    # import flow`. Inside a test's call that removed pytest's capture handlers, and a test
    # reading `caplog` saw nothing when it was the first of its worker to import a flow
    # (run alone: tests/e2e/test_publish.py's retry lines). Done here, in a setup phase.
    import prefect.main  # noqa: F401
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.api_server import drain_prefect_workers
    from flows.local_api import shared_api

    with shared_api() as state, temporary_settings(updates={PREFECT_API_URL: state.url}):
        try:
            yield state.url
        finally:
            drain_prefect_workers()  # the logs and events queued, while the API answers


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real S3-protocol server (moto) on 127.0.0.1; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the test server, with AWS env vars pointing at it."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    name = f"tt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.hookimpl(optionalhook=True)  # -p no:xdist: no such hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: two workers a core (``--maxprocesses`` caps it at 4), unless
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` says otherwise (xdist's own hook reads it).

    A test waits a third of its time on a process it started (a server's start, a worker's
    poll, a retry's backoff): with one worker a core the 2-core machine was 78 % busy, and
    the suite took 14 min 21 s; with two, 99 % and 11 min 54 s (docs/performance.md).
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 2 * len(os.sched_getaffinity(0))


def _shared_setup(item: pytest.Item) -> object:
    """The module whose fixture ``item`` shares with its neighbours (a deploy, a generated
    history: tens of seconds each) or whose tests are marked ``one_worker``, else the item
    itself."""
    if item.get_closest_marker("one_worker") is not None:
        return item.nodeid.split("::", 1)[0]
    definitions = getattr(item, "_fixtureinfo", None)
    for defs in (definitions.name2fixturedefs.values() if definitions else ()):
        if any(d.scope in ("module", "package", "class") for d in defs):
            return item.nodeid.split("::", 1)[0]
    return item


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each xdist worker's first block of tests gets its share of the expected time, longest
    first (`tests.durations.deal`): measured against whole flows first, which put them all
    in one worker's block, in docs/performance.md."""
    from tests.durations import DEFAULT_S, DEFAULT_SLOW_S, deal, expected_seconds

    expected = expected_seconds()

    def cost(item: pytest.Item) -> float:
        slow = item.get_closest_marker("slow") is not None
        return expected.get(item.nodeid, DEFAULT_SLOW_S if slow else DEFAULT_S)

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    items[:] = deal(items, cost, workers, group=_shared_setup)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the session's shared local Prefect API and the spare Prometheus and warm Pythons
    its runs left (the controller, once all workers end).

    Runs with a home of their own (a deployed run under a worker's minimal environment) leave
    their spares under the session's temporary dirs: those are stopped too, so the suite
    leaves no process behind (a spare would otherwise stop itself 10 minutes later).
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from core.warm_python import stop_warm_pythons
    from flows.local_api import stop
    from tasks.observe.spare import SPARES_DIR, stop_spares

    home = Path(os.environ["TELLTALE_PREFECT_API_HOME"])
    stop(home)
    stop_spares(home / SPARES_DIR)
    basetemp = session.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    for base in _spare_bases_under(basetemp):
        stop_spares(base)
    for root in (home, basetemp):  # the warm Pythons the runs left (core.warm_python)
        stop_warm_pythons(root)


def _spare_bases_under(root: Path) -> set[Path]:
    """The dirs of spare Prometheus whose keeper runs and whose dir is under ``root``."""
    bases = set()
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tasks.observe.spare" in argv and len(argv) > 3:
            directory = Path(os.fsdecode(argv[3]))
            if directory.is_relative_to(root):
                bases.add(directory.parent)
    return bases
