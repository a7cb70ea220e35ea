"""The fine-tuning flow on the kubernetes platform, against the stateful API test server."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.servers.fake_operators import OlmController, TrainingOperator, seed_cluster
from tests.servers.kubernetes import kube_server, write_kubeconfig

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, scenario: str, name: str, overrides: dict | None = None):
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    with kube_server() as (url, state):
        seed_cluster(state, rhoai=None)  # the gpu preset installs RHOAI itself
        operator = TrainingOperator(state, scenario)  # type: ignore[arg-type]
        operator.start()
        olm = OlmController(state)
        olm.start()
        try:
            kubeconfig = write_kubeconfig(tmp_path / f"{name}.kubeconfig", url)
            outcome = outcome_of(fine_tuning(presets=["gpu"], platform="kubernetes", overrides={
                "clusters.kubeconfig": kubeconfig,
                "analysis.history_uri": str(tmp_path / "history"), **(overrides or {})},
                artifact_dir=str(tmp_path / name), return_state=True))
        finally:
            operator.stop()
            olm.stop()
        return outcome, state


def test_flow_runs_green_against_the_api_server(tmp_path: Path, prefect_harness) -> None:
    from tasks.kube.api import clients_built, open_clients

    built = clients_built()
    outcome, state = _run(tmp_path, "success", "ok")
    assert outcome.exit_code == 0, outcome.failures
    # every step (prepare's concurrent operators, the cell, capture, cleanup) shared one
    # client for the run's kubeconfig, and the run closed it
    assert clients_built() == built + 1 and open_clients() == 0
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
    outcome, state = _run(tmp_path, "image_pull_backoff", "pull")
    assert outcome.exit_code == 1
    assert "ImagePullBackOff" in outcome.cells[0].reason
    assert 'Back-off pulling image "quay.io/modh/fms-hf-tuning' in outcome.cells[0].reason
    # failed on the pod's own status, not on the wait's deadline (no clock bound: load-safe)
    assert "not ready after" not in outcome.cells[0].reason
    assert not state.list("kubeflow.org/v1", "PyTorchJob")
    assert not state.list("v1", "ConfigMap")
    job_dir = next((tmp_path / "pull").glob("*__cell/*__fine_tuning__run_fine_tuning_job"))
    assert (job_dir / "artifacts" / "pod.json").is_file()  # captured even though it failed


# what each fan-out user's trainer prints: the summary line the parser reads
USER_SUMMARY = ("{'train_runtime': 10.0, 'train_samples_per_second': 5.0, "
                "'train_steps_per_second': 1.0, 'train_tokens_per_second': 1000.0, "
                "'train_loss': 1.0, 'epoch': 1.0}")


def _scale_test(tmp_path: Path, url: str, s3_server: str, s3_bucket: str,
                overrides: dict) -> object:
    """The scale_test preset on the API server, each user printing `USER_SUMMARY`."""
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    return outcome_of(fine_tuning(presets=["scale_test"], platform="kubernetes", overrides={
        "clusters.kubeconfig": write_kubeconfig(tmp_path / "kc", url),
        "analysis.history_uri": str(tmp_path / "history"),
        "tests.fine_tuning.multi_user.s3_endpoint": s3_server,
        "tests.fine_tuning.multi_user.s3_bucket": s3_bucket,
        "tests.fine_tuning.multi_user.command": ["python3", "-c", f"print({USER_SUMMARY!r})"],
        **overrides}, artifact_dir=str(tmp_path / "run"), return_state=True))


def test_scale_test_on_the_cluster_fans_out_an_indexed_job(tmp_path: Path, prefect_harness,
                                                           s3_server: str,
                                                           s3_bucket: str) -> None:
    from tests.servers.fake_operators import IndexedJobController

    with kube_server() as (url, state):
        seed_cluster(state, rhoai=None)
        mount = tmp_path / "mount"
        mount.mkdir()
        controller = IndexedJobController(state, str(mount))
        controller.start()
        try:
            outcome = _scale_test(tmp_path, url, s3_server, s3_bucket, {
                "tests.fine_tuning.multi_user.user_count": 5,
                "tests.fine_tuning.multi_user.collect_batch": 2,
                "tests.fine_tuning.multi_user.sleep_factor": 0.2})
        finally:
            controller.stop()
        assert outcome.exit_code == 0, outcome.failures
        root = tmp_path / "run"
        assert len(list(root.glob("*__cell/*__users__collect_batch"))) == 3  # 5 users / 2
        kpis = pd.read_parquet(next(root.glob("*__analysis__*/kpis.parquet"))).set_index("kpi")
        assert kpis.loc["users_success_ratio", "value"] == 1.0
        assert kpis.loc["users_train_tokens_per_second_total", "value"] == 5000.0
        assert kpis.loc["user_time_to_start_max", "value"] >= 0.4  # last batch: 2 x 0.2 s
        assert not [j for j in state.list("batch/v1", "Job")
                    if j["metadata"]["name"].startswith("fine-tuning-users")]  # cleaned up


def test_a_pr_build_and_nodes_of_their_own_run_the_users_and_are_given_back(
        tmp_path: Path, prefect_harness, s3_server: str, s3_bucket: str) -> None:
    """``--pr`` with a tainted MachineSet: prepare builds Telltale's images from the PR and
    brings the nodes up; the user pods run the PR's program by digest, on those nodes; the
    cleanup deletes the clone, the builds and their image stream tags."""
    from tests.servers.fake_openshift import (
        BuildController,
        MachineController,
        seed_machine_api,
    )
    from tests.servers.fake_operators import IndexedJobController

    with kube_server() as (url, state):
        seed_cluster(state, rhoai=None)
        seed_machine_api(state)
        mount = tmp_path / "mount"
        mount.mkdir()
        users = IndexedJobController(state, str(mount))
        controllers = [users, MachineController(state), BuildController(state)]
        for controller in controllers:
            controller.start()
        try:
            outcome = _scale_test(tmp_path, url, s3_server, s3_bucket, {
                "clusters.image_build.pr": 42,
                "clusters.image_build.git_url": "https://github.com/org/telltale",
                "clusters.sutest.compute.machineset.enabled": True,
                "clusters.sutest.compute.machineset.replicas": 2,
                "clusters.sutest.compute.machineset.taint": {"key": "telltale.io/compute"},
                "tests.fine_tuning.multi_user.user_count": 3})
            events = list(state.events)
        finally:
            for controller in controllers:
                controller.stop()
        assert outcome.exit_code == 0, outcome.failures
        root = tmp_path / "run"
        built = next(root.glob("*__image__build_images"))
        assert len(list(built.glob("telltale-*-pr42-*.log"))) == 2  # each build's log
        brought = json.loads(next(root.glob("*__machineset__scale_machineset"))
                             .joinpath("machineset.json").read_text())
        assert brought["created"] and len(brought["nodes"]) == 2
        job = next(obj for _, kind, key, obj in events
                   if key[2] == "jobs" and obj["spec"].get("completionMode") == "Indexed")
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"telltale.io/compute": "sutest"}
        assert pod["tolerations"][0]["key"] == "telltale.io/compute"
        program = pod["initContainers"][0]
        assert program["name"] == "telltale-program" and "@sha256:" in program["image"]
        assert users.program_images == [program["image"]]  # what the pods ran
        kpis = pd.read_parquet(next(root.glob("*__analysis__*/kpis.parquet"))).set_index("kpi")
        assert kpis.loc["users_success_ratio", "value"] == 1.0
        # given back: the clone with its nodes, the builds with their tags
        assert state.get("machine.openshift.io/v1beta1", "MachineSet", "telltale-sutest",
                         "openshift-machine-api") is None
        assert not [n for n in state.list("v1", "Node")
                    if "telltale.io/compute" in n["metadata"].get("labels", {})]
        assert not state.list("build.openshift.io/v1", "BuildConfig")
        assert not state.list("image.openshift.io/v1", "ImageStreamTag")


def test_cluster_prometheus_gives_gpu_and_pod_resource_kpis(tmp_path: Path, prefect_harness,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """Each cell's window from the cluster's Prometheus (DCGM and cAdvisor series), with the
    service account's token from the secret dir; KPIs and the report from the files."""
    from tests.servers.prometheus import prometheus_api

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "prometheus-token").write_text("sa-token-xyz\n")
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(secrets))
    with prometheus_api(token="sa-token-xyz") as api:
        api.admin = True  # this one allows a TSDB snapshot
        outcome, _ = _run(tmp_path, "success", "prom", {
            "observe.prometheus.url": api.url,
            "secrets.prometheus_token": "prometheus-token"})
    assert outcome.exit_code == 0, outcome.failures
    assert api.requests and all(r["authorization"] == "Bearer sa-token-xyz"
                                for r in api.requests)
    cell = next((tmp_path / "prom").glob("*__cell"))
    step = next(cell.glob("*__observe__capture_prometheus"))
    assert (step / "prometheus" / "series.parquet").is_file()
    kpis = pd.read_parquet(next((tmp_path / "prom").glob("*__analysis__postprocess_results")) / "kpis.parquet")
    values = kpis.set_index("kpi")["value"]
    assert values["gpu_utilization_mean"] == pytest.approx(70.0)
    assert values["gpu_memory_used_max"] == pytest.approx(50_000 * 1048576 / 1e9)
    assert values["cpu_cores_used_mean"] == pytest.approx(7.5)
    assert values["memory_used_max"] == pytest.approx(24.0)
    snapshot = json.loads((tmp_path / "prom" / "prometheus" / "cluster_snapshot.json")
                          .read_text())
    assert snapshot["snapshot"] == "20260101T000000Z-0123456789abcdef"
    for path in (tmp_path / "prom").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".yaml", ".log", ".txt"):
            assert "sa-token-xyz" not in path.read_text(errors="replace"), path
