"""Resource usage of a cell, from the Prometheus series captured with it (any project).

The capture (``tasks.observe.prometheus.capture_window``) leaves
``<cell>/NNN__observe__capture_prometheus/prometheus/series.parquet``: tidy rows ``query``,
``labels``, ``timestamp``, ``value``. Query names are the contract between capture and parse:

=========================  =====================================  ===========================
name                       local platform                         cluster
=========================  =====================================  ===========================
``cpu_cores_used``         node CPU, all but idle                 workload pods (cAdvisor)
``memory_used_bytes``      node memory, total - available         pods' working set
``gpu_util_percent``       –                                      DCGM ``DCGM_FI_DEV_GPU_UTIL``
``gpu_memory_used_bytes``  –                                      DCGM ``DCGM_FI_DEV_FB_USED``
=========================  =====================================  ===========================

Several series of one query (GPUs, pods) are summed per instant, except utilisation, which
is averaged. The parser reads only the file: ``python -m analysis`` and replot need no
server.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from analysis.kpi import KpiDefinition
from analysis.parsing import FileReader

__all__ = ["CAPTURE_GLOB", "SERIES_FILE", "ResourceTimeline", "ResourceUsage", "read_resources",
           "resource_kpis", "timeline_rows"]

CAPTURE_GLOB = "*__observe__capture_prometheus"
SERIES_FILE = "prometheus/series.parquet"
_GB = 1e9
_MEAN_QUERIES = {"gpu_util_percent"}


class ResourceTimeline(BaseModel):
    """The cell's resource series, column by column (seconds from the window's start)."""

    t_s: list[float] = Field(default_factory=list)
    cpu_cores_used: list[float | None] = Field(default_factory=list)
    memory_used_bytes: list[float | None] = Field(default_factory=list)
    gpu_util_percent: list[float | None] = Field(default_factory=list)
    gpu_memory_used_bytes: list[float | None] = Field(default_factory=list)
    workload_cpu_cores: list[float | None] = Field(default_factory=list)
    workload_memory_rss_bytes: list[float | None] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t_s)


class ResourceUsage(BaseModel):
    """What the cell cost, summarised (None: not measured)."""

    samples: int = 0
    cpu_cores_mean: float | None = None
    cpu_cores_max: float | None = None
    memory_used_max_bytes: float | None = None
    gpu_util_mean: float | None = None
    gpu_memory_max_bytes: float | None = None
    workload_cpu_cores_mean: float | None = None
    workload_memory_rss_max_bytes: float | None = None


def _finite(values: Any) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def read_resources(reader: FileReader) -> tuple[ResourceUsage, ResourceTimeline] | None:
    """The resource usage captured in a cell dir, and its timeline; None without a capture.

    A capture that is there but unreadable is a parse problem (the reader records it). The
    timeline is apart: only the newest runs' report pages need it (a project's ``bulky``).
    """
    step = reader.glob(CAPTURE_GLOB)
    if step is None:
        return None
    frame = reader.table(f"{step}/{SERIES_FILE}", required=False)
    if frame is None or frame.empty:
        return None
    missing = {"query", "timestamp", "value"} - set(frame.columns)
    if missing:
        reader.problem(f"{step}/{SERIES_FILE}", f"missing columns: {sorted(missing)}")
        return None
    import pandas as pd

    frame = frame[frame["query"].isin(ResourceTimeline.model_fields.keys() - {"t_s"})]
    frame = frame.assign(value=pd.to_numeric(frame["value"], errors="coerce"),
                         timestamp=pd.to_datetime(frame["timestamp"], utc=True, errors="coerce"))
    frame = frame.dropna(subset=["timestamp"])
    if frame.empty:
        return None
    sums = frame[~frame["query"].isin(_MEAN_QUERIES)].pivot_table(
        index="timestamp", columns="query", values="value", aggfunc="sum")
    means = frame[frame["query"].isin(_MEAN_QUERIES)].pivot_table(
        index="timestamp", columns="query", values="value", aggfunc="mean")
    wide = pd.concat([sums, means], axis=1).sort_index()
    start = wide.index[0]
    columns: dict[str, list[float | None]] = {}
    for name in ResourceTimeline.model_fields:
        if name == "t_s":
            continue
        column = wide[name] if name in wide.columns else None
        columns[name] = [None if column is None or pd.isna(v) else float(v)
                         for v in (column if column is not None else [None] * len(wide))]
    timeline = ResourceTimeline(
        t_s=[round((t - start).total_seconds(), 3) for t in wide.index], **columns)
    cpu = _finite(timeline.cpu_cores_used)
    memory = _finite(timeline.memory_used_bytes)
    gpu = _finite(timeline.gpu_util_percent)
    gpu_memory = _finite(timeline.gpu_memory_used_bytes)
    workload_cpu = _finite(timeline.workload_cpu_cores)
    workload_rss = _finite(timeline.workload_memory_rss_bytes)
    return ResourceUsage(
        samples=len(timeline),
        cpu_cores_mean=sum(cpu) / len(cpu) if cpu else None,
        cpu_cores_max=max(cpu) if cpu else None,
        memory_used_max_bytes=max(memory) if memory else None,
        gpu_util_mean=sum(gpu) / len(gpu) if gpu else None,
        gpu_memory_max_bytes=max(gpu_memory) if gpu_memory else None,
        workload_cpu_cores_mean=sum(workload_cpu) / len(workload_cpu) if workload_cpu else None,
        workload_memory_rss_max_bytes=max(workload_rss) if workload_rss else None), timeline


def resource_kpis(usage: Callable[[Any], ResourceUsage | None],
                  tokens_per_second: Callable[[Any], float | None] | None = None,
                  ) -> list[KpiDefinition]:
    """The resource KPI family, for a project whose result holds a `ResourceUsage`.

    Args:
        usage: The result's resource usage (None: not measured: no KPI).
        tokens_per_second: The workload's throughput, for the efficiency KPI.
    """
    def field(name: str, scale: float = 1.0) -> Callable[[Any], float | None]:
        def compute(result: Any) -> float | None:
            found = usage(result)
            value = getattr(found, name) if found is not None else None
            return None if value is None else value / scale
        return compute

    kpis = [
        KpiDefinition("cpu_cores_used_mean", "CPU cores in use over the test window (mean)",
                      "cores", True, field("cpu_cores_mean"), format="{:.2f}"),
        KpiDefinition("cpu_cores_used_max", "CPU cores in use over the test window (max)",
                      "cores", True, field("cpu_cores_max"), format="{:.2f}"),
        KpiDefinition("memory_used_max", "Memory in use over the test window (max)", "GB",
                      True, field("memory_used_max_bytes", _GB), format="{:.2f}"),
        KpiDefinition("gpu_utilization_mean", "GPU utilisation over the test window (mean)",
                      "%", False, field("gpu_util_mean"), format="{:.1f}"),
        KpiDefinition("gpu_memory_used_max", "GPU memory in use over the test window (max)",
                      "GB", True, field("gpu_memory_max_bytes", _GB), format="{:.2f}"),
        KpiDefinition("workload_cpu_cores_mean", "CPU cores the workload's own processes "
                      "used (mean; local platform with process-exporter)", "cores", True,
                      field("workload_cpu_cores_mean"), format="{:.2f}"),
        KpiDefinition("workload_memory_rss_max", "Resident memory of the workload's own "
                      "processes (max)", "GB", True, field("workload_memory_rss_max_bytes",
                                                             _GB), format="{:.2f}"),
    ]
    if tokens_per_second is not None:
        rate = tokens_per_second

        def per_core(result: Any) -> float | None:
            found, tps = usage(result), rate(result)
            cores = found.cpu_cores_mean if found is not None else None
            return tps / cores if tps is not None and cores else None

        kpis.append(KpiDefinition("tokens_per_cpu_core_second", "Throughput per CPU core in "
                                  "use: tokens per core-second", "tokens/core/s", False,
                                  per_core, format="{:,.1f}"))
    return kpis


_DISPLAY = {"cpu_cores_used": ("CPU cores in use", 1.0),
            "memory_used_bytes": ("memory in use (GB)", _GB),
            "gpu_util_percent": ("GPU utilisation (%)", 1.0),
            "gpu_memory_used_bytes": ("GPU memory in use (GB)", _GB),
            "workload_cpu_cores": ("workload CPU cores", 1.0),
            "workload_memory_rss_bytes": ("workload resident memory (GB)", _GB)}


def timeline_rows(timeline: ResourceTimeline) -> list[dict[str, Any]]:
    """Rows ``{t_s, metric, value}`` for the resources report (display names and units)."""
    rows = []
    for name, (label, scale) in _DISPLAY.items():
        for t, value in zip(timeline.t_s, getattr(timeline, name), strict=False):
            if value is not None:
                rows.append({"t_s": t, "metric": label, "value": value / scale})
    return rows
