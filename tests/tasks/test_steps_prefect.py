"""Steps under Prefect's real engine: retries on transient errors only, artifacts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from analysis.pipeline import PostprocessOutcome, VerdictRow
from core.errors import PermanentServiceError, TransientServiceError
from tasks.artifacts import step, use_artifact_dir
from tasks.progress import ProgressArtifact
from tasks.publish.prefect_artifacts import (
    artifact_key,
    publish_results,
)


@step("demo", retries=3, retry_delay_seconds=0, retry_jitter_factor=None)
def flaky(counter: str, error: str) -> int:
    path = Path(counter)
    attempt = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(attempt))
    if attempt < 3:
        raise {"transient": TransientServiceError, "permanent": PermanentServiceError}[error](
            f"attempt {attempt}", service="s3", status=503)
    return attempt


def _states(root: Path) -> list[str]:
    return [json.loads((d / "step.json").read_text())["state"]
            for d in sorted(root.glob("*__demo__flaky"))]


def test_transient_errors_are_retried_each_attempt_in_its_own_dir(tmp_path: Path,
                                                                  prefect_harness) -> None:
    from prefect import flow

    @flow
    def run(root: str, error: str) -> int:
        with use_artifact_dir(root):
            return flaky(str(Path(root) / "counter"), error)

    assert run(str(tmp_path / "t"), "transient") == 3
    assert _states(tmp_path / "t") == ["Failed", "Failed", "Completed"]
    with pytest.raises(PermanentServiceError):
        run(str(tmp_path / "p"), "permanent")
    assert _states(tmp_path / "p") == ["Failed"]  # a 4xx-like error is never retried
    assert "PermanentServiceError" in next((tmp_path / "p").glob("*__demo__flaky/FAILURE")
                                           ).read_text()


def test_publish_results_creates_prefect_artifacts(tmp_path: Path, prefect_harness) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    report = tmp_path / "report" / "index.html"
    report.parent.mkdir()
    report.write_text("<html></html>")
    outcome = PostprocessOutcome(out_dir=str(tmp_path), runs=1, failed_runs=0, problems=0,
                                 kpi_rows=1, report=str(report),
                                 verdict_counts={"no_change": 1},
                                 verdicts=[VerdictRow(run_uuid="u", test_path="000__cell",
                                                      kpi="tps", unit="tokens/s", latest=10.0,
                                                      baseline=10.1, change_pct=-1.0,
                                                      verdict="no_change", confidence=0.9,
                                                      history_used=5, explanation="x")])

    @flow
    def publish() -> None:
        progress = ProgressArtifact("2 cells")
        progress.update(50.0, "1/2 cell(s) done")
        publish_results("telltale-test", outcome, [{"name": "base", "status": "passed",
                                                    "exit_code": 0}], tmp_path)

    publish()

    async def read() -> dict[str, object]:
        async with get_client() as client:
            keys = [artifact_key("telltale-test", k) for k in ("kpis", "summary", "report")]
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=keys)))
            return {a.key: a for a in found}

    artifacts = asyncio.run(read())
    assert artifacts["telltale-test-kpis"].type == "table"
    assert "no_change" in str(artifacts["telltale-test-kpis"].data)
    assert "| base | passed | 0 |" in str(artifacts["telltale-test-summary"].data)
    assert report.resolve().as_uri() in str(artifacts["telltale-test-report"].data)


def test_artifact_keys_are_valid() -> None:
    assert artifact_key("Fine_Tuning", "KPIs!") == "fine-tuning-kpis"
