"""``python -m analysis RESULTS_DIR --project fine_tuning --out OUT [--history URI] [--strict]``.

``python -m analysis accept [--history URI | --project NAME] RUN [--kpi NAME]... [--by WHO]
[--note TEXT]``
records that a run's level is the new baseline (all its KPIs, or the named ones): later
verdicts compare with it, and the shift it carries stops being reported.

``python -m analysis compare --history URI A B [--project NAME] [--kpi NAME]... [--html PATH]
[--json PATH] [--same-within PCT]`` compares two selections of the history (runs, label
selections such as ``vllm=0.32.0``, or time windows ``2026-11-01..2026-11-08``) KPI by KPI:
change, 95 % interval, effect size and a verdict (`analysis.compare`).

``python -m analysis history [--history URI | --project NAME] [--select SPEC]... [--kpi NAME]...
[--kpis] [--csv PATH]`` lists what a history holds — one line per run, or per KPI with ``--kpis`` —
filtered by compare's selections (all applied), and writes the rows as CSV
(`analysis.listing`).

``python -m analysis lts-schema [--uri URI]`` prints the LTS document's JSON schema, with its
``$id`` — what a Horreum admin registers as the schema of Telltale's uploads.

The subcommands' ``--history`` defaults to the history the project's runs append to
(``<data dir>/history/<project>``; with one project there, ``--project`` is not needed
either). A run is named by its uuid or by the id its run folder ends with (``25f0bdb0``):
``analysis history`` lists both.

A tree already post-processed into the same ``--out``, with nothing changed since (the
tree, a read-only ``--history``, the code, the arguments, the environment, the outputs
themselves), answers from those outputs in a fraction of a second: ``analysis.memo``
says what is witnessed and when a run leaves no memo. ``--force`` analyses again.

Progress lines (``parse: 4,000/10,000 run(s) (40 %), 1,250/s``, judging, the report) go to
stderr; ``--quiet`` leaves them out.

After its first run a command line is served by a warm Python that run left, its imports
done (``analysis/__main__.py``, `core.warm_command`; ``TELLTALE_WARM_COMMAND_MINUTES=0``:
never): the same command, in a forked child; `run_here` runs it in this process.

Exit codes: 0 parsing succeeded (failed runs still count as parsed), 1 the regression gate
failed (``--fail-on-regression``), 2 a user error (bad path, unknown project, cpt-incomplete
payload), with one line on stderr.

Over 500 lines: each subcommand's arguments and their checks live here, where the command
line is read, and so does the order of a memoised post-processing's work (the memo's child:
stamps, discovery, the early parse; `_postprocess`), which the pipeline itself never sees.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from core.environment import default_data_dir, env_settings
from core.errors import TelltaleError, UserError
from core.exit import exit_now
from core.paths import writable_dir
from core.progress import logger as progress_logger
from core.terminal import ArgumentParser, printable, say

# The history, the pipeline and the projects (pandas, pyarrow, the parsers: ~1 s) are
# imported once the arguments are usable: --help and a usage error answer at once.

HISTORY_HELP = ("Parquet history: local dir or s3://bucket/prefix (default: the history "
                "the project's runs append to, <data dir>/history/<project>)")


def _history_option(parser: argparse.ArgumentParser, *, project: bool = True) -> None:
    """``--history`` (and ``--project``, which picks its default) of a subcommand."""
    parser.add_argument("--history", metavar="URI", help=HISTORY_HELP)
    if project:
        parser.add_argument("--project", help="the project whose history to use (needed "
                            "only when the data dir holds several)")


def history_of(given: str | None, project: str | None) -> str:
    """The history a subcommand reads.

    ``--history``, else the project's own (where its runs append), else the data dir's only
    one.

    Raises:
        UserError: No ``--history`` and no way to choose one (none or several exist).
    """
    from analysis.history import default_history_uri
    from analysis.project import load_project

    if given:
        return given
    if project:
        load_project(project)  # an unknown name: one line naming the known ones
        return default_history_uri(project)
    root = default_data_dir() / "history"
    found = sorted(d.name for d in root.glob("*/") if any(d.glob("*.parquet"))) \
        if root.is_dir() else []
    if len(found) == 1:
        return str(root / found[0])
    if not found:
        raise UserError(f"no history under {root} yet (a run appends to "
                        f"{root}/<project>): give --history URI")
    raise UserError(f"{root} holds the histories of {', '.join(found)}: give --project NAME "
                    "or --history URI")


def accept_main(argv: Sequence[str]) -> int:
    """``accept``: record an accepted baseline in the history; returns the exit code."""
    parser = ArgumentParser(prog="python -m analysis accept",
                     description="Accept a run's level as the new baseline of its KPIs.")
    parser.add_argument("run_uuid", metavar="RUN", help="a run uuid, or a run folder's id "
                        "or name (every cell of that run), as `analysis history` lists them")
    _history_option(parser)
    parser.add_argument("--kpi", action="append", default=[],
                        help="only this KPI (repeatable; default: every KPI of the run)")
    parser.add_argument("--by", default="", help="who accepted it (recorded)")
    parser.add_argument("--note", default="", help="why (recorded)")
    args = parser.parse_args(argv)
    from analysis.compare import runs_named
    from analysis.history import ALL_KPIS, HistoryStore

    try:
        store = HistoryStore(history_of(args.history, args.project))
        known = store.query({}, exclude_runs=())
        named = runs_named(known, args.run_uuid) if not known.empty else None
        if named is None or not named.any():
            raise UserError(f"run {args.run_uuid!r} is not in the history {store!r}")
        uuids = sorted(set(known.loc[named, "run_uuid"]))
        kpis = set(known.loc[named, "kpi"])
        unknown = sorted(set(args.kpi) - kpis)
        if unknown:
            raise UserError(f"run {args.run_uuid!r} has no KPI {', '.join(unknown)} "
                            f"(it has: {', '.join(sorted(kpis))})")
        paths = [store.accept(run_uuid, args.kpi or [ALL_KPIS], by=args.by, note=args.note)
                 for run_uuid in uuids]
    except UserError as exc:
        say(f"error: {exc}", error=True)
        return 2
    for run_uuid, path in zip(uuids, paths, strict=True):
        say(f"accepted {run_uuid} as the baseline of "
            f"{', '.join(args.kpi) if args.kpi else 'every KPI'}: {path}")
    return 0


def _failed(exc: TelltaleError) -> int:
    """One line on stderr; exit 2 for a user error, 1 for anything else."""
    say(f"error: {exc}", error=True)
    return 2 if isinstance(exc, UserError) else 1


def compare_main(argv: Sequence[str]) -> int:
    """``compare``: two selections of the history, KPI by KPI; returns the exit code."""
    parser = ArgumentParser(prog="python -m analysis compare",
                     description="Compare two selections of a history: runs (uuids), label "
                                 "selections (vllm=0.32.0) or time windows (START..END).")
    parser.add_argument("a", metavar="A", help="the reference selection")
    parser.add_argument("b", metavar="B", help="the selection compared with it")
    parser.add_argument("--history", metavar="URI", help=HISTORY_HELP)
    parser.add_argument("--project", help="use this project's ignored labels (and its "
                        "history when --history is not given)")
    parser.add_argument("--kpi", action="append", default=[], help="only this KPI "
                        "(repeatable)")
    parser.add_argument("--same-within", type=float, default=2.0, metavar="PCT",
                        help="an interval within ±PCT %% is 'same' (default 2)")
    parser.add_argument("--html", metavar="PATH", help="also write an HTML page")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    from analysis.compare import compare_frames, comparison_html, comparison_lines
    from analysis.history import HistoryStore
    from analysis.project import load_project
    from analysis.settings import settings_for
    from core.safeio import write_json, write_text

    try:
        env_settings()
        if not 0 < args.same_within <= 100:
            raise UserError("--same-within must be between 0 and 100")
        ignored: list[str] = []
        hooks = load_project(args.project) if args.project else None
        if hooks is not None:
            ignored = list(settings_for(hooks, ".").comparison.ignored_labels)
        rows = compare_frames(HistoryStore(history_of(args.history, args.project)).read(),
                              args.a, args.b,
                              kpis=args.kpi, ignored_labels=ignored,
                              same_within_pct=args.same_within,
                              curve=hooks.curve if hooks is not None else None)
        for path in (args.html, args.json):
            if path:
                writable_dir(str(Path(path).parent), "--html/--json")
        if args.html:
            # static (inline SVG bars): no plotly.js beside it
            write_text(args.html, comparison_html(rows, args.a, args.b,
                                                  same_within_pct=args.same_within))
        if args.json:
            write_json(args.json, [r.model_dump() for r in rows])
    except TelltaleError as exc:
        return _failed(exc)
    for line in comparison_lines(rows, args.a, args.b):
        say(line)
    return 0


def _skip_reasons(skipped: Sequence[dict[str, str]]) -> list[tuple[str, int]]:
    """Skipped dirs counted by reason (another project's runs are one reason each)."""
    counts: dict[str, int] = {}
    for item in skipped:
        reason = item.get("reason", "")
        counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:10]


