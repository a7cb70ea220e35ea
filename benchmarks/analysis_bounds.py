"""Bounded post-processing: peak memory and time of ``python -m analysis`` on hostile sizes.

    python benchmarks/analysis_bounds.py [--dirs 10000] [--log-gb 2] [--skip-log] [--no-report]

Two inputs (issue #20), each analysed by a fresh ``python -m analysis`` process whose peak RSS
is read from ``getrusage(RUSAGE_CHILDREN)`` (the same figure ``/usr/bin/time -v`` prints):

- one result dir whose ``pod.log`` is ``--log-gb`` GiB with no newline at all;
- ``--dirs`` result dirs with 10 KB logs (4 configurations, 6 hours apart), report on,
  analysed cold (no parse cache) then warm (no history: the issue's figure); the tenth of
  them is also judged against a history holding every one of its runs (each run against
  the runs before it).

Goals: peak RSS <= 500 MB for both (#20), <= 300 MB for 10 000 dirs with the report (#43);
time linear in the number of dirs (the script also runs a tenth of the dirs and prints the
ratio of seconds per dir).

Beside it, the largest anonymous part (``RssAnon``) any process of the command reached,
polled from ``/proc`` every 10 ms: what the command allocated. The rest of a peak RSS is the
shared libraries' pages mapped into it, and that count moves with the kernel's page cache,
not with the command: on a 6.x kernel that keeps libraries in large folios, a fault maps a
whole folio (session 48: the same command's peak read 320 MB on a machine's first run, 273
MB after the page cache was dropped, its anonymous part ~200 MB throughout).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.factories import DEFAULT_SETTINGS, make_result_dir  # noqa: E402

GOAL_MB = 500
TREE_GOAL_MB = 300  # #43: 10 000 dirs, report on


def build_tree(root: Path, dirs: int) -> None:
    """``dirs`` result dirs: 4 configurations (model x learning rate), one run a day each."""
    configs = [{"model_name": model,
                "hyper_parameters": {**DEFAULT_SETTINGS["hyper_parameters"], "learning_rate": lr}}
               for model in ("tiny-llama", "tiny-mistral") for lr in (0.0003, 0.0001)]
    start = datetime(2020, 1, 1, tzinfo=UTC)
    for i in range(dirs):
        config = configs[i % len(configs)]
        make_result_dir(root, f"{i:05d}__cell", settings=config,
                        tokens_per_second=1000 + (i * 37) % 100, noise_lines=60,
                        start=start + timedelta(hours=6 * i), seed=i)


def _status_kb(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` field in kB (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) for line in status
                         if line.startswith(field)), 0)
    except (OSError, ValueError):
        return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/PID/task/*/children``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            pass
    return found


def _watch_anonymous(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Keep in ``peak[0]`` the largest ``RssAnon`` of any process of ``pid``'s tree."""
    while not done.wait(0.01):
        for member in _tree(pid):
            peak[0] = max(peak[0], _status_kb(member, "RssAnon:"))


def analyse(results: Path, out: Path, extra: list[str]) -> tuple[float, float, int, float]:
    """Run ``python -m analysis`` once; (seconds, peak RSS in MB, exit code, the largest
    anonymous RSS of any of its processes in MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    # a fresh interpreter each time: a command served by a warm Python (core.warm_command)
    # runs in the warm Python's child, not in a child of this process, whose peak is read
    proc = subprocess.Popen([sys.executable, "-m", "analysis", str(results), "--project",
                             "fine_tuning", "--out", str(out), *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TELLTALE_WARM_COMMAND_MINUTES": "0"})
    done, anonymous = threading.Event(), [0]
    watcher = threading.Thread(target=_watch_anonymous, args=(proc.pid, done, anonymous))
    watcher.start()
    try:
        _, stderr = proc.communicate()
    finally:
        done.set()
        watcher.join()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        print(stderr[-2000:], file=sys.stderr)
    # ru_maxrss of children is the largest child so far: each call's own peak shows only
    # when it is the largest yet, so the measured process runs are ordered small to large
    return seconds, max(peak, before) / 1024, proc.returncode, anonymous[0] / 1024


def bench_log(tmp: Path, gib: float) -> None:
    """One result dir with a newline-free log of ``gib`` GiB."""
    results = tmp / "bigline"
    run = make_result_dir(results, "000__cell")
    log = run / "001__fine_tuning__run_fine_tuning_job" / "artifacts" / "pod.log"
    block = b"x" * (1 << 20)
    with open(log, "wb") as stream:
        for _ in range(int(gib * 1024)):
            stream.write(block)
    seconds, peak, code, anonymous = analyse(results, tmp / "bigline-out", ["--no-report"])
    print(f"newline-free log {gib:.1f} GiB : {seconds:6.1f} s, peak RSS {peak:6.0f} MB "
          f"(goal <= {GOAL_MB}; anonymous {anonymous:.0f} MB), exit {code}", flush=True)
    shutil.rmtree(results)


def bench_tree(tmp: Path, dirs: int, report: bool) -> None:
    """Cold then warm analysis of ``dirs`` dirs, and a tenth of them for the linearity."""
    extra = [] if report else ["--no-report"]
    small = max(dirs // 10, 1)
    for count in (small, dirs):
        results = tmp / f"tree{count}"
        t0 = time.perf_counter()
        build_tree(results, count)
        print(f"tree of {count} dirs built in {time.perf_counter() - t0:.0f} s", flush=True)
        cold = analyse(results, tmp / f"out{count}", extra)
        warm = analyse(results, tmp / f"out{count}w", extra)
        measured = [("cold", cold), ("warm", warm)]
        if count == small:  # every run judged against the history of the runs before it
            history = tmp / "history"
            analyse(results, tmp / "seed", ["--no-report", "--history", str(history)])
            measured.append(("judged", analyse(results, tmp / f"out{count}h",
                                               [*extra, "--history", str(history),
                                                "--no-append"])))
        goal = TREE_GOAL_MB if count >= 10_000 and report else GOAL_MB
        for name, (seconds, peak, code, anonymous) in measured:
            print(f"{count:6d} dirs {name:6s}: {seconds:6.1f} s = "
                  f"{seconds / count * 1000:5.2f} ms/dir, peak RSS {peak:6.0f} MB "
                  f"(goal <= {goal}: {peak / goal:.2f}x; anonymous {anonymous:4.0f} MB), "
                  f"exit {code}", flush=True)
        shutil.rmtree(results)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dirs", type=int, default=10_000)
    parser.add_argument("--log-gb", type=float, default=2.0)
    parser.add_argument("--skip-log", action="store_true")
    parser.add_argument("--skip-tree", action="store_true")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DO_NOT_TRACK", "1")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if not args.skip_log:
            bench_log(tmp, args.log_gb)
        if not args.skip_tree:
            bench_tree(tmp, args.dirs, not args.no_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
