"""What Telltale asks a Prometheus (ours or a cluster's) and how it keeps the answers.

`capture_window` queries a cell's test window and writes
``<step dir>/prometheus/series.parquet`` — one row per sample: ``query``, ``labels`` (JSON),
``timestamp`` (UTC), ``value`` — so post-processing and replot read them offline, without the
server. The answers are untrusted: validated by pydantic (`QueryResult`), bounded in size
and points. The server itself is `tasks.observe.prometheus`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from core.errors import PermanentServiceError, TransientServiceError
from core.safeio import atomic_open, write_text

__all__ = ["CLUSTER_QUERIES", "LOCAL_QUERIES", "MAX_ANSWER", "MAX_POINTS", "QueryResult",
           "QueryTarget", "Series", "capture_window", "duration", "series_rows"]

logger = logging.getLogger("telltale.prometheus")

MAX_ANSWER = 64 * 1024 * 1024  # bytes of one query answer we accept
MAX_POINTS = 11_000  # Prometheus's own limit per series for a range query

# What the local platform records for every cell: the machine as the workload used it.
LOCAL_QUERIES: dict[str, str] = {
    "cpu_cores_used": 'sum(rate(node_cpu_seconds_total{mode!="idle"}[{window}]))',
    "memory_used_bytes": "node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes",
    "load1": "node_load1",
    # with prometheus-process-exporter: the workload's own processes
    "workload_cpu_cores": 'sum(rate(namedprocess_namegroup_cpu_seconds_total'
                          '{groupname="workload"}[{window}]))',
    "workload_memory_rss_bytes": 'sum(namedprocess_namegroup_memory_bytes'
                                 '{groupname="workload",memtype="resident"})',
}


# A cluster: the workload's pods (cAdvisor, through the kubelet) and their GPUs (NVIDIA's DCGM
# exporter; OpenShift labels each GPU series with the pod that holds it as exported_*).
# FB_USED is in MiB. {namespace} is checked to be a DNS label before it is written in.
CLUSTER_QUERIES: dict[str, str] = {
    "cpu_cores_used": 'sum(rate(container_cpu_usage_seconds_total{namespace="{namespace}",'
                      'container!="",container!="POD"}[{window}]))',
    "memory_used_bytes": 'sum(container_memory_working_set_bytes{namespace="{namespace}",'
                         'container!="",container!="POD"})',
    "gpu_util_percent": 'DCGM_FI_DEV_GPU_UTIL{exported_namespace="{namespace}"}',
    # what the validity check reads: the share of the pods' CFS periods throttled
    "cpu_throttled_share": 'sum(rate(container_cpu_cfs_throttled_periods_total{namespace='
                           '"{namespace}",container!=""}[{window}])) / sum(rate('
                           'container_cpu_cfs_periods_total{namespace="{namespace}",'
                           'container!=""}[{window}]))',
    "gpu_memory_used_bytes": 'DCGM_FI_DEV_FB_USED{exported_namespace="{namespace}"} '
                             '* 1048576',
    # energy (projects.library.energy): the board's power (W) and its total-energy counter
    # (mJ since the driver loaded; integrated over each KPI's own window at parse time)
    "gpu_power_watts": 'DCGM_FI_DEV_POWER_USAGE{exported_namespace="{namespace}"}',
    "gpu_energy_joules": 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{exported_namespace='
                         '"{namespace}"} / 1000',
}


class Series(BaseModel):
    """One series of a range query's answer."""

    metric: dict[str, str] = Field(default_factory=dict)
    values: list[tuple[float, str]] = Field(default_factory=list, max_length=MAX_POINTS)


class _Data(BaseModel):
    resultType: Literal["matrix"]  # noqa: N815 (Prometheus's field name)
    result: list[Series] = Field(default_factory=list, max_length=10_000)


class QueryResult(BaseModel):
    """The ``/api/v1/query_range`` answer (status ``success``)."""

    status: Literal["success"]
    data: _Data


def duration(seconds: float) -> str:
    """A Prometheus duration (integers only: "500ms", not "0.5s")."""
    return f"{max(int(round(seconds * 1000)), 1)}ms"


class QueryTarget(Protocol):
    """What `capture_window` needs of a server (`tasks.observe.prometheus.PrometheusServer`)."""

    url: str
    local: bool
    scrape_interval_s: float

    def query_range(self, query: str, start: datetime, end: datetime,
                    step_s: float) -> list[Series]:
        """The series of a range query."""
        ...

    def wait_sample_after(self, moment: datetime) -> None:
        """Wait until the server has scraped after ``moment``."""
        ...


def series_rows(name: str, series: Sequence[Series]) -> list[dict[str, Any]]:
    """Tidy rows (query, labels, timestamp, value) of one query's series."""
    rows = []
    for one in series:
        labels = json.dumps(one.metric, sort_keys=True)
        for stamp, value in one.values:
            try:
                number = float(value)
            except ValueError:
                continue
            rows.append({"query": name, "labels": labels, "timestamp": stamp, "value": number})
    return rows


def capture_window(prometheus: QueryTarget, queries: Mapping[str, str], start: datetime,
                   end: datetime, out_dir: Path) -> dict[str, Any]:
    """Query ``queries`` over [start, end] and write ``out_dir/series.parquet``.

    A query's ``{window}`` is replaced by a rate window of four scrape intervals. A query
    that fails is recorded in ``out_dir/capture.json`` and the others are still written.

    Returns:
        The capture summary (also in ``capture.json``): rows per query, errors.
    """
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    if prometheus.local and (end - start).total_seconds() < 4 * prometheus.scrape_interval_s:
        try:  # a cell shorter than the rate window: its last evaluation needs a new sample
            prometheus.wait_sample_after(end)
        except (TransientServiceError, PermanentServiceError) as exc:
            logger.warning("prometheus: %s", exc)  # the window is queried as it is
    window = duration(max(4 * prometheus.scrape_interval_s, 1.0))
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"url": prometheus.url, "start": start.isoformat(),
                               "end": end.isoformat(), "queries": {}, "errors": {}}
    span = (end - start).total_seconds()
    if prometheus.local and span < prometheus.scrape_interval_s:
        # what starts in the window (the process exporter's group of its workload) is seen
        # only by a scrape in it: a window shorter than the interval may hold none
        summary["warning"] = (
            f"a {span:.1f}-s window is shorter than the {prometheus.scrape_interval_s:g}-s "
            "scrape interval: what starts in it (the workload's own processes) may not be "
            "measured; lower observe.prometheus.scrape_interval_s")
        logger.warning("prometheus: %s", summary["warning"])
    for name, query in queries.items():
        text = query.replace("{window}", window)
        try:
            found = series_rows(name, prometheus.query_range(
                text, start, end, prometheus.scrape_interval_s))
        except (TransientServiceError, PermanentServiceError) as exc:
            summary["errors"][name] = str(exc)
            continue
        summary["queries"][name] = {"query": text, "rows": len(found)}
        rows += found
    frame = pd.DataFrame(rows, columns=["query", "labels", "timestamp", "value"])
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], unit="s", utc=True)
    with atomic_open(out_dir / "series.parquet") as stream:
        frame.to_parquet(stream, index=False)
    write_text(out_dir / "capture.json", json.dumps(summary, indent=2) + "\n")
    return summary
