"""Plan mode of the fine_tuning flow (no Prefect import: it must answer in well under 3 s)."""

from __future__ import annotations

from pathlib import Path

from analysis.yamlio import dump_yaml
from projects.config import Config
from projects.fine_tuning.manifests import cell_manifests
from projects.plan import Plan, build_plan, write_plan

__all__ = ["plan_run"]


def plan_run(config: Config, platform: str, artifact_dir: Path) -> Plan:
    """Resolve the plan of a run and write it (config, plan, manifests) into ``artifact_dir``.

    On the kubernetes platform every manifest a cell would apply is written to
    ``manifests/<NNN>__<cell>/<NN>-<kind>-<name>.yaml``.
    """
    plan = build_plan(config, platform)
    write_plan(plan, config, artifact_dir)
    if platform == "kubernetes":
        written = 0
        for cell in plan.runnable:
            target = artifact_dir / "manifests" / f"{cell.index:03d}__cell"
            target.mkdir(parents=True, exist_ok=True)
            manifests = cell_manifests(cell.settings,
                                       namespace=config.get("tests.fine_tuning.namespace"),
                                       block=config.get("tests.fine_tuning.kubernetes"),
                                       cell_index=cell.index)
            for index, manifest in enumerate(manifests):
                name = f"{index:02d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}"
                (target / f"{name}.yaml").write_text(dump_yaml(manifest), encoding="utf-8")
                written += 1
        plan.extra["manifests"] = written
    return plan
