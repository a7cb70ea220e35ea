"""Publish a run: S3 upload of the artifact dir + KPI history, OpenSearch documents.

Targets come from the config's ``export_artifacts`` block plus, for credentials, the secret
dir (``secrets.s3_credentials`` as ``KEY=VALUE`` lines, ``secrets.opensearch_instances`` as
YAML ``{name: {url, user, password, ...}}``), falling back to the AWS environment / a saved
Prefect block of the instance's name. A failure never touches the local artifacts.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

import pandas as pd
from prefect.blocks.core import Block

from analysis.history import HistoryStore
from analysis.lts import LtsPayload
from blocks.horreum import HorreumInstance
from blocks.opensearch import OpenSearchInstance
from blocks.s3 import S3Target
from core.errors import ConfigError
from core.safeio import read_text_bounded
from projects.library import ExportBlock, SecretsBlock
from tasks.artifacts import step
from tasks.publish.horreum import DEFAULT_SCHEMA_URI, HorreumUpload, upload_payloads
from tasks.publish.opensearch import export_payloads
from tasks.publish.s3 import ExportResult, s3_append_lock, upload_dir
from tasks.retry import RetryPolicy
from tasks.secrets import from_secret_file, read_env_file, read_yaml_secret, secret_file

__all__ = ["append_history", "horreum_instance", "opensearch_instance", "publish_horreum",
           "publish_opensearch", "s3_target", "upload_run"]

logger = logging.getLogger("telltale.export")
B = TypeVar("B", bound=Block)


def s3_target(export: ExportBlock, secrets: SecretsBlock) -> S3Target:
    """Build the S3 target from ``export_artifacts.s3`` and the secret dir.

    Raises:
        ConfigError: No bucket configured, or an unreadable credentials file.
    """
    s3 = export.s3
    if not s3.bucket:
        raise ConfigError("export needs a bucket", key="export_artifacts.s3.bucket")
    creds: dict[str, Any] = {}
    path = secret_file(secrets.dir.env_key, secrets.s3_credentials)
    if path is not None:
        values = read_env_file(path)
        creds = {"access_key_id": values.get("AWS_ACCESS_KEY_ID"),
                 "secret_access_key": values.get("AWS_SECRET_ACCESS_KEY")}
    return S3Target(bucket=s3.bucket, prefix=s3.prefix or "telltale",
                    endpoint_url=s3.endpoint_url, region=s3.region, **creds)


def _named_instance(model: type[B], name: str | None, secrets: SecretsBlock, file_name: str | None,
                    key: str) -> B:
    """An instance block by name: from the secret dir's YAML file, else a saved Prefect block.

    One lookup for every service (OpenSearch, Horreum): the file wins when the secret dir
    has it; an error names the key and the names the file has, never a value.
    """
    what = model.get_block_type_name()
    if not name:
        raise ConfigError(f"{what}: an instance name is needed", key=key)
    path = secret_file(secrets.dir.env_key, file_name)
    if path is not None:
        instances = read_yaml_secret(path)
        if name not in instances:
            raise ConfigError(f"instance {name!r} is not in the secret file; it has: "
                              f"{', '.join(sorted(instances)) or '(none)'}", key=key)
        return from_secret_file(model, instances[name], file=str(path))
    try:
        return model.load(name)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"no {what} {name!r}: set ${secrets.dir.env_key} with "
                          f"{file_name} or save a '{model.get_block_type_slug()}' block "
                          f"({exc})", key=key) from None


def opensearch_instance(export: ExportBlock, secrets: SecretsBlock) -> OpenSearchInstance:
    """The OpenSearch instance ``export_artifacts.opensearch.instance`` names.

    Raises:
        ConfigError: No instance name, or the name is in neither place.
    """
    return _named_instance(OpenSearchInstance, export.opensearch.instance, secrets,
                           secrets.opensearch_instances, "export_artifacts.opensearch.instance")


def horreum_instance(export: ExportBlock, secrets: SecretsBlock) -> HorreumInstance:
    """The Horreum instance ``export_artifacts.horreum.instance`` names.

    Raises:
        ConfigError: No instance name, or the name is in neither place.
    """
    return _named_instance(HorreumInstance, export.horreum.instance, secrets,
                           secrets.horreum_instances, "export_artifacts.horreum.instance")


# No Prefect-level retries on the export steps: boto3 (standard mode) and the OpenSearch
# RetryPolicy already retry each request with backoff; a second layer would multiply waits.
@step("export", timeout_seconds=3600)
def upload_run(root: str, target: S3Target, flow: str, run_id: str,
               valid: bool) -> ExportResult:
    """Upload the artifact dir with its manifest (see `tasks.publish.s3.upload_dir`).

    Args:
        root: The run's artifact dir.
        target: The S3 target.
        flow: Flow name (key level).
        run_id: Run id (key level).
        valid: False when the test failed (the export is marked invalid).

    Returns:
        The `ExportResult`.
    """
    return upload_dir(root, target, flow, run_id, valid=valid)


@step("export", timeout_seconds=600)
def append_history(target: S3Target, kpis_file: str, project: str) -> int:
    """Append the run's KPI rows to the S3 history dataset (the block's own identity).

    A separate step from the upload: when it fails the run's KPIs are not stored, which
    fails the run whatever ``export_artifacts.fail_on_error`` says.

    Returns:
        The rows appended.
    """
    store = HistoryStore(target.history_uri(project), filesystem=target.filesystem(),
                         lock=s3_append_lock(target, project))
    return store.append(pd.read_parquet(kpis_file))


LTS_MAX_BYTES = 1024 * 1024 * 1024
"""The largest ``lts_payload.json`` read back for publication (one payload a cell)."""


def _lts_payloads(lts_file: str) -> list[LtsPayload]:
    """The post-process step's LTS payloads, read through the bounded reader."""
    return [LtsPayload.model_validate(p) for p in json.loads(read_text_bounded(
        lts_file, LTS_MAX_BYTES, what="LTS payloads"))]


@step("export", timeout_seconds=600)
def publish_opensearch(instance: OpenSearchInstance, lts_file: str, index: str,
                       kpi_index: str | None, valid: bool,
                       policy: RetryPolicy | None = None) -> dict[str, int]:
    """Publish one document per run (and per KPI) from the post-process ``lts_payload.json``.

    ``policy``: the retries of each request (``export_artifacts.opensearch.retry``).
    """
    payloads = _lts_payloads(lts_file)
    return export_payloads(instance, payloads, index=index, kpi_index=kpi_index, valid=valid,
                           policy=policy or RetryPolicy())


@step("export", timeout_seconds=600)
def publish_horreum(instance: HorreumInstance, lts_file: str, export: ExportBlock,
                    valid: bool) -> dict[str, int]:
    """Upload each cell's LTS document as a Horreum run (``export_artifacts.horreum``).

    Returns:
        ``{"uploaded": n, "present": m}`` (runs already in Horreum are not uploaded again).
    """
    block = export.horreum
    if not block.test_name:
        raise ConfigError("Horreum export needs the test's name",
                          key="export_artifacts.horreum.test_name")
    payloads = _lts_payloads(lts_file)
    where = HorreumUpload(test=block.test_name, owner=block.owner, access=block.access,
                          schema_uri=block.schema_uri or DEFAULT_SCHEMA_URI)
    return upload_payloads(instance, payloads, where, valid=valid,
                           policy=RetryPolicy(**block.retry.model_dump()))
