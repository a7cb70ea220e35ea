"""A deployment run by a real process worker from a fresh clone, with no Telltale environment.

The README's work-pool path, end to end: a repository (a bare copy of this commit), a user's
fresh clone that deploys ``deployments/prefect.yaml`` (both work pools, the Prefect variables
its pull step reads), a process worker started in an empty dir with a minimal environment, and
a run of the manual deployment. The run must complete from the worker's own git clone.

And the deployed path's own behaviour: a run cancelled from the API is stopped by the worker,
whose runner calls the flow's cancellation hooks *by keyword* — the hook must run to its end
(its record ``crash_cleanup.json`` in the run's dir) instead of a TypeError in the worker's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.servers.prefect_server import api_call, clean_env, prefect_server, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = {"tests.fine_tuning.test_settings.max_steps": 12,
        "tests.fine_tuning.test_settings.dataset_replication": 1}


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _prefect(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, f"prefect {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done.stdout


@contextmanager
def _deployed(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path, str]]:
    """A bare origin of this commit, a user's clone that deployed prefect.yaml to a real
    server; yields (API URL, the user's environment, the clone, the commit)."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout of Telltale")
    origin = tmp_path / "origin.git"
    _git("init", "--bare", "-q", str(origin), cwd=tmp_path)
    _git("push", "-q", str(origin), "HEAD:refs/heads/main", cwd=ROOT)
    commit = _git("rev-parse", "HEAD", cwd=ROOT)
    clone = tmp_path / "clone"
    _git("clone", "-q", "--branch", "main", str(origin), str(clone), cwd=tmp_path)

    with prefect_server(tmp_path / "server") as api:
        user = clean_env(tmp_path / "user", PREFECT_API_URL=api)
        _prefect(user, clone, "work-pool", "create", "telltale-local", "--type", "process")
        _prefect(user, clone, "work-pool", "create", "telltale-kubernetes", "--type",
                 "kubernetes", "--base-job-template", "deployments/kubernetes-job-template.json")
        _prefect(user, clone, "variable", "set", "telltale_repository", origin.as_uri())
        _prefect(user, clone, "variable", "set", "telltale_ref", "main")
        _prefect(user, clone, "variable", "set", "telltale_image", "example/telltale:test")
        _prefect(user, clone, "deploy", "--all", "--prefect-file",
                 "deployments/prefect.yaml")
        yield api, user, clone, commit


Deployed = tuple[str, dict[str, str], Path, str]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """One server with the deployments, shared by the worker tests of this module (each
    starts its own worker and run): the deploy is ~30 s of Prefect commands a test."""
    with _deployed(tmp_path_factory.mktemp("deployed")) as found:
        yield found


def _state(api: str, run_id: str) -> str:
    """The flow run's state type (``COMPLETED``...), read from the API itself: each
    ``prefect flow-run inspect`` was a 2-4 s command start, and a wait polled it."""
    return str((api_call(api, "GET", f"/flow_runs/{run_id}").get("state") or {}).get("type"))


def _api_post(api: str, path: str, body: dict[str, object]) -> None:
    """Create an object through Prefect's REST API (a work pool, a variable)."""
    api_call(api, "POST", path, body)


def _start(user: dict[str, str], clone: Path, overrides: dict[str, object]) -> str:
    """A run of the manual deployment, as the README starts one (``prefect deployment run``)."""
    started = _prefect(user, clone, "deployment", "run", "fine-tuning/fine-tuning-manual",
                       "--params", json.dumps({"presets": ["light"], "overrides": overrides}))
    return next(word for line in started.splitlines() if "UUID" in line
                for word in line.split() if len(word) == 36 and word.count("-") == 4)


def _start_from_the_api(api: str, overrides: dict[str, object]) -> str:
    """The same run through Prefect's REST API (what the command does, without its 2-3 s
    start: the README's command is the fresh-clone test's)."""
    deployment = api_call(api, "GET", "/deployments/name/fine-tuning/fine-tuning-manual")
    run = api_call(api, "POST", f"/deployments/{deployment['id']}/create_flow_run",
                   {"parameters": {"presets": ["light"], "overrides": overrides}})
    return str(run["id"])


def test_a_process_worker_runs_a_deployment_from_a_fresh_clone(tmp_path: Path,
                                                              deployed: Deployed) -> None:
    api, user, clone, commit = deployed
    run_id = _start(user, clone, FAST)

    # the worker: an empty dir, a minimal environment (no TELLTALE_*, no checkout)
    worker_home = tmp_path / "worker"
    workdir = worker_home / "empty"
    workdir.mkdir(parents=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "telltale-local",
         "--type", "process", "--run-once"], cwd=workdir,
        env=clean_env(worker_home, PREFECT_API_URL=api),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # --run-once: the worker takes the scheduled run, runs it, and exits
    output, _ = worker.communicate(timeout=1200)
    assert worker.returncode == 0, output[-4000:]
    assert _state(api, run_id) == "COMPLETED", output[-4000:]

    runs = list((worker_home / ".local" / "share" / "telltale" / "runs").glob(
        f"*-fine_tuning-{run_id[:8]}"))
    assert len(runs) == 1, output[-4000:]  # in the data dir: the worker deletes its clone
    outcome = json.loads((runs[0] / "outcome.json").read_text())
    assert outcome["exit_code"] == 0
    assert outcome["code_commit"] == commit  # the code came from the pull step's clone
    assert not outcome["code_dir"].startswith(str(ROOT))
    assert "main" in Path(outcome["code_dir"]).name


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _flow_process(run_id: str) -> int:
    """The flow run's process: the top one of those the worker gave the run's id.

    Not the workload's parent: a workload forked from the warm Python is the warm Python's
    child, and the processes the flow starts inherit the id too.
    """
    marker = f"PREFECT__FLOW_RUN_ID={run_id}".encode()
    holders = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                holders.add(int(proc.name))
        except OSError:
            continue
    tops = [pid for pid in holders if _parent_of(pid) not in holders]
    assert len(tops) == 1, f"flow processes of {run_id}: {sorted(holders)}"
    return tops[0]


def _stop_worker(worker: subprocess.Popen[str], *, run_ended: bool) -> None:
    """End a ``--run-once`` worker started in its own session, and all it started.

    Once its run has ended the worker exits by itself; a test that failed before that ends
    it at once. A long-running worker told to stop with SIGTERM did not (Prefect's worker
    turns it into a SIGINT to itself, which it did not act on): two minutes later it was
    still polling the pool, took the next test's run and ran it in its own home, and that
    test waited 900 s for a workload that never came. So a bounded wait, then SIGKILL to its
    whole session: no worker outlives its test to take another test's run.
    """
    if run_ended:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=300)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)  # its run's processes too, if any were left
    worker.wait(timeout=120)


