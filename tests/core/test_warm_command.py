"""A command line served by a warm Python (`core.warm_command`): the child is the command a
fresh interpreter would have run — its stdio, directory, variables, arguments, exit code and
signals — and a key that changes with the code or the environment never reaches it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.warm_key import SHELL_BOOKKEEPING, code_stamps, warm_key
from core.warm_python import acquire, offer, stop_warm_pythons
from tests.factories import process_gone

PRELOAD = ("json",)
# The command: says what it is (one JSON line), echoes a stdin line, then ends as told.
PROBE = '''
import json, os, signal, sys, time
mode = sys.argv[1]
try:  # a Ctrl-C may come as soon as the first line is out
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "ppid": os.getppid(),
                      "pid": os.getpid(), "wx": os.environ.get("WX"), "name": __name__,
                      "stdin": sys.stdin.readline() if mode == "echo" else None}), flush=True)
    sys.stderr.write("a line on stderr\\n")
    if mode == "wait":
        time.sleep(600)
    if mode == "tally":  # one line a run, then an end at once
        with open("tally", "a") as tally:
            tally.write("ran\\n")
        sys.exit(77)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
sys.exit(int(mode) if mode.isdigit() else 0)
'''
# The client, as a command's __main__ calls it: served, else says so (exit 99)
CLIENT = f'''
import sys
from core.warm_command import command_key, served_warm
key = command_key({PRELOAD!r})
if sys.argv[1:] == ["key"]:
    print(key)
    sys.exit(0)
code = served_warm(key, "cmd_probe", sys.argv[1:])
if code is None and sys.argv[1:] == ["tally"]:  # as a command's __main__ does: run it here
    import runpy
    runpy.run_module("cmd_probe", run_name="__main__")
sys.exit(99 if code is None else code)
'''


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], int]]:
    """A work dir with the probe, the client's environment, and the warm Python's pid."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "cmd_probe.py").write_text(PROBE)
    (work / "client.py").write_text(CLIENT)
    env = {**os.environ, "TELLTALE_PREFECT_API_HOME": str(tmp_path / "home"), "WX": "wx1"}
    key = _client(work, env, "key").stdout.strip()
    base = tmp_path / "home" / "telltale-warm-python"
    assert offer(key, sys.executable, PRELOAD, work, env, minutes=5, base=base)
    warm = acquire(key, base=base)
    assert warm is not None
    try:
        yield work, env, warm.pid
    finally:
        stop_warm_pythons(tmp_path)
        assert process_gone(warm.pid)


def _client(work: Path, env: dict[str, str], *args: str, stdin: str = ""
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "client.py", *args], cwd=work, env=env,
                          input=stdin, capture_output=True, text=True, timeout=600)


def _waiting_client(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    """The client of a command that waits, as a terminal's foreground job (SIGINT at its
    default: a CI shell's background job ignores it, and every child would inherit that);
    and the served command's pid, once it runs."""
    launcher = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    job = subprocess.Popen([sys.executable, "-c", launcher, sys.executable, "client.py", "wait"],
                           cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    assert job.stdout is not None
    return job, int(json.loads(job.stdout.readline())["pid"])


def test_the_command_runs_in_the_warm_python_with_this_process_stdio(
        served: tuple[Path, dict[str, str], int]) -> None:
    work, env, warm_pid = served
    proc = _client(work, env, "echo", "--x", "ü", stdin="a line in\n")
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout.splitlines()[0])
    assert said["ppid"] == warm_pid  # forked by the warm Python, not run here
    assert said["argv"] == ["echo", "--x", "ü"] and said["cwd"] == str(work)
    assert said["wx"] == "wx1" and said["name"] == "__main__"
    assert said["stdin"] == "a line in\n"
    assert proc.stderr == "a line on stderr\n"


@pytest.mark.parametrize("code", [0, 1, 2, 77])
def test_the_commands_exit_code_is_this_process_exit_code(
        served: tuple[Path, dict[str, str], int], code: int) -> None:
    work, env, _ = served
    assert _client(work, env, str(code)).returncode == code


def test_a_command_that_ends_at_once_is_run_once(
        served: tuple[Path, dict[str, str], int]) -> None:
    """Its connection is closed as soon as it ended: the client must never take that for
    a refusal and run the command again itself (an empty send after the order got EPIPE)."""
    work, env, _ = served
    for _ in range(50):  # the race it had was lost about once in 30 on a loaded machine
        assert _client(work, env, "tally").returncode == 77
    assert (work / "tally").read_text().splitlines() == ["ran"] * 50


def test_another_environment_is_another_key_and_runs_nothing(
        served: tuple[Path, dict[str, str], int]) -> None:
    work, env, _ = served
    proc = _client(work, {**env, "WX": "wx2"}, "0")
    assert proc.returncode == 99 and not proc.stdout  # not served: the command runs itself


def test_ctrl_c_and_sigterm_reach_the_served_command(
        served: tuple[Path, dict[str, str], int]) -> None:
    work, env, _ = served
    for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)):
        job, child = _waiting_client(work, env)
        os.kill(job.pid, sig)
        assert job.wait(timeout=600) == expected
        assert process_gone(child)
        assert job.stdout is not None
        if sig == signal.SIGINT:
            assert "interrupted" in job.stdout.read()
        job.stdout.close()


