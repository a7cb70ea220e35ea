"""Typed view of the fine_tuning config and of one matrix cell's settings."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)

from projects.library import EngineConfig, TestBlock
from projects.library.tiny_lm import LocalModelSpec

__all__ = [
    "ConfigModel",
    "FineTuningTest",
    "HyperParameters",
    "KubernetesWorkloadBlock",
    "LocalModelSpec",
    "TestSettings",
    "TestsBlock",
]


Ratio = Annotated[float, Field(ge=0, le=1)]


class HyperParameters(BaseModel):
    """Trainer hyper-parameters: the known ones checked at input, others passed through.

    Each may be a list (a matrix dimension). A typo'd value (``r: sixteen``,
    ``learning_rate: fast``) is refused before anything runs, not by the trainer later.
    """

    model_config = ConfigDict(extra="allow")

    raw_lists: list[str] = Field(default_factory=list,
                                 description="Keys whose lists are values, not dimensions.")
    num_train_epochs: PositiveFloat | list[PositiveFloat] | None = Field(
        default=None, description="Epochs over the dataset.")
    per_device_train_batch_size: PositiveInt | list[PositiveInt] | None = Field(
        default=None, description="Samples per device and step.")
    gradient_accumulation_steps: PositiveInt | list[PositiveInt] | None = Field(
        default=None, description="Steps accumulated per optimiser step.")
    learning_rate: PositiveFloat | list[PositiveFloat] | None = Field(
        default=None, description="Peak learning rate.")
    max_seq_length: PositiveInt | list[PositiveInt] | None = Field(
        default=None, description="Tokens per sample (longer ones are cut).")
    peft_method: str | list[str] | None = Field(default=None,
                                                description="lora, or none for full tuning.")
    r: PositiveInt | list[PositiveInt] | None = Field(default=None, description="LoRA rank.")
    lora_alpha: PositiveInt | list[PositiveInt] | None = Field(default=None,
                                                               description="LoRA alpha.")
    lora_dropout: Ratio | list[Ratio] | None = Field(default=None, description="LoRA dropout.")


class TestSettings(BaseModel):
    """Settings of one test cell (after matrix expansion every value is a scalar)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Test name, used in labels.")
    model_name: str = Field(description="Model: a local spec name or a model dir on the PVC.")
    dataset_name: str = Field(description="Dataset file name.")
    dataset_replication: PositiveInt | list[PositiveInt] = Field(
        description="Dataset copies concatenated.")
    gpu: NonNegativeInt | list[NonNegativeInt] = Field(
        description="GPUs per pod (0 on the local platform).")
    pod_count: PositiveInt | list[PositiveInt] = Field(
        description="PyTorchJob replicas (master + workers).")
    container_image: str | list[str] = Field(description="Trainer image (cluster).")
    hyper_parameters: HyperParameters = Field(
        description="Trainer config merged into config.json.")
    max_steps: PositiveInt | list[PositiveInt] | None = Field(
        default=None, description="Cap training steps.")


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


class FineTuningTest(TestBlock):
    """``tests.fine_tuning``: the shared test block with this project's settings."""

    namespace: str = Field(default="fine-tuning-testing",
                           description="Cluster namespace of the workload.")
    test_settings: TestSettings
    local_models: dict[str, LocalModelSpec] = Field(
        default_factory=dict, description="Tiny models for the local platform."
    )
    kubernetes: KubernetesWorkloadBlock = Field(default_factory=KubernetesWorkloadBlock)


class TestsBlock(BaseModel):
    """``tests``: one entry per test of this project."""

    model_config = ConfigDict(extra="forbid")

    fine_tuning: FineTuningTest


class ConfigModel(EngineConfig):
    """The whole fine_tuning config file."""

    tests: TestsBlock
