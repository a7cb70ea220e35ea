"""What a run produced: its cells' outcomes and the run's own (``outcome.json``).

Its own module: the run's events (`flows.events`) and the orchestration
(`flows.orchestration`) both read it, and neither imports the other for it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from core.errors import TelltaleError
from core.timeline import Moment
from flows.cli import EXIT_OK

__all__ = ["CellOutcome", "RunFailed", "RunOutcome", "finish", "last_written", "outcome_of",
           "written"]


class CellOutcome(BaseModel):
    """What happened to one matrix cell."""

    name: str
    status: Literal["passed", "failed", "skipped", "resumed", "not_run", "interrupted"]
    exit_code: int | None = None
    dir: str | None = None
    reason: str | None = None
    log_tail: str | None = Field(default=None, description="Last lines of a failed workload.")
    validity: Literal["valid", "invalid", "failed"] | None = Field(
        default=None, description="Whether the cell's result is a valid measurement (None: "
        "not checked: skipped, not run, or validity off).")
    validity_reasons: list[str] = Field(default_factory=list)


class RunOutcome(BaseModel):
    """The result of one run of any project."""

    artifact_dir: str = Field(description="Where everything was written.")
    exit_code: int = Field(description="0 success, 1 failed cell, gate or unstored KPIs.")
    platform: str
    cells: list[CellOutcome] = Field(default_factory=list)
    report: str | None = Field(default=None, description="HTML report index.")
    verdict_counts: dict[str, int] = Field(default_factory=dict)
    history_note: str | None = Field(default=None, description="When verdicts start, while "
                                     "the history is too short to judge.")
    export_url: str | None = Field(default=None, description="Where the run was exported.")
    failures: list[str] = Field(default_factory=list, description="Why the run failed.")
    inconclusive: list[str] = Field(default_factory=list, description="Cells whose "
                                    "measurement stayed invalid, with the reasons.")
    regressions: list[str] = Field(default_factory=list, description="One line per KPI "
                                   "judged a regression: KPI, change, explanation.")
    curves: list[str] = Field(default_factory=list, description="One line per load sweep "
                              "judged as one curve: its verdict, the load range that moved, "
                              "its knee.")
    findings: list[str] = Field(default_factory=list, description="One line per KPI to look "
                                "at, worst first: regression, suspect (not confirmed), "
                                "noisier, drift, outlier (a suspect its re-runs dismissed), "
                                "improvement.")
    code_dir: str | None = Field(default=None, description="The Telltale checkout that ran "
                                 "(a deployment's run: its pull step's clone).")
    code_commit: str | None = Field(default=None, description="Its git commit, when a git "
                                    "checkout.")
    timeline: list[Moment] = Field(default_factory=list, description="Where the run's "
                                   "seconds went: each phase's start (since the process "
                                   "started) and length (core.timeline).")
    leftovers: list[str] = Field(default_factory=list, description="What the cleanup could "
                                 "not remove and may still be active (a QUADS lease, a "
                                 "cluster), each with the command that removes it.")


# The outcome this process wrote last. A command-line run is one run per process; when it is
# interrupted, Prefect's engine may re-raise the signal as an exception of its own (its
# SIGTERM handler's TerminationSignal), so the outcome attached to *our* exception can be
# lost on the way up — the CLI then reads this record to print what was left active.
_last: list[RunOutcome] = []


def written(outcome: RunOutcome) -> None:
    """Record ``outcome`` as the one this process wrote last (``outcome.json``)."""
    _last[:] = [outcome]


def last_written() -> RunOutcome | None:
    """The outcome this process wrote last, if any."""
    return _last[0] if _last else None


class RunFailed(TelltaleError):
    """The run finished and failed (a cell, the regression gate, unstored KPIs).

    It is the data of the flow run's Failed state, so the Prefect UI, automations and
    deployments see a failed run; ``outcome`` carries everything the run recorded.
    """

    def __init__(self, outcome: RunOutcome) -> None:
        super().__init__("; ".join(outcome.failures[:3]) or "the run failed")
        self.outcome = outcome


def finish(outcome: RunOutcome) -> Any:
    """What a project's flow returns: the outcome, or a Failed state carrying it."""
    if outcome.exit_code == EXIT_OK:
        return outcome
    from prefect.states import Failed

    return Failed(message=str(RunFailed(outcome))[:1000], data=RunFailed(outcome))


def outcome_of(result: Any) -> RunOutcome:
    """The `RunOutcome` of a flow call made with ``return_state=True`` (or its value).

    Raises:
        BaseException: The run ended with another error (a user error before any cell
            ran, a crash): it is raised as it was.
    """
    if hasattr(result, "result") and hasattr(result, "type"):  # a Prefect State
        result = result.result(raise_on_failure=False)
    if isinstance(result, RunFailed):
        return result.outcome
    if isinstance(result, RunOutcome):
        return result
    if isinstance(result, BaseException):
        raise result
    raise TypeError(f"not a run outcome: {type(result).__name__}")
