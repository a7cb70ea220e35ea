"""Every file the project opens from outside its own code goes through the one reader.

An AST audit over the packages: a call that opens a path (``open``, ``Path.read_text`` /
``read_bytes``, pandas/pyarrow readers, ``json.load``/``yaml.safe_load`` on a stream, the
kubernetes client's own kubeconfig loader) must be in `core.safeio` (the reader itself)
or listed below with why it is not a read of outside input. A new bypass fails this test;
so does a listed site that moved away (the list stays true).

`core.safeio.open_regular` is the mechanism: regular files only (a FIFO or device is
refused, never opened for a blocking read), no link followed unless the user named it, a
size cap. The behaviour is tested on planted FIFOs below, through the real entry points.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from tests.code_tree import python_files

ROOT = Path(__file__).resolve().parents[2]
READERS = {"open", "read_text", "read_bytes", "read_parquet", "read_table", "ParquetFile",
           "new_client_from_config", "load_kube_config"}

# "file::function" -> why the open there is not of outside input (or how it is bounded)
ALLOWED = {
    # opens of a descriptor the reader returned, or of an already-checked stream
    "analysis/file_reader.py::FileReader._open": "wraps the fd of FileReader._open_fd (open_regular)",
    "analysis/file_reader.py::FileReader.table": "reads the stream FileReader opened",
    "analysis/file_reader.py::FileReader.tail": "wraps the fd of FileReader._open_fd",
    "analysis/validity.py::_prometheus_mean": "reads the stream FileReader opened",
    "analysis/history.py::HistoryStore._read_files":
        "history parts: listed and checked as regular files by the store before the read",
    "analysis/history.py::HistoryStore.accepted": "history part, as above",
    "tasks/publish/export.py::append_history": "a Parquet file this run wrote in its own dir",
    # the repository's own files (templates, shipped data, generated docs)
    "flows/new_project.py::_copy": "the scaffold's own templates",
    "flows/new_project.py::_minimal": "the scaffold's own templates",
    "deployments/generated.py::generated_main": "a generated file of the repository (--check)",
    "deployments/reference.py::main": "a generated page of the repository (--check)",
    "projects/library/tiny_lm.py::read_samples": "the project's shipped dataset",
    "projects/library/data.py::content_hash": "the project's shipped dataset (hashed)",
    "projects/llm_serving/project.py::_corpus_digest": "the project's shipped corpus",
    "projects/llm_serving/manifests.py::cell_manifests": "the project's own templates",
    "projects/llm_serving/project.py::kube_users": "the project's own user program",
    "tasks/kube/users.py::user_job_manifests": "Telltale's own user-pod program",
    "tasks/platforms/plan.py::prepare_cluster_manifests": "the project's own manifests",
    "tasks/kube/images.py::run_builds": "the repository's Containerfile",
    "projects/llm_serving/install.py::installed": "the serving venv's marker this code wrote",
    # workload programs: they run as the workload, on files the engine gave them
    "projects/fine_tuning/workload/train_local.py::main": "the trainer's config.json",
    "projects/llm_serving/workload/load.py::_config": "the load step's own config",
    "projects/llm_serving/workload/load.py::_verdict": "GuideLLM's result, in its step dir",
    "projects/llm_serving/workload/load.py::main": "the load step's own files",
    "tasks/kube/user_pod_script.py::upload_results": "inside a user pod: its own results",
    # streams this process itself is writing
    "tasks/process.py::log_tail": "the log its own child (a server, fresh or forked) writes",
    "tasks/progress.py::_read_tail": "the log its own child is writing",
    "tasks/runner.py::run": "the step log it is writing",
    "tasks/runner.py::_tail_of": "the step log it wrote",
    "tasks/publish/s3.py::_sha256": "a file of this run it is about to upload",
    "tasks/hostwatch.py::_read": "/proc files of this machine",
    "core/timeline.py::process_start": "/proc/self/stat: this process's start",
    "core/cmdline.py::set_cmdline": "/proc/self/stat: this process's argv area",
    "core/pids.py::pid_alive": "/proc/<pid>/stat: is a process a zombie",
    # a command line's client reads before it imports core.safeio (pydantic: ~0.1 s)
    "core/warm_key.py::warm_key": "the warm Python's own source files (hashed into its key)",
    "core/warm_command.py::_importing":
        "a warm Python's pid file (its own dir, 0700) and /proc/<pid>/cmdline",
}
# Sites still reading run-dir files without the bounded reader: none left.
NOT_YET: set[str] = set()


def _sites(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            name = func
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name if func is None else f"{func}.{child.name}"
            elif isinstance(child, ast.ClassDef):
                name = child.name
            if isinstance(child, ast.Call):
                fn = child.func
                called = fn.id if isinstance(fn, ast.Name) else (
                    fn.attr if isinstance(fn, ast.Attribute) else None)
                on_module = isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name)
                if called in READERS and not (on_module and fn.value.id == "os"):
                    out.append((child.lineno, name or "<module>"))
                elif called == "load" and on_module and fn.value.id in ("json", "yaml"):
                    out.append((child.lineno, name or "<module>"))
            visit(child, name)

    visit(tree, None)
    return out


def _all_sites() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rel, path in python_files(skip_scaffold=True):
        for line, func in _sites(path):
            found.setdefault(f"{rel}::{func}", []).append(line)
    return found


def test_no_code_opens_outside_input_around_the_reader() -> None:
    sites = _all_sites()
    unknown = {k: v for k, v in sites.items() if k not in ALLOWED and k not in NOT_YET}
    assert not unknown, ("read these through core.safeio (read_bounded, "
                         f"read_text_bounded, open_stream) or list why not: {unknown}")
    stale = (set(ALLOWED) | NOT_YET) - set(sites)
    assert not stale, f"listed sites that no longer open anything: {sorted(stale)}"


def test_the_audit_sees_every_kind_of_open(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import json, yaml\nfrom pathlib import Path\n"
                   "def f(p):\n    open(p)\n    Path(p).read_text()\n    Path(p).read_bytes()\n"
                   "    json.load(p)\n    yaml.load(p)\n    os.open(p, 0)\n")
    assert [line for line, _ in _sites(bad)] == [4, 5, 6, 7, 8]


needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")


@needs_fifo
def test_a_fifo_as_kubeconfig_is_one_error_not_a_hang(tmp_path: Path) -> None:
    from core.errors import ConfigError
    from tasks.kube.api import api_client

    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        api_client(str(fifo))


@needs_fifo
def test_fifos_in_a_results_tree_and_run_dir_are_refused(tmp_path: Path) -> None:
    """The parse cache, cell.json, exit_code, a pid file, a lease file: planted FIFOs."""
    from analysis.discovery import _cell_file, read_exit_code
    from analysis.parsing import CACHE_FILE, read_tail
    from tasks.lab.lease import _local_leases
    from tasks.platforms.local import cleanup_local
    from tasks.runner import PID_FILE

    run = tmp_path / "run"
    cell = run / "001__cell"
    cell.mkdir(parents=True)
    for name in ("cell.json", "exit_code", CACHE_FILE, PID_FILE, "lease.json", "log.txt"):
        os.mkfifo(cell / name)
    assert _cell_file(str(cell), {"cell.json"}) == {}
    assert "exit_code" in str(read_exit_code(cell))
    assert read_tail(cell / "log.txt") is None
    assert cleanup_local(run) == {"stopped_pids": [], "removed": []}
    assert _local_leases([run]) == {}


def test_a_kubeconfig_with_relative_certificate_paths_still_resolves(tmp_path: Path) -> None:
    """Read as a mapping, the file's folder still anchors relative paths (as the client's
    own loader did)."""
    from tasks.kube.api import api_client

    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n"
                                     "-----END CERTIFICATE-----\n")
    (tmp_path / "config").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443', "
        "certificate-authority: ca.crt}}]\n"
        "users: [{name: u, user: {token: abcdefgh12345678}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    client = api_client(str(tmp_path / "config"))
    assert client.configuration.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert client.configuration.host == "https://127.0.0.1:6443"
    client.close()
    assert sys.modules["tasks.kube.api"]
