"""Small helpers on nested settings shared by reports and comparisons."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flatten_settings"]


def flatten_settings(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted keys (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_settings(value, f"{path}."))
        else:
            out[path] = value
    return out
