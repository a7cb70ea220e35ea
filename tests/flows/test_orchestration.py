"""The generic orchestration with a fake platform: resume, skip_if, stop_on_error, fan-out
aggregation, exit codes and cleanup in every outcome — in seconds, under Prefect's engine."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, StepError
from projects.matrix import Cell
from tasks.platforms.base import CellResult, RunContext

QUICK = {"analysis.report": False}
# The sweep preset: cells 0 (A), 1 (skipped by skip_if), 2 (B), 3.
A = "per_device_train_batch_size=4,learning_rate=0.0001"
B = "per_device_train_batch_size=8,learning_rate=0.0001"


class FakePlatform:
    """Records every call; cells end as scripted by name (an exit code or an exception)."""

    name = "local"

    def __init__(self, script: dict[str, Any] | None = None,
                 users: Sequence[int] = (), prepare_error: Exception | None = None,
                 write_log: bool = True) -> None:
        self.write_log = write_log
        self.script = script or {}
        self.users = list(users)
        self.prepare_error = prepare_error
        self.calls: list[str] = []

    def prepare(self, run: RunContext, cells: Sequence[Cell]) -> None:
        self.calls.append(f"prepare:{len(cells)}")
        if self.prepare_error is not None:
            raise self.prepare_error

    def capture(self, run: RunContext) -> None:
        self.calls.append("capture")

    def run_cell(self, run: RunContext, cell: Cell) -> CellResult:
        import logging

        self.calls.append(f"run:{cell.name}")
        # what the real platforms say through their module loggers
        logging.getLogger("telltale.local").info("%s started (fake platform)", cell.name)
        outcome = self.script.get(cell.name, 0)
        if isinstance(outcome, Exception):
            raise outcome
        if self.write_log:  # what a trainer leaves: the parser computes real KPIs from it
            from tasks.artifacts import artifact_dir
            from tests.factories import train_log

            job = artifact_dir() / "001__fine_tuning__run_fine_tuning_job" / "artifacts"
            job.mkdir(parents=True)
            (job / "pod.log").write_text(train_log())
        return CellResult(exit_code=outcome, reason="Completed" if outcome == 0 else "Error",
                          log_tail=None if outcome == 0 else "ValueError: boom")

    def run_users(self, run: RunContext, cell: Cell) -> list[CellResult]:
        self.calls.append(f"users:{cell.name}")
        return [CellResult(exit_code=code, user=i) for i, code in enumerate(self.users)]

    def cleanup(self, run: RunContext) -> None:
        self.calls.append("cleanup")

    @contextmanager
    def lock(self, run: RunContext) -> Iterator[None]:
        self.calls.append("lock")
        yield


_CURRENT: list[FakePlatform] = []


@pytest.fixture()
def run_fake(prefect_harness, tmp_path: Path):
    from prefect import flow
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.orchestration import orchestrate

    @flow(name="fake-orchestration")
    def fake_flow(presets: list[str], overrides: dict[str, Any], artifact_dir: str) -> Any:
        return orchestrate("fine_tuning", presets, overrides, "local", artifact_dir,
                           platform_factory=lambda name: _CURRENT[-1])

    def run(fake: FakePlatform, presets: list[str], overrides: dict[str, Any] | None = None,
            name: str = "run") -> Any:
        _CURRENT.append(fake)
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            return fake_flow(presets, {**QUICK, "analysis.history_uri": str(tmp_path / "h"),
                                       **(overrides or {})}, str(tmp_path / name))

    return run


def test_passing_matrix_exits_0_with_cleanup_last(run_fake, tmp_path: Path) -> None:
    fake = FakePlatform()
    outcome = run_fake(fake, ["sweep"])
    assert outcome.exit_code == 0, outcome.failures
    assert [c.status for c in outcome.cells] == ["passed", "skipped", "passed", "passed"]
    assert fake.calls[0] == "prepare:3" and fake.calls[1] == "lock"
    assert fake.calls[-1] == "cleanup"
    saved = json.loads((tmp_path / "run" / "outcome.json").read_text())
    assert saved["exit_code"] == 0 and len(saved["cells"]) == 4
    cell_dirs = sorted((tmp_path / "run").glob("*__cell"))
    assert [(d / "exit_code").read_text().strip() for d in cell_dirs] == ["0", "0", "0"]


def test_failed_cell_gives_exit_1_with_reason_and_log_tail(run_fake) -> None:
    fake = FakePlatform(script={B: 3})
    outcome = run_fake(fake, ["sweep"])
    assert outcome.exit_code == 1
    assert [c.status for c in outcome.cells] == ["passed", "skipped", "failed", "passed"]
    failed = outcome.cells[2]
    assert failed.exit_code == 3 and failed.log_tail == "ValueError: boom"
    assert "failed: Error" in outcome.failures[0]


def test_stop_on_error_leaves_the_rest_not_run(run_fake) -> None:
    fake = FakePlatform(script={A: 1})
    outcome = run_fake(fake, ["sweep"], {"tests.fine_tuning.stop_on_error": True})
    assert [c.status for c in outcome.cells] == ["failed", "skipped", "not_run", "not_run"]
    assert sum(call.startswith("run:") for call in fake.calls) == 1
    assert fake.calls[-1] == "cleanup"


def test_platform_error_is_the_cells_failure_and_the_matrix_goes_on(run_fake) -> None:
    fake = FakePlatform(script={A: StepError("ImagePullBackOff: no such image")})
    outcome = run_fake(fake, ["sweep"])
    assert [c.status for c in outcome.cells] == ["failed", "skipped", "passed", "passed"]
    assert outcome.cells[0].reason == "StepError: ImagePullBackOff: no such image"


def test_rerun_resumes_passed_cells_and_reruns_failed_ones(run_fake, tmp_path: Path) -> None:
    first = run_fake(FakePlatform(script={B: 1}), ["sweep"])
    assert first.exit_code == 1
    fake = FakePlatform()
    second = run_fake(fake, ["sweep"])
    assert [c.status for c in second.cells] == ["resumed", "skipped", "passed", "resumed"]
    assert [c for c in fake.calls if c.startswith("run:")] == [f"run:{B}"]
    assert second.exit_code == 0
    superseded = [d for d in (tmp_path / "run").glob("*__cell") if (d / "skip").exists()]
    assert len(superseded) == 1  # the failed attempt is kept, hidden from discovery


def test_prepare_failure_raises_after_cleanup_and_keeps_the_config(run_fake,
                                                                   tmp_path: Path) -> None:
    fake = FakePlatform(prepare_error=ConfigError("dataset 'x' not found", key="k"))
    with pytest.raises(ConfigError, match="dataset 'x' not found"):
        run_fake(fake, ["light"])
    assert fake.calls == ["prepare:1", "cleanup"]
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert not list((tmp_path / "run").glob("*__cell"))


@pytest.mark.parametrize(("users", "need_all", "status"), [
    ([0, 1, 0, 0], False, "passed"), ([0, 1, 0, 0], True, "failed"), ([1, 1], False, "failed"),
])
def test_fan_out_aggregates_user_results(run_fake, users: list[int], need_all: bool,
                                         status: str) -> None:
    fake = FakePlatform(users=users)
    outcome = run_fake(fake, ["scale_test"], {
        "tests.fine_tuning.multi_user.need_all_success": need_all})
    cell = outcome.cells[0]
    assert cell.status == status, cell
    assert "users:base" in fake.calls and not any(c.startswith("run:") for c in fake.calls)
    if status == "failed":
        assert cell.reason == f"{users.count(0)}/{len(users)} users succeeded"


def test_kpis_not_stored_is_not_green(run_fake, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the history dir should be\n")
    outcome = run_fake(FakePlatform(write_log=True), ["light"],
                       {"analysis.history_uri": str(blocked)})
    assert outcome.cells[0].status == "passed"
    assert outcome.exit_code == 1
    assert any("KPIs not stored" in f for f in outcome.failures), outcome.failures


def test_s3_refusal_fails_the_run_and_still_publishes_to_opensearch(
        run_fake, tmp_path: Path, s3_server: str, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from tests.servers.fault_proxy import fault_proxy
    from tests.servers.opensearch import opensearch_server

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(secrets))
    with fault_proxy(s3_server) as (proxy, faults), \
            opensearch_server(user="cpt", password="pw") as (url, state):
        (secrets / "opensearch.yaml").write_text(yaml.safe_dump({"os": {
            "url": url, "user": "cpt", "password": "pw"}}))
        faults.fail_next(100_000, status=403)  # S3 refuses everything, at once (no retry)
        outcome = run_fake(FakePlatform(write_log=True), ["light"], {
            "export_artifacts.enabled": True, "export_artifacts.s3.bucket": s3_bucket,
            "export_artifacts.s3.endpoint_url": proxy, "export_artifacts.s3.region": "us-east-1",
            "export_artifacts.opensearch.enabled": True,
            "export_artifacts.opensearch.instance": "os"})
        documents = sum(len(index) for index in state.indices.values())
    assert outcome.exit_code == 1
    assert any("KPIs not stored" in f for f in outcome.failures), outcome.failures
    assert not any(f.startswith("S3 export") for f in outcome.failures)  # not fail_on_error
    assert documents >= 1  # the S3 failure no longer skips OpenSearch


def test_a_failed_run_ends_its_flow_run_failed(prefect_harness, tmp_path: Path) -> None:
    """The Prefect UI, automations and deployments see a failed cell as a Failed run."""
    from prefect import flow
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.orchestration import RunFailed, finish, orchestrate, outcome_of

    @flow(name="fake-finish")
    def finishing(artifact_dir: str, code: int) -> Any:
        return finish(orchestrate(
            "fine_tuning", ["light"], {**QUICK, "analysis.history_uri": str(tmp_path / "h")},
            "local", artifact_dir, platform_factory=lambda name: FakePlatform(
                script={"base": code})))

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        state = finishing(str(tmp_path / "failed"), 3, return_state=True)
        assert state.is_failed() and "cell base failed" in str(state.message)
        assert outcome_of(state).cells[0].exit_code == 3
        with pytest.raises(RunFailed) as raised:
            finishing(str(tmp_path / "raised"), 1)
        assert raised.value.outcome.exit_code == 1
        passed = finishing(str(tmp_path / "passed"), 0, return_state=True)
        assert passed.is_completed() and outcome_of(passed).exit_code == 0


def test_telltale_log_lines_reach_the_prefect_run_logs(run_fake, tmp_path: Path) -> None:
    """A platform's own lines ("... started") are in the flow run's logs, as the UI shows."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    # the suite turns API logging off for speed (conftest); this test is about it
    with temporary_settings(updates={PREFECT_LOGGING_TO_API_ENABLED: True}):
        outcome = run_fake(FakePlatform(), ["light"])
        APILogHandler.flush(APILogHandler())  # wait for the batch to reach the API
    assert outcome.exit_code == 0

    async def messages() -> list[str]:
        # the newest runs of this flow: the suite's shared API holds more runs than the
        # server's default page (200) of an unfiltered, unsorted read
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["fake-orchestration"])),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC)
            run_id = next(r.id for r in runs if str(tmp_path) in json.dumps(r.parameters))
            logs = await client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            return [log.message for log in logs]

    found = asyncio.run(messages())
    assert any("base started (fake platform)" in m for m in found), found[-10:]


