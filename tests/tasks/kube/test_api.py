"""Kubernetes helpers against a stateful API server, through the official client over HTTP."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import PermanentServiceError, StepError
from tasks.kube.api import (
    RUN_ID_LABEL,
    Kube,
    api_client,
    clients_built,
    open_clients,
    owned_clients,
)
from tasks.retry import RetryPolicy
from tests.servers.kubernetes import kube_server, label_matches, write_kubeconfig

FAST = RetryPolicy(attempts=4, backoff_base_s=0, jitter=0)


@pytest.fixture()
def kube(tmp_path: Path):
    # the client's own verbs, patch_status included (the RBAC audit is for flows)
    with kube_server(rbac_audit=False) as (url, state), owned_clients():
        api = api_client(write_kubeconfig(tmp_path / "kubeconfig", url))
        kube = Kube(api, run_id="run-1", policy=FAST, request_timeout_s=10)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ft"}})
        yield kube, state


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ft"},
            "spec": {"containers": [{"name": "trainer", "image": "quay.io/x/y:1"}]}}


def later(*steps) -> threading.Thread:
    def run() -> None:
        for delay, action in steps:
            time.sleep(delay)
            action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def phase(value: str):
    return lambda obj: (obj.get("status") or {}).get("phase") == value


def test_apply_is_idempotent_and_labels_by_run(kube) -> None:
    k, state = kube
    manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cfg", "namespace": "ft"}, "data": {"a": "1"}}
    first = k.apply(manifest)
    second = k.apply({**manifest, "data": {"a": "2"}})
    assert first["metadata"]["uid"] == second["metadata"]["uid"]
    assert second["data"] == {"a": "2"}
    assert second["metadata"]["labels"][RUN_ID_LABEL] == "run-1"
    again = k.apply({**manifest, "data": {"a": "2"}})
    assert again["metadata"]["generation"] == second["metadata"]["generation"]
    assert [o["metadata"]["name"] for o in k.list("v1", "ConfigMap",
                                                  labels=f"{RUN_ID_LABEL}=run-1")] == ["cfg"]


def test_wait_follows_a_driven_lifecycle(kube) -> None:
    k, state = kube
    k.apply(pod("p"))
    seen: list[str] = []
    following = threading.Event()

    def progress(obj: dict) -> None:
        seen.append((obj.get("status") or {}).get("phase", ""))
        following.set()

    # The lifecycle starts once the wait has read the pod (an event, not a head start a
    # loaded machine can outrun); the watch then resumes from that read's resourceVersion,
    # so it sees every phase, however fast they come.
    later((0, lambda: following.wait(120)),
          (0, lambda: state.set_status("v1", "Pod", "p", {"phase": "Pending"}, "ft")),
          (0, lambda: state.set_status("v1", "Pod", "p", {"phase": "Running"}, "ft")),
          (0, lambda: state.set_status("v1", "Pod", "p", {"phase": "Succeeded"}, "ft")))
    obj = k.wait("v1", "Pod", "p", "ft", ready=phase("Succeeded"), deadline_s=600,
                 progress=progress)
    assert obj["status"]["phase"] == "Succeeded"
    assert seen == ["", "Pending", "Running", "Succeeded"]


def test_fail_fast_on_image_pull_backoff(kube) -> None:
    k, state = kube
    k.apply(pod("p"))
    later((0.3, lambda: state.set_status("v1", "Pod", "p", {"phase": "Pending",
          "containerStatuses": [{"name": "trainer", "state": {"waiting": {
              "reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}, "ft")))

    def fail(obj: dict) -> str | None:
        for status in (obj.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ImagePullBackOff", "ErrImagePull",
                                         "CrashLoopBackOff"):
                return f"{waiting['reason']}: {waiting.get('message', '')}"
        return None

    # The error names the pod's own reason, not the deadline: the wait stopped on the first
    # failing status (a clock bound here would break on a loaded machine).
    with pytest.raises(StepError, match="ImagePullBackOff: Back-off pulling image") as err:
        k.wait("v1", "Pod", "p", "ft", ready=phase("Succeeded"), fail=fail, deadline_s=600)
    assert "not ready after" not in str(err.value)


def test_deadline_reports_the_last_status(kube) -> None:
    k, state = kube
    k.apply(pod("p"))
    state.set_status("v1", "Pod", "p", {"phase": "Pending"}, "ft")
    with pytest.raises(StepError, match=r"not ready after 1s .*Pending"):
        k.wait("v1", "Pod", "p", "ft", ready=phase("Succeeded"), deadline_s=1)


def test_transient_faults_retry_and_refusals_do_not(kube) -> None:
    k, state = kube
    state.fail_next(2, 503)
    assert k.get("v1", "Namespace", "ft") is not None
    before = len(state.requests)
    state.fail_next(1, 403)
    with pytest.raises(PermanentServiceError) as info:
        k.get("v1", "Namespace", "ft")
    assert info.value.status == 403 and len(state.requests) == before + 1


def test_logs_and_propagated_delete(kube) -> None:
    k, state = kube
    job = k.apply({"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": "stage", "namespace": "ft"},
                   "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}],
                                                  "restartPolicy": "Never"}}}})
    owned = pod("stage-abc")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                             "name": "stage", "uid": job["metadata"]["uid"]}]
    k.apply(owned)
    state.set_log("ft", "stage-abc", "copied 3 files\n")
    assert k.pod_log("stage-abc", "ft") == "copied 3 files\n"
    assert k.delete("batch/v1", "Job", "stage", "ft") is True
    assert k.get("v1", "Pod", "stage-abc", "ft") is None  # dependents go with it
    assert k.delete("batch/v1", "Job", "stage", "ft") is False


def test_custom_resources_and_status_subresource(kube) -> None:
    k, state = kube
    job = k.apply({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                   "metadata": {"name": "ft", "namespace": "ft"},
                   "spec": {"pytorchReplicaSpecs": {}}})
    assert job["metadata"]["uid"]
    k.patch_status("kubeflow.org/v1", "PyTorchJob", "ft", {"conditions": [
        {"type": "Succeeded", "status": "True"}]}, "ft")
    k.apply({**job, "spec": {"pytorchReplicaSpecs": {"Master": {}}}})  # keeps the status
    stored = k.get("kubeflow.org/v1", "PyTorchJob", "ft", "ft")
    assert stored["status"]["conditions"][0]["type"] == "Succeeded"
    assert stored["spec"]["pytorchReplicaSpecs"] == {"Master": {}}


@pytest.mark.parametrize(("selector", "expected"), [
    ("a=1", True), ("a==1,b!=3", True), ("a in (1, 2)", True), ("a notin (1)", False),
    ("c", False), ("!c", True), ("b", True),
])
def test_label_selectors(selector: str, expected: bool) -> None:
    assert label_matches({"a": "1", "b": "2"}, selector) is expected


def test_workload_stages_data_once(tmp_path: Path) -> None:
    from projects.contract import CellContext
    from projects.fine_tuning.models import FineTuningTest, TestSettings
    from projects.fine_tuning.project import kube_workload
    from tasks.kube.api import Kube, api_client
    from tasks.kube.workload import run_kube_workload
    from tests.servers.fake_operators import TrainingOperator

    block = {"pvc_name": "storage", "pvc_size": "10Gi", "storage_class": None,
             "staging_image": "ubi", "dataset_url": "https://example.com/d.json",
             "model_url": None, "image_pull_deadline_minutes": 1}
    settings = {"name": "ft", "model_name": "m", "dataset_name": "d.json", "gpu": 1,
                "pod_count": 1, "container_image": "img:1", "hyper_parameters": {"r": 4},
                "dataset_replication": 1}
    test = FineTuningTest(namespace="ft", test_settings=settings, kubernetes=block)

    def run(run_id: str, index: int) -> tuple[int, str, float, bool]:
        here = tmp_path / run_id
        here.mkdir()
        ctx = CellContext(settings=TestSettings.model_validate(settings), test=test,
                          index=index, name="base", workdir=here, data_dir=tmp_path,
                          run_id=run_id)
        client = api_client(kubeconfig)
        return run_kube_workload(Kube(client, run_id), Kube(client), kube_workload(ctx), "ft",
                                 here=here, image_pull_deadline_s=60, timeout_s=300)

    with kube_server() as (url, state):
        operator = TrainingOperator(state, step_s=0.05)
        operator.start()
        kubeconfig = write_kubeconfig(tmp_path / "kc", url)
        try:
            first = run("run-a", 0)
            second = run("run-b", 1)
        finally:
            operator.stop()
        assert first[3] is True and second[3] is False  # the PVC carries the source
        assert first[:2] == (0, "Completed")
        assert (tmp_path / "run-a" / "artifacts" / "pytorchjob.json").is_file()
        staging_jobs = [j["metadata"]["name"] for j in state.list("batch/v1", "Job")]
        assert staging_jobs == ["ft-000-staging"]


_KUBECONFIG_TEXTS = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["", "a: [1\n", "- 1\n", "apiVersion: v1\nkind: Config\n",
                     "current-context: x\ncontexts: []\n", "null\n", "42\n",
                     "current-context: x\ncontexts: [{name: x, context: {cluster: c, "
                     "user: u}}]\n"]),
    st.dictionaries(st.sampled_from(["current-context", "contexts", "clusters", "users"]),
                    st.one_of(st.none(), st.integers(), st.text(max_size=5),
                              st.lists(st.integers(), max_size=2)), max_size=4)
    .map(lambda d: json.dumps(d)))


@given(text=_KUBECONFIG_TEXTS)
def test_an_unusable_kubeconfig_is_a_config_error_naming_the_key(text: str) -> None:
    """Whatever the file holds, an unusable kubeconfig is one user error (exit 2), never a
    traceback from the client's reader (every caller goes through `api_client`)."""
    import tempfile

    from core.errors import ConfigError

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kubeconfig"
        path.write_text(text, encoding="utf-8")
        try:
            api_client(str(path))
        except ConfigError as exc:
            assert exc.key == "clusters.kubeconfig"
            assert str(path) in str(exc)


