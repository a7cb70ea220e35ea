"""The ports Telltale's children listen on: chosen in one place (`tasks.process.free_ports`),
distinct when a child set needs several, and never picked by a ``bind(0)`` elsewhere."""

from __future__ import annotations

import ast
import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from core.loopback import LOOPBACK_HOST
from tasks.process import free_ports
from tests.code_tree import REPO, python_files

PICKER = "tasks/process.py"


@settings(max_examples=25, deadline=None)
@given(count=st.integers(min_value=1, max_value=24))
def test_ports_asked_together_are_distinct_and_free(count: int) -> None:
    """Three for a Prometheus and its exporters: never one port twice (picked one after
    the other, the kernel may give the same port again once the first socket is closed)."""
    ports = free_ports(count)
    assert len(set(ports)) == count
    held = []
    try:
        for port in ports:  # each one free now, and all of them at once
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((LOOPBACK_HOST, port))
    finally:
        for sock in held:
            sock.close()


def _binds_port_zero(tree: ast.AST) -> list[int]:
    """Lines that call ``.bind((host, 0))``: a port picked by the kernel, then let go."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "bind" and node.args
                and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) == 2
                and isinstance(node.args[0].elts[1], ast.Constant)
                and node.args[0].elts[1].value == 0):
            found.append(node.lineno)
    return found


def test_no_code_picks_a_port_but_free_ports() -> None:
    """The product, its test servers and its benchmarks: one picker, so the distinct-ports
    rule (and any later one) holds for every child. A test server that binds port 0 and
    keeps its socket (an in-process HTTP server) is not a picker and is not matched."""
    files = [rel for rel, _ in python_files()]
    files += [p.relative_to(REPO).as_posix() for folder in ("tests", "benchmarks")
              for p in sorted((REPO / folder).rglob("*.py"))]
    offenders = []
    for rel in files:
        if rel == PICKER:
            continue
        tree = ast.parse((REPO / rel).read_text(encoding="utf-8"), rel)
        offenders += [f"{rel}:{line}" for line in _binds_port_zero(tree)]
    assert not offenders, f"pick ports with tasks.process.free_ports: {offenders}"
    assert _binds_port_zero(ast.parse((REPO / PICKER).read_text(encoding="utf-8")))


def test_the_audit_sees_a_bind_to_port_zero() -> None:
    code = "import socket\nwith socket.socket() as s:\n    s.bind(('127.0.0.1', 0))\n"
    assert _binds_port_zero(ast.parse(code)) == [3]
    assert _binds_port_zero(ast.parse("s.bind(('127.0.0.1', 8080))\n")) == []
