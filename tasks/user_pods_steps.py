"""Prefect steps of the cluster fan-out (see `tasks.user_pods`)."""

from __future__ import annotations

import json
import logging
from typing import Any

from blocks.s3 import S3Target
from projects.fine_tuning.trainer import trainer_config
from tasks.artifacts import artifact_dir, step
from tasks.k8s import Kube, api_client
from tasks.user_pods import (
    UsersJobStatus,
    collect_users,
    deploy_in_cluster_s3,
    follow_users,
    user_job_manifests,
)

__all__ = ["collect_batch", "deploy_s3", "follow", "run_fine_tuning_job"]

logger = logging.getLogger("telltale.users")


@step("prepare", timeout_seconds=300)
def deploy_s3(kubeconfig: str | None, namespace: str, bucket: str) -> str:
    """Deploy the fan-out's in-cluster S3 server; returns its endpoint for the pods."""
    return deploy_in_cluster_s3(Kube(api_client(kubeconfig)), namespace, bucket)


@step("fine_tuning", timeout_seconds=300)
def run_fine_tuning_job(kubeconfig: str | None, run_id: str, namespace: str,
                        settings: dict[str, Any], cell_index: int, multi_user: dict[str, Any],
                        timeout_minutes: int) -> dict[str, Any]:
    """Launch the users' Indexed Job; returns where results will be collected from and to."""
    here = artifact_dir()
    (here / "src").mkdir(exist_ok=True)
    name = f"{str(settings.get('name', 'fine-tuning'))[:40]}-users-{cell_index:03d}"
    config = trainer_config(settings, f"/mnt/storage/dataset/{settings['dataset_name']}",
                            "/tmp/output")
    (here / "src" / "config_final.json").write_text(json.dumps(config, indent=2) + "\n")
    prefix = f"{run_id}/{name}"
    manifests = user_job_manifests(
        name, namespace, users=int(multi_user["user_count"]),
        image=settings["container_image"], config=config,
        command=list(multi_user.get("command") or
                     ["python3", "-m", "tuning.sft_trainer"]),
        batch_size=int(multi_user["batch_size"]), sleep_factor=float(multi_user["sleep_factor"]),
        deadline_s=timeout_minutes * 60, s3_endpoint=str(multi_user["s3_endpoint"]),
        bucket=multi_user["s3_bucket"], prefix=prefix, gpus=int(settings.get("gpu") or 0))
    (here / "manifests.json").write_text(json.dumps(manifests, indent=1))
    kube = Kube(api_client(kubeconfig), run_id)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for manifest in manifests:
        kube.apply(manifest)
    return {"job": name, "dir": str(here),
            "url": f"s3://{multi_user['s3_bucket']}/{prefix}"}


@step("fine_tuning", timeout_seconds=None)
def follow(kubeconfig: str | None, namespace: str, job: str, users: int, deadline_s: float,
           abort_on_failure: bool) -> UsersJobStatus:
    """Follow the users to the end, with a progress artifact of their counts."""
    try:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        artifact = create_progress_artifact(progress=0.0, description=f"{users} users pending")
    except Exception:  # outside a flow run
        artifact, update_progress_artifact = None, None

    def progress(status: UsersJobStatus) -> None:
        if artifact is not None and update_progress_artifact is not None:
            update_progress_artifact(
                artifact_id=artifact,
                progress=round(100 * (status.succeeded + status.failed) / users, 1),
                description=f"pending: {status.pending}, running: {status.running}, "
                            f"succeeded: {status.succeeded}, failed: {status.failed}")

    return follow_users(Kube(api_client(kubeconfig)), job, namespace, users,
                        deadline_s=deadline_s, abort_on_failure=abort_on_failure,
                        progress=progress)


@step("users", retries=2, retry_delay_seconds=[5, 20], timeout_seconds=1800)
def collect_batch(indices: list[int], url: str, dest: str, target: S3Target) -> list[int]:
    """Download one batch of users' results (mapped over batches by the flow)."""
    return collect_users(indices, url, dest, target)
