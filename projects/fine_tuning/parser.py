"""Parse one fine_tuning result dir, in Telltale's layout or the field's current tool's.

Both layouts put the workload in ``*__fine_tuning__run_fine_tuning_job/`` (with
``src/config_final.json``, ``artifacts/pod.log`` and ``artifacts/pod.json``, or
``artifacts/process.json`` for a local process) and the capture in
``*__cluster__capture_environment/`` (``nodes.json``, ``ocp_version.yml`` on a cluster;
``machine.json`` on the local platform). The field's tool adds
``*__rhods__capture_state/`` (``rhods.version``, ``rhods.createdAt``). The run dir holds
``.uuid``, ``settings.yaml``, ``exit_code``, ``test_start_end.json`` and (in either the run
dir or its parent) ``config.yaml`` and ``presets_applied``. When a glob matches several dirs,
the last in sort order wins.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from analysis.discovery import ResultDir
from analysis.parsing import FileReader, ParsedResult
from projects.fine_tuning.logparse import (
    DatasetStats,
    Progress,
    TrainSummary,
    parse_numbered_lines,
)
from projects.library.energy import kpi_window, read_energy
from projects.library.runs import RunResult, first_line, read_run, telltale_image, users_launch

__all__ = ["FineTuningParser", "FineTuningResult", "PlatformFacts", "UserResult",
           "WorkloadState"]

WORKLOAD_GLOB = "*__fine_tuning__run_fine_tuning_job"
CAPTURE_GLOB = "*__cluster__capture_environment"
RHODS_GLOB = "*__rhods__capture_state"


class WorkloadState(BaseModel):
    """How the workload container/process ended."""

    exit_code: int | None = None
    finish_reason: str | None = Field(default=None, description="Completed, Error, OOMKilled...")
    launch: str | None = Field(default=None, max_length=200, description="How a local "
                               "process was started (its process.json: a fresh process or "
                               "forked from the warm Python); None for a pod.")


class PlatformFacts(BaseModel):
    """Where it ran: a cluster's versions and nodes, or the local machine's facts."""

    platform: str | None = Field(default=None, description="local or kubernetes.")
    ocp_version: str | None = None
    rhoai_version: str | None = None
    rhoai_created_at: str | None = None
    instance_type: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None
    os_version: str | None = None
    python_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    memory_gb: float | None = None
    telltale_image: str | None = None


class UserResult(BaseModel):
    """One user of a multi-user (scale) test."""

    index: int
    exit_code: int | None = None
    time_to_start_s: float | None = Field(default=None, description="Launch → workload start.")
    runtime_s: float | None = Field(default=None, description="Workload start → end.")
    train_tokens_per_second: float | None = None
    train_runtime: float | None = None
    train_samples_per_second: float | None = None


class FineTuningResult(RunResult):
    """A parsed fine_tuning run."""

    trainer_config: dict[str, Any] | None = None
    dataset_stats: DatasetStats | None = None
    summary: TrainSummary | None = None
    progress: Progress = Field(default_factory=Progress)
    first_loss: float | None = Field(default=None, description="The loss curve's first value: "
                                     "there when the curve, stored apart, is not read.")
    last_loss: float | None = Field(default=None, description="The loss curve's last value.")
    workload: WorkloadState = Field(default_factory=WorkloadState)
    users: list[UserResult] = Field(default_factory=list, description="Multi-user tests.")
    platform: PlatformFacts = Field(default_factory=PlatformFacts)


def _pod_state(pod: Any) -> WorkloadState:
    try:
        statuses = pod["status"].get("containerStatuses") or []
        for status in statuses:
            terminated = (status.get("state") or {}).get("terminated") or \
                (status.get("lastState") or {}).get("terminated")
            if terminated:
                return WorkloadState(exit_code=terminated.get("exitCode"),
                                     finish_reason=terminated.get("reason"))
        return WorkloadState(finish_reason=pod["status"].get("phase"))
    except (KeyError, TypeError, AttributeError):
        return WorkloadState()


def _nodes_facts(nodes: Any, facts: PlatformFacts) -> None:
    items = nodes.get("items", []) if isinstance(nodes, dict) else []
    for node in items:
        labels = (node.get("metadata") or {}).get("labels") or {}
        gpus = labels.get("nvidia.com/gpu.count")
        if gpus or facts.instance_type is None:
            facts.instance_type = labels.get("node.kubernetes.io/instance-type",
                                             facts.instance_type)
        if gpus:
            facts.accelerator_type = labels.get("nvidia.com/gpu.product")
            try:
                facts.accelerator_count = int(gpus)
            except ValueError:
                pass


def _finished_at(pod: Any) -> datetime | None:
    """When the pod's trainer container finished (``state.terminated.finishedAt``)."""
    try:
        for status in pod["status"].get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            if terminated.get("finishedAt"):
                return datetime.fromisoformat(str(terminated["finishedAt"]).replace(
                    "Z", "+00:00"))
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    return None


