"""Re-run post-processing of a stored run and write the result next to it.

    python -m flows.replot --from s3://bucket/prefix/flow/<run-id> | LOCAL_DIR
        [--download cache|important|all] [--project NAME] [--history URI]
        [--preset NAME]... [--var KEY=VALUE]...

- ``s3://`` sources are fetched into ``runs/replot-<run-id>/`` (every key is checked first: one
  that would escape the target dir stops the fetch), then the new outputs are uploaded to
  ``<source>/plot/``. ``cache`` fetches only settings, exit codes and parse caches (and trusts
  the caches), ``important`` what post-processing reads, ``all`` everything.
- A local dir is post-processed in place; the outputs go to ``LOCAL_DIR/plot``.

S3 endpoint and credentials come from the project's ``export_artifacts`` block and secrets
(``--preset``/``--var`` apply), or the AWS environment (``AWS_ENDPOINT_URL``...). The run is
judged against the history but not appended to it again.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from core.exit import exit_now
from flows.cli import (
    EXIT_FAILED,
    EXIT_OK,
    add_config_arguments,
    lazy_exports,
    main_guard,
    make_parser,
    overrides_from_args,
    policy_for,
    prefect_defaults,
    say,
    source_project,
)
from tasks.publish import DOWNLOAD_MODES

if TYPE_CHECKING:
    from flows.replot_flow import ReplotOutcome, replot

__all__ = ["ReplotOutcome", "replot"]

__getattr__ = lazy_exports(__name__, "flows.replot_flow", ["ReplotOutcome", "replot"])


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = make_parser("python -m flows.replot", "Re-run post-processing of a stored run.")
    parser.add_argument("--from", dest="source", required=True,
                        help="s3://bucket/prefix/flow/<run-id> or a local artifact dir")
    parser.add_argument("--download", choices=DOWNLOAD_MODES, default="important")
    parser.add_argument("--project", help="the run's project (default: the one the run says)")
    parser.add_argument("--history", metavar="URI", help="history to judge against")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    if not args.source.startswith("s3://") and not Path(args.source).is_dir():
        parser.error(f"--from: no such directory: {args.source}")
    prefect_defaults()
    overrides = overrides_from_args(args, policy_for(args.project or
                                                     source_project(args.source)))
    from flows.api_server import prefect_api
    from flows.replot_flow import replot

    with prefect_api():
        outcome = replot(source=args.source, download=args.download, project=args.project,
                         history_uri=args.history, presets=args.preset, overrides=overrides)
    say(f"outputs : {outcome.out_dir}")
    if outcome.report:
        say(f"report  : {outcome.report}")
    if outcome.uploaded_to:
        say(f"uploaded: {outcome.uploaded_to}")
    return EXIT_OK if outcome.report or outcome.out_dir else EXIT_FAILED


if __name__ == "__main__":
    exit_now(main())
