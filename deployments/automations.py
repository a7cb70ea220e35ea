"""Prefect automations that close the CPT loop: people hear of regressions, failed and missing runs.

    python -m deployments.automations --slack-url URL            # or --webhook-url URL,
                                      [--github-token-env VAR]    # or --block TYPE/NAME
                                      [--nightly-tag nightly] [--missing-after-hours 26]

Telltale sends nothing itself. Its runs emit Prefect events (`flows.events`); Prefect's own
automation engine (the server's triggers and actions services) matches them and sends through
Prefect notification blocks. This module only declares them, once, against the API in
``PREFECT_API_URL``; re-running replaces them (same names).

- **regression**: a ``telltale.run.regression`` event (a run with a regression verdict);
- **failed nightly**: a flow run tagged ``nightly`` ending Failed, Crashed or TimedOut;
- **missing nightly**: for each deployment tagged ``nightly`` with an active schedule, no flow
  run of it at all within ``--missing-after-hours`` (a proactive trigger: it fires on the
  *absence* of events, e.g. a worker that is down);
- **GitHub comment** (with a token): every ``telltale.run.finished`` event whose run names a
  pull request or commit (`projects.library.notify.NotifyBlock`) is answered there.

The blocks are Prefect's ``CustomWebhookNotificationBlock`` (no code of ours runs in the
server): Slack's incoming-webhook JSON, a generic JSON webhook, or GitHub's comment API, whose
path comes from the event (validated at the run's input). Any other saved notification block
(``--block slack-webhook/team``: Prefect's apprise Slack block, Teams...) works as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from core.terminal import ArgumentParser, say

__all__ = ["AUTOMATION_PREFIX", "apply_automations", "github_block", "slack_block",
           "telltale_automations", "webhook_block"]

AUTOMATION_PREFIX = "telltale: "

_REGRESSION_BODY = (
    "Regression in {{ event.resource['telltale.project'] }} run "
    "{{ event.resource['prefect.resource.name'] }}:\n"
    "{% for line in event.payload.regressions %}- {{ line }}\n{% endfor %}"
    "{% if event.payload.more %}... and {{ event.payload.more }} more\n{% endif %}"
    "Report: {{ event.payload.report }}\n"
    "{% if event.payload.export_url %}Export: {{ event.payload.export_url }}\n{% endif %}")
_FINISHED_BODY = (
    "**Telltale** {{ event.resource['telltale.project'] }} run "
    "`{{ event.resource['prefect.resource.name'] }}`: "
    "{% if event.payload.exit_code == 0 %}passed{% else %}failed "
    "(exit {{ event.payload.exit_code }}){% endif %}\n\n"
    "Verdicts: {% for kind, count in event.payload.verdict_counts.items() %}"
    "{{ kind }} {{ count }}{% if not loop.last %}, {% endif %}{% endfor %}\n"
    "{% for line in event.payload.failures %}- {{ line }}\n{% endfor %}"
    "{% if event.payload.export_url %}Results: {{ event.payload.export_url }}\n{% endif %}")


def slack_block(url: str, *, allow_private_urls: bool = False) -> Any:
    """A notification block posting Slack's incoming-webhook JSON (``{"text": ...}``)."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    return CustomWebhookNotificationBlock(
        name="telltale-slack", url=url, method="POST",
        json_data={"text": "*{{subject}}*\n{{body}}"}, allow_private_urls=allow_private_urls)


