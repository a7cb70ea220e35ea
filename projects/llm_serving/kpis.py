"""llm_serving KPIs (OpenMetrics-style: unit, help, direction) and the run's labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from analysis.kpi import KpiDefinition
from analysis.parsing import ParsedResult
from projects.library.cost import cost_per_million_tokens, declared_cost
from projects.library.energy import energy_kpis
from projects.llm_serving.goodput import ServingSlo
from projects.llm_serving.parser import ServingResult, Stats

__all__ = ["KPIS", "LTS_VERSION", "as_serving", "labels", "results_summary", "slo_bound"]

LTS_VERSION = "1"


def as_serving(result: ParsedResult) -> ServingResult:
    """The result as a `ServingResult` (a wrong type is a bug, said loudly)."""
    if not isinstance(result, ServingResult):
        raise TypeError(f"expected a ServingResult, got {type(result).__name__}")
    return result


def _measured(get: Callable[[ServingResult], float | None]) -> Callable[[Any], float | None]:
    """A KPI of a valid measurement only (a bottlenecked load generator gives none)."""
    def compute(result: Any) -> float | None:
        serving = as_serving(result)
        return get(serving) if serving.measured else None
    return compute


def _pct(field: str, quantile: str) -> Callable[[Any], float | None]:
    def get(result: ServingResult) -> float | None:
        stats: Stats = getattr(result, field)
        value: float | None = getattr(stats, quantile)
        return value
    return _measured(get)


def _latencies() -> list[KpiDefinition]:
    kinds = [("ttft", "ttft_ms", "ms", "Time to first token"),
             ("itl", "itl_ms", "ms", "Inter-token latency"),
             ("tpot", "tpot_ms", "ms", "Time per output token"),
             ("request_latency", "request_latency_s", "s", "Request latency")]
    return [KpiDefinition(f"{name}_{quantile}", f"{text}, {quantile} over successful requests",
                          unit, lower_better=True, compute=_pct(field, quantile),
                          format="{:.2f}")
            for name, field, unit, text in kinds for quantile in ("p50", "p95", "p99")]


def _error_rate(result: ServingResult) -> float | None:
    total = (result.successful or 0) + (result.errored or 0)
    return 100.0 * (result.errored or 0) / total if total else None


def _gpus(result: ServingResult) -> int:
    try:
        return max(int(result.settings.get("gpu") or 0), 0)
    except (TypeError, ValueError):
        return 0


def _cost_per_mtok(result: ServingResult) -> float | None:
    """Declared price of a million generated tokens (`projects.library.cost`)."""
    return cost_per_million_tokens(declared_cost(result.settings),
                                   result.output_tokens_per_second, gpus=_gpus(result))


def _gpu_hours_per_mtok(result: ServingResult) -> float | None:
    tps = result.output_tokens_per_second
    gpus = _gpus(result)
    return gpus * 1e6 / (tps * 3600.0) if gpus and tps and tps > 0 else None


def _slo_met(result: ServingResult) -> float | None:
    """1.0 when the attainment reached the SLO's target, 0.0 when not (None: no SLO)."""
    if result.slo_attainment_pct is None:
        return None
    try:
        target = ServingSlo.model_validate(result.settings.get("slo") or {}).attainment_pct
    except ValidationError:
        return None
    return 1.0 if result.slo_attainment_pct >= target else 0.0


def slo_bound(labels: dict[str, str], figure: str) -> float | None:
    """One threshold of the ``slo`` label (``ttft_ms<=5000,...``), or None."""
    for part in (labels.get("slo") or "").split(","):
        name, _, bound = part.partition("<=")
        if name == figure:
            try:
                return float(bound)
            except ValueError:
                return None
    return None


def _window_tokens(result: ServingResult) -> float | None:
    """Tokens generated over GuideLLM's measured window."""
    tps, window = result.output_tokens_per_second, result.measured_s
    return tps * window if tps and window else None


def _first_success(result: ServingResult) -> float | None:
    firsts = result.samples.get("time_to_first_success_s")
    return max(firsts) if result.users and firsts else None


