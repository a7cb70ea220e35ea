"""The order the suite's tests are dealt to the xdist workers (tests.durations)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.durations import FILE, block_sizes, deal, expected_seconds, from_report, main

REPO = Path(__file__).resolve().parent.parent


def _blocks(order: list[int], workers: int) -> list[list[int]]:
    sizes = block_sizes(len(order), workers)
    starts = [sum(sizes[:b]) for b in range(len(sizes))]
    return [order[s:s + n] for s, n in zip(starts, sizes, strict=True)]


def test_the_blocks_are_those_xdist_work_stealing_sends_first() -> None:
    # WorkStealingScheduling.check_schedule: each idle node len(pending) // nodes_remaining
    assert block_sizes(10, 4) == [2, 2, 3, 3]
    assert block_sizes(1159, 4) == [289, 290, 290, 290]
    assert block_sizes(3, 4) == [0, 1, 1, 1]
    assert sum(block_sizes(1159, 3)) == 1159


def test_long_tests_are_spread_over_the_workers_each_block_longest_first() -> None:
    costs = [60.0] * 8 + [0.3] * 100  # eight whole flows, collected first
    order = deal(list(range(len(costs))), costs.__getitem__, 4)
    blocks = _blocks(order, 4)
    assert [sum(costs[i] >= 60 for i in block) for block in blocks] == [2, 2, 2, 2]
    for block in blocks:
        assert [costs[i] for i in block] == sorted((costs[i] for i in block), reverse=True)


def test_a_group_sharing_a_module_fixture_stays_in_one_block() -> None:
    costs = [30.0, 30.0, 30.0, 40.0] + [0.3] * 40
    group = {0: "m", 1: "m", 2: "m"}
    order = deal(list(range(len(costs))), costs.__getitem__, 2, group=lambda i: group.get(i, i))
    blocks = _blocks(order, 2)
    assert any({0, 1, 2} <= set(block) for block in blocks)
    assert blocks[0][:3] == [0, 1, 2] or blocks[1][:3] == [0, 1, 2]  # the 90 s group first


@given(st.lists(st.floats(0, 100), max_size=60), st.integers(1, 6),
       st.lists(st.integers(0, 3), max_size=60))
def test_every_test_is_dealt_once_and_the_order_is_the_same_each_time(
        costs: list[float], workers: int, groups: list[int]) -> None:
    key = {i: f"g{g}" for i, g in enumerate(groups) if g}
    order = deal(list(range(len(costs))), costs.__getitem__, workers,
                 group=lambda i: key.get(i, i))
    assert sorted(order) == list(range(len(costs)))
    assert order == deal(list(range(len(costs))), costs.__getitem__, workers,
                         group=lambda i: key.get(i, i))


def test_the_report_gives_each_tests_setup_call_and_teardown_together(tmp_path: Path) -> None:
    report = ("== slowest durations ==\n"
              "12.50s call     tests/e2e/test_a.py::test_x[a b]\n"
              "3.00s setup    tests/e2e/test_a.py::test_x[a b]\n"
              "0.40s call     tests/test_b.py::test_y\n"
              "0.01s teardown tests/e2e/test_a.py::test_x[a b]\n")
    assert from_report(report) == {"tests/e2e/test_a.py::test_x[a b]": 15.5}
    log = tmp_path / "suite.log"
    log.write_text("no report here\n")
    assert main([str(log)]) == 2  # nothing to write: the file is left as it was
    assert expected_seconds(tmp_path / "missing.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert expected_seconds(tmp_path / "bad.json") == {}


def test_every_listed_test_still_exists() -> None:
    """A renamed or removed test left in the file would fall back to the default cost (its
    new name unlisted): the file is refreshed instead (`python -m tests.durations LOG`)."""
    listed = json.loads(FILE.read_text())
    assert listed, "tests/durations.json is empty"
    stale = []
    for node in listed:
        path, _, name = node.partition("::")
        function = re.sub(r"\[.*\]$", "", name).split("::")[-1]
        source = REPO / path
        if not source.is_file() or f"def {function}(" not in source.read_text():
            stale.append(node)
    assert not stale, f"refresh tests/durations.json: {stale}"
