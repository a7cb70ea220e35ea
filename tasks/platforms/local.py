"""The local platform: this machine stands in for the cluster, for every project.

- `local_machine.capture_environment` records the machine's facts (CPU, memory, OS, Python, library
  versions, GPU if any) where a cluster run records nodes and OpenShift versions;
- a cell runs the project's `LocalWorkload` as a process in its step dir
  (``NNN__<project>__<workload_step>``), in the layout a cluster run produces: input files,
  ``artifacts/pod.log``, ``artifacts/process.json``;
- a multi-user cell runs the same workload once per user behind a real start barrier
  (``python -m tasks.platforms.fanout`` in its own process), ``users/user-<NNN>/``;
- a project's `LocalService` (a model server) is started before the first cell that needs
  it, shared by the cells with its key, and stopped in cleanup (`tasks.platforms.service`);
  the workload gets its URL in ``TELLTALE_SERVICE_URL`` and its record in
  ``artifacts/service.json``;
- `cleanup_local` stops workload processes left behind (found through their pid files, so
  it also works from another process, e.g. a cancellation hook) and removes scratch dirs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import StepError
from core.pids import kill_leftovers
from core.safeio import (
    UnreadableInputError,
    open_append,
    read_text_bounded,
    write_text,
)
from core.timeline import mark
from core.warm_python import WarmPython
from projects.config import Config
from projects.contract import (
    SCRATCH_DIR,
    SERVICE_URL_ENV,
    LocalWorkload,
    Project,
)
from projects.library.runs import FORKED, FRESH
from projects.matrix import Cell
from tasks.artifacts import artifact_dir, step
from tasks.hostwatch import uncount
from tasks.observe.capture import capture_energy, capture_prometheus
from tasks.observe.energy import EnergyRecorder, meters
from tasks.observe.prometheus import PrometheusServer, local_wanted, take_ahead
from tasks.observe.promql import LOCAL_QUERIES
from tasks.platforms.base import (
    CellResult,
    RunContext,
    project_step,
    read_users,
    tail_lines,
)
from tasks.platforms.local_ahead import adopt_spare, ahead, offer_spare
from tasks.platforms.local_machine import capture_environment, read_small
from tasks.platforms.local_warm import (
    find_warm,
    offer_warm,
    run_process,
    wanted_warm,
    warm_for,
)
from tasks.platforms.service import SERVICE_FILE, RunningService, start_service
from tasks.platforms.service_launch import offer_warm_service
from tasks.progress import LogProgress, ProgressArtifact
from tasks.runner import CMDLINE_FILE, PID_FILE, CommandTimeout, die_with_parent

__all__ = [
    "LocalPlatform",
    "cleanup_local",
    "prepare_local",
]

logger = logging.getLogger("telltale.local")

# Long: a project's check may build what it needs on first use (the serving venv: ~4 min).
@step("prepare", timeout_seconds=1800)
def prepare_local(run_ctx: RunContext, cells: list[Cell]) -> dict[str, Any]:
    """Check, before anything runs, that every cell can run on this machine.

    Args:
        run_ctx: The run (project, typed config).
        cells: The cells that will run.

    Returns:
        What the project's check reported (datasets, models, library versions...).

    Raises:
        ConfigError: The project's check refused a cell (missing dataset, model, library).
    """
    if run_ctx.project.check_local is None or not cells:
        return {}
    return run_ctx.project.check_local(
        [run_ctx.cell_context(cell, artifact_dir()) for cell in cells])


def _write_inputs(here: Path, workload: LocalWorkload) -> None:
    for relative, text in workload.files.items():
        target = (here / relative).resolve()
        if here.resolve() not in target.parents:
            raise StepError(f"workload input {relative!r} escapes the step dir")
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, text)


def _service_env(here: Path, service: dict[str, Any] | None) -> dict[str, str]:
    """Record the cell's server in ``artifacts/service.json``; its URL for the workload."""
    if not service:
        return {}
    (here / "artifacts").mkdir(exist_ok=True)
    write_text(here / "artifacts" / SERVICE_FILE, json.dumps(service, indent=2) + "\n")
    return {SERVICE_URL_ENV: str(service["url"])}


