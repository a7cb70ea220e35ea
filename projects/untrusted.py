"""Values from untrusted sources (PR comments, deployment forms) held to a narrower schema.

A PR comment is written by anyone who can comment on a pull request, and a deployment's form
by anyone who can start a run in the Prefect UI. What they set is checked here, before the
project's own model sees it, against rules that hold for every value of every project:

- **allow-listed keys**: only the key patterns in the project's *base* ``pr_comment.allowed_keys``
  (fnmatch; presets and overrides cannot widen them);
- **declared settings only**: each key and every key inside a mapping value must be a field
  the project's config model declares; a free mapping (``dict[str, ...]``: host filters,
  model tables, tolerations) cannot be set at all, so no value can carry keys nobody
  declared (``hyper_parameters: {output_dir: /elsewhere}``);
- **experiment groups and skip rules** (``test_extra_settings``, ``skip_if``) are lists of
  mappings whose keys must be declared settings of the project's ``test_settings`` model,
  each value checked like a setting of its own;
- **images** (fields typed `core.strict.ImageRef`) only from a registry in
  ``pr_comment.image_registries`` (empty by default: an untrusted source sets no image);
- **bounded text**: strings of at most `MAX_TEXT` characters without control or
  bidirectional-override characters; lists of at most `MAX_LIST` values; a comment of at
  most `MAX_PR_COMMENT` bytes;
- **names, numbers and bools** are then typed by the project's strict model
  (`core.strict.StrictSettings`): names are not paths, numbers are finite and bounded,
  bools are bools, and the matrix the values span is capped (``matrix.max_cells``).
"""

from __future__ import annotations

import fnmatch
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from core.errors import ConfigError
from core.strict import image_registry, kinds_of
from core.terminal import UNSAFE_CHARACTERS
from projects.config import parse_override, resolve
from projects.schema import element_of, is_free_mapping, models_in

__all__ = [
    "MAX_LIST",
    "MAX_PR_COMMENT",
    "MAX_TEXT",
    "UntrustedPolicy",
    "check_untrusted",
    "parse_pr_args",
    "policy_for",
]

MAX_PR_COMMENT = 64 * 1024
"""Largest PR comment read, in bytes (characters, when given as text)."""
MAX_TEXT = 256
"""Longest string an untrusted source may set."""
MAX_LIST = 64
"""Most values in one list an untrusted source may set."""
MAX_DEPTH = 32
"""Deepest nesting of an untrusted value (a deployment form's JSON has no YAML loader)."""

_GROUP_FIELDS = ("test_extra_settings", "skip_if")
"""TestBlock fields holding lists of mappings keyed by dotted paths into test_settings."""


@dataclass(frozen=True)
class UntrustedPolicy:
    """What an untrusted source may set: the project's base ``pr_comment`` block.

    Attributes:
        keys: Key patterns (fnmatch, ``*`` spans dots) it may set.
        image_registries: Registries its images may come from.
        model: The project's config model (the fields it declares).
    """

    keys: tuple[str, ...]
    image_registries: tuple[str, ...] = ()
    model: type[BaseModel] | None = field(default=None, compare=False)


def policy_for(project: str) -> UntrustedPolicy:
    """The untrusted-input policy of a project: its *base* ``pr_comment`` block and model.

    Read without presets, overrides or environment, so none of them can widen it.
    """
    config = resolve(project, env={})
    block = config.model.pr_comment
    return UntrustedPolicy(keys=tuple(block.allowed_keys),
                           image_registries=tuple(block.image_registries),
                           model=type(config.model))


def _kinds(annotation: Any, metadata: Sequence[Any] = ()) -> set[str]:
    found = kinds_of(metadata)
    if typing.get_origin(annotation) is typing.Annotated:
        found |= kinds_of(annotation.__metadata__)
    for arg in typing.get_args(annotation):
        if not isinstance(arg, str | int | float | FieldInfo):
            found |= _kinds(arg)
    return found


