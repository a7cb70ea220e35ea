"""The warm Python (`core.warm_python`): a workload forked from it is the process a fresh
``python -m`` would have been, and it never outlives what it must not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.pids import pid_alive
from core.warm_child import WarmPythonGone, run_warm
from core.warm_key import installed_stamps, warm_key, workload_module
from core.warm_python import (
    WarmPython,
    acquire,
    offer,
    stop_warm_pythons,
)
from projects.library.runs import FORKED, FRESH
from tasks.warm_launch import fork_or_fresh
from tests.factories import process_gone, wait_until

# A workload that says what it is, then waits for its order (a FIFO), or exits with a code.
WORKLOAD = '''
import json, os, random, sys, time
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("core", "tasks", "projects"))
import numpy
me = {"ours_ahead": ours, "argv": sys.argv[1:], "cwd": os.getcwd(), "wx": os.environ.get("WX"),
      "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode().split("\\0"),
      "pgid": os.getpgid(0), "pid": os.getpid(), "ppid": os.getppid(),
      "random": random.random(), "numpy": float(numpy.random.random()),
      "name": __name__, "file": __file__}
print(json.dumps(me))
sys.stderr.write("a line on stderr\\n")
if sys.argv[1] == "wait":
    open(sys.argv[2]).read()  # blocks until the test (never) writes
if sys.argv[1] == "leave":  # a child left behind, deaf to SIGTERM (as GuideLLM's workers)
    import subprocess
    left = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print(json.dumps({"left": left.pid}), flush=True)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
'''


@pytest.fixture
def warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[WarmPython, Path]]:
    """A warm Python (numpy imported ahead) for workloads in ``tmp_path/work``."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "wl_probe.py").write_text(WORKLOAD)
    monkeypatch.chdir(work)
    base = tmp_path / ("a-user-home-longer-than-a-socket-path-" * 3) / "warm"  # > 107 bytes
    key = warm_key(sys.executable, ["numpy"], work, dict(os.environ))
    assert offer(key, sys.executable, ["numpy"], work, dict(os.environ), minutes=5, base=base)
    found = acquire(key, base=base)
    assert found is not None
    try:
        yield found, work
    finally:
        stop_warm_pythons(base)
        assert process_gone(found.pid)


def _run(found: WarmPython, work: Path, *args: str, timeout: float | None = 600,
         **env: str) -> tuple[int, list[dict[str, object]], str, list[int]]:
    started: list[int] = []
    log = work / "out.log"
    log.unlink(missing_ok=True)
    code = run_warm(found, [sys.executable, "-m", "wl_probe", *args],
                    env={**os.environ, **env}, output_file=log, timeout=timeout,
                    on_start=started.append)
    text = log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return code, lines, text, started


@pytest.mark.parametrize("launch", ["forked", "fresh"])
def test_what_a_workload_leaves_in_its_session_goes_with_it(warm, launch: str) -> None:
    """A finished workload's session is emptied: a child it left (GuideLLM's workers
    outlived a load by minutes) is killed, forked or fresh (`core.pids.kill_leftovers`)."""
    from tasks.runner import run

    found, work = warm
    if launch == "forked":
        code, lines, _, _ = _run(found, work, "leave")
    else:
        log = work / "out.log"
        code = run([sys.executable, "-m", "wl_probe", "leave"], check=False, timeout=600,
                   output_file=log, pid_file=work / "workload.pid").returncode
        lines = [json.loads(line) for line in log.read_text().splitlines()
                 if line.startswith("{")]
    left = lines[-1]["left"]
    assert code == 0 and left != lines[0]["pid"]
    assert process_gone(left, 60)

def test_a_forked_workload_is_what_a_fresh_python_m_would_be(warm) -> None:
    found, work = warm
    code, [me], text, started = _run(found, work, "3", f"{work}/001__cell/001__p__run/x",
                                     WX="yes")
    assert code == 3  # its exit code is the workload's
    argv = [sys.executable, "-m", "wl_probe", "3", f"{work}/001__cell/001__p__run/x"]
    assert me["cmdline"] == argv  # what the process exporter and cleanup read
    assert me["argv"] == argv[3:] and me["cwd"] == str(work) and me["wx"] == "yes"
    assert me["name"] == "__main__" and me["file"] == str(work / "wl_probe.py")
    assert me["pgid"] == me["pid"] == started[0]  # its own session: cleanup stops the group
    assert me["ppid"] == found.pid
    assert me["ours_ahead"] == []  # Telltale's own code is imported afresh, as edited
    assert "a line on stderr" in text  # stdout and stderr in the log
    # a fresh interpreter's random state, not the warm Python's copied into every child
    _, [again], _, _ = _run(found, work, "0")
    assert (again["random"], again["numpy"]) != (me["random"], me["numpy"])
    # a workload that edits its source runs as edited (never imported ahead)
    (work / "wl_probe.py").write_text("import sys\nsys.exit(7)\n")
    assert _run(found, work, "0")[0] == 7


