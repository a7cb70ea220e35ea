"""``python -m analysis RESULTS_DIR --project fine_tuning --out OUT [--history URI] [--strict]``.

Exit codes: 0 parsing succeeded (failed runs still count as parsed), 1 the regression gate
failed (``--fail-on-regression``), 2 a user error (bad path, unknown project, cpt-incomplete
payload), with one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis.errors import TelltaleError, UserError
from analysis.paths import writable_dir
from analysis.pipeline import postprocess
from analysis.settings import AnalysisSettings, RegressionSettings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run post-processing from the command line; returns the exit code."""
    parser = _Parser(prog="python -m analysis",
                     description="Post-process a results tree: KPIs, LTS payloads, "
                                 "history, regression verdicts and an HTML report.")
    parser.add_argument("results_dir", metavar="RESULTS_DIR")
    parser.add_argument("--project", required=True, help="registered project (fine_tuning)")
    parser.add_argument("--out", required=True, help="output dir")
    parser.add_argument("--history", metavar="URI",
                        help="Parquet history: local dir or s3://bucket/prefix")
    parser.add_argument("--no-append", action="store_true",
                        help="judge against the history without adding these runs to it")
    parser.add_argument("--strict", action="store_true",
                        help="cpt mode: every LTS field is required")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when a KPI regressed")
    parser.add_argument("--force", action="store_true", help="re-parse, ignoring caches")
    parser.add_argument("--no-report", action="store_true", help="skip the HTML report")
    args = parser.parse_args(argv)
    settings = AnalysisSettings(
        mode="cpt" if args.strict else "investigate", strict=args.strict,
        regression=RegressionSettings(fail_on_regression=args.fail_on_regression))
    try:
        writable_dir(args.out, "--out")
        outcome = postprocess(args.results_dir, args.project, args.out,
                              history_uri=args.history, settings=settings,
                              append_history=not args.no_append, force=args.force,
                              report=not args.no_report)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TelltaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk mid-way: one line, not a traceback
        print(f"error: {exc.strerror or exc} ({exc.filename or args.out})", file=sys.stderr)
        return 1
    print(f"{outcome.runs} run(s) parsed ({outcome.failed_runs} failed, "
          f"{outcome.problems} problem(s), {len(outcome.skipped)} dir(s) skipped); "
          f"{outcome.kpi_rows} KPI rows")
    if outcome.verdict_counts:
        print("verdicts: " + ", ".join(f"{k}={v}" for k, v in
                                       sorted(outcome.verdict_counts.items())))
    for name, path in outcome.files.items():
        print(f"  {name:<18} {path}")
    for failure in outcome.gate_failures:
        print(f"GATE: {failure}", file=sys.stderr)
    return 1 if outcome.gate_failures else 0


if __name__ == "__main__":
    sys.exit(main())
