"""The local platform: this machine stands in for the cluster.

- `capture_environment` records the machine's facts (CPU, memory, OS, Python, library
  versions, GPU if any) where a cluster run records nodes and OpenShift versions;
- `run_fine_tuning_job` runs the trainer as a local process in the layout a cluster run
  produces (``src/config_final.json``, ``artifacts/pod.log``, ``artifacts/process.json``);
- `cleanup_local` stops workload processes left behind (found through their pid files, so
  it also works from another process, e.g. a cancellation hook) and removes scratch dirs.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from analysis.errors import ConfigError, StepError
from projects.fine_tuning.trainer import trainer_config
from tasks.artifacts import artifact_dir, step
from tasks.runner import CommandTimeout, run

__all__ = [
    "WorkloadOutcome",
    "capture_environment",
    "cleanup_local",
    "machine_facts",
    "prepare_local",
    "run_fine_tuning_job",
]

logger = logging.getLogger("telltale.local")

PID_FILE = "workload.pid"
SCRATCH_DIR = "scratch"
WORKLOAD_MODULE = "projects.fine_tuning.workload.train_local"


class WorkloadOutcome(BaseModel):
    """How a workload run ended."""

    exit_code: int
    finish_reason: str
    duration_s: float
    log: str


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _gpus() -> tuple[str | None, int]:
    if shutil.which("nvidia-smi") is None:
        return None, 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None, 0
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return (names[0] if names else None), len(names)


def machine_facts() -> dict[str, Any]:
    """Describe this machine: CPU, memory, OS, Python, ML library versions, GPUs."""
    cpu_model = None
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory_gb = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
            break
    os_release = {}
    for line in _read("/etc/os-release").splitlines():
        key, _, value = line.partition("=")
        os_release[key] = value.strip().strip('"')
    gpu_name, gpu_count = _gpus()
    return {
        "platform": "local",
        "hostname": platform.node(),
        "os_version": os_release.get("PRETTY_NAME") or platform.platform(),
        "kernel": platform.release(),
        "python_version": platform.python_version(),
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "peft_version": _version("peft"),
        "accelerate_version": _version("accelerate"),
        "cpu_model": cpu_model or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "memory_gb": memory_gb,
        "accelerator_type": gpu_name,
        "accelerator_count": gpu_count,
        "captured_at": datetime.now(UTC).isoformat(),
    }


@step("cluster", timeout_seconds=120)
def capture_environment() -> dict[str, Any]:
    """Capture the local machine's facts into ``machine.json`` of the step dir.

    Returns:
        The facts written.
    """
    facts = machine_facts()
    (artifact_dir() / "machine.json").write_text(json.dumps(facts, indent=2) + "\n",
                                                 encoding="utf-8")
    return facts


_LOCAL_EXTRA = ("torch", "transformers", "peft", "accelerate", "tokenizers")


@step("prepare", timeout_seconds=60)
def prepare_local(cells: list[dict[str, Any]], local_models: dict[str, dict[str, Any]],
                  data_dir: str) -> dict[str, Any]:
    """Check, before anything runs, that every cell can run on this machine.

    Args:
        cells: Settings of the cells that will run.
        local_models: Tiny model specs by name.
        data_dir: Directory holding the datasets.

    Returns:
        What was checked (datasets, models, library versions).

    Raises:
        ConfigError: A cell names a dataset or model that does not exist, or the local
            workload's libraries are not installed (the ``[local]`` extra).
    """
    missing = [name for name in _LOCAL_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"the local workload needs {', '.join(missing)}: "
                          "pip install torch==2.13.0 && pip install -e '.[local]'")
    datasets = sorted({str(c["dataset_name"]) for c in cells})
    for name in datasets:
        if not (Path(data_dir) / name).is_file():
            available = sorted(p.name for p in Path(data_dir).glob("*.json*"))
            raise ConfigError(f"dataset {name!r} not found in {data_dir}; available: "
                              f"{', '.join(available) or '(none)'}",
                              key="tests.fine_tuning.test_settings.dataset_name")
    models = sorted({str(c["model_name"]) for c in cells})
    for name in models:
        if name not in local_models:
            raise ConfigError(f"model {name!r} has no local spec; defined: "
                              f"{', '.join(sorted(local_models)) or '(none)'}",
                              key="tests.fine_tuning.test_settings.model_name")
    return {"datasets": datasets, "models": models,
            "versions": {name: _version(name) for name in _LOCAL_EXTRA}}


@step("fine_tuning")
def run_fine_tuning_job(job_name: str, settings: dict[str, Any], timeout_minutes: int,
                        local_models: dict[str, dict[str, Any]], data_dir: str,
                        logging_steps: int = 10) -> WorkloadOutcome:
    """Run the fine-tuning workload as a local process, in the cluster's artifact layout.

    Args:
        job_name: Name of the job (process title in the logs).
        settings: The cell's settings (model, dataset, hyper-parameters...).
        timeout_minutes: Deadline; the process is killed past it.
        local_models: Tiny model specs by name (``tests.fine_tuning.local_models``).
        data_dir: Directory holding the datasets.
        logging_steps: Trainer logging period, in steps.

    Returns:
        The `WorkloadOutcome` (a failed training is an outcome, not an exception).

    Raises:
        StepError: The model spec or dataset does not exist (a configuration mistake).
    """
    model = settings["model_name"]
    if model not in local_models:
        raise StepError(f"model {model!r} has no local spec; local models: "
                        f"{', '.join(sorted(local_models)) or '(none)'}")
    data_file = Path(data_dir) / str(settings["dataset_name"])
    if not data_file.is_file():
        raise StepError(f"dataset {data_file} not found")
    here = artifact_dir()
    (here / "src").mkdir(exist_ok=True)
    (here / "artifacts").mkdir(exist_ok=True)
    config = trainer_config(settings, str(data_file), str(here / SCRATCH_DIR),
                            local_model=local_models[model], logging_steps=logging_steps)
    config_file = here / "src" / "config_final.json"
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    log_file = here / "artifacts" / "pod.log"
    started = time.monotonic()
    start_iso = datetime.now(UTC).isoformat()
    logger.info("starting %s: model=%s dataset=%s", job_name, model, data_file.name)
    reason = "Completed"
    try:
        result = run([sys.executable, "-m", WORKLOAD_MODULE, str(config_file)], check=False,
                     timeout=timeout_minutes * 60, output_file=log_file,
                     pid_file=here / PID_FILE, env={"PYTHONUNBUFFERED": "1"})
        code = result.returncode
        if code != 0:
            reason = "Error"
    except CommandTimeout:
        code, reason = 124, "DeadlineExceeded"
    duration = time.monotonic() - started
    (here / "artifacts" / "process.json").write_text(json.dumps({
        "job_name": job_name, "exit_code": code, "finish_reason": reason,
        "start": start_iso, "end": datetime.now(UTC).isoformat(),
        "duration_s": round(duration, 3)}, indent=2) + "\n", encoding="utf-8")
    (here / PID_FILE).unlink(missing_ok=True)  # finished: nothing left for cleanup to stop
    logger.info("%s finished: exit %d (%s) in %.1fs", job_name, code, reason, duration)
    return WorkloadOutcome(exit_code=code, finish_reason=reason, duration_s=duration,
                           log=str(log_file))


def _is_our_workload(pid: int) -> bool:
    cmdline = _read(f"/proc/{pid}/cmdline").replace("\0", " ")
    return WORKLOAD_MODULE in cmdline


def cleanup_local(root: str | Path) -> dict[str, Any]:
    """Stop workload processes left under ``root`` and remove trainer scratch dirs.

    Safe to call from any process and more than once: pid files are checked against the
    process's command line, so a recycled pid is never killed.

    Returns:
        What was stopped and removed.
    """
    stopped: list[int] = []
    removed: list[str] = []
    base = Path(root)
    for pid_file in base.rglob(PID_FILE):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_our_workload(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
                stopped.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        pid_file.unlink(missing_ok=True)
    for scratch in base.rglob(SCRATCH_DIR):
        if scratch.is_dir() and scratch.parent.name.endswith("__run_fine_tuning_job"):
            shutil.rmtree(scratch, ignore_errors=True)
            removed.append(str(scratch.relative_to(base)))
    return {"stopped_pids": stopped, "removed": removed}


@step("cleanup", timeout_seconds=300)
def cleanup(root: str) -> dict[str, Any]:
    """Cleanup phase on the local platform (see `cleanup_local`)."""
    summary = cleanup_local(root)
    logger.info("cleanup: stopped %d process(es), removed %d scratch dir(s)",
                len(summary["stopped_pids"]), len(summary["removed"]))
    return summary
