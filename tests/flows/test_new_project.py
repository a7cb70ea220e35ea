"""Scaffolding: a new orchestration is a folder, and it runs green with no edits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from core.errors import ConfigError
from flows.new_project import scaffold
from tests.factories import prometheus_required

REPO = Path(__file__).resolve().parents[2]
# the copy holds the code, not the venvs (the serving venv alone is 3.7 GB) or caches
_IGNORE = shutil.ignore_patterns(".venv", ".venvs", ".git", "runs", "site", "__pycache__",
                                 ".pytest_cache", ".ruff_cache", ".hypothesis", ".grimp_cache",
                                 ".import_linter_cache", "*.egg-info", "benchmarks")


def _skeleton(root: Path) -> Path:
    for folder in ("projects", "flows", "tests/projects"):
        (root / folder).mkdir(parents=True)
    return root


def test_names_are_checked_and_nothing_is_overwritten(tmp_path: Path) -> None:
    repo = _skeleton(tmp_path)
    for bad in ("Demo", "1demo", "de-mo", "class", "x", "demo_"):
        with pytest.raises(ConfigError, match="lowercase identifier"):
            scaffold(bad, repo=repo)
    scaffold("demo", repo=repo)
    with pytest.raises(ConfigError, match="already exists"):
        scaffold("demo", repo=repo)
    with pytest.raises(ConfigError, match="unknown template"):
        scaffold("other", "nope", repo=repo)


def test_minimal_project_is_small_and_complete(tmp_path: Path) -> None:
    written = {p.relative_to(tmp_path).as_posix()
               for p in scaffold("demo", repo=_skeleton(tmp_path))}
    assert {"projects/demo/config.yaml", "projects/demo/plots.yaml", "projects/demo/project.py",
            "projects/demo/workload.py", "flows/demo/flow.py", "flows/demo/__main__.py",
            "tests/projects/test_demo.py"} <= written
    code = sum(len(p.read_text().splitlines()) for p in (tmp_path / "projects/demo").glob("*.py"))
    assert code <= 200, code
    flow = (tmp_path / "flows/demo/flow.py").read_text()
    assert len(flow.splitlines()) <= 60 and "__NAME__" not in flow


def _repo_copy(tmp_path: Path) -> tuple[Path, Callable[..., subprocess.CompletedProcess[str]]]:
    """A copy of the code (no venvs, no caches) and a runner of Python commands inside it."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=_IGNORE)
    env = {**os.environ, "TELLTALE_DATA_DIR": str(tmp_path / "data"),
           "PREFECT_HOME": str(tmp_path / "prefect-home")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=1200)

    return repo, run


# The existing tests that go over every registered project (what a new one could break);
# they run, unchanged, in the copy with the new project in it. (The reference pages' check
# is the regeneration `_generated_files_change_only_for` does: not run twice.)
_TESTS_OVER_EVERY_PROJECT = (
    "tests/projects/test_config_schema.py", "tests/projects/test_untrusted.py",
    "tests/flows/test_deployments.py",
    "tests/test_layers.py::test_every_project_has_its_thin_flow_and_nothing_else_is_one",
    "tests/test_layers.py::test_thin_flows_stay_thin", "tests/test_bootstrap.py::"
    "test_help_lists_the_registered_projects_and_exits_0",
)
# ...but for the ones about the Kubernetes work pool's job template, which no project
# changes: they start a Prefect API of their own in the copy (~7 CPU-s)
_NOT_ABOUT_PROJECTS = tuple(
    f"--deselect=tests/flows/test_deployments.py::{name}" for name in (
        "test_the_kubernetes_job_template_renders_a_valid_job",
        "test_the_stock_template_is_what_the_schema_check_catches"))


def _sections(text: str) -> dict[str, str]:
    """A generated reference page's sections by project (``## name``)."""
    parts = text.split("\n## ")
    return {part.split("\n", 1)[0]: part for part in parts[1:]}


def _generated_files_change_only_for(repo: Path, run: Callable[..., Any], name: str) -> None:
    """Regenerate what the engine derives from every project: the other projects' parts are
    byte for byte what they were (their nightly slots, deployments, RBAC, reference)."""
    from core.yamlio import load_yaml_text

    prefect = run("-m", "deployments.prefect_file")
    assert prefect.returncode == 0, prefect.stderr
    (repo / "deployments" / "prefect.yaml").write_text(prefect.stdout)
    before, _ = load_yaml_text((REPO / "deployments" / "prefect.yaml").read_text(), source="a")
    after, _ = load_yaml_text(prefect.stdout, source="b")
    others = [d for d in after["deployments"] if not d["name"].startswith(
        name.replace("_", "-"))]
    assert others == before["deployments"]
    rbac = run("-m", "deployments.rbac")
    assert rbac.returncode == 0, rbac.stderr
    assert rbac.stdout == (REPO / "deployments" / "kubernetes-rbac.yaml").read_text()
    (repo / "deployments" / "kubernetes-rbac.yaml").write_text(rbac.stdout)
    reference = run("-m", "deployments.reference")
    assert reference.returncode == 0, reference.stderr
    old = _sections((REPO / "docs" / "reference" / "config.md").read_text())
    new = _sections((repo / "docs" / "reference" / "config.md").read_text())
    assert {k: v for k, v in new.items() if k != name} == old and name in new


