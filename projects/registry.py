"""Find projects: their folder, base config file, contract and config model."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from analysis.discovery import available_projects
from analysis.project import load_project
from core.errors import ConfigError, ResultsError, did_you_mean
from core.safeio import UnreadableInputError, read_text_bounded
from projects.contract import Project

__all__ = ["PROJECTS_DIR", "available", "config_model", "load", "locate", "project_dir",
           "project_of_flow", "project_of_run"]

PROJECTS_DIR = Path(__file__).resolve().parent


def available() -> list[str]:
    """The projects that can run (a ``config.yaml`` in their folder).

    Narrowed from `analysis.discovery.available_projects`, the one answer: every command,
    test and generator reads this list.
    """
    return [name for name in available_projects() if (PROJECTS_DIR / name / "config.yaml")
            .is_file()]


def project_dir(name: str) -> Path:
    """Return a project's folder.

    Raises:
        ConfigError: No such project, listing the available ones.
    """
    path = PROJECTS_DIR / name
    if not name.isidentifier() or not (path / "config.yaml").is_file():
        raise ConfigError(f"unknown project {name!r}{did_you_mean(name, available())}; "
                          f"available: {', '.join(available())}")
    return path


def locate(base: str | Path) -> tuple[str | None, Path]:
    """Turn ``base`` (a project name or a YAML path) into (project name or None, config path)."""
    text = str(base)
    if isinstance(base, str) and "/" not in text and not text.endswith((".yaml", ".yml")):
        return text, project_dir(text) / "config.yaml"
    path = Path(base).resolve()
    if not path.is_file():
        raise ConfigError("config file not found", file=str(base))
    if path.parent.parent == PROJECTS_DIR and path.name == "config.yaml":
        return path.parent.name, path
    return None, path


def load(name: str) -> Project:
    """Return a project's contract (entry point ``telltale.projects``, else its folder).

    Raises:
        ConfigError: No such project, or it exports no `Project`.
    """
    project_dir(name)
    try:
        project = load_project(name)
    except ResultsError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(project, Project):
        raise ConfigError(f"project {name!r} exports an AnalysisProject, not a Project: it "
                          "can be post-processed but not orchestrated")
    return project


def config_model(project: str) -> type[BaseModel] | None:
    """Return the pydantic model validating a project's config (its contract's)."""
    return load(project).config_model


def project_of_run(run_dir: str | Path) -> str | None:
    """The project a run's artifact dir belongs to: its cells' ``cell.json`` say so.

    None when no cell names a registered project (then the caller asks for ``--project``).
    """
    known = set(available())
    for cell in sorted(Path(run_dir).glob("*__cell*/cell.json"))[:16]:
        try:
            data = json.loads(read_text_bounded(cell, 64 * 1024, what="cell record"))
        except (UnreadableInputError, ValueError):
            continue
        name = data.get("project") if isinstance(data, dict) else None
        if name in known:
            return str(name)
    return None


def project_of_flow(flow_name: str) -> str | None:
    """The registered project whose Prefect flow is ``flow_name`` (``fine-tuning``), if any.

    An export's S3 keys are ``<prefix>/<flow name>/<run id>``.
    """
    return next((name for name in available() if load(name).flow_name == flow_name), None)
