"""Applying a config's sources in order, each key checked against the model.

The base is merged over the model's defaults, then presets (``extends`` where it appears),
overrides and environment are assigned, each key checked against the model
(`projects.schema`) and who set it recorded.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from core.errors import ConfigError, did_you_mean
from core.yamlio import LineMap
from projects.schema import UndeclaredKeyError, level_at

_MISSING: Any = object()
_PRESETS_KEY = "ci_presets"
_EXTENDS = "extends"


def _split(path: str) -> list[str]:
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ConfigError(f"invalid key path {path!r}")
    return parts


def _closest(word: str, choices: Iterable[str]) -> str:
    names = sorted(str(c) for c in choices)
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.5)
    if close:
        return f"closest: {', '.join(close)}"
    if len(names) <= 12:
        return f"valid keys here: {', '.join(names) or '(none)'}"
    return f"{len(names)} keys exist at this level"


def _lookup(data: Any, parts: Sequence[str]) -> Any:
    node = data
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _merged(defaults: Any, written: Any) -> Any:
    """``written`` over ``defaults``, mapping by mapping (any other value: ``written`` wins)."""
    if isinstance(defaults, dict) and isinstance(written, Mapping):
        out = dict(defaults)
        for key, value in written.items():
            out[key] = _merged(defaults[key], value) if key in defaults \
                else copy.deepcopy(value)
        return out
    return copy.deepcopy(written)


class _Resolver:
    """Applies sources to a working copy and records who set each key.

    With a model, a key exists when the model declares it (`projects.schema.level_at`);
    without one (a bare YAML file), when the data holds it.
    """

    def __init__(self, data: dict[str, Any], file: str, lines: LineMap,
                 model: type[BaseModel] | None = None) -> None:
        self.data = data
        self.file = file
        self.lines = lines
        self.model = model
        self.sources: dict[str, str] = {}
        self.presets_applied: list[str] = []

    def _unknown(self, parts: Sequence[str], depth: int, keys: Iterable[str], source: str,
                 where: str | None) -> ConfigError:
        parent = ".".join(parts[:depth]) or "the top level"
        if self.model is None:
            why = f"{_closest(parts[depth], keys)}; presets and overrides cannot create keys"
        else:
            keys = list(keys)
            why = _closest(parts[depth], keys) if keys else f"{parent} has no keys below it"
        return ConfigError(f"unknown key (set by {source}): no {parts[depth]!r} under "
                           f"{parent} ({why})", file=self.file, key=where or ".".join(parts),
                           line=self.lines.get(where or ""))

    def _declared(self, parts: Sequence[str], depth: int, source: str,
                  where: str | None) -> bool:
        """Whether the model declares ``parts[:depth + 1]`` with keys below it.

        Raises:
            ConfigError: The model declares no such key (or there is no model).
        """
        if self.model is None:
            return False
        try:
            level = level_at(self.model, parts[:depth + 1])
        except UndeclaredKeyError as exc:
            raise self._unknown(parts, exc.depth, exc.level.keys, source, where) from None
        return not level.is_leaf

    def assign(self, path: str, value: Any, source: str, *, where: str | None = None) -> None:
        parts = _split(path)
        node: Any = self.data
        for depth, part in enumerate(parts):
            if not isinstance(node, dict):
                parent = ".".join(parts[:depth])
                raise ConfigError(
                    f"cannot set {path!r} from {source}: {parent!r} is a "
                    f"{type(node).__name__}, not a mapping",
                    file=self.file,
                    key=where or path,
                    line=self.lines.get(where or ""),
                )
            last = depth == len(parts) - 1
            if part not in node:
                branch = self._declared(parts, depth, source, where)
                if self.model is None:
                    raise self._unknown(parts, depth, node.keys(), source, where)
                if not last:
                    if not branch:
                        raise self._unknown(parts, depth + 1, [], source, where)
                    node[part] = {}
            elif not last and node[part] is None and self.model is not None:
                if not self._declared(parts, depth, source, where):
                    raise self._unknown(parts, depth + 1, [], source, where)
                node[part] = {}  # a block that is off (None) gets its first key
            if last:
                node[part] = copy.deepcopy(value)
            else:
                node = node[part]
        self.sources[path] = source

    def presets(self) -> Mapping[str, Any]:
        presets = self.data.get(_PRESETS_KEY) or {}
        if not isinstance(presets, Mapping):
            raise ConfigError("must be a mapping of preset name → settings", file=self.file,
                              key=_PRESETS_KEY, line=self.lines.get(_PRESETS_KEY))
        return presets

    def apply_preset(self, name: str, stack: tuple[str, ...] = ()) -> None:
        presets = self.presets()
        if name in stack:
            cycle = " -> ".join((*stack[stack.index(name) :], name))
            raise ConfigError(f"preset cycle: {cycle}", file=self.file,
                              key=f"{_PRESETS_KEY}.{stack[-1]}.{_EXTENDS}",
                              line=self.lines.get(f"{_PRESETS_KEY}.{stack[-1]}.{_EXTENDS}"))
        if name not in presets:
            via = f" (extended by {stack[-1]!r})" if stack else ""
            available = ", ".join(sorted(presets)) or "(none)"
            raise ConfigError(f"unknown preset {name!r}{via}{did_you_mean(name, presets)}; "
                              f"available presets: {available}", file=self.file)
        body = presets[name] or {}
        base = f"{_PRESETS_KEY}.{name}"
        if not isinstance(body, Mapping):
            raise ConfigError("a preset must be a mapping of dotted key: value", file=self.file,
                              key=base, line=self.lines.get(base))
        # Child first, then its parents: the order the field records (and its run metadata).
        self.presets_applied.append(name)
        for key, value in body.items():
            if key == _EXTENDS:
                parents = [value] if isinstance(value, str) else value
                if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
                    raise ConfigError("extends must be a preset name or a list of names",
                                      file=self.file, key=f"{base}.{_EXTENDS}",
                                      line=self.lines.get(f"{base}.{_EXTENDS}"))
                for parent in parents:
                    self.apply_preset(parent, (*stack, name))
                continue
            self.assign(str(key), value, f"preset {name!r}", where=f"{base}.{key}")


def _data_path(data: Any, loc: Sequence[Any]) -> str:
    """Keep the parts of a pydantic error location that are real keys (not union tags)."""
    parts: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, Mapping) and not parts[-1:] == [str(part)]:
            parts.append(str(part))  # a missing required key: still part of the path
            break
        else:
            continue
        parts.append(str(part))
    return ".".join(parts)
