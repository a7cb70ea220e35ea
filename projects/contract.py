"""The project contract: what a project declares, and what the engine calls.

A project is a plug-in (like a pytest plugin): its folder ``projects/<name>/`` holds data and
hooks, and exports one `Project` object, registered under the ``telltale.projects`` entry
point (or found as ``projects.<name>.project:PROJECT``). The engine (`flows.orchestration`,
`tasks.platforms`) resolves the config, expands the matrix and, for each cell, asks the
project *what* to run on the chosen platform; the platform decides *how*:

- local: `Project.local` returns a `LocalWorkload` (argv, env, input files) that the local
  platform runs as a process in the cell's workload dir, with its output in
  ``artifacts/pod.log``;
- kubernetes: `Project.kubernetes` returns a `KubeWorkload` (pure manifests: shared objects,
  optional data staging, run-labelled objects, the pod that carries the result);
- multi-user: the local platform runs the same `LocalWorkload` once per user behind a
  barrier; on a cluster `Project.kube_users` says what each user pod runs;
- a server the cells talk to (a model server): `Project.local_service` returns a
  `LocalService` the local platform starts once, keeps for every cell with the same
  ``key``, and stops in every outcome; the workload finds it in ``TELLTALE_SERVICE_URL``.

Hooks receive a `CellContext` holding *typed* config sections (the project's settings model
and test block), never dotted strings. A project imports nothing from ``tasks`` or ``flows``
(import-linter checks it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from analysis.project import AnalysisProject
from core.strict import StrictSettings
from core.yamlio import load_yaml
from projects.library.kinds import Kind
from projects.library.resources import resource_kpis, timeline_rows
from projects.library.tests import EngineConfig, TestBlock

__all__ = [
    "SCRATCH_DIR",
    "SERVICE_URL_ENV",
    "USERS_CONFIG_PATH",
    "USER_RESULT_DIR",
    "CellContext",
    "KubeGate",
    "KubeService",
    "KubeUsers",
    "KubeWorkload",
    "LocalService",
    "LocalWorkload",
    "Project",
    "Staging",
]

SCRATCH_DIR = "scratch"
"""A workload's scratch dir inside its step dir (removed by the platform's cleanup)."""

USERS_CONFIG_PATH = "/etc/telltale-users/config.json"
"""Where a cluster user pod finds the `KubeUsers.config` file (and `KubeUsers.files` beside
it)."""

USER_RESULT_DIR = "{dir}"
"""In a user's command, the dir whose files become that user's results (``users/user-NNN/``):
a fresh dir per user, on both platforms."""


@dataclass(frozen=True)
class CellContext:
    """What a project hook knows about the cell it builds a workload for.

    Attributes:
        settings: The cell's settings, validated by the project's settings model.
        test: The project's ``tests.<name>`` block (typed, frozen for the run).
        index: Position of the cell in the matrix.
        name: The cell's short name.
        workdir: The workload's step dir (local platform; input files are relative to it).
        data_dir: The project's ``data/`` folder.
        run_id: The run's id (labels, names).
    """

    settings: BaseModel
    test: TestBlock
    index: int
    name: str
    workdir: Path
    data_dir: Path
    run_id: str


@dataclass(frozen=True)
class LocalWorkload:
    """A process the local platform runs for one cell (or once per user).

    Attributes:
        argv: The command (no shell); ``{index}``, ``{users}`` and ``{dir}`` are replaced per
            user in a multi-user run.
        env: Extra environment variables.
        files: Input files written before the start, path relative to the workdir → text.
        preload: For a ``PYTHON -m MODULE ...`` workload: the heavy modules a warm Python
            imports ahead, once, so that later runs fork the workload from it instead of
            importing them again (`core.warm_python`; never the workload's own code).
    """

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    preload: Sequence[str] = ()


SERVICE_URL_ENV = "TELLTALE_SERVICE_URL"
"""Where a workload finds the base URL of the cell's `LocalService` (``http://127.0.0.1:P``)."""


@dataclass(frozen=True)
class LocalService:
    """A long-lived server the local platform runs for the cells (a model server...).

    Attributes:
        key: Cells with the same key share one server; a cell with another key stops it and
            starts its own (keep the matrix's server dimensions outermost).
        argv: The command (no shell); ``{port}`` is replaced by a free port on 127.0.0.1.
        env: Extra environment variables.
        health_path: Answers 200 once the server is ready.
        ready_timeout_s: How long the start may take (model load, warm-up).
        facts: Recorded in the server's ``service.json`` (model, runtime version...).
        needs: Paths the server reads as it starts (a model dir the project's prepare
            builds). A command line starts the first cell's server ahead of the run only
            when they all exist: one started before its model was built dies, or is taken
            and dies, a few seconds later (`tasks.platforms.local_ahead`).
        preload: For a ``PYTHON -m MODULE ...`` server: the heavy modules a warm Python
            imports once, left by a run after its cells, so that later runs fork the server
            from it instead of importing them again (`tasks.platforms.service_launch`).
        forked_facts: What ``facts`` says otherwise of a server forked from that warm
            Python (its record's ``launch`` says it was).
    """

    key: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    ready_timeout_s: float = 600.0
    facts: Mapping[str, Any] = field(default_factory=dict)
    needs: Sequence[str] = ()
    preload: Sequence[str] = ()
    forked_facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Staging:
    """Data staging on a cluster: a Job that fills a volume, skipped when already done.

    The volume carries a label whose value identifies what was staged; when the existing
    volume has the same value the Job is not run again.
    """

    volume: dict[str, Any]
    job: dict[str, Any]
    label: str


@dataclass(frozen=True)
class KubeGate:
    """An object that must be Ready before the rest of a cell is applied (a model server).

    Attributes:
        api_version: Its apiVersion (``serving.kserve.io/v1beta1``).
        kind: Its kind (``InferenceService``).
        name: Its name.
        pods: Label selector of its pods: one of them in ImagePullBackOff, CrashLoopBackOff...
            fails the wait at once, with the kubelet's reason.
        deadline_s: How long it may take (model download and load).
    """

    api_version: str
    kind: str
    name: str
    pods: str | None = None
    deadline_s: float = 1200.0


@dataclass(frozen=True)
class KubeWorkload:
    """What one cell applies on a cluster (pure data: ``--plan`` writes exactly this).

    Attributes:
        shared: Objects that outlive the run (Namespace...): applied without the run label.
        manifests: The run's objects, applied in order with the run-id label.
        pod: The pod whose end is the workload's end (its log is ``artifacts/pod.log``);
            empty when ``pod_selector`` finds it.
        staging: Optional data staging before ``manifests``.
        files: Files written to the step dir (e.g. the effective ``src/config_final.json``).
        capture: ``(apiVersion, kind, name, file)`` saved under ``artifacts/`` at the end.
        gates: Objects of ``manifests`` that must be Ready (condition ``Ready``) before
            ``after`` is applied; fail-fast on a terminal condition or a failing pod.
        after: Objects applied once the gates are Ready (the load against a server); their
            pods run on the driver's nodes when the driver has a MachineSet.
        pod_selector: Label selector of the workload's pod when a controller names it (a
            Job's pod: ``batch.kubernetes.io/job-name=<job>``).
    """

    shared: Sequence[dict[str, Any]]
    manifests: Sequence[dict[str, Any]]
    pod: str
    staging: Staging | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    capture: Sequence[tuple[str, str, str, str]] = ()
    gates: Sequence[KubeGate] = ()
    after: Sequence[dict[str, Any]] = ()
    pod_selector: str | None = None

    def all_manifests(self) -> list[dict[str, Any]]:
        """Every object in apply order (shared, staging, run objects, after the gates)."""
        staged = [self.staging.volume, self.staging.job] if self.staging else []
        return [*self.shared, *staged, *self.manifests, *self.after]


@dataclass(frozen=True)
class KubeService:
    """The server a cluster fan-out's users share (a model server), started before them.

    Attributes:
        shared: Objects that outlive the run (Namespace...): applied without the run label.
        manifests: The run's objects, applied in order with the run-id label (deleted at
            cleanup like every run object).
        gates: Objects of ``manifests`` that must be Ready before the users start.
    """

    shared: Sequence[dict[str, Any]]
    manifests: Sequence[dict[str, Any]]
    gates: Sequence[KubeGate] = ()


@dataclass(frozen=True)
class KubeUsers:
    """What each user pod of a cluster fan-out runs.

    Attributes:
        name: Job name (a DNS label).
        image: Container image of the user pods.
        command: Default workload argv (``multi_user.command`` overrides it); the argument
            `USER_RESULT_DIR` is replaced by a dir whose files are collected as the user's
            results.
        config: Written to `USERS_CONFIG_PATH` in every pod.
        env: Extra environment variables of the user container.
        gpus: ``nvidia.com/gpu`` per pod.
        files: More files mounted beside the config (name → text: a script).
        service: A server the users share, started (and waited on) before them.
        init_containers: Init containers of every user pod (fetching a tokenizer...).
        volumes: Extra pod volumes (for the init containers).
        mounts: Extra volume mounts of the user container.
        role: Whose nodes the user pods run on when MachineSets give each role its own:
            ``sutest`` (each user is the workload: a trainer) or ``driver`` (each user is
            a load client of ``service``).
    """

    name: str
    image: str
    command: Sequence[str]
    config: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 0
    files: Mapping[str, str] = field(default_factory=dict)
    service: KubeService | None = None
    init_containers: Sequence[dict[str, Any]] = ()
    volumes: Sequence[dict[str, Any]] = ()
    mounts: Sequence[dict[str, Any]] = ()
    role: Literal["sutest", "driver"] = "sutest"


def settings_model_of(test_model: type[TestBlock]) -> type[BaseModel]:
    """The cell settings model a test block types its ``test_settings`` with.

    Raises:
        TypeError: ``test_settings`` is not typed by a pydantic model.
    """
    annotation = test_model.model_fields["test_settings"].annotation
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise TypeError(f"{test_model.__name__}.test_settings must be typed by a settings "
                        f"model, not {annotation!r}")
    return annotation


@functools.cache
def config_model_for(name: str, test_model: type[TestBlock]) -> type[EngineConfig]:
    """The model of a project's whole config file: the engine's blocks and ``tests.<name>``.

    Every project's file has the same shape; only its test block differs, so the engine
    writes the wrapper (``tests: {<name>: <test block>}``) instead of each project.
    """
    camel = "".join(part.title() for part in name.split("_"))
    tests = create_model(f"{camel}Tests", __base__=StrictSettings,
                         __doc__=f"``tests``: the {name} test block.",
                         **{name: (test_model, Field(description=f"The {name} test."))})
    return create_model(f"{camel}Config", __base__=EngineConfig,
                        __doc__=f"The whole {name} config file.", tests=(tests, ...))


def _resource_rows(result: Any) -> list[dict[str, Any]]:
    timeline = getattr(result, "resource_timeline", None)
    return timeline_rows(timeline) if timeline is not None else []


LocalHook = Callable[[CellContext], LocalWorkload]
KubeHook = Callable[[CellContext], KubeWorkload]
UsersHook = Callable[[CellContext], KubeUsers]
ServiceHook = Callable[[CellContext], LocalService]
CheckHook = Callable[[Sequence[CellContext]], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class Project(AnalysisProject):
    """A project: its config, workload per platform, and post-processing hooks.

    The post-processing fields come from `analysis.project.AnalysisProject` (parser, KPIs,
    labels, plots), so ``python -m analysis`` reads the same object without the engine.

    Attributes:
        folder: The project's folder (``config.yaml``, ``plots.yaml``, ``data/``; the config
            is found through `projects.registry.locate`).
        flow_name: Prefect flow name (``fine-tuning``).
        test_model: The project's ``tests.<name>`` block (a `TestBlock` whose
            ``test_settings`` field is typed by the cell's settings model).
        config_model: Validates the whole config file: built by the engine from
            ``test_model`` (`config_model_for`), never written by a project.
        settings_model: Validates one cell's settings (``test_model``'s ``test_settings``).
        workload_step: Name of the workload's step dir (``run_fine_tuning_job``); the group
            is the project's name, so dirs read ``NNN__<name>__<workload_step>``.
        local: Builds the local workload of a cell (None: no local platform).
        kubernetes: Builds the cluster workload of a cell (None: no cluster platform).
        kube_users: Builds a cluster user pod (None: no cluster fan-out).
        check_local: Checks, before anything runs, that the cells can run on this machine;
            raises a `core.errors.ConfigError` naming the key otherwise.
        local_service: The server a cell's local workload talks to (None: none).
        kube_kinds: The Kubernetes kinds the project brings (a PyTorchJob, an
            InferenceService...): their REST mapping, the verbs used (the runner's RBAC is
            generated from them) and their place in the run's cleanup.
        environment: Reads the project's own machine settings from the environment (a
            serving venv's place...); the resolver calls it with every config it resolves
            from the real environment, so a malformed variable is a user error (exit 2)
            before anything runs, not a traceback in the middle of prepare.
    """

    folder: Path
    flow_name: str
    test_model: type[TestBlock]
    workload_step: str
    local: LocalHook | None = None
    kubernetes: KubeHook | None = None
    kube_users: UsersHook | None = None
    check_local: CheckHook | None = None
    local_service: ServiceHook | None = None
    kube_kinds: tuple[Kind, ...] = ()
    environment: Callable[[], object] | None = None
    config_model: type[EngineConfig] = field(init=False)
    settings_model: type[BaseModel] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_model", config_model_for(self.name, self.test_model))
        object.__setattr__(self, "settings_model", settings_model_of(self.test_model))
        # Every project gets the engine's resource capture (`RunResult` parses it): its KPI
        # family (a project may list it itself, e.g. with its throughput for the efficiency
        # KPI), its report page, and the slimming of its timeline.
        listed = {kpi.name for kpi in self.kpis}
        extra = [kpi for kpi in resource_kpis(lambda r: getattr(r, "resources", None))
                 if kpi.name not in listed]
        if extra:
            object.__setattr__(self, "kpis", [*self.kpis, *extra])
        if self.resource_rows is None:
            object.__setattr__(self, "resource_rows", _resource_rows)
        if "resource_timeline" not in self.bulky:
            object.__setattr__(self, "bulky", (*self.bulky, "resource_timeline"))
        if "resources" not in self.analysis_only:  # its KPIs are all the report shows of it
            object.__setattr__(self, "analysis_only", (*self.analysis_only, "resources"))

    @property
    def data_dir(self) -> Path:
        """The project's ``data/`` folder."""
        return self.folder / "data"

    @property
    def test_key(self) -> str:
        """Dotted path of the project's test block (``tests.<name>``)."""
        return f"tests.{self.name}"

    def analysis_defaults(self) -> dict[str, Any]:
        """The ``analysis`` block of the project's config file with no preset applied.

        Read from the file itself (the safe loader): the contract stays below the config
        resolver, which reads contracts.
        """
        data, _ = load_yaml(self.folder / "config.yaml")
        block = data.get("analysis") if isinstance(data, Mapping) else None
        return dict(block) if isinstance(block, Mapping) else {}

    def test_block(self, config: EngineConfig) -> TestBlock:
        """The project's typed ``tests.<name>`` block of a validated config."""
        block = getattr(getattr(config, "tests", None), self.name, None)
        if not isinstance(block, TestBlock):
            raise TypeError(f"tests.{self.name} of {self.name} is not a TestBlock")
        return block
