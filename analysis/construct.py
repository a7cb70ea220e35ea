"""Pydantic models built from values that are already typed, at a quarter of the cost.

Post-processing makes ~30 objects a run (KPIs, their LTS copies, verdict rows): 30 000 for a
1 000-run tree. They are built with ``model_construct`` (validation copied the label dicts the
KPIs of a run share, and held a fields set each), and ``model_construct`` itself, a Python loop
over the fields with alias and default handling, was the largest single cost of a warm
``python -m analysis`` (~13 µs an object here, ~3.5 µs this way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["constructor"]

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


def constructor(cls: type[M]) -> Callable[..., M]:
    """A function making ``cls`` instances from every field's value, given by name.

    It sets what ``cls.model_construct(**values)`` sets when every field is given: the
    instance dict, the fields set (one set shared by every instance: all fields are in it,
    so pydantic's ``add`` on assignment changes nothing), no extra and no private values. A
    model for which that is not the whole story (aliases, a post-init hook, extra fields,
    private attributes, a root model) gets ``model_construct`` itself. A call without every
    field, or with another name, raises TypeError: never a half-built object.
    """
    fields = cls.model_fields
    if (any(f.alias is not None for f in fields.values()) or cls.__pydantic_post_init__
            or cls.__pydantic_root_model__ or cls.model_config.get("extra") == "allow"
            or cls.__private_attributes__):
        return lambda **values: cls.model_construct(**values)
    names = set(fields)
    keys = frozenset(names)

    def make(**values: Any) -> M:
        if values.keys() != keys:
            raise TypeError(f"{cls.__name__} needs exactly its fields: missing "
                            f"{sorted(keys - values.keys())}, unknown "
                            f"{sorted(values.keys() - keys)}")
        instance = cls.__new__(cls)
        _set(instance, "__dict__", values)
        _set(instance, "__pydantic_fields_set__", names)
        _set(instance, "__pydantic_extra__", None)
        _set(instance, "__pydantic_private__", None)
        return instance

    return make
