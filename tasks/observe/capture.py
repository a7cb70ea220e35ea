"""The capture step both platforms run after each cell, and the cluster's Prometheus client."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from core.errors import ConfigError
from core.safeio import read_text_bounded
from projects.library.observe import PrometheusBlock
from projects.library.secrets import SecretsBlock
from tasks.artifacts import artifact_dir, step
from tasks.observe.energy import write_series
from tasks.observe.prometheus import PrometheusServer
from tasks.observe.promql import CLUSTER_QUERIES, capture_window
from tasks.secrets import secret_file

__all__ = ["capture_energy", "capture_prometheus", "cluster_prometheus", "cluster_queries"]

logger = logging.getLogger("telltale.prometheus")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@step("observe", timeout_seconds=600)
def capture_prometheus(prometheus: PrometheusServer, queries: Mapping[str, str],
                       start: datetime, end: datetime) -> dict[str, Any]:
    """The cell's test window from Prometheus, as ``prometheus/series.parquet`` here."""
    summary = capture_window(prometheus, queries, start, end, artifact_dir() / "prometheus")
    if summary["errors"]:
        logger.warning("prometheus capture: %s", summary["errors"])
    return summary


@step("observe", timeout_seconds=120)
def capture_energy(rows: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    """The energy meters' samples of the cell's window, as ``energy/series.parquet`` here."""
    return write_series(rows, artifact_dir() / "energy", sources)


def cluster_queries(namespace: str) -> dict[str, str]:
    """`CLUSTER_QUERIES` for the workload's namespace (refused unless a DNS label)."""
    if not _DNS_LABEL.fullmatch(namespace):
        raise ConfigError(f"namespace {namespace!r} is not a DNS label: not written into a "
                          "Prometheus query", key="tests.namespace")
    return {name: query.replace("{namespace}", namespace)
            for name, query in CLUSTER_QUERIES.items()}


def cluster_prometheus(block: PrometheusBlock, secrets: SecretsBlock) -> PrometheusServer | None:
    """The cluster's Prometheus (``observe.prometheus.url``) with its token, or None.

    None when no URL is configured.

    Raises:
        ConfigError: The token file is configured but missing or empty.
    """
    if not block.url:
        return None
    token = None
    path = secret_file(secrets.dir.env_key, secrets.prometheus_token)
    if path is not None:
        token = read_text_bounded(path, 64 * 1024, what="secret file",
                                  follow_links=True).strip()  # a mounted secret: a link
        if not token:
            raise ConfigError(f"secret file {secrets.prometheus_token!r} is empty",
                              key="secrets.prometheus_token")
    return PrometheusServer(block.url, token=token, verify_tls=block.verify_tls,
                            scrape_interval_s=15.0)
