"""A secret field type for blocks: `pydantic.SecretStr`, accepting a number as its text.

A password written as ``password: 12345`` in a YAML secret file is an integer: a plain
``SecretStr`` refused it with an error that echoed the value to stderr and the Prefect logs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, SecretStr

from core.redact import register_secret

__all__ = ["SecretText"]


def _as_text(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _registered(value: SecretStr) -> SecretStr:
    register_secret(value)  # masked by value at every sink from now on
    return value


SecretText = Annotated[SecretStr, BeforeValidator(_as_text), AfterValidator(_registered)]
"""A `SecretStr` that takes numbers as their text (never echoed in an error), registered
with `core.redact` so that its value is masked wherever it would be written."""