def test_a_deadline_kills_the_workload_group(warm) -> None:
    found, work = warm
    os.mkfifo(work / "never")
    started: list[int] = []
    with pytest.raises(TimeoutError):
        run_warm(found, [sys.executable, "-m", "wl_probe", "wait", str(work / "never")],
                 env=dict(os.environ), output_file=work / "out.log", timeout=1,
                 on_start=started.append)
    assert process_gone(started[0])
    assert pid_alive(found.pid)  # the warm Python serves the next run


def test_a_requester_that_dies_takes_its_workload_with_it(warm) -> None:
    """A run SIGKILLed mid-cell: its connection closes, the warm Python sends SIGTERM to the
    workload's group, as a fresh process's parent-death signal did."""
    found, work = warm
    os.mkfifo(work / "never")
    script = (f"import sys, os\nsys.path.insert(0, {str(Path.cwd())!r})\n"
              "from pathlib import Path\nfrom core.warm_python import WarmPython\n"
              "from core.warm_child import run_warm\n"
              f"w = WarmPython(pid={found.pid}, key={found.key!r}, "
              f"directory=Path({str(found.directory)!r}))\n"
              "run_warm(w, [sys.executable, '-m', 'wl_probe', 'wait', 'never'], "
              "env=dict(os.environ), output_file=Path('out.log'), timeout=None, "
              "on_start=lambda pid: Path('child.pid').write_text(str(pid)))\n")
    requester = subprocess.Popen([sys.executable, "-c", script], cwd=work)
    try:
        wait_until(lambda: (work / "child.pid").exists() and
                   (work / "child.pid").read_text().isdigit(), "the workload started")
        child = int((work / "child.pid").read_text())
        assert pid_alive(child)
        requester.kill()
        requester.wait()
        assert process_gone(child)
    finally:
        requester.kill()
        requester.wait()


def test_a_warm_python_that_dies_takes_its_children(warm) -> None:
    found, work = warm
    os.mkfifo(work / "never")
    started: list[int] = []

    def kill_it(pid: int) -> None:
        started.append(pid)
        os.kill(found.pid, signal.SIGKILL)

    with pytest.raises(WarmPythonGone):
        run_warm(found, [sys.executable, "-m", "wl_probe", "wait", str(work / "never")],
                 env=dict(os.environ), output_file=work / "out.log", timeout=None,
                 on_start=kill_it)
    assert process_gone(started[0])


def test_a_stopping_warm_python_takes_no_order_and_nothing_runs(warm) -> None:
    """SIGTERM: it ends once its children are done and refuses new orders meanwhile — an
    `OSError` the local platform answers with a fresh process."""
    found, work = warm
    os.mkfifo(work / "never")
    started: list[int] = []
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(run_warm(found, [
        sys.executable, "-m", "wl_probe", "wait", str(work / "never")], env=dict(os.environ),
        output_file=work / "busy.log", timeout=None, on_start=started.append)), daemon=True)
    running.start()
    wait_until(lambda: bool(started), "the first workload started")
    os.kill(found.pid, signal.SIGTERM)
    wait_until(lambda: not (found.directory / "warm.json").exists() or _refuses(found, work),
               "the warm Python refusing orders")
    with pytest.raises(OSError):
        run_warm(found, [sys.executable, "-m", "wl_probe", "0"], env=dict(os.environ),
                 output_file=work / "out.log", timeout=600)
    assert pid_alive(started[0])  # the running child is left to end
    os.kill(started[0], signal.SIGKILL)
    running.join()
    assert codes == [-signal.SIGKILL]  # its exit status still reaches its run
    assert process_gone(found.pid)  # then it ends


def _never_fresh() -> int:
    raise AssertionError("a fresh process was started")


