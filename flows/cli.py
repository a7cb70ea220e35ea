"""Shared command-line plumbing: config arguments, one-line errors, exit codes."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import logging
import os
import re
import signal
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.environment import default_data_dir, env_settings
from core.errors import ConfigError, TelltaleError, UserError
from core.safeio import UnreadableInputError, read_text_bounded
from core.terminal import ArgumentParser, say
from projects.config import Config, load_vars_file, parse_override, resolve
from projects.registry import available, project_of_flow, project_of_run
from projects.untrusted import MAX_PR_COMMENT, UntrustedPolicy, parse_pr_args, policy_for

__all__ = [
    "Terminated",
    "is_terminated",
    "lazy_exports",
    "parse_age",
    "EXIT_FAILED",
    "EXIT_INCONCLUSIVE",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_OK",
    "EXIT_USAGE",
    "add_config_arguments",
    "default_artifact_dir",
    "runs_root",
    "source_project",
    "exit_code_for",
    "main_guard",
    "overrides_from_args",
    "policy_for",
    "prefect_defaults",
    "resolve_from_args",
    "say",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
"""Nothing failed, but a cell's measurement stayed invalid (``analysis.validity: enforce``)."""
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``kill``, a CI timeout), taken the Ctrl-C way.

    The workload is stopped, cleanup and teardown (lease release) run, ``outcome.json`` is
    written.
    """


def is_terminated(exc: BaseException) -> bool:
    """Whether ``exc`` is a SIGTERM: ours (`Terminated`) or Prefect's ``TerminationSignal``.

    Prefect's flow engine installs its own SIGTERM handler while a flow runs. The class is
    matched by name, so that plan mode never imports Prefect. An error raised while the
    signal was being handled counts too (its context is the signal): a SIGTERM that lands
    while Prefect creates a task run makes its crash handling raise
    ``ValueError('Task run is not set')``, and that run was terminated, not failed.
    """
    seen = 0
    found: BaseException | None = exc
    while found is not None and seen < 8:  # a chain is short; a cycle must not hang
        if isinstance(found, Terminated) or (
                type(found).__name__ == "TerminationSignal"
                and getattr(found, "signal", None) == signal.SIGTERM):
            return True
        found, seen = found.__cause__ or found.__context__, seen + 1
    return False


def _on_sigterm(signum: int, frame: Any) -> None:
    # One-shot: a second SIGTERM (the usual "TERM, then KILL after a grace period") must not
    # cut the cleanup short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("terminated (SIGTERM)")


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


def lazy_exports(owner: str, module: str, names: Sequence[str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of command module ``owner``: ``names`` from ``module``, lazily.

    ``python -m flows.cleanup`` runs the command module itself, so its flows, which import
    Prefect (2-4 s), live in a module of their own (``flows.cleanup_flow``): ``--help`` and
    usage errors answer without it, and ``from flows.cleanup import janitor`` still works.
    """
    exported = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in exported:
            return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")

    return __getattr__


def source_project(source: str) -> str:
    """The project of a stored run: its flow's name in an S3 key, its cells' records locally.

    Raises:
        ConfigError: Neither says a registered project (pass ``--project``).
    """
    if source.startswith("s3://"):
        parts = source.rstrip("/").split("/")
        found = project_of_flow(parts[-2]) if len(parts) >= 5 else None
    else:
        found = project_of_run(source)
    if found is None:
        raise ConfigError(f"cannot tell which project {source} belongs to: pass --project "
                          f"({', '.join(available())})", key="--project")
    return found


PR_KEY = "clusters.image_build.pr"
"""The config key of the PR under test (``--pr``, ``PULL_NUMBER``)."""