def run_local_workload(run_ctx: RunContext, cell: Cell, timeout_minutes: int,
                       service: dict[str, Any] | None = None,
                       warm: dict[str, Any] | None = None) -> CellResult:
    """Run one cell's workload as a local process in the current step dir.

    Args:
        run_ctx: The run.
        cell: The cell.
        timeout_minutes: Deadline; the process group is killed past it.
        service: The record of the cell's running `LocalService`, if the project has one.
        warm: The record of the run's warm Python (`core.warm_python`): the workload is
            forked from it when its key is the workload's.

    Returns:
        The `CellResult` (a failed workload is a result, not an exception).
    """
    assert run_ctx.project.local is not None
    here = artifact_dir()
    workload = run_ctx.project.local(run_ctx.cell_context(cell, here))
    (here / "artifacts").mkdir(exist_ok=True)
    _write_inputs(here, workload)
    env = {**workload.env, **_service_env(here, service)}
    log_file = here / "artifacts" / "pod.log"
    started = time.monotonic()
    start_iso = datetime.now(UTC).isoformat()
    logger.info("starting %s cell %s", run_ctx.project.name, cell.name)
    reason = "Completed"
    argv = [str(a) for a in workload.argv]
    write_text(here / CMDLINE_FILE, "\0".join(argv))
    chosen = warm_for(warm, workload, env)
    launch = f"{FORKED} {chosen.pid}" if chosen else FRESH
    try:
        with LogProgress(log_file, cell.name):  # steps and ETA, from the workload's own bar
            code, launch = run_process(argv, env, here, log_file, timeout_minutes * 60,
                                        chosen)
        if code != 0:
            reason = "Error"
    except CommandTimeout:
        code, reason = 124, "DeadlineExceeded"
    duration = time.monotonic() - started
    write_text(here / "artifacts" / "process.json", json.dumps({
        "job_name": cell.name, "exit_code": code, "finish_reason": reason,
        "launch": launch, "start": start_iso, "end": datetime.now(UTC).isoformat(),
        "duration_s": round(duration, 3)}, indent=2) + "\n")
    (here / PID_FILE).unlink(missing_ok=True)  # finished: nothing left for cleanup to stop
    logger.info("%s finished: exit %d (%s) in %.1fs, %s", cell.name, code, reason, duration,
                launch)
    return CellResult(exit_code=code, reason=reason, duration_s=duration,
                      log_tail=None if code == 0 else tail_lines(log_file))


def count_users(root: Path, users: int) -> dict[str, int]:
    """Pending / running / succeeded / failed counts from the users' files."""
    counts = {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}
    for index in range(users):
        directory = root / f"user-{index:03d}"
        code_file = directory / "exit_code"
        if code_file.exists():
            try:
                code = int(read_text_bounded(code_file, 64, what="exit code").strip())
            except (ValueError, UnreadableInputError):
                code = 1
            counts["succeeded" if code == 0 else "failed"] += 1
        elif (directory / "pod.log").exists():
            counts["running"] += 1
        else:
            counts["pending"] += 1
    return counts