def _train_window(out: FineTuningResult, finished: datetime | None
                  ) -> tuple[datetime | None, datetime | None]:
    """The training steps' window; (None, None): unknown.

    The local trainer prints its own bounds. A cluster's image prints none: the trainer's
    runtime ending when its container finished (a model saved after training moves it later
    by the save's time).
    """
    summary = out.summary
    if summary is None:
        return None, None
    if summary.train_start is not None and summary.train_end is not None:
        return kpi_window(summary.train_start, summary.train_end)
    if finished is not None and summary.train_runtime and finished.tzinfo is not None:
        return kpi_window(end=finished, seconds=summary.train_runtime)
    return None, None


class FineTuningParser:
    """`analysis.parsing.ResultParser` for fine_tuning runs."""

    name: ClassVar[str] = "fine_tuning"
    version: ClassVar[str] = "1.10"  # 1.9: the launch (a label); 1.10: the users' launch
    result_model: ClassVar[type[ParsedResult]] = FineTuningResult

    def parse(self, result: ResultDir, reader: FileReader) -> FineTuningResult:
        """Parse one result dir; missing or corrupt files become problems, not exceptions."""
        out = FineTuningResult(path=result.path, rel_path=result.rel_path,
                               settings=result.settings, exit_code=result.exit_code,
                               parser=self.name, parser_version=self.version)
        read_run(result, reader, out)
        finished = self._workload(reader, out)
        self._capture(reader, out)
        out.energy = read_energy(reader, *_train_window(out, finished))
        return out

    def _workload(self, reader: FileReader, out: FineTuningResult) -> datetime | None:
        """The workload's results; returns when its container finished (a cluster's pod)."""
        job = reader.glob(WORKLOAD_GLOB)
        if job is None:
            reader.problem(WORKLOAD_GLOB, "no workload dir")
            return None
        config = reader.json(f"{job}/src/config_final.json")
        if isinstance(config, dict):
            out.trainer_config = config
        user_dirs = reader.listdir(f"{job}/users", "user-*")
        if user_dirs:
            self._users(reader, out, job, user_dirs)
            return None
        log = f"{job}/artifacts/pod.log"
        lines = reader.matching_spans(log, "{")
        if lines is not None:
            metrics = parse_numbered_lines(lines)
            if out.exit_code != 0:
                out.failure = reader.tail(log)
            out.dataset_stats = metrics.dataset_stats
            out.summary = metrics.summary
            out.progress = metrics.progress
            losses = [loss for loss in metrics.progress.loss if loss is not None]
            if losses:
                out.first_loss, out.last_loss = losses[0], losses[-1]
            numbers = reader.line_numbers(log, [offset for offset, _ in metrics.problems])
            for line, (_, message) in zip(numbers, metrics.problems, strict=True):
                reader.problem(log, message, line)
            if metrics.summary is None and out.exit_code == 0:
                reader.problem(f"{job}/artifacts/pod.log", "no training summary line")
        if reader.exists(f"{job}/artifacts/pod.json"):
            pod = reader.json(f"{job}/artifacts/pod.json")
            if pod is not None:
                out.workload = _pod_state(pod)
                return _finished_at(pod)
        elif reader.exists(f"{job}/artifacts/process.json"):
            proc = reader.json(f"{job}/artifacts/process.json")
            if isinstance(proc, dict):
                launch = proc.get("launch")
                out.workload = WorkloadState(exit_code=proc.get("exit_code"),
                                             finish_reason=proc.get("finish_reason"),
                                             launch=launch[:200] if isinstance(launch, str)
                                             else None)
        else:
            reader.problem(f"{job}/artifacts/pod.json", "missing (no pod.json nor process.json)")
        return None

    def _users(self, reader: FileReader, out: FineTuningResult, job: str,
               user_dirs: list[str]) -> None:
        timings = {}
        for name in user_dirs:
            data = reader.json(f"{job}/users/{name}/timings.json")
            if isinstance(data, dict):
                timings[name] = data
        launched = min((t.get("launched_at") for t in timings.values()
                        if t.get("launched_at") is not None), default=None)
        for name in user_dirs:
            data = timings.get(name, {})
            user = UserResult(index=int(name.split("-")[-1]), exit_code=data.get("exit_code"))
            started, ended = data.get("started_at"), data.get("ended_at")
            if started is not None and launched is not None:
                user.time_to_start_s = started - launched
            if started is not None and ended is not None:
                user.runtime_s = ended - started
            lines = reader.matching_spans(f"{job}/users/{name}/pod.log", "{",
                                          required=user.exit_code != 124)
            if lines is not None:
                metrics = parse_numbered_lines(lines)
                if metrics.summary is not None:
                    user.train_tokens_per_second = metrics.summary.train_tokens_per_second
                    user.train_runtime = metrics.summary.train_runtime
                    user.train_samples_per_second = metrics.summary.train_samples_per_second
                if out.dataset_stats is None:
                    out.dataset_stats = metrics.dataset_stats
            out.users.append(user)
        out.workload = WorkloadState(
            exit_code=0 if any(u.exit_code == 0 for u in out.users) else 1,
            finish_reason=f"{sum(u.exit_code == 0 for u in out.users)}/{len(out.users)} "
                          "users succeeded",
            launch=users_launch([t.get("launch") for t in timings.values()]))

    def _capture(self, reader: FileReader, out: FineTuningResult) -> None:
        facts = out.platform
        capture = reader.glob(CAPTURE_GLOB)
        if capture is not None:
            facts.telltale_image = telltale_image(reader, capture)
            machine = reader.json(f"{capture}/machine.json", required=False)
            if isinstance(machine, dict):
                facts.platform = "local"
                for key in ("os_version", "python_version", "torch_version",
                            "transformers_version", "cpu_model", "cpu_count", "memory_gb",
                            "accelerator_type", "accelerator_count"):
                    if machine.get(key) is not None:
                        setattr(facts, key, machine[key])
                facts.instance_type = machine.get("instance_type") or "local"
            else:
                facts.platform = "kubernetes"
                nodes = reader.json(f"{capture}/nodes.json")
                if nodes is not None:
                    _nodes_facts(nodes, facts)
                version = reader.yaml(f"{capture}/ocp_version.yml", required=False)
                if isinstance(version, dict):
                    facts.ocp_version = str(version.get("openshiftVersion") or
                                            version.get("version") or "") or None
                elif version is not None:
                    facts.ocp_version = str(version)
        else:
            reader.problem(CAPTURE_GLOB, "no capture dir")
        rhods = reader.glob(RHODS_GLOB)
        if rhods is not None:
            facts.rhoai_version = first_line(reader.text(f"{rhods}/rhods.version"))
            facts.rhoai_created_at = first_line(reader.text(f"{rhods}/rhods.createdAt",
                                                             required=False))