def make_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """Return an argument parser whose usage errors are one line with exit code 2."""
    return ArgumentParser(prog=prog, description=description)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--preset``, ``--var``, ``--vars-file`` and ``--pr-args``."""
    parser.add_argument("--preset", action="append", default=[], metavar="NAME",
                        help="apply a preset from ci_presets (repeatable, in order)")
    parser.add_argument("--var", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key; VALUE is parsed as YAML (repeatable)")
    parser.add_argument("--vars-file", action="append", default=[], metavar="FILE",
                        help="YAML mapping of dotted key: value overrides")
    parser.add_argument("--pr-args", metavar="FILE",
                        help="PR comment text; its '/var key: value' lines become overrides")


def overrides_from_args(args: argparse.Namespace,
                        pr_policy: UntrustedPolicy | None = None) -> dict[str, Any]:
    """Collect overrides in precedence order.

    The CI's PR number (``PULL_NUMBER`` with ``HOMELAB_CI=true``) < vars files < PR comment
    < ``--pr`` < ``--var``. The PR number is read only by a command that has ``--pr``.

    Args:
        args: The parsed command line.
        pr_policy: What a PR comment may set (`policy_for`); None: nothing.
    """
    overrides: dict[str, Any] = {}
    if hasattr(args, "pr"):
        from tasks.kube.images import pr_from_env

        ci_pr = pr_from_env()
        if ci_pr is not None:
            overrides[PR_KEY] = ci_pr
    for path in args.vars_file:
        overrides.update(load_vars_file(path))
    if args.pr_args:
        try:
            text = read_text_bounded(args.pr_args, MAX_PR_COMMENT, what="PR comment",
                                     follow_links=True)
        except UnreadableInputError as exc:
            raise ConfigError(f"PR comment: {exc.reason}", file=args.pr_args) from None
        overrides.update(parse_pr_args(text, pr_policy or UntrustedPolicy(keys=()),
                                       source=args.pr_args))
    if getattr(args, "pr", None) is not None:
        overrides[PR_KEY] = args.pr
    for item in args.var:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--var expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = parse_override(key.strip(), value)
    return overrides


def resolve_from_args(project: str, args: argparse.Namespace) -> Config:
    """Resolve the project config from parsed command-line arguments, once.

    The overrides are parsed once too: the flow the command starts gets them back from
    ``Config.request_overrides`` (and takes this very config: `projects.config.resolve_once`).
    """
    return resolve(project, presets=args.preset,
                   overrides=overrides_from_args(args, policy_for(project)))


def runs_root(*, deployed: bool = False) -> Path:
    """Where runs go when no artifact dir is given.

    ``TELLTALE_RUNS_DIR`` when set; else ``runs/`` under the current dir for a terminal run,
    and ``<data dir>/runs`` for a deployment's run: a process worker runs it in a temporary
    dir (the git clone of its pull step) that it deletes afterwards.
    """
    settings = env_settings()
    if settings.runs_dir is not None:
        return settings.runs_dir
    return default_data_dir() / "runs" if deployed else Path("runs")


def default_artifact_dir(project: str, root: str | Path | None = None, *,
                         run_id: str | None = None) -> Path:
    """Return a fresh ``runs/<date>-<project>-<id>`` path (not created).

    The id is the flow run's (its first 8 characters, which crash hooks look for) or a
    random one (plan mode, no flow run).
    """
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    base = Path(root) if root is not None else runs_root()
    return base / f"{stamp}-{project}-{(run_id or uuid.uuid4().hex)[:8]}"


def exit_code_for(exc: BaseException) -> int:
    """The process exit code of an error: 2 user error, 130 interrupted, 143 terminated, else 1."""
    if is_terminated(exc):
        return EXIT_TERMINATED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, UserError):
        return EXIT_USAGE
    return EXIT_FAILED


def prefect_defaults() -> None:
    """Set Prefect settings Telltale relies on, unless the user set them.

    No telemetry; 60 s for the temporary API server to start (measured ~15 s on 2 cores,
    close to Prefect's 20 s default); task-run logs not shipped to the API when none runs.
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")


class _NoTracebackForOurErrors(logging.Filter):
    """Drop the traceback Prefect's engine logs with a Telltale error.

    Ours (`TelltaleError`: a user error, a service that is down) already say what is wrong
    in one line, which the command prints last; their tracebacks are noise on a terminal.
    Any other exception (a bug) keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop the traceback of a Telltale error; keep the record's one line."""
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, TelltaleError) or (
                error is not None and isinstance(error.__cause__, TelltaleError)):
            record.exc_info, record.exc_text = None, None
        return True


_ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine",
                   "prefect.task_engine")


def _quiet_engine_tracebacks() -> None:
    for name in _ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForOurErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForOurErrors())


Main = Callable[[Sequence[str] | None], int]


def main_guard(main: Main) -> Main:
    """Wrap a CLI ``main``: user errors print one line on stderr and exit 2, no traceback."""

    def guarded(argv: Sequence[str] | None = None) -> int:
        # `kill -USR1 <pid>` prints every thread's stack: what a run that seems stuck does
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
        _quiet_engine_tracebacks()
        try:
            env_settings()  # a bad TELLTALE_* variable is a usage error before any work
            return main(argv)
        except TelltaleError as exc:
            say(f"error: {exc}", error=True)
            return exit_code_for(exc)
        except KeyboardInterrupt as exc:
            say("terminated" if is_terminated(exc) else "interrupted", error=True)
            return exit_code_for(exc)
        except OSError as exc:  # e.g. a full disk: one line, not a 162-line traceback
            where = f" ({exc.filename})" if exc.filename else ""
            say(f"error: {exc.strerror or exc}{where}", error=True)
            return EXIT_FAILED

    return guarded