@pytest.mark.parametrize("how", ["cancel", "crash", "sigterm"])
def test_a_deployed_run_cancelled_or_crashed_runs_its_cleanup_hook(tmp_path: Path, how: str,
                                                                   deployed: Deployed) -> None:
    """The runner calls ``on_cancellation``/``on_crashed`` hooks by keyword: the hook must
    complete. Cancelled from the API, crashed (its flow process SIGKILLed), or terminated
    (SIGTERM to the flow process: its own cleanup runs, then the hook)."""
    worker_home = tmp_path / "worker"
    workdir = worker_home / "empty"
    workdir.mkdir(parents=True)
    runs = worker_home / ".local" / "share" / "telltale" / "runs"
    api, user, clone, _commit = deployed
    run_id = _start_from_the_api(api, {
        "tests.fine_tuning.test_settings.max_steps": 1_000_000,
        "tests.fine_tuning.test_settings.dataset_replication": 1})
    log = (worker_home / "worker.log").open("w")
    # --run-once: the worker takes this run, and exits once the run has ended
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "telltale-local",
         "--type", "process", "--run-once"], cwd=workdir,
        env=clean_env(worker_home, PREFECT_API_URL=api), stdout=log, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        # the workload is running once the cell's pid file exists (not any pid file: the
        # run's own Prometheus has one from its first second, and a SIGTERM then landed
        # while Prefect was creating a task run)
        wait_for("running workload", lambda: next(runs.glob(
            f"*-fine_tuning-{run_id[:8]}/*__cell/*__run_fine_tuning_job/workload.pid"),
            None), worker, 900)
        if how == "cancel":
            _prefect(user, clone, "flow-run", "cancel", run_id)
        else:  # the flow process: killed, or terminated
            os.kill(_flow_process(run_id), signal.SIGKILL if how == "crash" else signal.SIGTERM)
        run_dir = next(runs.glob(f"*-fine_tuning-{run_id[:8]}"))
        record = wait_for("crash_cleanup.json", lambda: (
            run_dir / "crash_cleanup.json").is_file(), worker, 900)
        assert record
        state = wait_for("a final state", lambda: next(
            (s for s in ("CANCELLED", "COMPLETED", "FAILED", "CRASHED")
             if s == _state(api, run_id)), None), worker, 900)
        assert state == ("CANCELLED" if how == "cancel" else "CRASHED")
    except BaseException:
        _stop_worker(worker, run_ended=False)
        raise
    else:
        _stop_worker(worker, run_ended=True)
    finally:
        log.close()
    output = (worker_home / "worker.log").read_text()
    assert "An error was encountered while running hook" not in output, output[-4000:]
    cleanup = json.loads((run_dir / "crash_cleanup.json").read_text())
    assert cleanup["errors"] == []
    assert cleanup["state"] in (("Cancelling", "Cancelled") if how == "cancel" else
                                ("Crashed",))
    if how == "sigterm":  # the run's own cleanup ran first and said so
        outcome = json.loads((run_dir / "outcome.json").read_text())
        assert outcome["exit_code"] == 143 and "terminated" in outcome["failures"][-1]
    assert not list(run_dir.rglob("workload.pid"))  # the workload was stopped


