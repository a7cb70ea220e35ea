"""OpenSearch instance block: where one LTS document per run is published."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.blocks.core import Block
from pydantic import Field

from blocks.secret import SecretText

__all__ = ["OpenSearchInstance"]


class OpenSearchInstance(Block):
    """An OpenSearch (or Elasticsearch-compatible) endpoint and its credentials.

    Example:
        ```python
        from blocks.opensearch import OpenSearchInstance
        instance = OpenSearchInstance(url="https://opensearch.example:9200", user="cpt")
        with instance.client() as client:   # an opensearch-py `OpenSearch`
            client.info()
        ```
    """

    _block_type_name = "Telltale OpenSearch Instance"
    _description = "OpenSearch URL, credentials and index prefix for Telltale exports."

    url: str = Field(description="Base URL, e.g. https://opensearch.example:9200.")
    user: str | None = Field(default=None, description="Basic-auth user.")
    password: SecretText | None = Field(default=None, description="Basic-auth password.")
    index_prefix: str = Field(default="telltale-", description="Prefix added to index names.")
    verify_certs: bool = Field(default=True, description="Verify the server's TLS certificate.")
    ca_bundle: str | None = Field(default=None, description="CA bundle file for TLS.")
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout.")

    def __repr__(self) -> str:  # never show the password
        return f"OpenSearchInstance(url={self.url!r}, user={self.user!r})"

    def index(self, name: str) -> str:
        """Full index name: prefix + name."""
        return f"{self.index_prefix}{name}"

    @contextmanager
    def client(self) -> Iterator[Any]:
        """Yield an ``opensearchpy.OpenSearch`` client bound to the instance (auth, TLS, timeout).

        The client's own retries are off (``max_retries=0``): opensearch-py retries at once,
        with no backoff; Telltale's callers retry transient faults with a backoff policy.
        """
        from opensearchpy import OpenSearch

        auth = None
        if self.user is not None:
            auth = (self.user, self.password.get_secret_value() if self.password else "")
        client = OpenSearch(
            hosts=[self.url.rstrip("/")], http_auth=auth, verify_certs=self.verify_certs,
            ca_certs=self.ca_bundle if (self.ca_bundle and self.verify_certs) else None,
            ssl_show_warn=self.verify_certs, timeout=self.timeout_s, max_retries=0,
            retry_on_timeout=False, http_compress=False)
        try:
            yield client
        finally:
            client.close()
