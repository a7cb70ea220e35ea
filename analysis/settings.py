"""The ``analysis`` config block: where history lives and how runs are compared."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field

from analysis.regression import DEFAULTS, DetectorSettings
from analysis.strict import StrictSettings

__all__ = ["AnalysisSettings", "ComparisonSettings", "RegressionSettings"]


class ComparisonSettings(StrictSettings):
    """Which runs count as the same configuration when building a KPI's history."""

    ignored_labels: list[str] = Field(
        default_factory=list,
        description="Labels that may differ inside a history (platform versions, run ids...).",
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
    confirm_reruns: int = Field(
        default=0, ge=0, le=5,
        description=("Re-run a cell this many times when its newest run alone looks like a "
                     "regression, and judge the repeats together (0: never)."),
    )
    comparison: ComparisonSettings = Field(default_factory=ComparisonSettings)
    regression: RegressionSettings = Field(default_factory=RegressionSettings)