def run_local_users(run_ctx: RunContext, cell: Cell, timeout_minutes: int,
                    service: dict[str, Any] | None = None,
                    warm: dict[str, Any] | None = None) -> list[CellResult]:
    """Run ``multi_user.user_count`` users of the cell's workload behind a start barrier.

    One launcher process (``python -m tasks.platforms.fanout``) forks the users, so forks
    never copy a Prefect process's threads; this step follows them through their files and
    keeps a progress artifact with the pending, running, succeeded and failed counts. With
    a `LocalService`, every user talks to the same server. With the run's warm Python
    (``warm``, its key the workload's) each user's workload is forked from it, as a single
    cell's is (`run_local_workload`): its imports done once, not once a user.

    Returns:
        One `CellResult` per user.
    """
    assert run_ctx.project.local is not None
    here = artifact_dir()
    workload = run_ctx.project.local(run_ctx.cell_context(cell, here))
    _write_inputs(here, workload)
    env = {**workload.env, **_service_env(here, service)}
    multi_user = run_ctx.test.multi_user
    users = multi_user.user_count
    root = here / "users"
    argv = [sys.executable, "-m", "tasks.platforms.fanout", "--users", str(users),
            "--root", str(root), "--batch-size", str(multi_user.batch_size),
            "--sleep-factor", str(multi_user.sleep_factor)]
    if multi_user.abort_on_failure:
        argv.append("--abort-on-failure")
    chosen = warm_for(warm, workload, env)
    if chosen is not None:
        argv += ["--warm", json.dumps(chosen.as_record())]
    argv += ["--", *[str(a) for a in workload.argv]]
    progress = _UsersProgress(users)
    deadline = time.monotonic() + timeout_minutes * 60
    logger.info("starting %d users of %s", users, cell.name)
    write_text(here / CMDLINE_FILE, "\0".join(argv))
    with open_append(here / "launcher.log") as log:
        process = subprocess.Popen(die_with_parent(argv), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, **env})
        write_text(here / PID_FILE, f"{process.pid}\n")
        try:
            while process.poll() is None:
                if time.monotonic() > deadline:
                    raise StepError(f"{users} users not done after {timeout_minutes} min")
                progress.show(count_users(root, users))
                time.sleep(0.5)
        finally:
            if process.poll() is None:  # deadline, Ctrl-C: the users go with the launcher
                _stop_group(process.pid)
                process.wait()
            kill_leftovers(process.pid)  # and what outlived it (a user's own children)
            (here / PID_FILE).unlink(missing_ok=True)
    progress.show(count_users(root, users))
    return read_users(root, users)


class _UsersProgress:
    """A Prefect progress artifact of the users' counts (nothing outside a flow run)."""

    def __init__(self, users: int) -> None:
        self.users = users
        self.last: dict[str, int] = {}
        self.artifact = ProgressArtifact(f"{users} users pending")

    def show(self, counts: dict[str, int]) -> None:
        if counts == self.last:
            return
        done = counts["succeeded"] + counts["failed"]
        self.artifact.update(100 * done / self.users,
                             ", ".join(f"{k}: {v}" for k, v in counts.items()))
        self.last = counts


def _stop_group(pid: int) -> bool:
    try:
        os.killpg(pid, signal.SIGTERM)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _is_ours(pid_file: Path, pid: int) -> bool:
    """The pid still runs the command this run started (never a recycled pid)."""
    expected = read_small(str(pid_file.with_name(CMDLINE_FILE)))
    actual = read_small(f"/proc/{pid}/cmdline").rstrip("\0")
    return bool(expected) and actual == expected


def cleanup_local(root: str | Path) -> dict[str, Any]:
    """Stop workload processes left under ``root`` and remove the workloads' scratch dirs.

    Safe to call from any process and more than once: pid files are checked against the
    recorded command line, so a recycled pid is never killed.

    Returns:
        What was stopped and removed.
    """
    stopped: list[int] = []
    removed: list[str] = []
    base = Path(root)
    for pid_file in base.rglob(PID_FILE):
        try:  # the one reader: a FIFO planted as a pid file must not hang the crash hook
            pid = int(read_text_bounded(pid_file, 64, what="pid file").strip())
        except (OSError, ValueError, UnreadableInputError):
            continue
        if _is_ours(pid_file, pid) and _stop_group(pid):
            stopped.append(pid)
        pid_file.unlink(missing_ok=True)
    for marker in base.rglob(CMDLINE_FILE):
        scratch = marker.parent / SCRATCH_DIR
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)
            removed.append(str(scratch.relative_to(base)))
    return {"stopped_pids": stopped, "removed": removed}


