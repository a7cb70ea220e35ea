"""The config model is the schema: which dotted keys exist, and their defaults.

One walker over a pydantic config model answers every "does this key exist?" question — the
resolver's presets, overrides and environment (`projects.config`), untrusted input
(`projects.untrusted`), the configuration reference (`deployments.reference`) — and builds
the tree of defaults a project's ``config.yaml`` is merged over. A project's file holds only
what differs from the model; no placeholder makes a key exist.

Levels of a path:

- a **model** (a `BaseModel` class): its fields are the keys;
- a **free mapping** (``dict[str, X]``: host filters, model tables, presets): any key, each
  value of type ``X``;
- a **leaf** (a number, a name, a list): no key below it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo, PydanticUndefined

__all__ = ["NO_DEFAULT", "Level", "UndeclaredKeyError", "default_of", "defaults_of", "element_of",
           "is_free_mapping", "level_at", "level_of", "models_in"]


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic model classes an annotation admits (through Optional, unions, lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += models_in(arg)
    return out


def is_free_mapping(annotation: Any) -> bool:
    """True for ``Any``, ``dict`` and ``dict[str, X]`` (through Optional and Annotated)."""
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is dict or origin in (dict, Mapping):
        return True
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(is_free_mapping(a) for a in typing.get_args(annotation)
                   if not isinstance(a, FieldInfo))
    return False


def _mapping_value(annotation: Any) -> Any:
    """The value annotation of the free mapping in ``annotation`` (``Any`` when untyped)."""
    origin = typing.get_origin(annotation)
    if origin in (dict, Mapping):
        args = typing.get_args(annotation)
        return args[1] if len(args) == 2 else Any
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            if not isinstance(arg, FieldInfo) and is_free_mapping(arg):
                return _mapping_value(arg)
    return Any


def element_of(annotation: Any) -> Any:
    """The element annotation of a list in ``annotation`` (``X | list[X]`` → ``X``)."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return typing.get_args(annotation)[0]
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if typing.get_origin(arg) is list:
                return typing.get_args(arg)[0]
        scalars = [a for a in typing.get_args(annotation) if a is not type(None)]
        return scalars[0] if len(scalars) == 1 else annotation
    return annotation


@dataclass(frozen=True)
class Level:
    """What a dotted path of a config model holds.

    Attributes:
        model: The model whose fields are the keys here (None: a free mapping or a leaf).
        free: Any key is allowed here (a ``dict[str, X]``).
        annotation: The path's annotation (the value's type).
        field: The field the path ends on (None for the root or a free mapping's entry).
    """

    model: type[BaseModel] | None
    free: bool
    annotation: Any
    field: FieldInfo | None = None

    @property
    def keys(self) -> list[str]:
        """The declared keys here (empty for a free mapping or a leaf)."""
        return list(self.model.model_fields) if self.model is not None else []

    @property
    def is_leaf(self) -> bool:
        """True when nothing can be set below this path."""
        return self.model is None and not self.free


def level_of(annotation: Any, info: FieldInfo | None = None) -> Level:
    """What a value of ``annotation`` is: a block (its model), a free mapping, or a leaf."""
    if is_free_mapping(annotation):
        return Level(None, True, annotation, info)
    models = models_in(annotation)
    # a list of models (skip rules, groups) is a value set whole, not keys to walk
    if models and typing.get_origin(annotation) is not list:
        return Level(models[0], False, annotation, info)
    return Level(None, False, annotation, info)


class UndeclaredKeyError(KeyError):
    """A path the model does not declare: ``depth`` is the index of the first bad part."""

    def __init__(self, depth: int, level: Level) -> None:
        super().__init__(depth)
        self.depth = depth
        self.level = level


def level_at(model: type[BaseModel], parts: Sequence[str]) -> Level:
    """The level a dotted path (as parts) reaches in ``model``.

    Raises:
        UndeclaredKeyError: A part the level above does not declare, or a part below a leaf;
            it carries the index of that part and the level that refused it.
    """
    level = Level(model, False, model)
    for depth, part in enumerate(parts):
        if level.free:
            level = level_of(_mapping_value(level.annotation), None)
        elif level.model is not None and part in level.model.model_fields:
            info = level.model.model_fields[part]
            level = level_of(info.annotation, info)
        else:
            raise UndeclaredKeyError(depth, level)
    return level


NO_DEFAULT: Any = PydanticUndefined
"""What `default_of` returns for a field without a default."""

_PLAIN = TypeAdapter(Any)


def default_of(info: FieldInfo) -> Any:
    """A field's default as plain data, as declared (`NO_DEFAULT` when it has none)."""
    factory = info.default_factory
    if isinstance(factory, type) and issubclass(factory, BaseModel):
        return defaults_of(factory)  # as declared: an instance would hold validated values
    if factory is not None:
        value = factory()  # type: ignore[call-arg]
    elif info.default is not PydanticUndefined:
        value = info.default
    else:
        return NO_DEFAULT
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return _PLAIN.dump_python(value, mode="json")


def defaults_of(model: type[BaseModel]) -> dict[str, Any]:
    """The tree of a model's defaults: every field that has one, as plain data.

    A required field of a model type contributes its own defaults (the file supplies the
    rest); a required scalar is left out (the file must set it: validation says so).
    Defaults are taken as declared (not validated): ``1`` stays ``1``, as a file writes it.
    """
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        value = default_of(info)
        if value is NO_DEFAULT:
            level = level_of(info.annotation, info)
            if level.model is None:
                continue
            value = defaults_of(level.model)
        out[name] = value
    return out
