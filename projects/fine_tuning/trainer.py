"""The trainer's ``config.json``: one typed model, written by the engine, read by the trainers.

One builder for both platforms: the local workload reads it from ``src/config_final.json``
(`TrainerConfig.model_validate_json`: the same model, its defaults declared once, here), the
cluster image from the ConfigMap mounted in the PyTorchJob. The file holds only what was set
(the cell's hyper-parameters and the engine's paths), so the cluster image applies its own
defaults for the rest, as it always did; the defaults below are the local trainer's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from core.strict import StrictSettings
from projects.library.tiny_lm import LocalModelSpec

__all__ = ["TrainerConfig", "trainer_config"]


class TrainerConfig(StrictSettings):
    """``config.json`` of one cell (fms-hf-tuning's keys; ``telltale_*`` for the local one)."""

    model_name_or_path: str = Field(description="Model name or dir.")
    training_data_path: str = Field(description="Dataset file as the trainer sees it.")
    output_dir: str = Field(description="Where the trainer writes.")
    dataset_replication: int = Field(default=1, ge=1, le=10_000)
    logging_steps: int = Field(default=10, ge=1, le=1_000_000)
    max_steps: int | None = Field(default=None, ge=1, le=10_000_000)
    include_tokens_per_second: bool = True
    num_train_epochs: float = Field(default=1.0, gt=0, le=1000)
    per_device_train_batch_size: int = Field(default=4, ge=1, le=65_536)
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=65_536)
    learning_rate: float = Field(default=3e-4, gt=0, le=10)
    max_seq_length: int = Field(default=256, ge=8, le=1_048_576)
    peft_method: Literal["lora", "pt", "none"] | None = None
    r: int = Field(default=8, ge=1, le=4096)
    lora_alpha: int = Field(default=16, ge=1, le=4096)
    lora_dropout: float = Field(default=0.0, ge=0, le=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"],
                                      max_length=64)
    warmup_ratio: float = Field(default=0.0, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    telltale_local_model: LocalModelSpec | None = Field(
        default=None, description="The tiny model of the local platform.")
    telltale_gpus: int = Field(
        default=0, ge=0, le=64, description="Accelerators the local trainer uses (the cell's "
        "gpu: 0 is the CPU; N needs N devices torch sees, a clear error otherwise).")
    telltale_torch_threads: int | None = Field(
        default=None, ge=1, le=1024, description="CPU threads of the local trainer "
        "(default: every core).")


def trainer_config(settings: dict[str, Any], data_file: str, output_dir: str, *,
                   model_path: str | None = None, local_model: dict[str, Any] | None = None,
                   logging_steps: int = 10) -> dict[str, Any]:
    """Build the trainer config of one cell (as written to ``config.json``).

    Args:
        settings: The cell's settings (model, dataset, hyper-parameters...).
        data_file: Training data path as the trainer sees it.
        output_dir: Where the trainer writes.
        model_path: Model path as the trainer sees it (default: the model name).
        local_model: The tiny model spec (local platform only).
        logging_steps: Trainer logging period.

    Returns:
        The ``config.json`` mapping: the keys set, validated by `TrainerConfig` (the
        engine's paths always win over a hyper-parameter of the same name).
    """
    # None: not set, the trainer's own default applies
    hyper = {k: v for k, v in (settings.get("hyper_parameters") or {}).items()
             if k != "raw_lists" and v is not None}
    values: dict[str, Any] = {
        **hyper,
        "model_name_or_path": model_path or settings["model_name"],
        "training_data_path": data_file,
        "output_dir": output_dir,
        "dataset_replication": settings.get("dataset_replication") or 1,
        "logging_steps": logging_steps,
        "max_steps": settings.get("max_steps"),
        "include_tokens_per_second": True,
    }
    if local_model is not None:
        values["telltale_local_model"] = local_model
        if settings.get("gpu"):
            values["telltale_gpus"] = settings["gpu"]
    return TrainerConfig.model_validate(values).model_dump(mode="json", exclude_unset=True)
