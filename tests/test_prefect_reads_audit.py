"""Every read of a list from Prefect's API says which items it wants, or pages; every call
on it goes through Prefect's client.

Prefect's server answers a list read (flows, deployments, work pools, artifacts, runs, logs)
with one page: its default limit is 200, and artifacts come sorted by their (random) id. An
unfiltered read is a sample once a server holds more: a test of the suite's shared API
missed its own run's artifact that way, and `python -m deployments.deploy` would have taken
a pool past the first 200 for missing. An audit over the source (AST): each such call in the
packages and the tests passes a ``*_filter`` or a ``limit``.

And Prefect's server answers 503 while its SQLite database is busy: its client retries that
with backoff, a bare ``httpx.post`` failed a CI run on the suite's shared API. The second audit:
no module that names a Prefect API path calls HTTP raw (httpx, urllib, requests), except for a
``/health`` probe, whose every failure means "not up yet".
"""

from __future__ import annotations

import ast
import re
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


PREFECT_PATH = re.compile(
    r"^/(flows|flow_runs|task_runs|deployments|work_pools|work_queues|variables|artifacts|"
    r"logs|block_documents|block_types|block_schemas|automations|events|concurrency_limits|"
    r"v2/concurrency_limits|workers|csrf-token|admin)(/|$)")
"""The Prefect REST API's resources (an endpoint's path after ``/api``)."""

RAW_HTTP = frozenset({
    *(f"httpx.{verb}" for verb in ("get", "post", "put", "patch", "delete", "head", "options",
                                   "request", "stream", "Client", "AsyncClient")),
    *(f"requests.{verb}" for verb in ("get", "post", "put", "patch", "delete", "request",
                                      "Session")),
    "urllib.request.urlopen", "urlopen"})


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _a_health_probe(call: ast.Call) -> bool:
    """The call's URL is a literal (or f-string) ending in ``/health``."""
    url = call.args[0] if call.args else None
    last = url.values[-1] if isinstance(url, ast.JoinedStr) and url.values else url
    return isinstance(last, ast.Constant) and str(last.value).endswith("/health")


def _raw_prefect_calls(path: Path, root: Path = REPO) -> list[str]:
    """The raw HTTP calls of a module that speaks to Prefect's API, by line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    speaks = any(isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and PREFECT_PATH.match(node.value) for node in ast.walk(tree))
    if not speaks:
        return []
    found = [(node.lineno, f"{path.relative_to(root)}:{node.lineno} {_dotted(node.func)}()")
             for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _dotted(node.func) in RAW_HTTP
             and not _a_health_probe(node)]
    return [hit for _, hit in sorted(found)]


def test_no_call_on_prefects_api_goes_around_its_client() -> None:
    files = [path for _, path in python_files()] + sorted((REPO / "tests").rglob("*.py"))
    found = sorted(hit for path in files for hit in _raw_prefect_calls(path))
    assert found == [], found


def test_the_audit_sees_a_raw_call_on_prefects_api(tmp_path: Path) -> None:
    """It fails on the calls it is there for (the CI failure's), not on a health probe nor
    on a module that names no Prefect path."""
    sample = tmp_path / "sample.py"
    sample.write_text("import httpx, urllib.request\n"
                      "def f(api, path):\n"
                      "    httpx.post(f'{api}{path}', json={})\n"
                      "    urllib.request.urlopen(f'{api}/health')\n"
                      "    with httpx.Client() as c: pass\n"
                      "f('http://x/api', '/deployments/')\n")
    hits = [h.split(" ", 1)[1] for h in _raw_prefect_calls(sample, tmp_path)]
    assert hits == ["httpx.post()", "httpx.Client()"]
    other = tmp_path / "other.py"
    other.write_text("import httpx\nhttpx.post('http://quads/api/v3/register')\n")
    assert _raw_prefect_calls(other, tmp_path) == []
