"""Safe YAML reading with line numbers, duplicate-key refusal and clear errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigError
from core.redact import redact
from core.safeio import UnreadableInputError, read_text_bounded

__all__ = ["MAX_UNTRUSTED_YAML", "MAX_YAML_DEPTH", "MAX_YAML_FILE", "LineMap", "dump_yaml",
           "load_documents", "load_yaml", "load_yaml_text"]

LineMap = dict[str, int]
"""Dotted key path -> 1-based line where that key is written."""


_SafeBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster


class _Loader(_SafeBase):  # type: ignore[valid-type,misc]
    """Safe loader: duplicate keys refused, YAML 1.2's booleans (only true and false).

    PyYAML silently keeps the last of two equal keys. It resolves YAML 1.1's yes/no/on/off
    (and y/n) to booleans too: ``--var analysis.validity.mode=off`` arrived as False and was
    refused as "not 'off'", and a label ``NO`` or ``on`` silently turned into a bool. Every
    YAML Telltale reads (config files, presets, ``--var``, PR comments, result trees) goes
    through here.
    """


_BOOL_TAG = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in _SafeBase.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


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


MAX_YAML_DEPTH = 64
"""Deepest nesting of mappings and lists accepted in any YAML (a config is ~8 deep).

Deeper documents are refused before they are built: composing and constructing recurse, and
300 levels of block-style YAML (46 KB) ended in a 3 000-line `RecursionError`."""

MAX_YAML_FILE = 16 * 1024 * 1024
"""Largest YAML file read at all (project configs, saved configs, secrets), in bytes."""

_SafeParser: type = getattr(yaml, "CBaseLoader", None) or yaml.BaseLoader  # libyaml's events


def _scan(text: str, source: str, *, aliases: bool) -> None:
    """Refuse too deep nesting and (untrusted) anchors/aliases, before anything is built.

    libyaml's parser is a state machine: its event stream is produced without recursion,
    so this walk is linear in the text and safe on any input. Aliases are how a few bytes
    expand to gigabytes (a 372-byte alias bomb held 3.9 GB).
    """
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_SafeParser):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ConfigError(f"nested deeper than {MAX_YAML_DEPTH} levels",
                                      file=source, line=event.start_mark.line + 1)
                if not aliases and event.anchor is not None:
                    raise ConfigError("YAML anchors and aliases (&x / *x) are not accepted "
                                      "here", file=source, line=event.start_mark.line + 1)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif not aliases and (isinstance(event, yaml.AliasEvent) or (
                    isinstance(event, yaml.ScalarEvent) and event.anchor is not None)):
                raise ConfigError("YAML anchors and aliases (&x / *x) are not accepted here",
                                  file=source, line=event.start_mark.line + 1)
    except yaml.MarkedYAMLError as exc:
        raise _malformed(exc, source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {_one_line(str(exc))}", file=source) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _malformed(exc: yaml.MarkedYAMLError, source: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    problem = exc.problem or exc.context or "malformed YAML"
    return ConfigError(f"malformed YAML: {_one_line(problem)}", file=source, line=line)


def load_documents(text: str) -> list[Any]:
    """Every document of a pinned, trusted YAML text (upstream CRDs and OpenAPI documents).

    PyYAML's safe loading as it is (libyaml's, ~5x faster on the 3.5 MB of CRDs the tests
    read), without `load_yaml_text`'s line map, duplicate-key refusal and YAML 1.2 booleans:
    those are for what users write.
    """
    return list(yaml.load_all(text, Loader=_SafeBase))


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
        ConfigError: Malformed YAML, a duplicate key, nesting deeper than `MAX_YAML_DEPTH`,
            or (untrusted) an alias or oversized text, with the source and line: one line.
    """
    if untrusted and len(text) > MAX_UNTRUSTED_YAML:
        raise ConfigError(f"{len(text)} characters of YAML: over the {MAX_UNTRUSTED_YAML} "
                          "accepted from a user", file=source)
    _scan(text, source, aliases=not untrusted)
    loader = _Loader(text)
    loader._telltale_file = source  # type: ignore[attr-defined]
    try:
        node = loader.get_single_node()
        lines: LineMap = {}
        _line_map(node, "", lines)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise _malformed(exc, source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {_one_line(str(exc))}", file=source) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. a timestamp in year 0
        raise ConfigError(f"malformed YAML: {_one_line(str(exc))}", file=source) from None
    finally:
        loader.dispose()
    return data, lines


def load_yaml(path: str | Path, *, untrusted: bool = False,
              follow_links: bool = True) -> tuple[Any, LineMap]:
    """Read a YAML file safely (the bounded reader, then `load_yaml_text`).

    Args:
        path: The file: a regular file (a FIFO or device is refused, never waited on).
        untrusted: A user's or a results tree's file: at most 4 x `MAX_UNTRUSTED_YAML`
            bytes, no aliases. Others are capped at `MAX_YAML_FILE`.
        follow_links: Follow a symbolic link (off for files inside a results tree).

    Raises:
        ConfigError: The file is missing, unreadable, not a regular file, oversized or
            malformed, in one line.
    """
    path = Path(path)
    cap = MAX_UNTRUSTED_YAML * 4 if untrusted else MAX_YAML_FILE
    try:
        text = read_text_bounded(path, cap, what="YAML", follow_links=follow_links)
    except UnreadableInputError as exc:
        raise ConfigError(exc.reason, file=str(path)) from None
    return load_yaml_text(text, source=str(path), untrusted=untrusted)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """SafeDumper that never writes anchors/aliases (shared objects are written out again).

    libyaml's emitter where PyYAML has it: the pure-Python one was ~4x slower (a Kubernetes
    plan's manifests and saved config: 37 of its 85 ms). The two wrap long double-quoted
    strings at different places; what they write loads back to the same data.
    """

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any, *, redacted: bool = True) -> str:
    """Serialise ``data`` as block-style YAML keeping key order, without aliases.

    Args:
        data: The structure.
        redacted: Mask secrets by key and by value (`core.redact.redact`): every YAML
            artifact is a sink. Only a file that must hold a credential (an install config,
            written private) passes False.
    """
    return yaml.dump(redact(data) if redacted else data, Dumper=_Dumper, sort_keys=False,
                     default_flow_style=False, allow_unicode=True)
