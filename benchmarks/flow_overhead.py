"""Orchestration overhead of the fine-tuning flow: wall time minus workload time.

    python benchmarks/flow_overhead.py [--cells 10] [--skip-cli]

Workload time is what the trainer processes themselves took (``process.json`` of every
cell); everything else — Prefect engine, config, capture, post-processing, report, Prefect
artifacts, cleanup — is overhead. Measured three ways:

1. ``cli``: ``python -m flows.fine_tuning --preset light`` as a user types it, with Prefect's
   temporary API server (its ~12 s start is counted as overhead);
2. ``light``: the light preset run by a process already connected to a running
   ``prefect server`` (how a worker or ``flows.serve`` runs deployments); ``light-hb0`` the
   same with Prefect's flow heartbeat off (what the CLI does with its temporary server);
3. ``matrix``: the light preset with N learning rates (N cells), same setting.

Goal (issue #5): overhead <= 10 % of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from core.prefect_seed import seed  # noqa: E402
from tasks.process import free_port  # noqa: E402


def workload_seconds(run_dir: Path) -> float:
    return sum(json.loads(p.read_text())["duration_s"]
               for p in run_dir.glob("*__cell/*__run_fine_tuning_job/artifacts/process.json"))


def report(name: str, wall: float, work: float) -> None:
    overhead = wall - work
    print(f"{name:<9} wall {wall:7.1f} s  workload {work:7.1f} s  overhead {overhead:6.1f} s "
          f"= {overhead / wall:6.1%}")


def run_cli(tmp: Path, env: dict[str, str]) -> None:
    run_dir = tmp / "cli"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                    "--artifact-dir", str(run_dir)], cwd=REPO, env=env, check=True,
                   capture_output=True)
    report("cli", time.perf_counter() - start, workload_seconds(run_dir))


def run_with_server(tmp: Path, env: dict[str, str], cells: int) -> None:
    port = free_port()
    seed(tmp / "prefect-home" / "prefect.db")  # when `cli` did not make it (core.prefect_seed)
    server = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=tmp)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        os.environ.update(env)
        os.environ["PREFECT_API_URL"] = api
        sys.path.insert(0, str(REPO))
        from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        from flows.fine_tuning.flow import fine_tuning

        history = {"analysis.history_uri": str(tmp / "history")}
        fine_tuning(presets=["light"], overrides={
            **history, "tests.fine_tuning.test_settings.max_steps": 2},
            artifact_dir=str(tmp / "warmup"))
        start = time.perf_counter()
        fine_tuning(presets=["light"], overrides=history, artifact_dir=str(tmp / "light"))
        report("light", time.perf_counter() - start, workload_seconds(tmp / "light"))
        # the same without Prefect's flow heartbeat (its thread join costs ~1 s at exit)
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            start = time.perf_counter()
            fine_tuning(presets=["light"], overrides=history, artifact_dir=str(tmp / "light2"))
            report("light-hb0", time.perf_counter() - start, workload_seconds(tmp / "light2"))
        rates = [round(1e-4 * (i + 1), 6) for i in range(cells)]
        start = time.perf_counter()
        fine_tuning(presets=["light"], overrides={
            **history, "tests.fine_tuning.test_settings.hyper_parameters.learning_rate": rates},
            artifact_dir=str(tmp / "matrix"))
        report(f"matrix{cells}", time.perf_counter() - start, workload_seconds(tmp / "matrix"))
    finally:
        server.terminate()
        server.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--skip-cli", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"), "DO_NOT_TRACK": "1",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "TELLTALE_DATA_DIR": str(tmp / "data"),
               # `cli` measures a run with its own temporary API, as this script always has
               # (benchmarks/main_job.py measures the shared one); none is left behind
               "TELLTALE_PREFECT_API": "temporary",
               "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60"}
        if not args.skip_cli:
            run_cli(tmp, env)
        run_with_server(tmp, env, args.cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