def test_fork_or_fresh_names_each_launch_and_never_runs_a_workload_twice(warm) -> None:
    """`tasks.warm_launch.fork_or_fresh`, what a cell and a fan-out user launch through:
    forked (its pid in the launch); the warm Python gone under it (exit 1, why in its log,
    not run again); a deadline (raised, not run again); not reached (a fresh process)."""
    found, work = warm
    argv = [sys.executable, "-m", "wl_probe", "5"]
    log = work / "out.log"
    assert fork_or_fresh(found, argv, _never_fresh, env=dict(os.environ),
                         output_file=log) == (5, f"{FORKED} {found.pid}")
    assert fork_or_fresh(None, argv, lambda: 9, env={}, output_file=log) == (9, FRESH)
    os.mkfifo(work / "never")
    waiting = [sys.executable, "-m", "wl_probe", "wait", str(work / "never")]
    started: list[int] = []
    with pytest.raises(TimeoutError):
        fork_or_fresh(found, waiting, _never_fresh, env=dict(os.environ), output_file=log,
                      timeout=1, on_start=started.append)
    assert process_gone(started[0])

    def kill_it(pid: int) -> None:
        started.append(pid)
        os.kill(found.pid, signal.SIGKILL)

    assert fork_or_fresh(found, waiting, _never_fresh, env=dict(os.environ), output_file=log,
                         on_start=kill_it) == (1, f"{FORKED} {found.pid}, which died")
    assert process_gone(started[-1])
    assert str(found.pid) in log.read_text().splitlines()[-1]  # the log says why it ended
    # the warm Python is gone now: not reached, nothing started, a fresh process runs it
    assert fork_or_fresh(found, argv, lambda: 0, env=dict(os.environ),
                         output_file=log) == (0, FRESH)


@pytest.mark.parametrize("argv", [["/bin/sh", "-c", "echo no"], ["/usr/bin/python3", "-m",
                                                                 "wl_probe", "0"]])
def test_an_order_for_another_command_is_refused_and_nothing_runs(warm, argv) -> None:
    """Only ``THIS_PYTHON -m MODULE``: another program, or another interpreter than the warm
    one (its imports are not that one's), is refused — an `OSError`, a fresh process."""
    found, work = warm
    if os.path.abspath(argv[0]) == os.path.abspath(sys.executable):
        pytest.skip("this interpreter is the system's python3")
    with pytest.raises(OSError):
        run_warm(found, argv, env=dict(os.environ), output_file=work / "out.log", timeout=600)
    assert not (work / "out.log").exists()
    assert pid_alive(found.pid)


def _refuses(found: WarmPython, work: Path) -> bool:
    try:
        code = run_warm(found, [sys.executable, "-m", "wl_probe", "0"], env=dict(os.environ),
                        output_file=work / "probe.log", timeout=600)
    except OSError:
        return True
    assert code == 0
    return False


