"""Matrix expansion: test settings → the list of cells a test runs (DESIGN §5).

- Every list-valued setting is a dimension; cells are the Cartesian product, in key order.
  Nested mappings (``hyper_parameters``) are walked; a ``raw_lists: [k, ...]`` entry inside a
  mapping keeps those keys' lists as values instead of dimensions (and is itself dropped).
- ``test_extra_settings`` (a list of mappings, dotted keys allowed) gives experiment groups:
  each is merged over the base settings, then expanded. An empty list means one group.
- ``skip_if`` (a list of mappings of dotted key → value) marks a cell skipped when it matches
  every pair of one entry; skipped cells are counted, never failed.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from analysis.matrix_utils import flatten_settings as flatten
from core.errors import ConfigError

__all__ = ["Cell", "canonical_settings", "expand", "flatten", "settings_hash", "unflatten"]

_RAW_LISTS = "raw_lists"
_M = TypeVar("_M", bound=BaseModel)


class Cell(BaseModel):
    """One point of the matrix."""

    index: int = Field(description="0-based position in the matrix.")
    name: str = Field(description="Short name: the values that vary, or 'base'.")
    group: int = Field(description="Index of the test_extra_settings group (0 when none).")
    settings: dict[str, Any] = Field(description="Fully expanded settings (no dimension left).")
    skip_reason: str | None = Field(default=None, description="Why the cell is skipped.")
    typed: Any = Field(default=None, exclude=True, repr=False, description="The settings as "
                       "the project's model validated them at plan time (not serialised).")

    def typed_as(self, model: type[_M]) -> _M:
        """The cell's settings as ``model`` types them: the object the plan validated.

        Every step after the plan reads this one object (the workload's input file is built
        from it); a cell read back from a file (no plan) is validated here, once.
        """
        if not isinstance(self.typed, model):
            self.typed = model.model_validate(self.settings)
        return self.typed


def canonical_settings(settings: Any) -> Any:
    """A cell's settings as they identify it: ``None`` (not set) left out, the rest as written.

    A setting the model declares but nobody set is ``None`` whether the file named it or not,
    so it never changes the identity; numbers keep the form they were written in (``1`` is
    not ``1.0``: the labels a history matches on are that text).
    """
    if isinstance(settings, Mapping):
        return {str(k): canonical_settings(v) for k, v in settings.items() if v is not None}
    if isinstance(settings, list | tuple):
        return [canonical_settings(v) for v in settings]
    return settings


def settings_hash(settings: Mapping[str, Any]) -> str:
    """Identity of a cell's settings (resume compares it): a hash of `canonical_settings`."""
    text = json.dumps(canonical_settings(settings), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def unflatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of `flatten`."""
    out: dict[str, Any] = {}
    for path, value in data.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _raw_list_keys(settings: Mapping[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in settings.items():
        if key == _RAW_LISTS and isinstance(value, list):
            keys.update(f"{prefix}{name}" for name in value)
        elif isinstance(value, Mapping):
            keys |= _raw_list_keys(value, f"{prefix}{key}.")
    return keys


def _merge_group(base: dict[str, Any], group: Mapping[str, Any], index: int) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for dotted, value in group.items():
        parts = str(dotted).split(".")
        node = merged
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(
                    f"test_extra_settings[{index}]: unknown setting {dotted!r} "
                    f"(valid: {', '.join(sorted(base))})"
                )
            if depth == len(parts) - 1:
                node[part] = copy.deepcopy(value)
            else:
                node = node[part]
    return merged


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _skip_reason(flat: Mapping[str, Any], skip_if: Sequence[Mapping[str, Any]]) -> str | None:
    for index, rule in enumerate(skip_if):
        if rule and all(k in flat and flat[k] == v for k, v in rule.items()):
            pairs = ", ".join(f"{k}={v}" for k, v in rule.items())
            return f"skip_if[{index}]: {pairs}"
    return None


def expand(
    test_settings: Mapping[str, Any],
    test_extra_settings: Sequence[Mapping[str, Any]] = (),
    skip_if: Sequence[Mapping[str, Any]] = (),
    *,
    max_cells: int | None = None,
) -> list[Cell]:
    """Expand settings into cells.

    Args:
        test_settings: The base settings (lists are dimensions).
        test_extra_settings: Experiment groups merged over the base, dotted keys allowed.
        skip_if: Rules marking cells skipped.
        max_cells: Refuse a matrix of more cells (``matrix.max_cells``), counted before
            anything is expanded: three lists of 100 values are 10^6 cells.

    Returns:
        The cells, in order (group, then Cartesian product in key order).

    Raises:
        ConfigError: A group names a setting that does not exist, a dimension is empty, or
            the matrix has more than ``max_cells`` cells (the count and the settings that
            multiply are named).

    Example:
        >>> [c.name for c in expand({"a": [1, 2], "b": 3})]
        ['a=1', 'a=2']
    """
    groups: Sequence[Mapping[str, Any]] = list(test_extra_settings) or [{}]
    prepared = []
    total = 0
    sizes: dict[str, int] = {}
    for group_index, group in enumerate(groups):
        if not isinstance(group, Mapping):
            raise ConfigError(f"test_extra_settings[{group_index}] must be a mapping")
        merged = _merge_group(dict(test_settings), group, group_index)
        raw = _raw_list_keys(merged)
        flat = {k: v for k, v in flatten(merged).items() if _short(k) != _RAW_LISTS}
        dims = [k for k, v in flat.items() if isinstance(v, list) and k not in raw]
        for key in dims:
            if not flat[key]:
                raise ConfigError(f"setting {key!r} is an empty list: a dimension needs values")
            sizes[key] = max(sizes.get(key, 0), len(flat[key]))
        total += math.prod(len(flat[k]) for k in dims)
        prepared.append((group_index, group, flat, dims))
    if max_cells is not None and total > max_cells:
        factors = " x ".join(f"{k} ({n})" for k, n in sizes.items() if n > 1)
        groups_part = f" over {len(groups)} test_extra_settings groups" if len(groups) > 1 else ""
        raise ConfigError(f"the matrix has {total} cells, over matrix.max_cells ({max_cells}): "
                          f"{factors or 'no list'}{groups_part} multiply; shorten a list or "
                          "raise matrix.max_cells")
    cells: list[Cell] = []
    for group_index, group, flat, dims in prepared:
        varying = [k for k in dims if len(flat[k]) > 1]
        for combo in itertools.product(*(flat[k] for k in dims)):
            values = dict(flat)
            values.update(zip(dims, combo, strict=True))
            label = ",".join(f"{_short(k)}={values[k]}" for k in varying)
            if len(groups) > 1:
                extra = ",".join(f"{_short(k)}={v}" for k, v in group.items())
                label = ",".join(x for x in (extra, label) if x)
            cells.append(Cell(
                index=len(cells),
                name=label or "base",
                group=group_index,
                settings=unflatten(values),
                skip_reason=_skip_reason(values, skip_if),
            ))
    return cells
