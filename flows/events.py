"""The run's Prefect events: what automations (Slack, webhooks, GitHub comments) react to.

- ``telltale.run.finished``: every run that got as far as its outcome (exit code, verdict
  counts, first failures, report, export URL);
- ``telltale.run.regression``: a run with at least one ``regression`` verdict (the KPIs,
  their change and explanation, bounded).

The resource is the run (``telltale.run.<flow run id>``) with its project and, when the CI
said where the run came from (`projects.library.notify.NotifyBlock`), the GitHub path its
comments go to. Prefect relates the event to the flow run, its deployment and its tags, so an
automation can match "nightly" runs or one deployment. No secret is in an event: outcomes
never hold one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from flows.outcome import RunOutcome

if TYPE_CHECKING:
    from projects.library.notify import NotifyBlock

__all__ = ["FINISHED", "REGRESSION", "emit_run_events"]

FINISHED = "telltale.run.finished"
REGRESSION = "telltale.run.regression"
_MAX_LINES = 20  # an event stays small: the report has the rest

logger = logging.getLogger("telltale.events")


def _resource(project: str, outcome: RunOutcome, notify: NotifyBlock,
              run_id: str | None) -> dict[str, str]:
    name = outcome.artifact_dir.rstrip("/").rsplit("/", 1)[-1]
    resource = {"prefect.resource.id": f"telltale.run.{run_id or name}",
                "prefect.resource.name": name, "telltale.project": project,
                "telltale.exit_code": str(outcome.exit_code)}
    path = notify.github_comments_path()
    if path is not None:
        resource["telltale.github.comments_path"] = path
    return resource


def emit_run_events(project: str, outcome: RunOutcome, notify: NotifyBlock,
                    run_id: str | None) -> list[str]:
    """Emit the run's events (inside or outside a flow run); returns the event names sent.

    Never raises: a run's outcome does not depend on its notifications.
    """
    if not notify.events:
        return []
    try:
        from prefect.events import emit_event

        resource = _resource(project, outcome, notify, run_id)
        payload: dict[str, Any] = {
            "exit_code": outcome.exit_code, "verdict_counts": outcome.verdict_counts,
            "failures": outcome.failures[:5], "report": outcome.report,
            "export_url": outcome.export_url, "artifact_dir": outcome.artifact_dir,
            "code_commit": outcome.code_commit}
        sent = []
        if emit_event(event=FINISHED, resource=resource, payload=payload) is not None:
            sent.append(FINISHED)
        if outcome.regressions:
            regression = {**payload, "regressions": outcome.regressions[:_MAX_LINES],
                          "more": max(0, len(outcome.regressions) - _MAX_LINES)}
            if emit_event(event=REGRESSION, resource=resource, payload=regression) is not None:
                sent.append(REGRESSION)
        return sent
    except Exception as exc:  # best effort, like the Prefect artifacts
        logger.warning("could not emit the run's events: %s", exc)
        return []
