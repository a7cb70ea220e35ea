"""OpenSearch export: one document per run, per-KPI documents, and a history query.

One document per run (``_id`` = run uuid), optional per-KPI documents, and a label-filtered,
paginated history query.

Through OpenSearch's own client, opensearch-py (connection pool, auth, TLS, the bulk helper).
Endpoints it calls (and the test server implements): ``HEAD /<index>``, ``PUT /<index>``
(explicit mappings), ``POST /_bulk`` (NDJSON ``index`` actions), ``POST /<index>/_search``
(``bool.filter`` of ``term`` clauses, ``sort``, ``size``, ``search_after``).

Re-exporting a run overwrites its document (same ``_id``), never duplicates it. Transient
faults (5xx, 429, connection errors, timeouts) are retried with backoff; anything else fails at
once with the server's reason. The history query never downloads a whole index: it filters by
the run's labels and KPI and pages through the matches.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pandas as pd

from analysis.fingerprint import encode
from analysis.history import FINGERPRINT, VALIDITY, matched_labels
from analysis.kpi import BASE_COLUMNS
from analysis.lts import LtsPayload
from blocks.opensearch import OpenSearchInstance
from core.errors import PermanentServiceError, TransientServiceError
from core.redact import redact
from tasks.retry import RetryPolicy, call_with_retries

__all__ = [
    "KPI_MAPPINGS",
    "RUN_MAPPINGS",
    "OpenSearchHistory",
    "bulk_index",
    "ensure_index",
    "export_payloads",
    "kpi_documents",
    "run_document",
]

logger = logging.getLogger("telltale.opensearch")
T = TypeVar("T")

_LABELS_AS_KEYWORDS = [{"labels": {"path_match": "*labels.*", "match_mapping_type": "string",
                                   "mapping": {"type": "keyword"}}}]
RUN_MAPPINGS: dict[str, Any] = {
    "dynamic_templates": _LABELS_AS_KEYWORDS,
    "properties": {
        "metadata": {"properties": {
            "run_uuid": {"type": "keyword"}, "start": {"type": "date"},
            "end": {"type": "date"}, "status": {"type": "keyword"},
            "exit_code": {"type": "integer"}, "presets": {"type": "keyword"},
            "project": {"type": "keyword"}, "schema_version": {"type": "keyword"},
            "config": {"type": "text", "index": False},
            "settings": {"type": "object", "enabled": False},
        }},
        "labels": {"type": "object"},
        "results": {"type": "object"},
        "kpis": {"type": "object"},
        "regression": {"type": "object", "enabled": False},
        "valid": {"type": "boolean"},
    },
}
KPI_MAPPINGS: dict[str, Any] = {
    "dynamic_templates": _LABELS_AS_KEYWORDS,
    "properties": {
        "run_uuid": {"type": "keyword"}, "timestamp": {"type": "date"},
        "kpi": {"type": "keyword"}, "value": {"type": "double"}, "unit": {"type": "keyword"},
        "lower_better": {"type": "boolean"}, "ignored_for_regression": {"type": "boolean"},
        "verdict": {"type": "keyword"}, "labels": {"type": "object"},
        "valid": {"type": "boolean"},
    },
}


def _service_error(exc: Exception, what: str) -> Exception:
    """Telltale's transient/permanent error for an opensearch-py exception."""
    from opensearchpy.exceptions import ConnectionError as ClientConnectionError
    from opensearchpy.exceptions import TransportError

    if isinstance(exc, ClientConnectionError):  # refused, reset, timed out, TLS
        return TransientServiceError(f"{what}: {exc}", service="opensearch")
    if isinstance(exc, TransportError):
        status = exc.status_code if isinstance(exc.status_code, int) else None
        reason = json.dumps(exc.info, default=str)[:256] if exc.info else str(exc.error)
        kind = TransientServiceError if status is None or status >= 500 or status == 429 \
            else PermanentServiceError
        return kind(f"{what}: {reason}", service="opensearch", status=status)
    return exc


def _call(fn: Callable[[], T], policy: RetryPolicy, what: str) -> T:
    """Run one opensearch-py call with the retry policy; errors become Telltale's kinds."""

    def once() -> T:
        try:
            return fn()
        except Exception as exc:
            mapped = _service_error(exc, what)
            if mapped is exc:
                raise
            raise mapped from exc

    return call_with_retries(once, policy, what=f"opensearch {what}")


