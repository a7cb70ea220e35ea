"""Plan mode: what a run would do, written to disk without touching any cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from core.errors import ConfigError
from core.safeio import write_text
from core.terminal import printable
from core.yamlio import dump_yaml
from projects.config import Config
from projects.library.tests import TestBlock
from projects.matrix import Cell, expand

__all__ = ["Plan", "build_plan", "cells_of", "format_plan", "write_plan"]


class Plan(BaseModel):
    """The resolved shape of a run."""

    project: str | None = Field(description="Project name.")
    presets_applied: list[str] = Field(description="Presets, child first then parents.")
    platform: str = Field(description="Platform the run would use.")
    cells: list[Cell] = Field(description="Matrix cells in run order.")
    estimated_gpu_hours: float | None = Field(
        default=None, description="From the history of matching runs; None without history."
    )
    extra: dict[str, Any] = Field(default_factory=dict, description="Platform-specific plan.")

    @property
    def runnable(self) -> list[Cell]:
        """Cells that are not skipped."""
        return [c for c in self.cells if c.skip_reason is None]


def cells_of(config: Config, test: str) -> list[Cell]:
    """Expand the matrix of ``tests.<test>`` from a resolved config.

    Every cell is validated by the project's settings model here, at plan time: a group or
    override that leaves a cell invalid (a value list where the workload takes a list
    value) is a user error naming the cell and the setting, never a failure minutes later.

    The matrix is read from the typed test block (its ``test_settings`` as written: see
    `TestBlock.settings_as_written`).

    Raises:
        ConfigError: An invalid matrix (see `expand`) or an invalid cell.
    """
    block = _test_block(config, test)
    base = f"tests.{test}"
    cells = expand(block.settings_as_written, block.test_extra_settings, block.skip_if,
                   max_cells=config.model.matrix.max_cells)
    settings = type(block.test_settings) if isinstance(block.test_settings, BaseModel) \
        else None
    if settings is not None:
        for cell in cells:
            try:
                cell.typed_as(settings)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(p) for p in error["loc"])
                raise ConfigError(f"cell {cell.index} ({cell.name}): {error['msg']}",
                                  file=config.file, key=f"{base}.test_settings.{where}") \
                    from None
    return cells


def _test_block(config: Config, test: str) -> TestBlock:
    """The typed ``tests.<test>`` block.

    Raises:
        ConfigError: The config has no model, or no such test block.
    """
    block = getattr(getattr(config.model, "tests", None), test, None)
    if not isinstance(block, TestBlock):
        raise ConfigError(f"the config has no tests.{test} block", file=config.file,
                          key=f"tests.{test}")
    return block


def build_plan(config: Config, platform: str, *, test: str) -> Plan:
    """Resolve the plan of a run: its cells, platform, and (bare metal) the lease request."""
    extra: dict[str, Any] = {}
    clusters = config.model.clusters
    lab = clusters.sutest.lab
    if lab.enabled:
        extra["lease"] = {
            "service": "QUADS self-scheduling (/api/v3/assignments/self)",
            "count": lab.count, "filters": lab.filters,
            "description": lab.description, "wipe": lab.wipe, "ticket": lab.ticket,
            "end": "set by QUADS (its default lifetime, at most the lab's weekly deadline); "
                   "lease.json records it",
            "wait_hosts_minutes": lab.wait_hosts_minutes,
            "wait_delivery_minutes": lab.wait_delivery_minutes,
            "release": ("kept (clusters.keep)" if clusters.keep
                        else "released at the end, in every outcome"),
        }
    create = clusters.create
    if create.type:
        # said at plan time, not after hours of waiting for leased hosts to be delivered
        if create.type in ("single", "ocp", "metal") and not create.base_domain:
            raise ConfigError(f"clusters.create.type {create.type} needs a base domain (the "
                              "cluster's DNS domain)", file=config.file,
                              key="clusters.create.base_domain")
        if create.type == "pool" and not create.pool:
            raise ConfigError("clusters.create.type pool needs a ClusterPool name",
                              file=config.file, key="clusters.create.pool")
        extra["cluster"] = {"create": create.type}
    return Plan(project=config.project, presets_applied=list(config.presets_applied),
                platform=platform, cells=cells_of(config, test), extra=extra)


def write_plan(plan: Plan, config: Config, directory: str | Path) -> Path:
    """Write ``config.yaml`` (+ presets, overrides) and ``plan.yaml`` into ``directory``."""
    directory = Path(directory)
    config.save(directory)
    data = plan.model_dump(mode="json")
    data["cells"] = [
        {k: v for k, v in (("name", c.name), ("settings", c.settings),
                           ("skip_reason", c.skip_reason)) if k != "skip_reason" or v}
        for c in plan.cells
    ]
    target = directory / "plan.yaml"
    write_text(target, dump_yaml(data))
    return target


def format_plan(plan: Plan) -> str:
    """Render a plan as a short human summary table."""
    width = max([len(c.name) for c in plan.cells] + [4])
    lines = [
        f"project   {plan.project}",
        f"presets   {', '.join(plan.presets_applied) or '(none)'}",
        f"platform  {plan.platform}",
        f"cells     {len(plan.cells)} ({len(plan.runnable)} to run, "
        f"{len(plan.cells) - len(plan.runnable)} skipped)",
    ]
    lease = plan.extra.get("lease")
    if lease:
        filters = ", ".join(f"{k}={v}" for k, v in lease["filters"].items()) or "any host"
        lines.append(f"lease     QUADS: {lease['count']} host(s) [{filters}], "
                     f"wipe={lease['wipe']}, end set by QUADS, {lease['release']}")
    if plan.extra.get("manifests"):
        lines.append(f"manifests {plan.extra['manifests']} written under manifests/")
    if plan.extra.get("cluster"):
        lines.append(f"cluster   create: {plan.extra['cluster']['create']}")
    if plan.estimated_gpu_hours is not None:
        lines.append(f"estimate  {plan.estimated_gpu_hours:.3f} GPU-hours (from history)")
    lines.append("")
    lines.append(f"  {'#':>3}  {'cell':<{width}}  status")
    for cell in plan.cells:
        status = f"skip ({cell.skip_reason})" if cell.skip_reason else "run"
        lines.append(f"  {cell.index:>3}  {cell.name:<{width}}  {status}")
    # cell names and skip reasons carry values from a PR comment or a form
    return "\n".join(printable(line) for line in lines)
