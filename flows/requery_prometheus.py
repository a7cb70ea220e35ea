"""Rebuild the cells' resource series of a run from its Prometheus TSDB snapshot.

    python -m flows.requery_prometheus RUN_DIR [--snapshot DIR] [--force]

Cells whose ``*__observe__capture_prometheus/prometheus/series.parquet`` is missing (or all
of them with ``--force``) are queried again from the run's newest snapshot (see
`tasks.observe.snapshot`); then ``python -m analysis`` or ``flows.replot`` give their
resource KPIs. Needs the ``prometheus`` binary, not the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.exit import exit_now
from core.terminal import say
from flows.cli import EXIT_OK, main_guard, make_parser
from tasks.observe.snapshot import requery_run

__all__ = ["main"]


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = make_parser("python -m flows.requery_prometheus",
                         "Rebuild a run's resource series from its TSDB snapshot.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's artifact dir")
    parser.add_argument("--snapshot", help="snapshot dir (default: the run's newest)")
    parser.add_argument("--force", action="store_true", help="replace existing captures")
    parser.add_argument("--scrape-interval", type=float, default=1.0,
                        help="the run's scrape interval in seconds (sets the rate window)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        parser.error(f"no such directory: {run_dir}")
    written = requery_run(run_dir, snapshot=Path(args.snapshot) if args.snapshot else None,
                          force=args.force, scrape_interval_s=args.scrape_interval)
    say(f"{len(written)} cell(s) captured again from the snapshot"
          + (f": {', '.join(written)}" if written else ""))
    return EXIT_OK


if __name__ == "__main__":
    exit_now(main())
