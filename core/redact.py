"""Secret redaction at every sink: files, caches, exports, Prefect artifacts, log lines.

Two rules, applied in one place each sink goes through:

- **by key**: a value under a key that names a credential (`is_secret_key`: ``password``,
  ``api_key``, ``hf_token``...) is masked in every structure written (`redact`, which
  `core.yamlio.dump_yaml` and `core.safeio.write_json` apply). Secret *references*
  are not secrets: the values of the config's top-level ``secrets`` block are file or block
  names, kept so that a crash hook can still find the credentials and release a lease;
- **by value**: every secret value Telltale reads (secret files, Prefect Secret blocks, a
  value given under a secret-named key) is registered (`register_secret`) and masked wherever
  it appears, whole or inside a longer text, in every file `core.safeio` writes and
  every log line that passes `RedactingFilter`;
- **by shape**: credentials inside URLs (user info, secret-named query and fragment
  parameters) and ``Bearer``/``Basic`` authorization values, in any text (`url_secrets`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import SecretBytes, SecretStr

__all__ = ["REDACTED", "REFERENCE_BLOCKS", "RedactingFilter", "is_secret_key",
           "key_words", "known_secrets", "redact", "redact_bytes", "redact_text",
           "register_secret", "register_secrets_in", "restore_secrets", "url_password",
           "url_secrets"]

REDACTED = "***"

# Key names whose values are credentials: the *last words* of a key, whatever its style —
# snake (``hf_token``), kebab (``X-Api-Key``), camel (``accessToken``), upper
# (``AWS_SECRET_ACCESS_KEY``), dotted paths (``a.b.password``). Plural or longer words are
# not credentials (``max_tokens``, ``tokenizer``; ``secret_name`` names a reference).
_SECRET_SUFFIXES: tuple[tuple[str, ...], ...] = (
    ("password",), ("passwd",), ("passphrase",), ("pwd",), ("secret",), ("token",),
    ("apikey",), ("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"),
    ("session", "key"), ("signing", "key"), ("credential",), ("credentials",), ("bearer",),
    ("authorization",), ("auth",), ("cookie",), ("signature",), ("sig",), ("jwt",),
    ("access", "key", "id"),
)
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def key_words(key: str) -> tuple[str, ...]:
    """The lower-case words of a key name in any style (``X-Api-Key`` → x, api, key)."""
    return tuple(w.lower() for w in _WORD.findall(str(key)))


def is_secret_key(key: str) -> bool:
    """Tell whether a mapping key names a credential (``password``, ``X-Api-Key``, ``hfToken``).

    The one classifier of secret-looking key names: every sink (`redact`), the override
    check and the URL query/fragment rule ask it. Only the last dotted component counts, and
    in it the last words (`key_words`): ``hf-token``, ``HF_TOKEN``, ``hfToken`` and
    ``hf_token`` are the same key.

    Args:
        key: A mapping key, header or query parameter name, or dotted path.

    Returns:
        True when values under this key must never be written or logged.
    """
    return _secret_name(str(key).rsplit(".", 1)[-1])


@functools.lru_cache(maxsize=8192)
def _secret_name(name: str) -> bool:
    # a pure function of the name; the same few hundred keys are asked about for every
    # run of a tree (a settings tree each: ~0.7 s of 1 000 runs' post-processing uncached)
    words = key_words(name)
    return any(words[-len(suffix):] == suffix for suffix in _SECRET_SUFFIXES
               if len(words) >= len(suffix))


# A URL's user info (``scheme://user:password@`` or a bare token ``scheme://token@``).
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/\s@?#]+)@")
# A query or fragment parameter (``?access_token=…``, ``&X-Amz-Signature=…``, ``#token=…``).
_URL_PARAM = re.compile(r"([?&#;])([^=&#;\s?]{1,100})=([^&#;\s]+)")
# An HTTP authorization value (``Bearer eyJ…``, ``Basic dXNlcjpwdw==``).
_AUTH_VALUE = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]{8,})")


def _is_auth_value(scheme: str, value: str) -> bool:
    """Whether ``value`` after ``Bearer``/``Basic`` is a credential, not a word of prose.

    A Basic credential is base64 of ``user:password``; a bearer token has a digit or a
    symbol in it (``Bearer authentication`` in a sentence is not one).
    """
    if scheme.lower() == "basic":
        try:
            return b":" in base64.b64decode(value, validate=True)
        except (ValueError, binascii.Error):
            return False
    return any(not c.isalpha() for c in value)


def _userinfo_secret(userinfo: str) -> str:
    """The secret part of a URL's user info: the password, or a bare user that is a token."""
    user, sep, password = userinfo.partition(":")
    return password if sep else user


