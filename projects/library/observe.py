"""The ``observe`` block: what watches the platform while the workload runs (Prometheus)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from core.strict import StrictSettings

__all__ = ["ObserveBlock", "PrometheusBlock"]


class PrometheusBlock(StrictSettings):
    """Resource series of each cell's test window, kept with the artifacts."""

    mode: Literal["auto", "on", "off"] = Field(
        default="auto", description="Local platform: start a Prometheus and a node exporter "
        "for the run. auto: when both are installed; on: required (a clear error when "
        "missing); off: never.")
    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        # YAML 1.1 reads a bare `on`/`off` (`--var observe.prometheus.mode=on`) as a boolean
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value

    scrape_interval_s: float = Field(default=2.0, ge=0.2, le=60.0,
                                     description="Scrape interval of the local Prometheus.")
    ready_timeout_s: float = Field(default=120.0, ge=5.0, le=1800.0,
                                   description="How long the local Prometheus may take to "
                                   "start.")
    snapshot: bool = Field(default=True, description="Keep a TSDB snapshot of the run in "
                           "<run>/prometheus/data/snapshots (admin API).")
    url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$", description="Cluster "
                            "platform: the Prometheus to query (OpenShift: the Thanos "
                            "querier's route); None: no resource capture on a cluster.")
    verify_tls: bool = Field(default=True, description="Cluster: verify the server's "
                             "certificate.")


class ObserveBlock(StrictSettings):
    """Observability of the run."""

    prometheus: PrometheusBlock = Field(default_factory=PrometheusBlock)
