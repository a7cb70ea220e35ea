"""Project plugins: what post-processing needs to know about a project.

Projects register an `AnalysisProject` under the ``telltale.projects`` entry-point group
(see ``pyproject.toml``), so this layer finds them without importing ``projects/``. A project
folder that is not registered yet (a freshly scaffolded one, before ``pip install -e .`` runs
again) is found by convention as the module ``projects.<name>.project``, attribute
``PROJECT``; the name is looked up, never imported statically.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from analysis.curve_spec import CurveSpec
from analysis.discovery import ENTRY_POINT_GROUP, available_projects
from analysis.kpi import KpiDefinition
from analysis.parsing import ParsedResult, ResultParser
from core.errors import ResultsError, did_you_mean

__all__ = ["ENTRY_POINT_GROUP", "AnalysisProject", "available_projects", "load_project"]


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
        samples: Result → per-request values by metric (``{"ttft_ms": [...]}``) for the
            ``distribution`` report (optional).
        resource_rows: Result → rows ``{t_s, metric, value}`` of its resource timeline
            (Prometheus capture) for the resources report (optional).
        bulky: Fields of the parsed result only the newest runs' report pages need (a loss
            curve per step): post-processing drops them from older runs once their KPIs
            and payloads are computed, so memory stays bounded over 10 000 runs.
        analysis_only: Fields of the parsed result only the analysis reads (KPIs, labels and
            the payload are computed from them; no report page reads them): dropped from
            older runs once analysed, like ``bulky``, but still read from every run's cache.
        kpi_less: The project measures nothing as KPIs (a functional check): a run that
            exits 0 with no KPI is then not a failure.
        validity: Result → reasons its numbers are not a valid measurement (empty: valid):
            the project's own checks, added to the engine's (`analysis.validity`).
        measured_window: Result → seconds of the workload's measured window, when known.
        min_window_s: The shortest measured window the project calls a measurement.
        curve: The load sweep a run's cells make (`analysis.curve.CurveSpec`): judged as
            one curve (knee, frontier, one verdict for its shape). None: no curve.
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
    samples: Callable[[ParsedResult], dict[str, list[float]]] | None = None
    resource_rows: Callable[[ParsedResult], list[dict[str, Any]]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    bulky: tuple[str, ...] = ()
    analysis_only: tuple[str, ...] = ()
    kpi_less: bool = False
    validity: Callable[[ParsedResult], list[str]] | None = None
    measured_window: Callable[[ParsedResult], float | None] | None = None
    min_window_s: float = 0.0
    curve: CurveSpec | None = None

    def analysis_defaults(self) -> dict[str, Any]:
        """The project's default ``analysis`` block (ignored labels, compared label...).

        ``python -m analysis`` and replot start from it, so they select the same history and
        give the verdicts a run of the project gave. Empty here; `projects.contract.Project`
        reads it from the project's config file.
        """
        return {}


FOLDER_MODULE = "projects.{name}.project"
"""Where an unregistered project's plugin is found (``PROJECT`` in that module)."""


@functools.cache
def load_project(name: str) -> AnalysisProject:
    """Load a project's hooks: its entry point, else its folder module.

    Raises:
        ResultsError: No project of that name is registered or found.
    """
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return _checked(ep.load(), ep.value)
    if name.isidentifier():
        module_name = FOLDER_MODULE.format(name=name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name not in (module_name, module_name.rsplit(".", 1)[0]):
                raise
        else:
            return _checked(getattr(module, "PROJECT", None), f"{module_name}:PROJECT")
    known = ", ".join(available_projects()) or "(none: is the package installed?)"
    raise ResultsError(f"unknown project {name!r}{did_you_mean(name, available_projects())}; "
                       f"registered projects: {known}")


def _checked(project: object, where: str) -> AnalysisProject:
    if not isinstance(project, AnalysisProject):
        raise ResultsError(f"{where} is not an AnalysisProject")
    return project
