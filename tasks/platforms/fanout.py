"""Local multi-user fan-out: N worker processes, a real start barrier, a staggered start.

    python -m tasks.platforms.fanout --users N --root DIR [--batch-size B] [--sleep-factor S]
        [--barrier-timeout T] [--abort-on-failure] -- COMMAND ARG...

How a user runs:

1. it is forked from this launcher (fork, not spawn: ~1 ms a user instead of ~50), writes
   ``ready_at`` and waits on a ``multiprocessing.Barrier(N)`` — no user starts before all N
   are ready (a broken or timed-out barrier fails every user with exit code 125);
2. it sleeps its stagger, ``floor(index / batch_size) * sleep_factor`` seconds;
3. it runs the scenario: ``COMMAND`` with ``{index}``, ``{users}`` and ``{dir}`` replaced (its
   output to ``user-<index>/pod.log``), or the built-in ``sleep:<seconds>`` scenario; with
   ``--warm RECORD`` (a warm Python's record, `core.warm_python`) a ``PYTHON -m MODULE``
   command is forked from that warm Python instead of started as a new interpreter (its
   imports done once for every user; not reached: a new interpreter, as without it);
4. it writes ``user-<index>/exit_code`` and ``user-<index>/timings.json`` (``launch``: how
   its command was started).

With ``--abort-on-failure`` the first failure stops users that have not started yet (they
exit 124 and say so). The launcher runs in its own process so the forks never copy a
Prefect process's threads. The layout (``user-<index>/``) is the one the cluster fan-out
uploads to S3, so one parser reads both.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from core.pids import set_parent_death_signal
from core.safeio import open_append, read_text_bounded, write_text
from tasks.runner import die_with_parent

if TYPE_CHECKING:  # imported when a warm Python is given: the launcher starts light
    from core.warm_python import WarmPython

__all__ = ["FanoutResult", "UserTimings", "run_local_fanout", "stagger_delay"]

_MAX_TIMINGS = 64 * 1024  # a user's timings.json: a few hundred bytes
EXIT_BARRIER = 125
EXIT_ABORTED = 124


class UserTimings(BaseModel):
    """One user's timeline (epoch seconds) and outcome."""

    index: int
    exit_code: int
    launched_at: float
    ready_at: float
    released_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stagger_s: float = 0.0
    note: str | None = None
    launch: str | None = None  # a fresh process, or forked from the warm Python (its pid)


class FanoutResult(BaseModel):
    """All users of one fan-out."""

    users: list[UserTimings]
    launched_at: float
    ended_at: float
    success_count: int
    user_count: int
    release_skew_p50_ms: float | None = Field(default=None)
    release_skew_p99_ms: float | None = Field(default=None)


def stagger_delay(index: int, batch_size: int, sleep_factor: float) -> float:
    """Seconds user ``index`` waits after the barrier: ``floor(index / batch) * factor``."""
    return math.floor(index / max(1, batch_size)) * sleep_factor


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _run_command(argv: list[str], log_file: Path, warm: WarmPython | None) -> tuple[int, str]:
    """One user's command: its exit code and how it was launched.

    Forked from ``warm`` when given (the user's connection closing — this process dying
    with its launcher — makes the warm Python stop it), else, or when the warm Python is not
    reached, a new interpreter that dies with this process (`tasks.warm_launch`).
    """
    def fresh() -> int:
        with open_append(log_file) as log:  # never through a link, as the forked one's
            return subprocess.run(die_with_parent(argv), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, check=False).returncode

    if warm is None:  # the warm Python's client is imported only by the users that use it
        from projects.library.runs import FRESH

        return fresh(), FRESH
    from tasks.warm_launch import fork_or_fresh

    return fork_or_fresh(warm, argv, fresh, env=dict(os.environ), output_file=log_file)


