"""Scaffold a new orchestration: ``python -m flows.new_project NAME [--from minimal|fine_tuning]``.

Writes ``projects/NAME/`` (config.yaml with presets, settings and config models, a small real
local workload, parser, KPIs, plots.yaml), the thin flow ``flows/NAME/`` and
``tests/projects/test_NAME.py``. The project is found without re-installing (the folder
convention of `analysis.project.load_project`); add it to the ``telltale.projects`` entry
points in pyproject.toml to make it visible to other installs.

- ``minimal`` (default): a hashing-throughput workload (standard library only), its JSON-line
  parser and two KPIs; ``python -m flows.NAME --preset light`` runs green at once.
- ``fine_tuning``: a copy of the fine_tuning project's folder and flow, renamed.

Nothing is overwritten: an existing project, flow or test file stops the command (exit 2).
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from pathlib import Path

from core.errors import ConfigError
from core.exit import exit_now
from core.safeio import copy_file, write_text
from core.terminal import say
from flows.cli import EXIT_OK, main_guard, make_parser

__all__ = ["scaffold"]

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "scaffold"
_NAME = re.compile(r"[a-z][a-z0-9_]{1,39}")
# template → where it goes, relative to the repo
_MINIMAL = {
    "project.py.tmpl": "projects/{name}/project.py",
    "workload.py.tmpl": "projects/{name}/workload.py",
    "config.yaml.tmpl": "projects/{name}/config.yaml",
    "plots.yaml.tmpl": "projects/{name}/plots.yaml",
    "flow.py.tmpl": "flows/{name}/flow.py",
    "main.py.tmpl": "flows/{name}/__main__.py",
    "test.py.tmpl": "tests/projects/test_{name}.py",
}


def _check_name(name: str, repo: Path) -> None:
    if not _NAME.fullmatch(name) or keyword.iskeyword(name) or name.endswith("_"):
        raise ConfigError(f"project name {name!r} must be a lowercase identifier of 2-40 "
                          "characters (letters, digits, underscores), starting with a letter")
    for existing in (repo / "projects" / name, repo / "flows" / name,
                     repo / "tests" / "projects" / f"test_{name}.py"):
        if existing.exists():
            raise ConfigError(f"{existing} already exists: choose another name")


def _fill(text: str, name: str) -> str:
    return (text.replace("__NAME__", name).replace("__DASH__", name.replace("_", "-"))
            .replace("__CLASS__", "".join(p.title() for p in name.split("_"))))


def _minimal(name: str, repo: Path) -> list[Path]:
    written = []
    for template, target in _MINIMAL.items():
        path = repo / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, _fill((TEMPLATES / template).read_text(encoding="utf-8"), name))
        written.append(path)
    for package in (repo / "projects" / name, repo / "flows" / name):
        init = package / "__init__.py"
        write_text(init, f'"""The {name} orchestration (scaffolded by flows.new_project)."""\n')
        written.append(init)
    return written


def _copy(source: str, name: str, repo: Path) -> list[Path]:
    """Copy a project folder and its flow, renaming every mention of the source."""
    dash = name.replace("_", "-")
    written = []
    for folder in ("projects", "flows"):
        src, dst = repo / folder / source, repo / folder / name
        for path in sorted(src.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                copy_file(path, target)
            else:
                write_text(target, text.replace(source, name).replace(
                    source.replace("_", "-"), dash))
            written.append(target)
    return written


def scaffold(name: str, template: str = "minimal", repo: Path = REPO) -> list[Path]:
    """Write a new project, its thin flow and (minimal) its tests; returns the files written.

    Raises:
        ConfigError: An invalid name, an existing project, or an unknown template.
    """
    _check_name(name, repo)
    if template == "minimal":
        return _minimal(name, repo)
    if (repo / "projects" / template / "config.yaml").is_file() and \
            (repo / "flows" / template / "flow.py").is_file():
        return _copy(template, name, repo)
    raise ConfigError(f"unknown template {template!r}: minimal, or a project with a flow")


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = make_parser("python -m flows.new_project", "Scaffold a new orchestration.")
    parser.add_argument("name", help="project name (a lowercase identifier)")
    parser.add_argument("--from", dest="template", default="minimal", metavar="TEMPLATE",
                        help="minimal (default) or the name of an existing project to copy")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="repository root to write into (default: this checkout)")
    args = parser.parse_args(argv)
    written = scaffold(args.name, args.template, args.repo)
    root = Path(args.repo).resolve()
    for path in written:
        say(f"wrote {path.resolve().relative_to(root)}")
    say("")
    say(f"next: python -m flows.{args.name} --preset light")
    say("then regenerate what the engine derives from every project (its deployments, the "
          "runner's RBAC, the reference pages):\n"
          "  python -m deployments.prefect_file > deployments/prefect.yaml\n"
          "  python -m deployments.rbac > deployments/kubernetes-rbac.yaml\n"
          "  python -m deployments.reference", keep_newlines=True)
    return EXIT_OK


if __name__ == "__main__":
    exit_now(main())
