"""This machine's facts, where a cluster run records its nodes and OpenShift versions.

`machine_facts` describes the CPU, memory, OS, Python, the ML libraries' versions and the
GPUs (through ``nvidia-smi`` when it is installed); `capture_environment` is the run's
``cluster`` step that writes them into ``machine.json``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from core.environment import env_settings
from core.safeio import UnreadableInputError, read_bounded, write_text
from tasks.artifacts import artifact_dir, step

__all__ = ["capture_environment", "machine_facts", "read_small"]


def read_small(path: str) -> str:
    """A small text file (/proc, /etc, a cmdline file in a run dir), "" when unusable.

    Through the one bounded reader: a FIFO planted as a run's cmdline file is refused.
    """
    try:
        return read_bounded(path, 1024 * 1024, what="file", follow_links=True).decode(
            "utf-8", errors="replace")
    except (OSError, UnreadableInputError):
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
    for line in read_small("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory_gb = None
    for line in read_small("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
            break
    os_release = {}
    for line in read_small("/etc/os-release").splitlines():
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
        "telltale_image": env_settings().image or None,  # set in the Containerfile
        "captured_at": datetime.now(UTC).isoformat(),
    }


@step("cluster", timeout_seconds=120)
def capture_environment() -> dict[str, Any]:
    """Capture the local machine's facts into ``machine.json`` of the step dir.

    Returns:
        The facts written.
    """
    facts = machine_facts()
    write_text(artifact_dir() / "machine.json", json.dumps(facts, indent=2) + "\n")
    return facts