def ensure_index(client: Any, index: str, mappings: Mapping[str, Any],
                 policy: RetryPolicy = RetryPolicy()) -> bool:
    """Create ``index`` with explicit mappings when it does not exist; True when created."""
    if _call(lambda: client.indices.exists(index=index), policy, f"check index {index}"):
        return False
    try:
        _call(lambda: client.indices.create(index=index, body={"mappings": dict(mappings)}),
              policy, f"create index {index}")
    except PermanentServiceError as exc:
        if exc.status == 400 and "already_exists" in str(exc):
            return False  # created concurrently: fine
        raise
    return True


def bulk_index(client: Any, index: str, documents: Iterable[tuple[str, dict[str, Any]]],
               policy: RetryPolicy = RetryPolicy(), chunk: int = 500) -> int:
    """Index documents with opensearch-py's bulk helper.

    The ``index`` action: the same ``_id`` overwrites, so a retried chunk never duplicates.

    Returns:
        Documents indexed.

    Raises:
        PermanentServiceError: An item was refused (mapping error...), with its reason.
        TransientServiceError: The server kept answering 5xx/429 or was unreachable.
    """
    from opensearchpy import helpers

    actions = [{"_op_type": "index", "_index": index, "_id": doc_id,
                # a sink: secrets masked by key and by value (core.redact)
                "_source": redact(json.loads(json.dumps(body, default=str)))}
               for doc_id, body in documents]
    if not actions:
        return 0

    def once() -> int:
        indexed, failed = helpers.bulk(client, actions, chunk_size=chunk, max_retries=0,
                                       raise_on_error=False, stats_only=False)
        if failed:
            items = [item.get("index", {}) for item in failed if isinstance(item, dict)]
            statuses = {int(i.get("status", 500)) for i in items}
            reason = json.dumps(items[0].get("error"))[:256] if items else "unknown"
            kind = TransientServiceError if statuses <= {429, 503} else PermanentServiceError
            raise kind(f"{len(failed)} document(s) refused by {index}: {reason}",
                       service="opensearch", status=max(statuses) if statuses else None)
        return int(indexed)

    return _call(once, policy, f"bulk index into {index}")


def _labels(payload: LtsPayload) -> dict[str, str]:
    for kpi in payload.kpis.values():
        return dict(kpi.labels)
    return {}


def run_document(payload: LtsPayload, *, valid: bool) -> dict[str, Any]:
    """The run's document: the LTS payload plus top-level labels and validity."""
    body = payload.model_dump(mode="json")
    body["labels"] = _labels(payload)
    body["valid"] = valid
    return body


def kpi_documents(payload: LtsPayload, *, valid: bool) -> list[tuple[str, dict[str, Any]]]:
    """One document per KPI (for dashboards): ``_id`` = ``<run uuid>-<kpi>``."""
    run_uuid = payload.metadata.run_uuid or "unknown"
    verdicts = payload.regression or {}
    return [(f"{run_uuid}-{name}", {
        "run_uuid": run_uuid, "timestamp": payload.metadata.start, "kpi": name,
        "value": kpi.value, "unit": kpi.unit, "lower_better": kpi.lower_better,
        "ignored_for_regression": kpi.ignored_for_regression,
        "verdict": (verdicts.get(name) or {}).get("verdict"), "labels": kpi.labels,
        "valid": valid}) for name, kpi in payload.kpis.items()]


def export_payloads(instance: OpenSearchInstance, payloads: Sequence[LtsPayload], *,
                    index: str, kpi_index: str | None = None, valid: bool = True,
                    policy: RetryPolicy = RetryPolicy()) -> dict[str, int]:
    """Publish one document per run (and per KPI when ``kpi_index`` is set).

    Returns:
        Documents written per index.
    """
    written: dict[str, int] = {}
    with instance.client() as client:
        run_index = instance.index(index)
        ensure_index(client, run_index, RUN_MAPPINGS, policy)
        written[run_index] = bulk_index(client, run_index, (
            (p.metadata.run_uuid or "unknown", run_document(p, valid=valid)) for p in payloads),
            policy)
        if kpi_index:
            full = instance.index(kpi_index)
            ensure_index(client, full, KPI_MAPPINGS, policy)
            written[full] = bulk_index(client, full, (
                doc for p in payloads for doc in kpi_documents(p, valid=valid)), policy)
    logger.info("published to OpenSearch: %s", written)
    return written


