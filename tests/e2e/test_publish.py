"""Publishing a real run: S3 export (moto server), OpenSearch (test server), replot."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import boto3
import pandas as pd
import pytest
import yaml

from analysis.history import HistoryStore
from blocks.s3 import S3Target
from tests.servers.horreum import horreum_server
from tests.servers.opensearch import opensearch_server

pytestmark = pytest.mark.slow

FAST = {"tests.fine_tuning.test_settings.max_steps": 12,
        "tests.fine_tuning.test_settings.dataset_replication": 1}


@pytest.fixture()
def secret_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "secrets"
    directory.mkdir()
    (directory / "s3.env").write_text("AWS_ACCESS_KEY_ID=key-id-not-logged\n"
                                      "export AWS_SECRET_ACCESS_KEY='secret-not-logged'\n")
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(directory))
    return directory


def _overrides(tmp_path: Path, s3_server: str, bucket: str, *, opensearch: bool = True,
               **extra: object) -> dict:
    # validity off: the suite's other workers make the machine busy (validity has its tests)
    # (a disabled OpenSearch gets none of its keys: setting them would be refused)
    searching = {"export_artifacts.opensearch.enabled": True,
                 "export_artifacts.opensearch.instance": "test",
                 "export_artifacts.opensearch.kpi_index": "fine-tuning-kpis"}
    return {**FAST, "analysis.history_uri": str(tmp_path / "history"),
            "analysis.validity.mode": "off",
            "export_artifacts.enabled": True,
            "export_artifacts.s3.bucket": bucket,
            "export_artifacts.s3.endpoint_url": s3_server,
            "export_artifacts.s3.region": "us-east-1",
            **(searching if opensearch else {}), **extra}


def test_run_is_exported_to_s3_and_opensearch(tmp_path: Path, prefect_harness, secret_dir: Path,
                                             s3_server: str, s3_bucket: str) -> None:
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    horreum_key = "HUSR_not_logged_0000"
    with opensearch_server(user="cpt", password="pw-not-logged") as (url, state), \
            horreum_server(api_key=horreum_key) as (horreum_url, horreum):
        (secret_dir / "opensearch.yaml").write_text(yaml.safe_dump({"test": {
            "url": url, "user": "cpt", "password": "pw-not-logged"}}))
        (secret_dir / "horreum.yaml").write_text(yaml.safe_dump({"lab": {
            "url": horreum_url, "api_key": horreum_key}}))
        horreum.add_test("telltale-fine-tuning")
        overrides = _overrides(tmp_path, s3_server, s3_bucket, **{
            "export_artifacts.horreum.enabled": True, "export_artifacts.horreum.instance": "lab",
            "export_artifacts.horreum.test_name": "telltale-fine-tuning",
            "export_artifacts.horreum.owner": "perf-team"})
        outcome = outcome_of(fine_tuning(presets=["light"], overrides=overrides,
                              artifact_dir=str(tmp_path / "run"), return_state=True))
        assert outcome.exit_code == 0, outcome.failures
        root = tmp_path / "run"
        assert (root / "export.url").read_text().strip() == outcome.export_url
        s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
        prefix = outcome.export_url[len(f"s3://{s3_bucket}/"):]
        keys = {o["Key"][len(prefix):] for o in
                s3.list_objects_v2(Bucket=s3_bucket, Prefix=prefix)["Contents"]}
        assert "manifest.json" in keys and "config.yaml" in keys
        assert any(k.endswith("artifacts/pod.log") for k in keys)
        manifest = json.loads(s3.get_object(Bucket=s3_bucket, Key=prefix + "manifest.json")
                              ["Body"].read())
        assert manifest["valid"] is True and len(manifest["files"]) == len(keys) - 1
        target = S3Target(bucket=s3_bucket, endpoint_url=s3_server, region="us-east-1")
        history = HistoryStore(target.history_uri("fine_tuning")).read()
        kpis = pd.read_parquet(next(root.glob("*__analysis__postprocess_results")) / "kpis.parquet")
        assert len(history) == len(kpis) >= 9 and history["run_uuid"].nunique() == 1
        run_uuid = history["run_uuid"].iloc[0]
        docs = state.indices["telltale-fine-tuning"]["docs"]
        assert list(docs) == [run_uuid]
        assert docs[run_uuid]["kpis"]["train_tokens_per_second"]["value"] > 0
        assert docs[run_uuid]["regression"]["train_runtime"]["verdict"] == "insufficient_history"
        assert docs[run_uuid]["metadata"]["validity"] == "valid"
        assert docs[run_uuid]["metadata"]["fingerprint"]["package:torch"].startswith("2.13")
        assert "mde_pct" in docs[run_uuid]["regression"]["train_runtime"]
        assert len(state.indices["telltale-fine-tuning-kpis"]["docs"]) == len(kpis)
        [uploaded] = horreum.runs  # the same run, as one Horreum run of the test
        assert uploaded["description"] == f"telltale run {run_uuid}"
        assert uploaded["data"]["kpis"] == docs[run_uuid]["kpis"]
        assert horreum_key not in json.dumps(uploaded["data"])
    everything = "\n".join(p.read_text(errors="replace") for p in root.rglob("*")
                           if p.is_file() and p.suffix in (".yaml", ".json", ".log", ".url"))
    for secret in ("pw-not-logged", "key-id-not-logged", "secret-not-logged", horreum_key):
        assert secret not in everything


def test_opensearch_down_keeps_local_artifacts(tmp_path: Path, prefect_harness,
                                               secret_dir: Path, s3_server: str,
                                               s3_bucket: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    with opensearch_server() as (url, _):
        pass  # nothing listens there any more
    (secret_dir / "opensearch.yaml").write_text(yaml.safe_dump({"test": {"url": url,
                                                                         "timeout_s": 2}}))
    # export_artifacts.opensearch.retry: 2 attempts, no wait (the default 5 waited ~7.5 s)
    overrides = _overrides(tmp_path, s3_server, s3_bucket, **{
        "export_artifacts.opensearch.retry.attempts": 2,
        "export_artifacts.opensearch.retry.backoff_base_s": 0})
    caplog.set_level(logging.DEBUG, logger="telltale.retry")
    outcome = outcome_of(fine_tuning(presets=["light"], overrides=overrides,
                          artifact_dir=str(tmp_path / "lenient"), return_state=True))
    assert outcome.exit_code == 0  # reported, not fatal by default
    assert list((tmp_path / "lenient").glob("*__cell/exit_code"))
    tries = [r.getMessage() for r in caplog.records if r.name == "telltale.retry"]
    assert any("attempt 2/2 failed" in t and "giving up" in t for t in tries), tries
    strict = outcome_of(fine_tuning(presets=["light"], overrides={
        **overrides, "export_artifacts.fail_on_error": True},
        artifact_dir=str(tmp_path / "strict"), return_state=True))
    assert strict.exit_code == 1
    assert any("export failed" in f and "opensearch" in f for f in strict.failures)
    assert next((tmp_path / "strict").glob("*__analysis__*/report/index.html")).is_file()


def test_replot_from_s3_and_from_local(tmp_path: Path, prefect_harness, secret_dir: Path,
                                       s3_server: str, s3_bucket: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of
    from flows.replot import replot

    overrides = _overrides(tmp_path, s3_server, s3_bucket, opensearch=False)
    outcome = outcome_of(fine_tuning(presets=["light"], overrides=overrides,
                          artifact_dir=str(tmp_path / "run"), return_state=True))
    monkeypatch.chdir(tmp_path)
    for mode in ("cache", "important"):
        result = replot(source=outcome.export_url.rstrip("/"), download=mode,
                        overrides={k: v for k, v in overrides.items() if "s3" in k})
        kpis = pd.read_parquet(Path(result.out_dir) / "kpis.parquet")
        assert kpis.set_index("kpi")["value"]["train_tokens_per_second"] > 0, mode
        assert result.uploaded_to.endswith("/plot/")
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    prefix = outcome.export_url[len(f"s3://{s3_bucket}/"):] + "plot/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix=prefix)["Contents"]]
    assert any(k.endswith("report/index.html") for k in keys)
    local = replot(source=str(tmp_path / "run"))
    assert Path(local.report).is_file() and local.out_dir == str(tmp_path / "run" / "plot")


def test_an_s3_history_goes_through_the_export_block_not_the_environment(
        tmp_path: Path, prefect_harness, secret_dir: Path, s3_server: str, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """analysis.history_uri on S3: judged and appended with the export's endpoint and
    credentials (one S3 identity). The AWS environment points elsewhere (a closed port): a
    second credential path would fail the run's post-processing."""
    from flows.fine_tuning.flow import fine_tuning
    from flows.orchestration import outcome_of

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    uri = f"s3://{s3_bucket}/judged-history"
    overrides = {**_overrides(tmp_path, s3_server, s3_bucket, opensearch=False),
                 "analysis.history_uri": uri}
    outcome = outcome_of(fine_tuning(presets=["light"], overrides=overrides,
                                     artifact_dir=str(tmp_path / "run"), return_state=True))
    assert outcome.exit_code == 0, outcome.failures
    target = S3Target(bucket=s3_bucket, endpoint_url=s3_server, region="us-east-1",
                      access_key_id="key-id-not-logged", secret_access_key="secret-not-logged")
    stored = HistoryStore(uri, filesystem=target.filesystem()).read()
    assert len(stored) > 0 and stored["run_uuid"].nunique() == 1
