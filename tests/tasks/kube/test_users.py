"""Cluster fan-out: Indexed Job on the API test server; each pod runs the real user program
against a real S3 server (moto), so barrier, stagger and uploads happen for real."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from blocks.s3 import S3Target
from tasks.kube.api import Kube, api_client
from tasks.kube.users import collect_users, follow_users, user_job_manifests
from tests.servers.fake_operators import IndexedJobController
from tests.servers.kubernetes import kube_server, write_kubeconfig

USERS = 6


@pytest.fixture()
def cluster(tmp_path: Path):
    with kube_server() as (url, state):
        mount = tmp_path / "mount"
        mount.mkdir()
        controller = IndexedJobController(state, str(mount))
        controller.start()
        yield Kube(api_client(write_kubeconfig(tmp_path / "kc", url)), run_id="r"), state
        controller.stop()


def launch(kube: Kube, s3_server: str, bucket: str, command: list[str], **kwargs) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scale"}})
    for manifest in user_job_manifests(
            "users", "scale", users=USERS, image="quay.io/modh/fms-hf-tuning:v2.2.1",
            command=command, config={"k": 1}, batch_size=2, sleep_factor=0.3,
            deadline_s=120, s3_endpoint=s3_server, bucket=bucket, prefix="runs/r1",
            **kwargs):
        kube.apply(manifest)


def test_indexed_job_barrier_stagger_and_collection(tmp_path: Path, cluster, s3_server: str,
                                                    s3_bucket: str) -> None:
    kube, state = cluster
    job = user_job_manifests("users", "scale", users=USERS, image="img", command=["true"],
                             config={}, batch_size=2, sleep_factor=0.3, deadline_s=60,
                             s3_endpoint=s3_server, bucket=s3_bucket, prefix="p")[1]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == USERS
    assert job["spec"]["backoffLimit"] == 0
    launch(kube, s3_server, s3_bucket,
           [sys.executable, "-c", "import os; print('user', os.environ['JOB_COMPLETION_INDEX'])"])
    seen = []
    status = follow_users(kube, "users", "scale", USERS, deadline_s=600, progress=seen.append)
    assert (status.succeeded, status.failed) == (USERS, 0)
    assert seen[-1].succeeded == USERS and seen[0].pending + seen[0].running > 0
    target = S3Target(bucket=s3_bucket, endpoint_url=s3_server, region="us-east-1")
    found = collect_users([0, 1, 2], f"s3://{s3_bucket}/runs/r1", str(tmp_path / "out"), target)
    found += collect_users([3, 4, 5], f"s3://{s3_bucket}/runs/r1", str(tmp_path / "out"), target)
    assert found == list(range(USERS))
    timings = [json.loads((tmp_path / "out" / "users" / f"user-{i:03d}" / "timings.json")
                          .read_text()) for i in range(USERS)]
    last_ready = max(t["ready_at"] for t in timings)
    assert all(t["started_at"] >= last_ready for t in timings)  # the barrier held
    assert [t["stagger_s"] for t in timings] == [0.0, 0.0, 0.3, 0.3, 0.6, 0.6]
    assert (tmp_path / "out" / "users" / "user-004" / "pod.log").read_text() == "user 4\n"


def test_abort_on_failure_deletes_the_job(cluster, s3_server: str, s3_bucket: str) -> None:
    kube, state = cluster
    launch(kube, s3_server, s3_bucket, [sys.executable, "-c",
           "import os, sys, time; i = int(os.environ['JOB_COMPLETION_INDEX']);"
           "time.sleep(0 if i == 0 else 3); sys.exit(7 if i == 0 else 0)"])
    status = follow_users(kube, "users", "scale", USERS, deadline_s=600, abort_on_failure=True)
    assert status.aborted and status.failed >= 1
    assert state.get("batch/v1", "Job", "users", "scale") is None


def test_in_cluster_s3_deploys_idempotently_with_a_secret(cluster) -> None:
    import kubernetes_validate

    from tasks.kube.users import deploy_in_cluster_s3, in_cluster_s3_manifests

    kube, state = cluster
    endpoint = deploy_in_cluster_s3(kube, "scale", "telltale-users")
    assert endpoint == "http://telltale-s3.scale.svc:9000"
    secret = state.get("v1", "Secret", "telltale-s3", "scale")
    password = secret["stringData"]["MINIO_ROOT_PASSWORD"]
    deploy_in_cluster_s3(kube, "scale", "telltale-users")
    assert state.get("v1", "Secret", "telltale-s3", "scale")["stringData"][
        "MINIO_ROOT_PASSWORD"] == password  # not rotated under a running server
    assert state.get("apps/v1", "Deployment", "telltale-s3", "scale")
    for manifest in in_cluster_s3_manifests("scale", "b"):
        kubernetes_validate.validate(manifest, "1.30", strict=True)
    for manifest in user_job_manifests("u", "scale", users=3, image="i", command=["true"],
                                       config={}, batch_size=1, sleep_factor=0, deadline_s=60,
                                       s3_endpoint="http://s3:9000", bucket="b", prefix="p"):
        kubernetes_validate.validate(manifest, "1.30", strict=True)


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(bucket=st.text(min_size=1, max_size=40))
def test_no_value_reaches_the_in_cluster_s3_jobs_shell_text(bucket: str) -> None:
    from tasks.kube.users import in_cluster_s3_manifests

    def job_container(name: str) -> dict:
        job = next(m for m in in_cluster_s3_manifests("ns", name) if m["kind"] == "Job")
        return job["spec"]["template"]["spec"]["containers"][0]

    container = job_container(bucket)
    # the script is the same text whatever the bucket: the value travels as BUCKET
    assert container["command"] == job_container("plain-bucket")["command"]
    assert {"name": "BUCKET", "value": bucket} in container["env"]
