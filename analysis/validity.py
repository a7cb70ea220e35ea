"""Whether a cell's result is a valid measurement: the engine's checks and the project's.

A result is ``valid``, ``invalid`` (with reasons: the numbers measured a busy machine, a
bottlenecked load generator, a diverged training...) or ``failed`` (its workload did not
exit 0). Invalid and failed results are kept, shown and stored in the history marked so,
but never judged and never part of a baseline.

Engine checks, the same for every project, read the cell's own data:

- ``host.json`` (written around the cell by the local platform, `HostWindow`): the share
  of the machine's CPU time used by processes outside the run, the highest 1-minute load
  average per core, CPU steal, pages swapped in, the least memory available, the run's
  cgroup's CFS throttling;
- ``*/prometheus/series.parquet`` (the run's Prometheus, when it ran): on a cluster, where
  no ``host.json`` is written, the share of the workload's CFS periods throttled
  (``cpu_throttled_share``, cAdvisor);
- the workload's measured window (the project's ``measured_window``) against its declared
  minimum.

A check without data (no ``host.json`` on a cluster, no cgroup throttling counters) is not
made: validity never invents a measurement. Thresholds are `ValidityPolicy`'s.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from analysis.file_reader import lstat_or_none, stamp_of
from analysis.fingerprint import VISIBLE
from analysis.settings import ValidityPolicy
from core.safeio import UnreadableInputError, read_text_bounded

__all__ = [
    "HOST_FILE",
    "HostWindow",
    "MachineInputs",
    "Validity",
    "ValidityStatus",
    "engine_reasons",
    "judge_validity",
    "read_host_window",
    "read_machine_inputs",
]

logger = logging.getLogger("telltale.validity")

HOST_FILE = "host.json"
"""In a cell dir: the machine as the cell's window saw it (`HostWindow`)."""
_MAX_HOST_FILE = 64 * 1024
ValidityStatus = Literal["valid", "invalid", "failed"]


class HostWindow(BaseModel):
    """The machine during one cell's window, from ``/proc`` (and the run's cgroup).

    CPU times are seconds summed over all cores; shares are of ``cpu_total_s``.
    """

    cores: int = Field(ge=1, le=100_000)
    window_s: float = Field(ge=0, le=1e7)
    cpu_total_s: float = Field(ge=0, le=1e12, description="All CPU time of the window "
                               "(busy, idle, iowait and steal).")
    cpu_busy_s: float = Field(ge=0, le=1e12, description="CPU time spent running anything.")
    cpu_steal_s: float = Field(default=0.0, ge=0, le=1e12)
    run_cpu_s: float = Field(ge=0, le=1e12, description="CPU time of the run's own process "
                             "tree (the flow, its workloads, servers and exporters).")
    load1_max: float | None = Field(default=None, ge=0, le=1e6, description="The machine's "
                                    "1-minute load average, highest sample (the run's own "
                                    "threads included: recorded, not judged).")
    other_runnable_mean: float | None = Field(default=None, ge=0, le=1e6, description=(
        "Mean number of threads of other processes running or ready to run: the load "
        "others put on the machine."))
    memory_total_bytes: int | None = Field(default=None, ge=0)
    memory_available_min_bytes: int | None = Field(default=None, ge=0)
    swap_in_pages: int | None = Field(default=None, ge=0)
    throttled_periods: int | None = Field(default=None, ge=0)
    periods: int | None = Field(default=None, ge=0)

    @property
    def other_cpu_share(self) -> float:
        """Share of the window's CPU time used by processes outside the run."""
        if self.cpu_total_s <= 0:
            return 0.0
        return max(0.0, self.cpu_busy_s - self.run_cpu_s) / self.cpu_total_s


class Validity(BaseModel):
    """A cell result's validity: the status and, unless valid, why."""

    status: ValidityStatus = "valid"
    reasons: list[str] = Field(default_factory=list)

    @property
    def valid(self) -> bool:
        """True when the result may be judged and used as a baseline."""
        return self.status == "valid"

    def summary(self) -> str:
        """One line: ``valid`` or ``invalid: reason; reason``."""
        return self.status + (f": {'; '.join(self.reasons)}" if self.reasons else "")


