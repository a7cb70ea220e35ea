"""The post-process step: a thin task around `analysis.pipeline.postprocess`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.pipeline import PostprocessOutcome, postprocess, suspects, validity_of_tree
from analysis.power import repeats_for
from analysis.settings import AnalysisSettings
from blocks.opensearch import OpenSearchInstance
from blocks.s3 import S3Target
from tasks.artifacts import artifact_dir, step
from tasks.publish.opensearch import OpenSearchHistory
from tasks.publish.s3 import s3_append_lock

__all__ = ["cell_validity", "find_suspects", "postprocess_results"]


# Retries cover transient history-store faults (S3); the timeout bounds a runaway parse.
@step("analysis", retries=2, retry_delay_seconds=[5, 30], timeout_seconds=1800)
def postprocess_results(results_dir: str, project: str, history_uri: str | None,
                        settings: dict[str, Any], presets: Sequence[str],
                        config_text: str | None = None,
                        opensearch: OpenSearchInstance | None = None,
                        opensearch_index: str | None = None,
                        history_target: S3Target | None = None,
                        shared_dir: str | None = None) -> PostprocessOutcome:
    """Parse the run's result dirs, compute KPIs and verdicts, append history, render report.

    Outputs land in this step's artifact dir (``report/index.html``, ``kpis.parquet``...).

    Args:
        results_dir: The run's artifact dir.
        project: Registered project name.
        history_uri: Parquet history location (local dir or s3://).
        settings: The config's ``analysis`` block.
        presets: Presets applied, for the LTS metadata.
        config_text: Resolved config YAML (redacted), for the LTS metadata.
        opensearch: Judge against this instance's run index instead of the Parquet history
            (``analysis.history_source: opensearch``); the Parquet history is still appended.
        opensearch_index: The run index name (without the instance's prefix).
        history_target: The S3 block an ``s3://`` history is read and appended through
            (the export's endpoint and credentials); None: the AWS environment.
        shared_dir: The runs root's dir of files reports share (plotly.js, hard-linked).

    Returns:
        The `PostprocessOutcome`.
    """
    history = (OpenSearchHistory(opensearch, opensearch_index or project)
               if opensearch is not None else None)
    return postprocess(results_dir, project, artifact_dir(), history_uri=history_uri,
                       settings=AnalysisSettings.model_validate(settings), presets=presets,
                       config_text=config_text, history=history,
                       history_filesystem=_filesystem(history_target),
                       history_lock=s3_append_lock(history_target, project)
                       if history_target is not None else None, shared_dir=shared_dir)


def _filesystem(target: S3Target | None) -> Any:
    """The history's filesystem from the run's S3 block (one S3 identity), or None."""
    return target.filesystem() if target is not None else None


@step("analysis", retries=2, retry_delay_seconds=[5, 30], timeout_seconds=1800)
def find_suspects(results_dir: str, project: str, history_uri: str,
                  settings: dict[str, Any],
                  history_target: S3Target | None = None) -> dict[str, tuple[str, int]]:
    """Result dirs (relative) whose newest run alone looks like a regression → (why, re-runs).

    The confirmation re-runs of ``analysis.confirm_reruns`` are chosen from these: that many
    each, or with ``auto`` as many as bring the KPI's minimum detectable effect under
    ``analysis.target_mde_pct`` (at least 1, at most 5).
    """
    analysis = AnalysisSettings.model_validate(settings)
    found: dict[str, tuple[str, int]] = {}
    rows = suspects(results_dir, project, history_uri, analysis,
                    history_filesystem=_filesystem(history_target))
    for row in rows:
        if analysis.confirm_reruns == "auto":
            runs = repeats_for((row.mde_pct or 0.0) / 100, row.history_used,
                               analysis.target_mde_pct / 100)
            reruns = max(runs - 1, 1)
        else:
            reruns = analysis.confirm_reruns
        why, most = found.get(row.test_path, (f"{row.kpi}: {row.explanation}", 0))
        found[row.test_path] = (why, max(most, reruns))
    # the budget goes to the largest suspects first
    largest = {row.test_path: abs(row.change_pct or 0.0) for row in sorted(
        rows, key=lambda r: abs(r.change_pct or 0.0))}
    return dict(sorted(found.items(), key=lambda kv: -largest.get(kv[0], 0.0)))


# its own group: ``*__analysis__*`` is the post-processing's dir, ``*__cell*`` a cell's
@step("validity", name="check_cells", timeout_seconds=1800)
def cell_validity(results_dir: str, project: str, settings: dict[str, Any]
                  ) -> dict[str, dict[str, Any]]:
    """Each result dir's validity (relative path → status and reasons) after the cells ran.

    The flow re-runs invalid cells from it (``analysis.invalid_reruns``).
    """
    found = validity_of_tree(results_dir, project, AnalysisSettings.model_validate(settings))
    return {path: validity.model_dump() for path, validity in found.items()}
