"""Bare metal end to end: QUADS lease → cluster install → prepare → test → destroy → release,
against the QUADS and Kubernetes API test servers and an openshift-install stand-in."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import pytest
import yaml

from tests.servers.fake_operators import OlmController, TrainingOperator, seed_cluster
from tests.servers.kubernetes import kube_server
from tests.servers.quads import quads_server

pytestmark = pytest.mark.slow
BIN = Path(__file__).resolve().parent.parent / "bin"


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str, name: str,
         create_type: str = "ocp"):
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(secrets))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TELLTALE_FAKE_BASTION_ROOT", str(tmp_path / "bastion-home"))
    (secrets / "pull-secret.json").write_text('{"auths": {"quay.io": {"auth": "cHVsbA=="}}}')
    (secrets / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3Nz perf@lab\n")
    with quads_server() as (quads_url, quads), kube_server() as (api_url, kube):
        httpx.post(f"{quads_url}/register", json={"email": "perf@example.com",
                                                  "password": "lab-pw-secret"})
        (secrets / "quads.yaml").write_text(yaml.safe_dump({
            "url": quads_url, "email": "perf@example.com", "password": "lab-pw-secret"}))
        quads.auto_deliver_after = 2
        monkeypatch.setenv("TELLTALE_FAKE_API_URL", api_url)
        seed_cluster(kube, rhoai=None)
        operators = [TrainingOperator(kube, scenario), OlmController(kube)]  # type: ignore[arg-type]
        for operator in operators:
            operator.start()
        try:
            outcome = outcome_of(fine_tuning(presets=["metal_quads"], overrides={
                "clusters.create.type": create_type,
                "clusters.create.base_domain": "lab.example.com",
                "clusters.sutest.lab.poll_seconds": 0.05,
                "clusters.sutest.lab.count": 2,
                "analysis.history_uri": str(tmp_path / "history")},
                artifact_dir=str(tmp_path / name), return_state=True))
        finally:
            for operator in operators:
                operator.stop()
        return outcome, quads, kube


def test_lease_install_run_destroy_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           prefect_harness) -> None:
    outcome, quads, kube = _run(tmp_path, monkeypatch, "success", "ok")
    assert outcome.exit_code == 0, outcome.failures
    root = tmp_path / "ok"
    lease = json.loads((root / "lease.json").read_text())
    assert lease["state"] == "released" and len(lease["hosts"]) == 2
    assert not quads.assignments[lease["assignment_id"]]["active"]
    assert (root / "cluster.destroyed.json").is_file() and not (root / "cluster.json").exists()
    assert stat.S_IMODE((root / "kubeconfig").stat().st_mode) == 0o600
    assert [c.status for c in outcome.cells] == ["passed"]
    text = "\n".join(p.read_text(errors="replace") for p in root.rglob("*")
                     if p.is_file() and p.suffix in (".yaml", ".json", ".log"))
    assert "lab-pw-secret" not in text and "cHVsbA==" not in text


def test_failed_test_still_destroys_and_releases(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 prefect_harness) -> None:
    outcome, quads, _ = _run(tmp_path, monkeypatch, "image_pull_backoff", "bad")
    assert outcome.exit_code == 1
    root = tmp_path / "bad"
    assert json.loads((root / "lease.json").read_text())["state"] == "released"
    assert all(not a["active"] for a in quads.assignments.values())
    assert (root / "cluster.destroyed.json").is_file()


def test_bare_metal_installs_on_the_bastion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            prefect_harness) -> None:
    outcome, quads, _ = _run(tmp_path, monkeypatch, "success", "metal", create_type="metal")
    assert outcome.exit_code == 0, outcome.failures
    root = tmp_path / "metal"
    lease = json.loads((root / "lease.json").read_text())
    bastion_dir = tmp_path / "bastion-home" / "telltale"
    assert (next(bastion_dir.iterdir()) / "auth" / "kubeconfig").is_file()  # ran there
    config = yaml.safe_load((root / "install-config.redacted.yaml").read_text())
    assert config["platform"] == {"none": {}} and config["pullSecret"] == "***"
    assert config["controlPlane"]["replicas"] == 1  # 2 hosts: a bastion and one node
    assert lease["state"] == "released"
    assert not (root / ".install-config.yaml").exists()
