"""The local trainer's accelerator path without an accelerator: a cell asking for GPUs is
refused before anything runs (NVML: the stand-in's two boards, or none), and the trainer
itself refuses when torch sees fewer CUDA devices than asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.errors import ConfigError
from projects.fine_tuning.project import _check_gpus
from projects.fine_tuning.trainer import TrainerConfig, trainer_config
from tests.servers.nvml import build_nvml_standin

REPO = Path(__file__).resolve().parents[2]


def test_the_cells_gpu_reaches_the_trainer_config() -> None:
    from projects.fine_tuning.models import TestSettings
    from projects.library.tiny_lm import LocalModelSpec

    settings = TestSettings(gpu=2)
    spec = LocalModelSpec(hidden_size=64)
    config = trainer_config(settings, "data.jsonl", "out", local_model=spec)
    assert TrainerConfig.model_validate_json(config.file_text()).telltale_gpus == 2
    # a cluster's config.json carries no local key
    assert "telltale_gpus" not in trainer_config(settings, "data.jsonl", "out").file_text()
    cpu = trainer_config(TestSettings(gpu=0), "d", "o", local_model=spec)
    assert TrainerConfig.model_validate_json(cpu.file_text()).telltale_gpus == 0


def test_the_trainer_file_holds_what_the_config_set_with_the_models_bounds() -> None:
    """One default per hyper-parameter (the config model's) and one set of bounds."""

    from projects.config import resolve
    from projects.plan import cells_of

    config = resolve("fine_tuning", ["light"], overrides={
        "tests.fine_tuning.test_settings.hyper_parameters.r": 16}, env={})
    cell = cells_of(config, "fine_tuning")[0]
    from projects.fine_tuning.models import TestSettings

    text = trainer_config(cell.typed_as(TestSettings), "d", "o").file_text()
    data = json.loads(text)
    assert data["r"] == 16 and data["lora_alpha"] == 16 and "warmup_ratio" not in data
    # the bounds are the config model's types, not a copy: the trainer module names none
    import projects.fine_tuning.trainer as trainer

    assert "4096" not in Path(trainer.__file__).read_text()
    from projects.fine_tuning.models import HyperParameters

    TrainerConfig.model_validate({**data, "r": 4096})
    HyperParameters.model_validate({"r": 4096})
    with pytest.raises(ValidationError, match="less than or equal to 4096"):
        TrainerConfig.model_validate({**data, "r": 4097})
    with pytest.raises(ValidationError, match="less than or equal to 4096"):
        HyperParameters.model_validate({"r": 4097})


def test_no_gpu_asked_needs_no_nvml() -> None:
    _check_gpus(0)


@pytest.mark.skipif(Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists(),
                    reason="this machine has NVIDIA's library")
def test_a_gpu_cell_on_a_machine_without_one_fails_before_it_runs() -> None:
    with pytest.raises(ConfigError) as caught:
        _check_gpus(1)
    assert caught.value.key == "tests.fine_tuning.test_settings.gpu"
    assert "gpu: 1" in str(caught.value) and "0 NVIDIA GPU(s)" in str(caught.value)


def test_the_gpu_check_counts_the_boards_nvml_reports(tmp_path: Path) -> None:
    folder = build_nvml_standin(tmp_path / "nvml")
    if folder is None:
        pytest.skip("no C compiler: the NVML stand-in library cannot be built")
    code = ("from projects.fine_tuning.project import _check_gpus\n"
            "from core.errors import ConfigError\n"
            "_check_gpus(2)\n"
            "try:\n    _check_gpus(3)\nexcept ConfigError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "LD_LIBRARY_PATH": str(folder)})
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "has 2 NVIDIA GPU(s)" in done.stdout


def test_the_trainer_refuses_gpus_torch_does_not_see(tmp_path: Path) -> None:
    """torch's CPU build sees no CUDA device: exit non-zero, the reason on stderr."""
    from projects.fine_tuning.models import TestSettings
    from projects.library.tiny_lm import LocalModelSpec

    config = tmp_path / "config.json"
    config.write_text(trainer_config(
        TestSettings(gpu=1), str(REPO / "projects/fine_tuning/data/alpaca_mini.jsonl"),
        str(tmp_path / "out"), local_model=LocalModelSpec(hidden_size=64)).file_text())
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-m", "projects.fine_tuning.workload.train_local",
                           str(config)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here")
    assert done.returncode != 0
    assert "asks for gpu: 1" in done.stderr and "sees 0 CUDA device(s)" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before any training