def _user(index: int, users: int, root: str, command: list[str], batch_size: int,
          sleep_factor: float, barrier: Any, abort: Any, barrier_timeout: float,
          launched_at: float, warm: WarmPython | None = None) -> None:
    set_parent_death_signal()  # a user never outlives its launcher (deadline, SIGKILL)
    directory = Path(root) / f"user-{index:03d}"
    directory.mkdir(parents=True, exist_ok=True)
    timings: dict[str, Any] = {"index": index, "launched_at": launched_at,
                               "ready_at": time.time(), "exit_code": 1}
    try:
        try:
            barrier.wait(timeout=barrier_timeout)
        except Exception as exc:  # BrokenBarrierError, timeout
            timings.update(exit_code=EXIT_BARRIER, note=f"barrier: {type(exc).__name__}")
            return
        timings["released_at"] = time.time()
        timings["stagger_s"] = stagger_delay(index, batch_size, sleep_factor)
        if timings["stagger_s"]:
            time.sleep(timings["stagger_s"])
        if abort.is_set():
            timings.update(exit_code=EXIT_ABORTED, note="aborted: another user failed")
            return
        timings["started_at"] = time.time()
        if len(command) == 1 and command[0].startswith("sleep:"):
            time.sleep(float(command[0].split(":", 1)[1]))
            code = 0
        else:
            argv = [a.format(index=index, users=users, dir=directory) for a in command]
            code, timings["launch"] = _run_command(argv, directory / "pod.log", warm)
        timings["ended_at"] = time.time()
        timings["exit_code"] = code
        if code != 0:
            abort.set()
    finally:
        write_text(directory / "timings.json", json.dumps(timings))
        write_text(directory / "exit_code", f"{timings['exit_code']}\n")
        os._exit(0)  # a forked child must not run the parent's atexit handlers


def run_local_fanout(users: int, root: str | Path, command: Sequence[str], *,
                     batch_size: int = 1, sleep_factor: float = 0.0,
                     barrier_timeout: float = 300.0,
                     abort_on_failure: bool = False,
                     warm: WarmPython | None = None) -> FanoutResult:
    """Run ``users`` users of ``command`` behind a start barrier; see the module docstring."""
    if users < 1:
        raise ValueError("users must be >= 1")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(users)
    abort = context.Event()
    ignored = context.Event()  # without abort_on_failure a failure stops no one
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    launched_at = time.time()
    processes = []
    for index in range(users):
        process = context.Process(target=_user, args=(
            index, users, str(base), list(command), batch_size, sleep_factor, barrier,
            abort if abort_on_failure else ignored, barrier_timeout, time.time(), warm))
        process.start()
        processes.append(process)
    for process in processes:
        process.join()
    ended_at = time.time()
    timings = [UserTimings.model_validate(json.loads(
        read_text_bounded(base / f"user-{i:03d}" / "timings.json", _MAX_TIMINGS,
                          what="a user's timings"))) for i in range(users)]
    released = [t.released_at for t in timings if t.released_at is not None]
    skew = [(r - min(released)) * 1000 for r in released] if released else []
    return FanoutResult(users=timings, launched_at=launched_at, ended_at=ended_at,
                        success_count=sum(t.exit_code == 0 for t in timings),
                        user_count=users,
                        release_skew_p50_ms=_percentile(skew, 0.5) if skew else None,
                        release_skew_p99_ms=_percentile(skew, 0.99) if skew else None)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of the launcher; writes ``fanout.json`` and exits 0 (results in files)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.platforms.fanout")
    parser.add_argument("--users", type=int, required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sleep-factor", type=float, default=0.0)
    parser.add_argument("--barrier-timeout", type=float, default=300.0)
    parser.add_argument("--abort-on-failure", action="store_true")
    parser.add_argument("--warm", help="a warm Python's record (JSON) the users fork from")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command (or sleep:<seconds>) is required after --")
    warm = None
    if args.warm:
        from core.warm_python import WarmPython

        try:
            warm = WarmPython.from_record(json.loads(args.warm))
        except (ValueError, KeyError, TypeError) as exc:
            parser.error(f"--warm: not a warm Python's record: {exc}")
    result = run_local_fanout(args.users, args.root, command, batch_size=args.batch_size,
                              sleep_factor=args.sleep_factor,
                              barrier_timeout=args.barrier_timeout,
                              abort_on_failure=args.abort_on_failure, warm=warm)
    write_text(Path(args.root, "fanout.json"), result.model_dump_json(indent=1))
    print(f"{result.success_count}/{result.user_count} users succeeded; command: "
          f"{shlex.join(command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
