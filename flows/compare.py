"""Compare two selections of a KPI history as a Prefect flow: the result as artifacts.

    python -m flows.compare --history URI A B [--kpi NAME]... [--project NAME]

The same comparison as ``python -m analysis compare`` (`analysis.compare`), published as a
table and a markdown artifact of the flow run (a deployment of it answers "is 0.33 worse
than 0.32?" from the UI).
"""

import sys
from collections.abc import Sequence

from prefect import flow

from analysis.compare import Comparison, compare_frames, comparison_lines
from analysis.history import HistoryStore
from analysis.pipeline import settings_for
from analysis.project import load_project
from flows.cli import EXIT_OK, main_guard, make_parser, prefect_defaults, say
from tasks.publish.prefect_artifacts import publish_comparison

__all__ = ["compare"]


@flow(name="compare", log_prints=True)
def compare(history: str, a: str, b: str, kpis: list[str] | None = None,
            project: str | None = None, same_within_pct: float = 2.0) -> list[Comparison]:
    """Compare selection B with selection A of the history, KPI by KPI (see module doc)."""
    hooks = load_project(project) if project else None
    ignored = list(settings_for(hooks, ".").comparison.ignored_labels) if hooks else []
    rows = compare_frames(HistoryStore(history).read(), a, b, kpis=kpis or (),
                          ignored_labels=ignored, same_within_pct=same_within_pct,
                          curve=hooks.curve if hooks else None)
    publish_comparison(rows, a, b, key=f"{project or 'history'}")
    return rows


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = make_parser("python -m flows.compare", "Compare two selections of a history "
                         "and publish the result as Prefect artifacts.")
    parser.add_argument("a", metavar="A")
    parser.add_argument("b", metavar="B")
    parser.add_argument("--history", required=True, metavar="URI")
    parser.add_argument("--kpi", action="append", default=[])
    parser.add_argument("--project")
    args = parser.parse_args(argv)
    prefect_defaults()
    from flows.api_server import prefect_api

    with prefect_api():
        rows = compare(args.history, args.a, args.b, args.kpi, args.project)
    for line in comparison_lines(rows, args.a, args.b):
        say(line)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