@pytest.mark.slow
def test_scaffolded_project_runs_green_end_to_end(tmp_path: Path) -> None:
    repo, run = _repo_copy(tmp_path)

    made = run("-m", "flows.new_project", "demo")
    assert made.returncode == 0, made.stderr
    _generated_files_change_only_for(repo, run, "demo")
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                "tests/projects/test_demo.py", *_TESTS_OVER_EVERY_PROJECT, *_NOT_ABOUT_PROJECTS)
    assert tests.returncode == 0, tests.stdout[-3000:]
    lint = run("-m", "ruff", "check", "projects/demo", "flows/demo", "tests/projects")
    assert lint.returncode == 0, lint.stdout[-3000:]
    out = tmp_path / "run"
    flow = run("-m", "flows.demo", "--preset", "light", "--artifact-dir", str(out))
    assert flow.returncode == 0, flow.stdout[-3000:] + flow.stderr[-3000:]
    kpis = pd.read_parquet(next(out.glob("*__analysis__postprocess_results/kpis.parquet")))
    values = kpis.set_index("kpi")["value"]
    assert values["hash_mb_per_second"] > 0 and values["hash_runtime"] > 0
    if prometheus_required():  # the engine's resource family, with no project code
        assert values["cpu_cores_used_mean"] > 0 and values["memory_used_max"] > 0
    assert list(out.glob("*__cell/*__demo__run_demo_job/artifacts/pod.log"))
    copied = run("-m", "flows.new_project", "ft_copy", "--from", "fine_tuning")
    assert copied.returncode == 0, copied.stderr
    plan = run("-m", "flows.ft_copy", "--preset", "sweep", "--plan", "--artifact-dir",
               str(tmp_path / "plan"))
    assert plan.returncode == 0 and "cells     4 (3 to run, 1 skipped)" in plan.stdout, \
        plan.stderr


_RAYJOB_KIND = '''

# A kind the engine has never heard of: declared here, and only here.
from projects.library.kinds import MANAGE, Kind  # noqa: E402

_plain_kubernetes = kubernetes


def kubernetes(ctx: CellContext) -> KubeWorkload:  # noqa: F811
    """The workload, and a RayJob beside it (a kind this project brings)."""
    plain = _plain_kubernetes(ctx)
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": f"{plain.pod}-ray", "namespace": ctx.test.namespace},
              "spec": {"entrypoint": "python -c 'print(1)'"}}
    return dataclasses.replace(plain, manifests=[*plain.manifests, rayjob])


PROJECT = dataclasses.replace(  # noqa: F811
    PROJECT, kubernetes=kubernetes,
    kube_kinds=(Kind("ray.io/v1", "RayJob", "rayjobs", True, MANAGE, cleanup=15),))
'''


@pytest.mark.slow
def test_a_third_project_brings_a_new_kind_touching_only_its_own_folder(
        tmp_path: Path) -> None:
    """A scaffolded project declares a kind the engine does not know (RayJob): its plan
    writes it, the generated RBAC grants it, the cleanup order holds it (after the
    PyTorchJob, before the Jobs), it still runs green locally — and nothing outside its own
    folder, its flow and its test changed."""
    import filecmp
    import json

    repo, run = _repo_copy(tmp_path)

    assert run("-m", "flows.new_project", "raydemo").returncode == 0
    project_file = repo / "projects" / "raydemo" / "project.py"
    project_file.write_text(project_file.read_text().replace(
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\nimport dataclasses\n", 1) + _RAYJOB_KIND)
    plan = run("-m", "flows.raydemo", "--preset", "light", "--platform", "kubernetes",
               "--plan", "--artifact-dir", str(tmp_path / "plan"))
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    planned = sorted(p.name for p in (tmp_path / "plan" / "manifests").rglob("*.yaml"))
    assert any("rayjob" in name for name in planned), planned
    rbac = run("-m", "deployments.rbac")
    assert "rayjobs" in rbac.stdout and rbac.returncode == 0
    order = run("-c", "import json; from tasks.kube.kinds import cleanup_kinds; "
                "print(json.dumps([k.kind for k in cleanup_kinds()]))")
    kinds = json.loads(order.stdout)
    assert kinds.index("PyTorchJob") < kinds.index("RayJob") < kinds.index("Job"), kinds
    flow = run("-m", "flows.raydemo", "--preset", "light", "--artifact-dir",
               str(tmp_path / "run"))
    assert flow.returncode == 0, flow.stdout[-2000:] + flow.stderr[-2000:]
    # only its own files: every file of the original tree is unchanged in the copy
    own = ("projects/raydemo/", "flows/raydemo/", "tests/projects/test_raydemo.py")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    changed = []
    for relative in listed.stdout.splitlines():
        if relative.startswith(("benchmarks/", *own)) or not (REPO / relative).is_file():
            continue
        copy = repo / relative
        if not copy.is_file() or not filecmp.cmp(REPO / relative, copy, shallow=False):
            changed.append(relative)
    assert changed == []
