"""Typed view of the fine_tuning config and of one matrix cell's settings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from analysis.settings import AnalysisSettings
from projects.library import ClustersBlock, ExportBlock, PrepareBlock, SecretsBlock

__all__ = [
    "ConfigModel",
    "FineTuningTest",
    "KubernetesWorkloadBlock",
    "LocalModelSpec",
    "MultiUserBlock",
    "TestSettings",
    "TestsBlock",
]


class LocalModelSpec(BaseModel):
    """A tiny causal LM built from a config on the local platform (no weights downloaded)."""

    model_config = ConfigDict(extra="forbid")

    architecture: Literal["llama"] = Field(default="llama", description="Model family.")
    hidden_size: int = Field(default=64, ge=8, description="Hidden width.")
    num_hidden_layers: int = Field(default=2, ge=1, description="Transformer layers.")
    num_attention_heads: int = Field(default=4, ge=1, description="Attention heads.")
    intermediate_size: int = Field(default=128, ge=8, description="MLP width.")
    seed: int = Field(default=42, description="Seed of the random initialisation.")


class TestSettings(BaseModel):
    """Settings of one test cell (after matrix expansion every value is a scalar)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Test name, used in labels.")
    model_name: str = Field(description="Model: a local spec name or a model dir on the PVC.")
    dataset_name: str = Field(description="Dataset file name.")
    dataset_replication: int | list[int] = Field(description="Dataset copies concatenated.")
    gpu: int | list[int] = Field(description="GPUs per pod (0 on the local platform).")
    pod_count: int | list[int] = Field(description="PyTorchJob replicas (master + workers).")
    container_image: str | list[str] = Field(description="Trainer image (cluster).")
    hyper_parameters: dict[str, Any] = Field(description="Trainer config merged into config.json.")
    max_steps: int | list[int] | None = Field(default=None, description="Cap training steps.")


class MultiUserBlock(BaseModel):
    """Multi-user fan-out (the scale_test preset)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="Run N users at once.")
    user_count: int = Field(default=1, ge=1, description="Number of users (N).")
    batch_size: int = Field(default=1, ge=1, description="Users released per stagger step.")
    sleep_factor: float = Field(default=0.0, ge=0, description="Seconds between stagger steps.")
    abort_on_failure: bool = Field(default=False, description="Stop all users on a failure.")
    need_all_success: bool = Field(default=False, description="k < N successes fails the test.")
    deploy_s3: bool = Field(default=False, description="Cluster fan-out: prepare deploys an "
                            "in-cluster S3 server (MinIO) in the test namespace.")
    s3_endpoint: str | None = Field(default=None, description="Cluster fan-out: S3 endpoint as "
                                    "the pods reach it (barrier and per-user artifacts).")
    s3_external_endpoint: str | None = Field(default=None, description="The same S3 as "
                                             "Telltale reaches it (default: s3_endpoint).")
    s3_bucket: str = Field(default="telltale-users", description="Bucket of the fan-out.")
    collect_batch: int = Field(default=50, ge=1, description="Users collected per task.")
    command: list[str] | None = Field(default=None, description="Cluster fan-out: workload "
                                      "argv in each user pod (default: the fms-hf-tuning "
                                      "trainer).")


class KubernetesWorkloadBlock(BaseModel):
    """How the workload runs on a cluster (``tests.fine_tuning.kubernetes``)."""

    model_config = ConfigDict(extra="forbid")

    pvc_name: str = Field(default="fine-tuning-storage", description="Data/model volume.")
    pvc_size: str = Field(default="200Gi", description="Volume size.")
    storage_class: str | None = Field(default=None, description="StorageClass (default: the "
                                                                "cluster's).")
    staging_image: str = Field(default="registry.access.redhat.com/ubi9/python-311:latest",
                               description="Image of the data/model staging job.")
    dataset_url: str | None = Field(default=None, description="Where staging fetches the "
                                                              "dataset (https:// or s3://).")
    model_url: str | None = Field(default=None, description="Where staging fetches the model.")
    image_pull_deadline_minutes: int = Field(default=15, ge=1,
                                             description="Deadline to pull the image.")
    prometheus_url: str | None = Field(default=None, description="Prometheus to snapshot "
                                                                 "(absence is recorded).")


class FineTuningTest(BaseModel):
    """``tests.fine_tuning``: what the test runs and how the matrix is walked."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(description="Cluster namespace of the workload.")
    stop_on_error: bool = Field(default=False, description="A failed cell stops the matrix.")
    timeout_minutes: int = Field(default=60, ge=1, description="Deadline of one cell.")
    skip_if: list[dict[str, Any]] = Field(
        default_factory=list, description="A cell matching every pair of one entry is skipped."
    )
    test_settings: TestSettings
    test_extra_settings: list[dict[str, Any]] = Field(
        default_factory=list, description="Experiment groups merged over test_settings."
    )
    local_models: dict[str, LocalModelSpec] = Field(
        default_factory=dict, description="Tiny models for the local platform."
    )
    multi_user: MultiUserBlock = Field(default_factory=MultiUserBlock)
    kubernetes: KubernetesWorkloadBlock = Field(default_factory=KubernetesWorkloadBlock)


class TestsBlock(BaseModel):
    """``tests``: one entry per test of this project."""

    model_config = ConfigDict(extra="forbid")

    fine_tuning: FineTuningTest


class ConfigModel(BaseModel):
    """The whole fine_tuning config file."""

    model_config = ConfigDict(extra="forbid")

    ci_presets: dict[str, dict[str, Any] | None] = Field(description="Named presets.")
    secrets: SecretsBlock
    clusters: ClustersBlock
    prepare: PrepareBlock
    tests: TestsBlock
    analysis: AnalysisSettings
    export_artifacts: ExportBlock
