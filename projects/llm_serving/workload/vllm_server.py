"""vLLM's OpenAI server on this machine, its engine core forked from a preloaded fork server.

    python -m projects.llm_serving.workload.vllm_server [vLLM's server arguments]

Run by the serving venv's Python (the local platform's `LocalService`; a cluster runs vLLM's
own image and never this). Standard library, vLLM and `core.cmdline` (standard library) only.
The server and its children use a temporary dir of their own, removed when it exits
(`private_temporary_dir`: vLLM's sockets and stores left 8 files in /tmp a run).

Why: vLLM's CPU platform starts three processes one after the other — the API server, the
engine core it starts, the worker the engine core starts — with the ``spawn`` method, so each
imports torch and vLLM afresh (10-18 s each on 2 cores; ~45 s to ``/health``). Here a fork
server is started first thing, and imports the engine core's modules on the other core while
the API server imports its own; the engine core is then forked from it at once. ~10 s less to
``/health`` (docs/performance.md).

What stays as vLLM does it, on purpose:
- **The worker is spawned**, as before: it runs the model, and its OpenMP thread binding is
  environment variables (``OMP_NUM_THREADS``, ``GOMP_CPU_AFFINITY``) that libgomp reads when
  it loads — a worker forked from a process that had loaded torch would run unbound (measured:
  two torch threads instead of one, on the core reserved for the engine core).
- **The environment**: a child of a fork server gets the fork server's environment, not its
  parent's; the engine core here gets the API server's environment as it is when the engine
  core starts (what ``spawn`` gives: vLLM's CPU platform sets variables there that the worker
  needs, ``LD_PRELOAD`` among them).
- **The three processes, their roles, arguments, process titles and the multiprocessing
  executor.**

Forked from a warm Python (`tasks.platforms.service_launch`: a later run's server, the
modules of `SERVER_PRELOAD` imported ahead), this process has the engine core's modules
already: the engine core is then forked from it directly (the start method vLLM itself uses
for its engine core on a GPU), and no fork server is started. The worker is still spawned.
vLLM titles its processes with ``setproctitle``, which cannot find the command line of a
process forked from a warm Python: there the title is written by `core.cmdline.set_title`
(``ps`` shows ``VLLM::EngineCore`` as after a fresh start).

Where this vLLM has no such hook point (another version), the server starts as vLLM starts
it, and the log says so.
"""

from __future__ import annotations

import atexit
import getpass
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import runpy
import shutil
import sys
import tempfile
from typing import Any

__all__ = ["ENGINE_CORE_MODULES", "SERVER_PRELOAD", "EnvCarryingProcess", "forkserver_context",
           "install_engine_core_hook", "main", "preloaded", "private_temporary_dir"]

_THIS = "projects.llm_serving.workload.vllm_server"
_API_SERVER = "vllm.entrypoints.openai.api_server"
ENGINE_CORE_MODULES = ("vllm.v1.engine.core",)
"""What the fork server imports before the first engine core is forked from it."""
SERVER_PRELOAD = (_API_SERVER, *ENGINE_CORE_MODULES)
"""What a warm Python imports ahead for this server (`LocalService.preload`)."""
_HOOKED_MODULE = "vllm.v1.engine.utils"  # launch_core_engines: where vLLM starts engine cores
_HOOK = "get_mp_context"
_NEEDS_SPAWN = frozenset({"--numa-bind"})  # vLLM forces spawn for it (executable hijacking)


class EnvCarryingProcess(multiprocessing.context.ForkServerProcess):
    """A fork-server process that runs with its parent's environment at ``start()``.

    A spawned child inherits its parent's environment when it starts; a fork server's child
    inherits the fork server's, frozen when that server started. This carries the parent's
    over, so the child is started as ``spawn`` would have started it in that respect.
    """

    _telltale_environ: dict[str, str]

    def start(self) -> None:
        """Start the process, with the environment this process has now."""
        self._telltale_environ = dict(os.environ)
        super().start()

    def run(self) -> None:
        """Take the parent's environment, then run the target."""
        # Only what differs is set or removed: clearing the whole environment moves it away
        # from the memory setproctitle takes over, and vLLM's process titles
        # ("VLLM::EngineCore") were then lost.
        wanted = self._telltale_environ
        for name in [name for name in os.environ if name not in wanted]:
            del os.environ[name]
        for name, value in wanted.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        tempfile.tempdir = None  # the parent's temporary dir (`private_temporary_dir`)
        super().run()


class _Context(multiprocessing.context.ForkServerContext):
    Process = EnvCarryingProcess  # type: ignore[assignment]


def forkserver_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context whose processes carry their parent's environment."""
    return _Context()


def preloaded() -> bool:
    """This process has the server's modules imported already (forked from a warm Python)."""
    return all(name in sys.modules for name in SERVER_PRELOAD)


