"""A project's data files: a name from the config becomes a file inside its data dir.

Never a path elsewhere: a name that resolves outside is an error.
"""

from __future__ import annotations

from pathlib import Path

from analysis.errors import ConfigError

__all__ = ["data_file"]


def data_file(data_dir: Path, name: str, *, key: str, what: str = "data file") -> Path:
    """The file ``name`` of ``data_dir``, resolved (links included) and checked to stay inside.

    The config's types already refuse absolute paths and ``..`` (`analysis.strict.Name`);
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
