"""Energy over a KPI's own window, from the series a cell captured (any project, any platform).

Sources, by query name (the contract with the capture):

=====================  ==================================  =====================================
query                  local (`tasks.observe.energy`)      cluster (DCGM, via Prometheus)
=====================  ==================================  =====================================
``gpu_energy_joules``  NVML total-energy counter           ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
``gpu_power_watts``    NVML power draw                     ``DCGM_FI_DEV_POWER_USAGE``
``cpu_energy_joules``  RAPL package counters (unwrapped)   –
=====================  ==================================  =====================================

Energy is measured, never estimated: a counter's increase over the window (interpolated at
the window's edges), or, for a GPU whose counter is missing, its power samples integrated.
A window the samples cover for less than `MIN_COVERAGE` of its length gives nothing.
The window is the KPI's own (the training steps, the load window), not the process's: a
trainer's data preparation at idle power is not the training's energy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from analysis.kpi import KpiDefinition
from analysis.parsing import FileReader

__all__ = ["ENERGY_GLOB", "ENERGY_QUERIES", "EnergyUse", "Window", "energy_in_window",
           "energy_kpis", "kpi_window", "read_energy"]

ENERGY_GLOB = "*__observe__capture_energy"
ENERGY_FILE = "energy/series.parquet"
PROMETHEUS_GLOB = "*__observe__capture_prometheus"
PROMETHEUS_FILE = "prometheus/series.parquet"
COUNTERS = ("gpu_energy_joules", "cpu_energy_joules")
ENERGY_QUERIES = (*COUNTERS, "gpu_power_watts")
MIN_COVERAGE = 0.8
"""Share of the window the samples must span (a capture that started late measures less)."""


class EnergyUse(BaseModel):
    """What a window used (None: not measured)."""

    sources: list[str] = Field(default_factory=list, description="Series measured "
                               "(gpu_energy_joules, gpu_power_watts, cpu_energy_joules).")
    window_s: float = Field(description="The window's length.")
    energy_joules: float = Field(description="GPUs and CPU packages together.")
    gpu_energy_joules: float | None = None
    cpu_energy_joules: float | None = None
    power_watts_mean: float
    power_watts_max: float | None = Field(default=None, description="Highest sampled total "
                                          "power (None: a single sample interval).")


def energy_in_window(frame: Any, start: datetime, end: datetime) -> EnergyUse | None:
    """The energy the series in ``frame`` record over [start, end] (None: not measured).

    Args:
        frame: Tidy rows ``query``, ``labels``, ``timestamp`` (UTC), ``value``; rows of
            other queries are ignored.
        start: The window's start (aware).
        end: The window's end (aware).
    """
    import numpy as np
    import pandas as pd

    if frame is None or frame.empty or end <= start:
        return None
    frame = frame[frame["query"].isin(ENERGY_QUERIES)]
    if frame.empty:
        return None
    stamps = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce")
    frame = frame.assign(value=pd.to_numeric(frame["value"], errors="coerce"))[stamps.notna()]
    frame = frame.assign(t=(stamps[stamps.notna()] - pd.Timestamp(0, tz="UTC"))
                         .dt.total_seconds())
    frame = frame[np.isfinite(frame["value"])]
    t0, t1 = start.timestamp(), end.timestamp()
    per_query: dict[str, float] = {}
    power_at: dict[float, float] = {}
    countered_gpus: set[str] = set()
    covered = math.inf
    for (query, labels), series in frame.groupby(["query", "labels"], sort=True):
        series = series.sort_values("t")
        t, v = series["t"].to_numpy(), series["value"].to_numpy()
        lo, hi = max(t0, float(t[0])), min(t1, float(t[-1]))
        if len(t) < 2 or hi <= lo:
            continue
        covered = min(covered, (hi - lo) / (t1 - t0))
        inside = (t > lo) & (t < hi)
        ts = np.concatenate([[lo], t[inside], [hi]])
        vs = np.interp(ts, t, v)
        if query in COUNTERS:
            used = float(vs[-1] - vs[0])
            if used < 0:  # a counter reset (a driver reload): not a measurement
                return None
            if query == "gpu_energy_joules":
                countered_gpus.add(str(labels))
            rates = np.diff(vs) / np.diff(ts)
            if query == "cpu_energy_joules":
                for stamp, rate in zip(ts[1:], rates, strict=True):
                    power_at[float(stamp)] = power_at.get(float(stamp), 0.0) + float(rate)
        else:
            used = float(np.trapezoid(vs, ts))
            for stamp, watts in zip(ts, vs, strict=True):
                power_at[float(stamp)] = power_at.get(float(stamp), 0.0) + float(watts)
        per_query.setdefault(query, 0.0)
        per_query[query] += used
        per_query[f"{query}:{labels}"] = used
    if not per_query or covered < MIN_COVERAGE:
        return None
    gpu = None
    if "gpu_energy_joules" in per_query or "gpu_power_watts" in per_query:
        # a GPU's counter wins over its integrated power; power counts for GPUs without one
        gpu = per_query.get("gpu_energy_joules", 0.0) + sum(
            used for key, used in per_query.items()
            if key.startswith("gpu_power_watts:") and key.split(":", 1)[1] not in countered_gpus)
    cpu = per_query.get("cpu_energy_joules")
    total = (gpu or 0.0) + (cpu or 0.0)
    window = t1 - t0
    return EnergyUse(sources=sorted(q for q in per_query if ":" not in q), window_s=window,
                     energy_joules=total, gpu_energy_joules=gpu, cpu_energy_joules=cpu,
                     power_watts_mean=total / window,
                     power_watts_max=max(power_at.values()) if len(power_at) > 1 else None)


Window = tuple[datetime | None, datetime | None]
"""A KPI's own window; ``(None, None)``: unknown."""


