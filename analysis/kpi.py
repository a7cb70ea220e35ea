"""KPIs: declarative definitions, computed values, OpenMetrics text and the tidy table.

A `KpiDefinition` says what a KPI means (name, help, unit, direction, whether regression
analysis ignores it, a divisor and a display format) and how to compute it from a parsed
result. `compute_kpis` applies the definitions; a KPI whose inputs are missing is left out
(and the run keeps its parse problems), never reported as zero.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

__all__ = [
    "BASE_COLUMNS",
    "Kpi",
    "KpiDefinition",
    "compute_kpis",
    "kpi_table",
    "openmetrics_lines",
    "to_openmetrics",
]

BASE_COLUMNS = ["run_uuid", "timestamp", "kpi", "value", "unit", "lower_better",
                "ignored_for_regression"]


@dataclass(frozen=True)
class KpiDefinition:
    """What a KPI is and how to compute it.

    Attributes:
        name: Metric name (``[a-zA-Z_][a-zA-Z0-9_]*``).
        help: One-line meaning.
        unit: Display unit (``tokens/s``).
        lower_better: Direction: True when a lower value is better.
        compute: Parsed result → raw value, or None when it cannot be computed.
        ignored_for_regression: Reported but never judged (e.g. a dataset property).
        divisor: The raw value is divided by this (e.g. 1e6 for "M tokens").
        format: Display format for reports.
    """

    name: str
    help: str
    unit: str
    lower_better: bool
    compute: Callable[[Any], float | None]
    ignored_for_regression: bool = False
    divisor: float = 1.0
    format: str = "{:.3f}"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.name):
            raise ValueError(f"invalid KPI name {self.name!r}")
        if self.divisor == 0:
            raise ValueError(f"KPI {self.name}: divisor must not be 0")


class Kpi(BaseModel):
    """One computed KPI value with its metadata and the run's labels."""

    name: str
    value: float
    unit: str
    help: str
    lower_better: bool
    ignored_for_regression: bool = False
    format: str = "{:.3f}"
    labels: dict[str, str] = Field(default_factory=dict)

    def display(self) -> str:
        """The value formatted for humans."""
        try:
            return self.format.format(self.value)
        except (ValueError, IndexError):
            return str(self.value)


_KPI_FIELDS = set(Kpi.model_fields)  # one set shared by every constructed Kpi (all fields set)


def compute_kpis(definitions: Sequence[KpiDefinition], result: Any,
                 labels: Mapping[str, str]) -> list[Kpi]:
    """Compute every KPI that has its inputs; skip those that do not (or are not finite).

    The KPIs of a run share one copy of its labels (read-only by convention): a dict per
    KPI, and again per LTS KPI, was 32 KB a run — 320 MB over 10 000 runs.
    """
    out: list[Kpi] = []
    shared = {str(k): str(v) for k, v in labels.items()}
    for definition in definitions:
        try:
            raw = definition.compute(result)
        except (ArithmeticError, TypeError, ValueError):
            raw = None
        if raw is None:
            continue
        value = float(raw) / definition.divisor
        if not math.isfinite(value):
            continue
        # every field comes from a validated KpiDefinition or is the float above
        out.append(Kpi.model_construct(
            _fields_set=_KPI_FIELDS, name=definition.name, value=value, unit=definition.unit,
            help=definition.help, lower_better=definition.lower_better,
            ignored_for_regression=definition.ignored_for_regression,
            format=definition.format, labels=shared))
    return out


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@functools.lru_cache(maxsize=4096)  # a few label names, repeated on every sample
def _label_name(name: str) -> str:
    clean = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    return clean if re.match(r"[a-zA-Z_]", clean) else f"_{clean}"


