"""A deployment run by a real process worker from a fresh clone, with no Telltale environment.

The README's work-pool path, end to end: a repository (a bare copy of this commit), a user's
fresh clone that deploys ``deployments/prefect.yaml`` (both work pools, the Prefect variables
its pull step reads), a process worker started in an empty dir with a minimal environment, and
a run of the manual deployment. The run must complete from the worker's own git clone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers.prefect_server import clean_env, prefect_server

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


def test_a_process_worker_runs_a_deployment_from_a_fresh_clone(tmp_path: Path) -> None:
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
        started = _prefect(user, clone, "deployment", "run", "fine-tuning/fine-tuning-manual",
                           "--params", json.dumps({"presets": ["light"], "overrides": FAST}))
        run_id = next(word for line in started.splitlines() if "UUID" in line
                      for word in line.split() if len(word) == 36 and word.count("-") == 4)

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
        state = _prefect(user, clone, "flow-run", "inspect", run_id)
        assert "COMPLETED" in state, output[-4000:]

    runs = list((worker_home / ".local" / "share" / "telltale" / "runs").glob(
        f"*-fine_tuning-{run_id[:8]}"))
    assert len(runs) == 1, output[-4000:]  # in the data dir: the worker deletes its clone
    outcome = json.loads((runs[0] / "outcome.json").read_text())
    assert outcome["exit_code"] == 0
    assert outcome["code_commit"] == commit  # the code came from the pull step's clone
    assert not outcome["code_dir"].startswith(str(ROOT))
    assert "main" in Path(outcome["code_dir"]).name
