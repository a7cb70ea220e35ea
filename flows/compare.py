"""Compare two selections of a KPI history as a Prefect flow: the result as artifacts.

    python -m flows.compare --history URI A B [--kpi NAME]... [--project NAME]

The same comparison as ``python -m analysis compare`` (`analysis.compare`), published as a
table and a markdown artifact of the flow run (a deployment of it answers "is 0.33 worse
than 0.32?" from the UI).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.exit import exit_now
from flows.cli import EXIT_OK, lazy_exports, main_guard, make_parser, prefect_defaults, say

if TYPE_CHECKING:
    from flows.compare_flow import compare

__all__ = ["compare"]

__getattr__ = lazy_exports(__name__, "flows.compare_flow", ["compare"])


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
    from analysis.compare import comparison_lines
    from flows.api_server import prefect_api
    from flows.compare_flow import compare

    with prefect_api():
        rows = compare(args.history, args.a, args.b, args.kpi, args.project)
    for line in comparison_lines(rows, args.a, args.b):
        say(line)
    return EXIT_OK


if __name__ == "__main__":
    exit_now(main())
