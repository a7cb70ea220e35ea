"""Whole-flow runs of llm_serving on the local platform: a real vLLM server (CPU build), the
real GuideLLM, real Prefect. Needs the serving venv (.ci/run builds it)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.discovery import ResultDir
from analysis.kpi import compute_kpis
from analysis.parsing import FileReader
from projects import registry
from projects.contract import LocalService
from projects.library.runs import FORKED, FRESH
from tests.factories import (
    cli_env,
    group_gone,
    process_gone,
    running_in,
    serving_venv_or_skip,
    terminal_job,
    wait_until,
)

# one_worker: each test starts a real vLLM server, which takes both cores; two at once
# (dealt to two workers) left a 5 s load window without one finished request
pytestmark = [pytest.mark.slow, pytest.mark.one_worker]

# One server for both cells; the second calls the chat route of a model with no chat
# template: every request is refused (400), the load step says no request succeeded.
TWO_CELLS = ["--var", "tests.llm_serving.test_settings.duration_s=5",
             "--var", "tests.llm_serving.test_extra_settings=[{request_format: /v1/completions},"
                      " {request_format: /v1/chat/completions}]"]


def _reasons(run_dir: Path) -> str:
    """Each cell's status and reason from the run's outcome, and the end of each server log."""
    outcome = run_dir / "outcome.json"
    cells = json.loads(outcome.read_text())["cells"] if outcome.exists() else []
    said = [f"{c.get('name')}: {c.get('status')} {c.get('reason') or ''}" for c in cells]
    said += [f"{log}:\n{log.read_text(errors='replace')[-3000:]}"
             for log in sorted(run_dir.glob("services/*/server.log"))]
    return "\n".join(said)


def _light_server() -> LocalService:
    """The light preset's server, as a CLI run of these tests asks for it."""
    from projects.config import resolve
    from tasks.platforms.local_ahead import first_context

    project = registry.load("llm_serving")
    context = first_context(project, resolve("llm_serving", presets=["light"], env={}))
    assert project.local_service is not None and context is not None
    return project.local_service(context)


def _offer_the_servers_warm_python() -> None:
    """What a light run leaves once its cells are done: the server's warm Python, vLLM's API
    server and engine core imported (`tasks.platforms.service_launch`), offered here with
    the environment a CLI run of this test has (its key must be the run's)."""
    from tasks.platforms.service_launch import offer_warm_service

    offer_warm_service(_light_server())


def _assert_private_temporary_dir_gone(server_log: str) -> None:
    """The server's own temporary dir (vLLM's sockets and stores: vllm_server.py) was
    used, and went with the server."""
    import re

    private = re.search(r"temporary files under (\S+), removed at exit", server_log)
    assert private is not None, server_log[-2000:]
    assert not Path(private.group(1)).exists(), f"{private.group(1)} outlived the server"


def test_two_cells_share_one_real_server_and_a_failed_cell_leaves_nothing(
        tmp_path: Path) -> None:
    """The server forked from its warm Python, still importing when the run asks for it (a
    run started right after a first one): the run waits for it, and the server's engine
    core is forked from the server."""
    serving_venv_or_skip()
    _offer_the_servers_warm_python()
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "flows.llm_serving", "--preset", "light",
                           *TWO_CELLS, "--artifact-dir", str(run_dir)],
                          capture_output=True, text=True, env=cli_env(tmp_path), timeout=1500)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 1, output  # one cell failed
    cells = sorted(run_dir.glob("*__cell*"))
    assert len(cells) == 2, output
    jobs = [next(c.glob("*__llm_serving__run_llm_serving_load"), None) for c in cells]
    # a cell with no load step failed before it (its server, Prometheus): say why
    assert None not in jobs, f"{_reasons(run_dir)}\n{output}"
    # each cell's load forked from the serving venv's warm Python, GuideLLM imported
    # there once (core.warm_python; workload/load.py runs it in-process)
    launches = [json.loads((j / "artifacts" / "process.json").read_text())["launch"]
                for j in jobs]
    assert all(launch.startswith(FORKED) for launch in launches), launches
    # one server for both cells (same key), stopped at the end
    services = list((run_dir / "services").iterdir())
    assert len(services) == 1
    records = [json.loads((j / "artifacts" / "service.json").read_text()) for j in jobs]
    assert records[0]["pid"] == records[1]["pid"] and records[0]["url"] == records[1]["url"]
    assert process_gone(records[0]["pid"]), "the vLLM server outlived the run"
    # the server was forked from its warm Python, its engine core from the server
    # (workload/vllm_server.py); neither it nor the worker outlived it
    assert records[0]["launch"].startswith(FORKED), records[0]
    assert records[0]["engine_core_start"] == "forked"
    server_log = (services[0] / "server.log").read_text()
    assert "telltale: the engine core is forked from the API server" in server_log
    _assert_private_temporary_dir_gone(server_log)
    assert group_gone(records[0]["pid"]), "a process of the vLLM server outlived the run"
    assert not list(run_dir.rglob("workload.pid"))
    # nothing a load started outlived it (GuideLLM's workers had, by minutes: a torch
    # data-loader worker has its load's command line)
    wait_until(lambda: not running_in(run_dir), "the loads' leftovers gone", timeout_s=60)
    assert "stopped_at" in json.loads((services[0] / "service.json").read_text())
    # the failed cell: the load step's own words in the outcome
    outcome = json.loads((run_dir / "outcome.json").read_text())
    failed = [c for c in outcome["cells"] if c["status"] == "failed"]
    assert len(failed) == 1 and (cells[1] / "exit_code").read_text().strip() == "4"
    # KPIs of the good cell are the numbers GuideLLM itself wrote
    result_file = jobs[0] / "artifacts" / "guidellm.json"
    written = json.loads(result_file.read_text())["benchmarks"][0]["metrics"]
    post = next(run_dir.glob("*__analysis__postprocess_results"))
    kpis = pd.read_parquet(post / "kpis.parquet")
    assert set(kpis["engine_core_start"]) == {"forked"}  # a label: its own history
    good = kpis[kpis["request_format"] == "/v1/completions"].set_index("kpi")["value"]
    assert math.isclose(good["ttft_p95"], written["time_to_first_token_ms"]["successful"][
        "percentiles"]["p95"])
    assert math.isclose(good["output_tokens_per_second"],
                        written["output_tokens_per_second"]["successful"]["mean"])
    for name in ("itl_p50", "tpot_p99", "request_latency_p95", "requests_per_second",
                 "server_startup_time"):
        assert math.isfinite(good[name]) and good[name] > 0, name
    assert good["error_rate"] == 0.0
    # goodput under the light preset's SLO (loose for a CPU): bounded by what was served
    assert 0.0 <= good["slo_attainment_pct"] <= 100.0
    assert 0.0 <= good["goodput_requests_per_second"] <= good["requests_per_second"] + 1e-9
    assert 0.0 <= good["goodput_tokens_per_second"] <= good["output_tokens_per_second"] + 1e-9
    bad = kpis[kpis["request_format"] == "/v1/chat/completions"].set_index("kpi")["value"]
    assert bad["error_rate"] == 100.0 and "ttft_p95" not in bad.index
    # the server counted the good cell's tokens itself
    project = registry.load("llm_serving")
    parsed = project.parser.parse(ResultDir(path=str(cells[0]), rel_path=cells[0].name,
                                            settings={}, exit_code=0), FileReader(cells[0]))
    assert parsed.server_counters["generation_tokens"] > 0
    assert {k.name for k in compute_kpis(project.kpis, parsed, {})} >= {"ttft_p50", "itl_p95"}
    # the serving curve page has its point
    report = post / "report"
    curve = next(report.glob("*_kpi_curve.html")).read_text()
    assert "no run has both" not in curve


