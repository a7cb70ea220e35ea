"""The trainer's ``config.json``: base config merged with the cell's hyper-parameters.

One builder for both platforms: the local workload reads it from ``src/config_final.json``,
the cluster image from the ConfigMap mounted in the PyTorchJob.
"""

from __future__ import annotations

from typing import Any

__all__ = ["trainer_config"]


def trainer_config(settings: dict[str, Any], data_file: str, output_dir: str, *,
                   model_path: str | None = None, local_model: dict[str, Any] | None = None,
                   logging_steps: int = 10) -> dict[str, Any]:
    """Build the trainer config of one cell.

    Args:
        settings: The cell's settings (model, dataset, hyper-parameters...).
        data_file: Training data path as the trainer sees it.
        output_dir: Where the trainer writes.
        model_path: Model path as the trainer sees it (default: the model name).
        local_model: The tiny model spec (local platform only).
        logging_steps: Trainer logging period.

    Returns:
        The ``config.json`` mapping (the engine's paths always win).
    """
    hyper = {k: v for k, v in (settings.get("hyper_parameters") or {}).items()
             if k != "raw_lists"}
    # The hyper-parameters come first: where the trainer reads and writes is the engine's
    # to say, and a key of the same name (the model refuses them anyway) never wins.
    config: dict[str, Any] = {
        **hyper,
        "model_name_or_path": model_path or settings["model_name"],
        "training_data_path": data_file,
        "output_dir": output_dir,
        "dataset_replication": settings.get("dataset_replication", 1),
        "logging_steps": logging_steps,
        "max_steps": settings.get("max_steps"),
        "include_tokens_per_second": True,
    }
    if local_model is not None:
        config["telltale_local_model"] = local_model
    return config
