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


FLAG = r'''
import json, os, sys
from core.forked import Flag, beside

flag, go_read, go_write = Flag(), *os.pipe()

def child_waits_then_reads() -> bool:
    os.read(go_read, 1)  # the parent sets the flag, then writes this byte
    return flag.is_set()

before = flag.is_set()
with beside(child_waits_then_reads) as late:
    flag.set()
    os.write(go_write, b"x")
    seen_late = late.result()
other = Flag()
with beside(lambda: (other.set(), True)[1]) as job:
    job.result()
print(json.dumps({"before": before, "seen_late": seen_late, "set_by_child": other.is_set(),
                  "forked": late.forked and job.forked}))
'''


def test_a_flag_set_on_either_side_of_a_fork_is_seen_on_the_other() -> None:
    """`Flag`: set by the parent after the fork, seen by the child; set by a child, seen by
    its parent (a copied page would show neither)."""
    proc = subprocess.run([sys.executable, "-c", FLAG], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True,
                          env={**os.environ, "TELLTALE_BESIDE": "1"})
    answer = json.loads(proc.stdout)
    if not answer["forked"]:
        pytest.skip("no fork here (one usable CPU)")
    assert answer == {"before": False, "seen_late": True, "set_by_child": True,
                      "forked": True}
