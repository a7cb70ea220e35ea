"""The docs' generated reference pages: every config key of every project, every command.

    python -m deployments.reference            # (re)write docs/reference/{config,cli}.md
    python -m deployments.reference --check    # exit 1 when a page is stale

The configuration reference is read from the pydantic models (each registered project's
config model: the same classes that validate a run's config), the CLI reference from the
commands' own ``--help``. A test runs ``--check``: a key or an option added without
regenerating fails the suite, so the pages never drift from the code.
"""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core.terminal import ArgumentParser, say
from projects import registry, schema
from projects.config import resolve

__all__ = ["CLI_COMMANDS", "DOCS", "cli_page", "config_page", "main"]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference"
ROOT = DOCS.parent.parent
CLI_COMMANDS: list[tuple[str, list[str]]] = [
    ("./telltale", ["bash", "telltale", "--help"]),
    *[(f"python -m flows.{name}", [sys.executable, "-m", f"flows.{name}", "--help"])
      for name in registry.available()],
    ("python -m analysis", [sys.executable, "-m", "analysis", "--help"]),
    ("python -m analysis accept", [sys.executable, "-m", "analysis", "accept", "--help"]),
    ("python -m analysis compare", [sys.executable, "-m", "analysis", "compare", "--help"]),
    ("python -m analysis history", [sys.executable, "-m", "analysis", "history", "--help"]),
    ("python -m analysis lts-schema",
     [sys.executable, "-m", "analysis", "lts-schema", "--help"]),
    ("python -m flows.cleanup", [sys.executable, "-m", "flows.cleanup", "--help"]),
    ("python -m flows.replot", [sys.executable, "-m", "flows.replot", "--help"]),
    ("python -m flows.compare", [sys.executable, "-m", "flows.compare", "--help"]),
    ("python -m flows.new_project", [sys.executable, "-m", "flows.new_project", "--help"]),
    ("python -m deployments.automations",
     [sys.executable, "-m", "deployments.automations", "--help"]),
    ("python -m deployments.rbac", [sys.executable, "-m", "deployments.rbac", "--help"]),
    ("python -m deployments.reference",
     [sys.executable, "-m", "deployments.reference", "--help"]),
]


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The block a field holds, walked like every other key (`projects.schema`)."""
    return schema.level_of(annotation).model


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(required)"
    if isinstance(value, dict) and value:  # a table (presets, models): its entries
        return f"entries: {', '.join(map(str, value))}"[:60].replace("|", "\\|")
    text = repr(value) if not isinstance(value, str) else f"`{value}`" if value else "`''`"
    return text.replace("|", "\\|")[:60]


_ABSENT: Any = object()


def keys(model: type[BaseModel], defaults: dict[str, Any] | None = None,
         prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every field of ``model``, nested.

    ``defaults``: the values with no preset applied (the model's defaults merged with the
    project's file, as `projects.config.resolve` builds them); a block shows none.
    """
    defaults = defaults if defaults is not None else schema.defaults_of(model)
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        nested = _nested(field.annotation)
        description = (field.description or (nested.__doc__ or "").strip().splitlines()[0]
                       if nested else field.description or "").replace("|", "\\|")
        value = defaults.get(name, _ABSENT)
        shown = "" if nested is not None and isinstance(value, dict) else _shown(value)
        yield key, _type_name(field.annotation), shown, " ".join(description.split())
        if nested is not None:
            # a block that is off (None) shows what its keys default to once it is set
            yield from keys(nested, value if isinstance(value, dict) else None, f"{key}.")


def config_page() -> str:
    """The configuration reference (Markdown)."""
    out = ["# Configuration reference", "",
           "Generated by `python -m deployments.reference` from the pydantic models that "
           "validate each project's `config.yaml` (do not edit). Keys are dotted paths, as "
           "`--var KEY=VALUE`, presets and PR comments write them. The default is the "
           "project's with no preset: the model's own, or what the project's file sets "
           "instead.", ""]
    for name in registry.available():
        project = registry.load(name)
        out += [f"## {name}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        defaults = resolve(name, env={}).as_dict()
        for key, kind, default, description in keys(project.config_model, defaults):
            out.append(f"| `{key}` | {kind} | {default} | {description} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def cli_page(commands: Sequence[tuple[str, list[str]]] = CLI_COMMANDS) -> str:
    """The CLI reference (Markdown): each command's own ``--help``."""
    out = ["# Command-line reference", "",
           "Generated by `python -m deployments.reference` from each command's `--help` (do "
           "not edit). Every project has the same command line, "
           "`python -m flows.<project>`.", ""]
    for title, argv in commands:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              check=False, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin",
                                                "NO_COLOR": "1"})
        text = (done.stdout or done.stderr).strip()
        out += [f"## `{title}`", "", "```text", text, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the generated pages, or with ``--check`` say which are stale (exit 1)."""
    parser = ArgumentParser(prog="python -m deployments.reference",
                                     description="Write the docs' generated reference pages.")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a generated page differs from what is written")
    args = parser.parse_args(argv)
    pages = {DOCS / "config.md": config_page(), DOCS / "cli.md": cli_page()}
    stale = [path for path, text in pages.items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            say(f"{path} is stale: run python -m deployments.reference", error=True)
        return 1 if stale else 0
    from core.safeio import write_text

    DOCS.mkdir(parents=True, exist_ok=True)
    for path, text in pages.items():
        write_text(path, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
