"""The vLLM server's launcher (projects/llm_serving/workload/vllm_server.py): its engine core
forked from a preloaded fork server, with the environment ``spawn`` would have given it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from projects.llm_serving import install
from projects.llm_serving.workload import vllm_server
from tests.factories import serving_venv_or_skip

REPO = Path(__file__).resolve().parents[2]

# The parent sets a variable after its fork server started: a fork server's child would see
# the fork server's value, a spawned child (and EnvCarryingProcess) the parent's.
_PROBE = """
import multiprocessing, multiprocessing.forkserver, os, sys
from projects.llm_serving.workload import vllm_server
from tests.projects import env_probe
os.environ["TT_PROBE"] = "when the fork server started"
multiprocessing.set_forkserver_preload(["tests.projects.env_probe"])
multiprocessing.forkserver.ensure_running()
os.environ["TT_PROBE"] = "when the child started"
os.environ.pop("TT_GONE", None)
plain = multiprocessing.get_context("forkserver").Process
carrying = vllm_server.forkserver_context().Process
for name, cls in (("plain", plain), ("carrying", carrying)):
    for var in ("TT_PROBE", "TT_GONE"):
        child = cls(target=env_probe.write_env, args=(f"{sys.argv[1]}/{name}.{var}", var))
        child.start()
        child.join()
        assert child.exitcode == 0, (name, child.exitcode)
"""


def test_a_child_of_the_fork_server_runs_with_its_parents_environment_as_spawned(
        tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TT_GONE": "set before the fork server"}
    done = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = {p.name: p.read_text() for p in tmp_path.iterdir()}
    # the stdlib's fork server child: the fork server's environment (what the class fixes)
    assert seen["plain.TT_PROBE"] == "when the fork server started"
    assert seen["plain.TT_GONE"] == "set before the fork server"
    # the launcher's: the parent's as it was at start(), a variable removed since included
    assert seen["carrying.TT_PROBE"] == "when the child started"
    assert seen["carrying.TT_GONE"] == "-"


# What vLLM's processes do with the temporary dir: the engine core (a fork server's child)
# and the worker (spawned) each ask for it, and files are left in it.
_PRIVATE = """
import multiprocessing, multiprocessing.forkserver, os, subprocess, sys, tempfile
from projects.llm_serving.workload import vllm_server
from tests.projects import env_probe
private = vllm_server.private_temporary_dir()
print(private)
print(os.environ["TORCHINDUCTOR_CACHE_DIR"])
multiprocessing.set_forkserver_preload(["tests.projects.env_probe"])
multiprocessing.forkserver.ensure_running()
child = vllm_server.forkserver_context().Process(
    target=env_probe.write_tempdir, args=(os.path.join(sys.argv[1], "engine-core"),))
child.start()
child.join()
print(subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                     capture_output=True, text=True, check=True).stdout.strip())
for name in ("vllm_dist_0123", "9ee75a1b-210a-457e-a67e-df73d5b7d7a4"):
    open(os.path.join(tempfile.gettempdir(), name), "w").close()
