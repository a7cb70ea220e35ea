"""S3 target block: where run artifacts and Parquet history go (AWS, MinIO, any S3 server)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from prefect.blocks.core import Block
from pydantic import Field

from blocks.secret import SecretText

__all__ = ["S3Target"]


class S3Target(Block):
    """An S3 bucket and prefix, with the endpoint and credentials to reach it.

    Credentials left empty fall back to boto3's usual chain (environment, profile, role).

    Example:
        ```python
        from blocks.s3 import S3Target
        target = S3Target(bucket="cpt-results", endpoint_url="https://minio.example:9000")
        with target.client() as s3:
            s3.list_objects_v2(Bucket=target.bucket)
        ```
    """

    _block_type_name = "Telltale S3 Target"
    _description = "S3 bucket, prefix, endpoint and credentials for Telltale exports."

    bucket: str = Field(description="Bucket name.")
    prefix: str = Field(default="telltale", description="Key prefix of every export.")
    endpoint_url: str | None = Field(default=None, description="S3-protocol endpoint URL.")
    region: str | None = Field(default=None, description="Region name.")
    access_key_id: SecretText | None = Field(default=None, description="Access key id.")
    secret_access_key: SecretText | None = Field(default=None, description="Secret access key.")
    max_attempts: int = Field(default=6, ge=1, description="boto3 attempts per request.")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="Connect timeout.")
    read_timeout_s: float = Field(default=120.0, gt=0, description="Read timeout.")

    def __repr__(self) -> str:  # never show credentials
        return (f"S3Target(bucket={self.bucket!r}, prefix={self.prefix!r}, "
                f"endpoint_url={self.endpoint_url!r})")

    def client_kwargs(self) -> dict[str, Any]:
        """Arguments for ``boto3.client('s3', ...)``, with retries and timeouts set."""
        from botocore.config import Config

        kwargs: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "config": Config(retries={"mode": "standard", "max_attempts": self.max_attempts},
                             connect_timeout=self.connect_timeout_s,
                             read_timeout=self.read_timeout_s,
                             max_pool_connections=32),
        }
        if self.access_key_id and self.secret_access_key:
            kwargs["aws_access_key_id"] = self.access_key_id.get_secret_value()
            kwargs["aws_secret_access_key"] = self.secret_access_key.get_secret_value()
        return kwargs

    @contextmanager
    def client(self) -> Iterator[Any]:
        """Yield a boto3 S3 client and close it afterwards."""
        import boto3

        client = boto3.session.Session().client("s3", **self.client_kwargs())
        try:
            yield client
        finally:
            client.close()

    def filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` with this block's endpoint, region and credentials.

        The same identity as `client`: history appends and artifact uploads never disagree
        on who they are (no silent fall-back to other environment credentials).
        """
        from pyarrow import fs

        options: dict[str, Any] = {"region": self.region or "us-east-1",
                                   "connect_timeout": self.connect_timeout_s,
                                   "request_timeout": self.read_timeout_s}
        if self.endpoint_url:
            parsed = urlparse(self.endpoint_url)
            options["endpoint_override"] = parsed.netloc
            options["scheme"] = parsed.scheme or "https"
        if self.access_key_id and self.secret_access_key:
            options["access_key"] = self.access_key_id.get_secret_value()
            options["secret_key"] = self.secret_access_key.get_secret_value()
        return fs.S3FileSystem(**options)

    def uri(self, *parts: str) -> str:
        """``s3://bucket/prefix/part/...``."""
        keys = "/".join(p.strip("/") for p in (self.prefix, *parts) if p and p.strip("/"))
        return f"s3://{self.bucket}/{keys}"

    def history_uri(self, project: str) -> str:
        """Parquet history location for pyarrow, endpoint included when one is set."""
        uri = self.uri("history", project)
        if self.endpoint_url:
            parsed = urlparse(self.endpoint_url)
            uri += f"?endpoint_override={parsed.netloc}&scheme={parsed.scheme or 'https'}"
            if self.region:
                uri += f"&region={self.region}"
        return uri
