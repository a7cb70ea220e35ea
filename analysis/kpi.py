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
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from analysis.construct import constructor

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BASE_COLUMNS",
    "Kpi",
    "KpiDefinition",
    "compute_kpis",
    "display_value",
    "kpi_table",
    "label_strings",
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
        return display_value(self.format, self.value)


def display_value(format: str, value: float) -> str:
    """``value`` in a KPI's display ``format`` (its plain text when the format does not fit)."""
    try:
        return format.format(value)
    except (ValueError, IndexError):
        return str(value)


_new_kpi = constructor(Kpi)  # every value typed: a validated definition or a finite float


def label_strings(labels: Mapping[str, Any]) -> dict[str, str]:
    """``labels`` as a dict of interned strings.

    Runs of one configuration repeat the same label values: interned, 10 000 runs share
    them instead of holding ~1.5 KB of copies each.
    """
    return {sys.intern(str(k)): sys.intern(str(v)) for k, v in labels.items()}


def _is_label_strings(labels: Mapping[str, Any]) -> bool:
    return type(labels) is dict and all(
        type(k) is str and type(v) is str for k, v in labels.items())


def compute_kpis(definitions: Sequence[KpiDefinition], result: Any,
                 labels: Mapping[str, str]) -> list[Kpi]:
    """Compute every KPI that has its inputs; skip those that do not (or are not finite).

    The KPIs of a run share one copy of its labels (read-only by convention): a dict per
    KPI, and again per LTS KPI, was 32 KB a run — 320 MB over 10 000 runs. A dict of
    strings (`label_strings`) is that copy itself.
    """
    out: list[Kpi] = []
    shared = labels if _is_label_strings(labels) else label_strings(labels)
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
        out.append(_new_kpi(
            name=definition.name, value=value, unit=definition.unit,
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


def kpi_table(rows: Iterable[tuple[str, str | None, Sequence[Kpi]]],
              run_columns: Mapping[str, Sequence[str | None]] | None = None) -> pd.DataFrame:
    """Build the tidy KPI table: one row per run × KPI, plus one column per label.

    Args:
        rows: ``(run_uuid, timestamp ISO string or None, kpis)`` per run.
        run_columns: More columns with one value per run (in the order of ``rows``), placed
            after the labels in the order given (`analysis.history.RUN_COLUMNS`).

    Returns:
        A DataFrame with `BASE_COLUMNS`, the label columns (sorted), then ``run_columns``.
        The label and run columns are dictionary-encoded text (pandas ``category``): a value
        is held once, not once a row — 34 of the 42 MB of a 10 000-run table were those
        copies. Every file stores them as text (`analysis.history_schema.write_parquet`,
        `normalised`); readers compare, group and sort them as they do text.
    """
    # imported here: a project's declaration imports this module, and every command line
    # reads one before it runs anything (pandas and NumPy: ~0.7 s)
    import numpy as np
    import pandas as pd

    # Run-level columns (uuid, timestamp, labels) are built once per run — once per
    # distinct labels dict, which a run's KPIs usually share — and expanded to the KPI rows
    # by position: a Python list per label column over every row held ~110 MB at 10 000
    # runs (90 000 rows x 36 labels) for a 45 MB table.
    uuids: list[str] = []
    stamps: list[str | None] = []
    label_sets: list[Mapping[str, Any]] = []
    run_of: list[int] = []  # per labels set: its run's position in ``rows``
    owner: list[int] = []  # per row: its position in uuids/stamps/label_sets
    names: list[str] = []
    values: list[float] = []
    units: list[str] = []
    lower: list[bool] = []
    ignored: list[bool] = []
    keys: set[str] = set()
    reserved = set(BASE_COLUMNS) | set(run_columns or ())
    for index, (run_uuid, timestamp, kpis) in enumerate(rows):
        current: object = None
        for kpi in kpis:
            if kpi.labels is not current:
                clash = kpi.labels.keys() & reserved
                if clash:
                    raise ValueError(f"label names clash with table columns: {sorted(clash)}")
                current = kpi.labels
                uuids.append(run_uuid)
                stamps.append(timestamp)
                label_sets.append(kpi.labels)
                run_of.append(index)
                keys.update(kpi.labels)
            owner.append(len(uuids) - 1)
            names.append(kpi.name)
            values.append(kpi.value)
            units.append(kpi.unit)
            lower.append(kpi.lower_better)
            ignored.append(kpi.ignored_for_regression)
    where = np.asarray(owner, dtype=np.intp)

    def encoded(column: list[str | None]) -> pd.Categorical:
        # categories of pandas text (not NumPy objects): decoded, a column is the text
        # column it was before; codes taken by row, never the strings
        kinds = pd.Index(pd.unique(pd.array(column, dtype="string")).dropna(), dtype="string")
        return pd.Categorical(column, categories=kinds.sort_values()).take(where)

    columns: dict[str, Any] = {
        "run_uuid": pd.array(uuids, dtype="string").take(where),
        "timestamp": pd.to_datetime(pd.Series(stamps, dtype="object"), utc=True,
                                    errors="coerce").array.take(where),
        "kpi": pd.array(names, dtype="string"),
        "value": np.asarray(values, dtype="float64"),
        "unit": pd.array(units, dtype="string"),
        "lower_better": np.asarray(lower, dtype=bool),
        "ignored_for_regression": np.asarray(ignored, dtype=bool),
    }
    for key in sorted(keys):
        columns[key] = encoded([_label_text(labels.get(key)) for labels in label_sets])
    for key, per_run in (run_columns or {}).items():
        columns[key] = encoded([per_run[index] for index in run_of])
    return pd.DataFrame(columns, copy=False)  # the arrays are new: no second copy


def _label_text(value: Any) -> str | None:
    return value if value is None or type(value) is str else str(value)
