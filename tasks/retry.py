"""One retry policy value for service calls, run by tenacity.

S3 has boto's own; OpenSearch, QUADS and the Kubernetes API use this.

Like urllib3's ``Retry``: a frozen value (pydantic, so it can sit in a config block),
exponential backoff with jitter and a cap, retries only what `core.errors.is_transient`
calls transient, every attempt logged with its number and whether it will retry; exhaustion
re-raises the last error. tenacity runs the loop; this module only says which errors are
transient and what the log lines say.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity
from pydantic import BaseModel, ConfigDict, Field

from core.errors import is_transient

__all__ = ["RetryPolicy", "call_with_retries"]

T = TypeVar("T")
logger = logging.getLogger("telltale.retry")
_JITTER = random.Random()  # its own: a library's jitter never moves the global random state


class RetryPolicy(BaseModel):
    """How often and how patiently to retry a transient failure."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=5, ge=1, description="Total attempts, the first included.")
    backoff_base_s: float = Field(default=0.5, ge=0, description="Delay before the 2nd attempt.")
    backoff_max_s: float = Field(default=30.0, ge=0, description="Cap of one delay.")
    jitter: float = Field(default=0.2, ge=0, le=1, description="Random extra, as a fraction.")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        return base * (1 + _JITTER.uniform(0, self.jitter))


def call_with_retries(fn: Callable[[], T], policy: RetryPolicy, *, what: str,
                      transient: Callable[[BaseException], bool] = is_transient,
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``, retrying transient failures according to ``policy``.

    Args:
        fn: The call (no arguments; bind them with a lambda or functools.partial).
        policy: The retry policy.
        what: Name of the call, for the log lines.
        transient: Decides whether an exception is worth retrying.
        sleep: Injected for tests.

    Returns:
        What ``fn`` returned.

    Raises:
        Exception: The last error, when it is permanent or the attempts are exhausted.
    """
    attempt = 0

    def logged() -> T:
        nonlocal attempt
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            retry = transient(exc) and attempt < policy.attempts
            # A permanent error on the first attempt is the caller's to report (a 404 is
            # often expected); retries and exhaustion are worth a warning here.
            level = logging.WARNING if retry or attempt > 1 else logging.DEBUG
            logger.log(level, "%s: attempt %d/%d failed (%s)%s", what, attempt,
                       policy.attempts, exc, "; retrying" if retry else "; giving up")
            raise

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=lambda state: policy.delay(state.attempt_number),
        retry=tenacity.retry_if_exception(transient), sleep=sleep, reraise=True)
    return retrying(logged)
