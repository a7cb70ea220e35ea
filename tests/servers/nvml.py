"""Build the NVML stand-in (``nvml_standin.c``) as ``libnvidia-ml.so.1`` in a folder.

A process started with that folder on ``LD_LIBRARY_PATH`` loads it where nvidia-ml-py loads
NVIDIA's library (``CDLL("libnvidia-ml.so.1")``): the real binding, known counters.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["build_nvml_standin"]

_SOURCE = Path(__file__).with_name("nvml_standin.c")


def build_nvml_standin(folder: Path) -> Path | None:
    """Compile the stand-in into ``folder``; None when this machine has no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o",
                    str(folder / "libnvidia-ml.so.1"), str(_SOURCE)],
                   check=True, capture_output=True, timeout=120)
    return folder
