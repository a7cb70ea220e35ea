"""Horreum export against a server shaped by Horreum's published OpenAPI (tests/servers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.lts import LtsKpi, LtsMetadata, LtsPayload
from blocks.horreum import HorreumInstance
from core.errors import ConfigError, PermanentServiceError, TransientServiceError
from tasks.publish.horreum import DEFAULT_SCHEMA_URI, HorreumUpload, marker, upload_payloads
from tasks.retry import RetryPolicy
from tests.servers.horreum import horreum_server

FAST = RetryPolicy(attempts=3, backoff_base_s=0, jitter=0)
KEY = "HUSR_11111111_2222_3333_4444_555555555555"
T0 = datetime(2026, 11, 1, tzinfo=UTC)



def payload(run: str, minutes: int, value: float = 10.0) -> LtsPayload:
    start = T0 + timedelta(minutes=minutes)
    return LtsPayload(
        metadata=LtsMetadata(run_uuid=run, start=start.isoformat(),
                             end=(start + timedelta(seconds=90)).isoformat(),
                             project="fine_tuning", status="success", exit_code=0,
                             validity="valid", config=f"token: {KEY}\n"),
        results={"train_runtime": 10.0},
        kpis={"tps": LtsKpi(value=value, unit="tokens/s", help="h", lower_better=False,
                            labels={"model_name": "m1"})})


WHERE = HorreumUpload(test="telltale-ft", owner="perf-team", access="PUBLIC")


def test_a_run_is_uploaded_once_with_its_times_owner_schema_and_no_secret() -> None:
    with horreum_server(api_key=KEY) as (url, state):
        state.add_test("telltale-ft")
        instance = HorreumInstance(url=url, api_key=KEY)
        counts = upload_payloads(instance, [payload("r1", 0)], WHERE, policy=FAST)
        assert counts == {"uploaded": 1, "present": 0}
        [run] = state.runs
        assert run["description"] == marker("r1") and run["owner"] == "perf-team"
        assert run["access"] == "PUBLIC" and run["schema"] == DEFAULT_SCHEMA_URI
        assert run["start"] == int(T0.timestamp() * 1000)
        assert run["stop"] - run["start"] == 90_000
        assert run["data"]["$schema"] == DEFAULT_SCHEMA_URI
        assert run["data"]["kpis"]["tps"]["value"] == 10.0 and run["data"]["valid"] is True
        assert KEY not in str(run["data"]), "the API key reached the uploaded document"
        assert KEY not in repr(instance)
        # again (a retried step, a re-run of the export): found by its uuid, not uploaded
        again = upload_payloads(instance, [payload("r1", 0), payload("r2", 5)], WHERE,
                                policy=FAST)
        assert again == {"uploaded": 1, "present": 1}
        assert [r["description"] for r in state.runs] == [marker("r1"), marker("r2")]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offsets=st.lists(st.integers(min_value=-5000, max_value=5000), min_size=1,
                        max_size=8, unique=True),
       others=st.integers(min_value=0, max_value=130))
def test_idempotent_whatever_the_test_already_holds(offsets: list[int], others: int) -> None:
    """Any number of other runs (several pages of the list), any start order: each run is
    there exactly once after two exports."""
    with horreum_server(api_key=KEY) as (url, state):
        state.add_test("telltale-ft")
        for i in range(others):  # other runs of the test, around ours in time
            state.add_run("telltale-ft", start_ms=int((T0 + timedelta(minutes=i * 77 - 5000))
                                                      .timestamp() * 1000),
                          description=f"someone else's run {i}")
        instance = HorreumInstance(url=url, api_key=KEY)
        payloads = [payload(f"run-{o}", o) for o in offsets]
        first = upload_payloads(instance, payloads, WHERE, policy=FAST)
        second = upload_payloads(instance, list(reversed(payloads)), WHERE, policy=FAST)
        assert first == {"uploaded": len(offsets), "present": 0}
        assert second == {"uploaded": 0, "present": len(offsets)}
        ours = [r["description"] for r in state.runs if r["description"].startswith("telltale")]
        assert sorted(ours) == sorted(marker(f"run-{o}") for o in offsets)


def test_transient_faults_are_retried_without_a_duplicate() -> None:
    with horreum_server(api_key=KEY) as (url, state):
        state.add_test("telltale-ft")
        state.fail_next(2, 503)
        upload_payloads(HorreumInstance(url=url, api_key=KEY), [payload("r1", 0)], WHERE,
                        policy=FAST)
        assert len(state.runs) == 1
        state.fail_next(5, 502)
        with pytest.raises(TransientServiceError):
            upload_payloads(HorreumInstance(url=url, api_key=KEY), [payload("r2", 1)], WHERE,
                            policy=FAST)


def test_a_refused_key_is_permanent_and_never_quoted() -> None:
    with horreum_server(api_key=KEY) as (url, state):
        state.add_test("telltale-ft")
        with pytest.raises(PermanentServiceError) as info:
            upload_payloads(HorreumInstance(url=url, api_key="HUSR_wrong_key_value"),
                            [payload("r1", 0)], WHERE, policy=FAST)
        assert info.value.status == 401 and "api_key" in str(info.value)
        assert "HUSR_wrong_key_value" not in str(info.value)
        assert len(state.requests) == 1, "a 401 was retried"


def test_a_missing_test_says_so_and_uploads_nothing() -> None:
    with horreum_server(api_key=KEY) as (url, state):
        with pytest.raises(PermanentServiceError, match="no test 'telltale-ft'"):
            upload_payloads(HorreumInstance(url=url, api_key=KEY), [payload("r1", 0)], WHERE,
                            policy=FAST)
        assert state.runs == []


def test_the_server_refuses_what_the_api_does_not_declare() -> None:
    """The test server is strict to the OpenAPI: the client's calls pass because they use
    only declared parameters with valid values (an undeclared one would get 400)."""
    import httpx

    with horreum_server(api_key=KEY) as (url, state):
        test_id = state.add_test("t")
        headers = {"X-Horreum-API-Key": KEY}
        bad = httpx.get(f"{url}/api/run/list/{test_id}", params={"pageSize": 5},
                        headers=headers)
        assert bad.status_code == 400 and "undeclared" in bad.text
        bad = httpx.post(f"{url}/api/run/data", params={"test": "t", "start": "1",
                                                          "stop": "1", "access": "OPEN"},
                         headers=headers, json={})
        assert bad.status_code == 400 and "access" in bad.text
        bad = httpx.post(f"{url}/api/run/data", params={"test": "t", "stop": "1"},
                         headers=headers, json={})
        assert bad.status_code == 400 and "start" in bad.text


def test_a_horreum_instance_needs_a_credential() -> None:
    with pytest.raises(ValueError, match="api_key"):
        HorreumInstance(url="http://127.0.0.1:1")
    bearer = HorreumInstance(url="http://h", token="tok-123")
    assert bearer.headers() == {"Authorization": "Bearer tok-123"}


def test_the_export_block_names_its_instance_from_the_secret_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from projects.library import ExportBlock, SecretsBlock
    from tasks.publish.export import horreum_instance

    (tmp_path / "horreum.yaml").write_text(yaml.safe_dump(
        {"lab": {"url": "https://horreum.example", "api_key": KEY}}))
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(tmp_path))
    secrets = SecretsBlock.model_validate({"dir": {"env_key": "TELLTALE_SECRET_DIR"},
                                           "horreum_instances": "horreum.yaml"})
    export = ExportBlock.model_validate({"horreum": {"enabled": True, "instance": "lab"}})
    assert horreum_instance(export, secrets).url == "https://horreum.example"
    missing = ExportBlock.model_validate({"horreum": {"enabled": True, "instance": "other"}})
    with pytest.raises(ConfigError, match="'other' is not in the secret file; it has: lab"):
        horreum_instance(missing, secrets)
