"""The code's own packages, named once for every test that walks or graphs them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PACKAGES = ("core", "analysis", "projects", "tasks", "flows", "blocks", "deployments")
"""Every first-party package, ground floor first (docs/architecture.md)."""


def python_files(*, skip_scaffold: bool = False) -> Iterator[tuple[str, Path]]:
    """Each ``.py`` file of the packages as (path relative to the repo, path), sorted.

    ``skip_scaffold``: leave out ``flows/scaffold/`` (templates, not code that runs here).
    """
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if skip_scaffold and "/scaffold/" in rel:
                continue
            yield rel, path
