"""The lock a history append holds while it checks the stored runs and writes.

Two analyses storing the same ``.uuid`` at the same moment must not both pass the identity
check (it reads, then writes). `local_append_lock` serves a history on a local disk; an
``s3://`` history gets its lock from the layer that owns the S3 client
(`tasks.publish.s3.s3_append_lock`), since this package never imports an S3 client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from core.filelock import dir_lock

__all__ = ["LOCK_FILE", "AppendLock", "local_append_lock"]

AppendLock = Callable[[], contextlib.AbstractContextManager[object]]
"""A factory of the lock an append holds while it checks the stored runs and writes."""

LOCK_FILE = ".append.lock"


def local_append_lock(directory: str) -> AppendLock:
    """An exclusive ``flock`` on ``directory/.append.lock`` (any process on this machine).

    The kernel drops it when its holder dies, so a crashed writer never leaves it held.
    """

    def hold() -> contextlib.AbstractContextManager[object]:
        return dir_lock(directory, LOCK_FILE)

    return hold
