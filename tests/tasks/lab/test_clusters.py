"""Cluster creation: openshift-install's contract (stand-in on PATH) and Hive pool claims."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from core.errors import ConfigError
from tasks.kube.api import Kube, api_client
from tasks.lab.clusters import (
    ClusterRecord,
    claim_from_pool,
    create_with_installer,
    destroy,
    install_config,
)
from tasks.publish.s3 import iter_files
from tasks.runner import CommandError
from tests.servers.kubernetes import kube_server, write_kubeconfig

BIN = Path(__file__).resolve().parents[2] / "bin"
CREATE = {"type": "ocp", "base_domain": "perf.example.com", "region": "us-west-2",
          "worker_count": 2, "worker_instance_type": "p4d.24xlarge"}


@pytest.fixture()
def installer_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    with kube_server() as (url, state):
        monkeypatch.setenv("TELLTALE_FAKE_API_URL", url)
        yield url, state


def test_install_config_shapes() -> None:
    ocp = install_config("c1", CREATE, pull_secret='{"auths": {}}', ssh_key="ssh-ed25519 AAA")
    assert ocp["controlPlane"]["replicas"] == 3 and ocp["compute"][0]["replicas"] == 2
    assert ocp["compute"][0]["platform"]["aws"]["type"] == "p4d.24xlarge"
    single = install_config("c2", {**CREATE, "type": "single"}, pull_secret="{}", ssh_key="k")
    assert single["controlPlane"]["replicas"] == 1 and single["compute"][0]["replicas"] == 0
    with pytest.raises(ConfigError, match="base domain"):
        install_config("c3", {"type": "ocp"}, pull_secret="{}", ssh_key="k")


def test_create_use_and_destroy(tmp_path: Path, installer_env) -> None:
    root, install = tmp_path / "artifacts", tmp_path / "private" / "install"
    root.mkdir()
    record = create_with_installer(root, install, "perf-c1", CREATE,
                                   pull_secret='{"auths": {"quay.io": {"auth": "c2VjcmV0"}}}',
                                   ssh_key="ssh-ed25519 AAAA perf")
    kubeconfig = Path(record.kubeconfig)
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    assert stat.S_IMODE(install.stat().st_mode) == 0o700
    assert Kube(api_client(str(kubeconfig))).get("v1", "Namespace", "default") is not None
    assert record.api_url == installer_env[0]
    redacted = (root / "install-config.redacted.yaml").read_text()
    assert "c2VjcmV0" not in redacted and "pullSecret: '***'" in redacted
    assert "kubeconfig" not in [p.name for p in iter_files(root)]  # never exported
    assert destroy(root) is True
    assert not (install / "metadata.json").exists()
    assert destroy(root) is False  # already gone


def test_keep_marks_and_installer_failure(tmp_path: Path, installer_env,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "a"
    root.mkdir()
    create_with_installer(root, tmp_path / "i", "perf-c2", CREATE, pull_secret="{}",
                          ssh_key="k")
    assert destroy(root, keep=True) is False
    assert ClusterRecord.model_validate_json((root / "cluster.json").read_text()).kept
    assert destroy(root) is False  # kept stays kept
    monkeypatch.setenv("TELLTALE_FAKE_INSTALL_FAIL", "1")
    failed = tmp_path / "b"
    failed.mkdir()
    with pytest.raises(CommandError, match="quota exceeded"):
        create_with_installer(failed, tmp_path / "j", "perf-c3", CREATE, pull_secret="{}",
                              ssh_key="k")
    assert (failed / "cluster.json").is_file()  # recorded before the install: destroyable


def _hive(state, stop: threading.Event, cluster_url: str) -> None:
    """What Hive does for a claim: assign a pooled cluster and its admin kubeconfig."""
    kubeconfig = json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                             "clusters": [{"name": "c", "cluster": {"server": cluster_url}}],
                             "users": [{"name": "u", "user": {"token": "t"}}],
                             "contexts": [{"name": "c", "context": {"cluster": "c",
                                                                    "user": "u"}}]})
    while not stop.wait(0.05):
        for claim in state.list("hive.openshift.io/v1", "ClusterClaim"):
            if claim.get("status"):
                continue
            ns = "pool-gpu-abc12"
            state.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            state.put({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "admin-kubeconfig", "namespace": ns},
                       "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}})
            state.put({"apiVersion": "hive.openshift.io/v1", "kind": "ClusterDeployment",
                       "metadata": {"name": ns, "namespace": ns},
                       "spec": {"clusterMetadata": {"adminKubeconfigSecretRef": {
                           "name": "admin-kubeconfig"}}},
                       "status": {"apiURL": cluster_url}})
            claim["spec"]["namespace"] = ns
            claim["status"] = {"conditions": [{"type": "ClusterRunning", "status": "True"}]}
            state.put(claim)


def test_claim_from_a_hive_pool(tmp_path: Path) -> None:
    with kube_server() as (hub_url, hub_state), kube_server() as (cluster_url, _):
        hub_state.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hive"}})
        stop = threading.Event()
        thread = threading.Thread(target=_hive, args=(hub_state, stop, cluster_url), daemon=True)
        thread.start()
        try:
            hub_config = write_kubeconfig(tmp_path / "hub", hub_url)
            hub = Kube(api_client(hub_config))
            root = tmp_path / "a"
            root.mkdir()
            record = claim_from_pool(root, hub, "gpu-pool", "hive", "telltale-claim-1",
                                     hub_kubeconfig=hub_config, deadline_s=300)
            assert record.api_url == cluster_url
            cluster = Kube(api_client(record.kubeconfig))
            assert cluster.get("v1", "Namespace", "default") is not None
            assert destroy(root, hub=hub) is True
            assert hub_state.get("hive.openshift.io/v1", "ClusterClaim", "telltale-claim-1",
                                 "hive") is None
        finally:
            stop.set()
            thread.join(5)


def test_managed_cluster_with_rosa_and_oc(tmp_path: Path, installer_env,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.lab.clusters import create_managed

    monkeypatch.setenv("TELLTALE_FAKE_ROSA_DIR", str(tmp_path / "rosa"))
    root = tmp_path / "a"
    root.mkdir()
    from tasks.artifacts import use_artifact_dir

    with use_artifact_dir(root):
        record = create_managed(root, "perf-rosa", {"region": "us-east-2", "worker_count": 3},
                                poll_s=0, sleep=lambda s: None)
    assert record.api_url == installer_env[0]
    assert stat.S_IMODE(Path(record.kubeconfig).stat().st_mode) == 0o600
    assert Kube(api_client(record.kubeconfig)).get("v1", "Namespace", "default") is not None
    assert "Adm1n-S3cr3t-pw" not in (root / "commands.log").read_text()
    assert destroy(root) is True
    assert not (tmp_path / "rosa" / "perf-rosa.json").exists()
    monkeypatch.setenv("TELLTALE_FAKE_ROSA_FAIL", "1")
    failed = tmp_path / "b"
    failed.mkdir()
    from core.errors import StepError

    with pytest.raises(StepError, match="quota exceeded"):
        create_managed(failed, "perf-rosa-2", {}, poll_s=0, sleep=lambda s: None)


def test_bastion_commands_are_quoted_for_the_remote_shell(tmp_path: Path, installer_env,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The ssh stand-in runs its joined arguments through a shell, as OpenSSH does."""
    from tasks.lab.clusters import create_on_bastion

    home = tmp_path / "bastion-home"
    monkeypatch.setenv("TELLTALE_FAKE_BASTION_ROOT", str(home))
    root = tmp_path / "run"
    root.mkdir()
    hostile = "x;touch marker-file;"
    create_on_bastion(root, hostile, {"type": "metal", "base_domain": "perf.example.com"},
                      ["bastion.example.com", "node1.example.com"],
                      pull_secret='{"auths": {}}', ssh_key="ssh-ed25519 AAAA test")
    assert not list(home.rglob("marker-file")), "a name reached the remote shell unquoted"
    assert (home / "telltale" / hostile / "auth" / "kubeconfig").is_file()  # ran in its dir


def test_cluster_name_prefix_must_be_a_dns_label() -> None:
    from pydantic import ValidationError

    from projects.library import CreateBlock

    with pytest.raises(ValidationError):
        CreateBlock(name_prefix="x;touch marker-file;")
    assert CreateBlock(name_prefix="perf-cpt").name_prefix == "perf-cpt"
