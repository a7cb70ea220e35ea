"""A command ends as ``sys.exit`` ends it, less the interpreter's teardown (`core.exit`).

And no code goes around it: ``os._exit`` is called in `core.exit` alone (and where a forked
child must not run its parent's handlers), and every command entry point of ``analysis`` and
``flows`` ends through `exit_now` once its ``main`` returned.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("analysis", "blocks", "core", "deployments", "flows", "projects", "tasks")

# Where ``os._exit`` is right, and why: a forked child that must not run its parent's
# ``atexit`` handlers, or a standard-library-only file that cannot import `core`.
OWN_EXIT = {
    "core/exit.py": "the mechanism itself",
    "tasks/platforms/fanout.py": "a forked user's child: its parent's handlers are not its own",
    "core/forked.py": "work forked beside its caller: its parent's handlers are not its own",
    "projects/llm_serving/workload/load.py": "GuideLLM forked in the load script's child; the "
                                             "script is standard library only (a cluster's "
                                             "load Pod runs the file alone)",
}
# Long-lived servers keep Python's own exit: they end once, not once a run. A scaffolded
# workload is a standard-library script (any container runs it), not a Telltale command.
NOT_COMMANDS = {"flows/local_api.py", "flows/serve.py", "flows/scaffold/workload.py.tmpl"}

SCRIPT = """\
import atexit, logging, sys, threading
from core.exit import exit_now

class Teardown:
    def __del__(self):
        print('teardown ran', end='')

KEPT = Teardown()  # alive at exit: only the interpreter's teardown would delete it
atexit.register(lambda: print('handler ran', end=''))
logging.basicConfig(stream=sys.stderr)
logging.getLogger('t').warning('logged')

def late():
    sum(range(2_000_000))  # still working when the main thread exits
    sys.stderr.write('thread done')

threading.Thread(target=late).start()
print('summary line', end='')  # stdout is a pipe: block-buffered, still in the buffer
sys.stderr.write('on stderr')
exit_now({code})
print('never')
"""


@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (None, 0)])
def test_exit_now_joins_threads_runs_handlers_and_flushes_but_tears_nothing_down(
        code: int | None, status: int) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(code=code)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout == "summary linehandler ran"  # handlers after the flushless print;
    # no "teardown ran": the object's __del__ is what finalization would have done
    assert "logged" in done.stderr and "on stderr" in done.stderr
    assert "thread done" in done.stderr  # a non-daemon thread finished before the end


def test_a_broken_stdout_is_no_error_at_exit() -> None:
    """`| head` went away: the flush fails quietly, the status stays the command's."""
    script = ("import os, sys\nfrom core.exit import exit_now\n"
              "print('x' * 10)\nos.close(1)\nexit_now(4)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 4 and "Traceback" not in done.stderr, done.stderr


def _sources() -> list[tuple[str, str]]:
    found = []
    for top in PRODUCT:
        for path in sorted((REPO / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found.append((path.relative_to(REPO).as_posix(), path.read_text()))
    for path in sorted((REPO / "flows" / "scaffold").glob("*.py.tmpl")):
        found.append((path.relative_to(REPO).as_posix(), path.read_text()))
    return found


def _calls(tree: ast.AST, owner: str, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and isinstance(node.func.value, ast.Name) and node.func.value.id == owner]


def _tree(source: str) -> ast.Module:
    return ast.parse(source.replace("__NAME__", "name"))


def test_no_code_ends_a_process_around_exit_now() -> None:
    bypass = [path for path, source in _sources()
              if _calls(_tree(source), "os", "_exit") and path not in OWN_EXIT]
    assert not bypass, f"os._exit outside core.exit (use exit_now, or list why): {bypass}"
    assert all(_calls(_tree(source), "os", "_exit") for path, source in _sources()
               if path in OWN_EXIT), "an exception listed that no longer needs to be"


def _main_block(tree: ast.Module) -> ast.If | None:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__":
            return node
    return None


def test_every_command_of_analysis_and_flows_ends_through_exit_now() -> None:
    """A command's last seconds were its interpreter's teardown: 1.1 s after a flow run."""
    commands, slow = [], []
    for path, source in _sources():
        if not path.startswith(("analysis/", "flows/")) or path in NOT_COMMANDS:
            continue
        block = _main_block(_tree(source))
        if block is None:
            continue
        commands.append(path)
        names = {node.func.id for node in ast.walk(block) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Name)}
        if "exit_now" not in names or _calls(block, "sys", "exit"):
            slow.append(path)
    assert "flows/fine_tuning/__main__.py" in commands and "analysis/__main__.py" in commands
    assert "flows/scaffold/main.py.tmpl" in commands  # a new project's command too
    assert not slow, f"commands that end with Python's teardown (use core.exit): {slow}"