def test_deploy_deploys_what_its_pools_allow_and_names_what_it_skipped(tmp_path: Path) -> None:
    """Only the process pool exists: `prefect deploy --all` would exit 1 on the Kubernetes
    deployments; `python -m deployments.deploy` deploys the rest and says what it skipped."""
    from deployments.deploy import deployable
    from deployments.prefect_file import PREFECT_FILE

    with prefect_server(tmp_path / "server") as api:
        user = clean_env(tmp_path / "user", PREFECT_API_URL=api)
        # the pool and the variables through Prefect's REST API (the `prefect` commands the
        # README names are the module fixture's: each is a 2-4 s command start)
        _api_post(api, "/work_pools/", {"name": "telltale-local", "type": "process"})
        for name in ("telltale_repository", "telltale_ref", "telltale_image"):
            _api_post(api, "/variables/", {"name": name, "value": "x"})
        done = subprocess.run([sys.executable, "-m", "deployments.deploy"], cwd=ROOT,
                              env={**user, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        listed = _prefect(user, ROOT, "deployment", "ls")
    wanted, skipped = deployable(PREFECT_FILE, {"telltale-local"})
    assert skipped and all(pool == "telltale-kubernetes" for _, pool in skipped)
    for name, _ in skipped:
        assert f"skipped {name}: work pool 'telltale-kubernetes' does not exist" in done.stdout
    assert "prefect work-pool create telltale-kubernetes" in done.stdout
    rows = [line for line in listed.splitlines() if "telltale-loca" in line]  # a table
    assert len(rows) == len(wanted) and "telltale-kube" not in listed, listed
    assert f"deployed {len(wanted)}, skipped {len(skipped)}" in done.stdout
