"""Kubernetes manifests of an llm_serving cell: KServe's vLLM runtime, the model, the load.

Pure functions (no cluster access), so ``--preset gpu --plan`` writes exactly what a run
applies: a Namespace, a ``serving.kserve.io/v1alpha1`` ServingRuntime running vLLM's OpenAI
server, a ``serving.kserve.io/v1beta1`` InferenceService (RawDeployment: a plain Service the
load reaches in-cluster), a ConfigMap with the load step's config and script, and the load
Job (one pod, no retry; GuideLLM's image). The engine applies the load once the
InferenceService is Ready (a gate); the pod still polls the model's ``/health`` briefly (a
Service's endpoints can lag its Ready condition).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["LOAD_SCRIPT", "cell_manifests", "object_name"]

JOB_NAME_LABEL = "job-name"
"""The label the Job controller puts on its pods (with ``batch.kubernetes.io/job-name``)."""

LOAD_SCRIPT = Path(__file__).resolve().parent / "workload" / "load.py"
_MOUNT = "/etc/telltale-load"


def object_name(test_name: str, cell_index: int) -> str:
    """The cell's object name (a DNS label of at most 45 characters: room for suffixes)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", f"{test_name}-{cell_index:03d}".lower()).strip("-")
    return slug[:45].rstrip("-") or "cell"


def cell_manifests(settings: dict[str, Any], *, namespace: str, block: dict[str, Any],
                   cell_index: int, ready_timeout_s: int,
                   invalid_on_warnings: list[str] | None = None) -> dict[str, Any]:
    """Every manifest of one cell, by role.

    Args:
        settings: The cell's settings (validated).
        namespace: ``tests.llm_serving.namespace``.
        block: ``tests.llm_serving.kubernetes`` (models, memory, cpu).
        cell_index: The cell's index (names).
        ready_timeout_s: How long the load Pod waits for the model to answer.
        invalid_on_warnings: GuideLLM warning codes that make the measurement invalid.

    Returns:
        ``namespace``, ``runtime``, ``isvc``, ``configmap``, ``job``, the ``load_config``
        and the ``tokenizer`` parts (init container, volume, mount) a fan-out's users reuse.
    """
    name = object_name(str(settings.get("name", "llm-serving")), cell_index)
    model = block["models"][settings["model_name"]]
    gpus = int(settings.get("gpu") or 0)
    resources: dict[str, Any] = {
        "requests": {"cpu": block["cpu"], "memory": block["memory"]},
        "limits": {"memory": block["memory"]}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = gpus
        resources["limits"]["nvidia.com/gpu"] = gpus
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
        "metadata": {"name": f"{name}-vllm", "namespace": namespace,
                     "annotations": {"opendatahub.io/recommended-accelerators":
                                     '["nvidia.com/gpu"]'}},
        "spec": {
            "multiModel": False,
            "supportedModelFormats": [{"name": "vLLM", "autoSelect": True}],
            "containers": [{
                "name": "kserve-container", "image": settings["runtime_image"],
                "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
                "args": ["--port=8080", "--model=/mnt/models",
                         f"--served-model-name={model['served_name']}",
                         f"--max-model-len={int(settings['max_model_len'])}"],
                "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]},
    }
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}},
        "spec": {"predictor": {
            "minReplicas": 1, "maxReplicas": 1,
            "model": {"modelFormat": {"name": "vLLM"}, "runtime": f"{name}-vllm",
                      "storageUri": model["storage_uri"], "resources": resources}}},
    }
    load_config = {
        "guidellm": ["guidellm"],
        "target": f"http://{name}-predictor.{namespace}.svc.cluster.local:8080",
        "model": model["served_name"], "tokenizer": "/mnt/models",
        "concurrency": int(settings["concurrency"]),
        "prompt_tokens": int(settings["prompt_tokens"]),
        "output_tokens": int(settings["output_tokens"]),
        "duration_s": int(settings["duration_s"]),
        "warmup_s": int(settings.get("warmup_s") or 0),
        "request_format": settings["request_format"],
        "wait_ready_s": min(ready_timeout_s, 300),
        "invalid_on_warnings": list(invalid_on_warnings or ["generation_delay_ttft"]),
    }
    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{name}-load", "namespace": namespace},
        "data": {"config.json": json.dumps(load_config, indent=2),
                 "load.py": LOAD_SCRIPT.read_text(encoding="utf-8")},
    }
    # the tokenizer ships with the model: the same storage initializer fetches it (for the
    # load Job and for every user of a fan-out)
    tokenizer = {
        "init": {"name": "storage-initializer", "image": "quay.io/opendatahub/kserve-storage-"
                 "initializer:latest", "args": [model["storage_uri"], "/mnt/models"],
                 "volumeMounts": [{"name": "model", "mountPath": "/mnt/models"}]},
        "volume": {"name": "model", "emptyDir": {}},
        "mount": {"name": "model", "mountPath": "/mnt/models"}}
    template = {
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [tokenizer["init"]],
            "containers": [{
                "name": "load", "image": settings["loadgen_image"],
                "command": ["python3", f"{_MOUNT}/load.py", f"{_MOUNT}/config.json",
                            "--out", "/tmp/result"],
                "volumeMounts": [{"name": "load", "mountPath": _MOUNT}, tokenizer["mount"]]}],
            "volumes": [{"name": "load", "configMap": {"name": f"{name}-load"}},
                        tokenizer["volume"]]}}
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{name}-load", "namespace": namespace},
        # one try: a re-run load would measure a different window
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400, "template": template},
    }
    return {"namespace": {"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": namespace}},
            "runtime": runtime, "isvc": isvc, "configmap": configmap, "job": job,
            "load_config": load_config, "tokenizer": tokenizer}
