"""A Prometheus HTTP API (``/api/v1/query_range``) serving recorded-shape cluster series.

It does not evaluate PromQL: it recognises the metric a query reads (cAdvisor's
``container_cpu_usage_seconds_total`` / ``container_memory_working_set_bytes``, DCGM's
``DCGM_FI_DEV_GPU_UTIL`` / ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_POWER_USAGE`` /
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, a counter growing at the power) and answers what that expression gives on
a cluster running one training pod with two GPUs, with the labels the real exporters put on
each series, one sample per ``step`` over [start, end]. A bearer token is required when one
is configured (401 otherwise, as OpenShift's Thanos querier answers); ``mode`` makes it
misbehave (``503``, ``garbage``); ``admin`` opens the snapshot endpoint (403 otherwise).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["SERIES", "prometheus_api"]

_POD = {"namespace": "fine-tuning-testing", "pod": "fine-tuning-master-0",
        "container": "pytorch"}
_GPU = {"exported_namespace": "fine-tuning-testing", "exported_pod": "fine-tuning-master-0",
        "Hostname": "gpu-node-1", "modelName": "NVIDIA A100-SXM4-80GB"}
# metric read by the query -> [(labels, value)]: what the query's expression evaluates to
SERIES: dict[str, list[tuple[dict[str, str], float | Callable[[float], float]]]] = {
    "container_cpu_usage_seconds_total": [({}, 7.5)],  # sum(rate(...)): cores
    "container_memory_working_set_bytes": [({}, 24e9)],  # sum(...): bytes
    "DCGM_FI_DEV_GPU_UTIL": [({**_GPU, "gpu": "0", "UUID": "GPU-0"}, 80.0),
                             ({**_GPU, "gpu": "1", "UUID": "GPU-1"}, 60.0)],
    "DCGM_FI_DEV_FB_USED": [({**_GPU, "gpu": "0", "UUID": "GPU-0"}, 30_000 * 1048576),
                            ({**_GPU, "gpu": "1", "UUID": "GPU-1"}, 20_000 * 1048576)],
    "DCGM_FI_DEV_POWER_USAGE": [({**_GPU, "gpu": "0", "UUID": "GPU-0"}, 300.0),
                                ({**_GPU, "gpu": "1", "UUID": "GPU-1"}, 250.0)],
    # the energy counter / 1000 (mJ since the driver loaded, in J): it grows at the power
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": [
        ({**_GPU, "gpu": "0", "UUID": "GPU-0"}, lambda t: 5e6 + 300.0 * t),
        ({**_GPU, "gpu": "1", "UUID": "GPU-1"}, lambda t: 4e6 + 250.0 * t)],
}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any] | bytes) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        server: Any = self.server
        server.requests.append({"path": self.path, "query": {},
                                "authorization": self.headers.get("Authorization")})
        if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
            self._send(401, {"status": "error", "errorType": "unauthorized"})
        elif self.path == "/api/v1/admin/tsdb/snapshot" and server.admin:
            self._send(200, {"status": "success",
                             "data": {"name": "20260101T000000Z-0123456789abcdef"}})
        else:  # Prometheus without --web.enable-admin-api
            self._send(403, {"status": "error", "errorType": "unavailable",
                             "error": "admin APIs disabled"})

    def do_GET(self) -> None:  # noqa: N802
        server: Any = self.server
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        server.requests.append({"path": url.path, "query": query,
                                "authorization": self.headers.get("Authorization")})
        if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
            self._send(401, {"status": "error", "errorType": "unauthorized"})
            return
        if server.mode == "503":
            self._send(503, b"")
            return
        if url.path != "/api/v1/query_range":
            self._send(404, {"status": "error", "error": "not found"})
            return
        if server.mode == "garbage":
            self._send(200, {"status": "success", "data": {"resultType": "matrix",
                                                           "result": "x"}})
            return
        try:
            start, end, step = (float(query[k]) for k in ("start", "end", "step"))
        except (KeyError, ValueError):
            self._send(400, {"status": "error", "errorType": "bad_data"})
            return
        metric = next((m for m in SERIES if m in query.get("query", "")), None)
        stamps = [start + i * step for i in range(int((end - start) / step) + 1)]
        result = [{"metric": labels,
                   "values": [[t, str(value(t) if callable(value) else value)] for t in stamps]}
                  for labels, value in (SERIES[metric] if metric else [])]
        self._send(200, {"status": "success",
                         "data": {"resultType": "matrix", "result": result}})


@contextmanager
def prometheus_api(token: str | None = None) -> Iterator[Any]:
    """Serve on 127.0.0.1; yields the server (``.url``, ``.requests``, ``.mode``)."""
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.token, server.mode, server.requests, server.admin = token, "ok", [], False
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
