"""A run that is interrupted (Ctrl-C, SIGTERM, SIGKILL of the CLI) stops its workload,
cleans up, releases what it leased, and leaves no server behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.factories import cli_env, process_gone, terminal_job

pytestmark = pytest.mark.slow


def _start_long_run(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                    ) -> tuple[subprocess.Popen[str], Path, int]:
    """The CLI in its own session (like a terminal's job), up to its running trainer."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
            "--var", "tests.fine_tuning.test_settings.dataset_replication=20",
            "--artifact-dir", str(run_dir), *extra]
    proc = terminal_job(argv, env or cli_env(tmp_path))
    pid_file = None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and pid_file is None and proc.poll() is None:
        pid_file = next(run_dir.glob("*__cell/*__run_fine_tuning_job/workload.pid"), None)
        time.sleep(0.2)
    if pid_file is None:  # say why: the CLI's own words (a fresh-clone run once ended
        # here after 73 s with an empty run dir, and nothing said what the CLI had printed)
        proc.kill()
        output = proc.communicate(timeout=60)[0]
        pytest.fail(f"the workload never started (the CLI exited {proc.returncode}):\n"
                    f"{output[-6000:]}")
    return proc, run_dir, int(pid_file.read_text())


def _communicate_or_dump(proc: subprocess.Popen[str], timeout: float = 900) -> str:
    """The CLI's output once it exits; if it does not, its threads' stacks (SIGUSR1) in the
    failure message: a loaded CI machine is slow, a hang needs a diagnosis."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
        pytest.fail(f"the CLI did not exit {timeout:.0f} s after Ctrl-C; its stacks:\n"
                    f"{output[-8000:]}")


def _servers_of(prefect_home: Path) -> list[int]:
    """Temporary Prefect API servers started with this PREFECT_HOME."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if "uvicorn" in (proc / "cmdline").read_text() and str(prefect_home) in \
                    (proc / "environ").read_text(errors="replace"):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.timeout(1800)  # start (≤ 900 s) + a shutdown that load may slow (≤ 900 s)
def test_ctrl_c_stops_the_workload_and_cleans_up(tmp_path: Path) -> None:
    """A terminal's Ctrl-C signals the whole process group, not only the CLI."""
    proc, run_dir, workload_pid = _start_long_run(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    output = _communicate_or_dump(proc)
    assert proc.returncode == 130, output[-3000:]
    assert process_gone(workload_pid)
    assert "Connection refused" not in output and "All connection attempts failed" not in output
    assert next(run_dir.glob("*__cleanup__cleanup"), None) is not None, output[-3000:]
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["exit_code"] == 130 and "interrupted" in outcome["failures"][0]
    assert yaml.safe_load((run_dir / "plan.yaml").read_text())["cells"][0]["name"] == "base"
    assert not _servers_of(tmp_path / "prefect-home")
    # the shared local API it used is in its own session: the Ctrl-C did not reach it
    from flows.local_api import status

    assert status() is not None


@pytest.mark.timeout(1800)
def test_sigterm_is_taken_the_ctrl_c_way(tmp_path: Path) -> None:
    """SIGTERM to the CLI alone (a scheduler, kill, a CI timeout): the workload stops, the
    cleanup runs, outcome.json says so, exit 143."""
    proc, run_dir, workload_pid = _start_long_run(tmp_path)
    proc.send_signal(signal.SIGTERM)
    output = _communicate_or_dump(proc)
    assert proc.returncode == 143, output[-3000:]
    assert process_gone(workload_pid)
    assert next(run_dir.glob("*__cleanup__cleanup"), None) is not None, output[-3000:]
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["exit_code"] == 143 and "terminated" in outcome["failures"][0]
    assert not _servers_of(tmp_path / "prefect-home")


@pytest.mark.timeout(1800)
def test_sigterm_while_quads_is_down_names_the_lease_left_active(tmp_path: Path) -> None:
    """A leased run gets SIGTERM while QUADS is unreachable: the release fails, and the last
    lines the scheduler shows are LEFT ACTIVE with the command that releases it."""

    from tests.servers.quads import impatient_tenant, quads_server

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    env = {**cli_env(tmp_path), "TELLTALE_SECRET_DIR": str(secrets)}
    with quads_server() as (url, quads):
        impatient_tenant(url, quads, secrets)
        proc, _run_dir, _pid = _start_long_run(
            tmp_path, "--var", "clusters.sutest.lab.enabled=true",
            "--var", "clusters.sutest.lab.poll_seconds=0.05", env=env)
        quads.down = True
        proc.send_signal(signal.SIGTERM)
        output = _communicate_or_dump(proc)
        assert any(a["active"] for a in quads.assignments.values())  # really left
    assert proc.returncode == 143, output[-3000:]
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1].startswith("LEFT ACTIVE: "), output[-3000:]
    assert "python -m flows.cleanup --quads --project fine_tuning" in lines[-1]
    assert "left 1 thing(s) active" in output


def test_sigkill_of_the_cli_leaves_no_workload_and_no_server(tmp_path: Path) -> None:
    """With a temporary API of its own (the shared one outlives runs by design)."""
    proc, _, workload_pid = _start_long_run(
        tmp_path, env={**cli_env(tmp_path), "TELLTALE_PREFECT_API": "temporary"})
    servers = _servers_of(tmp_path / "prefect-home")
    assert servers, "the CLI's temporary API server was not found"
    proc.kill()
    proc.communicate(timeout=60)
    assert process_gone(workload_pid), "the trainer outlived the CLI"
    assert all(process_gone(pid) for pid in servers), "the API server outlived the CLI"
