"""Generated manifests validate: built-in kinds against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict), custom kinds against their real upstream CRDs
(`tests.upstream_schemas`, read from ../shared/crds)."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest

from projects.config import resolve
from projects.fine_tuning.manifests import cell_manifests
from projects.fine_tuning.models import TestSettings as FineTuningSettings
from projects.library import GpuOperatorBlock
from projects.plan import cells_of
from tasks.kube.olm import (
    GPU_OPERATOR,
    NFD,
    RHOAI,
    SERVICE_MESH,
    cluster_policy,
    operator_manifests,
)
from tests.upstream_schemas import validate


def all_manifests() -> list[dict]:
    out = []
    for presets in (["gpu"], ["gating"], ["light"]):
        config = resolve("fine_tuning", presets, overrides={
            "tests.fine_tuning.test_settings.pod_count": 2,
            "tests.fine_tuning.kubernetes.dataset_url": "https://example.com/data.json",
            "tests.fine_tuning.kubernetes.model_url": "s3://models/granite",
            "tests.fine_tuning.kubernetes.storage_class": "nfs"}, env={})
        for cell in cells_of(config, "fine_tuning"):
            out += cell_manifests(cell.typed_as(FineTuningSettings), namespace="ft",
                                  cell_index=cell.index,
                                  block=config.model.tests.fine_tuning.kubernetes)
    for spec in (SERVICE_MESH, RHOAI.model_copy(update={"version": "rhods-operator.2.13.0",
                                                        "catalog_image": "quay.io/x/y:1"}),
                 NFD, GPU_OPERATOR):
        out += operator_manifests(spec)
    out += cluster_policy(GpuOperatorBlock.model_validate({
        "time_sharing_replicas": 4, "extended_dcgm_metrics": True,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                         "effect": "NoSchedule"}]}))
    return out


@pytest.mark.parametrize("manifest", all_manifests(),
                         ids=lambda m: f"{m['kind']}-{m['metadata']['name']}")
def test_manifest_is_valid(manifest: dict) -> None:
    validate(manifest)


def test_validation_catches_mistakes() -> None:
    job = next(m for m in all_manifests() if m["kind"] == "PyTorchJob")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replica"] = 1  # replicas, misspelt
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        validate(job)
    pvc = next(m for m in all_manifests() if m["kind"] == "PersistentVolumeClaim")
    pvc["spec"]["acessModes"] = pvc["spec"].pop("accessModes")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pvc)
