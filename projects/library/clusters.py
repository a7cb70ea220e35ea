"""The ``clusters`` block: platform choice, cluster creation and bare-metal leases."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StringConstraints, model_validator

from analysis.strict import StrictSettings

__all__ = ["ClustersBlock", "CreateBlock", "QuadsLabBlock", "SutestBlock"]


def _number_as_text(value: Any) -> Any:
    """A ticket typed as a number (``8001``) is the usual case: keep it as text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class QuadsLabBlock(StrictSettings):
    """A QUADS self-scheduling request."""

    enabled: bool = Field(default=False, description="Lease hosts from QUADS first.")
    count: int = Field(default=1, ge=1, le=10, description="Hosts to lease (≤ 10 per cloud).")
    filters: dict[str, Any] = Field(
        default_factory=dict, description="Host metadata filters, e.g. {model: R640}."
    )
    description: str = Field(default="telltale CPT run", description="Assignment description.")
    wipe: bool = Field(default=True, description="Wipe the hosts before delivery.")
    cc_users: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]] = Field(
        default_factory=list, max_length=20, description="Other users (e-mail local parts) "
        "QUADS copies on the assignment's notifications.")
    ticket: Annotated[str | None, BeforeValidator(_number_as_text)] = Field(
        default=None, description="JIRA ticket of the assignment: the number (8001) or the "
        "key; QUADS stores the number.")
    wait_hosts_minutes: int = Field(
        default=60, ge=0, le=7 * 24 * 60, description="How long to wait for enough free hosts."
    )
    wait_delivery_minutes: int = Field(
        default=240, ge=1, le=7 * 24 * 60, description="Deadline for provisioned+validated."
    )
    poll_seconds: float = Field(default=60.0, gt=0, le=3600, description="QUADS polling period.")


class SutestBlock(StrictSettings):
    """The system-under-test cluster."""

    is_metal: bool = Field(default=False, description="Bare-metal cluster (lease, install).")
    lab: QuadsLabBlock = Field(default_factory=QuadsLabBlock)


class CreateBlock(StrictSettings):
    """How to obtain a cluster when none is given."""

    type: Literal["single", "ocp", "managed", "pool", "metal"] | None = Field(
        default=None, description="None: use the given kubeconfig (or the local platform)."
    )
    name_prefix: str = Field(default="telltale", pattern=r"^[a-z][a-z0-9-]{0,30}$",
                             description="Prefix of created cluster names (a DNS label: "
                             "it reaches installers, hosts and remote shells).")
    ocp_version: str | None = Field(default=None, description="OpenShift version to install.")
    region: str | None = Field(default=None, description="Cloud region (ocp/managed).")
    base_domain: str | None = Field(default=None, description="DNS base domain (ocp/single).")
    worker_instance_type: str | None = Field(default=None, description="Worker machine type.")
    worker_count: int = Field(default=2, ge=0, le=1000, description="Worker nodes.")
    pool: str | None = Field(default=None, description="Hive ClusterPool name (type: pool).")
    pool_namespace: str = Field(default="hive", description="Namespace of the pool's claims.")


class ClustersBlock(StrictSettings):
    """Where the test runs."""

    platform: Literal["auto", "local", "kubernetes"] = Field(
        default="auto", description="auto: kubernetes when a kubeconfig is found, else local."
    )
    kubeconfig: str | None = Field(default=None, description="Explicit kubeconfig path.")
    keep: bool = Field(default=False, description="Keep leases, clusters and objects at the end.")
    cleanup_on_exit: bool = Field(default=True, description="Run the cleanup phase.")
    sutest: SutestBlock = Field(default_factory=SutestBlock)
    create: CreateBlock = Field(default_factory=CreateBlock)

    @model_validator(mode="after")
    def _metal_needs_two_hosts(self) -> ClustersBlock:
        """A bare-metal install needs a bastion and a node: refuse before any lease."""
        if self.create.type == "metal" and self.sutest.lab.enabled and self.sutest.lab.count < 2:
            raise ValueError(f"sutest.lab.count is {self.sutest.lab.count}: a bare-metal "
                             "cluster needs at least 2 hosts (a bastion and a node)")
        return self