def openmetrics_lines(kpis: Iterable[Kpi], *, prefix: str = "") -> Iterator[str]:
    """OpenMetrics text line by line (gauges with HELP, one sample per run, ``# EOF``).

    A generator, so 10 000 runs are written to a file without a 70 MB string in memory.
    """
    by_name: dict[str, list[Kpi]] = {}
    for kpi in kpis:
        by_name.setdefault(kpi.name, []).append(kpi)
    label_text: dict[int, str] = {}  # the runs' KPIs share their labels: render them once
    for name, group in by_name.items():
        metric = f"{prefix}{name}"
        first = group[0]
        direction = "lower is better" if first.lower_better else "higher is better"
        help_text = f"{first.help} [{first.unit}, {direction}]".replace("\\", "\\\\")
        yield f"# TYPE {metric} gauge\n"
        yield f"# HELP {metric} {help_text}\n"
        for kpi in group:
            labels = label_text.get(id(kpi.labels))
            if labels is None:
                labels = ",".join(f'{_label_name(k)}="{_escape_label(str(v))}"'
                                  for k, v in sorted(kpi.labels.items()))
                if len(label_text) < 100_000:
                    label_text[id(kpi.labels)] = labels
            yield (f"{metric}{{{labels}}} {kpi.value!r}\n" if labels
                   else f"{metric} {kpi.value!r}\n")
    yield "# EOF\n"


def to_openmetrics(kpis: Iterable[Kpi], *, prefix: str = "") -> str:
    """Render KPIs as OpenMetrics text (see `openmetrics_lines`)."""
    return "".join(openmetrics_lines(kpis, prefix=prefix))


def kpi_table(rows: Iterable[tuple[str, str | None, Sequence[Kpi]]]) -> pd.DataFrame:
    """Build the tidy KPI table: one row per run × KPI, plus one column per label.

    Args:
        rows: ``(run_uuid, timestamp ISO string or None, kpis)`` per run.

    Returns:
        A DataFrame with `BASE_COLUMNS` then the label columns (strings, sorted).
    """
    # Column by column: a dict per row (90 000 rows for 10 000 runs) held ~230 MB, and a
    # run's label strings are shared by its rows instead of copied into each.
    uuids: list[str] = []
    stamps: list[str | None] = []
    names: list[str] = []
    values: list[float] = []
    units: list[str] = []
    lower: list[bool] = []
    ignored: list[bool] = []
    labels: dict[str, list[str | None]] = {}
    reserved = set(BASE_COLUMNS)
    count = 0
    for run_uuid, timestamp, kpis in rows:
        checked: object = None  # a run's KPIs usually share one labels dict: checked once
        for kpi in kpis:
            if kpi.labels is not checked:
                clash = kpi.labels.keys() & reserved
                if clash:
                    raise ValueError(f"label names clash with table columns: {sorted(clash)}")
                checked = kpi.labels
            uuids.append(run_uuid)
            stamps.append(timestamp)
            names.append(kpi.name)
            values.append(kpi.value)
            units.append(kpi.unit)
            lower.append(kpi.lower_better)
            ignored.append(kpi.ignored_for_regression)
            for key, value in kpi.labels.items():
                column = labels.get(key)
                if column is None:
                    column = labels[key] = [None] * count
                column.append(value if type(value) is str else str(value))
            count += 1
            if len(labels) > len(kpi.labels):  # labels this KPI lacks
                for column in labels.values():
                    if len(column) < count:
                        column.append(None)
    frame = pd.DataFrame({"run_uuid": uuids, "timestamp": stamps, "kpi": names,
                          "value": values, "unit": units, "lower_better": lower,
                          "ignored_for_regression": ignored,
                          **{k: labels[k] for k in sorted(labels)}})
    if frame.empty:
        frame = pd.DataFrame(columns=BASE_COLUMNS)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce")
    frame["value"] = frame["value"].astype("float64")
    frame["lower_better"] = frame["lower_better"].astype(bool)
    frame["ignored_for_regression"] = frame["ignored_for_regression"].astype(bool)
    for column in ["run_uuid", "kpi", "unit", *labels]:
        frame[column] = frame[column].astype("string")
    return frame
