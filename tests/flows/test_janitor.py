"""The leak janitor and one-run-per-cluster, against the Kubernetes API test server."""

from __future__ import annotations

import contextvars
import os
import threading
import time
from pathlib import Path

import pytest

from core.errors import ConfigError
from flows.cleanup import parse_age
from tasks.kube.api import Kube, api_client
from tasks.kube.workload import KEEP_LABEL, cleanup_cluster, find_leaks
from tests.servers.kubernetes import kube_server, write_kubeconfig


def _objects(kube: Kube, run: str) -> None:
    kube.run_id = run
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{run}-cfg", "namespace": "default"}})
    kube.apply({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": f"{run}-job", "namespace": "default"},
                "spec": {"pytorchReplicaSpecs": {}}})


def test_janitor_finds_old_leaks_and_spares_kept_runs(tmp_path: Path, prefect_harness) -> None:
    from flows.cleanup import janitor

    with kube_server() as (url, state):
        kubeconfig = write_kubeconfig(tmp_path / "kc", url)
        kube = Kube(api_client(kubeconfig))
        _objects(kube, "crashed")
        _objects(kube, "kept")
        cleanup_cluster(kubeconfig, "kept", keep=True)
        kept = state.get("v1", "ConfigMap", "kept-cfg", "default")
        assert kept["metadata"]["labels"][KEEP_LABEL] == "true"
        assert find_leaks(kubeconfig, 3600) == []  # nothing is 1 h old yet
        later = time.time() + 7 * 3600
        leaks = find_leaks(kubeconfig, 6 * 3600, now=later)
        assert sorted((kind, name) for _, kind, name, _, _ in leaks) == [
            ("ConfigMap", "crashed-cfg"), ("PyTorchJob", "crashed-job")]
        dry = janitor(older_than="0s", dry_run=True, kubeconfig=kubeconfig)
        assert len(dry.leaks) == 2 and state.get("v1", "ConfigMap", "crashed-cfg", "default")
        done = janitor(older_than="0s", dry_run=False, kubeconfig=kubeconfig)
        assert done.deleted == 2
        assert state.get("v1", "ConfigMap", "crashed-cfg", "default") is None
        assert state.get("v1", "ConfigMap", "kept-cfg", "default") is not None


@pytest.mark.parametrize(("text", "seconds"), [("6h", 21600), ("90m", 5400), ("2d", 172800),
                                               ("30s", 30)])
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds
    with pytest.raises(ConfigError):
        parse_age("six hours")


def test_second_run_on_a_cluster_queues(prefect_harness) -> None:
    from tasks.kube.lock import cluster_lock

    order: list[str] = []
    first_in, second_trying = threading.Event(), threading.Event()

    # Events, not sleeps: taking the slot is a few Prefect API calls, which a loaded machine
    # can stretch past any fixed head start.
    def first_run() -> None:
        with cluster_lock("https://api.cluster-a.example:6443"):
            order.append("first-in")
            first_in.set()
            second_trying.wait(60)
            time.sleep(0.5)  # the second is asking for the slot meanwhile (it is polled)
            order.append("first-out")

    def second_run() -> None:
        second_trying.set()
        with cluster_lock("https://api.cluster-a.example:6443"):
            order.append("second-in")
            order.append("second-out")

    # Each thread in a copy of this context, as Prefect runs its tasks: the API is a
    # context setting (a bare thread has none, and Prefect starts a temporary server for it)
    first = threading.Thread(target=contextvars.copy_context().run, args=(first_run,))
    first.start()
    assert first_in.wait(120), "the first run never took the cluster's slot"
    second = threading.Thread(target=contextvars.copy_context().run, args=(second_run,))
    second.start()
    first.join(120)
    second.join(120)
    assert order == ["first-in", "first-out", "second-in", "second-out"]


def test_the_janitor_against_an_unreachable_api_server_says_it_in_one_line(
        tmp_path: Path) -> None:
    """No traceback from Prefect's engine log: our error says what is wrong, once, last."""
    import subprocess
    import sys

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: abcdefgh12345678}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.run([sys.executable, "-m", "flows.cleanup", "--kubeconfig",
                           str(kubeconfig), "--older-than", "1h"], capture_output=True,
                          text=True, env=env, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "127.0.0.1" in errors[0] and "refused" in errors[0]