@step("cleanup", timeout_seconds=300)
def cleanup(root: str) -> dict[str, Any]:
    """Cleanup phase on the local platform (see `cleanup_local`)."""
    summary = cleanup_local(root)
    logger.info("cleanup: stopped %d process(es), removed %d scratch dir(s)",
                len(summary["stopped_pids"]), len(summary["removed"]))
    return summary


class LocalPlatform:
    """This machine: the workload as a local process (see the module docstring)."""

    name = "local"
    watches_host = True  # the machine's window of each cell: the validity checks read it

    @classmethod
    @contextmanager
    def ahead(cls, project: Project, config: Config,
              artifact_dir: Path | None) -> Iterator[None]:
        """What the run takes at its start, started before the flow (`local_ahead.ahead`)."""
        with ahead(project, config, artifact_dir):
            yield

    def __init__(self) -> None:
        self.prometheus: PrometheusServer | None = None
        self.service: RunningService | None = None
        self.facts: dict[str, Any] = {}
        self.warm: WarmPython | None = None

    def prepare(self, run_ctx: RunContext, cells: Sequence[Cell]) -> None:
        """Check the cells can run here; start Prometheus; find the run's warm Python.

        Prometheus: ``observe``; the warm Python its workload forks from:
        `core.warm_python`.
        """
        self._start_prometheus(run_ctx)  # first: its 5 s until the first scrape overlaps
        wanted = wanted_warm(run_ctx, cells)
        if wanted is not None:  # its imports beside the project's check
            offer_warm(*wanted)
        self.facts = prepare_local(run_ctx, list(cells)) or {}
        # asked again: the prepare may have installed what it imports (a first serving venv)
        self.warm = find_warm(wanted_warm(run_ctx, cells) if wanted is not None else None)

    def _start_prometheus(self, run_ctx: RunContext) -> None:
        block = run_ctx.model.observe.prometheus
        if self.prometheus is not None:
            return
        if not local_wanted(block):
            if block.mode == "auto":
                logger.info("prometheus/prometheus-node-exporter not installed: no resource "
                            "KPIs (apt-get install prometheus prometheus-node-exporter)")
            return
        # Started here, in the flow's thread, not in a task's: the parent-death signal of a
        # child fires when the thread that started it ends.
        home = run_ctx.root / "prometheus"
        self.prometheus = take_ahead(home, block.scrape_interval_s) or \
            adopt_spare(block, home) or \
            PrometheusServer.start_local(home, scrape_interval_s=block.scrape_interval_s,
                                         ready_timeout_s=block.ready_timeout_s)

    def capture(self, run_ctx: RunContext) -> None:
        """Record this machine's facts."""
        capture_environment()

    def run_cell(self, run_ctx: RunContext, cell: Cell) -> CellResult:
        """Run the cell's workload; Prefect's timeout backs up the process deadline."""
        minutes = run_ctx.test.timeout_minutes
        task = project_step(run_ctx, run_local_workload).with_options(
            timeout_seconds=minutes * 60 + 120)
        service = self._service(run_ctx, cell)
        warm = self.warm.as_record() if self.warm is not None else None
        with self._observed(run_ctx, cell):
            result: CellResult = task(run_ctx, cell, minutes, service, warm)
        return result

    def _service(self, run_ctx: RunContext, cell: Cell) -> dict[str, Any] | None:
        """The cell's server, running: kept from the previous cell when its key is the same.

        Started here, in the flow's thread (not a task's): the parent-death signal of a
        child fires when the thread that started it ends, and the server outlives cells.
        """
        if run_ctx.project.local_service is None:
            return None
        spec = run_ctx.project.local_service(run_ctx.cell_context(cell, run_ctx.root))
        current = self.service
        if current is not None and current.spec.key == spec.key and current.process.running:
            return dict(current.record)
        if current is not None:
            if not current.process.running:
                logger.warning("the %s server exited (%s): starting it again", current.spec.key,
                               current.process.returncode)
            current.stop()
            self.service = None
        self.service = start_service(spec, run_ctx.root)
        return dict(self.service.record)

    @contextmanager
    def _observed(self, run_ctx: RunContext, cell: Cell) -> Iterator[None]:
        """The block is a cell's test window: captured after it, failed cells too.

        Prometheus (when on) and this machine's energy meters (`tasks.observe.energy`:
        NVML when the cell asks for GPUs, RAPL when readable; none: nothing recorded).
        """
        gpus = cell.settings.get("gpu")
        recorder = None
        found = meters(gpu=isinstance(gpus, int) and gpus > 0)
        if found:
            recorder = EnergyRecorder(found).start()
        if self.prometheus is not None and not self.prometheus.scraped:
            mark("wait for prometheus's first scrape")
            self.prometheus.wait_scraped(run_ctx.model.observe.prometheus.ready_timeout_s)
            mark(f"cell {cell.name} (scraped)")
        start = datetime.now(UTC)
        try:
            yield
        finally:  # a failed cell's resources are worth seeing too
            if recorder is not None:
                try:
                    capture_energy(recorder.stop(), [m.name for m in recorder.meters])
                except Exception as exc:  # no energy KPIs is not a failed cell
                    logger.warning("energy capture failed: %s", exc)
            if self.prometheus is not None:
                try:
                    capture_prometheus(self.prometheus, LOCAL_QUERIES, start,
                                       datetime.now(UTC))
                except Exception as exc:  # no resource KPIs is not a failed cell
                    logger.warning("prometheus capture failed: %s", exc)

    def run_users(self, run_ctx: RunContext, cell: Cell) -> list[CellResult]:
        """Run the fan-out of the cell's workload (all users against one server, if any)."""
        service = self._service(run_ctx, cell)
        warm = self.warm.as_record() if self.warm is not None else None
        with self._observed(run_ctx, cell):
            result: list[CellResult] = project_step(run_ctx, run_local_users)(
                run_ctx, cell, run_ctx.test.timeout_minutes, service, warm)
        return result

    def cleanup(self, run_ctx: RunContext) -> None:
        """Stop the server, Prometheus (snapshot first) and leftovers; remove scratch.

        The run's warm Python stays for the next runs (`core.warm_python`).
        """
        if self.warm is not None:
            uncount(self.warm.pid)
            self.warm = None
        if self.service is not None:
            try:
                self.service.stop()
            finally:
                self.service = None
        if self.prometheus is not None:
            snapshot = None
            try:
                if run_ctx.model.observe.prometheus.snapshot:
                    snapshot = self.prometheus.snapshot()
            finally:
                self.prometheus.stop()  # a server started ahead moves into the run here
                data = self.prometheus.data_dir
                self.prometheus = None
            if snapshot is not None and data is not None:
                logger.info("prometheus TSDB snapshot: %s", data / "snapshots" / snapshot.name)
        cleanup(str(run_ctx.root))

    @contextmanager
    def lock(self, run_ctx: RunContext) -> Iterator[None]:
        """Nothing to lock: each local run has its own artifact dir.

        The block is the run's cells (re-runs included): once it ends normally nothing more
        is measured, and the run leaves its spare Prometheus for the next run then
        (`offer_spare`), not at its cleanup — its post-processing and cleanup overlap the
        spare's ~5-10 s to its first scrape, which a run started right after this one waits
        for. A failed or interrupted run leaves none. So with its server's warm Python
        (`tasks.platforms.service_launch`): its imports never run beside a measurement.
        """
        yield
        if self.prometheus is not None:  # the run measured with one
            offer_spare(run_ctx.model.observe.prometheus)
        if self.service is not None:
            offer_warm_service(self.service.spec)
