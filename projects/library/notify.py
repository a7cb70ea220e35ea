"""The ``notify`` config block: what the run tells Prefect automations about itself.

Telltale does not send notifications itself: the run emits Prefect events
(``telltale.run.finished``, ``telltale.run.regression``) and Prefect automations, created by
``python -m deployments.automations``, turn them into Slack, webhook or GitHub messages.
This block names where a run came from, so the GitHub automation can comment on that pull
request or commit. It is set by the CI that starts the run (``--var
notify.github_repository=org/repo --var notify.pull_request=12``), never by a PR comment:
a comment must not choose where the answer goes.
"""

from __future__ import annotations

from pydantic import Field

from core.strict import StrictSettings

__all__ = ["NotifyBlock"]


class NotifyBlock(StrictSettings):
    """Events for automations, and the pull request or commit a run answers."""

    events: bool = Field(default=True, description="Emit telltale.run.* Prefect events.")
    github_repository: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$",
        description="owner/repo the run tests (with pull_request or commit).")
    pull_request: int | None = Field(default=None, ge=1, le=10**9,
                                     description="The PR to comment on.")
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$",
                               description="The commit to comment on (when no PR).")

    def github_comments_path(self) -> str | None:
        """``owner/repo/issues/N`` or ``owner/repo/commits/SHA``: where a comment goes."""
        if self.github_repository is None:
            return None
        if self.pull_request is not None:
            return f"{self.github_repository}/issues/{self.pull_request}"
        if self.commit is not None:
            return f"{self.github_repository}/commits/{self.commit}"
        return None
