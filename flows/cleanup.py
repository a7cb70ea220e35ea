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

from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.errors import ConfigError
from core.exit import exit_now
from flows.cli import (
    EXIT_OK,
    lazy_exports,
    main_guard,
    make_parser,
    parse_age,
    prefect_defaults,
    say,
)
from projects.registry import available, project_of_run

if TYPE_CHECKING:
    from flows.cleanup_flow import JanitorOutcome, janitor, quads_janitor

__all__ = ["JanitorOutcome", "janitor", "parse_age", "quads_janitor"]

__getattr__ = lazy_exports(__name__, "flows.cleanup_flow",
                           ["JanitorOutcome", "janitor", "quads_janitor"])


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
    from flows.api_server import prefect_api

    if args.quads:
        from flows.cleanup_flow import quads_janitor

        with prefect_api():
            outcome = quads_janitor(older_than=args.older_than or "6h", dry_run=args.dry_run,
                                    artifacts=args.artifacts, project=str(project),
                                    presets=args.preset, artifact_dir=args.artifact_dir)
        verb = "would release" if outcome.dry_run else "released"
        say(f"{len(outcome.leaks)} QUADS lease(s) of dead runs; {verb} "
            f"{len(outcome.leaks) if outcome.dry_run else outcome.deleted}")
        return EXIT_OK
    from tasks.kube.api import api_client, owned_clients
    from tasks.platforms.select import find_kubeconfig

    # a missing kubeconfig is a usage error before Prefect starts (one line, exit 2)
    kubeconfig = args.kubeconfig or find_kubeconfig()
    if kubeconfig is None:
        raise ConfigError("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
    with owned_clients():
        api_client(kubeconfig)  # an unusable one too (empty, not YAML, no context)
    from flows.cleanup_flow import janitor

    with prefect_api():
        outcome = janitor(older_than=args.older_than, dry_run=args.dry_run,
                          kubeconfig=kubeconfig)
    verb = "would delete" if outcome.dry_run else "deleted"
    say(f"{len(outcome.leaks)} leak(s); {verb} "
        f"{len(outcome.leaks) if outcome.dry_run else outcome.deleted}")
    return EXIT_OK


if __name__ == "__main__":
    exit_now(main())
