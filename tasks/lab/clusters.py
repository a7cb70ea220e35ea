"""Cluster creation and destruction: openshift-install (single, ocp) and Hive pools.

- ``single`` / ``ocp``: an ``install-config.yaml`` is generated (the pull secret and SSH key
  come from the secret dir) into a private install dir (mode 0700, *outside* the artifact dir:
  it holds the kubeadmin password), then ``openshift-install create cluster --dir D``.
  ``destroy`` runs ``openshift-install destroy cluster --dir D``.
- ``pool``: a Hive ``ClusterClaim`` on the hub cluster; once Hive assigns a cluster, its admin
  kubeconfig comes from the ``ClusterDeployment``'s ``adminKubeconfigSecretRef``. ``destroy``
  deletes the claim.

The created cluster's kubeconfig is written into the artifact dir with mode 0600 (and never
exported: the S3 export skips kubeconfigs), with ``cluster.json`` describing what to destroy
(so a crash hook in another process can do it). Installers are run through `tasks.runner`
with deadlines; a failing installer raises with its stderr tail.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from core.errors import ConfigError, StepError
from core.safeio import read_text_bounded, write_text
from core.yamlio import dump_yaml
from tasks.kube.api import Kube
from tasks.runner import run

__all__ = ["CLUSTER_FILE", "ClusterRecord", "claim_from_pool", "create_managed",
           "create_on_bastion", "create_with_installer", "destroy", "install_config",
           "metal_install_config", "release_claim"]

logger = logging.getLogger("telltale.clusters")
CLUSTER_FILE = "cluster.json"
KUBECONFIG_FILE = "kubeconfig"


class ClusterRecord(BaseModel):
    """What was created (``cluster.json``): enough to destroy it from another process."""

    name: str
    type: Literal["single", "ocp", "managed", "pool", "metal"]
    kubeconfig: str = Field(description="Kubeconfig path in the artifact dir (mode 0600).")
    install_dir: str | None = Field(default=None, description="openshift-install dir.")
    claim: str | None = Field(default=None, description="Hive ClusterClaim name.")
    claim_namespace: str | None = None
    hub_kubeconfig: str | None = None
    api_url: str | None = None
    kept: bool = False


def install_config(name: str, create: dict[str, Any], *, pull_secret: str,
                   ssh_key: str) -> dict[str, Any]:
    """The ``install-config.yaml`` of a cloud cluster (``single`` = one control-plane node)."""
    if not create.get("base_domain"):
        raise ConfigError("cluster creation needs a base domain",
                          key="clusters.create.base_domain")
    single = create["type"] == "single"
    workers = 0 if single else int(create.get("worker_count", 2))
    platform: dict[str, Any] = {"aws": {"region": create.get("region") or "us-east-1"}}
    compute: dict[str, Any] = {"name": "worker", "replicas": workers, "architecture": "amd64"}
    if create.get("worker_instance_type"):
        compute["platform"] = {"aws": {"type": create["worker_instance_type"]}}
    return {
        "apiVersion": "v1",
        "baseDomain": create["base_domain"],
        "metadata": {"name": name},
        "controlPlane": {"name": "master", "replicas": 1 if single else 3,
                         "architecture": "amd64"},
        "compute": [compute],
        "networking": {"networkType": "OVNKubernetes",
                       "clusterNetwork": [{"cidr": "10.128.0.0/14", "hostPrefix": 23}],
                       "machineNetwork": [{"cidr": "10.0.0.0/16"}],
                       "serviceNetwork": ["172.30.0.0/16"]},
        "platform": platform,
        "pullSecret": pull_secret,
        "sshKey": ssh_key,
    }


def _save(root: Path, record: ClusterRecord) -> None:
    write_text(root / CLUSTER_FILE, record.model_dump_json(indent=2) + "\n")


def _write_private(path: Path, text: str) -> Path:
    """Write a file only its owner can read (created 0600, never world-readable)."""
    return write_text(path, text, private=True)


def create_with_installer(root: Path, install_dir: Path, name: str, create: dict[str, Any], *,
                          pull_secret: str, ssh_key: str, timeout_s: float = 4 * 3600,
                          installer: str = "openshift-install") -> ClusterRecord:
    """Create a ``single``/``ocp`` cluster with openshift-install.

    Args:
        root: Artifact dir (gets ``kubeconfig`` 0600 and ``cluster.json``).
        install_dir: Private install dir (created 0700; holds credentials).
        name: Cluster name.
        create: ``clusters.create``.
        pull_secret: The registry pull secret (JSON text).
        ssh_key: Public SSH key for the nodes.
        timeout_s: Installer deadline.
        installer: Installer executable.

    Returns:
        The `ClusterRecord` (also saved as ``cluster.json`` before the long install).
    """
    install_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(install_dir, 0o700)
    config = install_config(name, create, pull_secret=pull_secret, ssh_key=ssh_key)
    _write_private(install_dir / "install-config.yaml", dump_yaml(config, redacted=False))
    redacted = {**config, "pullSecret": "***", "sshKey": config["sshKey"][:20] + "..."}
    write_text(root / "install-config.redacted.yaml", dump_yaml(redacted))
    record = ClusterRecord(name=name, type=create["type"], kubeconfig=str(root / KUBECONFIG_FILE),
                           install_dir=str(install_dir))
    _save(root, record)  # before the install: a crash hook can already destroy it
    run([installer, "create", "cluster", "--dir", str(install_dir), "--log-level", "info"],
        timeout=timeout_s)
    kubeconfig = install_dir / "auth" / "kubeconfig"
    if not kubeconfig.is_file():
        raise StepError(f"{installer} succeeded but wrote no {kubeconfig}")
    _write_private(root / KUBECONFIG_FILE, read_text_bounded(
        kubeconfig, 4 * 1024 * 1024, what="installer kubeconfig"))
    metadata = install_dir / "metadata.json"
    if metadata.is_file():
        record.api_url = json.loads(read_text_bounded(
            metadata, 1024 * 1024, what="installer metadata")).get("apiURL")
    _save(root, record)
    logger.info("cluster %s created", name)
    return record


_SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
                "-o", "ConnectTimeout=30"]


def metal_install_config(name: str, create: dict[str, Any], hosts: list[str], *,
                         pull_secret: str, ssh_key: str) -> dict[str, Any]:
    """install-config for bare metal (user-provisioned, ``platform: none``).

    The first leased host is the bastion; the others become nodes: one node is a single-node
    cluster (bootstrap in place), three or more get three control-plane nodes.
    """
    if not create.get("base_domain"):
        raise ConfigError("cluster creation needs a base domain",
                          key="clusters.create.base_domain")
    nodes = len(hosts) - 1
    if nodes < 1:
        raise ConfigError("bare metal needs at least 2 leased hosts (a bastion and a node)",
                          key="clusters.sutest.lab.count")
    masters = 1 if nodes < 3 else 3
    config = install_config(name, {**create, "type": "ocp"}, pull_secret=pull_secret,
                            ssh_key=ssh_key)
    config["platform"] = {"none": {}}
    config["controlPlane"]["replicas"] = masters
    config["compute"] = [{"name": "worker", "replicas": nodes - masters,
                          "architecture": "amd64"}]
    if masters == 1:
        config["bootstrapInPlace"] = {"installationDisk": create.get("installation_disk")
                                      or "/dev/nvme0n1"}
    return config


def _remote(*argv: str) -> str:
    """One remote command line, every word quoted.

    OpenSSH joins its arguments with spaces and hands the line to the remote user's shell.
    """
    return shlex.join(argv)


def create_on_bastion(root: Path, name: str, create: dict[str, Any], hosts: list[str], *,
                      pull_secret: str, ssh_key: str, user: str = "root",
                      timeout_s: float = 4 * 3600) -> ClusterRecord:
    """Bare metal: run openshift-install on the bastion (the first leased host) over SSH."""
    bastion = f"{user}@{hosts[0]}"
    remote = f"telltale/{name}"
    config = metal_install_config(name, create, hosts, pull_secret=pull_secret,
                                  ssh_key=ssh_key)
    record = ClusterRecord(name=name, type="metal", kubeconfig=str(root / KUBECONFIG_FILE),
                           install_dir=f"{hosts[0]}:{remote}")
    _save(root, record)
    local = _write_private(root / ".install-config.yaml", dump_yaml(config, redacted=False))
    try:
        run(["ssh", *_SSH_OPTIONS, bastion, _remote("mkdir", "-p", remote)], timeout=120)
        run(["scp", *_SSH_OPTIONS, str(local), f"{bastion}:{remote}/install-config.yaml"],
            timeout=300)
    finally:
        local.unlink()  # the pull secret stays off the artifact dir
    redacted = {**config, "pullSecret": "***", "sshKey": config["sshKey"][:20] + "..."}
    write_text(root / "install-config.redacted.yaml", dump_yaml(redacted))
    run(["ssh", *_SSH_OPTIONS, bastion, _remote("openshift-install", "create", "cluster",
                                                "--dir", remote, "--log-level", "info")],
        timeout=timeout_s)
    run(["scp", *_SSH_OPTIONS, f"{bastion}:{remote}/auth/kubeconfig", str(root / "kubeconfig")],
        timeout=300)
    os.chmod(root / KUBECONFIG_FILE, 0o600)
    return record


def claim_from_pool(root: Path, hub: Kube, pool: str, namespace: str, name: str, *,
                    hub_kubeconfig: str | None, deadline_s: float = 3600) -> ClusterRecord:
    """Claim a cluster from a Hive ClusterPool and fetch its admin kubeconfig."""
    hub.apply({"apiVersion": "hive.openshift.io/v1", "kind": "ClusterClaim",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"clusterPoolName": pool, "lifetime": "8h"}})
    record = ClusterRecord(name=name, type="pool", kubeconfig=str(root / KUBECONFIG_FILE),
                           claim=name, claim_namespace=namespace, hub_kubeconfig=hub_kubeconfig)
    _save(root, record)
    claim = hub.wait("hive.openshift.io/v1", "ClusterClaim", name, namespace,
                     deadline_s=deadline_s, what=f"claim {name} on pool {pool}",
                     ready=lambda o: bool((o.get("spec") or {}).get("namespace")) and any(
                         c.get("type") == "ClusterRunning" and c.get("status") == "True"
                         for c in (o.get("status") or {}).get("conditions") or []))
    cluster_ns = claim["spec"]["namespace"]
    deployments = hub.list("hive.openshift.io/v1", "ClusterDeployment", cluster_ns)
    if not deployments:
        raise StepError(f"claim {name}: no ClusterDeployment in {cluster_ns}")
    meta = (deployments[0].get("spec") or {}).get("clusterMetadata") or {}
    secret_name = (meta.get("adminKubeconfigSecretRef") or {}).get("name")
    secret = hub.get("v1", "Secret", secret_name, cluster_ns) if secret_name else None
    if secret is None or "kubeconfig" not in (secret.get("data") or {}):
        raise StepError(f"claim {name}: admin kubeconfig secret not found in {cluster_ns}")
    _write_private(root / KUBECONFIG_FILE, base64.b64decode(secret["data"]["kubeconfig"]).decode())
    record.api_url = (deployments[0].get("status") or {}).get("apiURL")
    _save(root, record)
    return record


_LOGIN = re.compile(r"oc login (\S+) --username (\S+) --password (\S+)")


def create_managed(root: Path, name: str, create: dict[str, Any], *, rosa: str = "rosa",
                   oc: str = "oc", timeout_s: float = 3 * 3600, poll_s: float = 60.0,
                   sleep: Any = time.sleep) -> ClusterRecord:
    """Create a managed (ROSA) cluster and log in to it.

    ``rosa create cluster`` → poll ``rosa describe cluster -o json`` until ``ready`` (fail on
    ``error``) → ``rosa create admin`` → ``oc login`` into ``root/kubeconfig`` (0600). The
    admin password is parsed from rosa's output, never logged, and masked in ``oc``'s log.
    """
    record = ClusterRecord(name=name, type="managed", kubeconfig=str(root / KUBECONFIG_FILE))
    _save(root, record)
    argv = [rosa, "create", "cluster", "--cluster-name", name, "--region",
            create.get("region") or "us-east-1", "--replicas",
            str(create.get("worker_count", 2)), "--yes"]
    if create.get("worker_instance_type"):
        argv += ["--compute-machine-type", create["worker_instance_type"]]
    if create.get("ocp_version"):
        argv += ["--version", create["ocp_version"]]
    run(argv, timeout=600)
    deadline = time.monotonic() + timeout_s
    while True:
        described = json.loads(run([rosa, "describe", "cluster", "--cluster", name,
                                    "--output", "json"], timeout=120).stdout)
        state = described.get("state")
        if state == "ready":
            break
        if state == "error":
            raise StepError(f"ROSA cluster {name} failed: "
                            f"{described.get('status', {}).get('description', state)}")
        if time.monotonic() > deadline:
            raise StepError(f"ROSA cluster {name} not ready after {timeout_s / 60:.0f} min "
                            f"(state {state})")
        sleep(poll_s)
    admin = run([rosa, "create", "admin", "--cluster", name], timeout=300, log=False).stdout
    match = _LOGIN.search(admin)
    if match is None:
        raise StepError(f"could not read the admin login of {name} from rosa's output")
    api, user, password = match.groups()
    kubeconfig = root / KUBECONFIG_FILE
    run([oc, "login", api, "--username", user, "--password", password,
         f"--kubeconfig={kubeconfig}"], timeout=300, secrets=[password])
    os.chmod(kubeconfig, 0o600)
    record.api_url = api
    _save(root, record)
    return record


def release_claim(hub: Kube, record: ClusterRecord) -> bool:
    """Delete the ClusterClaim (Hive reclaims the cluster)."""
    return hub.delete("hive.openshift.io/v1", "ClusterClaim", record.claim or record.name,
                      record.claim_namespace)


def destroy(root: Path, *, keep: bool = False, hub: Kube | None = None,
            installer: str = "openshift-install", timeout_s: float = 3600) -> bool:
    """Destroy the cluster recorded in ``root/cluster.json`` unless kept; True when destroyed.

    ``keep`` marks the record kept instead (the janitor and later cleanups leave it alone).
    """
    path = root / CLUSTER_FILE
    if not path.is_file():
        return False
    record = ClusterRecord.model_validate_json(read_text_bounded(
        path, 1024 * 1024, what="cluster record"))
    if record.kept:
        return False
    if keep:
        record.kept = True
        _save(root, record)
        logger.warning("keeping cluster %s (clusters.keep); destroy it yourself", record.name)
        return False
    if record.type == "pool":
        if hub is None:
            raise StepError("destroying a pool claim needs the hub cluster")
        release_claim(hub, record)
    elif record.type == "metal":
        logger.info("bare-metal cluster %s goes with its lease (hosts are wiped on release)",
                    record.name)
    elif record.type == "managed":
        run(["rosa", "delete", "cluster", "--cluster", record.name, "--yes", "--watch"],
            timeout=timeout_s)
    elif record.install_dir:
        run([installer, "destroy", "cluster", "--dir", record.install_dir,
             "--log-level", "info"], timeout=timeout_s)
    path.rename(root / "cluster.destroyed.json")
    logger.info("cluster %s destroyed", record.name)
    return True
