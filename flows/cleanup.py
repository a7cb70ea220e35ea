"""Leak janitor: remove what crashed runs left on a cluster.

    python -m flows.cleanup --older-than 6h [--dry-run] [--kubeconfig PATH]

Finds objects labelled ``app.kubernetes.io/managed-by=telltale`` with a
``telltale.io/run-id`` older than the given age, skipping anything labelled
``telltale.io/keep=true`` (runs with ``clusters.keep``), and deletes them with their
dependents. ``--dry-run`` lists what it would delete. Shared objects (namespace, data PVC)
carry no run id and are never touched.
"""

import re
import sys
from collections.abc import Sequence

from prefect import flow
from pydantic import BaseModel

from analysis.errors import ConfigError
from flows.cli import EXIT_OK, main_guard, make_parser, prefect_defaults
from tasks.kube.api import Kube, api_client
from tasks.kube.workload import find_leaks
from tasks.platforms.select import find_kubeconfig

__all__ = ["JanitorOutcome", "janitor", "parse_age"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """``90s``, ``30m``, ``6h``, ``2d`` → seconds.

    Raises:
        ConfigError: Anything else.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if not match:
        raise ConfigError(f"--older-than expects a number and a unit (s, m, h, d), got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


class JanitorOutcome(BaseModel):
    """What the janitor found and did."""

    leaks: list[str]
    deleted: int
    dry_run: bool


@flow(name="cleanup-janitor", log_prints=True)
def janitor(older_than: str = "6h", dry_run: bool = True,
            kubeconfig: str | None = None) -> JanitorOutcome:
    """Delete objects of crashed runs older than ``older_than`` (``--dry-run`` only lists).

    Args:
        older_than: Minimum age, e.g. 6h, 90m, 2d.
        dry_run: Only list what would be deleted.
        kubeconfig: Kubeconfig path (default: KUBECONFIG, ~/.kube/config, in-cluster).
    """
    seconds = parse_age(older_than)
    config = kubeconfig or find_kubeconfig()
    if config is None:
        raise ConfigError("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
    leaks = find_leaks(config, seconds)
    names = [f"{kind}/{ns + '/' if ns else ''}{name} (run {run})"
             for _, kind, name, ns, run in leaks]
    for line in names:
        print(("would delete " if dry_run else "deleting ") + line)
    deleted = 0
    if not dry_run:
        kube = Kube(api_client(config))
        for api_version, kind, name, namespace, _ in leaks:
            deleted += kube.delete(api_version, kind, name, namespace)
    return JanitorOutcome(leaks=names, deleted=deleted, dry_run=dry_run)


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    parser = make_parser("python -m flows.cleanup", "Remove leaks of crashed Telltale runs.")
    parser.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 6h, 90m, 2d")
    parser.add_argument("--dry-run", action="store_true", help="list, delete nothing")
    parser.add_argument("--kubeconfig", help="kubeconfig path")
    args = parser.parse_args(argv)
    parse_age(args.older_than)  # a bad age is a usage error before Prefect starts
    prefect_defaults()
    outcome = janitor(older_than=args.older_than, dry_run=args.dry_run,
                      kubeconfig=args.kubeconfig)
    verb = "would delete" if outcome.dry_run else "deleted"
    print(f"{len(outcome.leaks)} leak(s); {verb} "
          f"{len(outcome.leaks) if outcome.dry_run else outcome.deleted}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
