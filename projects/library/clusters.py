"""The ``clusters`` block: platform choice, cluster creation and bare-metal leases."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StringConstraints, model_validator

from core.strict import DnsLabel, StrictSettings

__all__ = ["ClustersBlock", "ComputeBlock", "CreateBlock", "DriverBlock", "ImageBuildBlock",
           "MachineSetBlock", "QuadsLabBlock", "SutestBlock", "TaintBlock"]


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


LabelKey = Annotated[str, StringConstraints(
    pattern=r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
            r"[A-Za-z0-9])?$")]
LabelValue = Annotated[str, StringConstraints(
    pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")]


class TaintBlock(StrictSettings):
    """A taint put on a MachineSet's nodes; the run's pods get the matching toleration."""

    key: LabelKey = Field(default="telltale.io/compute", description="Taint key.")
    value: LabelValue | None = Field(default=None, description="Taint value (default: the "
                                     "cluster's role, sutest or driver).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="NoSchedule", description="Taint effect.")


class MachineSetBlock(StrictSettings):
    """Nodes of their own for the run (OpenShift Machine API).

    An existing MachineSet of that name is scaled (and scaled back at cleanup); otherwise one
    is cloned from a worker MachineSet with the instance type (and deleted at cleanup). Its
    nodes get the label ``telltale.io/compute=<role>`` and the taint; the run's pods of that
    role get the node selector and the toleration.
    """

    enabled: bool = Field(default=False, description="Scale (or create) a MachineSet.")
    name: DnsLabel | None = Field(default=None, description="The MachineSet's name (default: "
                                  "telltale-<role>, e.g. telltale-sutest).")
    instance_type: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="Instance type of created machines (AWS instanceType, GCP machineType, "
        "Azure vmSize); None: the cloned MachineSet's.")
    replicas: Annotated[int, Field(ge=0, le=1000)] | Literal["auto"] = Field(
        default=1, description="Nodes wanted, or auto: the run's pods of this role over what "
        "one node of the instance type holds (its allocatable over the pods' requests).")
    users_per_node: int | None = Field(
        default=None, ge=1, le=10_000,
        description="replicas auto: pods per node (default: measured from a node).")
    max_replicas: int = Field(default=20, ge=1, le=1000,
                              description="replicas auto never asks for more.")
    taint: TaintBlock | None = Field(default=None, description="Taint the nodes (optional).")
    source: DnsLabel | None = Field(
        default=None, description="Worker MachineSet to clone (default: the first whose "
        "machines are workers).")
    namespace: DnsLabel = Field(default="openshift-machine-api",
                                description="Namespace of the Machine API.")
    ready_minutes: int = Field(default=30, ge=1, le=24 * 60,
                               description="Deadline for the nodes to be Ready.")


class ComputeBlock(StrictSettings):
    """A cluster's compute for the run."""

    machineset: MachineSetBlock = Field(default_factory=MachineSetBlock)


class ImageBuildBlock(StrictSettings):
    """Telltale's image built from a PR in the cluster (OpenShift BuildConfig + ImageStream).

    The PR comes from ``--pr N`` or, in the field's CI, ``PULL_NUMBER`` with
    ``HOMELAB_CI=true``. Each Containerfile target is built at the PR's head ref, and
    manifests naming ``telltale:<target>`` run it by digest.
    """

    pr: int | None = Field(default=None, ge=1, le=10_000_000,
                           description="PR number under test (None: no build).")
    git_url: str | None = Field(
        default=None, pattern=r"^https://[A-Za-z0-9.-]+(:\d+)?/[A-Za-z0-9._~/-]+$",
        description="Repository the PR belongs to (https; default: "
        "https://github.com/$REPO_OWNER/$REPO_NAME as the field's CI exports them).")
    # a brace only as the one placeholder: the ref is never a format string
    ref: str = Field(default="refs/pull/{pr}/head", max_length=200,
                     pattern=r"^(?:[A-Za-z0-9._/-]|\{pr\})+$",
                     description="Git ref built ({pr} is the PR number).")
    targets: list[Literal["telltale", "user-pod"]] = Field(
        default_factory=lambda: ["telltale", "user-pod"], min_length=1,
        description="Containerfile targets to build.")
    stream: DnsLabel = Field(default="telltale", description="ImageStream of the builds.")
    deadline_minutes: int = Field(default=45, ge=1, le=24 * 60,
                                  description="Deadline of each build.")


class SutestBlock(StrictSettings):
    """The system-under-test cluster."""

    is_metal: bool = Field(default=False, description="Bare-metal cluster (lease, install).")
    lab: QuadsLabBlock = Field(default_factory=QuadsLabBlock)
    compute: ComputeBlock = Field(default_factory=ComputeBlock)


class DriverBlock(StrictSettings):
    """Where load clients run: nodes of their own on the test cluster.

    A separate driver cluster (``kubeconfig``) is typed but refused for now (exit 2): the
    load clients reach the served model through its in-cluster address.
    """

    kubeconfig: str | None = Field(default=None, description="A second cluster for the load "
                                   "clients (not supported yet: refused).")
    compute: ComputeBlock = Field(default_factory=ComputeBlock)


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
    driver: DriverBlock = Field(default_factory=DriverBlock)
    image_build: ImageBuildBlock = Field(default_factory=ImageBuildBlock)
    create: CreateBlock = Field(default_factory=CreateBlock)

    @model_validator(mode="after")
    def _metal_needs_two_hosts(self) -> ClustersBlock:
        """A bare-metal install needs a bastion and a node: refuse before any lease."""
        if self.create.type == "metal" and self.sutest.lab.enabled and self.sutest.lab.count < 2:
            raise ValueError(f"sutest.lab.count is {self.sutest.lab.count}: a bare-metal "
                             "cluster needs at least 2 hosts (a bastion and a node)")
        return self