def kpi_window(start: float | datetime | None = None, end: float | datetime | None = None,
               *, seconds: float | None = None) -> Window:
    """A KPI's window from a result's own numbers: epoch seconds, aware datetimes, a length.

    Two of ``start``, ``end`` and ``seconds`` make it. The numbers come from an untrusted
    tree: one that is not a time (NaN, a length of 1e40 s, a year past 9999, a negative
    length, a naive datetime) gives ``(None, None)``, never an exception. Every parser builds
    its windows here (a test holds them to it).
    """
    try:
        first, last = _moment(start), _moment(end)
        if seconds is not None:
            if not math.isfinite(seconds) or seconds < 0:
                return None, None
            if first is None and last is not None:
                first = last - timedelta(seconds=seconds)
            elif first is not None and last is None:
                last = first + timedelta(seconds=seconds)
    except (OverflowError, ValueError, OSError, TypeError):
        return None, None
    return (first, last) if first is not None and last is not None else (None, None)


def _moment(value: float | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo is not None else None
    return datetime.fromtimestamp(value, UTC) if math.isfinite(value) else None


def read_energy(reader: FileReader, start: datetime | None, end: datetime | None
                ) -> EnergyUse | None:
    """The energy a cell's captures record over [start, end]; None when not measured.

    Reads the local capture (``*__observe__capture_energy``) and the Prometheus capture
    (DCGM's series on a cluster); a file that is there but unreadable is a parse problem.
    """
    if start is None or end is None:
        return None
    import pandas as pd

    frames = []
    for pattern, name in ((ENERGY_GLOB, ENERGY_FILE), (PROMETHEUS_GLOB, PROMETHEUS_FILE)):
        step = reader.glob(pattern)
        if step is None:
            continue
        frame = reader.table(f"{step}/{name}", required=False)
        if frame is not None and not frame.empty and {"query", "labels", "timestamp",
                                                        "value"} <= set(frame.columns):
            frames.append(frame[["query", "labels", "timestamp", "value"]])
    if not frames:
        return None
    return energy_in_window(pd.concat(frames, ignore_index=True), start, end)


def energy_kpis(energy: Callable[[Any], EnergyUse | None],
                tokens: Callable[[Any], float | None], tokens_help: str) -> list[KpiDefinition]:
    """The energy KPI family for a project whose result holds an `EnergyUse`.

    Args:
        energy: The result's energy over its KPI window (None: not measured: no KPI).
        tokens: The tokens that window processed (for ``joules_per_token``).
        tokens_help: Which tokens those are, for the help text.
    """
    def field(name: str) -> Callable[[Any], float | None]:
        def compute(result: Any) -> float | None:
            found = energy(result)
            return None if found is None else getattr(found, name)
        return compute

    def per_token(result: Any) -> float | None:
        found, count = energy(result), tokens(result)
        return found.energy_joules / count if found is not None and count else None

    measured = ("measured (NVML or DCGM for GPUs, RAPL for CPU packages) over the KPI's own "
                "window; absent when nothing was measurable")
    return [
        KpiDefinition("energy_joules", f"Energy used, {measured}", "J", True,
                      field("energy_joules"), format="{:,.0f}"),
        KpiDefinition("joules_per_token", f"Energy per token ({tokens_help}), {measured}",
                      "J/token", True, per_token, format="{:.4g}"),
        KpiDefinition("power_watts_mean", f"Average power, {measured}", "W", True,
                      field("power_watts_mean"), format="{:,.1f}"),
        KpiDefinition("power_watts_max", f"Peak sampled power, {measured}", "W", True,
                      field("power_watts_max"), format="{:,.1f}"),
    ]