"""


def test_the_server_s_temporary_files_go_with_it(tmp_path: Path) -> None:
    """vLLM left 8 files in /tmp a light run (ZMQ sockets, the distributed init's store):
    the server and every process it starts use a dir of their own, removed at its exit;
    torch's compile cache keeps its place under the temporary dir."""
    import getpass
    import shutil
    import tempfile

    # a short temporary dir, as /tmp is: sockets are made two dirs below it
    base, seen = Path(tempfile.mkdtemp(prefix="tt-")), tmp_path / "seen"
    seen.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(base)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    try:
        done = subprocess.run([sys.executable, "-c", _PRIVATE, str(seen)], env=env,
                              capture_output=True, text=True, timeout=300)
        left = list(base.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    private, compiled, spawned = done.stdout.split()
    assert Path(private).parent == base and Path(private).name.startswith("telltale-vllm-")
    assert compiled == str(base / f"torchinductor_{getpass.getuser()}")
    assert (seen / "engine-core").read_text() == private  # a fork server's child
    assert spawned == private  # a spawned process (vLLM's worker)
    assert left == []  # its files went with it


def test_a_dir_a_killed_server_left_goes_at_the_next_start() -> None:
    """SIGKILLed, a server runs no exit handler: the next server's start removes its dir,
    and only the dirs of servers that are gone."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="tt-"))
    dead = subprocess.Popen(["true"])  # its pid: no process holds it once it is reaped
    dead.wait()
    try:
        left = base / f"telltale-vllm-{dead.pid}-abc12345"
        alive = base / f"telltale-vllm-{os.getpid()}-def67890"  # this test's own process
        other = base / "telltale-vllm-notapid-x"
        for path in (left, alive, other):
            path.mkdir()
            (path / "9ee75a1b-210a-457e-a67e-df73d5b7d7a4").touch()
        subprocess.run([sys.executable, "-c", "from projects.llm_serving.workload import "
                        "vllm_server; vllm_server.private_temporary_dir()"],
                       env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(base)},
                       capture_output=True, text=True, timeout=120, check=True)
        assert sorted(p.name for p in base.iterdir()) == sorted([alive.name, other.name])
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_long_temporary_dir_is_used_as_it_is(tmp_path: Path) -> None:
    """One dir deeper, a socket's path would pass the 107 bytes a Unix socket may have."""
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    done = subprocess.run([sys.executable, "-c", "from projects.llm_serving.workload import "
                           "vllm_server; print(vllm_server.private_temporary_dir())"],
                          env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(deep)},
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == str(deep) and list(deep.iterdir()) == []


def test_without_vllm_the_hook_says_the_server_starts_as_vllm_starts_it() -> None:
    """Where vLLM (or its hook point) is missing, nothing is changed and the log says so."""
    if "vllm" in sys.modules:  # pragma: no cover - the dev venv has no vLLM
        return
    assert vllm_server.install_engine_core_hook().startswith("vLLM's own start (no vllm.")


def test_a_server_argument_that_needs_vllms_own_start_leaves_it_unhooked() -> None:
    for args in (["--model", "m", "--numa-bind"], ["--numa-bind=true"]):
        assert vllm_server.install_engine_core_hook(args) == \
            "vLLM's own start (--numa-bind needs it)"


_HOOK_CHECK = """
import multiprocessing, sys
import vllm.utils.system_utils as system_utils
import vllm.v1.engine.utils as engine_utils
import vllm.v1.executor.multiproc_executor as executor
from projects.llm_serving.workload import vllm_server
print(vllm_server.install_engine_core_hook())
context = engine_utils.get_mp_context()
print(type(context).__name__, context.get_start_method(), context.Process.__name__)
# the worker's start (the executor's) is vLLM's own, untouched
print(executor.get_mp_context is system_utils.get_mp_context)
# an engine core started this way keeps the title vLLM gives it (what ps shows)
from tests.projects import env_probe
child = context.Process(target=env_probe.write_vllm_title, args=(sys.argv[1],))
child.start()
child.join()
print(open(sys.argv[1]).read())
"""


def test_the_real_vllm_starts_its_engine_core_from_the_fork_server_and_nothing_else(
        tmp_path: Path) -> None:
    """Against the serving venv's vLLM (its pinned version): the hook point exists, the
    engine-core launch gets the fork server's context, the worker's launch is vLLM's own,
    and an engine core so started keeps vLLM's process title."""
    serving_venv_or_skip()
    python = install.venv_python(install.default_venv())
    done = subprocess.run([str(python), "-c", _HOOK_CHECK, str(tmp_path / "title")],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_NO_USAGE_STATS": "1",
                               "DO_NOT_TRACK": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()[-4:]
    assert lines == ["forked from a fork server with vllm.v1.engine.core imported",
                     "_Context forkserver EnvCarryingProcess", "True",
                     "VLLM::EngineCor"], done.stdout[-2000:]  # comm: 15 characters


def test_a_server_forked_from_its_warm_python_forks_its_engine_core_which_keeps_its_title(
        tmp_path: Path) -> None:
    """Against the serving venv's vLLM, in a real warm Python of that venv: the engine core
    is forked from the server itself, and titled as after a fresh start (setproctitle alone
    cannot find a forked child's command line: it showed ``python``)."""
    serving_venv_or_skip()
    from core.warm_child import run_warm
    from core.warm_key import warm_key
    from core.warm_python import acquire, offer, stop_warm_pythons

    python = str(install.venv_python(install.default_venv()))
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    base = tmp_path / "warm"
    key = warm_key(python, vllm_server.SERVER_PRELOAD, REPO, env)
    assert offer(key, python, vllm_server.SERVER_PRELOAD, REPO, env, minutes=5, base=base)
    try:
        found = acquire(key, base=base, wait_s=600)
        assert found is not None, (base / key / "warm-python.log").read_text()[-3000:]
        log = tmp_path / "out.log"
        code = run_warm(found, [python, "-m", "tests.projects.forked_probe",
                                str(tmp_path / "title")],
                        env=env, output_file=log, timeout=600)
        lines = log.read_text().strip().splitlines()
        assert code == 0, lines[-30:]
        assert lines[-3:] == ["forked from the API server, whose modules a warm Python "
                              "imported ahead", "fork", "VLLM::EngineCore VLLM::EngineCor"]
    finally:
        stop_warm_pythons(base)