def test_only_a_request_with_its_key_finds_it(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "warm"
    env = dict(os.environ)
    key = warm_key(sys.executable, ["json"], tmp_path, env)
    assert acquire(key, base=base) is None  # none started: no wait
    assert not offer(key, sys.executable, ["json"], tmp_path, env, minutes=0, base=base)
    assert offer(key, sys.executable, ["json"], tmp_path, env, minutes=5, base=base)
    # only this user reaches its socket, or lists the keys (digests of its environment)
    assert (base.stat().st_mode & 0o777, (base / key).stat().st_mode & 0o777) == (0o700, 0o700)
    try:
        assert not offer(key, sys.executable, ["json"], tmp_path, env, minutes=5, base=base)
        found = acquire(key, base=base)  # waits while it imports
        assert found is not None
        assert acquire(warm_key(sys.executable, ["json", "csv"], tmp_path, env),
                       base=base) is None
    finally:
        stop_warm_pythons(base)
    assert process_gone(found.pid)


def test_unused_it_stops_and_leaves_no_record(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle for its minutes (here 0.6 s), it ends and removes its record and socket: never a
    wall-clock margin — the test waits for it to be gone, whenever that is."""
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "warm"
    env = dict(os.environ)
    key = warm_key(sys.executable, ["json"], tmp_path, env)
    assert offer(key, sys.executable, ["json"], tmp_path, env, minutes=0.01, base=base)
    pid = int((base / key / "pid").read_text())
    assert process_gone(pid)
    assert not [p.name for p in (base / key).iterdir() if p.name in ("warm.json", "sock", "pid")]
    assert acquire(key, base=base) is None


_NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(name=_NAME, value=st.text(st.characters(codec="utf-8", exclude_characters="\0"),
                                 max_size=8))
def test_the_key_holds_every_variable_an_import_may_read(name: str, value: str) -> None:
    """Any variable but Telltale's, Prefect's, pytest's, AWS's (read when a client is made,
    in the child) and the shell's bookkeeping changes the key (an import may read it:
    OMP_NUM_THREADS, HF_HOME, LD_PRELOAD...)."""
    env = {"HOME": "/home/x", "PATH": "/usr/bin"}
    key = warm_key(sys.executable, ["json"], "/tmp", env)
    changed = warm_key(sys.executable, ["json"], "/tmp", {**env, name: value + "!"})
    ignored = name.startswith(("TELLTALE_", "PREFECT_", "PYTEST_", "COV_CORE_", "AWS_")) or name in {
        "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "PYTHONUNBUFFERED"}
    assert (changed == key) == ignored
    assert warm_key(sys.executable, ["json"], "/tmp", {**env, f"TELLTALE_{name}": value}) == key
    assert warm_key(sys.executable, ["json"], "/tmp", {**env, f"AWS_{name}": value}) == key
    assert warm_key(sys.executable, ["json"], "/srv", env) != key
    assert warm_key(sys.executable, ["json", "csv"], "/tmp", env) != key


@given(argv=st.lists(st.text(max_size=10), max_size=6))
def test_only_a_python_m_command_line_is_a_workload_module(argv: list[str]) -> None:
    found = workload_module(argv)
    if found is None:
        assert len(argv) < 3 or argv[1] != "-m" or not Path(argv[0]).name.startswith("python")
    else:
        assert found == (argv[2], argv[3:])


def test_a_reinstalled_package_is_another_key(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm Python keeps the package it imported: after a reinstall (its files written
    again), the key changes and a new warm Python imports the new one. Found without
    importing the package."""
    package = tmp_path / "site" / "heavy_pkg_for_key"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    env = {"HOME": "/home/x"}
    modules = ["heavy_pkg_for_key", "heavy_pkg_for_key.sub"]
    key = warm_key(sys.executable, modules, "/tmp", env)
    assert warm_key(sys.executable, modules, "/tmp", env) == key
    stamp = (package / "__init__.py").stat().st_mtime_ns
    os.utime(package / "__init__.py", ns=(stamp + 10**9, stamp + 10**9))  # a reinstall
    assert warm_key(sys.executable, modules, "/tmp", env) != key
    assert "heavy_pkg_for_key" not in sys.modules


def _venv_of(root: Path) -> Path:
    """A venv-like interpreter: ``root/bin/python`` linked to this one's binary."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.symlink_to(os.path.realpath(sys.executable))
    return python


def test_two_venvs_of_one_python_are_two_interpreters(tmp_path: Path) -> None:
    """Every venv's ``bin/python`` links to the same base Python, but each imports its own
    packages: the key tells them apart, and an installed package is stamped where that
    venv has it (the serving venv's GuideLLM, asked from the run's venv)."""
    env = {"HOME": "/home/x"}
    one, two = _venv_of(tmp_path / "one"), _venv_of(tmp_path / "two")
    assert os.path.realpath(one) == os.path.realpath(two)
    assert warm_key(str(one), ["pkg_in_venv"], "/tmp", env) != \
        warm_key(str(two), ["pkg_in_venv"], "/tmp", env)
    site = tmp_path / "one" / "lib" / "python3.11" / "site-packages" / "pkg_in_venv"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    stamps = installed_stamps(["pkg_in_venv", "pkg_in_venv.sub"], str(one))
    assert stamps == [("pkg_in_venv", str(site / "__init__.py"),
                       (site / "__init__.py").stat().st_mtime_ns)]
    assert installed_stamps(["pkg_in_venv"], str(two)) == [("pkg_in_venv", None, None)]
    key = warm_key(str(one), ["pkg_in_venv"], "/tmp", env)
    stamp = (site / "__init__.py").stat().st_mtime_ns
    os.utime(site / "__init__.py", ns=(stamp + 10**9, stamp + 10**9))  # a reinstall there
    assert warm_key(str(one), ["pkg_in_venv"], "/tmp", env) != key
    assert "pkg_in_venv" not in sys.modules


def test_an_order_for_another_venvs_python_is_refused(warm, tmp_path: Path) -> None:
    """A venv's ``python`` is the same binary as the warm one's, but not its imports."""
    found, work = warm
    other = _venv_of(tmp_path / "other")
    with pytest.raises(OSError):
        run_warm(found, [str(other), "-m", "wl_probe", "0"], env=dict(os.environ),
                 output_file=work / "out.log", timeout=600)
    assert not (work / "out.log").exists()


_LAZY = """
import sys, types
from core.warm_python import _forget_our_modules
asked = []
class Lazy(types.ModuleType):
    def __getattr__(self, name):  # what transformers' lazy modules do: import on a miss
        asked.append(name)
        raise ImportError(f"importing {name} needs a package that is not installed")
sys.modules["lazy_third_party"] = Lazy("lazy_third_party")
import tasks.process
_forget_our_modules()
print(asked, "tasks.process" in sys.modules, "lazy_third_party" in sys.modules)
"""


def test_dropping_our_modules_never_wakes_a_lazy_module() -> None:
    """The forked child drops Telltale's modules before the workload's run; reading a lazy
    module's attributes would import what it stands for (transformers' models import
    torchvision, which the serving venv lacks: every forked load step failed)."""
    done = subprocess.run([sys.executable, "-c", _LAZY], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "False", "True"]


# A requester: sends the order for argv[2:] to the warm Python in argv[1], then...
_ORDER = """
import os, socket, sys
from core.warm_python import Order
os.chdir(sys.argv[1])  # the warm Python's dir: its socket by a short relative path
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect("sock")
conn.sendall(Order(argv=sys.argv[2:], env=dict(os.environ), cwd=os.environ["WORK"],
                   output_file=os.environ["WORK"] + "/out.log").model_dump_json().encode()
             + b"\\n")
