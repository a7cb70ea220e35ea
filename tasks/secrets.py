"""Read secrets from the secret dir named by the config; values come back as `SecretStr`.

The config's ``secrets`` block holds only pointers: ``secrets.dir.env_key`` names the
environment variable whose value is the secret dir, and the other keys name files in it.
Nothing read here is ever written to config, logs or exports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError

from core.errors import ConfigError
from core.redact import register_secret, register_secrets_in
from core.safeio import UnreadableInputError, read_text_bounded
from core.yamlio import load_yaml

MAX_SECRET_FILE = 1024 * 1024
"""Largest secret file read, in bytes (a pull secret or kubeconfig is a few KB)."""

__all__ = ["from_secret_file", "read_env_file", "read_yaml_secret", "secret_dir",
           "secret_file"]

M = TypeVar("M", bound=BaseModel)


def from_secret_file(model: type[M], data: Any, *, file: str) -> M:
    """Validate secret-file data into ``model``; an error names fields, never values.

    pydantic's own message quotes the input, which here is a credential.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}"
                           for e in exc.errors())
        raise ConfigError(f"invalid {model.__name__}: {fields}", file=file) from None


def secret_dir(env_key: str) -> Path | None:
    """The secret dir named by ``$env_key``, or None when the variable is unset.

    Raises:
        ConfigError: The variable is set but the dir does not exist.
    """
    value = os.environ.get(env_key)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(f"${env_key} points to {value}, which is not a directory",
                          key="secrets.dir.env_key")
    return path


def secret_file(env_key: str, name: str | None) -> Path | None:
    """A file of the secret dir, or None when the dir or the name is not configured.

    Raises:
        ConfigError: The dir is configured but the file is missing.
    """
    directory = secret_dir(env_key)
    if directory is None or not name:
        return None
    path = directory / name
    if not path.is_file():
        raise ConfigError(f"secret file {name!r} not found in ${env_key}")
    return path


def read_env_file(path: Path) -> dict[str, SecretStr]:
    """Parse ``KEY=VALUE`` lines (``#`` comments, optional ``export``, optional quotes)."""
    values: dict[str, SecretStr] = {}
    try:
        text = read_text_bounded(path, MAX_SECRET_FILE, what="secret file", follow_links=True)
    except UnreadableInputError as exc:
        raise ConfigError(exc.reason, file=str(path)) from None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip():
            raise ConfigError("expected KEY=VALUE (value not shown)", file=str(path),
                              line=lineno)
        values[key.strip()] = SecretStr(value.strip().strip("'\""))
        register_secret(values[key.strip()])
    return values


def read_yaml_secret(path: Path) -> dict[str, Any]:
    """Read a YAML secret file (a mapping)."""
    data, _ = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("a secret YAML file must be a mapping", file=str(path))
    register_secrets_in(data)  # its credentials are masked at every sink from now on
    return data
