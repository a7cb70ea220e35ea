"""The docs site builds strictly, its generated reference is current, the README is short."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs build --strict: a broken link, a missing page or image, a bad reference fails."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs, "mkdocs is part of the [dev] extra"
    done = subprocess.run([mkdocs, "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "kube_kinds" in api and "HorreumInstance" in api  # mkdocstrings rendered them


def test_the_generated_reference_is_current() -> None:
    """docs/reference/{config,cli}.md come from the models and the commands: regenerate
    (python -m deployments.reference) when a key or an option changes."""
    done = subprocess.run([sys.executable, "-m", "deployments.reference", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr


def test_the_readme_is_what_a_newcomer_needs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    # the two commands, verbatim, and where the docs are
    assert "./telltale fine_tuning --preset light" in text and "./telltale test" in text
    assert "docs/" in text and "mkdocs serve" in text
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("./telltale test")
