"""A project's data files: a name from the config becomes a file inside its data dir.

Never a path elsewhere: a name that resolves outside is an error.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from core.errors import ConfigError

__all__ = ["content_hash", "data_file"]


def data_file(data_dir: Path, name: str, *, key: str, what: str = "data file") -> Path:
    """The file ``name`` of ``data_dir``, resolved (links included) and checked to stay inside.

    The config's types already refuse absolute paths and ``..`` (`core.strict.Name`);
    this is the second fence, where the name becomes a path: a link in the data dir that
    points elsewhere is refused too.

    Args:
        data_dir: The project's data dir.
        name: The name from the config (``alpaca_mini.jsonl``).
        key: The config key that named it, for the message.
        what: What the file is (``dataset``), for the message.

    Returns:
        The resolved file.

    Raises:
        ConfigError: The file is missing, not a regular file, or outside ``data_dir``.
    """
    root = data_dir.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ConfigError(f"{what} {name!r} is not a file of {root}", key=key)
    if not path.is_file():
        available = sorted(p.name for p in root.iterdir() if p.is_file()
                           and p.suffix not in (".py", ".pyc")) if root.is_dir() else []
        raise ConfigError(f"{what} {name!r} not found in {root}; available: "
                          f"{', '.join(available) or '(none)'}", key=key)
    return path


_HASH_LIMIT = 4 * 1024 * 1024 * 1024  # bytes hashed per file or dir: a model's weights pass


def content_hash(path: Path) -> str:
    """The content hash of a file, or of a dir's regular files (names and bytes), 16 hex.

    For the environment fingerprint: a dataset or model that changed under the same name
    changes its hash. Links are not followed; hashing stops at 4 GiB (a larger model is
    identified by its first 4 GiB and its file names).
    """
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    budget = _HASH_LIMIT
    for item in files:
        digest.update(str(item.relative_to(path) if item != path else item.name).encode())
        with item.open("rb") as stream:
            while budget > 0 and (chunk := stream.read(min(1 << 20, budget))):
                digest.update(chunk)
                budget -= len(chunk)
    return digest.hexdigest()[:16]