def url_secrets(text: str) -> list[str]:
    """The credentials inside the URLs and authorization values of ``text``.

    URL user info (``https://u:pw@h`` → ``pw``; ``https://TOKEN@h`` → ``TOKEN``), query and
    fragment parameters with a secret name (``?access_token=…``, ``#id_token=…``), and
    ``Bearer``/``Basic`` values.
    """
    found = [_userinfo_secret(m.group(2)) for m in _URL_USERINFO.finditer(text)]
    found += [m.group(3) for m in _URL_PARAM.finditer(text) if is_secret_key(m.group(2))]
    found += [m.group(3) for m in _AUTH_VALUE.finditer(text)
              if _is_auth_value(m.group(1), m.group(3))]
    return [f for f in found if f and f != REDACTED]


def url_password(text: str) -> str | None:
    """The first credential of ``text`` by shape (see `url_secrets`), or None."""
    found = url_secrets(text)
    return found[0] if found else None


def _mask_userinfo(match: re.Match[str]) -> str:
    user, sep, _ = match.group(2).partition(":")
    return f"{match.group(1)}{user}:{REDACTED}@" if sep else f"{match.group(1)}{REDACTED}@"


def _mask_param(match: re.Match[str]) -> str:
    if not is_secret_key(match.group(2)):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}={REDACTED}"


def _mask_by_shape(text: str) -> str:
    text = _URL_USERINFO.sub(_mask_userinfo, text)
    if "=" in text:
        text = _URL_PARAM.sub(_mask_param, text)
    return _AUTH_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}"
                           if _is_auth_value(m.group(1), m.group(3)) else m.group(0), text)


REFERENCE_BLOCKS = frozenset({"secrets"})
"""Top-level config blocks whose values are references to secrets (file or block names)."""

MIN_SECRET_LENGTH = 8
"""Shorter values are not registered: masking every "testing" or "admin" inside longer words
would garble what is written (a namespace ``fine-tuning-testing`` saved as
``fine-tuning-***`` no longer validated). A registered value is masked as a whole token
only: not where letters or digits continue it on either side."""

_LOCK = threading.Lock()
_KNOWN: set[str] = set()
_PATTERN: re.Pattern[str] | None = None
_BYTES_PATTERN: re.Pattern[bytes] | None = None


def register_secret(value: object) -> None:
    """Remember a secret value: every later sink masks it, whole or inside a text.

    Args:
        value: The secret (a `SecretStr` is unwrapped); ``None``, non-text and values
            shorter than `MIN_SECRET_LENGTH` are ignored.
    """
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH or value == REDACTED:
        return
    with _LOCK:
        if value in _KNOWN:
            return
        _KNOWN.add(value)
        _compile()


def _compile() -> None:
    """Rebuild the masking patterns from the known secrets (the caller holds the lock)."""
    global _PATTERN, _BYTES_PATTERN
    ordered = sorted(_KNOWN, key=len, reverse=True)  # the longest first
    if not ordered:
        _PATTERN = _BYTES_PATTERN = None
        return
    alternatives = "|".join(re.escape(v) for v in ordered)
    _PATTERN = re.compile(f"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])")
    _BYTES_PATTERN = re.compile(b"(?<![A-Za-z0-9])(?:"
                                + b"|".join(re.escape(v.encode()) for v in ordered)
                                + b")(?![A-Za-z0-9])")


