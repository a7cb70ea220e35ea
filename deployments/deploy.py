"""Deploy what can be deployed: every deployment of ``prefect.yaml`` whose work pool exists.

    python -m deployments.deploy [--prefect-file deployments/prefect.yaml]

``prefect --no-prompt deploy --all`` exits 1 as soon as one deployment names a work pool the
server lacks (a team with only the process pool has no ``telltale-kubernetes``), having
deployed some and not others. This asks the API which pools exist, deploys the deployments
of those pools in one ``prefect deploy`` call, and says which were skipped, why, and the
command that creates the missing pool. Exit 0 when every deployment that could be deployed
was; 1 when ``prefect deploy`` failed; 2 when no pool of the file exists.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from core.errors import ConfigError, UserError
from core.exit import exit_now
from core.terminal import ArgumentParser, say
from core.yamlio import load_yaml
from deployments.prefect_file import PREFECT_FILE

__all__ = ["deployable", "main"]

POOL_HINTS = {
    "telltale-local": "prefect work-pool create telltale-local --type process",
    "telltale-kubernetes": "prefect work-pool create telltale-kubernetes --type kubernetes "
                           "--base-job-template deployments/kubernetes-job-template.json",
}


def deployable(prefect_file: Path, pools: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Split the file's deployments by whether their work pool exists.

    Returns:
        The names to deploy (``<flow name>/<deployment>``, as ``prefect deploy --name``
        takes them), and (name, work pool) of those skipped.
    """
    data, _ = load_yaml(prefect_file)
    wanted: list[str] = []
    skipped: list[tuple[str, str]] = []
    specs = data.get("deployments") if isinstance(data, dict) else None
    if not isinstance(specs, list) or not specs:
        raise ConfigError("holds no deployments list", file=str(prefect_file),
                          key="deployments")
    for index, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not \
                isinstance(spec.get("work_pool") or {}, dict):
            raise ConfigError("a deployment needs a name and a work_pool mapping",
                              file=str(prefect_file), key=f"deployments[{index}]")
        pool = str((spec.get("work_pool") or {}).get("name") or "")
        name = spec["name"]
        if pool in pools:
            wanted.append(name)
        else:
            skipped.append((name, pool))
    return wanted, skipped


async def _pools(names: set[str]) -> set[str]:
    """Which of the work pools ``names`` exist.

    Asked by name: an unfiltered read returns the server's default page (200 pools).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

    async with get_client() as client:
        found = await client.read_work_pools(work_pool_filter=WorkPoolFilter(
            name=WorkPoolFilterName(any_=sorted(names))))
    return {pool.name for pool in found}


def main(argv: Sequence[str] | None = None) -> int:
    """Deploy the deployments whose work pool exists; say what was skipped and why."""
    parser = ArgumentParser(prog="python -m deployments.deploy",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefect-file", type=Path, default=PREFECT_FILE)
    args = parser.parse_args(argv)
    # a bad file is a user error before the API is asked; with no pool, every one is named
    _, every = deployable(args.prefect_file, set())
    try:
        pools = asyncio.run(_pools({pool for _, pool in every}))
    except Exception as exc:  # no API: one line, the setting to check
        say(f"error: cannot list work pools ({type(exc).__name__}: {str(exc)[:200]}); is "
            "PREFECT_API_URL set and the server up?", error=True)
        return 1
    wanted, skipped = deployable(args.prefect_file, pools)
    for name, pool in skipped:
        say(f"skipped {name}: work pool {pool!r} does not exist"
            + (f" (create it: {POOL_HINTS[pool]})" if pool in POOL_HINTS else ""))
    if not wanted:
        raise UserError(f"none of the deployments of {args.prefect_file} has an existing "
                        "work pool: create one first")
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file",
               str(args.prefect_file)]
    for name in wanted:
        command += ["--name", name]
    done = subprocess.run(command, check=False)
    if done.returncode == 0:
        say(f"deployed {len(wanted)}, skipped {len(skipped)}")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    from flows.cli import main_guard

    exit_now(main_guard(main)())
