"""Leak janitor: remove what crashed runs left on a cluster, and their QUADS leases.

    python -m flows.cleanup --older-than 6h [--dry-run] [--kubeconfig PATH]
    python -m flows.cleanup --quads --project NAME [--older-than 6h] [--artifacts runs] [--dry-run]
    python -m flows.cleanup --quads [--project NAME] --artifact-dir RUN_DIR

``--project`` names whose secrets block holds the QUADS credentials; a run dir whose cells
ran says it itself. The engine assumes no project.

Finds objects labelled ``app.kubernetes.io/managed-by=telltale`` with a
``telltale.io/run-id`` older than the given age, skipping anything labelled
``telltale.io/keep=true`` (runs with ``clusters.keep``), and deletes them with their
dependents (a build's ImageStreamTag with its BuildConfig, a cloned MachineSet's Machines
and nodes with it). A MachineSet a dead run only scaled (``telltale.io/scaled-by-run``,
scaled longer ago than the age) is scaled back to the count it had. ``--dry-run`` lists what
it would do. Shared objects (namespace, data PVC, the image stream) carry no run id and are
never touched.

``--quads`` releases the QUADS assignments of dead runs: the owner's active self-scheduled
assignments whose description starts with ``telltale:`` and whose ``lease.json`` (under
``--artifacts``) names a process of this machine that is gone — or, with no local record,
that are surely older than ``--older-than``. ``--artifact-dir`` releases one run's lease.
Credentials: the project's ``secrets.quads_credentials`` (``--project``, ``--preset``).
"""

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from core.errors import ConfigError
from core.terminal import say
from flows.api_server import prefect_api
from flows.cli import EXIT_OK, main_guard, make_parser, prefect_defaults
from projects.config import resolve
from projects.registry import available, project_of_run
from tasks.kube.api import Kube, api_client, owned_clients
from tasks.kube.machinesets import SCALED_BY_LABEL, find_scaled_leaks, give_back
from tasks.kube.workload import find_leaks, remove_object
from tasks.lab.lease import find_orphans, release_from_file, release_orphan
from tasks.lab.provision import quads_client
from tasks.platforms.select import find_kubeconfig

__all__ = ["JanitorOutcome", "janitor", "parse_age", "quads_janitor"]

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
    with owned_clients():  # the sweep's clients are closed when it ends
        return _sweep(config, seconds, dry_run)


def _sweep(config: str, seconds: float, dry_run: bool) -> JanitorOutcome:
    """The janitor's work: list the leaks, then delete them and scale back (not dry run)."""
    leaks = find_leaks(config, seconds)
    names = [f"{kind}/{ns + '/' if ns else ''}{name} (run {run})"
             for _, kind, name, ns, run in leaks]
    for line in names:
        say(("would delete " if dry_run else "deleting ") + line)
    kube = Kube(api_client(config))
    scaled = find_scaled_leaks(kube, seconds)
    for machineset in scaled:
        meta = machineset["metadata"]
        line = (f"MachineSet/{meta.get('namespace')}/{meta['name']} (scaled by run "
                f"{meta['labels'].get(SCALED_BY_LABEL)})")
        names.append(line)
        say(("would scale back " if dry_run else "scaling back ") + line)
    deleted = 0
    if not dry_run:
        for api_version, kind, name, namespace, _ in leaks:
            deleted += remove_object(kube, api_version, kind, name, namespace)
        for machineset in scaled:
            say(give_back(kube, machineset))
            deleted += 1
    return JanitorOutcome(leaks=names, deleted=deleted, dry_run=dry_run)