def test_one_client_per_kubeconfig_owned_by_the_run_and_closed(tmp_path: Path) -> None:
    with kube_server(rbac_audit=False) as (url, _state):
        path = write_kubeconfig(tmp_path / "kubeconfig", url)
        built = clients_built()
        with owned_clients():
            first = api_client(path)
            threads = [threading.Thread(target=api_client, args=(path,)) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert api_client(path) is first and clients_built() == built + 1
            Kube(first, policy=FAST).get("v1", "Namespace", "default", None)
            assert first.rest_client.pool_manager.pools  # a live connection pool
            with owned_clients():  # a second run of the process ends first: nothing closed
                assert api_client(path) is first
            assert open_clients() >= 1 and first.rest_client.pool_manager.pools
            write_kubeconfig(tmp_path / "kubeconfig", url, namespace="another-one")
            assert api_client(path) is not first  # a rewritten kubeconfig: a new client
        assert open_clients() == 0
        assert not first.rest_client.pool_manager.pools  # closed with its run


def test_no_code_builds_a_kubernetes_client_around_api_client() -> None:
    """One client per kubeconfig needs one builder: an ``ApiClient(...)`` or the client's
    own loaders anywhere else would be a client nobody owns or closes."""
    import ast

    from tests.code_tree import python_files

    builders = {"ApiClient", "new_client_from_config", "load_kube_config",
                "load_incluster_config"}
    offenders = []
    for rel, path in python_files():
        if rel == "tasks/kube/api.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name in builders:
                    offenders.append(f"{rel}:{node.lineno} {name}")
    assert offenders == []
