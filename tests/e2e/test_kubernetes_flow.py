"""The fine-tuning flow on the kubernetes platform, against the stateful API test server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.servers.fake_operators import OlmController, TrainingOperator, seed_cluster
from tests.servers.kubernetes import kube_server, write_kubeconfig

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, scenario: str, name: str):
    from flows.fine_tuning.flow import fine_tuning

    with kube_server() as (url, state):
        seed_cluster(state, rhoai=None)  # the gpu preset installs RHOAI itself
        operator = TrainingOperator(state, scenario)  # type: ignore[arg-type]
        operator.start()
        olm = OlmController(state)
        olm.start()
        try:
            kubeconfig = write_kubeconfig(tmp_path / f"{name}.kubeconfig", url)
            started = time.monotonic()
            outcome = fine_tuning(presets=["gpu"], platform="kubernetes", overrides={
                "clusters.kubeconfig": kubeconfig,
                "analysis.history_uri": str(tmp_path / "history")},
                artifact_dir=str(tmp_path / name))
            elapsed = time.monotonic() - started
        finally:
            operator.stop()
            olm.stop()
        return outcome, state, elapsed


def test_flow_runs_green_against_the_api_server(tmp_path: Path, prefect_harness) -> None:
    outcome, state, _ = _run(tmp_path, "success", "ok")
    assert outcome.exit_code == 0, outcome.failures
    root = tmp_path / "ok"
    cell = next(root.glob("*__cell"))
    capture = next(cell.glob("*__cluster__capture_environment"))
    assert json.loads((capture / "nodes.json").read_text())["items"]
    assert "4.16.3" in (capture / "ocp_version.yml").read_text()
    assert (next(cell.glob("*__rhods__capture_state")) / "rhods.version").read_text().strip() \
        == "1.0.0"
    # prepare installed the operators through OLM, concurrently, before the cell ran
    assert state.get("datasciencecluster.opendatahub.io/v1", "DataScienceCluster",
                     "default-dsc")["status"]["phase"] == "Ready"
    assert state.get("nvidia.com/v1", "ClusterPolicy", "gpu-cluster-policy")
    assert list(root.glob("*__rhods__deploy_rhoai")) and list(
        root.glob("*__gpu_operator__deploy_gpu_operator"))
    job_dir = next(cell.glob("*__fine_tuning__run_fine_tuning_job"))
    assert json.loads((job_dir / "artifacts" / "pod.json").read_text())["status"]["phase"] == \
        "Succeeded"
    assert "'train_runtime'" in (job_dir / "artifacts" / "pod.log").read_text()
    assert json.loads((job_dir / "src" / "config_final.json").read_text())[
        "training_data_path"].startswith("/mnt/storage/dataset/")
    kpis = pd.read_parquet(next(root.glob("*__analysis__*/kpis.parquet"))).set_index("kpi")
    assert kpis.loc["train_tokens_per_second", "value"] == 2500.0  # 1 GPU x the log's value
    assert kpis.loc["train_tokens_per_second", "ocp_version"] == "4.16.3"
    assert kpis.loc["train_tokens_per_second", "accelerator_type"] == "NVIDIA-A100-SXM4-40GB"
    # cleanup removed everything labelled with the run, kept the shared namespace and PVC
    assert not state.list("kubeflow.org/v1", "PyTorchJob")
    assert not state.list("v1", "ConfigMap") and not state.list("batch/v1", "Job")
    assert not [p for p in state.list("v1", "Pod") if p["metadata"]["namespace"] ==
                "fine-tuning-testing"]
    assert state.list("v1", "PersistentVolumeClaim")


def test_image_pull_backoff_fails_fast_and_cleans_up(tmp_path: Path, prefect_harness) -> None:
    outcome, state, elapsed = _run(tmp_path, "image_pull_backoff", "pull")
    assert outcome.exit_code == 1
    assert "ImagePullBackOff" in outcome.cells[0].reason
    assert 'Back-off pulling image "quay.io/modh/fms-hf-tuning' in outcome.cells[0].reason
    assert elapsed < 30
    assert not state.list("kubeflow.org/v1", "PyTorchJob")
    assert not state.list("v1", "ConfigMap")
    job_dir = next((tmp_path / "pull").glob("*__cell/*__fine_tuning__run_fine_tuning_job"))
    assert (job_dir / "artifacts" / "pod.json").is_file()  # captured even though it failed