def test_a_lease_left_by_an_interrupted_run_is_named_with_its_command(
        run_fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while QUADS is down at release: outcome.json and the exception say what may
    still be active, with the command that releases it; the cell is in the outcome."""

    from flows.cli import Terminated
    from tests.servers.quads import impatient_tenant, quads_server

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(secrets))
    with quads_server() as (url, quads):
        impatient_tenant(url, quads, secrets)

        class Interrupting(FakePlatform):
            def run_cell(self, run, cell):
                quads.down = True  # QUADS goes away, then the scheduler sends SIGTERM
                raise Terminated("terminated (SIGTERM)")

        with pytest.raises(KeyboardInterrupt) as info:
            run_fake(Interrupting(), ["light"], {
                "clusters.sutest.lab.enabled": True, "clusters.sutest.lab.poll_seconds": 0.05})
    outcome = json.loads((tmp_path / "run" / "outcome.json").read_text())
    assert outcome["exit_code"] == 143
    assert [c["status"] for c in outcome["cells"]] == ["interrupted"]
    assert outcome["leftovers"] and "python -m flows.cleanup --quads --project fine_tuning" \
        in outcome["leftovers"][0]  # the command as it must be typed, project included
    assert "left something active" in outcome["failures"][-1]
    assert info.value.telltale_outcome.leftovers == outcome["leftovers"]
    assert any(a["active"] for a in quads.assignments.values())  # really left: said so


def test_the_crash_hook_releases_a_lease_with_the_saved_configs_secret_references(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The saved config.yaml masks secret values but keeps secret references (file names):
    a crash or cancellation hook in another process can still log in and release."""
    import types

    import httpx
    import yaml

    from flows.orchestration import cleanup_hook
    from projects.config import resolve
    from tasks.lab.lease import LeaseRequest, acquire_lease
    from tasks.lab.quads import QuadsClient
    from tests.servers.quads import quads_server

    secrets = tmp_path / "secrets"
    secrets.mkdir()
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(secrets))
    root = tmp_path / "run"
    root.mkdir()
    config = resolve("fine_tuning", presets=["light"], overrides={
        "clusters.sutest.lab.enabled": True}, env={})
    config.save(root)
    saved = (root / "config.yaml").read_text()
    assert "quads_credentials: quads.yaml" in saved  # a reference, kept usable
    with quads_server() as (url, quads):
        httpx.post(f"{url}/register", json={"email": "perf@example.com", "password": "pw"})
        (secrets / "quads.yaml").write_text(yaml.safe_dump({
            "url": url, "email": "perf@example.com", "password": "pw"}))
        quads.auto_deliver_after = 1
        from pydantic import SecretStr

        with QuadsClient(url, "perf@example.com", SecretStr("pw")) as client:
            lease = acquire_lease(client, LeaseRequest(count=1), root=root,
                                  sleep=lambda s: None, poll_s=0)
        assert quads.assignments[lease.assignment_id]["active"]
        hook = cleanup_hook("fine_tuning")
        run = types.SimpleNamespace(parameters={"artifact_dir": str(root)}, id="x",
                                    deployment_id=None)
        hook(flow=None, flow_run=run, state=None)  # as Prefect's runner calls it
        assert not quads.assignments[lease.assignment_id]["active"]
    record = json.loads((root / "crash_cleanup.json").read_text())
    assert record["teardown"] == "done" and record["errors"] == []


