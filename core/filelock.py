"""One exclusive ``flock`` on a lock file in a directory: the machine-wide lock Telltale uses.

Artifact-dir numbering, history appends, the shared local Prefect API and the spare
Prometheus all serialize their check-then-write steps this way. The kernel drops the lock
when its holder dies, so a crashed process never leaves it held; the file's content is never
read or written, and no link is followed to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["dir_lock"]


@contextlib.contextmanager
def dir_lock(directory: str | Path, name: str, *, wait: bool = True,
             mode: int = 0o644) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``directory/name`` for the block.

    Args:
        directory: Created when missing.
        name: The lock file's name.
        wait: Wait for the lock; when False and it is taken, the block runs unheld.
        mode: The lock file's permissions when it is created.

    Yields:
        True when held; False only when not ``wait``ing and another holder has it.
    """
    os.makedirs(directory, exist_ok=True)
    fd = os.open(Path(directory) / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing drops the lock
