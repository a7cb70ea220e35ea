"""The ``export_artifacts`` block: S3 and OpenSearch publication."""

from __future__ import annotations

from pydantic import Field

from analysis.strict import StrictSettings

__all__ = ["ExportBlock", "ExportRetryBlock", "OpenSearchExportBlock", "S3ExportBlock"]


class S3ExportBlock(StrictSettings):
    """Artifact upload target (credentials come from a block or the secret dir)."""

    bucket: str | None = Field(default=None, description="Bucket name.")
    prefix: str = Field(default="telltale", description="Key prefix.")
    endpoint_url: str | None = Field(default=None, description="S3-protocol endpoint (MinIO...).")
    region: str | None = Field(default=None, description="Region name.")


class ExportRetryBlock(StrictSettings):
    """How an export request retries a transient failure (refused, timed out, 429, 5xx).

    A permanent failure (a 400, a 403) is never retried. The defaults ride out a service's
    restart of a few seconds; a nightly job that would rather fail fast sets fewer attempts.
    """

    attempts: int = Field(default=5, ge=1, le=20,
                          description="Attempts a request gets, the first included.")
    backoff_base_s: float = Field(default=0.5, ge=0, le=60, description="Wait before the "
                                  "second attempt (seconds), doubled before each next one.")
    backoff_max_s: float = Field(default=30.0, ge=0, le=600,
                                 description="Longest single wait (seconds).")


class OpenSearchExportBlock(StrictSettings):
    """One document per run (and optionally one per KPI)."""

    enabled: bool = Field(default=False, description="Publish to OpenSearch.")
    instance: str | None = Field(default=None, description="Instance name in the secret file.")
    index: str = Field(default="fine-tuning", description="Run index (prefix added by block).")
    kpi_index: str | None = Field(default=None, description="Per-KPI index for dashboards.")
    retry: ExportRetryBlock = Field(default_factory=ExportRetryBlock,
                                    description="Retries of each OpenSearch request.")


class ExportBlock(StrictSettings):
    """Where results are published."""

    enabled: bool = Field(default=False, description="Publish results at the end of the run.")
    fail_on_error: bool = Field(default=False, description="An export failure fails the run.")
    s3: S3ExportBlock = Field(default_factory=S3ExportBlock)
    opensearch: OpenSearchExportBlock = Field(default_factory=OpenSearchExportBlock)