@pytest.mark.parametrize(("overrides", "artifact", "words"), [
    ({"export_artifacts.s3.endpoint_url": "http://attacker.example"}, None, "may not set"),
    ({"tests.fine_tuning.test_settings.container_image": "evil.example/x"}, None,
     "image registry"),
    ({}, "/etc", "must be a dir inside"),
    ({}, "../../elsewhere", "must be a dir inside"),
])
def test_a_deployment_forms_values_are_untrusted(run_fake, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 overrides: dict, artifact: str | None,
                                                 words: str) -> None:
    from core.errors import ConfigError
    from flows.orchestration import orchestrate

    # what Prefect's runtime reports inside a deployment's run
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", "5f1d6a4e-0000-4000-8000-000000000001")
    monkeypatch.setenv("TELLTALE_RUNS_DIR", str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=words):
        orchestrate("fine_tuning", ["light"], overrides, "local", artifact,
                    platform_factory=lambda name: FakePlatform())
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_deployment_forms_relative_artifact_dir_is_the_runs_roots(
        run_fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked against the runs root and written there — not under the worker's working
    directory (the worker removes its clone after the run)."""
    from flows.orchestration import orchestrate

    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", "5f1d6a4e-0000-4000-8000-000000000001")
    monkeypatch.setenv("TELLTALE_RUNS_DIR", str(tmp_path / "runs"))
    worker_dir = tmp_path / "worker-clone"
    worker_dir.mkdir()
    monkeypatch.chdir(worker_dir)
    outcome = orchestrate("fine_tuning", ["light"], {}, "local", "nightly/run-1",
                          platform_factory=lambda name: FakePlatform())
    assert outcome.artifact_dir == str((tmp_path / "runs" / "nightly" / "run-1").resolve())
    assert (tmp_path / "runs" / "nightly" / "run-1" / "outcome.json").is_file()
    assert not any(worker_dir.iterdir())


@pytest.mark.parametrize(("waiting", "min_history", "expected"), [
    ([0], 3, "the 4th comparable run: 3 more"), ([1, 0], 3, "the 4th comparable run: 2 more"),
    ([2], 3, "the 4th comparable run: 1 more"), ([0], 20, "the 21st comparable run: 20 more"),
    ([5], 10, "the 11th comparable run: 5 more"), ([], 3, None)])
def test_the_history_note_says_when_verdicts_start(waiting: list[int], min_history: int,
                                                   expected: str | None) -> None:
    from flows.phases import history_note

    note = history_note(waiting, min_history)
    assert (note is None) if expected is None else (expected in (note or ""))


def test_an_all_invalid_run_says_what_to_do(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The first hour on a busy machine: the terminal says why nothing is judged and how to
    get valid runs, after the INVALID lines."""
    import contextlib

    from flows import api_server
    from flows.orchestration import run_from_cli
    from flows.outcome import CellOutcome, RunOutcome

    monkeypatch.setattr(api_server, "prefect_api", contextlib.nullcontext)
    outcome = RunOutcome(artifact_dir="runs/x", exit_code=0, platform="local",
                         cells=[CellOutcome(name="base", status="passed", validity="invalid",
                                            validity_reasons=["busy machine: 41 % of CPU"])],
                         inconclusive=["base: busy machine: 41 % of CPU"])
    assert run_from_cli(lambda **_: outcome, ["light"], {}, "local", None) == 0
    out = capsys.readouterr().out
    assert "INVALID   : base: busy machine" in out
    assert "what to do:" in out and "quieter machine" in out
    assert "analysis.validity.mode=off" in out
