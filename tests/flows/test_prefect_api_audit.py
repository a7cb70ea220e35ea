"""Every flow a command starts runs against the API `flows.api_server.prefect_api` gives it.

Without it Prefect starts its own temporary server in the command's process group, with a
20-s start-up limit: on a loaded machine the janitor and the replot ended in a traceback
("Timed out while attempting to connect to ephemeral Prefect API server"), and a terminal's
Ctrl-C killed the server under the run. The audit (AST, not grep) fails when code outside a
flow or task calls a flow anywhere but inside ``with prefect_api():``.
"""

from __future__ import annotations

import ast
from functools import cache

from tests.code_tree import python_files

# Calls that are not a command starting a flow, each with why
NOT_A_COMMAND: dict[str, str] = {}


def _decorated_by(node: ast.AST, names: tuple[str, ...]) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in names:
            return True
    return False


@cache
def _trees() -> tuple[tuple[str, ast.Module], ...]:
    return tuple((rel, ast.parse(path.read_text(encoding="utf-8")))
                 for rel, path in python_files(skip_scaffold=True))


def _flow_names() -> set[str]:
    """Every module-level function of the packages decorated with ``@flow``."""
    return {node.name for _, tree in _trees() for node in tree.body
            if _decorated_by(node, ("flow",))}


def _under_prefect_api(node: ast.With | ast.AsyncWith) -> bool:
    return any(isinstance(item.context_expr, ast.Call) and (
        getattr(item.context_expr.func, "id", None) == "prefect_api"
        or getattr(item.context_expr.func, "attr", None) == "prefect_api")
        for item in node.items)


def _bare_flow_calls(tree: ast.AST, flows: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each call of a flow outside a flow, a task and ``prefect_api``."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, covered: bool) -> None:
        if _decorated_by(node, ("flow", "task")):
            covered = True  # a subflow or a task's call runs under its parent's API
        if isinstance(node, (ast.With, ast.AsyncWith)) and _under_prefect_api(node):
            covered = True
        if isinstance(node, ast.Call) and not covered:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else None)
            if name in flows:
                found.append((node.lineno, name))
        for child in ast.iter_child_nodes(node):
            visit(child, covered)

    visit(tree, False)
    return found


def test_the_audit_finds_a_flow_called_outside_prefect_api() -> None:
    tree = ast.parse(
        "@flow\ndef f(): pass\n"
        "def main():\n    f()\n"
        "    with prefect_api():\n        f()\n"
        "@task\ndef t():\n    f()\n")
    assert _bare_flow_calls(tree, {"f"}) == [(4, "f")]


def test_every_command_runs_its_flows_under_prefect_api() -> None:
    flows = _flow_names()
    # the audit looks for something: the janitors, the replot, compare and the projects' flows
    assert {"janitor", "quads_janitor", "replot", "compare"} <= flows, flows
    bare = [f"{rel}:{line}: {name}()" for rel, tree in _trees()
            for line, name in _bare_flow_calls(tree, flows)
            if f"{rel}:{name}" not in NOT_A_COMMAND]
    assert not bare, ("a flow started outside `with prefect_api():` (flows/api_server.py) "
                      f"gets Prefect's own temporary server: {bare}")


def test_the_allowances_are_still_needed() -> None:
    names = {f"{rel}:{name}" for rel, tree in _trees()
             for _, name in _bare_flow_calls(tree, _flow_names())}
    assert set(NOT_A_COMMAND) <= names, set(NOT_A_COMMAND) - names
