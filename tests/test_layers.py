"""Architecture checks: import layers and public API lists."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.code_tree import PACKAGES

REPO = Path(__file__).resolve().parent.parent


def test_import_layers_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the [dev] extra"
    proc = subprocess.run([lint], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("module", [
    "core.errors", "analysis.kpi", "analysis.lts", "analysis.history", "analysis.regression",
    "analysis.parsing", "analysis.discovery", "analysis.pipeline", "analysis.report",
    "analysis.report_index",
    "projects.config", "projects.contract", "projects.matrix", "tasks.artifacts",
    "tasks.runner", "tasks.platforms.select",
])
def test_all_lists_exist_and_resolve(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__, module
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_importing_analysis_does_not_import_prefect() -> None:
    code = "import analysis.pipeline, analysis.report_index, sys; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is part of the [dev] extra"
    proc = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_declared_means_used() -> None:
    """deptry: no declared-unused package, no used-undeclared one (tests scanned too)."""
    deptry = shutil.which("deptry", path=str(Path(sys.executable).parent))
    assert deptry, "deptry is part of the [dev] extra"
    proc = subprocess.run([deptry, "."], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def _in_the_tree(module: str) -> bool:
    """A module of the code itself: pytest puts tests/ on sys.path, and grimp then counts
    tests/analysis/test_x.py as ``analysis.test_x``."""
    path = REPO.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _folder_cycles() -> list[list[str]]:
    """Import cycles among the modules of one folder (deferred and TYPE_CHECKING imports
    count: a cycle hidden in a function is still a cycle)."""
    import grimp

    # no cache: grimp's keys on file times a quick edit-and-revert can leave unchanged
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    modules = {m for m in graph.modules if _in_the_tree(m)}

    def folder(module: str) -> str:
        return module.rsplit(".", 1)[0]

    edges = {m: {i for i in graph.find_modules_directly_imported_by(m)
                 if i in modules and folder(i) == folder(m)} for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_inside_a_folder() -> None:
    """projects.config → registry → contract → config, analysis.parsing ↔ project and
    flows.events ↔ orchestration were such cycles; none may come back."""
    assert _folder_cycles() == []


def _engine_files() -> list[Path]:
    """The engine: tasks/, analysis/, blocks/, the generic flows, deployments' Python."""
    return sorted([*REPO.glob("tasks/**/*.py"), *REPO.glob("analysis/**/*.py"),
                   *REPO.glob("blocks/**/*.py"), *REPO.glob("flows/*.py"),
                   *REPO.glob("deployments/*.py")])


