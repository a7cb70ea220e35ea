"""What a history holds, filtered: one line per run, or one row per KPI; CSV for a sheet.

``python -m analysis history --history URI [--select SPEC]... [--kpi NAME]... [--kpis]
[--csv PATH]``: selections are those of ``compare`` (run uuids, ``label=value`` terms, time
windows ``START..END``), all of them applied (an intersection). Invalid and failed runs are
listed too, marked: the history keeps them (they are never a baseline).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import pandas as pd

from analysis.compare import select_runs
from analysis.history import CELL, FINGERPRINT, VALIDITY
from core.errors import UserError

__all__ = ["filter_history", "kpi_lines", "run_folder_id", "run_lines", "to_csv_frame"]


def filter_history(frame: pd.DataFrame, selections: Sequence[str] = (),
                   kpis: Iterable[str] = ()) -> pd.DataFrame:
    """The rows every selection picks (and only the named KPIs), newest first.

    Raises:
        UserError: A malformed selection, or one that picks nothing.
    """
    chosen = frame
    for spec in selections:
        chosen, _ = select_runs(chosen, spec)
    wanted = set(kpis)
    if wanted:
        unknown = wanted - set(chosen["kpi"])
        if unknown:
            raise UserError(f"no KPI {', '.join(sorted(unknown))} in the selected runs; "
                            f"they have: {', '.join(sorted(set(chosen['kpi'])))}")
        chosen = chosen[chosen["kpi"].isin(wanted)]
    order = pd.to_datetime(chosen["timestamp"], utc=True)
    return chosen.assign(_order=order).sort_values(["_order", "run_uuid", "kpi"],
                                                   ascending=[False, True, True]) \
        .drop(columns="_order")


def _when(value: object) -> str:
    stamp = pd.Timestamp(value)
    return stamp.strftime("%Y-%m-%d %H:%M:%S") if not pd.isna(stamp) else "?"


def _validity(frame: pd.DataFrame) -> pd.Series:
    if VALIDITY in frame.columns:
        return frame[VALIDITY].astype("object").fillna("valid")  # encoded or text alike
    return pd.Series("valid", index=frame.index)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A per-run column, or empty texts where an older history has none."""
    if name in frame.columns:
        return frame[name].astype("object").where(frame[name].notna(), "")
    return pd.Series("", index=frame.index, dtype="object")


def _cells(frame: pd.DataFrame) -> pd.Series:
    """Each row's cell name; an older history's rows (no name stored) show their dir."""
    names, dirs = _column(frame, CELL), _column(frame, "test_path")
    return names.where(names != "", dirs)


def run_folder_id(run_id: object, run_uuid: object) -> str:
    """The id a run's folder name ends with (``…-fine_tuning-25f0bdb0``).

    Its flow run id's first 8 characters; a run without one (imported results) shows its
    uuid's first 8.
    """
    text = str(run_id) if run_id not in (None, "") and not pd.isna(run_id) else str(run_uuid)
    return text[:8]


def run_lines(frame: pd.DataFrame) -> list[str]:
    """One line per run: start, run folder id, cell, uuid, validity, KPI count.

    The run folder id and the cell are what the terminal printed when the run ended
    (``artifacts : runs/20261126-231016-fine_tuning-25f0bdb0``, ``cell base``); the uuid is
    what ``accept`` and ``compare`` take (a run folder id works there too).
    """
    if frame.empty:
        return ["(no run)"]
    lines = [f"{'start (UTC)':<19} {'run':<8} {'cell':<16} {'uuid':<36} {'validity':<8} kpis"]
    shown = frame.assign(shown_validity=_validity(frame), shown_run=_column(frame, "run_id"),
                         shown_cell=_cells(frame))
    for run_uuid, rows in shown.groupby("run_uuid", sort=False):
        first = rows.iloc[0]
        cell = str(first["shown_cell"])
        lines.append(f"{_when(first['timestamp']):<19} "
                     f"{run_folder_id(first['shown_run'], run_uuid):<8} {cell[:16]:<16} "
                     f"{run_uuid!s:<36} {first['shown_validity']:<8} {len(rows)}")
    return lines


def kpi_lines(frame: pd.DataFrame) -> list[str]:
    """One line per KPI row: start, run (short), KPI, value and unit, validity."""
    if frame.empty:
        return ["(no KPI)"]
    lines = [f"{'start (UTC)':<19} {'run':<8} {'cell':<16} {'kpi':<36} {'value':>14} "
             f"{'unit':<12} validity"]
    shown = frame.assign(shown_validity=_validity(frame), shown_run=_column(frame, "run_id"),
                         shown_cell=_cells(frame))
    for row in shown[["timestamp", "run_uuid", "shown_run", "shown_cell", "kpi", "value",
                      "unit", "shown_validity"]].itertuples(index=False):
        lines.append(f"{_when(row.timestamp):<19} "
                     f"{run_folder_id(row.shown_run, row.run_uuid):<8} "
                     f"{str(row.shown_cell)[:16]:<16} {row.kpi:<36} "
                     f"{row.value:>14.6g} {str(row.unit):<12} {row.shown_validity}")
    return lines


def to_csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows as a spreadsheet takes them: the fingerprint as JSON text, no empty labels."""
    out = frame.copy()
    if FINGERPRINT in out.columns:
        out[FINGERPRINT] = [value if isinstance(value, str) or value is None
                            else json.dumps(value, sort_keys=True) for value in out[FINGERPRINT]]
    return out.dropna(axis=1, how="all")
