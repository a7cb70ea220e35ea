"""Work beside the caller (`core.forked`): a forked child's answer, or the work done at once.

pytest's workers run threads (xdist's channel), where `beside` must never fork: so each case
runs in a fresh single-threaded interpreter (a script), and the in-process tests check the
inline path that a flow run's threads get.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.forked import ChildDied, beside, can_fork

REPO = Path(__file__).resolve().parents[2]

CASES = r'''
import atexit, json, os, signal, sys, threading
from core.forked import ChildDied, beside, can_fork

case = sys.argv[1]
out = {"parent": os.getpid(), "can_fork": can_fork()}

def boom():
    raise ValueError("the work failed: bad row 7")

class Odd(Exception):
    def __init__(self, a, b):  # pickle rebuilds it with one argument: it cannot travel
        super().__init__(f"{a}/{b}")

def odd():
    raise Odd(1, 2)

def unsafe():
    from core.safeio import UnsafeOutputError
    raise UnsafeOutputError("it is a symbolic link", path="/out/kpis.prom")

class Locked(Exception):
    pass

def locked():
    exc = Locked("holds a lock")
    exc.lock = threading.Lock()  # no pickle carries a lock
    raise exc

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if case == "value":
    job = beside(os.getpid)
    out["forked"], out["child"] = job.forked, job.result()
elif case == "error":
    try:
        beside(boom).result()
    except ValueError as exc:
        out["error"] = str(exc)
elif case == "unpicklable":
    for work in (odd, unsafe, locked):
        try:
            beside(work).result()
        except Exception as exc:
            out.setdefault("errors", []).append(
                [type(exc).__name__, str(exc), getattr(exc, "filename", None)])
elif case == "killed":
    try:
        beside(die).result()
    except ChildDied as exc:
        out["error"] = str(exc)
elif case == "big":
    out["size"] = len(beside(lambda: b"x" * (5 << 20)).result())
elif case == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
    job = beside(os.getpid)
    out["forked"], out["child"] = job.forked, job.result()
    stop.set()
elif case == "stopped":
    reader, writer = os.pipe()
    try:
        with beside(os.read, reader, 1) as job:  # waits on a pipe nobody writes
            out["child"] = job.pid
            raise KeyError("the caller failed")
    except KeyError:
        pass
    try:
        os.kill(out["child"], 0)
        out["alive"] = True
    except ProcessLookupError:
        out["alive"] = False
elif case == "streams":
    print("parent line", flush=False)  # still in the buffer when the child is forked
    atexit.register(lambda: print("parent handler"))
    job = beside(print, "child line")
    job.result()
elif case == "values":
    values = json.loads(sys.stdin.read())
    out["back"] = beside(lambda: values).result()
if case != "streams":
    print(json.dumps(out))
'''


def _run(case: str, *, env: dict[str, str] | None = None, stdin: str = "") -> Any:
    proc = subprocess.run([sys.executable, "-c", CASES, case], cwd=REPO, input=stdin,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout if case == "streams" else json.loads(proc.stdout)


def test_the_answer_comes_from_a_child_on_another_core_when_one_can_fork() -> None:
    out = _run("value")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: beside runs the work at once")
    assert out["can_fork"] and out["forked"]
    assert out["child"] != out["parent"]


def test_a_childs_exception_is_raised_by_result() -> None:
    assert _run("error")["error"] == "the work failed: bad row 7"
    # its class, message and attributes, whatever its __init__ takes; words if not even that
    assert _run("unpicklable")["errors"] == [
        ["Odd", "1/2", None],
        ["UnsafeOutputError", "cannot write /out/kpis.prom: it is a symbolic link",
         "/out/kpis.prom"],
        ["RuntimeError", "Locked: holds a lock", None]]


def test_a_child_that_dies_says_how() -> None:
    error = _run("killed")["error"]
    assert "ended without an answer" in error and "SIGKILL" in error


def test_an_answer_larger_than_a_pipe_travels_whole() -> None:
    assert _run("big")["size"] == 5 << 20


def test_a_process_with_threads_or_the_setting_off_does_the_work_itself() -> None:
    threaded = _run("thread")
    assert not threaded["forked"] and threaded["child"] == threaded["parent"]
    off = _run("value", env={"TELLTALE_BESIDE": "0"})
    assert not off["can_fork"] and not off["forked"] and off["child"] == off["parent"]


def test_a_failing_caller_leaves_no_child_working() -> None:
    out = _run("stopped")
    assert out["child"] and out["alive"] is False


def test_nothing_is_printed_twice_and_no_handler_runs_in_the_child() -> None:
    lines = _run("streams").splitlines()
    assert sorted(lines) == ["child line", "parent handler", "parent line"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=6),
    max_leaves=40)


@settings(max_examples=15, deadline=None)
@given(st.lists(json_values, max_size=30))
def test_any_answer_comes_back_equal(values: list[Any]) -> None:
    assert _run("values", stdin=json.dumps(values))["back"] == values


def test_in_a_threaded_process_the_work_runs_at_once_with_its_error_kept() -> None:
    stop = threading.Event()
    waiter = threading.Thread(target=stop.wait)
    waiter.start()  # a second thread, as in a flow run (pytest's worker may have one too)
    try:
        assert not can_fork()
        job = beside(os.getpid)
        assert not job.forked and job.result() == os.getpid()
        with pytest.raises(ZeroDivisionError):
            beside(lambda: 1 // 0).result()
        with pytest.raises(ChildDied):  # the inline path raises what it was given, as is
            beside(_raise, ChildDied("x")).result()
    finally:
        stop.set()
        waiter.join()


def _raise(exc: Exception) -> None:
    raise exc


SHARED = r'''
import json, os, sys
from core.forked import Claims, Handoff, beside

n = 20_000
claims, handoff = Claims(), Handoff()
go_read, go_write = os.pipe()

def child() -> list[int]:
    handoff.give({"found": list(range(3))})  # given while it works on
    os.read(go_read, 1)  # the parent took the value, then writes this byte
    mine = []
    while (i := claims.front(n)) is not None:
        mine.append(i)
    return mine

with beside(child) as job:
    given = handoff.take()
    os.write(go_write, b"x")
    ours = []
    while (i := claims.back(n)) is not None:
        ours.append(i)
    theirs = job.result()
dead = Handoff()
with beside(os._exit, 3) as gone:  # dies without giving: take() does not wait forever
    none = dead.take()
print(json.dumps({"given": given, "forked": job.forked and gone.forked, "none": none,
                  "covered": sorted(set(ours) | set(theirs)) == list(range(n)),
                  "twice": len(set(ours) & set(theirs)),
                  "ours_from_the_end": ours == sorted(ours, reverse=True),
                  "theirs_from_the_start": theirs == sorted(theirs)}))
'''


def _forking(script: str) -> Any:
    """What ``script`` prints (JSON), run in a fresh single-threaded interpreter; skipped
    where it could not fork (its ``forked`` is false)."""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True,
                          env={**os.environ, "TELLTALE_BESIDE": "1"})
    answer = json.loads(proc.stdout)
    if not answer["forked"]:
        pytest.skip("no fork here (one usable CPU)")
    return answer


def test_claims_and_a_handoff_work_across_a_fork() -> None:
    """`Claims`: a child claiming from the front and its parent from the back cover every
    index, twice only around where they meet; `Handoff`: a value given while the child
    works on is taken before its end, and a child that ends without giving ends the wait."""
    answer = _forking(SHARED)
    assert answer == {"given": {"found": [0, 1, 2]}, "forked": True, "none": None,
                      "covered": True, "twice": answer["twice"], "ours_from_the_end": True,
                      "theirs_from_the_start": True}
    assert answer["twice"] <= 2  # a claim read the other's end just before it moved


PIPE_ONLY = r'''
import json, os
from core import forked
from core.forked import Handoff, beside

forked._anonymous_file = lambda: None
big = {"rows": list(range(200_000))}  # ~1 MB pickled: sixteen times a pipe's buffer
handoff = Handoff()
with beside(handoff.give, big) as job:
    taken = handoff.take()
print(json.dumps({"forked": job.forked, "same": taken == big}))
'''


def test_a_handoff_in_one_process_or_through_the_pipe_alone() -> None:
    """Where no child was forked the value is kept as given (a pipe would block a value
    over its 64 KB in the one process that writes and reads it); and with no anonymous file
    a forked child's value crosses in the pipe itself, however large."""
    from core.forked import Handoff

    big = {"rows": list(range(200_000))}
    handoff = Handoff()
    handoff.give(big)
    assert handoff.take() == big
    assert _forking(PIPE_ONLY) == {"forked": True, "same": True}