def test_ctrl_c_while_the_server_starts_leaves_no_server(tmp_path: Path) -> None:
    serving_venv_or_skip()
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "flows.llm_serving", "--preset", "light",
            "--artifact-dir", str(run_dir)]
    proc = terminal_job(argv, cli_env(tmp_path))
    server = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and server is None and proc.poll() is None:
        pid_file = next(run_dir.glob("services/*/workload.pid"), None)
        text = pid_file.read_text().strip() if pid_file is not None else ""
        server = int(text) if text.isdigit() else None
        time.sleep(0.2)
    assert server is not None, "the server never started"
    os.killpg(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 130, output[-3000:]
    assert process_gone(server), "the vLLM server outlived a Ctrl-C"
    assert group_gone(server), "a process of the vLLM server (its fork server, engine " \
        "core or worker) outlived a Ctrl-C"
    assert json.loads((run_dir / "outcome.json").read_text())["exit_code"] == 130


def test_a_nightly_serving_run_that_stays_invalid_exits_3_never_1(tmp_path: Path) -> None:
    """validity: enforce (nightly): an invalid measurement is re-run once against the same
    server; still invalid (here: a declared minimum window of a day), the run is
    inconclusive — exit 3 — with both results kept, stored marked and never judged.

    Warm Pythons off (``TELLTALE_WARM_PYTHON_MINUTES=0``): the server starts as a fresh
    process, its engine core forked from the fork server it starts first; the loads too."""
    serving_venv_or_skip()
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "flows.llm_serving", "--preset", "nightly",
                           "--var", "tests.llm_serving.test_settings.duration_s=5",
                           "--var", "analysis.validity.min_window_s=86400",
                           "--var", f"analysis.history_uri={tmp_path / 'history'}",
                           "--artifact-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=1500,
                          env={**cli_env(tmp_path), "TELLTALE_WARM_PYTHON_MINUTES": "0"})
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 3, output
    record = json.loads(next(run_dir.glob("services/*/service.json")).read_text())
    assert record["launch"] == FRESH and record["engine_core_start"] == "forkserver", record
    server_log = next(run_dir.glob("services/*/server.log")).read_text()
    assert "telltale: the engine core is forked from a fork server" in server_log
    _assert_private_temporary_dir_gone(server_log)
    assert group_gone(record["pid"]), "a process of the vLLM server outlived the run"
    launches = {json.loads(p.read_text())["launch"]
                for p in run_dir.glob("*__cell*/*__run_llm_serving_load/artifacts/process.json")}
    assert launches == {FRESH}, launches
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert [c["validity"] for c in outcome["cells"]] == ["invalid", "invalid"], output
    assert outcome["failures"] == [] and outcome["verdict_counts"] == {"not_judged": 2}
    assert "INCONCLUSIVE" in proc.stdout
    stored = pd.read_parquet(tmp_path / "history")
    assert set(stored["validity"]) == {"invalid"} and stored["run_uuid"].nunique() == 2
