"""What every project's parsed result carries: the run's identity, times, config and presets.

A project's result model subclasses `RunResult`; its parser calls `read_run` first. The
engine writes these files in every cell dir (``.uuid``, ``test_start_end.json``, and
``.repeat_of`` in a confirmation re-run) and in the
run dir (``config.yaml``, ``presets_applied``); the field's tool writes the same names.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from analysis.discovery import ResultDir
from analysis.parsing import FileReader, ParsedResult
from projects.library.energy import EnergyUse
from projects.library.resources import ResourceTimeline, ResourceUsage, read_resources

__all__ = ["FORKED", "FRESH", "MIXED", "REPEAT_FILE", "RunResult", "first_line", "launch_label",
           "read_run", "run_timestamps", "run_uuid", "telltale_image", "users_launch"]

REPEAT_FILE = ".repeat_of"
"""In a re-run's cell dir: the uuid of the run it repeats (``analysis.confirm_reruns``)."""
FRESH = "fresh process"
"""A local workload's ``launch`` (its ``process.json``): started as a new interpreter."""
FORKED = "forked from the warm python"
"""The start of a forked local workload's ``launch`` (`core.warm_python`), then its pid."""


MIXED = "mixed"
"""The start of a fan-out's ``launch`` when some users were forked and some were not."""


def launch_label(launch: object) -> str:
    """A local workload's launch as a label: ``forked``, ``mixed``, or empty for a fresh one.

    Empty for every run before the warm Python and every pod: their histories stay one
    configuration, and forked runs (no import phase in their cell: other resource KPIs)
    are another; a fan-out whose users were launched both ways (its warm Python died
    mid-run) is neither.
    """
    if not isinstance(launch, str):
        return ""
    return "forked" if launch.startswith(FORKED) else MIXED if launch.startswith(MIXED) else ""


def users_launch(launches: Sequence[object]) -> str | None:
    """A fan-out's launch from its users' (``timings.json``: ``launch``).

    Every user that ran forked: the first one's; none: None (fresh processes, or users that
    never ran); both: ``mixed: N of M users forked``.
    """
    ran = [launch for launch in launches if isinstance(launch, str)]
    forked = [launch for launch in ran if launch.startswith(FORKED)]
    if not forked:
        return None
    if len(forked) == len(ran):
        return forked[0][:200]
    return f"{MIXED}: {len(forked)} of {len(ran)} users forked"


class RunResult(ParsedResult):
    """A parsed result with the run's identity."""

    run_uuid: str | None = None
    start: str | None = None
    end: str | None = None
    presets: list[str] | None = None
    config_text: str | None = None
    repeat_of: str | None = None
    resources: ResourceUsage | None = Field(default=None, description="What the cell cost "
                                            "(the engine's Prometheus capture); None: not "
                                            "measured.")
    resource_timeline: ResourceTimeline = Field(default_factory=ResourceTimeline)
    energy: EnergyUse | None = Field(default=None, description="Energy over the KPI's own "
                                     "window (projects.library.energy); None: not measured.")


def first_line(text: str | None) -> str | None:
    """The first non-blank line of a small text file, stripped (None when empty)."""
    if text is None:
        return None
    stripped = text.strip()
    return stripped.splitlines()[0].strip() if stripped else None


def read_run(result: ResultDir, reader: FileReader, out: RunResult) -> None:
    """Fill ``out``'s identity fields and resource usage (every project gets them).

    A missing file is a problem, never an exception.
    """
    out.run_uuid = first_line(reader.text(".uuid", required=False, max_bytes=4096))
    if out.run_uuid is None:
        # Deterministic fallback so re-importing the same dir stays idempotent.
        out.run_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"telltale:{result.path}"))
        reader.problem(".uuid", "missing; derived a uuid from the path")
    # A confirmation re-run names the run it repeats: the two are judged together.
    out.repeat_of = first_line(reader.text(REPEAT_FILE, required=False, max_bytes=4096))
    times = reader.json("test_start_end.json", required=False)
    if isinstance(times, dict):
        out.start = _timestamp(reader, times, "start")
        out.end = _timestamp(reader, times, "end")
    elif times is not None:
        reader.problem("test_start_end.json", "not a mapping of start/end")
    for rel in ("config.yaml", "../config.yaml"):
        if reader.exists(rel):
            out.config_text = reader.text(rel)
            break
    for rel in ("presets_applied", "../presets_applied"):
        if reader.exists(rel):
            text = reader.text(rel) or ""
            out.presets = [p.strip() for p in text.splitlines() if p.strip()]
            break
    found = read_resources(reader)
    if found is not None:
        out.resources, out.resource_timeline = found
    if result.exit_code != 0 and out.failure is None:
        out.failure = failure_line(reader)


FAILURE_LOG = "artifacts/pod.log"
"""A cell's workload log, in its workload step dir, on both platforms (a project may set
``failure`` itself)."""


def failure_line(reader: FileReader) -> str | None:
    """Why a failed workload failed, in its own words (None without a log).

    Its last ``error:`` line, else its log's last line.
    """
    # the workload step: the last step dir holding a log (capture steps hold none)
    log = next((f"{d}/{FAILURE_LOG}" for d in reversed(reader.listdir(".", "[0-9]*__*__*"))
                if reader.exists(f"{d}/{FAILURE_LOG}")), None)
    if log is None:
        return None
    said = None
    for _, line in reader.matching_spans(log, "error:", required=False) or []:
        if line.lstrip().lower().startswith("error:"):
            said = line.strip()
    return (said or reader.tail(log, 1) or "").strip()[:500] or None


def _timestamp(reader: FileReader, times: dict[str, object], key: str) -> str | None:
    """An ISO 8601 time from the file, or None and a problem (never a later crash)."""
    value = times.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
            return value
        except ValueError:
            pass
    reader.problem("test_start_end.json", f"{key} is not an ISO 8601 time: {str(value)[:40]!r}")
    return None


def telltale_image(reader: FileReader, capture: str) -> str | None:
    """The image Telltale ran from (``TELLTALE_IMAGE``), from a capture step's facts.

    The local platform records it in ``machine.json``, the cluster platform in
    ``runner.json``; None when Telltale did not run from an image.
    """
    for name in ("machine.json", "runner.json"):
        facts = reader.json(f"{capture}/{name}", required=False)
        if isinstance(facts, dict) and isinstance(facts.get("telltale_image"), str):
            return str(facts["telltale_image"])[:200]
    return None


def run_uuid(result: ParsedResult) -> str:
    """`AnalysisProject.run_uuid` for a `RunResult`."""
    return getattr(result, "run_uuid", None) or result.rel_path


def run_timestamps(result: ParsedResult) -> tuple[str | None, str | None]:
    """`AnalysisProject.timestamps` for a `RunResult`."""
    return getattr(result, "start", None), getattr(result, "end", None)
