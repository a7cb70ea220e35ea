"""The retry policy run by tenacity: transient faults only, backoff from the policy, last error."""

from __future__ import annotations

import logging

import pytest

from core.errors import PermanentServiceError, TransientServiceError
from tasks.retry import RetryPolicy, call_with_retries


def _failing(*errors: Exception) -> tuple[list[int], object]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return calls, fn


def test_transient_faults_are_retried_with_the_policys_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    policy = RetryPolicy(attempts=4, backoff_base_s=1.0, backoff_max_s=3.0, jitter=0)
    calls, fn = _failing(*[TransientServiceError("503", service="s")] * 3)
    slept: list[float] = []
    with caplog.at_level(logging.WARNING, logger="telltale.retry"):
        assert call_with_retries(fn, policy, what="probe", sleep=slept.append) == "ok"
    assert len(calls) == 4
    assert slept == [1.0, 2.0, 3.0]  # exponential, capped
    assert "probe: attempt 3/4 failed (s: 503); retrying" in caplog.text


def test_a_permanent_error_is_raised_at_once() -> None:
    calls, fn = _failing(PermanentServiceError("401", service="s", status=401))
    with pytest.raises(PermanentServiceError):
        call_with_retries(fn, RetryPolicy(attempts=5), what="probe",
                          sleep=lambda _: pytest.fail("slept on a permanent error"))
    assert len(calls) == 1


def test_exhaustion_reraises_the_last_error(caplog: pytest.LogCaptureFixture) -> None:
    errors = [TransientServiceError(f"503 #{i}", service="s") for i in range(3)]
    calls, fn = _failing(*errors)
    with caplog.at_level(logging.WARNING, logger="telltale.retry"), \
            pytest.raises(TransientServiceError, match="503 #1"):
        call_with_retries(fn, RetryPolicy(attempts=2, backoff_base_s=0), what="probe",
                          sleep=lambda _: None)
    assert len(calls) == 2
    assert "attempt 2/2 failed (s: 503 #1); giving up" in caplog.text