def webhook_block(url: str, *, allow_private_urls: bool = False) -> Any:
    """A notification block posting ``{"subject": ..., "body": ...}`` JSON to any URL."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    return CustomWebhookNotificationBlock(
        name="telltale-webhook", url=url, method="POST",
        json_data={"subject": "{{subject}}", "body": "{{body}}", "source": "telltale"},
        allow_private_urls=allow_private_urls)


def github_block(token: str, *, api_url: str = "https://api.github.com",
                 allow_private_urls: bool = False) -> Any:
    """A notification block that comments on GitHub; the subject is ``owner/repo/issues/N``.

    The token lives in the block's ``secrets`` (stored encrypted by Prefect, never in an event
    or a log); the subject comes from the run's event and was pattern-checked at input.
    """
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    return CustomWebhookNotificationBlock(
        name="telltale-github", url=f"{api_url.rstrip('/')}/repos/{{{{subject}}}}/comments",
        method="POST", json_data={"body": "{{body}}"},
        headers={"Authorization": "Bearer {{token}}", "Accept": "application/vnd.github+json",
                 "X-GitHub-Api-Version": "2022-11-28"},
        secrets={"token": token}, allow_private_urls=allow_private_urls)


def telltale_automations(notify_block: UUID | None, *, github_block_id: UUID | None = None,
                         nightly_tag: str = "nightly",
                         scheduled: Sequence[tuple[str, UUID]] = (),
                         missing_after: timedelta = timedelta(hours=26)) -> list[Any]:
    """The automations, not yet created.

    Args:
        notify_block: The block people are told through (Slack, webhook...); None: only
            the GitHub automation.
        github_block_id: The GitHub comment block, or None.
        nightly_tag: The tag of the runs whose failure or absence matters.
        scheduled: (name, id) of the deployments whose runs must not go missing.
        missing_after: How long without a run of one of them before saying so.
    """
    from prefect.automations import Automation, EventTrigger, Posture, SendNotification

    automations: list[Any] = []
    if notify_block is not None:
        automations.append(Automation(
            name=f"{AUTOMATION_PREFIX}regression",
            description="A run judged a KPI a regression.",
            trigger=EventTrigger(expect={"telltale.run.regression"},
                                 match={"prefect.resource.id": "telltale.run.*"},
                                 posture=Posture.Reactive, threshold=1),
            actions=[SendNotification(
                block_document_id=notify_block, body=_REGRESSION_BODY,
                subject="Telltale: regression in {{ event.resource['telltale.project'] }}")]))
        automations.append(Automation(
            name=f"{AUTOMATION_PREFIX}failed {nightly_tag}",
            description=f"A flow run tagged {nightly_tag} did not complete.",
            trigger=EventTrigger(
                expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed",
                        "prefect.flow-run.TimedOut"},
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related={"prefect.resource.id": f"prefect.tag.{nightly_tag}"},
                posture=Posture.Reactive, threshold=1),
            actions=[SendNotification(
                block_document_id=notify_block,
                subject=f"Telltale: {nightly_tag} run failed",
                body="Flow run {{ event.resource['prefect.resource.name'] }} ended "
                     "{{ event.event.rsplit('.', 1)[-1] }}"
                     "{% if event.payload.validated_state and "
                     "event.payload.validated_state.message %}: "
                     "{{ event.payload.validated_state.message }}{% endif %}.")]))
        hours = missing_after.total_seconds() / 3600
        for name, deployment_id in scheduled:
            automations.append(Automation(
                name=f"{AUTOMATION_PREFIX}missing {name}",
                description=f"No run of deployment {name} within {hours:g} h.",
                # a run that *started*: a down worker still leaves Scheduled and Late runs
                trigger=EventTrigger(
                    expect={"prefect.flow-run.Running"},
                    match={"prefect.resource.id": "prefect.flow-run.*"},
                    match_related={"prefect.resource.id": f"prefect.deployment.{deployment_id}"},
                    posture=Posture.Proactive, threshold=1, within=missing_after),
                actions=[SendNotification(
                    block_document_id=notify_block,
                    subject=f"Telltale: {name} did not run",
                    body=f"No run of deployment {name} in the last {hours:g} h: is its worker "
                         "up, its schedule active, its work pool paused?")]))
    if github_block_id is not None:
        automations.append(Automation(
            name=f"{AUTOMATION_PREFIX}github comment",
            description="Answer the pull request or commit a run came from.",
            trigger=EventTrigger(expect={"telltale.run.finished"},
                                 match={"prefect.resource.id": "telltale.run.*",
                                        "telltale.github.comments_path": "*"},
                                 posture=Posture.Reactive, threshold=1),
            actions=[SendNotification(
                block_document_id=github_block_id, body=_FINISHED_BODY,
                subject="{{ event.resource['telltale.github.comments_path'] }}")]))
    return automations


def apply_automations(automations: Sequence[Any]) -> list[UUID]:
    """Create the automations, replacing earlier ones of the same names; returns their ids."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for automation in automations:
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
    return [automation.create().id for automation in automations]


