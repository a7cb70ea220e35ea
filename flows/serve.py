"""Serve Telltale's deployments from this process (no work pool needed).

    python -m flows.serve [--prefect-file deployments/prefect.yaml]

Reads the same ``deployments/prefect.yaml`` that ``prefect deploy`` uses, so a deployment is
declared once. Needs a Prefect API (``prefect server start`` and ``PREFECT_API_URL``) so the
schedules and the UI form have somewhere to live.
"""

import importlib
import sys
from pathlib import Path
from typing import Any

from core.terminal import ArgumentParser
from core.yamlio import load_yaml
from flows.cli import prefect_defaults

__all__ = ["build_deployments", "load_deployment_specs"]

DEFAULT_FILE = Path(__file__).resolve().parent.parent / "deployments" / "prefect.yaml"


def load_deployment_specs(path: Path = DEFAULT_FILE) -> list[dict[str, Any]]:
    """Return the ``deployments`` entries of a prefect.yaml."""
    data, _ = load_yaml(path)
    return list((data or {}).get("deployments") or [])


def _flow_of(entrypoint: str) -> Any:
    module_path, _, name = entrypoint.partition(":")
    module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
    return getattr(module, name)


def build_deployments(path: Path = DEFAULT_FILE) -> list[Any]:
    """Build runner deployments (schedules, parameters, limits) from a prefect.yaml."""
    from prefect.schedules import Cron

    deployments = []
    for spec in load_deployment_specs(path):
        schedules = [Cron(s["cron"], timezone=s.get("timezone", "UTC"), active=s.get(
            "active", True)) for s in spec.get("schedules") or []]
        deployments.append(_flow_of(spec["entrypoint"]).to_deployment(
            name=spec["name"], description=spec.get("description"), tags=spec.get("tags"),
            parameters=spec.get("parameters") or {}, schedules=schedules or None,
            concurrency_limit=spec.get("concurrency_limit")))
    return deployments


def main(argv: list[str] | None = None) -> int:
    """Serve the deployments until interrupted."""
    parser = ArgumentParser(prog="python -m flows.serve")
    parser.add_argument("--prefect-file", type=Path, default=DEFAULT_FILE)
    args = parser.parse_args(argv)
    prefect_defaults()
    from prefect import serve

    serve(*build_deployments(args.prefect_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