class MachineInputs(BaseModel):
    """What the engine's checks read from a cell's dir (the parse cache keeps them)."""

    host: HostWindow | None = None
    throttled_share: float | None = Field(default=None, description="The share of CFS "
                                          "periods throttled: the run's cgroup's, else its "
                                          "Prometheus capture's (a cluster's pods).")


def read_machine_inputs(cell_dir: str | Path,
                        inputs: dict[str, Any] | None = None) -> MachineInputs:
    """The cell's `MachineInputs`, read from its files.

    ``inputs``: filled with the files and listings read, in the parse cache's form
    (`analysis.fingerprint.Inputs`), so the cache can keep the result.
    """
    cell = Path(cell_dir)
    host = read_host_window(cell, inputs)
    if host is not None and host.periods and host.throttled_periods is not None:
        throttled: float | None = host.throttled_periods / host.periods
    else:
        throttled = _prometheus_mean(cell, "cpu_throttled_share", inputs)
    return MachineInputs(host=host, throttled_share=throttled)


def read_host_window(cell_dir: str | Path,
                     inputs: dict[str, Any] | None = None) -> HostWindow | None:
    """The cell's `HostWindow`, or None when it has none (or an unreadable one: logged)."""
    path = Path(cell_dir) / HOST_FILE
    st = lstat_or_none(str(path))
    if inputs is not None:  # stamped before it is read: a change after it reads it again
        inputs[HOST_FILE] = stamp_of(st)
    if st is None or not stat.S_ISREG(st.st_mode):
        return None
    try:
        return HostWindow.model_validate(json.loads(
            read_text_bounded(path, _MAX_HOST_FILE, what="host window")))
    except (UnreadableInputError, ValueError, ValidationError) as exc:
        logger.warning("%s is unusable (%s): the machine checks are skipped", path,
                       str(exc).splitlines()[0][:200])
        return None


def _prometheus_mean(cell_dir: Path, query: str,
                     inputs: dict[str, Any] | None = None) -> float | None:
    """The mean of one query's samples in the cell's Prometheus capture, if it has any.

    The captures are ``<step>/prometheus/series.parquet`` (regular files, the first eight
    steps that have one); every step's is stamped in ``inputs``, present or not, so a new
    capture invalidates a cached reading.
    """
    try:
        names = sorted(fnmatch.filter(os.listdir(cell_dir), VISIBLE))
    except OSError:
        names = []
    if inputs is not None:
        inputs[f"list:/{VISIBLE}"] = names
    paths: list[str] = []
    for name in names:
        rel = f"{name}/prometheus/series.parquet"
        st = lstat_or_none(os.path.join(cell_dir, rel))
        if inputs is not None:
            inputs[rel] = stamp_of(st)
        if st is not None and stat.S_ISREG(st.st_mode) and len(paths) < 8:
            paths.append(os.path.join(cell_dir, rel))
    if not paths:
        return None
    import pandas as pd  # only runs with a Prometheus capture pay for it

    values: list[float] = []
    for path in paths:
        try:
            frame = pd.read_parquet(path, columns=["query", "value"])
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("%s is unreadable (%s): its validity checks are skipped", path, exc)
            continue
        found = pd.to_numeric(frame.loc[frame["query"] == query, "value"], errors="coerce")
        values.extend(v for v in found.tolist() if math.isfinite(v))
    return sum(values) / len(values) if values else None