def known_secrets() -> frozenset[str]:
    """The secret values registered so far."""
    with _LOCK:
        return frozenset(_KNOWN)


def restore_secrets(known: frozenset[str]) -> None:
    """Forget every secret registered since `known_secrets` returned ``known``.

    For a process that runs one thing after another and must not let the secrets of one
    mask the output of the next (the test suite: one test's tokens once turned a manifest's
    ``devicePlugin`` key into ``***`` in another's).
    """
    with _LOCK:
        _KNOWN.intersection_update(known)
        _compile()


def redact_text(text: str) -> str:
    """Mask credentials by shape (`url_secrets`) and registered secrets in ``text``.

    Shape first: a registered value that happens to equal a parameter's *name* must not
    hide the name the shape rule needs to see.
    """
    text = _mask_by_shape(text)
    pattern = _PATTERN
    return pattern.sub(REDACTED, text) if pattern is not None else text


def redact_bytes(data: bytes) -> bytes:
    """Mask registered secrets in encoded text (what `core.safeio` writes)."""
    pattern = _BYTES_PATTERN
    return pattern.sub(REDACTED.encode(), data) if pattern is not None else data


def _register_under_secret_keys(value: Any, secret: bool = False) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _register_under_secret_keys(item, secret or is_secret_key(str(key)))
    elif isinstance(value, list | tuple):
        for item in value:
            _register_under_secret_keys(item, secret)
    elif secret:
        register_secret(value)


def register_secrets_in(data: Iterable[Any] | Mapping[str, Any]) -> None:
    """Register every value under a secret-named key of ``data`` (a secret file's YAML)."""
    _register_under_secret_keys(data)


class RedactingFilter(logging.Filter):
    """A logging filter that masks registered secrets and URL passwords in each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Mask the record's message in place; never drops a record."""
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def redact(value: Any, *, extra_secrets: frozenset[str] = frozenset(),
           references: frozenset[str] = REFERENCE_BLOCKS, _top: bool = True) -> Any:
    """Return a deep copy of ``value`` with every secret replaced by ``***``.

    Secrets are `SecretStr`/`SecretBytes` values, values under a key `is_secret_key` matches
    (a secret-named key's value is registered too, so it is masked in every other sink),
    passwords inside URLs (by value, whatever the key: ``endpoint_url:
    https://user:pw@host``), registered secrets (`register_secret`) wherever they appear in
    a string, and any string equal to one of ``extra_secrets``. The string values of the
    top-level ``references`` blocks (the config's ``secrets``: file and block names) are
    references, not secrets, and are kept.

    Args:
        value: Any JSON/YAML-like structure (mappings, sequences, scalars).
        extra_secrets: Known secret strings to mask wherever they appear as whole values.
        references: Top-level keys whose values are secret references.

    Returns:
        The redacted copy; ``value`` itself is left untouched.
    """
    if isinstance(value, SecretStr | SecretBytes):
        return REDACTED
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if _top and str(key) in references and isinstance(item, Mapping):
                out[key] = _references(item)
            elif is_secret_key(str(key)) and item not in (None, "", [], {}) and not isinstance(
                item, Mapping
            ):
                _register_under_secret_keys(item, True)
                out[key] = REDACTED
            else:
                out[key] = redact(item, extra_secrets=extra_secrets, _top=False)
        return out
    if isinstance(value, list | tuple):
        return type(value)(redact(v, extra_secrets=extra_secrets, _top=False) for v in value)
    if isinstance(value, str):
        return REDACTED if value in extra_secrets else redact_text(value)
    return value


def _references(block: Mapping[str, Any]) -> dict[str, Any]:
    """A block of secret references: names kept, anything that is not a name masked."""
    out: dict[str, Any] = {}
    for key, item in block.items():
        if isinstance(item, Mapping):
            out[key] = _references(item)
        elif item is None or isinstance(item, bool | int | float):
            out[key] = item
        elif isinstance(item, str) and re.fullmatch(r"[A-Za-z0-9_./-]{1,255}", item):
            out[key] = item  # a file name, a block name, an environment variable's name
        else:
            out[key] = REDACTED
    return out
