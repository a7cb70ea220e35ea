"""Where a run's changes to its config come from, and the credential none may carry.

``--var`` text and vars files (parsed once, as untrusted YAML), the ``TELLTALE__*``
environment; a secret-named key or a credential-shaped value is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.redact import (
    REFERENCE_BLOCKS,
    is_secret_key,
    register_secret,
    url_password,
)
from core.yamlio import load_yaml, load_yaml_text

ENV_PREFIX = "TELLTALE__"
"""Environment variables ``TELLTALE__a__b__c=value`` override config key ``a.b.c``."""


def parse_override(key: str, text: str) -> Any:
    """Parse one override value as YAML, once (``"[2, 4]"`` → ``[2, 4]``, ``"4"`` → ``4``).

    The text is untrusted (command line, PR comment, environment): aliases and oversized
    text are refused.

    Args:
        key: The dotted key, for error messages.
        text: The raw value as typed.

    Returns:
        The parsed value; an empty string stays an empty string.

    Raises:
        ConfigError: The value is not valid YAML.
    """
    if text == "":
        return ""
    value, _ = load_yaml_text(text, source=f"value of {key}", untrusted=True)
    return value


def load_vars_file(path: str | Path) -> dict[str, Any]:
    """Read a vars file: a YAML mapping of dotted key → value.

    Raises:
        ConfigError: Missing file, malformed YAML, or not a mapping.
    """
    data, _ = load_yaml(path, untrusted=True)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("a vars file must be a mapping of dotted key: value", file=str(path))
    return {str(k): v for k, v in data.items()}


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].replace("__", ".")
            out[key] = parse_override(f"${name}", env[name])
    return out


def _request(base: str | Path, presets: Sequence[str], overrides: Mapping[str, Any],
             environ: Mapping[str, str]) -> str:
    """What a resolution was asked for, as comparable text (base, presets, overrides, env)."""
    import json

    env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
    return json.dumps([str(base), list(presets), dict(overrides), env], sort_keys=True,
                      default=repr)


def _refuse_secret_values(key: str, value: Any, source: str) -> None:
    """Refuse a credential given as an override.

    It would reach the run's parameters (the Prefect database), the saved overrides and
    every document built from them.

    Keys of the top-level ``secrets`` block hold references (file and block names) and may
    be set.

    Raises:
        ConfigError: A secret-named key (``hf_token``, ``api_key``, ``password``...) at any
            depth of the override, or a credential by shape (`core.redact.url_secrets`)
            in a value; the value is not shown.
    """
    if key.split(".", 1)[0] in REFERENCE_BLOCKS:
        return
    stack: list[tuple[str, Any]] = [(key, value)]
    while stack:
        path, item = stack.pop()
        if is_secret_key(path):
            raise ConfigError(f"{path.rsplit('.', 1)[-1]!r} names a secret ({source}): "
                              "put the value in a file of the secret dir or a Prefect Secret "
                              "block, and its name in the secrets block", key=path)
        if isinstance(item, Mapping):
            stack += [(f"{path}.{k}", v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(path, v) for v in item]
        elif isinstance(item, str) and (password := url_password(item)) is not None:
            register_secret(password)  # masked if it got out
            raise ConfigError(f"a credential inside a value ({source}: a URL's user info, a "
                              "token query parameter or a Bearer value): a credential never "
                              "comes as an override; give it in the secret dir (S3: "
                              "secrets.s3_credentials) and the value without it", key=path)