@flow(name="cleanup-quads", log_prints=True)
def quads_janitor(project: str, older_than: str = "6h", dry_run: bool = True,
                  artifacts: str = "runs", presets: list[str] | None = None,
                  artifact_dir: str | None = None) -> JanitorOutcome:
    """Release the QUADS assignments of dead runs (``--dry-run`` only lists them).

    Args:
        older_than: With no local ``lease.json``, release only assignments surely older.
        dry_run: Only list what would be released.
        artifacts: Where the runs' artifact dirs (and their ``lease.json``) are.
        project: The project whose secrets block names the QUADS credentials.
        presets: Presets of that project's config (for the secrets block).
        artifact_dir: Release this one run's lease and nothing else.
    """
    seconds = parse_age(older_than)
    secrets = resolve(project, presets=presets or [], overrides={}).model.secrets
    with quads_client(secrets) as client:
        if artifact_dir is not None:
            released = not dry_run and release_from_file(client, Path(artifact_dir))
            line = f"lease of {artifact_dir}"
            say(("would release " if dry_run else "released " if released
                   else "nothing to release: ") + line)
            return JanitorOutcome(leaks=[line], deleted=int(released), dry_run=dry_run)
        orphans = find_orphans(client, [Path(artifacts)], seconds)
        names = [f"assignment {o.assignment_id} ({o.cloud}, run {o.marker}): {o.reason}"
                 for o in orphans]
        for line in names:
            say(("would release " if dry_run else "releasing ") + line)
        released = 0
        if not dry_run:
            for orphan in orphans:
                release_orphan(client, orphan)
                released += 1
    return JanitorOutcome(leaks=names, deleted=released, dry_run=dry_run)


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    parser = make_parser("python -m flows.cleanup", "Remove leaks of crashed Telltale runs.")
    parser.add_argument("--older-than", metavar="AGE", help="e.g. 6h, 90m, 2d")
    parser.add_argument("--dry-run", action="store_true", help="list, delete nothing")
    parser.add_argument("--kubeconfig", help="kubeconfig path")
    parser.add_argument("--quads", action="store_true",
                        help="release the QUADS assignments of dead runs instead")
    parser.add_argument("--artifacts", default="runs",
                        help="(--quads) where the runs' artifact dirs are")
    parser.add_argument("--artifact-dir", help="(--quads) release this run's lease only")
    parser.add_argument("--project",
                        help="(--quads) project whose secrets block names the QUADS "
                             "credentials (default: the one --artifact-dir's run says)")
    parser.add_argument("--preset", action="append", default=[], help="(--quads) preset")
    args = parser.parse_args(argv)
    if args.older_than is None and not args.quads:
        parser.error("--older-than is required (or --quads)")
    project = args.project or (project_of_run(args.artifact_dir) if args.artifact_dir else None)
    if args.quads and not project:
        parser.error("--quads needs --project (whose secrets block names the QUADS "
                     f"credentials; a run's --artifact-dir says it itself): "
                     f"{', '.join(available())}")
    parse_age(args.older_than or "6h")  # a bad age is a usage error before Prefect starts
    prefect_defaults()
    if args.quads:
        with prefect_api():
            outcome = quads_janitor(older_than=args.older_than or "6h", dry_run=args.dry_run,
                                    artifacts=args.artifacts, project=str(project),
                                    presets=args.preset, artifact_dir=args.artifact_dir)
        verb = "would release" if outcome.dry_run else "released"
        say(f"{len(outcome.leaks)} QUADS lease(s) of dead runs; {verb} "
              f"{len(outcome.leaks) if outcome.dry_run else outcome.deleted}")
        return EXIT_OK
    # a missing kubeconfig is a usage error before Prefect starts (one line, exit 2)
    kubeconfig = args.kubeconfig or find_kubeconfig()
    if kubeconfig is None:
        raise ConfigError("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
    with owned_clients():
        api_client(kubeconfig)  # an unusable one too (empty, not YAML, no context)
    with prefect_api():
        outcome = janitor(older_than=args.older_than, dry_run=args.dry_run,
                          kubeconfig=kubeconfig)
    verb = "would delete" if outcome.dry_run else "deleted"
    say(f"{len(outcome.leaks)} leak(s); {verb} "
          f"{len(outcome.leaks) if outcome.dry_run else outcome.deleted}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
