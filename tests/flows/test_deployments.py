from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from core.yamlio import load_yaml
from flows.serve import build_deployments, load_deployment_specs


def test_prefect_yaml_deployments_build_and_validate() -> None:
    specs = load_deployment_specs()
    names = {s["name"] for s in specs}
    assert {"fine-tuning-nightly", "fine-tuning-gating", "fine-tuning-manual"} <= names
    deployments = {d.name: d for d in build_deployments()}
    nightly = deployments["fine-tuning-nightly"]
    assert nightly.schedules and nightly.schedules[0].schedule.cron == "30 2 * * *"  # slot 1
    assert nightly.parameters["presets"] == ["nightly"]  # light + confirmation re-runs
    schema = nightly._parameter_openapi_schema.model_dump()
    props = schema["properties"]
    assert set(props) == {"presets", "overrides", "platform", "artifact_dir"}
    assert props["presets"]["description"].startswith("Presets from ``ci_presets``")
    assert props["platform"]["enum"] == ["auto", "local", "kubernetes"]


def test_the_checked_in_prefect_file_is_the_generated_one() -> None:
    """Every registered project's deployments, derived from its presets (a third project
    gets its own without editing the file)."""
    from deployments.prefect_file import main

    assert main(["--check"]) == 0
    names = {s["name"] for s in load_deployment_specs()}
    assert {"llm-serving-manual", "llm-serving-nightly"} <= names
    assert "llm-serving-gating" not in names  # no gating preset, no gating deployment


ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deployments" / "kubernetes-job-template.json"


def _render(template: dict[str, Any], **job_variables: Any) -> dict[str, Any]:
    """The Job a Kubernetes worker would create for a flow run, through prefect-kubernetes."""
    from prefect.client.schemas.objects import Flow, FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    defaults = {name: spec["default"] for name, spec in
                template["variables"]["properties"].items() if "default" in spec}
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
        template, {**defaults, **job_variables}))
    run = FlowRun(id=uuid.uuid4(), name="brave-otter", flow_id=uuid.uuid4())
    config.prepare_for_flow_run(run, flow=Flow(id=run.flow_id, name="fine-tuning"))
    return dict(config.job_manifest)


