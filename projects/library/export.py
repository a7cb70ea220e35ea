"""The ``export_artifacts`` block: S3 and OpenSearch publication."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core.strict import StrictSettings

__all__ = ["ExportBlock", "ExportRetryBlock", "HorreumExportBlock", "OpenSearchExportBlock",
           "S3ExportBlock"]


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
    # instance and index are also what `analysis.history_source: opensearch` judges against,
    # published to or not
    instance: str | None = Field(default=None, description="Instance name in the secret file.",
                                 json_schema_extra={"used_when_disabled": True})
    index: str = Field(default="fine-tuning", description="Run index (prefix added by block).",
                       json_schema_extra={"used_when_disabled": True})
    kpi_index: str | None = Field(default=None, description="Per-KPI index for dashboards.")
    retry: ExportRetryBlock = Field(default_factory=ExportRetryBlock,
                                    description="Retries of each OpenSearch request.")


class HorreumExportBlock(StrictSettings):
    """Each cell's LTS document as one Horreum run (the field's ``lts.horreum.test_name``).

    The test must exist in Horreum (its schema, labels and change detection are defined
    there, see docs/publishing.md); a re-export of the same run uploads nothing.
    """

    enabled: bool = Field(default=False, description="Upload to Horreum.")
    instance: str | None = Field(default=None, description="Instance name in the secret file "
                                 "(secrets.horreum_instances) or of a saved block.")
    test_name: str | None = Field(default=None, max_length=255,
                                  description="The Horreum test the runs belong to.")
    owner: str | None = Field(default=None, max_length=255,
                              description="Team owning the runs (a Horreum team role).")
    access: Literal["PUBLIC", "PROTECTED", "PRIVATE"] = Field(
        default="PROTECTED", description="Who sees the runs in Horreum.")
    schema_uri: str | None = Field(default=None, max_length=255, description="The documents' "
                                   "$schema; null: urn:telltale:lts:<LTS schema version>.")
    retry: ExportRetryBlock = Field(default_factory=ExportRetryBlock,
                                    description="Retries of each Horreum request.")


class ExportBlock(StrictSettings):
    """Where results are published."""

    enabled: bool = Field(default=False, description="Publish results at the end of the run.")
    fail_on_error: bool = Field(default=False, description="An export failure fails the run.")
    # the run's S3 identity: also what an s3:// history and `flows.replot` use, whether or not
    # the run publishes (so setting it with publishing off is not "a setting that does nothing")
    s3: S3ExportBlock = Field(default_factory=S3ExportBlock,
                              json_schema_extra={"used_when_disabled": True})
    opensearch: OpenSearchExportBlock = Field(default_factory=OpenSearchExportBlock)
    horreum: HorreumExportBlock = Field(default_factory=HorreumExportBlock)