KPIS: list[KpiDefinition] = [
    *_latencies(),
    KpiDefinition("output_tokens_per_second", "Generated tokens per second, all requests",
                  "tokens/s", lower_better=False,
                  compute=_measured(lambda r: r.output_tokens_per_second), format="{:.1f}"),
    KpiDefinition("requests_per_second", "Successful requests per second", "req/s",
                  lower_better=False, compute=_measured(lambda r: r.requests_per_second),
                  format="{:.2f}"),
    # An error rate is judged even when nothing succeeded: that is when it matters most.
    KpiDefinition("error_rate", "Errored requests, % of finished requests", "%",
                  lower_better=True, compute=lambda r: _error_rate(as_serving(r)),
                  format="{:.2f}"),
    # goodput under the cell's SLO (projects/llm_serving/goodput.py): none without one
    KpiDefinition("goodput_requests_per_second", "Successful requests per second that met "
                  "every threshold of the cell's SLO", "req/s", lower_better=False,
                  compute=_measured(lambda r: r.goodput_requests_per_second),
                  format="{:.2f}"),
    KpiDefinition("goodput_tokens_per_second", "Generated tokens per second of the requests "
                  "that met the cell's SLO", "tokens/s", lower_better=False,
                  compute=_measured(lambda r: r.goodput_tokens_per_second), format="{:.1f}"),
    KpiDefinition("slo_attainment_pct", "Requests that met the cell's SLO, % of finished "
                  "requests (an errored one never does)", "%", lower_better=False,
                  compute=_measured(lambda r: r.slo_attainment_pct), format="{:.1f}"),
    # whether this load met the SLO (1) or not (0): the curve's knee reads it
    # (analysis.curve); the attainment itself is what is judged per cell
    KpiDefinition("slo_met", "1 when the cell's SLO attainment reached its target "
                  "(slo.attainment_pct), else 0", "", lower_better=False,
                  compute=_measured(_slo_met), ignored_for_regression=True, format="{:.0f}"),
    KpiDefinition("cost_per_million_tokens", "Price of generating one million tokens, from "
                  "the prices declared in test_settings.cost (per GPU-hour, or per node-hour "
                  "without GPUs; in its currency): declared, not measured", "currency/Mtok",
                  lower_better=True, compute=_measured(_cost_per_mtok), format="{:.4g}"),
    KpiDefinition("gpu_hours_per_million_tokens", "GPU-hours needed to generate one million "
                  "tokens (runs with GPUs)", "h/Mtok", lower_better=True,
                  compute=_measured(_gpu_hours_per_mtok), format="{:.4f}"),
    KpiDefinition("server_startup_time", "Model server start to ready (local platform)", "s",
                  lower_better=True, compute=lambda r: as_serving(r).server_startup_s,
                  format="{:.1f}"),
    KpiDefinition("time_to_first_success_max", "Multi-user: slowest client's first request "
                  "to its first successful response", "s", lower_better=True,
                  compute=lambda r: _first_success(as_serving(r)), format="{:.2f}"),
    *energy_kpis(lambda r: as_serving(r).energy, _measured(_window_tokens),
                 "generated tokens over the load window"),
]


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _slo_label(raw: Any) -> str:
    """The SLO's thresholds as a label (empty: none, or not a valid SLO)."""
    try:
        return ServingSlo.model_validate(raw).label() if raw is not None else ""
    except ValidationError:
        return ""


def labels(result: ParsedResult) -> dict[str, str]:
    """The run's identity: runs with equal labels share a history."""
    serving = as_serving(result)
    settings = serving.settings
    return {k: _text(v) for k, v in {
        "lts_version": LTS_VERSION,
        "platform": serving.platform,
        "model_name": settings.get("model_name"),
        "runtime": "vllm",
        "runtime_version": serving.runtime_version,
        "concurrency": settings.get("concurrency"),
        "prompt_tokens": settings.get("prompt_tokens"),
        "output_tokens": settings.get("output_tokens"),
        "duration_s": settings.get("duration_s"),
        "request_format": settings.get("request_format"),
        # goodput under another SLO is another KPI: the SLO is part of the identity
        "slo": _slo_label(settings.get("slo")),
        # the flow run: a sweep's cells share it (analysis.curve; an ignored label)
        "run_id": settings.get("run_id"),
        "accelerator_count": settings.get("gpu") or 0,
        "user_count": len(serving.users) or 1,
        "telltale_image": serving.telltale_image,
        # the local server's engine core forked from a fork server (workload/vllm_server.py)
        # holds ~140 MB more of the machine's memory than vLLM's own start, and a server
        # forked from a warm Python ("forked") starts in half the time: each is another
        # history, as the trainer's launch is (empty: the rows before it)
        "engine_core_start": serving.engine_core_start,
    }.items()}


def results_summary(result: ParsedResult) -> dict[str, Any]:
    """Parsed values for the LTS payload (no per-request samples)."""
    return as_serving(result).model_dump(include={
        "measured", "warnings", "successful", "errored", "ttft_ms", "itl_ms", "tpot_ms",
        "request_latency_s", "output_tokens_per_second", "requests_per_second",
        "generation_delay_ratio", "server_startup_s", "runtime_version", "server_counters",
        "slo_attainment_pct", "goodput_requests_per_second", "goodput_tokens_per_second"})
