"""llm_serving's validity checks: is a cell's result a measurement of the server at all?

- the load generator's own overhead: the *median* wait of a request for its data (GuideLLM's
  generation delay) above `MAX_GENERATION_DELAY_SHARE` of the mean time to first token.
  GuideLLM's ``generation_delay_ttft`` warning uses the *mean*, over the warm-up too: the
  first requests wait for its data worker to start (one 13 ms wait in 50 requests was 60 %
  of the mean on a quiet 2-core machine) — a start-up before the measured window, not an
  overhead of the requests measured. With the summary at hand the median decides; without
  it (an older result), the warning does;
- GuideLLM's other warnings listed in ``tests.llm_serving.invalid_on_warnings``;
- no request completed in the window, none errored (all still running when it closed);
- more than `MAX_ERROR_SHARE` of the requests errored;
- the concurrency achieved (GuideLLM's mean requests in flight) below `MIN_CONCURRENCY_SHARE`
  of the concurrency asked for: the server was measured at another load than labelled.
"""

from __future__ import annotations

from analysis.parsing import ParsedResult
from projects.llm_serving.parser import ServingResult, UserServing

__all__ = ["MAX_ERROR_SHARE", "MAX_GENERATION_DELAY_SHARE", "MIN_CONCURRENCY_SHARE",
           "MIN_WINDOW_S", "measured_window",
           "validity_reasons"]

MAX_ERROR_SHARE = 0.01
MAX_GENERATION_DELAY_SHARE = 0.01
"""GuideLLM's own threshold for its generation delay against the mean TTFT."""
MIN_CONCURRENCY_SHARE = 0.75
MIN_WINDOW_S = 3.0
"""A window shorter than this holds too few requests of the tiny model to call a level."""


def _serving(result: ParsedResult) -> ServingResult:
    if not isinstance(result, ServingResult):
        raise TypeError(f"not an llm_serving result: {type(result).__name__}")
    return result


def _finished_nothing(load: ServingResult | UserServing) -> bool:
    """Whether a load step (the cell's, or a fan-out client's) finished no request.

    It ended 0, none succeeded and none errored: every request still running when its
    window closed.
    """
    return load.exit_code == 0 and load.successful == 0 and not load.errored


def validity_reasons(result: ParsedResult) -> list[str]:
    """Why this cell's numbers do not measure the server (empty: they do)."""
    serving = _serving(result)
    reasons: list[str] = []
    warnings = list(serving.invalid_warnings)
    median, ttft = serving.generation_delay_median_s, serving.ttft_mean_ms
    if median is not None and ttft:
        warnings = [w for w in warnings if w != "generation_delay_ttft"]  # the median decides
        share = median * 1000 / ttft
        if share > MAX_GENERATION_DELAY_SHARE:
            reasons.append(f"the load generator itself was the bottleneck: its median "
                           f"request generation delay was {share:.1%} of the mean time to "
                           f"first token (at most {MAX_GENERATION_DELAY_SHARE:.0%})")
    if warnings:
        ratio = serving.generation_delay_ratio
        reasons.append("GuideLLM says the load generator itself was the bottleneck ("
                       + ", ".join(warnings) + ")"
                       + (f": its mean generation delay was {ratio:.1%} of the mean time to "
                          "first token" if ratio is not None
                          and "generation_delay_ttft" in warnings else ""))
    if _finished_nothing(serving):
        # the load step ran and the server failed nothing, but no request finished in the
        # window: nothing was measured (a failed cell is exit 4, never judged at all)
        reasons.append(f"no request completed within the measured window "
                       f"({serving.incomplete or 0} still running, none errored): too slow a "
                       "server for the window, or a loaded machine")
    idle = [u.index for u in serving.users if _finished_nothing(u)]
    if idle:  # the same, client by client (each user's load step ends 0 then)
        reasons.append(f"{len(idle)} of {len(serving.users)} user(s) completed no request "
                       f"within the window, none errored (users {', '.join(map(str, idle[:10]))})")
    total = (serving.successful or 0) + (serving.errored or 0)
    if total and (serving.errored or 0) / total > MAX_ERROR_SHARE:
        reasons.append(f"{serving.errored} of {total} requests errored "
                       f"({(serving.errored or 0) / total:.1%}; at most "
                       f"{MAX_ERROR_SHARE:.0%})")
    requested = serving.settings.get("concurrency")
    achieved = serving.achieved_concurrency
    if (not serving.users and isinstance(requested, int) and requested > 0
            and achieved is not None and achieved < MIN_CONCURRENCY_SHARE * requested):
        reasons.append(f"achieved concurrency {achieved:.2f} of the {requested} requested "
                       f"(at least {MIN_CONCURRENCY_SHARE:.0%})")
    return reasons


def measured_window(result: ParsedResult) -> float | None:
    """GuideLLM's measured window in seconds."""
    return _serving(result).measured_s
