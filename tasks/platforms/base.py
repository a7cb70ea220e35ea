"""The Platform seam: the engine says *run this cell*; a platform decides how.

`Platform` is what `flows.orchestration` calls, for every project alike: ``prepare`` before
the matrix, ``capture`` and ``run_cell`` (or ``run_users`` for a multi-user fan-out) per
cell, ``cleanup`` in every outcome, under ``lock`` (one run per cluster). A failed workload
is a `CellResult` with a non-zero exit code, not an exception; an exception means the
platform itself could not do its job (the engine records it as the cell's failure).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from analysis.parsing import read_tail
from core.safeio import UnreadableInputError, read_text_bounded
from projects.config import Config
from projects.contract import CellContext, Project
from projects.library.tests import EngineConfig, TestBlock
from projects.matrix import Cell
from tasks.artifacts import step

__all__ = ["CellResult", "Platform", "RunContext", "project_step", "read_users", "tail_lines"]


class CellResult(BaseModel):
    """How one cell (or one user of a fan-out) ended."""

    exit_code: int = Field(description="0 success; the workload's code, 124 on a deadline.")
    reason: str | None = Field(default=None, description="Finish reason (Completed, Error...).")
    duration_s: float = Field(default=0.0, description="Wall time of the workload.")
    user: int | None = Field(default=None, description="User index in a fan-out.")
    log_tail: str | None = Field(default=None, description="Last lines of a failed workload's "
                                                         "log: the real error, at a glance.")


@dataclass(frozen=True, repr=False)
class RunContext:
    """What every platform call knows about the run (resolved once, frozen).

    Attributes:
        project: The project's contract.
        config: The resolved, frozen config (saved as the run's ``config.yaml``).
        model: Its typed view (the project's `EngineConfig`).
        test: The project's typed ``tests.<name>`` block.
        root: The run's artifact dir.
        run_id: The run's id (labels every cluster object).
        kubeconfig: How to reach the cluster (None on the local platform).
        fingerprint: The engine's part of every cell's environment fingerprint (Telltale's
            commit, the workload environment's packages and data hashes), written to each
            cell dir as ``fingerprint.json`` (`analysis.fingerprint`).
        images: Telltale's images this run resolved, Containerfile target → reference
            (by digest after a PR build in ``prepare``; a plan shows the tag): manifests
            naming ``telltale:<target>`` run them (`tasks.kube.placement`).
    """

    project: Project
    config: Config
    model: EngineConfig
    test: TestBlock
    root: Path
    run_id: str
    kubeconfig: str | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # step parameters show this: short, and no config values
        return (f"RunContext(project={self.project.name!r}, run_id={self.run_id!r}, "
                f"root={str(self.root)!r})")

    def cell_context(self, cell: Cell, workdir: Path) -> CellContext:
        """The typed context a project hook receives for ``cell``."""
        return CellContext(settings=cell.typed_as(self.project.settings_model),
                           test=self.test, index=cell.index, name=cell.name, workdir=workdir,
                           data_dir=self.project.data_dir, run_id=self.run_id)


class Platform(Protocol):
    """Where cells run. Implementations: `LocalPlatform`, `KubernetesPlatform`.

    Optional attributes the engine reads with a default: ``watches_host`` (True: the
    cell's window is watched on this machine, ``host.json``, for the validity checks) and
    ``facts`` (what ``prepare`` learnt of the workload environment: ``versions``, ``data``
    hashes, for the fingerprint).
    """

    name: str

    @classmethod
    def ahead(cls, project: Project, config: Config,
              artifact_dir: Path | None) -> AbstractContextManager[None]:
        """What the platform starts before a command line's flow, stopped when it ends.

        It overlaps Prefect's temporary API starting. Best effort: the run starts its own.
        """

    def prepare(self, run: RunContext, cells: Sequence[Cell]) -> None:
        """Fail fast, before any cell runs, on what would fail every cell; install needs."""

    def capture(self, run: RunContext) -> None:
        """Record the platform's state in the current (cell) artifact dir."""

    def run_cell(self, run: RunContext, cell: Cell) -> CellResult:
        """Run one cell's workload in the current (cell) artifact dir."""

    def run_users(self, run: RunContext, cell: Cell) -> list[CellResult]:
        """Run ``multi_user.user_count`` users of one cell; one result per user."""

    def cleanup(self, run: RunContext) -> None:
        """Undo what the run left (processes, cluster objects); safe to repeat."""

    def lock(self, run: RunContext) -> AbstractContextManager[object]:
        """Hold the platform for this run (one run per cluster at a time).

        The block is the run's cells, re-runs included; a platform may make ready for the
        next run once it ends normally (the local one leaves its spare Prometheus then).
        """


_STEPS: dict[tuple[str, str, str], Any] = {}


def project_step(run: RunContext, fn: Callable[..., Any], *,
                 timeout_seconds: float | None = None) -> Any:
    """``fn`` as the project's workload step (``NNN__<project>__<workload_step>``), built once.

    The step dir keeps the name the project's parser looks for, whatever platform ran it.
    """
    key = (run.project.name, run.project.workload_step, fn.__name__)
    if key not in _STEPS:
        _STEPS[key] = step(run.project.name, name=run.project.workload_step,
                           timeout_seconds=timeout_seconds)(fn)
    return _STEPS[key]


def tail_lines(path: Path, lines: int = 5) -> str | None:
    """The last non-empty lines of a log (see `analysis.parsing.read_tail`)."""
    return read_tail(path, lines)


def read_users(users_dir: Path, users: int) -> list[CellResult]:
    """One result per user from the fan-out layout ``users/user-<NNN>/exit_code``.

    Both platforms leave this layout (the cluster's is collected from S3); a user with no
    exit code never reported and counts as failed.
    """
    results = []
    for index in range(users):
        directory = users_dir / f"user-{index:03d}"
        try:
            code = int(read_text_bounded(directory / "exit_code", 64, what="exit code").strip())
            reason = "Completed" if code == 0 else "Error"
        except (OSError, ValueError, UnreadableInputError):
            code, reason = 1, "no result"
        results.append(CellResult(exit_code=code, reason=reason, user=index,
                                  log_tail=None if code == 0 else
                                  tail_lines(directory / "pod.log")))
    return results
