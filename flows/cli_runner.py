"""The command line's runner: a project's flow run from the terminal.

`run_from_cli` starts the flow (with the temporary Prefect API the CLI needs), turns its
outcome into an exit code, and prints its last words: the findings, what is left running.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import TelltaleError
from flows.cli import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    exit_code_for,
    is_terminated,
    say,
)
from flows.outcome import RunOutcome, last_written, outcome_of

MAX_FINDINGS = 10


def _leftovers_of(exc: BaseException) -> list[str]:
    """What the interrupted or failed run left active.

    From its exception, or else from the outcome this process wrote: Prefect may re-raise a
    signal as an exception of its own, without the outcome we attached.
    """
    left = getattr(exc, "telltale_outcome", None) or last_written()
    return list(left.leftovers) if left is not None else []


def _say_leftovers(exc: BaseException) -> None:
    for line in _leftovers_of(exc):
        say(f"LEFT ACTIVE: {line}", error=True)


def run_from_cli(flow_fn: Callable[..., RunOutcome], presets: list[str],
                 overrides: dict[str, Any], platform: str, artifact_dir: Path | None) -> int:
    """Run a project's flow for the command line and print where to look; returns the code."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    from flows.api_server import prefect_api

    # Heartbeats let a server's services notice a crashed run; the API a CLI run starts
    # (the shared local one, or a temporary one) runs none, so they would only cost ~1 s at
    # flow exit (a thread join).
    updates = {} if PREFECT_API_URL.value() else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    try:
        with prefect_api(), temporary_settings(updates=updates):
            outcome = outcome_of(flow_fn(
                presets=presets, overrides=overrides, platform=platform,
                artifact_dir=str(artifact_dir) if artifact_dir else None, return_state=True))
    except TelltaleError as exc:
        say(f"error: {exc}", error=True)
        _say_leftovers(exc)
        return exit_code_for(exc)
    except OSError as exc:  # e.g. a full artifact disk: outcome.json was attempted already
        say(f"error: {exc.strerror or exc} ({exc.filename or artifact_dir or 'runs/'})",
            error=True)
        _say_leftovers(exc)
        return EXIT_FAILED
    except BaseException as exc:  # Ctrl-C, or SIGTERM (ours or Prefect's TerminationSignal)
        if not (isinstance(exc, KeyboardInterrupt) or is_terminated(exc)):
            raise
        left = _leftovers_of(exc)
        say(f"{'terminated' if is_terminated(exc) else 'interrupted'}: the run's cleanup ran"
            + (f" but left {len(left)} thing(s) active (below)" if left else "")
            + f"; partial results are kept ({artifact_dir or 'see runs/'})", error=True)
        _say_leftovers(exc)  # the last lines a scheduler shows
        return exit_code_for(exc)
    say("")
    say(f"artifacts : {outcome.artifact_dir}")
    for cell in outcome.cells:
        say(f"  cell {cell.name:<40} {cell.status}"
            + (f" (exit {cell.exit_code})" if cell.exit_code not in (None, 0) else "")
            + (f", {cell.validity}" if cell.validity in ("valid", "invalid") else "")
            + (f": {'; '.join(cell.validity_reasons)}" if cell.validity == "invalid" else ""))
    if outcome.verdict_counts:
        say("verdicts  : " + ", ".join(f"{k}={v}" for k, v in
                                       sorted(outcome.verdict_counts.items()))
            + (f" ({outcome.history_note})" if outcome.history_note else ""))
    for line in outcome.curves:
        if not any(line == f for f in outcome.findings):  # news is said with the findings
            say(f"  {line}")
    for line in outcome.findings[:MAX_FINDINGS]:
        say(f"  {line}")
    if len(outcome.findings) > MAX_FINDINGS:
        say(f"  ... {len(outcome.findings) - MAX_FINDINGS} more in the report")
    if outcome.report:
        say(f"report    : {outcome.report}")
    if outcome.export_url:
        say(f"exported  : {outcome.export_url}")
    for failure in outcome.failures:
        say(f"FAILED    : {failure}")
    for line in outcome.inconclusive:
        say(("INCONCLUSIVE: " if outcome.exit_code == EXIT_INCONCLUSIVE else "INVALID   : ")
            + line + (" (not judged)" if outcome.exit_code != EXIT_INCONCLUSIVE else ""))
    if outcome.inconclusive:
        say("what to do: an invalid measurement is never judged nor a baseline, so verdicts "
            "wait for valid runs — run on a quieter machine (the reasons above say what was "
            "busy); for a demo only, --var analysis.validity.mode=off judges without the "
            "checks")
    for cell in outcome.cells:
        if cell.log_tail:
            say(f"--- last lines of {cell.name}'s workload log ---\n{cell.log_tail}",
                keep_newlines=True)
    for line in outcome.leftovers:
        say(f"LEFT ACTIVE: {line}", error=True)
    return outcome.exit_code