class _Checker:
    def __init__(self, policy: UntrustedPolicy, source: str, line: int | None) -> None:
        self.policy = policy
        self.source = source
        self.line = line

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{message} (an untrusted value, from {self.source})",
                           file=self.source, key=key, line=self.line)

    def field(self, model: type[BaseModel], name: str, key: str) -> FieldInfo:
        info = model.model_fields.get(name)
        if info is None:
            raise self.fail(key, f"{name!r} is not a declared setting of {model.__name__}")
        return info

    def value(self, key: str, value: Any, annotation: Any, metadata: Sequence[Any] = (),
              settings: type[BaseModel] | None = None, group: bool = False) -> None:
        if key.count(".") + key.count("[") > MAX_DEPTH:  # a form's JSON is not depth-bounded
            raise self.fail(key.split(".", 1)[0], f"nested deeper than {MAX_DEPTH} levels")
        if group:
            return self.groups(key, value, settings)
        if isinstance(value, Mapping):
            models = models_in(annotation)
            if not models or is_free_mapping(annotation):
                raise self.fail(key, "a mapping cannot be set here (only declared settings, "
                                     "one key at a time)")
            model = models[0]
            for name, item in value.items():
                info = self.field(model, str(name), f"{key}.{name}")
                self.value(f"{key}.{name}", item, info.annotation, info.metadata,
                           settings=_settings_of(model), group=str(name) in _GROUP_FIELDS)
            return
        if isinstance(value, list):
            if len(value) > MAX_LIST:
                raise self.fail(key, f"{len(value)} values: over the {MAX_LIST} accepted")
            inner = element_of(annotation)
            for index, item in enumerate(value):
                self.value(f"{key}[{index}]", item, inner, metadata)
            return
        if isinstance(value, str):
            if len(value) > MAX_TEXT:
                raise self.fail(key, f"{len(value)} characters: over the {MAX_TEXT} accepted")
            bad = next((c for c in value if c in UNSAFE_CHARACTERS), None)
            if bad is not None:
                raise self.fail(key, f"control or bidirectional character U+{ord(bad):04X} "
                                     "in the value")
            if "image" in _kinds(annotation, metadata):
                registry = image_registry(value)
                if registry not in self.policy.image_registries:
                    allowed = ", ".join(self.policy.image_registries) or "none"
                    raise self.fail(key, f"image registry {registry!r} is not allowed "
                                         f"(pr_comment.image_registries: {allowed})")
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, f"{value} is not a finite number")
        if value is not None and not isinstance(value, bool | int | float):
            raise self.fail(key, f"a {type(value).__name__} cannot be set here")

    def groups(self, key: str, value: Any, settings: type[BaseModel] | None) -> None:
        """``test_extra_settings`` / ``skip_if``: mappings of dotted setting → value."""
        if not isinstance(value, list) or len(value) > MAX_LIST:
            raise self.fail(key, f"expected a list of at most {MAX_LIST} mappings")
        if settings is None:
            raise self.fail(key, "this project declares no test_settings")
        for index, entry in enumerate(value):
            where = f"{key}[{index}]"
            if not isinstance(entry, Mapping):
                raise self.fail(where, "expected a mapping of setting: value")
            for dotted, item in entry.items():
                model, parts = settings, str(dotted).split(".")
                for depth, part in enumerate(parts):
                    info = self.field(model, part, f"{where}.{dotted}")
                    if depth < len(parts) - 1:
                        inner = models_in(info.annotation)
                        if not inner:
                            raise self.fail(f"{where}.{dotted}", f"{part!r} has no settings "
                                                                 "below it")
                        model = inner[0]
                self.value(f"{where}.{dotted}", item, info.annotation, info.metadata)


def _settings_of(model: type[BaseModel]) -> type[BaseModel] | None:
    info = model.model_fields.get("test_settings")
    found = models_in(info.annotation) if info is not None else []
    return found[0] if found else None


def check_untrusted(key: str, value: Any, policy: UntrustedPolicy, *, source: str,
                    line: int | None = None) -> None:
    """Check one untrusted override against the policy and the declared settings.

    Args:
        key: The dotted key it sets.
        value: Its value, parsed.
        policy: The project's `UntrustedPolicy`.
        source: Where it came from (``PR comment``, ``deployment form``), for the message.
        line: Its line in the source, when known.

    Raises:
        ConfigError: The key is not allowed or not declared, or the value breaks a rule of
            the module docstring; one line with the source, line and key.
    """
    checker = _Checker(policy, source, line)
    if not any(fnmatch.fnmatchcase(key, p) for p in policy.keys):
        raise ConfigError(f"a PR comment or deployment form may not set {key!r}; allowed "
                          f"(pr_comment.allowed_keys): {', '.join(policy.keys) or '(nothing)'}",
                          file=source, line=line)
    if policy.model is None:
        return
    model: type[BaseModel] = policy.model
    parts = key.split(".")
    settings = None
    for depth, part in enumerate(parts):
        info = checker.field(model, part, key)
        if depth == len(parts) - 1:
            checker.value(key, value, info.annotation, info.metadata, settings=settings,
                          group=part in _GROUP_FIELDS)
            return
        inner = models_in(info.annotation)
        if not inner:
            raise checker.fail(key, f"{part!r} has no settings below it")
        model = inner[0]
        settings = _settings_of(model) or settings


def parse_pr_args(text: str, policy: UntrustedPolicy | None, *,
                  source: str = "PR comment") -> dict[str, Any]:
    """Extract ``/var key: value`` lines from a PR comment into checked overrides.

    Other lines (``/test ...``, prose) are ignored; values are parsed as untrusted YAML (no
    aliases, bounded, at most 64 levels deep), then held to `check_untrusted`.

    Args:
        text: The comment body (at most `MAX_PR_COMMENT` characters).
        policy: What a comment may set (None: anything, for trusted callers and tests of
            the syntax alone).
        source: Name used in error messages.

    Returns:
        Dotted key → value, in comment order (a later line wins).

    Raises:
        ConfigError: An oversized comment, a ``/var`` line without ``key: value``, or a
            value `check_untrusted` refuses, with its line number.
    """
    if len(text) > MAX_PR_COMMENT:
        raise ConfigError(f"{len(text)} characters: over the {MAX_PR_COMMENT} accepted in a "
                          "PR comment", file=source)
    out: dict[str, Any] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line.startswith("/var"):
            continue
        rest = line[len("/var") :]
        if rest and not rest[0].isspace():
            continue  # e.g. "/variable" is not our command
        key, sep, value = rest.strip().partition(":")
        key = key.strip()
        if not sep or not key or " " in key:
            raise ConfigError(f"expected '/var key: value', got {line[:80]!r}", file=source,
                              line=lineno)
        parsed = parse_override(key, value.strip())
        if policy is not None:
            check_untrusted(key, parsed, policy, source=source, line=lineno)
        out[key] = parsed
    return out
