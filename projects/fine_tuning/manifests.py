"""Kubernetes manifests of the fine-tuning workload, built from a cell's settings.

Pure functions (no cluster access), so ``--plan`` writes exactly what a run would apply:
a Namespace, the data PVC, a staging Job (skipped at run time when the PVC already carries
the same source label), the ConfigMaps (trainer ``config.json`` and the entrypoint) and a
``kubeflow.org/v1`` PyTorchJob (one Master plus ``pod_count - 1`` Workers).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

from projects.fine_tuning.models import KubernetesWorkloadBlock, TestSettings
from projects.fine_tuning.trainer import trainer_config

__all__ = ["DATA_SOURCE_LABEL", "MOUNT", "cell_manifests", "data_source_id", "job_name"]

MOUNT = "/mnt/storage"
DATA_SOURCE_LABEL = "telltale.io/data-source"

_ENTRYPOINT = """#!/bin/bash
set -o errexit -o pipefail -o nounset
echo "telltale: $(date -u +%FT%TZ) rank ${RANK:-0}/${WORLD_SIZE:-1} on $(hostname)"
export SFT_TRAINER_CONFIG_JSON_PATH=/etc/telltale/config.json
exec python -m tuning.sft_trainer
"""


def _name(text: str, limit: int = 50) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-") or "cell"


def job_name(test_name: str, cell_index: int) -> str:
    """The PyTorchJob name of a cell (a DNS label)."""
    return _name(f"{test_name}-{cell_index:03d}")


def data_source_id(block: KubernetesWorkloadBlock, settings: TestSettings) -> str:
    """A short id of what staging puts in the PVC (its label value)."""
    source = json.dumps([block.dataset_url, block.model_url, settings.dataset_name,
                         settings.model_name])
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def cell_manifests(settings: TestSettings, *, namespace: str, block: KubernetesWorkloadBlock,
                   cell_index: int) -> list[dict[str, Any]]:
    """Every manifest of one cell, in apply order.

    Args:
        settings: The cell's settings.
        namespace: Target namespace (``tests.fine_tuning.namespace``).
        block: ``tests.fine_tuning.kubernetes``.
        cell_index: The cell's index (names).

    Returns:
        Namespace, PVC, staging Job, ConfigMaps, PyTorchJob.
    """
    name = job_name(settings.name, cell_index)
    gpus = int(settings.gpu)  # type: ignore[arg-type]  # a cell's value is a scalar
    replicas = int(settings.pod_count)  # type: ignore[arg-type]
    source = data_source_id(block, settings)
    dataset = f"{MOUNT}/dataset/{settings.dataset_name}"
    model = f"{MOUNT}/model/{_name(settings.model_name, 200)}"
    config = trainer_config(settings, dataset, f"{MOUNT}/output/{name}", model_path=model)
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": block.pvc_name, "namespace": namespace,
                     "labels": {DATA_SOURCE_LABEL: source}},
        "spec": {"accessModes": ["ReadWriteMany" if replicas > 1 else "ReadWriteOnce"],
                 "resources": {"requests": {"storage": block.pvc_size}}},
    }
    if block.storage_class:
        pvc["spec"]["storageClassName"] = block.storage_class
    fetch = [f"mkdir -p {MOUNT}/dataset {MOUNT}/model"]
    for url, target in ((block.dataset_url, dataset), (block.model_url, model)):
        if not url:
            continue
        if url.startswith("s3://"):
            fetch.append("pip install --quiet --user awscli && ~/.local/bin/aws s3 cp "
                         f"--recursive {shlex.quote(url)} {shlex.quote(target)}")
        else:
            fetch.append(f"curl -fsSL --retry 3 -o {shlex.quote(target)} {shlex.quote(url)}")
        fetch.append(f"test -e {shlex.quote(target)}")
    staging = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{name}-staging", "namespace": namespace,
                     "labels": {DATA_SOURCE_LABEL: source}},
        "spec": {"backoffLimit": 2, "activeDeadlineSeconds": 3600, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "staging", "image": block.staging_image,
                            "command": ["bash", "-c", " && ".join(fetch)],
                            "volumeMounts": [{"name": "storage", "mountPath": MOUNT}]}],
            "volumes": [{"name": "storage", "persistentVolumeClaim": {
                "claimName": block.pvc_name}}]}}},
    }
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": f"{name}-config", "namespace": namespace},
                 "data": {"config.json": config.file_text().rstrip("\n"),
                          "entrypoint.sh": _ENTRYPOINT}}

    def replica(count: int) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "pytorch", "image": settings.container_image,
            "command": ["bash", "/etc/telltale/entrypoint.sh"],
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
            "volumeMounts": [{"name": "storage", "mountPath": MOUNT},
                             {"name": "config", "mountPath": "/etc/telltale"}],
        }
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus},
                                      "requests": {"nvidia.com/gpu": gpus}}
        return {"replicas": count, "restartPolicy": "Never", "template": {"spec": {
            "containers": [container],
            "volumes": [{"name": "storage", "persistentVolumeClaim": {
                "claimName": block.pvc_name}},
                {"name": "config", "configMap": {"name": f"{name}-config"}}]}}}

    specs = {"Master": replica(1)}
    if replicas > 1:
        specs["Worker"] = replica(replicas - 1)
    pytorchjob = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                  "metadata": {"name": name, "namespace": namespace},
                  "spec": {"runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"},
                           "pytorchReplicaSpecs": specs}}
    namespace_obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    return [namespace_obj, pvc, staging, configmap, pytorchjob]
