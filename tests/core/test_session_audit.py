"""Every process started in a session of its own has that session emptied when it ends.

A child started with ``start_new_session=True`` (or a forked child that calls
``os.setsid``) leads a process group its starter alone knows by the leader's pid. What the
leader started and left (GuideLLM's spawned workers, a torch data-loader worker, a resource
tracker: session 47) outlived it by minutes, and a process exporter then counted one of them
as a workload in every later window on the machine. `core.pids.kill_leftovers` is the one
mechanism that empties a reaped leader's session (`core.pids.stop_session` ends a leader
and then calls it); this audit (AST, not grep) fails on a
module that makes a session and never calls it, unless the module is listed below as one
whose process is detached on purpose and ends its own children itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.code_tree import python_files

# module -> why the sessions it starts are not emptied by it
DETACHED = {
    "core/warm_python.py": "the warm Python itself outlives its starter (its children are "
                           "forked workloads, each emptied by core.warm_child.run_warm)",
    "flows/local_api.py": "the shared local Prefect API outlives the run that started it "
                          "and stops itself once idle",
    "tasks/observe/spare.py": "a spare Prometheus's keeper outlives its run; it stops its "
                              "exporters and Prometheus as ManagedProcesses",
}


def _makes_a_session(tree: ast.AST) -> list[int]:
    """Lines that start a process in a new session, or make this one a session leader."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if any(k.arg == "start_new_session" and not (isinstance(k.value, ast.Constant)
                                                     and k.value.value is False)
               for k in node.keywords):
            lines.append(node.lineno)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("setsid", "setpgrp", "setpgid"):
            lines.append(node.lineno)
    return lines


# the mechanism: `kill_leftovers` once the leader is reaped, or `stop_session`, which ends
# the leader and then calls it
_EMPTIERS = {"kill_leftovers", "stop_session"}


def _empties_sessions(tree: ast.AST) -> bool:
    return any((isinstance(node, ast.Name) and node.id in _EMPTIERS)
               or (isinstance(node, ast.Attribute) and node.attr in _EMPTIERS)
               for node in ast.walk(tree))


def sessions_never_emptied() -> dict[str, list[int]]:
    """Modules that make a session without calling `kill_leftovers`, and where."""
    found = {}
    for rel, path in python_files(skip_scaffold=True):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        lines = _makes_a_session(tree)
        if lines and not _empties_sessions(tree) and rel not in DETACHED:
            found[rel] = lines
    return found


def test_every_session_a_module_starts_is_emptied_when_its_leader_ends() -> None:
    assert sessions_never_emptied() == {}, (
        "these start a process in a session of its own and never empty it: call "
        "core.pids.kill_leftovers(pid) once the leader is reaped, or list the module in "
        "DETACHED with the reason its process outlives its starter")


def test_the_audit_sees_each_way_of_making_a_session(tmp_path: Path) -> None:
    """What the audit looks for, each form once (it fails without the cleanup)."""
    for source in ("subprocess.Popen(argv, start_new_session=True)\n",
                   "subprocess.Popen(argv, start_new_session=detach)\n",
                   "os.setsid()\n", "os.setpgrp()\n"):
        tree = ast.parse(source)
        assert _makes_a_session(tree) == [1] and not _empties_sessions(tree), source
    assert _makes_a_session(ast.parse("subprocess.Popen(argv, start_new_session=False)")) == []
    cleaned = ast.parse("p = subprocess.Popen(a, start_new_session=True)\np.wait()\n"
                        "pids.kill_leftovers(p.pid)\n")
    assert _empties_sessions(cleaned)
    assert _empties_sessions(ast.parse("stop_session(p, 10)\n"))


def test_every_detached_module_still_starts_a_session() -> None:
    """A stale exemption would let the next session in that module go unchecked."""
    sources = dict(python_files(skip_scaffold=True))
    for rel in DETACHED:
        assert _makes_a_session(ast.parse(sources[rel].read_text(encoding="utf-8"))), rel
