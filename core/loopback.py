"""This machine's loopback: where the services Telltale starts for itself listen.

The shared Prefect API (`flows.local_api`) and the spare Prometheus (`tasks.observe.spare`)
leave a record of their address in a file; a record edited to point elsewhere is refused by
`LOOPBACK_URL`, never used.
"""

from __future__ import annotations

__all__ = ["LOOPBACK_HOST", "LOOPBACK_URL", "loopback_address", "loopback_url"]

LOOPBACK_HOST = "127.0.0.1"
LOOPBACK_URL = r"^http://127\.0\.0\.1:[0-9]{1,5}$"
"""The pattern of `loopback_url`'s answers (a pydantic ``Field(pattern=...)``)."""


def loopback_address(port: int) -> str:
    """``127.0.0.1:<port>``: a listen address or a scrape target."""
    return f"{LOOPBACK_HOST}:{port}"


def loopback_url(port: int) -> str:
    """``http://127.0.0.1:<port>``: a service of this machine's own."""
    return f"http://{loopback_address(port)}"
