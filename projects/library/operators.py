"""The ``prepare`` block: operators installed through OLM before the test."""

from __future__ import annotations

from pydantic import Field

from core.strict import DnsSubdomain, ImageRef, StrictSettings

__all__ = ["GpuOperatorBlock", "NfdBlock", "PrepareBlock", "RhoaiBlock"]


class RhoaiBlock(StrictSettings):
    """Red Hat OpenShift AI (with its service-mesh dependency)."""

    enabled: bool = Field(default=False, description="Install RHOAI and a DataScienceCluster.")
    channel: str = Field(default="stable", description="OLM channel.")
    version: DnsSubdomain | None = Field(
        default=None, description="Pinned CSV (its name, e.g. rhods-operator.2.25.0; manual "
        "approval).")
    catalog_image: ImageRef | None = Field(default=None, description="Custom CatalogSource image.")
    components: list[str] = Field(
        default_factory=lambda: ["trainingoperator", "dashboard"],
        description="DataScienceCluster components set to Managed.",
    )
    # cleanup reads it whether or not this run installs RHOAI (remove an earlier install)
    uninstall: bool = Field(default=False, description="Uninstall in cleanup.",
                            json_schema_extra={"used_when_disabled": True})


class NfdBlock(StrictSettings):
    """Node Feature Discovery."""

    enabled: bool = Field(default=False, description="Install NFD and a NodeFeatureDiscovery.")
    channel: str = Field(default="stable", description="OLM channel.")


class GpuOperatorBlock(StrictSettings):
    """NVIDIA GPU operator."""

    enabled: bool = Field(default=False, description="Install the GPU operator + ClusterPolicy.")
    channel: str = Field(default="stable", description="OLM channel.")
    version: DnsSubdomain | None = Field(
        default=None, description="Pinned CSV (its name, e.g. gpu-operator-certified.v25.3.0).")
    time_sharing_replicas: int | None = Field(
        default=None, ge=2, le=128, description="GPU time-sharing replicas per GPU."
    )
    extended_dcgm_metrics: bool = Field(default=False, description="Enable extended DCGM metrics.")
    tolerations: list[dict[str, str]] = Field(
        default_factory=list, description="Tolerations added to the operator's DaemonSets."
    )


class PrepareBlock(StrictSettings):
    """Cluster preparation."""

    enabled: bool = Field(default=True, description="Run the prepare phase.")
    rhoai: RhoaiBlock = Field(default_factory=RhoaiBlock)
    nfd: NfdBlock = Field(default_factory=NfdBlock)
    gpu_operator: GpuOperatorBlock = Field(default_factory=GpuOperatorBlock)