@pytest.mark.usefixtures("prefect_harness")
def test_the_kubernetes_job_template_renders_a_valid_job() -> None:
    template = json.loads(TEMPLATE.read_text())
    assert "image" in template["variables"]["required"]  # no default image: say which
    job = _render(template, image="quay.io/org/telltale:abc123")
    kubernetes_validate.validate(job, "1.30", strict=True)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "quay.io/org/telltale:abc123"
    assert pod["serviceAccountName"] == "telltale-runner"
    assert job["spec"]["backoffLimit"] == 0  # a CPT run is never re-run behind one's back
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    # the secrets block reads $TELLTALE_SECRET_DIR: the Secret is mounted exactly there
    assert mounts["telltale-secrets"]["mountPath"] == env["TELLTALE_SECRET_DIR"]
    assert mounts["telltale-secrets"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["telltale-secrets"]["secret"]["secretName"] == "telltale-secrets"
    assert env["TELLTALE_RUNS_DIR"].startswith(mounts["work"]["mountPath"])
    assert "PREFECT__FLOW_RUN_ID" in env  # Prefect's own settings still reach the pod
    assert container["args"][:2] == ["prefect", "flow-run"]
    custom = _render(template, image="i:1", secret_name="cpt-creds", namespace="perf")
    kubernetes_validate.validate(custom, "1.30", strict=True)
    assert custom["metadata"]["namespace"] == "perf"
    assert custom["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] == \
        "cpt-creds"


@pytest.mark.usefixtures("prefect_harness")
def test_the_stock_template_is_what_the_schema_check_catches() -> None:
    # prefect-kubernetes' default puts completions/parallelism in the pod spec; ours moved
    # them to the Job spec: the validation used above does see such a mistake
    from prefect_kubernetes.worker import KubernetesWorker

    job = _render(KubernetesWorker.get_default_base_job_template(), image="i:1")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.30", strict=True)


def test_deployments_clone_the_configured_repo_or_use_the_image() -> None:
    data, _ = load_yaml(ROOT / "deployments" / "prefect.yaml")
    (step,) = data["pull"]
    clone = step["prefect.deployments.steps.git_clone"]
    # read by the worker at run time from Prefect variables: nothing to set on the worker
    assert clone["repository"] == "{{ prefect.variables.telltale_repository }}"
    assert clone["branch"] == "{{ prefect.variables.telltale_ref }}"
    pools = {spec["name"]: spec["work_pool"] for spec in data["deployments"]}
    kube = [s for s in data["deployments"] if s["work_pool"]["name"] == "telltale-kubernetes"]
    assert kube, pools
    for spec in kube:  # the image holds the code at its WORKDIR
        assert spec["pull"] == [{"prefect.deployments.steps.set_working_directory": {
            "directory": "/opt/telltale"}}]
        assert spec["work_pool"]["job_variables"]["image"] == \
            "{{ prefect.variables.telltale_image }}"
    assert "WORKDIR /opt/telltale" in (ROOT / "Containerfile").read_text()


def test_the_rbac_manifests_are_valid() -> None:
    documents = [d for d in yaml.safe_load_all(
        (ROOT / "deployments" / "kubernetes-rbac.yaml").read_text()) if d]
    for document in documents:
        kubernetes_validate.validate(document, "1.30", strict=True)
    template = json.loads(TEMPLATE.read_text())
    account = template["variables"]["properties"]["service_account_name"]["default"]
    assert {"kind": "ServiceAccount", "name": account} in [
        {"kind": d["kind"], "name": d["metadata"]["name"]} for d in documents]


def test_the_checked_in_rbac_is_the_generated_one() -> None:
    """deployments/kubernetes-rbac.yaml is written by `python -m deployments.rbac` from the
    declared kinds: a kind added (by the engine or a project) without regenerating fails."""
    from deployments.rbac import RBAC_FILE, main, render

    assert RBAC_FILE.read_text() == render(), "stale: python -m deployments.rbac > " \
        "deployments/kubernetes-rbac.yaml"
    assert main(["--check"]) == 0


def test_the_rbac_grants_what_is_declared_and_nothing_more() -> None:
    from deployments.rbac import grants, rbac_documents
    from tasks.kube.kinds import all_kinds

    rules = rbac_documents()[1]["rules"]
    declared = {(k.group, k.plural, v) for k in all_kinds().values() for v in k.verbs} | {
        (k.group, f"{k.plural}/{sub}", v) for k in all_kinds().values()
        for sub, verbs in k.subresources for v in verbs}
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == declared
    assert not any("*" in part for rule in rules for part in
                   (*rule["apiGroups"], *rule["resources"], *rule["verbs"]))
    # every kind a plan of any project writes is declared, with the verbs apply uses
    assert grants(rules, "kubeflow.org", "pytorchjobs", "create")
    assert grants(rules, "serving.kserve.io", "inferenceservices", "delete")
    assert grants(rules, "operators.coreos.com", "catalogsources", "create")
    assert grants(rules, "apps", "daemonsets", "list")
    assert not grants(rules, "", "secrets", "delete")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/hook", "https://10.1.2.3/hook",
                                 "http://[::1]/x", "http://192.168.0.7/x", "ftp://example/x",
                                 "https://no-such-host.invalid/hook"])
def test_a_webhook_prefect_would_refuse_is_refused_when_the_automation_is_made(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Prefect's blocks refuse a private address at send time, saying so only in the server
    log: the command checks with the same function first (exit 2, before saving anything)."""
    from deployments.automations import main, restricted_url

    assert main(["--webhook-url", url]) == 2
    assert "--allow-private-urls" in capsys.readouterr().err
    assert main(["--slack-url", url]) == 2
    assert restricted_url(url) is not None
    assert restricted_url("https://93.184.216.34/hook") is None  # a public address passes


@pytest.mark.parametrize("text", ["deployments:\n- {work_pool: 3}\n", "deployments:\n- 7\n",
                                  "deployments:\n- {name: [x]}\n", "- a list\n", "",
                                  "deployments: {}\n"])
def test_deploy_refuses_a_malformed_prefect_file_before_asking_the_api(
        tmp_path: Path, text: str) -> None:
    import subprocess
    import sys

    bad = tmp_path / "prefect.yaml"
    bad.write_text(text)
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    proc = subprocess.run([sys.executable, "-m", "deployments.deploy", "--prefect-file",
                           str(bad)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_projects_schedule_depends_on_its_name_alone() -> None:
    """Adding a project moves no other project's nights: each slot is a stable hash of the
    project's own name, whatever else is registered."""
    from deployments.prefect_file import SLOTS, slot_of

    assert slot_of("fine_tuning") == 1 and slot_of("llm_serving") == 4
    names = [f"project_{i}" for i in range(200)]
    assert {slot_of(n) for n in names} == set(range(SLOTS))  # every slot is used
    assert [slot_of(n) for n in names] == [slot_of(n) for n in reversed(names)][::-1]
