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
from analysis.errors import UserError
from analysis.history import FINGERPRINT, VALIDITY

__all__ = ["filter_history", "kpi_lines", "run_lines", "to_csv_frame"]


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
        return frame[VALIDITY].fillna("valid")
    return pd.Series("valid", index=frame.index)


def run_lines(frame: pd.DataFrame) -> list[str]:
    """One line per run: start, uuid, validity, KPI count."""
    if frame.empty:
        return ["(no run)"]
    lines = [f"{'start (UTC)':<19} {'run':<36} {'validity':<8} kpis"]
    runs = frame.assign(shown_validity=_validity(frame)).groupby("run_uuid", sort=False)
    for run_uuid, rows in runs:
        lines.append(f"{_when(rows['timestamp'].iloc[0]):<19} {run_uuid!s:<36} "
                     f"{rows['shown_validity'].iloc[0]:<8} {len(rows)}")
    return lines


def kpi_lines(frame: pd.DataFrame) -> list[str]:
    """One line per KPI row: start, run (short), KPI, value and unit, validity."""
    if frame.empty:
        return ["(no KPI)"]
    lines = [f"{'start (UTC)':<19} {'run':<8} {'kpi':<36} {'value':>14} {'unit':<12} "
             "validity"]
    shown = frame.assign(shown_validity=_validity(frame))
    for row in shown[["timestamp", "run_uuid", "kpi", "value", "unit",
                      "shown_validity"]].itertuples(index=False):
        lines.append(f"{_when(row.timestamp):<19} {str(row.run_uuid)[:8]:<8} {row.kpi:<36} "
                     f"{row.value:>14.6g} {str(row.unit):<12} {row.shown_validity}")
    return lines


def to_csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows as a spreadsheet takes them: the fingerprint as JSON text, no empty labels."""
    out = frame.copy()
    if FINGERPRINT in out.columns:
        out[FINGERPRINT] = [value if isinstance(value, str) or value is None
                            else json.dumps(value, sort_keys=True) for value in out[FINGERPRINT]]
    return out.dropna(axis=1, how="all")
