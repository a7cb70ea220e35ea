"""Project plugins: what post-processing needs to know about a project.

Projects register an `AnalysisProject` under the ``telltale.projects`` entry-point group
(see ``pyproject.toml``), so this layer finds them without importing ``projects/``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from analysis.errors import ResultsError
from analysis.kpi import KpiDefinition
from analysis.parsing import ParsedResult, ResultParser

__all__ = ["ENTRY_POINT_GROUP", "AnalysisProject", "available_projects", "load_project"]

ENTRY_POINT_GROUP = "telltale.projects"


@dataclass(frozen=True)
class AnalysisProject:
    """A project's post-processing hooks.

    Attributes:
        name: Project name (``fine_tuning``).
        parser: Turns a result dir into a typed result.
        kpis: Declarative KPI definitions.
        labels: Result → the run's identity labels (strings).
        results_summary: Result → flat mapping of parsed values for the LTS ``results`` block.
        plots_file: The project's ``plots.yaml`` (which reports to build).
        loss_curve: Result → rows ``{step, loss}`` for the training-curve report (optional).
        timestamps: Result → (start, end) ISO strings when known.
        run_uuid: Result → the run's uuid.
        user_rows: Result → one row per user of a multi-user test (optional).
    """

    name: str
    parser: ResultParser
    kpis: Sequence[KpiDefinition]
    labels: Callable[[ParsedResult], dict[str, str]]
    results_summary: Callable[[ParsedResult], dict[str, Any]]
    run_uuid: Callable[[ParsedResult], str]
    timestamps: Callable[[ParsedResult], tuple[str | None, str | None]]
    plots_file: Path | None = None
    loss_curve: Callable[[ParsedResult], list[dict[str, float]]] | None = None
    user_rows: Callable[[ParsedResult], list[dict[str, Any]]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def available_projects() -> list[str]:
    """Names of the registered projects."""
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


@functools.cache
def load_project(name: str) -> AnalysisProject:
    """Load a registered project's hooks.

    Raises:
        ResultsError: No project of that name is registered.
    """
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            project = ep.load()
            if not isinstance(project, AnalysisProject):
                raise ResultsError(f"entry point {ep.value} is not an AnalysisProject")
            return project
    known = ", ".join(available_projects()) or "(none: is the package installed?)"
    raise ResultsError(f"unknown project {name!r}; registered projects: {known}")
