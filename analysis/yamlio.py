"""Safe YAML reading with line numbers, duplicate-key refusal and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from analysis.errors import ConfigError

__all__ = ["MAX_UNTRUSTED_YAML", "LineMap", "dump_yaml", "load_yaml", "load_yaml_text"]

LineMap = dict[str, int]
"""Dotted key path -> 1-based line where that key is written."""


_SafeBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster


class _Loader(_SafeBase):  # type: ignore[valid-type,misc]
    """Safe loader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(
                f"duplicate key {key!r} (first written on line {seen[key]})",
                file=getattr(loader, "_telltale_file", None),
                line=line,
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_map(node: yaml.Node | None, prefix: str, out: LineMap) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            out[path] = key_node.start_mark.line + 1
            _line_map(value_node, path, out)


MAX_UNTRUSTED_YAML = 256 * 1024
"""Largest YAML text accepted from a user (``--var``, PR comment, vars file), in characters."""


def _refuse_aliases(node: yaml.Node | None, source: str) -> None:
    """Refuse anchors/aliases: in untrusted text they are how a few bytes expand to gigabytes.

    An alias is the same composed node reached twice; the walk visits each node once, so it
    stays linear in the text's size whatever the aliases would expand to.
    """
    seen: set[int] = set()
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if id(current) in seen:
            raise ConfigError("YAML anchors and aliases (&x / *x) are not accepted here",
                              file=source, line=current.start_mark.line + 1)
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                stack += [key, value]
        elif isinstance(current, yaml.SequenceNode):
            stack += current.value


def load_yaml_text(text: str, *, source: str = "<string>",
                   untrusted: bool = False) -> tuple[Any, LineMap]:
    """Parse YAML text safely and map each dotted key path to its line.

    Args:
        text: The YAML document.
        source: A name for error messages (a file path, ``--var x``...).
        untrusted: The text comes from a user or a PR comment: refuse aliases and text over
            `MAX_UNTRUSTED_YAML` characters (a 372-byte alias bomb held 3.9 GB).

    Returns:
        The parsed data and its `LineMap`.

    Raises:
        ConfigError: Malformed YAML, a duplicate key, or (untrusted) an alias or oversized
            text, with the source and line.
    """
    if untrusted and len(text) > MAX_UNTRUSTED_YAML:
        raise ConfigError(f"{len(text)} characters of YAML: over the {MAX_UNTRUSTED_YAML} "
                          "accepted from a user", file=source)
    loader = _Loader(text)
    loader._telltale_file = source  # type: ignore[attr-defined]
    try:
        node = loader.get_single_node()
        if untrusted:
            _refuse_aliases(node, source)
        lines: LineMap = {}
        _line_map(node, "", lines)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(f"malformed YAML: {problem}", file=source, line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", file=source) from None
    finally:
        loader.dispose()
    return data, lines


def load_yaml(path: str | Path, *, untrusted: bool = False) -> tuple[Any, LineMap]:
    """Read a YAML file safely; see `load_yaml_text`.

    Raises:
        ConfigError: The file is missing, unreadable, oversized (untrusted) or malformed.
    """
    path = Path(path)
    try:
        if untrusted and path.stat().st_size > MAX_UNTRUSTED_YAML * 4:
            raise ConfigError(f"over the {MAX_UNTRUSTED_YAML} characters of YAML accepted "
                              "from a user", file=str(path))
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None
    return load_yaml_text(text, source=str(path), untrusted=untrusted)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that never writes anchors/aliases (shared objects are written out again)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any) -> str:
    """Serialise ``data`` as block-style YAML keeping key order, without aliases."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)
