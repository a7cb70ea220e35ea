"""How long the suite's longer tests take, and the order the xdist workers are dealt them.

pytest-xdist's work stealing (``--dist worksteal``) first splits the collected tests into one
contiguous block per worker, by count, and later moves the *tail* of the longest queue to a
worker that ran dry. Sorting the whole flows first put every one of them in the first
worker's block: that worker ran them one after the other while the others took its short
tests, and the suite ended on a minute-long test with the other workers idle. :func:`deal`
instead gives each block its share of the expected time (longest first onto the block with
the least so far), orders each block longest first, and leaves the short tests at the
blocks' ends, where stealing evens them out.

The expected seconds are ``tests/durations.json``: each test that took a second or more in a
quiet run of the whole suite (setup, call and teardown together). A test not listed costs
:data:`DEFAULT_SLOW_S` when marked ``slow``, else :data:`DEFAULT_S`. The figures only order
the suite — a stale one costs time, never a result. Refresh them from a run's report::

    ./telltale test --durations=0 | tee /tmp/suite.log
    python -m tests.durations /tmp/suite.log      # rewrites tests/durations.json

Standard library only: the conftest imports it before anything else.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

FILE = Path(__file__).resolve().parent / "durations.json"
# below this a test's time is its process's noise: not worth a line in the file
LISTED_FROM_S = 1.0
DEFAULT_S = 0.3
DEFAULT_SLOW_S = 10.0

T = TypeVar("T")


def expected_seconds(path: Path = FILE) -> dict[str, float]:
    """The listed tests' seconds by node id; empty when the file is missing or unreadable
    (the order falls back to the defaults: slower, never wrong)."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): float(v) for k, v in loaded.items()
            if isinstance(v, int | float) and v >= 0}


def block_sizes(count: int, workers: int) -> list[int]:
    """The sizes of the blocks xdist's work stealing first sends ``workers`` idle workers
    (``WorkStealingScheduling.check_schedule``: each takes ``len(pending) // remaining``)."""
    sizes = []
    left = count
    for remaining in range(workers, 0, -1):
        size = left // remaining
        sizes.append(size)
        left -= size
    return sizes


def deal(items: Sequence[T], cost: Callable[[T], float], workers: int,
         group: Callable[[T], object] | None = None) -> list[T]:
    """``items`` reordered so that ``workers`` contiguous blocks (:func:`block_sizes`) carry
    about equal expected time, each block longest first.

    ``group`` keeps together the items that share something costly to set up (a module's
    fixture: a second worker running one of them would set it up again); a group goes whole
    to one block where one has room. Longest first onto the block with the least expected
    time that still has room (the longest-processing-time rule, bounded by the blocks' fixed
    sizes); ties keep the collection order, so every worker computes the same order (xdist
    requires it).
    """
    keyed: dict[object, list[int]] = {}
    for i, item in enumerate(items):
        keyed.setdefault(group(item) if group else i, []).append(i)
    units = sorted(keyed.values(), key=lambda unit: -sum(cost(items[i]) for i in unit))
    if workers <= 1:
        return [items[i] for unit in units for i in unit]
    sizes = block_sizes(len(items), workers)
    blocks: list[list[int]] = [[] for _ in sizes]
    loads = [0.0] * len(sizes)

    def place(part: list[int]) -> bool:
        """Put ``part`` on the least-loaded block with room for it; False if none has."""
        room = [b for b in range(len(sizes)) if len(blocks[b]) + len(part) <= sizes[b]]
        if not room:
            return False
        b = min(room, key=lambda b: (loads[b], b))
        blocks[b].extend(part)
        loads[b] += sum(cost(items[i]) for i in part)
        return True

    for unit in units:
        if not place(unit):  # no block has room for the whole group: one by one
            for i in unit:
                place([i])
    return [items[i] for block in blocks for i in block]


_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*?)\s*$")


def from_report(text: str) -> dict[str, float]:
    """Seconds by node id from pytest's ``--durations=0`` report (setup + call + teardown),
    the tests of :data:`LISTED_FROM_S` or more, rounded to a tenth."""
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            seconds[match[2]] = seconds.get(match[2], 0.0) + float(match[1])
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])
            if v >= LISTED_FROM_S}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.durations REPORT``: rewrite tests/durations.json from a report."""
    parser = argparse.ArgumentParser(prog="python -m tests.durations",
                                     description="Rewrite tests/durations.json from the "
                                                 "report of `pytest --durations=0`.")
    parser.add_argument("report", type=Path, help="the saved output of a whole-suite run")
    args = parser.parse_args(argv)
    seconds = from_report(args.report.read_text(errors="replace"))
    if not seconds:
        print(f"error: {args.report} holds no --durations report line", file=sys.stderr)
        return 2
    FILE.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{len(seconds)} test(s), {sum(seconds.values()):.0f} s, written to {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