"""
# ...is gone at once: before the answer, maybe before the child's own setup
_ORDER_AND_GO = _ORDER + "os._exit(0)\n"
# ...prints the answer ({"pid": N}), and holds the connection until its stdin is closed
_ORDER_AND_HOLD = _ORDER + """
print(conn.makefile("rb").readline().decode().strip(), flush=True)
sys.stdin.read()
"""


def _running_with(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_a_workload_exit_and_its_requester_gone_in_one_wake_up_keep_the_warm_python(
        warm) -> None:
    """The warm Python sees a child's exit and its requester's hang-up in one ``select``
    batch (both happened while it was not scheduled: a loaded machine). Handling the exit
    closes the connection; the hang-up event left in the batch is stale and must be
    skipped — unregistering the closed socket raised, and the warm Python died of it (its
    socket gone: seen in the suite, the next requester's connect failed)."""
    found, work = warm
    os.mkfifo(work / "gate")
    requester = subprocess.Popen(
        [sys.executable, "-c", _ORDER_AND_HOLD, str(found.directory), sys.executable, "-m",
         "wl_probe", "wait", "gate"], cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "WORK": str(work),
                        "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        answer = json.loads(requester.stdout.readline())  # type: ignore[union-attr]
        workload = int(answer["pid"])
        wait_until(lambda: (work / "out.log").is_file()
                   and '"argv"' in (work / "out.log").read_text(), "the workload running")
        os.kill(found.pid, signal.SIGSTOP)  # both events now wait for one wake-up
        try:
            with open(work / "gate", "w"):  # the workload's read ends: it exits 0
                pass
            assert process_gone(workload)  # a zombie: its parent is stopped
            requester.stdin.close()  # type: ignore[union-attr]
            requester.wait(timeout=600)
        finally:
            os.kill(found.pid, signal.SIGCONT)
        code, _lines, _text, _started = _run(found, work, "0")
        assert code == 0 and pid_alive(found.pid)
        assert "Traceback" not in (found.directory / "warm-python.log").read_text()
    finally:
        if requester.poll() is None:
            requester.kill()
            requester.wait()


def test_a_requester_gone_before_its_workload_is_set_up_still_takes_it(warm) -> None:
    """The requester may die while the forked child is still becoming the workload (before
    its own session exists, before its SIGTERM disposition is a fresh interpreter's): the
    warm Python's SIGTERM must still end it. Each order here is sent by a process that exits
    at once; under load the warm Python saw it gone before the child's `setsid`, signalled
    a group that did not exist yet, and the workload ran on (seen once in CI)."""
    found, work = warm
    os.mkfifo(work / "never")
    tokens = [f"requester-gone-{os.getpid()}-{i}" for i in range(12)]
    for token in tokens:
        done = subprocess.run(
            [sys.executable, "-c", _ORDER_AND_GO, str(found.directory), sys.executable, "-m",
             "wl_probe", "wait", "never", token], cwd=work, timeout=600, check=False,
            env={**os.environ, "WORK": str(work),
                 "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert done.returncode == 0
    for token in tokens:
        wait_until(lambda token=token: not _running_with(token), f"the workload {token} ended")
    assert pid_alive(found.pid)