def engine_reasons(cell_dir: str | Path, policy: ValidityPolicy, *,
                   measured_window_s: float | None = None,
                   min_window_s: float = 0.0,
                   machine: MachineInputs | None = None) -> list[str]:
    """Why the machine (not the system under test) decided this cell's numbers (engine checks).

    Args:
        cell_dir: The cell's result dir (``host.json``, the Prometheus capture).
        policy: The thresholds.
        measured_window_s: The workload's own measured window (the project tells).
        min_window_s: The project's declared minimum window (the policy's may be larger).
        machine: The cell's `MachineInputs` when already read (the parse cache keeps them);
            None: read from ``cell_dir``.

    Returns:
        One reason per failed check, each with the number and the threshold; none: valid.
    """
    cell = Path(cell_dir)
    reasons: list[str] = []
    machine = machine or read_machine_inputs(cell)
    host = machine.host
    if host is not None and host.cpu_total_s > 0:
        other = host.other_cpu_share
        if other > policy.max_other_cpu_share:
            reasons.append(f"busy machine: other processes used {other:.0%} of the CPU time "
                           f"(at most {policy.max_other_cpu_share:.0%})")
        steal = host.cpu_steal_s / host.cpu_total_s
        if steal > policy.max_steal_share:
            reasons.append(f"CPU steal {steal:.1%} of the CPU time (at most "
                           f"{policy.max_steal_share:.1%})")
    load = host.other_runnable_mean if host is not None else None
    if host is not None and load is not None:
        per_core = load / host.cores
        if per_core > policy.max_load_per_core:
            reasons.append(f"load from other processes: {load:.1f} runnable threads on "
                           f"{host.cores} cores ({per_core:.1f} a core; at most "
                           f"{policy.max_load_per_core:g})")
    if host is not None:
        if host.swap_in_pages is not None and host.window_s > 0:
            rate = host.swap_in_pages / host.window_s
            if rate > policy.max_swap_in_per_s:
                reasons.append(f"memory pressure: {rate:.0f} pages swapped in per second "
                               f"(at most {policy.max_swap_in_per_s:g})")
        if host.memory_total_bytes and host.memory_available_min_bytes is not None:
            share = host.memory_available_min_bytes / host.memory_total_bytes
            if share < policy.min_memory_available_share:
                reasons.append(f"memory pressure: only {share:.1%} of the memory available "
                               f"(at least {policy.min_memory_available_share:.0%})")
    throttled = machine.throttled_share
    if throttled is not None and throttled > policy.max_throttled_share:
        reasons.append(f"CPU throttled in {throttled:.0%} of the CFS periods "
                       f"(at most {policy.max_throttled_share:.0%})")
    floor = max(min_window_s, policy.min_window_s)
    if measured_window_s is not None and floor > 0 and measured_window_s < floor:
        reasons.append(f"measured window {measured_window_s:.1f} s, shorter than the "
                       f"{floor:g} s declared minimum")
    return reasons


def judge_validity(cell_dir: str | Path, exit_code: int, policy: ValidityPolicy, *,
                   project_reasons: Callable[[], Iterable[str]] | None = None,
                   measured_window_s: float | None = None,
                   min_window_s: float = 0.0,
                   machine: MachineInputs | None = None) -> Validity:
    """The validity of one cell result: failed, or the engine's and the project's checks.

    ``project_reasons`` is called only for a result that exited 0 (a project's checks read
    its parsed result); an error in it is a reason, never a crash of the analysis.
    """
    if exit_code != 0:
        return Validity(status="failed", reasons=[f"the workload exited {exit_code}"])
    if policy.mode == "off":
        return Validity()
    reasons = engine_reasons(cell_dir, policy, measured_window_s=measured_window_s,
                             min_window_s=min_window_s, machine=machine)
    if project_reasons is not None:
        try:
            reasons.extend(str(r) for r in project_reasons())
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            reasons.append(f"the project's validity checks could not run: "
                           f"{type(exc).__name__}: {exc}"[:300])
    return Validity(status="invalid" if reasons else "valid", reasons=reasons)


def validity_of(payload: dict[str, Any]) -> Validity:
    """The validity recorded in an LTS payload's metadata (valid when absent: older runs)."""
    meta = payload.get("metadata") or {}
    status = meta.get("validity") or "valid"
    reasons = meta.get("validity_reasons") or []
    return Validity(status=status if status in ("valid", "invalid", "failed") else "valid",
                    reasons=[str(r) for r in reasons][:20])