PAGE = 200
"""Prefect's API answers a read with one page (its default limit is 200): reads page on."""


def _scheduled_deployments(tag: str) -> list[tuple[str, UUID]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterTags,
        FlowFilter,
        FlowFilterId,
    )
    from prefect.client.schemas.sorting import DeploymentSort

    with get_client(sync_client=True) as client:
        found: list[Any] = []
        while True:  # every page, not the first 200
            page = client.read_deployments(deployment_filter=DeploymentFilter(
                tags=DeploymentFilterTags(all_=[tag])), sort=DeploymentSort.NAME_ASC,
                limit=PAGE, offset=len(found))
            found += page
            if len(page) < PAGE:
                break
        ids = sorted({d.flow_id for d in found}, key=str)
        flows = {f.id: f.name for start in range(0, len(ids), PAGE)
                 for f in client.read_flows(flow_filter=FlowFilter(
                     id=FlowFilterId(any_=ids[start:start + PAGE])), limit=PAGE)}
    return [(f"{flows.get(d.flow_id, '?')}/{d.name}", d.id) for d in found
            if any(s.active for s in d.schedules)]


def restricted_url(url: str) -> str | None:
    """Why Prefect's notification blocks would refuse ``url``, or None.

    The same check they run when they send: a private or unresolvable address, not http(s).
    """
    from prefect.utilities.urls import validate_restricted_url

    try:
        validate_restricted_url(url)
    except ValueError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    """Create the notification blocks and the automations; 2 on a usage error."""
    parser = ArgumentParser(prog="python -m deployments.automations",
                                     description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--slack-url", help="Slack incoming-webhook URL.")
    where.add_argument("--webhook-url", help="Any URL taking a JSON POST.")
    where.add_argument("--block", help="A saved notification block, as TYPE-SLUG/NAME.")
    parser.add_argument("--github-token-env", metavar="VAR",
                        help="Environment variable holding a GitHub token: comment on the "
                             "pull request or commit a run came from.")
    parser.add_argument("--github-api", default="https://api.github.com")
    parser.add_argument("--nightly-tag", default="nightly")
    parser.add_argument("--missing-after-hours", type=float, default=26.0)
    parser.add_argument("--allow-private-urls", action="store_true",
                        help="Let the blocks post to private addresses (an internal webhook); "
                             "without it a private or unresolvable URL is refused here, "
                             "not at send time.")
    args = parser.parse_args(argv)
    if not (args.slack_url or args.webhook_url or args.block or args.github_token_env):
        parser.error("say where to notify: --slack-url, --webhook-url, --block or "
                     "--github-token-env")
    from prefect.blocks.core import Block

    private = args.allow_private_urls
    for flag, url in (("--slack-url", args.slack_url), ("--webhook-url", args.webhook_url),
                      ("--github-api", args.github_api if args.github_token_env else None)):
        refusal = None if (url is None or private) else restricted_url(url)
        if refusal:
            say(f"error: {flag}: {refusal}: Prefect would refuse every notification to it "
                  "at send time (and say so only in its server log); pass "
                  "--allow-private-urls for an internal webhook", error=True)
            return 2
    notify_id: UUID | None = None
    if args.slack_url or args.webhook_url:
        block = slack_block(args.slack_url, allow_private_urls=private) if args.slack_url \
            else webhook_block(args.webhook_url, allow_private_urls=private)
        notify_id = block.save(block.name, overwrite=True)
    elif args.block:
        notify_id = Block.load(args.block)._block_document_id
    github_id = None
    if args.github_token_env:
        token = os.environ.get(args.github_token_env)
        if not token:
            say(f"error: ${args.github_token_env} is empty or unset", error=True)
            return 2
        gh = github_block(token, api_url=args.github_api, allow_private_urls=private)
        github_id = gh.save(gh.name, overwrite=True)
    automations = telltale_automations(
        notify_id, github_block_id=github_id, nightly_tag=args.nightly_tag,
        scheduled=_scheduled_deployments(args.nightly_tag) if notify_id else (),
        missing_after=timedelta(hours=args.missing_after_hours))
    apply_automations(automations)
    for automation in automations:
        say(f"automation: {automation.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
