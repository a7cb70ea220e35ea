"""Every read of a list from Prefect's API says which items it wants, or pages.

Prefect's server answers a list read (flows, deployments, work pools, artifacts, runs, logs)
with one page: its default limit is 200, and artifacts come sorted by their (random) id. An
unfiltered read is a sample once a server holds more: a test of the suite's shared API
missed its own run's artifact that way, and `python -m deployments.deploy` would have taken
a pool past the first 200 for missing. An audit over the source (AST): each such call in the
packages and the tests passes a ``*_filter`` or a ``limit``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.code_tree import REPO, python_files

LIST_READS = frozenset({
    "read_flows", "read_flow_runs", "read_task_runs", "read_deployments", "read_work_pools",
    "read_work_queues", "read_artifacts", "read_logs", "read_variables",
    "read_block_documents", "read_automations", "read_global_concurrency_limits",
    "read_workers_for_work_pool"})


def _unbounded_reads(path: Path, root: Path = REPO) -> list[str]:
    """The list reads in ``path`` that pass neither a filter nor a limit, by line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in LIST_READS:
            given = {k.arg for k in node.keywords}
            if not any(k and (k.endswith("_filter") or k == "limit") for k in given):
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno} "
                                           f"{node.func.attr}()"))
    return [hit for _, hit in sorted(found)]


def test_no_prefect_list_read_takes_the_servers_default_page() -> None:
    files = [path for _, path in python_files()] + sorted((REPO / "tests").rglob("*.py"))
    found = [hit for path in files for hit in _unbounded_reads(path)]
    assert found == [], found


def test_the_audit_sees_an_unbounded_read(tmp_path: Path) -> None:
    """It fails on the reads it is there for (the two this audit found)."""
    sample = tmp_path / "sample.py"
    sample.write_text("async def f(client):\n    await client.read_artifacts()\n"
                      "    client.read_work_pools()\n"
                      "    client.read_flows(flow_filter=None)\n")
    hits = [h.split(" ", 1)[1] for h in _unbounded_reads(sample, tmp_path)]
    assert hits == ["read_artifacts()", "read_work_pools()"]
