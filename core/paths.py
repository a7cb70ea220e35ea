"""Output directories given on a command line: usable, or one clear error."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from core.errors import ConfigError

__all__ = ["writable_dir"]


def writable_dir(path: str | Path, option: str) -> Path:
    """Create ``path`` if needed and prove a file can be written in it.

    Args:
        path: The directory.
        option: The command-line option that named it (for the message).

    Returns:
        The directory.

    Raises:
        ConfigError: It cannot be created or written (a file, read-only, no space...),
            said in one line with the option and the system's reason.
    """
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".telltale-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{option} {directory} is not a usable directory: {reason}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {directory} is not writable")
    return directory
