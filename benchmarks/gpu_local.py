"""The local trainer on the accelerator against the CPU, with a preset's own model (#43).

    python benchmarks/gpu_local.py [--preset gpu_local] [--max-steps 10] [--repeat 1]

Builds the trainer config of the preset's first cell as a run does (the resolved config,
the cell's typed settings, `projects.fine_tuning.trainer.trainer_config` with the model's
local spec and the project's dataset), then runs the trainer as a fresh process
(``python -m projects.fine_tuning.workload.train_local``) on the CPU (``gpu: 0``) and, when
torch sees a CUDA device, on it (the cell's ``gpu``); prints each one's device line and
``train_tokens_per_second`` (the median of ``--repeat`` runs), and the ratio of the
accelerator's to the CPU's. On the accelerator, NVML is sampled around each run as a cell's
window is (`tasks.observe.energy.EnergyRecorder`) and the training steps' energy, energy
per token, mean power and mean utilisation are printed, integrated over the trainer's own
``train_start``..``train_end`` (`projects.library.energy.energy_in_window`, the KPIs'
code), and the peak memory in use.

#43 measured its floor on one H100 and 16 cores with this model (hidden 1024, 8 layers,
sequence 512, batch 16): 1 379 tokens/s on the CPU, 11 202 on the GPU (8.1x). Throughput is
a rate: ``--max-steps`` (default 10, the preset runs 60) only needs to pass the first
steps' warm-up, and keeps the CPU leg short (~1 min on 16 cores).

Without an accelerator the CPU figure is printed and the accelerator's is said to be not
measured here; exit 0. The suite runs it in its smallest mode (``--preset light``, two
steps). Its figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pydantic import ValidationError  # noqa: E402

from core.errors import ConfigError  # noqa: E402
from projects.config import resolve  # noqa: E402
from projects.fine_tuning.models import TestSettings  # noqa: E402
from projects.fine_tuning.project import DATASET_KEY  # noqa: E402
from projects.fine_tuning.trainer import trainer_config  # noqa: E402
from projects.library.data import data_file  # noqa: E402
from projects.plan import cells_of  # noqa: E402
from tasks.observe.energy import EnergyRecorder, meters  # noqa: E402

ISSUE_FLOOR = "#43, one H100 + 16 cores: 1 379 tokens/s CPU, 11 202 GPU (8.1x)"


def _config(preset: str, gpus: int, max_steps: int, tmp: Path) -> Path:
    """The trainer config file of ``preset``'s first cell, on ``gpus`` accelerators."""
    config = resolve("fine_tuning", [preset], overrides={}, env={})
    cell = cells_of(config, "fine_tuning")[0]
    settings = cell.typed_as(TestSettings).model_copy(update={"gpu": gpus,
                                                              "max_steps": max_steps})
    test = config.typed.tests.fine_tuning
    dataset = data_file(REPO / "projects" / "fine_tuning" / "data", settings.dataset_name,
                        key=DATASET_KEY, what="dataset")
    text = trainer_config(settings, str(dataset), str(tmp / f"output-{gpus}"),
                          local_model=test.local_models[settings.model_name],
                          logging_steps=max(1, max_steps // 2)).file_text()
    path = tmp / f"config-gpu{gpus}.json"
    path.write_text(text)
    return path


def _train(config: Path) -> tuple[str, dict[str, Any], float]:
    """Run the trainer once: (its device line, its final summary, wall seconds)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "projects.fine_tuning.workload.train_local",
                           str(config)], cwd=REPO, capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the trainer exited {done.returncode}:\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    device = next((line.split(":", 1)[1].strip() for line in lines
                   if line.startswith("device:")), "?")
    summary = ast.literal_eval(next(line for line in reversed(lines) if line.startswith("{")))
    return device, summary, wall


def gpu_figures(rows: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, float]:
    """The accelerator's figures over the training steps, from NVML rows (the recorder's).

    ``energy_j`` and ``joules_per_token`` as the KPIs compute them (absent when NVML gave
    no energy over the window), ``power_w_mean``, ``util_pct_mean`` over the samples inside
    the window, ``memory_gib_max`` over the whole run.
    """
    import pandas as pd

    from projects.library.energy import energy_in_window

    frame = pd.DataFrame(rows, columns=["query", "labels", "timestamp", "value"])
    figures: dict[str, float] = {}
    start, end = summary.get("train_start"), summary.get("train_end")
    if frame.empty or start is None or end is None:
        return figures
    window = (datetime.fromtimestamp(float(start), UTC), datetime.fromtimestamp(float(end), UTC))
    used = energy_in_window(frame, *window)
    tokens = float(summary.get("train_tokens_per_second") or 0) * float(
        summary.get("train_runtime") or 0)
    if used is not None and used.gpu_energy_joules is not None:
        figures["energy_j"] = used.gpu_energy_joules
        figures["power_w_mean"] = used.gpu_energy_joules / used.window_s
        if tokens:
            figures["joules_per_token"] = used.gpu_energy_joules / tokens
    inside = frame[(frame["timestamp"] >= window[0]) & (frame["timestamp"] <= window[1])]
    util = inside.loc[inside["query"] == "gpu_util_percent", "value"]
    if len(util):
        figures["util_pct_mean"] = float(util.mean())
    memory = frame.loc[frame["query"] == "gpu_memory_used_bytes", "value"]
    if len(memory):
        figures["memory_gib_max"] = float(memory.max()) / 2**30
    return figures


def _accelerators() -> int:
    """CUDA devices torch sees (0 without torch's CUDA build or a device)."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count()"
                           " if torch.cuda.is_available() else 0)"], capture_output=True,
                          text=True, check=False)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main() -> int:
    """Measure and print; returns 0 (2: a wrong argument, said in one line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpu_local")
    parser.add_argument("--max-steps", type=_at_least_one, default=10)
    parser.add_argument("--repeat", type=_at_least_one, default=1)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="telltale-gpu-local-") as scratch:
        tmp = Path(scratch)
        try:  # the configs before torch is asked or anything runs: a wrong preset fails first
            configs = {gpus: _config(args.preset, gpus, args.max_steps, tmp) for gpus in (0, 1)}
        except (ConfigError, ValidationError) as exc:
            parser.error(str(exc).splitlines()[0])
        legs = [("cpu", 0)] + ([("accelerator", 1)] if _accelerators() else [])
        for name, gpus in legs:
            config = configs[gpus]
            for _ in range(args.repeat):
                # NVML around the accelerator's runs, as around a cell asking for GPUs
                recorder = EnergyRecorder(meters(gpu=True)).start() if gpus else None
                try:
                    device, summary, wall = _train(config)
                finally:
                    rows = recorder.stop() if recorder is not None else []
                rate = float(summary["train_tokens_per_second"])
                rates.setdefault(name, []).append(rate)
                figures = gpu_figures(rows, summary) if gpus else {}
                shown = "".join(f", {key} {value:.4g}" for key, value in figures.items())
                print(f"{name:12s} device {device}: {rate:10.1f} tokens/s "
                      f"({wall:.1f} s, the process{shown})", flush=True)
    cpu = statistics.median(rates["cpu"])
    print(f"preset {args.preset}, {args.max_steps} step(s), {os.cpu_count()} CPU(s)")
    print(f"cpu          median {cpu:10.1f} tokens/s")
    if "accelerator" not in rates:
        print("accelerator  not measured: torch sees no CUDA device here "
              f"(floor: {ISSUE_FLOOR})")
        return 0
    gpu = statistics.median(rates["accelerator"])
    print(f"accelerator  median {gpu:10.1f} tokens/s")
    print(f"ratio        {gpu / cpu:6.2f}x accelerator to CPU ({ISSUE_FLOOR})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
