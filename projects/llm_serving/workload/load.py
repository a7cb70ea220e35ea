"""One cell's load: GuideLLM against a running model server, its /metrics before and after.

    python load.py CONFIG_JSON --out DIR

``CONFIG_JSON``: ``guidellm`` (argv prefix), ``target`` (base URL; default the
``TELLTALE_SERVICE_URL`` the local platform sets), ``model`` (served name), ``tokenizer``,
``concurrency``, ``prompt_tokens``, ``output_tokens``, ``duration_s``, ``request_format``,
``warmup_s`` (seconds of load left out of the statistics: a cold server's first requests),
and optionally ``wait_ready_s`` (poll the server's ``/health`` that long first: on a
cluster the load Pod may start before KServe has loaded the model) and ``stall_grace_s``
(default 120: see `stall_after_s`; a GuideLLM that stalls is killed and started once more).
Standard library only, so the same file runs in the load generator's image on a cluster.

GuideLLM spends ~9 s of its start importing torch, transformers and datasets. When this
script runs in an interpreter that has GuideLLM's command line and benchmark modules imported
already (a warm Python of the serving venv that forked it: `core.warm_python`, the local
platform) and the configured ``guidellm`` is that interpreter's own console script, GuideLLM
runs in a child forked from this process instead of a new one (`_guidellm_in_process`): the
same command line, the same code, without the imports. Anywhere else (a cluster's load Pod,
a fresh process) it is executed as a command, as before.

Writes ``DIR/metrics_before.txt``, ``DIR/guidellm.json``, ``DIR/metrics_after.txt``,
``DIR/load.json`` (what ran, when, the server's version) and prints two lines: the result
in compact form (``{"event": "guidellm", ...}``: the statistics the parser reads and up to
200 requests' timings; a cluster keeps only the Pod's log) and a summary.
Exit codes: 0 measured; 2 bad config; 3 GuideLLM failed (or stalled twice); 4 no request
succeeded. GuideLLM's
warnings are recorded (``load.json``: ``warnings``, and ``invalid_warnings``, those listed in
``invalid_on_warnings``, default ``generation_delay_ttft``: its own request generation
bottlenecked the run). They make the measurement *invalid* (post-processing keeps it, never
judges it), not the workload failed: exit 0.
"""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

_MAX_METRICS = 8 * 1024 * 1024
_SAFE = re.compile(r"^[A-Za-z0-9_./:@+-]+$")  # no comma: GuideLLM splits its k=v lists on it
_INT_KEYS = ("concurrency", "prompt_tokens", "output_tokens", "duration_s")


