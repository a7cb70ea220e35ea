"""A run's timeline (`core.timeline`): moments since the process started, each one's length."""

from __future__ import annotations

import time

from core import timeline


def test_the_first_run_starts_at_the_process_start_and_a_later_one_at_its_first_mark() -> None:
    timeline._first_taken = False  # as in a fresh process
    before = time.time()
    start = timeline.process_start()
    assert start <= before  # the kernel's record, before this test ran
    timeline.mark("a")
    timeline.mark("b")
    first = timeline.take("end")
    assert [m.phase for m in first] == ["process start", "a", "b", "end"]
    assert first[0].at_s == 0.0 and first[1].at_s >= before - start - 0.01
    assert first[-1].seconds is None
    for moment, following in zip(first, first[1:], strict=False):
        assert moment.seconds == round(following.at_s - moment.at_s, 3) or abs(
            moment.seconds - (following.at_s - moment.at_s)) < 2e-3
    timeline.mark("c")
    second = timeline.take()
    assert [m.phase for m in second] == ["c", "outcome written"]  # nothing of the first run
    assert second[0].at_s == 0.0
