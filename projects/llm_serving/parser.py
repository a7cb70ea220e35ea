"""Parse an llm_serving result dir: GuideLLM's JSON, the server's record and /metrics.

The cell's load step (``NNN__llm_serving__run_llm_serving_load``) holds, under
``artifacts/`` (or ``users/user-NNN/`` per user of a fan-out):

- ``guidellm.json``: GuideLLM's result (version 2 schema), validated here field by field
  with pydantic; everything we do not use is ignored, a wrong type is a parse problem;
- ``load.json``: what the load step ran and its verdict (exit 5: GuideLLM said its own
  request generation bottlenecked the run, so no latency KPI is taken from it);
- ``metrics_before.txt`` / ``metrics_after.txt``: the server's Prometheus text, whose
  counters' difference is what the server itself counted during the load;
- ``service.json``: the local server's record (start-up time).

On a cluster only the load Pod's ``pod.log`` comes back: its ``{"event": "guidellm"}`` line
(the same benchmark shape, compacted by ``workload/load.py``) stands in for the JSON file.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from analysis.discovery import ResultDir
from analysis.parsing import FileReader, ParsedResult
from projects.library.energy import kpi_window, read_energy
from projects.library.runs import RunResult, read_run, telltale_image
from projects.llm_serving.goodput import RequestTimes, ServingSlo, goodput

__all__ = ["ENGINE_CORE_STARTS", "LOAD_STEP", "ServingParser", "ServingResult", "Stats",
           "UserServing"]

LOAD_STEP = "run_llm_serving_load"
WORKLOAD_GLOB = f"*__llm_serving__{LOAD_STEP}"
ENGINE_CORE_STARTS = ("forkserver", "forked")
"""How the local vLLM server's engine core started (`service.json`'s ``engine_core_start``):
from a fork server the server started, or forked from a server that was itself forked from a
warm Python (`tasks.platforms.service_launch`). Anything else reads as empty (vLLM's own
start, the runs before session 24)."""
CAPTURE_GLOB = "*__cluster__capture_environment"
DEFAULT_INVALID_WARNINGS = frozenset({"generation_delay_ttft"})
"""Invalidating GuideLLM warnings when the load step did not record its own list."""
MAX_SAMPLES = 2000
"""Per-request values kept for the distribution pages (evenly thinned beyond this)."""
_COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


class _Dist(BaseModel):
    """A GuideLLM distribution summary (the fields we read)."""

    model_config = ConfigDict(extra="ignore")

    mean: float | None = None
    median: float | None = None
    percentiles: dict[str, float | None] = Field(default_factory=dict)


class _ByStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")

    successful: _Dist = Field(default_factory=_Dist)


class _Totals(BaseModel):
    model_config = ConfigDict(extra="ignore")

    successful: int = 0
    errored: int = 0
    incomplete: int = 0


class _Metrics(BaseModel):
    model_config = ConfigDict(extra="ignore")

    request_totals: _Totals
    requests_per_second: _ByStatus
    request_latency: _ByStatus
    time_to_first_token_ms: _ByStatus
    inter_token_latency_ms: _ByStatus
    time_per_output_token_ms: _ByStatus
    output_tokens_per_second: _ByStatus
    request_concurrency: _ByStatus | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    request_start_time: float | None = None
    request_end_time: float | None = None
    request_latency: float | None = None
    time_to_first_token_ms: float | None = None
    inter_token_latency_ms: float | None = None
    time_per_output_token_ms: float | None = None
    output_tokens: float | None = None


class _Requests(BaseModel):
    model_config = ConfigDict(extra="ignore")

    successful: list[_Request] = Field(default_factory=list)


class _Warning(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str
    observed: float | None = None
    threshold: float | None = None


class _SchedulerMetrics(BaseModel):
    model_config = ConfigDict(extra="ignore")

    generation_delay: _Dist | None = None


class _Benchmark(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metrics: _Metrics
    scheduler_metrics: _SchedulerMetrics | None = None
    requests: _Requests = Field(default_factory=_Requests)
    warnings: list[_Warning] = Field(default_factory=list)
    start_time: float | None = None
    duration: float | None = None


class _GuideLLM(BaseModel):
    model_config = ConfigDict(extra="ignore")

    benchmarks: list[_Benchmark] = Field(min_length=1)


class Stats(BaseModel):
    """Mean and percentiles of one latency (successful requests)."""

    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class UserServing(BaseModel):
    """One client of a multi-user run."""

    index: int
    exit_code: int | None = None
    successful: int | None = None
    errored: int | None = None
    ttft_ms_p50: float | None = None
    request_latency_s_p50: float | None = None
    time_to_first_success_s: float | None = Field(
        default=None, description="Client's first request → its first successful response.")


class ServingResult(RunResult):
    """A parsed llm_serving cell."""

    platform: str | None = None
    telltale_image: str | None = None
    runtime_version: str | None = None
    server_startup_s: float | None = None
    engine_core_start: str = Field(default="", description="How the local vLLM server's "
                                   "engine core was started: forkserver "
                                   "(workload/vllm_server.py), forked (the server forked "
                                   "from a warm Python, its engine core from it), or empty "
                                   "(vLLM's own start, a cluster's, or a record from before "
                                   "it was recorded).")
    measured: bool = Field(default=False, description="The load step judged the run a valid "
                           "measurement (exit 0: no fatal GuideLLM warning, some success).")
    warnings: list[str] = Field(default_factory=list)
    invalid_warnings: list[str] = Field(default_factory=list, description="GuideLLM warnings "
                                        "that make the measurement invalid "
                                        "(tests.llm_serving.invalid_on_warnings).")
    achieved_concurrency: float | None = Field(default=None, description="Mean requests in "
                                               "flight (GuideLLM's request_concurrency).")
    measured_s: float | None = Field(default=None, description="GuideLLM's measured window.")
    generation_delay_median_s: float | None = Field(
        default=None, description="Median wait of a request for its data (GuideLLM's "
        "request generation): its steady overhead, without the data worker's start-up.")
    ttft_mean_ms: float | None = Field(default=None, description="Mean time to first token "
                                       "(what the generation delay is measured against).")
    successful: int | None = None
    errored: int | None = None
    incomplete: int | None = Field(default=None, description="Requests still running when "
                                   "the measured window closed.")
    ttft_ms: Stats = Field(default_factory=Stats)
    itl_ms: Stats = Field(default_factory=Stats)
    tpot_ms: Stats = Field(default_factory=Stats)
    request_latency_s: Stats = Field(default_factory=Stats)
    output_tokens_per_second: float | None = None
    requests_per_second: float | None = None
    generation_delay_ratio: float | None = Field(
        default=None, description="GuideLLM's own request-generation delay / mean TTFT.")
    server_counters: dict[str, float] = Field(default_factory=dict)
    samples: dict[str, list[float]] = Field(default_factory=dict, description="Per-request "
                                            "ttft_ms and itl_ms (thinned to MAX_SAMPLES).")
    slo_attainment_pct: float | None = Field(default=None, description="Requests that met "
                                             "the cell's SLO, % of finished requests.")
    goodput_requests_per_second: float | None = Field(
        default=None, description="Successful requests per second that met the SLO.")
    goodput_tokens_per_second: float | None = Field(
        default=None, description="Their generated tokens per second.")
    users: list[UserServing] = Field(default_factory=list)


def _stats(dist: _Dist) -> Stats:
    pct = dist.percentiles
    return Stats(mean=dist.mean, p50=pct.get("p50", dist.median), p95=pct.get("p95"),
                 p99=pct.get("p99"))


def _thin(values: list[float]) -> list[float]:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) <= MAX_SAMPLES:
        return finite
    step = len(finite) / MAX_SAMPLES
    return [finite[int(i * step)] for i in range(MAX_SAMPLES)]


def counters(text: str) -> dict[str, float]:
    """Sum of each sample of the Prometheus text, by metric name (labels summed over)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return sums


