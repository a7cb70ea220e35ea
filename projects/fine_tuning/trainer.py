"""The trainer's ``config.json``: one typed model, written by the engine, read by the trainers.

One builder for both platforms, from the cell's typed settings: the local workload reads it
from ``src/config_final.json`` (`TrainerConfig.model_validate_json`: the same model), the
cluster image from the ConfigMap mounted in the PyTorchJob. The file holds only what was set
(the cell's hyper-parameters and the engine's paths), so the cluster image applies its own
defaults for what the config leaves unset (``None``), as it always did.

A LoRA ``r`` from ``--var`` to the trainer's file changes form four times: text → a YAML
value (`projects.config.parse_override`) → the config (`projects.config.resolve`: its tree,
validated by the model) → the cell's typed settings (the plan expands the matrix and
validates each cell once: `projects.matrix.Cell.typed_as`) → the trainer's file
(`TrainerConfig`, written as its JSON). Its default and bounds are written once, in
`projects.fine_tuning.models`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from core.strict import StrictSettings
from projects.fine_tuning.models import (
    Batch,
    Epochs,
    LearningRate,
    Modules,
    PeftMethod,
    Rank,
    Ratio,
    Replication,
    SeqLength,
    Steps,
    TestSettings,
)
from projects.library.tiny_lm import LocalModelSpec

__all__ = ["TrainerConfig", "trainer_config"]


class TrainerConfig(StrictSettings):
    """``config.json`` of one cell (fms-hf-tuning's keys; ``telltale_*`` for the local one).

    The hyper-parameters' types and bounds are the config model's (`projects.fine_tuning
    .models`) and their defaults too: the config always sets them, so none is repeated
    here. Only what the config leaves to the trainer (``None``: warm-up, weight decay) has
    its default here, the local trainer's.
    """

    model_name_or_path: str = Field(description="Model name or dir.")
    training_data_path: str = Field(description="Dataset file as the trainer sees it.")
    output_dir: str = Field(description="Where the trainer writes.")
    dataset_replication: Replication
    logging_steps: int = Field(default=10, ge=1, le=1_000_000)
    max_steps: Steps | None = None
    include_tokens_per_second: bool = True
    num_train_epochs: Epochs
    per_device_train_batch_size: Batch
    gradient_accumulation_steps: Batch
    learning_rate: LearningRate
    max_seq_length: SeqLength
    peft_method: PeftMethod
    r: Rank
    lora_alpha: Rank
    lora_dropout: Ratio
    target_modules: Modules
    warmup_ratio: Ratio = 0.0
    weight_decay: Ratio = 0.0
    telltale_local_model: LocalModelSpec | None = Field(
        default=None, description="The tiny model of the local platform.")
    telltale_gpus: int = Field(
        default=0, ge=0, le=64, description="Accelerators the local trainer uses (the cell's "
        "gpu: 0 is the CPU; N needs N devices torch sees, a clear error otherwise).")
    telltale_torch_threads: int | None = Field(
        default=None, ge=1, le=1024, description="CPU threads of the local trainer "
        "(default: every core).")

    def file_text(self) -> str:
        """The file the trainer reads: what was set, nothing the model filled in."""
        return self.model_dump_json(indent=2, exclude_unset=True) + "\n"


def trainer_config(settings: TestSettings, data_file: str, output_dir: str, *,
                   model_path: str | None = None, local_model: LocalModelSpec | None = None,
                   logging_steps: int = 10) -> TrainerConfig:
    """Build the trainer config of one cell from its typed settings.

    Args:
        settings: The cell's settings, as the plan validated them (`Cell.typed_as`).
        data_file: Training data path as the trainer sees it.
        output_dir: Where the trainer writes.
        model_path: Model path as the trainer sees it (default: the model name).
        local_model: The tiny model spec (local platform only).
        logging_steps: Trainer logging period.

    Returns:
        The trainer's config: the hyper-parameters set (``None`` ones left to the trainer)
        and the engine's paths, which always win over a hyper-parameter of the same name.
    """
    hyper = settings.hyper_parameters.model_dump(exclude={"raw_lists"}, exclude_none=True)
    values: dict[str, Any] = {
        **hyper,
        "model_name_or_path": model_path or settings.model_name,
        "training_data_path": data_file,
        "output_dir": output_dir,
        "dataset_replication": settings.dataset_replication,
        "logging_steps": logging_steps,
        "max_steps": settings.max_steps,
        "include_tokens_per_second": True,
    }
    if local_model is not None:
        values["telltale_local_model"] = local_model
        if settings.gpu:
            values["telltale_gpus"] = settings.gpu
    return TrainerConfig.model_validate(values)