def install_engine_core_hook(args: list[str] | None = None, *, fork: bool = False) -> str:
    """Make vLLM start its engine cores from the fork server; what was done, in words.

    Only the engine-core launch is hooked (``vllm.v1.engine.utils.get_mp_context``): the
    worker the engine core starts, and every other process, keep vLLM's own start method.
    vLLM's own function still runs first (its checks and environment settings). Server
    arguments that need vLLM's own start (``--numa-bind`` re-executes the process) leave it
    unhooked. ``fork``: the engine core is forked from this process instead (its modules
    are imported already: `preloaded`).
    """
    needs_spawn = [a for a in args or [] if a.split("=", 1)[0] in _NEEDS_SPAWN]
    if needs_spawn:
        return f"vLLM's own start ({needs_spawn[0].split('=', 1)[0]} needs it)"
    try:
        module = __import__(_HOOKED_MODULE, fromlist=[_HOOK])
    except ImportError as exc:
        return f"vLLM's own start (no {_HOOKED_MODULE}: {exc})"
    original = getattr(module, _HOOK, None)
    if not callable(original):
        return f"vLLM's own start (no {_HOOKED_MODULE}.{_HOOK} in this vLLM)"
    # a forked child has the environment of this process when it starts, as spawn's has
    context = multiprocessing.get_context("fork") if fork else forkserver_context()

    def get_mp_context() -> Any:
        original()  # vLLM's checks and the environment it sets for its children
        return context

    setattr(module, _HOOK, get_mp_context)
    if fork:
        return "forked from the API server, whose modules a warm Python imported ahead"
    return "forked from a fork server with " + ", ".join(ENGINE_CORE_MODULES) + " imported"


def _title_in_place() -> None:
    """Make vLLM's process titles work in a process forked from a warm Python (see above)."""
    try:
        import setproctitle
    except ImportError:  # vLLM then titles nothing either
        return
    from core.cmdline import set_title

    setproctitle.setproctitle = set_title


_SOCKET_PATH_MAX = 107  # sun_path's 108 bytes, less the terminating NUL
_PRIVATE_PATH_SPACE = 1 + 30 + 1 + 44  # "/telltale-vllm-PID-XXXXXXXX", then the longest name
# below it: multiprocessing's fork server socket "pymp-XXXXXXXX/listener-XXXXXXXX" (32) or
# vLLM's "<uuid4>" (36), with room to spare
_PRIVATE_PREFIX = "telltale-vllm-"


def _sweep(base: str) -> None:
    """Remove the private dirs of servers that are gone without removing theirs.

    A server killed outright (SIGKILL after its grace) runs no exit handler: its dir is
    left, and the next server's start takes it away. The dir's name holds its server's pid;
    one whose process still runs, or that another user owns, stays.
    """
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(_PRIVATE_PREFIX):
            continue
        pid = name[len(_PRIVATE_PREFIX):].split("-", 1)[0]
        path = os.path.join(base, name)
        try:
            if not pid.isdigit() or os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)  # alive (or another user's process): kept
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def private_temporary_dir() -> str:
    """Give this server and its children a temporary dir of their own, removed at exit.

    vLLM leaves files in the temporary dir at every start: a ZMQ socket a process pair
    (``VLLM_RPC_BASE_PATH``, default the temporary dir) and the ``vllm_dist_*`` store of
    torch.distributed's init — 8 under /tmp a light run, for good. Here they go under one
    dir (``TMPDIR``, which the fork server, the engine core and the spawned worker all
    read) that goes when the server exits. Torch's compile cache, which is also under the
    temporary dir by default, keeps its place (``TORCHINDUCTOR_CACHE_DIR``): it serves
    the next start. A dir a killed server left is removed by the next start (`_sweep`). A
    temporary dir whose path leaves no room for a socket's name one dir deeper is used as
    it is. Returns the dir.
    """
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + _PRIVATE_PATH_SPACE > _SOCKET_PATH_MAX:
        return base  # sockets under one more dir would not fit a Unix socket's path
    _sweep(base)
    try:
        private = tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-", dir=base)
    except OSError:  # an unwritable temporary dir: vLLM fails there as it would have
        return base
    try:  # torch's own default, named before the temporary dir changes
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                              os.path.join(base, f"torchinductor_{getpass.getuser()}"))
    except (KeyError, OSError):  # no user name (an arbitrary container uid): torch's choice
        pass
    os.environ["TMPDIR"] = private
    tempfile.tempdir = private
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    return private


def main(argv: list[str] | None = None) -> None:
    """Start the fork server (unless `preloaded`), then run vLLM's OpenAI server."""
    args = sys.argv[1:] if argv is None else argv
    private = private_temporary_dir()  # first: every process below takes it
    print(f"telltale: temporary files under {private}, removed at exit", file=sys.stderr,
          flush=True)
    warm = preloaded()
    if not warm:
        # The fork server imports the engine core's modules now, beside the API server's
        # imports below; it imports this module too (the process class is unpickled by its
        # name).
        multiprocessing.set_forkserver_preload([_THIS, *ENGINE_CORE_MODULES])
        multiprocessing.forkserver.ensure_running()
        __import__(_API_SERVER)
    how = install_engine_core_hook(args, fork=warm)
    if warm:
        _title_in_place()
    print(f"telltale: the engine core is {how}", file=sys.stderr, flush=True)
    sys.argv = [_API_SERVER, *args]
    runpy.run_module(_API_SERVER, run_name="__main__", alter_sys=False)


if __name__ == "__main__":
    # Run by its import name, not as __main__: a process object pickled for the fork server
    # names its class by module, and the fork server's __main__ is not this file.
    __import__(_THIS, fromlist=["main"]).main()