def test_a_killed_client_takes_its_command_with_it(
        served: tuple[Path, dict[str, str], int]) -> None:
    work, env, warm_pid = served
    job, child = _waiting_client(work, env)
    job.kill()
    job.wait(timeout=600)
    assert job.stdout is not None
    job.stdout.close()
    assert process_gone(child)
    assert _client(work, env, "0").returncode == 0  # the warm Python serves on


def test_no_warm_python_leaves_the_command_to_the_caller(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "client.py").write_text(CLIENT)
    env = {**os.environ, "TELLTALE_PREFECT_API_HOME": str(tmp_path / "home")}
    proc = _client(work, env, "0")
    assert proc.returncode == 99 and not proc.stdout and not proc.stderr
    stale = tmp_path / "home" / "telltale-warm-python" / _client(work, env, "key").stdout.strip()
    stale.mkdir(parents=True)
    (stale / "sock").write_text("")  # a dead warm Python's leftover: never connected to
    (stale / "pid").write_text(f"{os.getpid()}\n")  # a live pid, but not a warm Python
    assert _client(work, env, "0").returncode == 99


def test_a_stamp_of_the_code_changes_the_key(tmp_path: Path) -> None:
    code = tmp_path / "pkg"
    (code / "sub").mkdir(parents=True)
    (code / "sub" / "mod.py").write_text("x = 1\n")
    (code / "__pycache__").mkdir()
    roots = [("code:pkg", code, True)]
    env = {"A": "1"}
    key = warm_key(sys.executable, PRELOAD, tmp_path, env, code=roots)
    stamps = code_stamps(roots)
    (code / "__pycache__" / "mod.pyc").write_bytes(b"compiled")  # caches are not code
    assert code_stamps(roots) == stamps
    (code / "sub" / "mod.py").write_text("x = 2\n")  # same size, a new mtime
    os.utime(code / "sub" / "mod.py", ns=(1, 1))
    assert code_stamps(roots) != stamps
    assert warm_key(sys.executable, PRELOAD, tmp_path, env, code=roots) != key
    stamps = code_stamps(roots)
    (code / "sub" / "new.py").write_text("")
    assert code_stamps(roots) != stamps
    # a location not walked: its own stamp only
    assert code_stamps([("site:0", code, False)]) == code_stamps([("site:0", code, False)])


@settings(max_examples=40)
@given(name=st.text(alphabet=st.characters(min_codepoint=65, max_codepoint=90), min_size=1,
                    max_size=12).filter(lambda n: n not in SHELL_BOOKKEEPING),
       value=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20))
def test_every_variable_keys_a_kept_modules_warm_python(name: str, value: str) -> None:
    """Kept modules were imported under the warm Python's environment: any variable — a
    TELLTALE_ one too, unlike a workload's key — makes another key; the shell's own
    bookkeeping does not."""
    env = {"BASE": "1"}
    code: list[tuple[str, Path, bool]] = []
    key = warm_key(sys.executable, PRELOAD, "/tmp", env, code=code)
    for variable in (name, f"TELLTALE_{name}"):
        if variable != "BASE":
            assert warm_key(sys.executable, PRELOAD, "/tmp", {**env, variable: value},
                            code=code) != key
    assert warm_key(sys.executable, PRELOAD, "/tmp", {**env, "OLDPWD": value, "SHLVL": "3"},
                    code=code) == key


def test_a_signal_before_the_child_is_known_is_passed_on_or_taken_here() -> None:
    """The order is sent, the child's pid not yet read back: a Ctrl-C then reaches the child
    as its pid comes, not when the command ends (one that waits never would: the race CI
    lost once, the command printing before its client read the pid); with no child at
    all, this process takes it as it would have."""
    from core.warm_command import _forwarding

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               start_new_session=True)
    try:
        with _forwarding() as known:
            signal.raise_signal(signal.SIGTERM)  # held: no child yet
            assert sleeper.poll() is None
            known(sleeper.pid)
            assert sleeper.wait(timeout=600) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()
    # a test worker may run with SIGINT ignored: the handler this process would have
    held = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), _forwarding():
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, held)
