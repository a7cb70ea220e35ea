from __future__ import annotations

from flows.serve import build_deployments, load_deployment_specs


def test_prefect_yaml_deployments_build_and_validate() -> None:
    specs = load_deployment_specs()
    names = {s["name"] for s in specs}
    assert {"fine-tuning-nightly", "fine-tuning-gating", "fine-tuning-manual"} <= names
    deployments = {d.name: d for d in build_deployments()}
    nightly = deployments["fine-tuning-nightly"]
    assert nightly.schedules and nightly.schedules[0].schedule.cron == "0 2 * * *"
    assert nightly.parameters["presets"] == ["nightly"]  # light + confirmation re-runs
    schema = nightly._parameter_openapi_schema.model_dump()
    props = schema["properties"]
    assert set(props) == {"presets", "overrides", "platform", "artifact_dir"}
    assert props["presets"]["description"].startswith("Presets from ``ci_presets``")
    assert props["platform"]["enum"] == ["auto", "local", "kubernetes"]
