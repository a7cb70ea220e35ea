"""The LTS (long-term storage) payload: one document per run for OpenSearch and archives.

Two modes:

- *investigate* (lenient): every field may be missing; what was parsed is kept.
- *cpt* (strict): `require_complete` refuses a payload with any empty metadata field or
  without KPIs, so nightly history never fills with half-documents.

``SCHEMA_VERSION`` changes when a field changes meaning; readers check it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from analysis.construct import constructor
from analysis.kpi import Kpi
from core.errors import ResultsError

__all__ = [
    "SCHEMA_VERSION",
    "LtsCurve",
    "LtsKpi",
    "LtsMetadata",
    "LtsPayload",
    "lts_json_schema",
    "require_complete",
]

SCHEMA_VERSION = "1.0"

RunStatus = Literal["success", "failed", "partial"]


class LtsMetadata(BaseModel):
    """Who, when and how: the run's identity."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = Field(default=SCHEMA_VERSION, description="Payload schema version.")
    project: str | None = Field(default=None, description="Project name.")
    run_uuid: str | None = Field(default=None, description="Unique id of the run (result dir).")
    start: str | None = Field(default=None, description="ISO-8601 start time.")
    end: str | None = Field(default=None, description="ISO-8601 end time.")
    presets: list[str] | None = Field(default=None, description="Presets applied.")
    config: str | None = Field(default=None, description="Resolved config as YAML (redacted).")
    settings: dict[str, Any] | None = Field(default=None, description="The cell's settings.")
    exit_code: int | None = Field(default=None, description="The run's exit code.")
    status: RunStatus | None = Field(default=None, description="success, failed or partial.")
    test_path: str | None = Field(default=None, description="Result dir, relative.")
    validity: Literal["valid", "invalid", "failed"] | None = Field(
        default=None, description="valid, invalid (a busy machine, a bottlenecked load "
        "generator...: see validity_reasons) or failed.")
    validity_reasons: list[str] = Field(default_factory=list, description="Why the run is "
                                        "not a valid measurement.")
    fingerprint: dict[str, str] = Field(default_factory=dict, description="The environment: "
                                        "package versions, data hashes, machine or cluster.")


class LtsKpi(BaseModel):
    """A KPI as stored: value plus its meaning and labels."""

    model_config = ConfigDict(extra="forbid")

    value: float
    unit: str
    help: str
    lower_better: bool
    ignored_for_regression: bool = False
    labels: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_kpi(cls, kpi: Kpi) -> LtsKpi:
        """Convert a computed `Kpi` (already validated: its labels are shared, not copied)."""
        return _new_lts_kpi(value=kpi.value, unit=kpi.unit, help=kpi.help,
                            lower_better=kpi.lower_better,
                            ignored_for_regression=kpi.ignored_for_regression,
                            labels=kpi.labels)


_new_lts_kpi = constructor(LtsKpi)


class LtsCurve(BaseModel):
    """The load sweep a cell belongs to, judged as one curve (`analysis.curve`)."""

    load: str = Field(description="The load label (concurrency).")
    verdict: str = Field(description="regression, improvement, unchanged or "
                         "insufficient_history: the curve's shape against its history.")
    load_range: list[float] | None = Field(default=None, description="The loads that moved.")
    explanation: str = ""
    history_curves: int = 0
    kpis: dict[str, float | None] = Field(default_factory=dict, description="knee_load, "
                                          "throughput_at_knee, frontier_throughput.")
    kpi_verdicts: dict[str, str] = Field(default_factory=dict)


class LtsPayload(BaseModel):
    """One run: metadata, parsed results, KPIs, and (once judged) regression verdicts."""

    model_config = ConfigDict(extra="forbid")

    metadata: LtsMetadata
    results: dict[str, Any] = Field(default_factory=dict, description="Parsed values.")
    kpis: dict[str, LtsKpi] = Field(default_factory=dict, description="KPI name → value.")
    regression: dict[str, Any] | None = Field(default=None, description="Verdict per KPI.")
    curve: LtsCurve | None = Field(default=None, description="The load sweep this cell is "
                                   "a point of, judged as one curve (None: not a sweep).")
    problems: list[str] = Field(default_factory=list, description="Parse problems, if any.")

    def missing_fields(self) -> list[str]:
        """Dotted names of the fields a strict (cpt) payload must have but this one lacks."""
        missing = [f"metadata.{name}" for name, value in self.metadata if value is None]
        if not self.kpis:
            missing.append("kpis")
        if not self.results:
            missing.append("results")
        return missing


def require_complete(payload: LtsPayload, mode: Literal["investigate", "cpt"]) -> None:
    """In cpt mode, refuse a payload with missing fields; in investigate mode, accept it.

    Raises:
        ResultsError: cpt mode and fields are missing (they are listed).
    """
    if mode != "cpt":
        return
    missing = payload.missing_fields()
    if missing:
        raise ResultsError(f"LTS payload of run {payload.metadata.run_uuid} is incomplete "
                           f"(cpt mode requires every field): {', '.join(missing)}")


def lts_json_schema() -> dict[str, Any]:
    """JSON schema of the LTS payload."""
    return LtsPayload.model_json_schema()
