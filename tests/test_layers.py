"""Architecture checks: import layers and public API lists."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_import_layers_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the [dev] extra"
    proc = subprocess.run([lint], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("module", [
    "analysis.errors", "analysis.kpi", "analysis.lts", "analysis.history", "analysis.regression",
    "analysis.parsing", "analysis.discovery", "analysis.pipeline", "analysis.report",
    "projects.config", "projects.contract", "projects.matrix", "tasks.artifacts",
    "tasks.runner", "tasks.platforms.select",
])
def test_all_lists_exist_and_resolve(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__, module
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_importing_analysis_does_not_import_prefect() -> None:
    code = "import analysis.pipeline, analysis.report, sys; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is part of the [dev] extra"
    proc = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
