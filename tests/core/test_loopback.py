"""Every service Telltale starts for itself listens on, and is recorded at, one loopback.

An audit (AST): the address is written in `core.loopback` alone, so the spare Prometheus's
record, the shared Prefect API's record and the servers themselves cannot drift apart (two
copies of the record's pattern had begun to).
"""

from __future__ import annotations

import ast

import pytest
from pydantic import BaseModel, Field, ValidationError

from core.loopback import LOOPBACK_URL, loopback_url
from tests.code_tree import python_files


class _Record(BaseModel):
    url: str = Field(pattern=LOOPBACK_URL)


def _address_literals(tree: ast.AST) -> list[int]:
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and "127.0.0.1" in node.value and id(node) not in docstrings]


def test_the_loopback_address_is_written_in_one_place() -> None:
    found = [f"{rel}:{line}" for rel, path in python_files(skip_scaffold=True)
             if rel != "core/loopback.py"
             for line in _address_literals(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, f"use core.loopback (LOOPBACK_HOST, loopback_url): {found}"
    assert _address_literals(ast.parse('x = "http://127.0.0.1:1"\n"""127.0.0.1"""\n')) == [1]


@pytest.mark.parametrize("port", [1, 80, 4200, 65535])
def test_a_loopback_url_is_a_valid_record(port: int) -> None:
    assert _Record(url=loopback_url(port)).url == f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("url", ["http://10.0.0.1:80", "http://127.0.0.1:80/x",
                                 "https://127.0.0.1:80", "http://127.0.0.1.evil:80",
                                 "http://127.0.0.1:123456", "http://localhost:80"])
def test_a_record_pointing_elsewhere_is_refused(url: str) -> None:
    with pytest.raises(ValidationError):
        _Record(url=url)