class ServingParser:
    """Reads the load step of an llm_serving cell (see the module docstring)."""

    name: ClassVar[str] = "llm_serving"
    version: ClassVar[str] = "6"  # 6: energy over the load window
    result_model: ClassVar[type[ParsedResult]] = ServingResult

    def parse(self, result: ResultDir, reader: FileReader) -> ServingResult:
        """Parse one result dir; missing or malformed files become problems."""
        out = ServingResult(path=result.path, rel_path=result.rel_path,
                            settings=result.settings, exit_code=result.exit_code,
                            parser=self.name, parser_version=self.version)
        read_run(result, reader, out)
        capture = reader.glob(CAPTURE_GLOB)
        if capture is not None:
            out.platform = "local" if reader.exists(f"{capture}/machine.json") \
                else "kubernetes"
            out.telltale_image = telltale_image(reader, capture)
        job = reader.glob(WORKLOAD_GLOB)
        if job is None:
            reader.problem(WORKLOAD_GLOB, "no load step dir")
            return out
        service = reader.json(f"{job}/artifacts/service.json", required=False)
        if isinstance(service, dict):
            if isinstance(service.get("startup_s"), int | float):
                out.server_startup_s = float(service["startup_s"])
            if service.get("engine_core_start") in ENGINE_CORE_STARTS:
                out.engine_core_start = str(service["engine_core_start"])
        user_dirs = reader.listdir(f"{job}/users", "user-*")
        if user_dirs:
            self._users(reader, out, job, user_dirs)
            return out
        self._cell(reader, out, f"{job}/artifacts")
        return out

    def _benchmark(self, reader: FileReader, rel: str) -> _Benchmark | None:
        data = reader.json(rel, required=False)
        if data is None:
            data = self._from_log(reader, rel.rsplit("/", 1)[0] + "/pod.log")
            rel = rel.rsplit("/", 1)[0] + "/pod.log"
        if data is None:
            return None
        try:
            return _GuideLLM.model_validate(data).benchmarks[0]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            reader.problem(rel, f"not a GuideLLM result: {where}: {first['msg']}")
            return None

    @staticmethod
    def _from_log(reader: FileReader, rel: str) -> dict[str, Any] | None:
        """``{"benchmarks": [...]}`` from the load step's ``{"event": "guidellm"}`` log line."""
        if not reader.exists(rel):
            return None
        found = None
        for _, line in reader.matching_spans(rel, '"event": "guidellm"', required=False) or []:
            try:
                event = json.loads(line)
            except ValueError:
                reader.problem(rel, "a cut or broken guidellm result line")
                continue
            if isinstance(event, dict) and isinstance(event.get("benchmark"), dict):
                found = {"benchmarks": [event["benchmark"]]}
        return found

    def _load_record(self, reader: FileReader, directory: str) -> dict[str, Any]:
        record = reader.json(f"{directory}/load.json", required=False)
        return record if isinstance(record, dict) else {}

    def _cell(self, reader: FileReader, out: ServingResult, directory: str) -> None:
        record = self._load_record(reader, directory)
        version = record.get("server_version")
        out.runtime_version = str(version)[:64] if isinstance(version, str) else None
        bench = self._benchmark(reader, f"{directory}/guidellm.json")
        if bench is None:
            if out.exit_code == 0:
                reader.problem(f"{directory}/guidellm.json", "missing: no measurement")
            return
        metrics = bench.metrics
        out.successful = metrics.request_totals.successful
        out.errored = metrics.request_totals.errored
        out.incomplete = metrics.request_totals.incomplete
        out.warnings = [w.code for w in bench.warnings]
        # the load step recorded which warnings invalidate (its config's list); a cluster's
        # log line carries none: the default list
        listed = record.get("invalid_warnings")
        out.invalid_warnings = [str(c)[:64] for c in listed][:20] if isinstance(listed, list) \
            else [c for c in out.warnings if c in DEFAULT_INVALID_WARNINGS]
        if metrics.request_concurrency is not None:
            out.achieved_concurrency = metrics.request_concurrency.successful.mean
        out.measured_s = bench.duration
        delay = bench.scheduler_metrics.generation_delay if bench.scheduler_metrics else None
        out.generation_delay_median_s = delay.median if delay is not None else None
        out.ttft_mean_ms = metrics.time_to_first_token_ms.successful.mean
        ratio = next((w.observed for w in bench.warnings
                      if w.code == "generation_delay_ttft"), None)
        out.generation_delay_ratio = ratio
        # nothing succeeded, or the load step failed: such a run measures no server, no KPI
        # (a bottlenecked load generator's run keeps its KPIs: an invalid measurement)
        out.measured = bool(out.successful) and out.exit_code == 0
        if not out.measured:
            return
        if bench.start_time is not None and bench.duration:
            # the load window's energy (the server's start-up and warm-up left out)
            out.energy = read_energy(reader, *kpi_window(bench.start_time,
                                                         seconds=bench.duration))
        out.ttft_ms = _stats(metrics.time_to_first_token_ms.successful)
        out.itl_ms = _stats(metrics.inter_token_latency_ms.successful)
        out.tpot_ms = _stats(metrics.time_per_output_token_ms.successful)
        out.request_latency_s = _stats(metrics.request_latency.successful)
        out.output_tokens_per_second = metrics.output_tokens_per_second.successful.mean
        out.requests_per_second = metrics.requests_per_second.successful.mean
        requests = bench.requests.successful
        out.samples = {
            "ttft_ms": _thin([r.time_to_first_token_ms for r in requests
                              if r.time_to_first_token_ms is not None]),
            "itl_ms": _thin([r.inter_token_latency_ms for r in requests
                             if r.inter_token_latency_ms is not None]),
        }
        self._goodput(reader, out, requests)
        before = reader.text(f"{directory}/metrics_before.txt", required=False)
        after = reader.text(f"{directory}/metrics_after.txt", required=False)
        if before is not None and after is not None:
            start, end = counters(before), counters(after)
            out.server_counters = {name: end[metric] - start.get(metric, 0.0)
                                   for name, metric in _COUNTERS.items() if metric in end}

    @staticmethod
    def _goodput(reader: FileReader, out: ServingResult, requests: list[_Request]) -> None:
        """The cell's goodput under its ``slo`` (`projects.llm_serving.goodput`)."""
        raw = out.settings.get("slo")
        if raw is None:
            return
        try:
            slo = ServingSlo.model_validate(raw)
        except ValidationError as exc:  # settings.yaml is read from the result tree
            reader.problem("settings.yaml", f"slo: {exc.errors()[0].get('msg', 'invalid')}"[:200])
            return
        found = goodput(
            [RequestTimes(ttft_ms=r.time_to_first_token_ms, itl_ms=r.inter_token_latency_ms,
                          tpot_ms=r.time_per_output_token_ms,
                          request_latency_s=r.request_latency, output_tokens=r.output_tokens)
             for r in requests], slo, successful=out.successful or 0,
            errored=out.errored or 0, requests_per_second=out.requests_per_second,
            output_tokens_per_second=out.output_tokens_per_second)
        if found is not None:
            out.slo_attainment_pct = found.slo_attainment_pct
            out.goodput_requests_per_second = found.goodput_requests_per_second
            out.goodput_tokens_per_second = found.goodput_tokens_per_second

    def _users(self, reader: FileReader, out: ServingResult, job: str,
               user_dirs: list[str]) -> None:
        firsts: list[float] = []
        for name in sorted(user_dirs):
            directory = f"{job}/users/{name}"
            try:
                index = int(name.split("-", 1)[1])
            except (IndexError, ValueError):
                reader.problem(directory, "not a user-NNN dir")
                continue
            code_text = reader.text(f"{directory}/exit_code", required=False)
            user = UserServing(index=index, exit_code=int(code_text.strip())
                               if code_text and code_text.strip().lstrip("-").isdigit()
                               else None)
            bench = self._benchmark(reader, f"{directory}/guidellm.json")
            if bench is not None and user.exit_code == 0:
                totals = bench.metrics.request_totals
                user.successful, user.errored = totals.successful, totals.errored
                user.ttft_ms_p50 = _stats(bench.metrics.time_to_first_token_ms.successful).p50
                user.request_latency_s_p50 = _stats(bench.metrics.request_latency
                                                    .successful).p50
                ends = [r.request_end_time for r in bench.requests.successful
                        if r.request_end_time is not None]
                # from the client's first request (its benchmark start), not its process
                # start: the load generator's own boot is not the server's responsiveness
                if ends and bench.start_time is not None:
                    user.time_to_first_success_s = max(0.0, min(ends) - bench.start_time)
                    firsts.append(user.time_to_first_success_s)
            out.users.append(user)
        ok = [u for u in out.users if u.exit_code == 0 and u.successful]
        out.successful = sum(u.successful or 0 for u in out.users)
        out.errored = sum(u.errored or 0 for u in out.users)
        out.measured = bool(ok) and out.exit_code == 0
        if out.measured:
            ttfts = sorted(u.ttft_ms_p50 for u in ok if u.ttft_ms_p50 is not None)
            latencies = sorted(u.request_latency_s_p50 for u in ok
                               if u.request_latency_s_p50 is not None)
            if ttfts:
                out.ttft_ms = Stats(p50=ttfts[len(ttfts) // 2], mean=sum(ttfts) / len(ttfts))
            if latencies:
                out.request_latency_s = Stats(p50=latencies[len(latencies) // 2],
                                              mean=sum(latencies) / len(latencies))
        if firsts:
            out.samples = {"time_to_first_success_s": sorted(firsts)}
