"""Goodput under a service-level objective: the requests a user would call served well.

A cell's ``slo`` (`ServingSlo`) sets per-request thresholds — time to first token,
inter-token latency, time per output token, request latency; a request *meets* the SLO
when every threshold set holds for it (a threshold it has no value for fails it). From
GuideLLM's per-request records of the measured window:

- ``slo_attainment_pct``: requests that met it, % of all finished requests (an errored
  request never meets it);
- ``goodput_requests_per_second``: the successful requests per second that met it;
- ``goodput_tokens_per_second``: their generated tokens per second.

GuideLLM may keep a sample of the requests (``--sample-requests``) while its totals and
rates cover all of them: the shares are read on the records kept and applied to the totals
and rates (an unbiased estimate when the sample is uniform; exact when it holds them all).
Computed here from the records rather than with GuideLLM's own ``--goodput``: the SLO is
Telltale's config (one per cell, in its history's identity), and recorded results from any
GuideLLM version give the same figures.

An SLO with no threshold set gives no goodput KPI: never a figure that means "no SLO".
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from core.strict import StrictSettings

__all__ = ["Goodput", "RequestTimes", "ServingSlo", "goodput"]

class ServingSlo(StrictSettings):
    """``test_settings.slo``: per-request thresholds; a request meets it when all set hold."""

    ttft_ms: float | None = Field(default=None, gt=0, le=10_000_000,
                                  description="Time to first token at most this (ms).")
    itl_ms: float | None = Field(default=None, gt=0, le=10_000_000,
                                 description="Mean inter-token latency at most this (ms).")
    tpot_ms: float | None = Field(default=None, gt=0, le=10_000_000,
                                  description="Time per output token at most this (ms).")
    request_latency_s: float | None = Field(default=None, gt=0, le=86_400,
                                            description="Request latency at most this (s).")
    attainment_pct: float = Field(default=95, gt=0, le=100,
                                  description="The share of requests that must meet the "
                                  "thresholds for a load to meet the SLO (%).")

    def thresholds(self) -> dict[str, float]:
        """The thresholds set, by the request figure they bound."""
        return {name: value for name, value in (
            ("ttft_ms", self.ttft_ms), ("itl_ms", self.itl_ms), ("tpot_ms", self.tpot_ms),
            ("request_latency_s", self.request_latency_s)) if value is not None}

    def label(self) -> str:
        """The SLO as a history label (``ttft_ms<=5000,itl_ms<=500``; empty: none)."""
        return ",".join(f"{k}<={v:g}" for k, v in self.thresholds().items())


class RequestTimes(BaseModel):
    """One successful request's figures (GuideLLM's per-request record)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    request_latency_s: float | None = None
    output_tokens: float | None = None


class Goodput(BaseModel):
    """A cell's goodput under its SLO."""

    slo_attainment_pct: float = Field(ge=0, le=100)
    goodput_requests_per_second: float = Field(ge=0)
    goodput_tokens_per_second: float | None = Field(default=None, ge=0)
    met: int = Field(ge=0, description="Records that met the SLO.")
    records: int = Field(ge=0, description="Successful requests' records read.")


def _meets(request: RequestTimes, bounds: dict[str, float]) -> bool:
    for name, bound in bounds.items():
        value = getattr(request, name)
        if value is None or not value <= bound:  # NaN fails too
            return False
    return True


def goodput(requests: Sequence[RequestTimes], slo: ServingSlo, *, successful: int,
            errored: int, requests_per_second: float | None,
            output_tokens_per_second: float | None) -> Goodput | None:
    """The goodput of a measured window, or None (no threshold set, or nothing to read).

    Args:
        requests: The successful requests' records kept (all, or GuideLLM's sample).
        slo: The cell's SLO.
        successful: Successful requests in the window (GuideLLM's total).
        errored: Errored requests in the window.
        requests_per_second: Successful requests per second.
        output_tokens_per_second: Generated tokens per second, all successful requests.
    """
    bounds = slo.thresholds()
    finished = successful + errored
    if not bounds or finished <= 0 or requests_per_second is None:
        return None
    if successful > 0 and not requests:
        return None  # successes without records: the share cannot be read
    met = [r for r in requests if _meets(r, bounds)]
    share = len(met) / len(requests) if requests else 0.0
    tokens_all = sum(r.output_tokens or 0.0 for r in requests)
    tokens_met = sum(r.output_tokens or 0.0 for r in met)
    tokens = None
    if output_tokens_per_second is not None and tokens_all > 0:
        tokens = output_tokens_per_second * tokens_met / tokens_all
    return Goodput(slo_attainment_pct=100.0 * share * successful / finished,
                   goodput_requests_per_second=max(requests_per_second, 0.0) * share,
                   goodput_tokens_per_second=None if tokens is None else max(tokens, 0.0),
                   met=len(met), records=len(requests))
