"""Secret redaction shared by every layer that writes or logs user data."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import SecretBytes, SecretStr

__all__ = ["REDACTED", "is_secret_key", "redact", "redact_text"]

REDACTED = "***"

# Key names whose values are credentials. Matched on the last dotted component, case-insensitive.
_SECRET_KEY = re.compile(
    r"(?i)(^|_)(password|passwd|secret|secret_key|token|auth_token|api_key|apikey|"
    r"access_key|access_key_id|secret_access_key|private_key|credentials?|bearer)$"
)


def is_secret_key(key: str) -> bool:
    """Tell whether a mapping key names a credential (``password``, ``aws_secret_access_key``...).

    Args:
        key: A mapping key or dotted path; only the last component is checked.

    Returns:
        True when values under this key must never be written or logged.
    """
    return bool(_SECRET_KEY.search(str(key).rsplit(".", 1)[-1]))


_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")


def redact_text(text: str) -> str:
    """Mask the password of every URL in ``text`` (``https://u:pw@host`` → ``u:***@``)."""
    return _URL_PASSWORD.sub(rf"\1{REDACTED}@", text)


def redact(value: Any, *, extra_secrets: frozenset[str] = frozenset()) -> Any:
    """Return a deep copy of ``value`` with every secret replaced by ``***``.

    Secrets are `SecretStr`/`SecretBytes` values, values under a key `is_secret_key` matches,
    passwords inside URLs (by value, whatever the key: ``endpoint_url:
    https://user:pw@host``), and any string equal to one of ``extra_secrets`` (secret values
    read at run time).

    Args:
        value: Any JSON/YAML-like structure (mappings, sequences, scalars).
        extra_secrets: Known secret strings to mask wherever they appear as whole values.

    Returns:
        The redacted copy; ``value`` itself is left untouched.
    """
    if isinstance(value, SecretStr | SecretBytes):
        return REDACTED
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if is_secret_key(str(key)) and item not in (None, "", [], {}) and not isinstance(
                item, Mapping
            ):
                out[key] = REDACTED
            else:
                out[key] = redact(item, extra_secrets=extra_secrets)
        return out
    if isinstance(value, list | tuple):
        return type(value)(redact(v, extra_secrets=extra_secrets) for v in value)
    if isinstance(value, str):
        return REDACTED if value in extra_secrets else redact_text(value)
    return value