def test_no_project_name_in_the_engines_code() -> None:
    """A project declares itself; the engine names none: no project's name (or flow name)
    in a string or an identifier of the engine's code. Documentation (docstrings and other
    bare string statements) may use one as an example."""
    import ast

    from projects import registry

    names = set()
    for name in registry.available():
        names |= {name, registry.load(name).flow_name}
    found = []
    for path in _engine_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        documentation = {id(node.value) for node in ast.walk(tree)
                         if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(
                node.value, str) and id(node) not in documentation else \
                node.id if isinstance(node, ast.Name) else None
            if text and any(name in text for name in names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text[:60]!r}")
    assert found == []


def test_the_hand_written_deployment_files_name_no_project() -> None:
    """What a project brings reaches deployments/ through generated files only (prefect.yaml,
    the RBAC): a hand-written file there names no project, so a third project edits none."""
    from projects import registry

    names = set()
    for name in registry.available():
        names |= {name, registry.load(name).flow_name}
    found = []
    for path in sorted((REPO / "deployments").iterdir()):
        if not path.is_file() or path.suffix == ".pyc":
            continue
        text = path.read_text(encoding="utf-8")
        if text.startswith("# GENERATED by"):
            continue
        found += [f"{path.name}: {name}" for name in sorted(names) if name in text]
    assert found == []


def test_the_tests_mirror_the_packages() -> None:
    """A test of tasks/kube/ lives in tests/tasks/kube/, and so on: every test folder under
    tests/<package>/ is a folder of that package (servers, data and bin are the suite's)."""
    own = {"servers", "data", "bin", "e2e", "__pycache__"}
    for folder in sorted(p for p in (REPO / "tests").rglob("*") if p.is_dir()):
        parts = folder.relative_to(REPO / "tests").parts
        if parts[0] in own or "__pycache__" in parts or parts[0] == "projects":
            continue
        assert (REPO.joinpath(*parts)).is_dir(), f"tests/{'/'.join(parts)} mirrors no package"
    for module in ("kube", "platforms", "lab", "publish", "observe"):
        assert list((REPO / "tests" / "tasks" / module).glob("test_*.py")), module


def _project_boundaries() -> list[str]:
    """What crosses a project folder's border: the two rules a project and the engine keep,
    for every registered project (no project named in a contract)."""
    import grimp

    from projects import registry

    graph = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    folders = {f"projects.{name}" for name in registry.available()}
    sdk = ("projects.contract", "projects.library")

    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    found = []
    for module in sorted(m for m in graph.modules if _in_the_tree(m)):
        mine = next((f for f in folders if inside(module, f)), None)
        for imported in graph.find_modules_directly_imported_by(module):
            theirs = next((f for f in folders if inside(imported, f)), None)
            entry = f"flows.{(theirs or '').split('.')[-1]}"
            if theirs and theirs != mine and not inside(module, entry):
                found.append(f"engine {module} imports the project {imported}")
            if mine is None or inside(imported, mine):
                continue
            top = imported.split(".")[0]
            if top in ("tasks", "flows", "blocks", "deployments", "prefect") or (
                    top == "projects" and imported != "projects"
                    and not any(inside(imported, s) for s in sdk)):
                found.append(f"project {module} imports {imported}")
    return found


def test_projects_and_the_engine_keep_to_their_sides() -> None:
    """The engine (tasks, flows but a project's own entry point, blocks, deployments,
    analysis, the projects package's engine modules) imports no project folder; a project
    folder imports only its own modules, the project SDK (projects.contract,
    projects.library), analysis and third-party packages other than Prefect."""
    assert _project_boundaries() == []


def _project_folders() -> set[str]:
    from projects import registry

    return set(registry.available())


def test_every_project_has_its_thin_flow_and_nothing_else_is_one() -> None:
    """The registry's list, the flows' folders and the command line agree on the projects."""
    flows = {p.parent.name for p in (REPO / "flows").glob("*/__main__.py")}
    assert flows == _project_folders()
    for name in flows:
        assert (REPO / "flows" / name / "flow.py").is_file(), name


def test_engine_imports_no_project_folder() -> None:
    """No module under tasks/ or flows/ (but a project's own thin flow) imports a project."""
    import ast

    projects = _project_folders()
    offenders = []
    for path in [*(REPO / "tasks").rglob("*.py"), *(REPO / "flows").rglob("*.py")]:
        rel = path.relative_to(REPO)
        if rel.parts[0] == "flows" and len(rel.parts) > 2 and rel.parts[1] in projects:
            continue  # flows/<project>/: the project's thin wrapper
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                parts = name.split(".")
                if parts[0] == "projects" and len(parts) > 1 and parts[1] in projects:
                    offenders.append(f"{rel}: {name}")
    assert not offenders, offenders


def test_thin_flows_stay_thin() -> None:
    for project in _project_folders():
        flow = REPO / "flows" / project / "flow.py"
        assert len(flow.read_text().splitlines()) <= 60, flow


def test_the_ground_floor_imports_only_itself() -> None:
    """``core/`` (docs/architecture.md) imports no other floor, deferred imports counted
    (import-linter sees module-level and deferred imports alike; this reads every file)."""
    import ast

    for path in sorted((REPO / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert top not in PACKAGES or top == "core", f"core/{path.name} imports {module}"


MAX_MODULE_LINES = 600
"""Rooms that fit (docs/architecture.md): a module over this holds more than one job."""


def test_no_module_is_over_600_lines() -> None:
    from tests.code_tree import python_files

    tests = sorted((REPO / "tests").rglob("*.py"))
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for p in [*(path for _, path in python_files()), *tests, *REPO.glob("benchmarks/**/*.py")]}
    assert {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES} == {}
