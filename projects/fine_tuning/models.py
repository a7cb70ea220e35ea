"""Typed view of the fine_tuning config and of one matrix cell's settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from core.strict import DnsLabel, DnsSubdomain, ImageRef, Name, Quantity, StrictSettings, Text
from projects.library import TestBlock
from projects.library.cost import CostBlock
from projects.library.tiny_lm import LocalModelSpec

__all__ = [
    "Batch",
    "Epochs",
    "FineTuningTest",
    "HyperParameters",
    "KubernetesWorkloadBlock",
    "LearningRate",
    "LocalModelSpec",
    "Modules",
    "PeftMethod",
    "Rank",
    "Ratio",
    "Replication",
    "SeqLength",
    "Steps",
    "TestSettings",
]


Ratio = Annotated[float, Field(ge=0, le=1)]
Epochs = Annotated[float, Field(gt=0, le=1000)]
Batch = Annotated[int, Field(ge=1, le=65_536)]
Steps = Annotated[int, Field(ge=1, le=10_000_000)]
LearningRate = Annotated[float, Field(gt=0, le=10)]
SeqLength = Annotated[int, Field(ge=8, le=1_048_576)]
Rank = Annotated[int, Field(ge=1, le=4096)]
Gpus = Annotated[int, Field(ge=0, le=64)]
Replicas = Annotated[int, Field(ge=1, le=1024)]
Replication = Annotated[int, Field(ge=1, le=10_000)]
PeftMethod = Literal["lora", "pt", "none"]
Modules = Annotated[list[Name], Field(max_length=64)]
# Each bound above is written once: the config model below and the trainer's file model
# (`projects.fine_tuning.trainer.TrainerConfig`) both use these types.


class HyperParameters(StrictSettings):
    """Trainer hyper-parameters: only these reach the trainer, each checked at input.

    Each may be a list (a matrix dimension). A typo'd value (``r: sixteen``,
    ``learning_rate: fast``, ``.inf``) or an undeclared key (``output_dir``,
    ``training_data_path``: the engine sets where the trainer reads and writes) is refused
    before anything runs, never forwarded to the trainer.
    """

    raw_lists: list[Literal["target_modules"]] = Field(
        default_factory=lambda: ["target_modules"],
        description="Keys whose lists are values, not dimensions.")
    num_train_epochs: Epochs | list[Epochs] = Field(
        default=1, description="Epochs over the dataset.")
    per_device_train_batch_size: Batch | list[Batch] = Field(
        default=4, description="Samples per device and step.")
    gradient_accumulation_steps: Batch | list[Batch] = Field(
        default=1, description="Steps accumulated per optimiser step.")
    learning_rate: LearningRate | list[LearningRate] = Field(
        default=0.0003, description="Peak learning rate.")
    max_seq_length: SeqLength | list[SeqLength] = Field(
        default=256, description="Tokens per sample (longer ones are cut).")
    peft_method: PeftMethod | list[PeftMethod] = Field(
        default="lora", description="lora, pt (prompt tuning, cluster image only), or none "
        "for full tuning.")
    r: Rank | list[Rank] = Field(default=8, description="LoRA rank.")
    lora_alpha: Rank | list[Rank] = Field(default=16, description="LoRA alpha.")
    lora_dropout: Ratio | list[Ratio] = Field(default=0.05, description="LoRA dropout.")
    target_modules: Modules = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="Modules LoRA adapts (a value, not a dimension: listed in raw_lists).")
    warmup_ratio: Ratio | list[Ratio] | None = Field(
        default=None, description="Share of the steps spent warming the learning rate up.")
    weight_decay: Ratio | list[Ratio] | None = Field(default=None,
                                                     description="Weight decay.")


class TestSettings(StrictSettings):
    """Settings of one test cell (after matrix expansion every value is a scalar)."""

    name: Text = Field(default="fine-tuning", description="Test name, used in labels.")
    model_name: Name = Field(default="tiny-llama", description="Model: a local spec name or "
                             "a model dir on the PVC.")
    dataset_name: Name = Field(default="alpaca_mini.jsonl", description="Dataset file name "
                               "(inside the project's data dir locally, the PVC's dataset "
                               "dir on a cluster).")
    dataset_replication: Replication | list[Replication] = Field(
        default=1, description="Dataset copies concatenated.")
    gpu: Gpus | list[Gpus] = Field(default=0, description="GPUs per pod (local platform: 0 "
                                   "trains on the CPU, N on the first N CUDA devices).")
    pod_count: Replicas | list[Replicas] = Field(
        default=1, description="PyTorchJob replicas (master + workers).")
    container_image: ImageRef | list[ImageRef] = Field(
        default="quay.io/modh/fms-hf-tuning:v2.2.1", description="Trainer image (cluster).")
    hyper_parameters: HyperParameters = Field(
        default_factory=HyperParameters, description="Trainer config merged into config.json.")
    max_steps: Steps | list[Steps] | None = Field(
        default=None, description="Cap training steps.")
    cost: CostBlock = Field(default_factory=CostBlock, description="Declared prices: the "
                            "cost_per_million_tokens KPI (none declared: no cost KPI).")


class KubernetesWorkloadBlock(StrictSettings):
    """How the workload runs on a cluster (``tests.fine_tuning.kubernetes``)."""

    pvc_name: DnsSubdomain = Field(default="fine-tuning-storage",
                                   description="Data/model volume.")
    pvc_size: Quantity = Field(default="200Gi", description="Volume size.")
    storage_class: DnsSubdomain | None = Field(default=None, description="StorageClass "
                                               "(default: the cluster's).")
    staging_image: ImageRef = Field(default="registry.access.redhat.com/ubi9/python-311:latest",
                               description="Image of the data/model staging job.")
    dataset_url: str | None = Field(default=None, description="Where staging fetches the "
                                                              "dataset (https:// or s3://).")
    model_url: str | None = Field(default=None, description="Where staging fetches the model.")
    image_pull_deadline_minutes: int = Field(default=15, ge=1, le=24 * 60,
                                             description="Deadline to pull the image.")


class FineTuningTest(TestBlock):
    """``tests.fine_tuning``: the shared test block with this project's settings."""

    namespace: DnsLabel = Field(default="fine-tuning-testing",
                           description="Cluster namespace of the workload.")
    test_settings: TestSettings = Field(default_factory=TestSettings)
    local_models: dict[str, LocalModelSpec] = Field(
        default_factory=dict, description="Tiny models for the local platform."
    )
    kubernetes: KubernetesWorkloadBlock = Field(default_factory=KubernetesWorkloadBlock)
