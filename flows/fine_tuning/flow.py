"""The ``fine-tuning`` flow: the generic orchestration (`flows.orchestration`) for this project.

Typed parameters render as the deployment form in the Prefect UI. No ``from __future__ import
annotations`` here: ``flow.serve()`` validates parameters from real annotations.
"""

from typing import Any, Literal

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.orchestration import RunOutcome, cleanup_hook, finish, orchestrate

__all__ = ["FLOW", "RunOutcome", "fine_tuning"]

PROJECT = "fine_tuning"


@flow(name="fine-tuning", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=4),
      on_cancellation=[cleanup_hook(PROJECT)], on_crashed=[cleanup_hook(PROJECT)])
def fine_tuning(
    presets: list[str] = ["light"],  # noqa: B006 (Prefect needs a literal default for the UI)
    overrides: dict[str, Any] | None = None,
    platform: Literal["auto", "local", "kubernetes"] = "auto",
    artifact_dir: str | None = None,
) -> RunOutcome:
    """Fine-tune a model for each cell of the test matrix and judge the KPIs.

    Args:
        presets: Presets from ``ci_presets`` of projects/fine_tuning/config.yaml, in order.
        overrides: Dotted config key → value (typed, as given; the CLI parses --var once).
        platform: auto (a kubeconfig selects kubernetes, else local), local or kubernetes.
        artifact_dir: Where to write artifacts (default: runs/DATE-fine_tuning-RUN_ID);
            reusing one resumes its passed cells.

    Returns:
        The `RunOutcome`; a failed run ends Failed, its outcome in the state's data.
    """
    return finish(orchestrate(PROJECT, presets, overrides, platform, artifact_dir))


FLOW = fine_tuning
