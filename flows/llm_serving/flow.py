"""The ``llm-serving`` flow: the generic orchestration (`flows.orchestration`) for this project.

No ``from __future__ import annotations`` here: ``flow.serve()`` validates parameters from
real annotations.
"""

from typing import Any, Literal

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.orchestration import RunOutcome, cleanup_hook, finish, orchestrate

__all__ = ["FLOW", "llm_serving"]

PROJECT = "llm_serving"


@flow(name="llm-serving", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=4),
      on_cancellation=[cleanup_hook(PROJECT)], on_crashed=[cleanup_hook(PROJECT)])
def llm_serving(
    presets: list[str] = ["light"],  # noqa: B006 (Prefect needs a literal default for the UI)
    overrides: dict[str, Any] | None = None,
    platform: Literal["auto", "local", "kubernetes"] = "auto",
    artifact_dir: str | None = None,
) -> RunOutcome:
    """Run the llm_serving test for each cell of its matrix and judge the KPIs.

    Args:
        presets: Presets from ``ci_presets`` of projects/llm_serving/config.yaml, in order.
        overrides: Dotted config key → value (typed, as given; the CLI parses --var once).
        platform: auto (a kubeconfig selects kubernetes, else local), local or kubernetes.
        artifact_dir: Where to write artifacts; reusing one resumes its passed cells.
    """
    return finish(orchestrate(PROJECT, presets, overrides, platform, artifact_dir))


FLOW = llm_serving