def _label_filter(name: str, value: str | None) -> dict[str, Any]:
    """The filter of one label (`analysis.history.matched_labels`: unset matches absent)."""
    field = f"labels.{name}"
    if value not in (None, ""):
        return {"term": {field: value}}
    return {"bool": {"should": [{"term": {field: ""}},
                                {"bool": {"must_not": [{"exists": {"field": field}}]}}],
                     "minimum_should_match": 1}}


class OpenSearchHistory:
    """KPI history read from the run index, filtered by labels, paginated.

    Implements the history interface post-processing uses (`query`; appending happens
    through `export_payloads`).
    """

    def __init__(self, instance: OpenSearchInstance, index: str, *, page_size: int = 500,
                 max_runs: int = 5000, policy: RetryPolicy = RetryPolicy()) -> None:
        self.instance = instance
        self.index = instance.index(index)
        self.page_size = page_size
        self.max_runs = max_runs
        self.policy = policy

    def __repr__(self) -> str:
        return f"OpenSearchHistory({self.instance!r}, index={self.index!r})"

    def query(self, labels: Mapping[str, str | None], *, kpi: str | None = None,
              compared_label: str | None = None, ignored_labels: Iterable[str] = (),
              exclude_runs: Iterable[str] = ()) -> pd.DataFrame:
        """Rows (one per run × KPI) of the runs whose labels match, oldest first."""
        filters: list[dict[str, Any]] = [
            _label_filter(name, value)
            for name, value in matched_labels(labels, compared_label, ignored_labels).items()]
        filters.append({"term": {"valid": True}})
        if kpi is not None:
            filters.append({"exists": {"field": f"kpis.{kpi}.value"}})
        excluded = set(exclude_runs)
        rows: list[dict[str, Any]] = []
        search_after: list[Any] | None = None
        seen = 0
        with self.instance.client() as client:
            while seen < self.max_runs:
                body: dict[str, Any] = {
                    "size": self.page_size,
                    "query": {"bool": {"filter": filters}},
                    # newest first: past max_runs it is the oldest runs that are left out
                    # (ascending kept the oldest and judged against them)
                    "sort": [{"metadata.start": "desc"}, {"metadata.run_uuid": "desc"}],
                    "_source": ["metadata.run_uuid", "metadata.start", "metadata.validity",
                                "metadata.fingerprint", "kpis", "labels"],
                }
                if search_after is not None:
                    body["search_after"] = search_after
                try:
                    answer = _call(lambda b=body: client.search(index=self.index, body=b),
                                   self.policy, f"search {self.index}")
                except PermanentServiceError as exc:
                    if exc.status == 404:
                        break  # no index yet: no history
                    raise
                hits = answer.get("hits", {}).get("hits", [])
                for hit in hits:
                    source = hit.get("_source", {})
                    meta = source.get("metadata", {})
                    if meta.get("run_uuid") in excluded:
                        continue
                    for name, value in (source.get("kpis") or {}).items():
                        if kpi is not None and name != kpi:
                            continue
                        rows.append({"run_uuid": meta.get("run_uuid"),
                                     "timestamp": meta.get("start"), "kpi": name,
                                     "value": value.get("value"), "unit": value.get("unit"),
                                     "lower_better": value.get("lower_better"),
                                     "ignored_for_regression": value.get(
                                         "ignored_for_regression", False),
                                     **(source.get("labels") or {}),
                                     # not labels: never matched, read by the verdicts
                                     VALIDITY: meta.get("validity"),
                                     FINGERPRINT: encode(meta["fingerprint"]) if isinstance(
                                         meta.get("fingerprint"), dict) else None})
                seen += len(hits)
                if len(hits) < self.page_size:
                    break
                search_after = hits[-1].get("sort")
        frame = pd.DataFrame(rows, columns=None if rows else BASE_COLUMNS)
        if not frame.empty:
            frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce")
            frame = frame.sort_values("timestamp", kind="stable").reset_index(drop=True)
        return frame
