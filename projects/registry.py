"""Find projects: their folder, base config file and config model."""

from __future__ import annotations

import importlib
from pathlib import Path

from pydantic import BaseModel

from analysis.errors import ConfigError

__all__ = ["PROJECTS_DIR", "available", "config_model", "locate", "project_dir"]

PROJECTS_DIR = Path(__file__).resolve().parent


def available() -> list[str]:
    """Names of the projects that ship a ``config.yaml``."""
    return sorted(p.parent.name for p in PROJECTS_DIR.glob("*/config.yaml"))


def project_dir(name: str) -> Path:
    """Return a project's folder.

    Raises:
        ConfigError: No such project, listing the available ones.
    """
    path = PROJECTS_DIR / name
    if not name.isidentifier() or not (path / "config.yaml").is_file():
        raise ConfigError(f"unknown project {name!r}; available: {', '.join(available())}")
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


def config_model(project: str) -> type[BaseModel] | None:
    """Return the pydantic model validating a project's config (``projects.<name>.models``)."""
    project_dir(project)
    try:
        module = importlib.import_module(f"projects.{project}.models")
    except ModuleNotFoundError as exc:
        if exc.name == f"projects.{project}.models":
            return None
        raise
    model = getattr(module, "ConfigModel", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None
