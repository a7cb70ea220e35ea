"""The lock a history append holds while it checks the stored runs and writes.

Two analyses storing the same ``.uuid`` at the same moment must not both pass the identity
check (it reads, then writes). `local_append_lock` serves a history on a local disk; an
``s3://`` history gets its lock from the layer that owns the S3 client
(`tasks.publish.s3.s3_append_lock`), since this package never imports an S3 client.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

__all__ = ["LOCK_FILE", "AppendLock", "local_append_lock"]

AppendLock = Callable[[], contextlib.AbstractContextManager[object]]
"""A factory of the lock an append holds while it checks the stored runs and writes."""

LOCK_FILE = ".append.lock"


def local_append_lock(directory: str) -> AppendLock:
    """An exclusive ``flock`` on ``directory/.append.lock`` (any process on this machine).

    The kernel drops it when its holder dies, so a crashed writer never leaves it held.
    """

    @contextlib.contextmanager
    def hold() -> Iterator[object]:
        os.makedirs(directory, exist_ok=True)
        # no link followed; the file's content is never read or written, only locked
        fd = os.open(os.path.join(directory, LOCK_FILE),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing drops the lock

    return hold
