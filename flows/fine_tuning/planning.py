"""Plan mode of the fine_tuning flow (no Prefect import: it must answer in well under 3 s)."""

from __future__ import annotations

from pathlib import Path

from projects.config import Config
from projects.plan import Plan, build_plan, write_plan

__all__ = ["plan_run"]


def plan_run(config: Config, platform: str, artifact_dir: Path) -> Plan:
    """Resolve the plan of a run and write it (config, plan) into ``artifact_dir``."""
    plan = build_plan(config, platform)
    write_plan(plan, config, artifact_dir)
    return plan
