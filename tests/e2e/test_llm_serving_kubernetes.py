"""The llm_serving flow on the kubernetes platform: the API test server with a driven KServe
controller (an InferenceService turns Ready or its predictor crashes; the load Pod's log is
what the load step prints for a result recorded from the real GuideLLM)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from tests.servers.fake_operators import (
    RECORDED_GUIDELLM,
    KServeController,
    OlmController,
    seed_cluster,
)
from tests.servers.kubernetes import kube_server, write_kubeconfig

pytestmark = pytest.mark.slow
ONE_CELL = {"tests.llm_serving.test_settings.concurrency": 4}


def _run(tmp_path: Path, scenario: str, name: str):
    from flows.llm_serving.flow import llm_serving
    from flows.orchestration import outcome_of

    with kube_server() as (url, state):
        seed_cluster(state, rhoai=None)  # the gpu preset installs RHOAI itself
        kserve = KServeController(state, scenario)  # type: ignore[arg-type]
        kserve.start()
        olm = OlmController(state)
        olm.start()
        try:
            outcome = outcome_of(llm_serving(presets=["gpu"], platform="kubernetes", overrides={
                "clusters.kubeconfig": write_kubeconfig(tmp_path / f"{name}.kubeconfig", url),
                "analysis.history_uri": str(tmp_path / "history"), **ONE_CELL},
                artifact_dir=str(tmp_path / name), return_state=True))
        finally:
            kserve.stop()
            olm.stop()
        return outcome, state


def test_kserve_serving_runs_green_and_cleans_up(tmp_path: Path, prefect_harness) -> None:
    outcome, state = _run(tmp_path, "success", "ok")
    assert outcome.exit_code == 0, outcome.failures
    root = tmp_path / "ok"
    job = next(root.glob("*__cell/*__llm_serving__run_llm_serving_load"))
    applied = json.loads((job / "manifests.json").read_text())
    kinds = [m["kind"] for m in applied]
    # the runtime and the model first, the load after the InferenceService turned Ready
    assert kinds.index("InferenceService") < kinds.index("Job")
    assert json.loads((job / "artifacts" / "job.json").read_text())["spec"]["backoffLimit"] == 0
    assert json.loads((job / "artifacts" / "pod.json").read_text())["metadata"]["name"] \
        .endswith("-load-x7k2q")
    isvc = json.loads((job / "artifacts" / "inferenceservice.json").read_text())
    assert isvc["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert json.loads((job / "src" / "load.json").read_text())["concurrency"] == 4
    # KPIs from the load Pod's log equal the recorded GuideLLM result's own numbers
    written = json.loads(RECORDED_GUIDELLM.read_text())["benchmarks"][0]["metrics"]
    kpis = pd.read_parquet(next(root.glob("*__analysis__*/kpis.parquet"))).set_index("kpi")
    assert math.isclose(kpis.loc["ttft_p95", "value"],
                        written["time_to_first_token_ms"]["successful"]["percentiles"]["p95"])
    assert math.isclose(kpis.loc["requests_per_second", "value"],
                        written["requests_per_second"]["successful"]["mean"])
    assert kpis.loc["ttft_p95", "platform"] == "kubernetes"
    assert kpis.loc["ttft_p95", "concurrency"] == "4"
    # run-labelled cleanup: the KServe objects and the load are gone, the namespace stays
    assert not state.list("serving.kserve.io/v1beta1", "InferenceService")
    assert not state.list("serving.kserve.io/v1alpha1", "ServingRuntime")
    assert not [j for j in state.list("batch/v1", "Job") if j["metadata"]["name"].endswith(
        "-load")]
    assert not state.list("v1", "ConfigMap")


def test_a_crashing_predictor_fails_fast_with_the_kubelet_reason(tmp_path: Path,
                                                                 prefect_harness) -> None:
    outcome, state = _run(tmp_path, "crash", "crash")
    assert outcome.exit_code == 1
    reason = outcome.cells[0].reason
    assert "CrashLoopBackOff" in reason and "kserve-container" in reason, reason
    # failed on the pod's status, not on the gate's deadline (no clock bound: load-safe)
    assert "not ready after" not in reason
    # the load never ran: it is applied only once the model is Ready
    assert not state.list("batch/v1", "Job")
    assert not state.list("serving.kserve.io/v1beta1", "InferenceService")


def test_load_clients_fan_out_against_one_model_server(tmp_path: Path, prefect_harness,
                                                      s3_server: str, s3_bucket: str) -> None:
    """multi_user on a cluster: the model server is the users' shared service (Ready before
    any user starts), then N load clients as one Indexed Job behind the start barrier, each
    leaving its GuideLLM result in its result dir, collected from S3 into users/user-NNN/."""
    from flows.llm_serving.flow import llm_serving
    from flows.orchestration import outcome_of
    from tests.servers.fake_operators import IndexedJobController

    # each client "runs GuideLLM": it leaves the recorded real result in its {dir}
    client = ["python3", "-c", "import shutil, sys; shutil.copy(sys.argv[1], "
              "sys.argv[2] + '/guidellm.json'); print('load done')",
              str(RECORDED_GUIDELLM), "{dir}"]
    with kube_server() as (url, state):
        seed_cluster(state, rhoai=None)
        kserve = KServeController(state, "success")
        kserve.start()
        olm = OlmController(state)
        olm.start()
        mount = tmp_path / "mount"
        mount.mkdir()
        jobs = IndexedJobController(state, str(mount))
        jobs.start()
        try:
            outcome = outcome_of(llm_serving(presets=["gpu"], platform="kubernetes", overrides={
                "clusters.kubeconfig": write_kubeconfig(tmp_path / "kc", url),
                "analysis.history_uri": str(tmp_path / "history"), **ONE_CELL,
                "tests.llm_serving.multi_user.enabled": True,
                "tests.llm_serving.multi_user.user_count": 3,
                "tests.llm_serving.multi_user.collect_batch": 2,
                "tests.llm_serving.multi_user.s3_endpoint": s3_server,
                "tests.llm_serving.multi_user.s3_bucket": s3_bucket,
                "tests.llm_serving.multi_user.command": client},
                artifact_dir=str(tmp_path / "run"), return_state=True))
        finally:
            for controller in (jobs, kserve, olm):
                controller.stop()
        assert outcome.exit_code == 0, outcome.failures
        root = tmp_path / "run"
        step = next(root.glob("*__cell/*__llm_serving__run_llm_serving_load"))
        kinds = [m["kind"] for m in json.loads((step / "manifests.json").read_text())]
        assert kinds == ["Namespace", "ServingRuntime", "InferenceService", "ConfigMap", "Job"]
        users = sorted(p.name for p in (step / "users").iterdir())
        assert users == ["user-000", "user-001", "user-002"]
        for user in users:
            assert (step / "users" / user / "guidellm.json").is_file()
            assert (step / "users" / user / "exit_code").read_text().strip() == "0"
        # the fan-out's KPIs from the three users' GuideLLM results (the same recorded run:
        # the median of the users' TTFT p50 is its own p50)
        kpis = pd.read_parquet(next(root.glob("*__analysis__*/kpis.parquet"))).set_index("kpi")
        written = json.loads(RECORDED_GUIDELLM.read_text())["benchmarks"][0]["metrics"]
        assert kpis.loc["ttft_p50", "user_count"] == "3"
        assert kpis.loc["ttft_p50", "platform"] == "kubernetes"
        assert math.isclose(kpis.loc["ttft_p50", "value"],
                            written["time_to_first_token_ms"]["successful"]["median"],
                            rel_tol=0.01)
        assert kpis.loc["error_rate", "value"] == 0.0
        # cleanup: the server and the users' Job went with the run
        assert not state.list("serving.kserve.io/v1beta1", "InferenceService")
        assert not [j for j in state.list("batch/v1", "Job")
                    if j["metadata"]["name"].endswith("-clients")]
