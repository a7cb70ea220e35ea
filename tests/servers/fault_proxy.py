"""An HTTP proxy for tests that answers the first N requests with an error, then forwards.

moto cannot return 5xx on its own; this proxy sits in front of it (127.0.0.1 only) so tests
can check that clients retry server faults. Error bodies are S3-style XML.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlparse

from tests.servers import serve

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-authorization", "proxy-authenticate"}


class FaultState:
    """Fault switches and counters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: list[int] = []
        self.injected = 0
        self.forwarded = 0

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status``."""
        with self.lock:
            self.pending.extend([status] * count)

    def fail_after(self, passed: int, count: int, status: int = 503) -> None:
        """Forward the next ``passed`` requests, then answer ``count`` with ``status``."""
        with self.lock:
            self.pending.extend([0] * passed + [status] * count)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().strip().split(b";")[0], 16)
            if size == 0:
                handler.rfile.readline()
                break
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
        return b"".join(chunks)
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


class _Handler(BaseHTTPRequestHandler):
    state: FaultState
    upstream: tuple[str, int]
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        body = _read_body(self)
        with self.state.lock:
            status = self.state.pending.pop(0) if self.state.pending else None
            if status:  # 0 (fail_after) or None: forward
                self.state.injected += 1
            else:
                self.state.forwarded += 1
        if status:
            data = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                    + (b"SlowDown" if status == 503 else b"InternalError")
                    + b"</Code><Message>injected fault</Message></Error>")
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in _HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815


@contextmanager
def fault_proxy(upstream_url: str) -> Iterator[tuple[str, FaultState]]:
    """Run the proxy on 127.0.0.1 in front of ``upstream_url``; yields (url, state)."""
    parsed = urlparse(upstream_url)
    state = FaultState()
    handler = type("Handler", (_Handler,), {"state": state,
                                            "upstream": (parsed.hostname, parsed.port)})
    with serve(handler) as port:
        yield f"http://127.0.0.1:{port}", state
