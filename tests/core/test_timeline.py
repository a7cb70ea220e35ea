"""A run's timeline (`core.timeline`): moments since the process started, each one's length."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import timeline
from core.errors import ConfigError
from flows.orchestration import orchestrate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeline of a fresh process: no run taken yet and no marks (an earlier test in
    this worker may have marked moments and never taken them)."""
    monkeypatch.setattr(timeline, "_first_taken", False)
    monkeypatch.setattr(timeline, "_marks", [])


def test_the_first_run_starts_at_the_process_start_and_a_later_one_at_its_first_mark(
        fresh: None) -> None:
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


def test_the_process_start_is_the_kernels_to_a_clock_tick() -> None:
    """A child's recorded start lies between a clock read just before it was spawned and
    one after it ended (less one clock tick: the kernel counts whole ticks). The start from
    ``btime`` (whole seconds) plus the ticks came up to a second before the spawn."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    for _ in range(3):
        before = time.time()
        done = subprocess.run([sys.executable, "-c", "from core.timeline import process_start;"
                               " print(repr(process_start()))"], cwd=REPO, check=True,
                              capture_output=True, text=True, timeout=600)
        after = time.time()
        start = float(done.stdout)
        assert before - tick - 1e-3 <= start <= after, (start - before, after - start)


def test_a_run_that_fails_before_its_outcome_leaves_no_moment_to_the_next(
        fresh: None, tmp_path: Path) -> None:
    """A served deployment runs one flow after another in one process: a run that ends on a
    config error (no outcome written, no `take`) must not start the next run's timeline."""
    with pytest.raises(ConfigError):
        orchestrate("fine_tuning", ["no-such-preset"], {}, "local", str(tmp_path / "run"))
    assert timeline._marks == []
    timeline.mark("next run")
    assert [m.phase for m in timeline.take()] == ["next run", "outcome written"]
