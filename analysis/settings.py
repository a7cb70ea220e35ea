"""The ``analysis`` config block: where history lives and how runs are compared."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import Field, ValidationError, field_validator

from analysis.detector_settings import DEFAULTS, DetectorSettings
from core.errors import ConfigError
from core.strict import StrictSettings
from core.yamlio import load_yaml

__all__ = ["AnalysisSettings", "ComparisonSettings", "RegressionSettings", "ValidityPolicy",
           "settings_for"]

logger = logging.getLogger("telltale.analysis")


class ComparisonSettings(StrictSettings):
    """Which runs count as the same configuration when building a KPI's history."""

    ignored_labels: list[str] = Field(
        default_factory=lambda: ["run_uuid", "run_id", "test_path"],
        description="Labels that may differ inside a history (platform versions, run ids...); "
        "a list replaces the default, so keep the run's own ids in it.",
    )
    compared_label: str | None = Field(
        default=None,
        description="The dimension under test (e.g. container_image); history ignores it.",
    )


class RegressionSettings(StrictSettings):
    """Regression verdict policy."""

    enabled: bool = Field(default=True, description="Compute verdicts against the history.")
    fail_on_regression: bool = Field(default=False, description="A regression fails the run.")
    fail_on_improvement: bool = Field(
        default=False, description="An improvement also fails the run (it needs a look too)."
    )
    min_history: int = Field(default=3, ge=3, le=10_000,
                             description="Runs needed before any verdict.")
    min_change_pct: float = Field(
        default=0.0, ge=0, le=100,
        description=("Smallest change, in %, called a regression, an improvement or a change "
                     "point. 0: significance against the KPI's own noise decides alone; set "
                     "e.g. 2 where a smaller change is real but not worth a look."),
    )

    def detector(self) -> DetectorSettings:
        """The detector's tuning with this policy's minimum history and minimum change."""
        return replace(DEFAULTS, min_history=self.min_history,
                       min_magnitude=self.min_change_pct / 100)


class ValidityPolicy(StrictSettings):
    """When a cell's result is a valid measurement, and what an invalid one does to the run.

    The engine's checks read the cell's own process and Prometheus data (``host.json``,
    ``prometheus/series.parquet``); a project adds its own (`analysis.validity`).
    """

    mode: Literal["record", "enforce", "off"] = Field(
        default="record", description="record: judge validity and show it, the run's exit code "
        "unchanged (light presets); enforce: a cell still invalid after its re-runs ends the "
        "run with exit 3 (inconclusive); off: no check.")
    max_other_cpu_share: float = Field(
        default=0.25, ge=0, le=1, description="Largest share of the machine's CPU time used by "
        "processes outside the run during the cell's window.")
    max_load_per_core: float = Field(
        default=1.0, ge=0.1, le=1000, description="Largest mean number of other processes' "
        "runnable threads per core during the cell's window (the load others add; the run's "
        "own threads are not counted).")
    max_steal_share: float = Field(
        default=0.05, ge=0, le=1, description="Largest share of CPU time stolen by the "
        "hypervisor during the window.")
    max_swap_in_per_s: float = Field(
        default=50.0, ge=0, le=1e9, description="Largest rate of pages swapped in per second "
        "(memory pressure).")
    min_memory_available_share: float = Field(
        default=0.05, ge=0, le=1, description="Smallest share of memory still available "
        "during the window.")
    max_throttled_share: float = Field(
        default=0.1, ge=0, le=1, description="Largest share of CFS periods throttled (where "
        "the run's cgroup shows it).")
    min_window_s: float = Field(
        default=0.0, ge=0, le=86_400, description="The workload's measured window must last at "
        "least this long (0: the project's own declared minimum only).")


class AnalysisSettings(StrictSettings):
    """Post-processing settings shared by every project."""

    history_uri: str | None = Field(
        default=None,
        description=("Parquet history: a local dir or s3://bucket/prefix. "
                     "None: the user's data dir."),
    )
    mode: Literal["investigate", "cpt"] = Field(
        default="investigate",
        description="cpt: every LTS field is required and post-processing errors fail the run.",
    )
    strict: bool = Field(default=False, description="Post-processing failures fail the run.")
    history_source: Literal["parquet", "opensearch"] = Field(
        default="parquet",
        description="Judge against the Parquet history or the OpenSearch run index.",
    )
    report: bool = Field(default=True, description="Render the Plotly HTML report.")
    confirm_reruns: Annotated[int, Field(ge=0, le=5)] | Literal["auto"] = Field(
        default=0,
        description=("Re-run a cell this many times right away when a KPI of its newest run "
                     "is a suspect (alone out of line with its level), and judge the repeats "
                     "together: confirmed, a regression (or improvement) at that run; not, "
                     "an outlier (0: never; auto: as many as bring the KPI's minimum "
                     "detectable effect under target_mde_pct, 1 to 5)."),
    )
    confirm_budget: int = Field(
        default=3, ge=0, le=20, description="At most this many confirmation re-runs in one "
        "run, every cell together (the suspects with the largest changes first).")
    validity: ValidityPolicy = Field(default_factory=ValidityPolicy, description="Whether "
                                     "each cell's result is a valid measurement.")
    invalid_reruns: int = Field(
        default=0, ge=0, le=5, description="Re-run an invalid cell this many times (its "
        "invalid result is kept and shown, never judged).")
    target_mde_pct: float = Field(
        default=5.0, gt=0, le=100, description="The report flags KPIs whose minimum detectable "
        "effect (at the detector's false-alarm budget, given their noise and repeats) is "
        "larger than this.")

    @field_validator("validity", mode="before")
    @classmethod
    def _mode_only(cls, value: object) -> object:
        # `analysis.validity: enforce` is the short form of `{mode: enforce}`
        return {"mode": value} if isinstance(value, str) else value
    comparison: ComparisonSettings = Field(default_factory=ComparisonSettings)
    regression: RegressionSettings = Field(default_factory=RegressionSettings)


class _Defaults(Protocol):
    """What `settings_for` needs of a project (`analysis.project.AnalysisProject`)."""

    def analysis_defaults(self) -> dict[str, Any]:
        """The project's own ``analysis`` block."""
        ...


def settings_for(project: _Defaults, results_dir: str | Path) -> AnalysisSettings:
    """The ``analysis`` block a run used, so a re-analysis gives the verdicts the run gave.

    The run's own ``config.yaml`` at the top of ``results_dir`` (a Telltale artifact dir)
    wins; otherwise the project's defaults (`AnalysisProject.analysis_defaults`). A missing,
    linked or invalid run config falls back to the defaults with a warning.
    """
    config = Path(results_dir) / "config.yaml"
    block: object = None
    if config.is_file() and not config.is_symlink():
        try:
            data, _ = load_yaml(config, untrusted=True)
            block = data.get("analysis") if isinstance(data, dict) else None
            if block is not None:
                return AnalysisSettings.model_validate(block)
        except (ConfigError, ValidationError) as exc:
            logger.warning("%s: its analysis block is unusable (%s); using the project's "
                           "defaults", config, str(exc).splitlines()[0])
    return AnalysisSettings.model_validate(project.analysis_defaults())