def _get(url, limit=_MAX_METRICS):
    """GET ``url``; the body (bounded), or None when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 (http only)
            return answer.read(limit).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _wait_ready(target, seconds):
    """Poll ``/health`` until it answers 200 (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(target + "/health", timeout=10) as answer:  # noqa: S310
                if answer.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(2)


def _config(path):
    with open(path, encoding="utf-8") as stream:
        config = json.load(stream)
    target = str(config.get("target") or os.environ.get("TELLTALE_SERVICE_URL") or "")
    if not re.match(r"^https?://[A-Za-z0-9.-]+(:\d+)?(/[A-Za-z0-9_./-]*)?$", target):
        raise ValueError(f"no usable server URL (target or TELLTALE_SERVICE_URL): {target!r}")
    config["target"] = target.rstrip("/")
    for key in ("model", "tokenizer", "request_format"):
        if not _SAFE.match(str(config.get(key, ""))):
            raise ValueError(f"{key} {config.get(key)!r}: letters, digits and _./:@+- only")
    for key in _INT_KEYS:
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise ValueError(f"{key} must be a positive integer, not {config.get(key)!r}")
    if not isinstance(config.get("guidellm"), list) or not config["guidellm"]:
        raise ValueError("guidellm must be the load generator's command (a list)")
    return config


def guidellm_argv(config, output):
    """The GuideLLM command for one cell (an argv: no shell ever sees a value)."""
    return [*[str(a) for a in config["guidellm"]], "run",
            "--backend", f"kind=openai_http,target={config['target']},model={config['model']},"
                         f"request_format={config['request_format']}",
            "--profile", f"kind=concurrent,streams={config['concurrency']},"
                         f"warmup={int(config.get('warmup_s') or 0)}",
            "--data", f"kind=synthetic_text,prompt_tokens={config['prompt_tokens']},"
                      f"output_tokens={config['output_tokens']}",
            "--constraint", f"kind=max_duration,seconds={config['duration_s']}",
            "--tokenizer", f"kind=hf_auto,model={config['tokenizer']}",
            # lightweight per-request stats only: no prompt/output text in the result file
            "--metrics", "kind=generative,sample_size=0",
            "--output", f"kind=json,path={output}",
            "--disable-console-interactive"]


STALL_GRACE_S = 120
"""Seconds past its load window (and at least twice its length) after which GuideLLM is
taken for stalled: killed and started again once."""
ATTEMPTS = 2


def stall_after_s(config):
    """How long GuideLLM may run before it counts as stalled.

    Its warm-up and load window, then ``max(STALL_GRACE_S, 2 x duration)`` for its start
    (tokenizer, workers) and its report.
    """
    duration = int(config["duration_s"])
    grace = int(config.get("stall_grace_s") or STALL_GRACE_S)
    return int(config.get("warmup_s") or 0) + duration + max(grace, 2 * duration)


def _run_guidellm(command, stall_s):
    """Run GuideLLM; a run that outlives ``stall_s`` is killed and started once more.

    GuideLLM sometimes stops between its last request and its report, alive and idle
    (upstream: vllm-project/guidellm#431 and #1152; seen once in this suite, after the
    server had answered every request). Without this the cell waited for its own deadline
    (10 minutes for a 10-second load) and failed. Returns the exit code of the last attempt
    (124 when every attempt stalled).
    """
    for attempt in range(1, ATTEMPTS + 1):
        print("$ " + " ".join(command), flush=True)
        proc = _ForkedGuideLLM(command) if _guidellm_in_process(command) \
            else subprocess.Popen(command)
        try:
            return proc.wait(timeout=stall_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            print(f"warning: guidellm stalled: still running {stall_s} s after it started "
                  "(a known GuideLLM hang, vllm-project/guidellm#431): killed"
                  + (f"; starting it again (attempt {attempt + 1} of {ATTEMPTS})"
                     if attempt < ATTEMPTS else ""), file=sys.stderr, flush=True)
        except BaseException:  # interrupted: GuideLLM goes with this step
            proc.kill()
            raise
    return 124


def _guidellm_in_process(command):
    """Whether ``command`` is this interpreter's own GuideLLM, its modules imported already.

    Its console script beside this interpreter (the same venv), GuideLLM's command line and
    benchmark modules in ``sys.modules`` (a warm Python preloaded them): then a forked child
    runs exactly what the script would, without the ~9 s of imports.
    """
    if os.path.basename(command[0]) != "guidellm" or not hasattr(os, "fork"):
        return False
    here = os.path.dirname(os.path.abspath(sys.executable))
    if os.path.dirname(os.path.abspath(command[0])) != here:
        return False
    return "guidellm.cli" in sys.modules and "guidellm.benchmark" in sys.modules


class _ForkedGuideLLM:
    """GuideLLM's command line run in a forked child; waited for as a `subprocess.Popen` is.

    The child runs the console script's own call (``guidellm.cli.cli``, click) with the
    command's arguments and exits with its code; nothing else of this process runs there.
    """

    def __init__(self, command):
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: GuideLLM, then gone (never back into this script)
            code = 1
            try:
                sys.argv = [command[0], *command[1:]]
                from guidellm.cli import cli

                cli.main(args=list(command[1:]), prog_name="guidellm")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
            except BaseException as exc:  # what Python would print, then its exit code
                import traceback

                traceback.print_exception(exc)
                code = 130 if isinstance(exc, KeyboardInterrupt) else 1
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                os._exit(code)
        self._pidfd = os.pidfd_open(self.pid)

    def wait(self, timeout=None):
        """Its exit code; `subprocess.TimeoutExpired` after ``timeout`` seconds."""
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("guidellm", timeout)
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self._pidfd)
        return self.returncode

    def terminate(self):
        """SIGTERM, as `subprocess.Popen.terminate`."""
        self._signal(signal.SIGTERM)

    def kill(self):
        """SIGKILL, as `subprocess.Popen.kill`."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig):
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


_READ = ("request_latency", "requests_per_second", "time_to_first_token_ms",
         "inter_token_latency_ms", "time_per_output_token_ms", "output_tokens_per_second",
         "request_concurrency")
_REQUEST_FIELDS = ("request_start_time", "request_end_time", "request_latency",
                   "time_to_first_token_ms", "inter_token_latency_ms")
_MAX_LOGGED_REQUESTS = 200


def compact_result(benchmark):
    """The statistics of one GuideLLM benchmark the parser reads, small enough for a log line.

    Same shape as the benchmark in GuideLLM's JSON (so one parser model reads both).
    """
    metrics = benchmark.get("metrics") or {}
    compact = {"request_totals": metrics.get("request_totals")}
    for name in _READ:
        dist = ((metrics.get(name) or {}).get("successful") or {})
        compact[name] = {"successful": {
            "mean": dist.get("mean"), "median": dist.get("median"),
            "percentiles": {k: v for k, v in (dist.get("percentiles") or {}).items()
                            if k in ("p50", "p95", "p99")}}}
    requests = ((benchmark.get("requests") or {}).get("successful") or [])
    step = max(1, -(-len(requests) // _MAX_LOGGED_REQUESTS))  # ceil: at most 200 kept
    delay = (benchmark.get("scheduler_metrics") or {}).get("generation_delay") or {}
    return {"metrics": compact,
            "scheduler_metrics": {"generation_delay": {
                k: delay.get(k) for k in ("mean", "median", "max", "count")}},
            "requests": {"successful": [{k: r.get(k) for k in _REQUEST_FIELDS}
                                        for r in requests[::step]]},
            "warnings": benchmark.get("warnings") or [],
            "start_time": benchmark.get("start_time"), "duration": benchmark.get("duration")}


def _verdict(result_file, invalidating):
    """(exit code, summary) from GuideLLM's JSON.

    ``invalidating``: warning codes that make the measurement invalid (recorded in the
    summary's ``invalid_warnings``; the exit code stays 0).
    """
    try:
        with open(result_file, encoding="utf-8") as stream:
            benchmark = json.load(stream)["benchmarks"][0]
        print(json.dumps({"event": "guidellm", "benchmark": compact_result(benchmark)}),
              flush=True)
        totals = benchmark["metrics"]["request_totals"]
        warnings = [w.get("code") for w in benchmark.get("warnings") or []]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return 3, {"error": f"no readable result: {exc}"}
    summary = {"successful": totals.get("successful"), "errored": totals.get("errored"),
               "incomplete": totals.get("incomplete"), "warnings": warnings,
               "invalid_warnings": [code for code in warnings if code in invalidating]}
    # Nothing succeeded and something errored: the server refused or failed the requests (a
    # failed cell). Nothing succeeded and nothing errored: every request was still running
    # when the window closed (a server too slow for the window, e.g. on a loaded machine) —
    # the server failed nothing; an invalid measurement, which validity decides (re-run once
    # under `validity: enforce`), not a failure.
    if not totals.get("successful") and totals.get("errored"):
        return 4, summary
    return 0, summary


def main(argv):
    """Scrape, load, scrape, judge (see the module docstring)."""
    if len(argv) != 3 or argv[1] != "--out":
        print("usage: load.py CONFIG_JSON --out DIR", file=sys.stderr)
        return 2
    out = argv[2]
    try:
        config = _config(argv[0])
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    if not _wait_ready(config["target"], float(config.get("wait_ready_s") or 0)):
        print(f"error: {config['target']}/health did not answer 200 within "
              f"{config['wait_ready_s']} s", file=sys.stderr)
        return 3
    version = _get(config["target"] + "/version", limit=4096)
    record = {"started_at": time.time(), "target": config["target"],
              "model": config["model"], "concurrency": config["concurrency"],
              "prompt_tokens": config["prompt_tokens"],
              "output_tokens": config["output_tokens"], "duration_s": config["duration_s"]}
    try:
        record["server_version"] = json.loads(version or "{}").get("version")
    except ValueError:
        record["server_version"] = None
    before = _get(config["target"] + "/metrics")
    if before is not None:
        with open(os.path.join(out, "metrics_before.txt"), "w", encoding="utf-8") as stream:
            stream.write(before)
    result_file = os.path.join(out, "guidellm.json")
    command = guidellm_argv(config, result_file)
    code = _run_guidellm(command, stall_after_s(config))
    after = _get(config["target"] + "/metrics")
    if after is not None:
        with open(os.path.join(out, "metrics_after.txt"), "w", encoding="utf-8") as stream:
            stream.write(after)
    record["ended_at"] = time.time()
    record["guidellm_exit_code"] = code
    verdict, summary = (3, {"error": f"guidellm exited with {code}"}) if code != 0 \
        else _verdict(result_file, config.get("invalid_on_warnings", ["generation_delay_ttft"]))
    record.update(summary, exit_code=verdict)
    with open(os.path.join(out, "load.json"), "w", encoding="utf-8") as stream:
        json.dump(record, stream, indent=2)
    print(json.dumps({"event": "summary", **summary, "exit_code": verdict}), flush=True)
    if verdict == 4:
        print(f"error: no request succeeded ({summary.get('errored')} errored): the server "
              "refused or failed every request", file=sys.stderr, flush=True)
    elif verdict == 3:
        print(f"error: {summary.get('error')}", file=sys.stderr, flush=True)
    if verdict == 0 and not summary.get("successful"):
        print(f"warning: no request completed within the {config['duration_s']} s window "
              f"({summary.get('incomplete') or 0} still running, none errored): an invalid "
              "measurement of the server (kept, not judged)", file=sys.stderr, flush=True)
    if summary.get("invalid_warnings"):
        print("warning: GuideLLM says the load generator itself was the bottleneck "
              f"({', '.join(summary['invalid_warnings'])}): an invalid measurement of the "
              "server (kept, not judged)", file=sys.stderr, flush=True)
    return verdict


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
