"""Provisioning steps: a bare-metal lease and a cluster, undone in every outcome.

The flow calls `lease_hosts` and `create_cluster` before preparing the cluster, and
`teardown` in its ``finally`` (and its crash/cancel hooks, from the files these steps leave in
the artifact dir: ``lease.json``, ``cluster.json``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import SecretStr

from core.environment import default_data_dir
from core.errors import ConfigError
from core.safeio import read_text_bounded
from projects.library import CreateBlock, QuadsLabBlock, SecretsBlock
from tasks.artifacts import step
from tasks.kube.api import Kube, api_client
from tasks.lab.clusters import (
    ClusterRecord,
    claim_from_pool,
    create_managed,
    create_on_bastion,
    create_with_installer,
    destroy,
)
from tasks.lab.lease import Lease, LeaseRequest, acquire_lease, release_from_file
from tasks.lab.quads import PATIENT, QuadsClient
from tasks.retry import RetryPolicy
from tasks.secrets import read_yaml_secret, secret_file

__all__ = ["create_cluster", "lease_hosts", "quads_client", "teardown"]

logger = logging.getLogger("telltale.provision")


def quads_client(secrets: SecretsBlock) -> QuadsClient:
    """A QUADS client from ``secrets.quads_credentials`` (``{url, email, password}``)."""
    path = secret_file(secrets.dir.env_key, secrets.quads_credentials)
    if path is None:
        raise ConfigError(f"a QUADS lease needs ${secrets.dir.env_key}/"
                          f"{secrets.quads_credentials} with url, email and password",
                          key="secrets.quads_credentials")
    data = read_yaml_secret(path)
    missing = [k for k in ("url", "email", "password") if not data.get(k)]
    if missing:
        raise ConfigError(f"QUADS credentials lack {', '.join(missing)}", file=str(path))
    patience = PATIENT
    if "patience_attempts" in data or "patience_backoff_max_s" in data:
        # how long this lab's outages last: the delivery wait and the release ride them out
        try:
            patience = RetryPolicy(
                attempts=int(data.get("patience_attempts", PATIENT.attempts)),
                backoff_base_s=min(PATIENT.backoff_base_s,
                                   float(data.get("patience_backoff_max_s", 60))),
                backoff_max_s=float(data.get("patience_backoff_max_s",
                                             PATIENT.backoff_max_s)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"patience_attempts / patience_backoff_max_s: {exc}",
                              file=str(path)) from None
    return QuadsClient(data["url"], data["email"], SecretStr(str(data["password"])),
                       verify=data.get("verify_tls", True), patient=patience)


@step("lab", timeout_seconds=None)
def lease_hosts(root: str, secrets: SecretsBlock, lab: QuadsLabBlock, marker: str) -> Lease:
    """Lease bare-metal hosts from QUADS.

    ``lease.json`` holds the intent before the request; an unreleased one from an earlier
    attempt in the same dir is adopted or closed.
    """
    request = LeaseRequest(count=lab.count, filters=lab.filters, description=lab.description,
                           wipe=lab.wipe, ticket=lab.ticket, cc_users=lab.cc_users,
                           marker=_marker(marker),
                           wait_hosts_minutes=lab.wait_hosts_minutes,
                           wait_delivery_minutes=lab.wait_delivery_minutes)
    with quads_client(secrets) as client:
        return acquire_lease(client, request, root=Path(root), poll_s=lab.poll_seconds)


def _marker(run_id: str) -> str:
    """The run id as a description marker (``[A-Za-z0-9._-]``, ≤ 64 characters)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in run_id)[:64]
    return cleaned or "run"


@step("cluster", timeout_seconds=None)
def create_cluster(root: str, block: CreateBlock, secrets: SecretsBlock, run_id: str,
                   hub_kubeconfig: str | None) -> ClusterRecord:
    """Create (or claim) the cluster; its kubeconfig lands in ``root`` with mode 0600."""
    name = f"{block.name_prefix}-{run_id[:8]}".lower()
    kind = block.type
    create = block.model_dump()  # the installers' own input files are built from a mapping
    if kind == "pool":
        if not block.pool:
            raise ConfigError("type pool needs a ClusterPool name", key="clusters.create.pool")
        hub = Kube(api_client(hub_kubeconfig))
        return claim_from_pool(Path(root), hub, block.pool, block.pool_namespace,
                               name, hub_kubeconfig=hub_kubeconfig)
    if kind == "managed":
        return create_managed(Path(root), name, create)
    if kind not in ("single", "ocp", "metal"):
        raise ConfigError(f"cluster type {kind!r} is not supported yet "
                          "(single, ocp, managed, pool)", key="clusters.create.type")
    env_key = secrets.dir.env_key
    pull = secret_file(env_key, secrets.pull_secret)
    ssh = secret_file(env_key, secrets.ssh_public_key)
    if pull is None or ssh is None:
        raise ConfigError(f"cluster creation needs ${env_key} with the pull secret and SSH key",
                          key="secrets.pull_secret")
    if kind == "metal":
        lease_file = Path(root) / "lease.json"
        if not lease_file.is_file():
            raise ConfigError("type metal needs leased hosts: enable clusters.sutest.lab",
                              key="clusters.sutest.lab.enabled")
        lease = Lease.model_validate_json(read_text_bounded(lease_file, 64 * 1024,
                                                             what="lease file"))
        return create_on_bastion(Path(root), name, create, lease.hosts,
                                 pull_secret=_secret_text(pull), ssh_key=_secret_text(ssh))
    private = default_data_dir() / "clusters" / name  # holds credentials: never exported
    return create_with_installer(Path(root), private, name, create,
                                 pull_secret=_secret_text(pull), ssh_key=_secret_text(ssh))


@step("cleanup", timeout_seconds=None)
def teardown(root: str, keep: bool, secrets: SecretsBlock,
             hub_kubeconfig: str | None) -> dict[str, bool]:
    """Destroy the cluster, then release the lease (each unless kept); safe to repeat."""
    base = Path(root)
    done = {"destroyed": False, "released": False}
    if (base / "cluster.json").is_file():
        hub = Kube(api_client(hub_kubeconfig)) if hub_kubeconfig else None
        done["destroyed"] = destroy(base, keep=keep, hub=hub)
    if (base / "lease.json").is_file() and not keep:
        with quads_client(secrets) as client:
            done["released"] = release_from_file(client, base)
    return done


def _secret_text(path: Path) -> str:
    """A secret file's text (a mounted secret may be a link: followed), bounded."""
    return read_text_bounded(path, 1024 * 1024, what="secret file", follow_links=True).strip()