def _show_progress() -> None:
    """Print the progress lines (`core.progress`) on stderr, once."""
    if not any(getattr(h, "telltale_progress", False) for h in progress_logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.telltale_progress = True  # type: ignore[attr-defined]
        progress_logger.addHandler(handler)
    if progress_logger.level == logging.NOTSET:
        progress_logger.setLevel(logging.INFO)


def history_main(argv: Sequence[str]) -> int:
    """``history``: list a history's runs or KPIs, filtered; CSV export; the exit code."""
    parser = ArgumentParser(prog="python -m analysis history",
                     description="List a history's runs (or KPI rows), filtered; write CSV.")
    _history_option(parser)
    parser.add_argument("--select", action="append", default=[], metavar="SPEC",
                        help="runs (uuids or run folder ids), label=value[,label=value] or "
                             "START..END "
                             "(repeatable: all apply)")
    parser.add_argument("--kpi", action="append", default=[], help="only this KPI "
                        "(repeatable)")
    parser.add_argument("--kpis", action="store_true", help="one line per KPI row, not "
                        "per run")
    parser.add_argument("--csv", metavar="PATH", help="write the selected rows as CSV")
    args = parser.parse_args(argv)
    from analysis.history import HistoryStore
    from analysis.listing import filter_history, kpi_lines, run_lines, to_csv_frame
    from core.safeio import write_text

    try:
        env_settings()
        history = history_of(args.history, args.project)
        frame = HistoryStore(history).read()
        if frame.empty:
            # the data dir keeps one history per project: name the folders a root holds
            inner = sorted(d.name for d in Path(history).glob("*/")
                           if any(d.glob("*.parquet"))) if "://" not in history else []
            raise UserError(f"the history {history} holds no run" + (
                f"; its folders hold the histories of {', '.join(inner)}: give one, e.g. "
                f"--history {Path(history) / inner[0]}" if inner else ""))
        chosen = filter_history(frame, args.select, args.kpi)
        if args.csv:
            writable_dir(str(Path(args.csv).parent), "--csv")
            # safeio-exempt: to_csv without a path returns the text; write_text writes it
            write_text(args.csv, to_csv_frame(chosen).to_csv(index=False))
    except TelltaleError as exc:
        return _failed(exc)
    for line in (kpi_lines(chosen) if args.kpis else run_lines(chosen)):
        say(line)
    if args.csv:
        say(f"{len(chosen)} row(s) written to {args.csv}", error=True)
    return 0


def lts_schema_main(argv: Sequence[str]) -> int:
    """``lts-schema``: the LTS document's JSON schema on stdout; returns the exit code."""
    import json

    from analysis.lts import SCHEMA_VERSION, lts_json_schema

    parser = ArgumentParser(prog="python -m analysis lts-schema",
                     description="Print the JSON schema of the LTS document (for Horreum).")
    parser.add_argument("--uri", default=f"urn:telltale:lts:{SCHEMA_VERSION}",
                        help="the schema's $id (Horreum's schema URI)")
    args = parser.parse_args(argv)
    schema = {"$id": args.uri, "$schema": "https://json-schema.org/draft/2020-12/schema",
              **lts_json_schema()}
    say(json.dumps(schema, indent=2), keep_newlines=True)
    return 0


SUBCOMMANDS = """subcommands (each with its own --help):
  python -m analysis history     list the runs (or KPI rows) a history holds; CSV
  python -m analysis accept      record a run as the new baseline of its KPIs
  python -m analysis compare     compare two selections of runs (releases, windows)
  python -m analysis lts-schema  print the JSON schema of the LTS document (Horreum)"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run post-processing from the command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["lts-schema"]:
        return lts_schema_main(argv[1:])
    if argv[:1] == ["history"]:
        return history_main(argv[1:])
    if argv[:1] == ["accept"]:
        return accept_main(argv[1:])
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    parser = ArgumentParser(prog="python -m analysis",
                            description="Post-process a results tree: KPIs, LTS payloads, "
                                        "history, regression verdicts and an HTML report.",
                            epilog=SUBCOMMANDS,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", metavar="RESULTS_DIR")
    parser.add_argument("--project", required=True, help="a registered project's name")
    parser.add_argument("--out", required=True, help="output dir")
    parser.add_argument("--history", metavar="URI",
                        help="Parquet history: local dir or s3://bucket/prefix, judged "
                             "against and appended to (none by default: a results tree is "
                             "judged only against a history named here — the project's "
                             "runs append to <data dir>/history/<project>; the subcommands "
                             "default to it)")
    parser.add_argument("--no-append", action="store_true",
                        help="judge against the history without adding these runs to it")
    parser.add_argument("--strict", action="store_true",
                        help="cpt mode: every LTS field is required")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when a KPI regressed")
    parser.add_argument("--force", action="store_true", help="re-parse and analyse again, "
                        "ignoring the parse caches and the memo of an unchanged tree")
    parser.add_argument("--no-report", action="store_true", help="skip the HTML report")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines on stderr (parse, judge, report)")
    args = parser.parse_args(argv)
    if not args.quiet:
        _show_progress()
    try:
        force = args.force or env_settings().force_reparse  # a bad TELLTALE_* variable:
        # one line, exit 2, before any work
        memo = _memo_of(args)
        if memo is not None and not force:
            summary = _answer_from_memo(*memo)
            if summary is not None:
                return _print_summary(summary)
        summary = _postprocess(args, memo)
    except TelltaleError as exc:
        return _failed(exc)
    except OSError as exc:  # a full disk mid-way: one line, not a traceback
        say(f"error: {exc.strerror or exc} ({exc.filename or args.out})", error=True)
        return 1
    return _print_summary(summary)


_Memo = tuple[Path, str, list[Any]]  # --out, the memo's key, its witnessed roots


def _memo_of(args: argparse.Namespace) -> _Memo | None:
    """Where and under which key this command is memoised (`analysis.memo`); None: never.

    Not with a history it appends to (each run writes a part to it) or an ``s3://`` one
    (its state is a listing away), nor when ``--out`` holds the tree.
    """
    from analysis import memo

    if args.history and ("://" in args.history or not args.no_append):
        return None
    # real paths: a root that is a link is walked where it points (its target's own stamp
    # says when an entry is added there), and a retargeted link is another root
    tree, out = Path(os.path.realpath(args.results_dir)), Path(os.path.realpath(args.out))
    if out == tree or out in tree.parents:
        return None
    history = Path(os.path.realpath(args.history)) if args.history else None
    # the paths as given too: the summary prints them so (another cwd: another memo)
    key = memo.key_of({"tree": str(tree), "out": str(out), "history": str(history),
                       "as_given": [args.results_dir, args.out, args.history],
                       "project": args.project, "strict": args.strict,
                       "fail_on_regression": args.fail_on_regression,
                       "report": not args.no_report, "append": not args.no_append})
    roots: list[memo.Root] = [("tree", tree, True), *memo.code_roots()]
    if history is not None:
        roots.append(("history", history, True))
    return out, key, roots


def _answer_from_memo(out: Path, key: str, roots: list[Any]) -> dict[str, Any] | None:
    """The recorded summary when nothing changed since ``out``'s outputs were made."""
    import time

    from analysis import memo

    began = time.perf_counter()
    summary = memo.answer(out, key, roots)
    if summary is not None:
        progress_logger.info("nothing changed since the outputs in %s were made (checked in "
                             "%.2f s): they stand (--force analyses again)", out,
                             time.perf_counter() - began)
    return summary


def _postprocess(args: argparse.Namespace, memo_at: _Memo | None) -> dict[str, Any]:
    """Post-process the tree as the arguments say; the summary the command prints."""
    from analysis import memo
    from core.forked import Claims, Handoff

    if memo_at is None:
        return _analyse(args)
    out, _, roots = memo_at
    memo.forget(out)  # a run that fails or is stopped leaves no memo of older outputs
    # before anything is read (the code too); the trees' stamps are taken, then the tree
    # discovered, then its warm dirs analysed from the first on, beside this process while
    # it imports the pipeline (then while it analyses them from the last down)
    claims, handoff = Claims(), Handoff()
    # with the pipeline imported already (a warm Python's child: core.warm_command) this
    # process has nothing to do while the trees are stamped: it stamps half of them
    before = memo.Before(roots, exclude=[out], then=functools.partial(
        _prepare, args, claims, handoff, os.getpid()),
        share="analysis.pipeline" in sys.modules)
    prepared: list[Any] = []

    def ready() -> None:
        given = handoff.take()
        if given is None:  # the child ended before: its error (or how it died) is raised
            before.wait()
            raise RuntimeError("the tree's discovery was never handed over")
        found, helping = given
        from analysis.run_analysis import Prepared

        prepared.append(Prepared(found, claims, before.take) if helping else Prepared(found))

    try:
        summary = _analyse(args, ready=ready, prepared=lambda: prepared.pop(),
                           tree_read=before.recheck_trees)
        memo.record(out, memo_at[1], before, summary)
    finally:
        handoff.close()
        before.close()
    return summary


def _prepare(args: argparse.Namespace, claims: Any, handoff: Any, parent: int,
             listed: Any) -> Any:
    """The tree's discovery, handed over; then its warm dirs analysed as ``claims`` says.

    Runs beside the command (`memo.Before`'s child) while it imports the pipeline (pandas,
    pyarrow: ~0.4 s of a warm 1 000-dir run in which the other core had nothing to do),
    then while it serves the same dirs from the last down (`parse_dirs`' ``helper``). The
    discovery is handed over first, before this child loads the project: the command need
    not wait for that to start serving. Its runs are analysed as the command analyses them
    — the same `Analyser` from the same settings: its key comes back with them, and the
    pipeline takes them in only when it is its own. Where no child could be forked, or
    above `BESIDE_MAX_RUNS` (the memory a child's answer holds), the discovery alone.
    Nothing here imports pandas. ``listed``: the tree's dirs as the memo's walk listed them
    (`memo.Listings`), which the discovery reads instead of listing them again.
    """
    from analysis.discovery import discover
    from analysis.parsing import BESIDE_MAX_RUNS

    found = discover(args.results_dir, project=args.project, listed=listed)
    helping = os.getpid() != parent and not args.force and bool(found.results) \
        and len(found.results) <= BESIDE_MAX_RUNS
    handoff.give((found, helping))
    if not helping:
        return None
    from analysis.project import load_project
    from analysis.run_analysis import Analyser, serve_early

    hooks = load_project(args.project)
    if hooks.name != args.project:  # another name for it: the command discovers again
        return None  # (nothing claimed: it would serve every dir itself)
    logging.disable(logging.WARNING)  # the command itself warns of unusable settings
    settings = _settings(hooks, args)
    logging.disable(logging.NOTSET)
    return serve_early(Analyser(hooks, found, None, None, settings.validity, settings.mode),
                       claims)


def _settings(hooks: Any, args: argparse.Namespace) -> Any:
    """The run's (or the project's) analysis block, with the command line's flags on top.

    The same history selection and ignored labels as the run itself.
    """
    from analysis.settings import settings_for

    base = settings_for(hooks, args.results_dir)
    return base.model_copy(update={
        "mode": "cpt" if args.strict else base.mode, "strict": args.strict or base.strict,
        "regression": base.regression.model_copy(update={
            "fail_on_regression": args.fail_on_regression})})


def _analyse(args: argparse.Namespace, ready: Callable[[], None] = lambda: None,
             prepared: Callable[[], Any] | None = None,
             tree_read: Callable[[], None] | None = None) -> dict[str, Any]:
    """`postprocess` as the arguments say; what the command prints of its outcome.

    ``ready`` returns once the tree may be read (the memo's stamps of it are taken);
    ``prepared`` and ``tree_read``: see `postprocess`.
    """
    from analysis.arrow_memory import use_system_allocator

    use_system_allocator()  # before pandas imports pyarrow: its C++ side reads it then
    from analysis.pipeline import postprocess
    from analysis.project import load_project

    # Everything imported so far lives as long as the process: out of the collector's sight,
    # its full collections (a 1 000-run post-processing makes a few hundred thousand
    # objects, and triggers several) walk only what the run made
    gc.freeze()
    # and the young generation is collected every 50 000 allocations, not 700: the run's
    # objects are parsed results and rows (no reference cycles to speak of), and the
    # default threshold spent ~40 ms of a 2 s post-processing walking them
    gc.set_threshold(50_000, 20, 20)
    hooks = load_project(args.project)
    ready()
    if hooks.name != args.project:  # another name for it: discovered again, for the name
        prepared = None  # the pipeline uses
    settings = _settings(hooks, args)
    writable_dir(args.out, "--out")
    outcome = postprocess(args.results_dir, args.project, args.out,
                          history_uri=args.history, settings=settings,
                          append_history=not args.no_append, force=args.force,
                          report=not args.no_report, prepared=prepared,
                          tree_read=tree_read)
    summary = {
        "runs": outcome.runs, "failed": outcome.failed_runs,
        "invalid": sum(v.status == "invalid" for v in outcome.validity.values()),
        "problems": outcome.problems, "skipped": len(outcome.skipped),
        "skip_reasons": _skip_reasons(outcome.skipped), "kpi_rows": outcome.kpi_rows,
        "verdicts": outcome.verdict_counts, "files": outcome.files,
        "gate_failures": outcome.gate_failures}
    return summary  # the outcome goes here: the memo's stamps are taken without it


def _print_summary(summary: dict[str, Any]) -> int:
    """Print what a post-processing made (from its outcome or its memo); the exit code."""
    say(f"{summary['runs']} run(s) parsed ({summary['failed']} failed, {summary['invalid']} "
        f"invalid, {summary['problems']} problem(s), {summary['skipped']} dir(s) skipped); "
        f"{summary['kpi_rows']} KPI rows")
    for reason, count in summary["skip_reasons"]:
        say(f"  skipped {count} dir(s): {printable(reason)}")
    if summary["verdicts"]:
        say("verdicts: " + ", ".join(f"{k}={v}" for k, v in
                                     sorted(summary["verdicts"].items())))
    for name, path in summary["files"].items():
        say(f"  {name:<18} {path}")
    for failure in summary["gate_failures"]:
        say(f"GATE: {failure}", error=True)
    return 1 if summary["gate_failures"] else 0


def run_here(key: str | None, preload: Sequence[str], env: dict[str, str],
             cwd: str) -> NoReturn:
    """Run the command line in this process, leave a warm Python for the next, and end.

    ``key``: the command's warm-Python key (`core.warm_command.command_key` of ``preload``,
    the modules it imports ahead), ``env`` and ``cwd`` what it was computed from, as the
    command began; None: none is left.
    """
    try:
        code = main()
    except BrokenPipeError:  # `| head`: the reader left; end without a traceback (`exit_now`
        # does not fail on the broken stdout, which a normal exit flushes again and reports)
        code = 1
    if key is not None:
        _leave_warm_python(key, preload, env, cwd)
    exit_now(code)


def _leave_warm_python(key: str, preload: Sequence[str], env: dict[str, str],
                       cwd: str) -> None:
    """Start a warm Python for the next command line with this key (`core.warm_command`).

    After the command's own work and output, so that its imports never compete with this
    command's; not when ``TELLTALE_WARM_COMMAND_MINUTES`` is 0 (or unreadable: the command
    said so already) or one for this key runs or starts.
    """
    from core.warm_command import command_base
    from core.warm_python import offer

    try:
        minutes = env_settings().warm_command_minutes
    except TelltaleError:
        return
    with contextlib.suppress(OSError):  # an unwritable services home: no warm Python
        offer(key, sys.executable, preload, cwd, env, minutes=minutes, base=command_base())
