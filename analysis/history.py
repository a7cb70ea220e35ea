"""KPI history as a Parquet dataset on local disk or S3.

Layout under the history URI::

    part-<run_uuid>[+N]-<stamp>-<rand>.parquet  one file per append (its first run, N more)
    compacted-<stamp>-<rand>.parquet  many runs merged by `HistoryStore.compact`

Guarantees:

- *append-only per run*: a run's stored rows are never replaced by fewer rows of that run (a
  re-parse that lost a log file is refused with both counts), and a run uuid already stored
  for another run (another identity: a hash of its settings and start) is refused and named
  (`HistoryConflictError`);
- *self-checking parts*: every part carries its schema version in its Parquet metadata; a
  part of a newer version, without the base columns, or with a base column of the wrong
  type (``value`` as text, ``timestamp`` as an integer) is moved to ``quarantine/`` and named
  while the rest is read. Version 1 parts (before the identity column) are read as they are:
  their ``run_identity`` is null, which matches any identity;
- *idempotent per run*: appending the same run again writes a new file, and readers keep only
  the newest write of each run (``_written_at``), so nothing is duplicated;
- *no lost rows under concurrency*: every append writes its own file (atomically: temp file +
  rename locally, a single PUT on S3); compaction only deletes the part files it merged,
  after the merged file exists;
- *fast queries*: `HistoryStore.query` pushes label filters down to Arrow's scanner over a
  few compacted files (appends compact automatically past `AUTO_COMPACT_PARTS` parts).

S3 URIs (``s3://bucket/prefix``) go through ``pyarrow.fs.S3FileSystem``; the endpoint comes
from ``?endpoint_override=host:port&scheme=http`` in the URI or ``$AWS_ENDPOINT_URL``,
credentials from the usual AWS environment variables.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from analysis.history_lock import AppendLock, local_append_lock
from analysis.history_schema import (
    SCHEMA_VERSION,
    VERSION_KEY,
    WRITTEN_AT,
    normalised,
    part_problem,
)
from analysis.kpi import BASE_COLUMNS
from core.environment import default_data_dir
from core.errors import ResultsError, TelltaleError
from core.safeio import atomic_open

READ_ATTEMPTS = 20
"""Reads of a history a compaction races: listed again up to this many times."""

__all__ = [
    "AUTO_COMPACT_PARTS",
    "FINGERPRINT",
    "IDENTITY",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "VALIDITY",
    "CELL",
    "AppendLock",
    "HistoryConflictError",
    "HistorySource",
    "HistoryStore",
    "default_history_uri",
    "matched_labels",
    "open_filesystem",
    "local_append_lock",
    "usable_rows",
]

AUTO_COMPACT_PARTS = 64
logger = logging.getLogger("telltale.history")
_PART = "part-"
_COMPACTED = "compacted-"
_ACCEPT = "accept-"
ALL_KPIS = "*"
"""An accept record for every KPI of a run."""
QUARANTINE = "quarantine"
"""Sub-directory where unreadable history files are moved (kept for inspection)."""
IDENTITY = "run_identity"
"""Column holding a run's identity: a hash of its settings and start
(`analysis.run_analysis.run_identity`)."""
VALIDITY = "validity"
"""Column holding a run's validity: valid, invalid or failed (null in older parts: valid).
Only valid rows are a baseline (`usable_rows`)."""
FINGERPRINT = "fingerprint"
"""Column holding a run's environment fingerprint (JSON, `analysis.fingerprint`)."""
CELL = "cell"
"""Column holding the cell's name (what the terminal and report call it; null before)."""
RUN_COLUMNS = (IDENTITY, VALIDITY, FINGERPRINT, CELL)
"""Per-run columns that are not labels: never matched when selecting a history."""


class HistoryConflictError(TelltaleError):
    """An append that would lose or overwrite stored rows; nothing was written.

    Not a user error of the command line (exit 1): the run's KPIs were not stored.
    """


class HistorySource(Protocol):
    """What regression judging needs from a history: label-matched rows, oldest first.

    `HistoryStore` (Parquet) implements it; so does ``tasks.publish.opensearch.
    OpenSearchHistory``, which this layer never imports.
    """

    def query(self, labels: Mapping[str, str | None], *, kpi: str | None = None,
              compared_label: str | None = None, ignored_labels: Iterable[str] = (),
              exclude_runs: Iterable[str] = ()) -> pd.DataFrame:
        """Rows of the runs whose labels match, ordered by time."""
        ...


def default_history_uri(project: str) -> str:
    """Default history location: ``<data dir>/history/<project>``."""
    return str(default_data_dir() / "history" / project)


def open_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return (filesystem, base path inside it) for a local path or an ``s3://`` URI.

    Raises:
        ResultsError: An unsupported scheme or an S3 URI without a bucket.
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme == "file" else uri).expanduser().resolve()
        return pafs.LocalFileSystem(), str(path)
    if parsed.scheme != "s3":
        raise ResultsError(f"unsupported history URI {uri!r}: use a local path or s3://")
    if not parsed.netloc:
        raise ResultsError(f"history URI {uri!r} has no bucket")
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    endpoint = query.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or \
        os.environ.get("AWS_ENDPOINT_URL")
    options: dict[str, Any] = {
        "region": query.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "connect_timeout": 10,
        "request_timeout": 60,
    }
    if endpoint:
        scheme = query.get("scheme")
        if "://" in endpoint:
            scheme_part, endpoint = endpoint.split("://", 1)
            scheme = scheme or scheme_part
        options["endpoint_override"] = endpoint.rstrip("/")
        options["scheme"] = scheme or "https"
    return pafs.S3FileSystem(**options), f"{parsed.netloc}{parsed.path}".rstrip("/")


class HistoryStore:
    """Append-only, run-idempotent KPI history."""

    def __init__(self, uri: str, filesystem: pafs.FileSystem | None = None,
                 lock: AppendLock | None = None) -> None:
        """Open the history at ``uri``.

        Args:
            uri: A local path or ``s3://bucket/prefix``.
            filesystem: The filesystem to use for an ``s3://`` URI (e.g. built by the S3
                block with its credentials); default: one from the URI and environment.
            lock: What an append holds while it checks and writes (default: a ``flock`` for
                a local history; none for an ``s3://`` one given without its lock).
        """
        self.uri = uri
        self.fs, self.base = open_filesystem(uri)
        if filesystem is not None:
            self.fs = filesystem
        if lock is None and isinstance(self.fs, pafs.LocalFileSystem):
            lock = local_append_lock(self.base)
        self._lock: AppendLock = lock or contextlib.nullcontext

    def __repr__(self) -> str:
        return f"HistoryStore({self.uri.split('?', 1)[0]!r})"

    # -- writing ---------------------------------------------------------------------------

    def _ensure_dir(self) -> None:
        if isinstance(self.fs, pafs.LocalFileSystem):
            self.fs.create_dir(self.base, recursive=True)

    def _write_table(self, table: pa.Table, name: str) -> None:
        self._ensure_dir()
        target = f"{self.base}/{name}"
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               VERSION_KEY: str(SCHEMA_VERSION).encode()})
        if isinstance(self.fs, pafs.LocalFileSystem):
            # temp file + fsync + rename, never through a link: readers never see half a
            # file, and a full disk names the history file that failed
            with atomic_open(target) as stream:
                pq.write_table(table, stream, compression="zstd")
        else:  # safeio-exempt: one S3 PUT is atomic (the object appears whole or not at all)
            pq.write_table(table, target, filesystem=self.fs, compression="zstd")

    def append(self, frame: pd.DataFrame) -> int:
        """Append KPI rows (the tidy table) as one new file.

        A re-append of a run writes a new file: readers keep the newest write of each run,
        and a concurrent compaction (which deletes only the files it merged) can never
        delete it and revert the run to an older write. One file per call, not per run:
        10 000 runs post-processed at once took 250 s and 2 GB as 10 000 files.

        Args:
            frame: Rows with at least `BASE_COLUMNS`.

        Returns:
            The number of rows written.

        Raises:
            ResultsError: Missing columns.
        """
        with self._lock():  # two writers never both pass the identity check for one run
            written = self._write_rows(frame, compacted=False)
        if written and len(self._files(_PART)) > AUTO_COMPACT_PARTS:
            try:
                self.compact()
            except OSError as exc:  # the rows are written; compaction is only an optimisation
                logger.warning("history compaction of %r skipped: %s", self, exc)
        return written

    def bulk_append(self, frame: pd.DataFrame) -> int:
        """Append many runs as a compacted file (seeding a history from imported results).

        Same semantics as `append` (newest write of a run wins); the file does not count
        towards the next automatic compaction.

        Returns:
            The number of rows written.
        """
        with self._lock():
            return self._write_rows(frame, compacted=True)

    def _write_rows(self, frame: pd.DataFrame, *, compacted: bool) -> int:
        missing = [c for c in BASE_COLUMNS if c not in frame.columns]
        if missing:
            raise ResultsError(f"history rows lack columns: {', '.join(missing)}")
        if frame.empty:
            return 0
        frame = normalised(frame)
        self._check_append(frame)
        now = time.time_ns()
        # rows read back from a history (a re-import) carry their old write time: replaced
        table = pa.Table.from_pandas(frame.drop(columns=[WRITTEN_AT], errors="ignore"),
                                     preserve_index=False)
        table = table.append_column(WRITTEN_AT, pa.array([now] * len(frame), pa.int64()))
        if compacted:
            name = f"{_COMPACTED}{now}"
        else:  # readable: the (first) run's id, and how many more runs the file holds
            runs = frame["run_uuid"].unique()
            more = f"+{len(runs) - 1}" if len(runs) > 1 else ""
            name = f"{_PART}{_safe_name(str(runs[0]))}{more}-{now}"
        self._write_table(table, f"{name}-{uuid.uuid4().hex[:8]}.parquet")
        return len(frame)

    def _check_append(self, frame: pd.DataFrame) -> None:
        """Refuse an append that would shrink a stored run or reuse another run's uuid.

        Raises:
            HistoryConflictError: With the run, both counts or both identities.
        """
        runs = [str(r) for r in pd.unique(frame["run_uuid"])]
        stored = self.read(pc.field("run_uuid").isin(runs))
        if stored.empty:
            return
        problems = []
        new_counts = frame.groupby("run_uuid")["kpi"].nunique()
        old_counts = stored.groupby("run_uuid")["kpi"].nunique()
        for run, old in old_counts.items():
            new = int(new_counts.get(run, 0))
            if new < old:
                problems.append(f"run {run}: {new} KPI rows would replace the {int(old)} "
                                "stored (the history is append-only; was a result file "
                                "deleted before this re-parse?)")
        if IDENTITY in frame.columns and IDENTITY in stored.columns:
            new_ids = frame.dropna(subset=[IDENTITY]).groupby("run_uuid")[IDENTITY].first()
            old_ids = stored.dropna(subset=[IDENTITY]).groupby("run_uuid")[IDENTITY].first()
            for run, old_id in old_ids.items():
                new_id = new_ids.get(run)
                if new_id is not None and str(new_id) != str(old_id):
                    problems.append(f"run uuid {run} is already stored for another run "
                                    f"(identity {old_id}, this one {new_id}: its settings or "
                                    "start differ); give this run a new .uuid")
        if problems:
            raise HistoryConflictError(f"history {self.uri.split('?', 1)[0]}: nothing "
                                       "appended: " + "; ".join(problems[:5]))

    def compact(self) -> int:
        """Merge part files (and earlier compactions) into one file; returns files merged."""
        for _ in range(3):
            files = self._files()
            if len(files) <= 1:
                return 0
            try:
                frame = self._read_files(files)
                break
            except FileNotFoundError:  # a concurrent compaction removed a file: list again
                continue
        else:
            return 0  # others keep compacting; the next append tries again
        if frame is None:
            return 0
        table = pa.Table.from_pandas(frame, preserve_index=False)
        name = f"{_COMPACTED}{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
        self._write_table(table, name)
        for path in files:  # only what was merged: concurrent appends survive
            try:
                self.fs.delete_file(path)
            except (FileNotFoundError, OSError):
                pass
        return len(files)

    # -- reading ---------------------------------------------------------------------------

    # -- accepted baselines ----------------------------------------------------------------

    def accept(self, run_uuid: str, kpis: Iterable[str] = (ALL_KPIS,), *, by: str = "",
               note: str = "") -> str:
        """Record that ``run_uuid``'s level is the new baseline of ``kpis`` (default: all).

        Verdicts of later runs compare with that run's level onwards, and a shift that began
        at or before it is no longer news. One small Parquet file per accept (like the
        appends: concurrent accepts never lose each other); returns its path.
        """
        names = sorted({str(k) for k in kpis}) or [ALL_KPIS]
        now = pd.Timestamp.now(tz="UTC")
        table = pa.table({"run_uuid": [run_uuid] * len(names), "kpi": names,
                          "accepted_by": [by] * len(names), "note": [note] * len(names),
                          "accepted_at": [now] * len(names)})
        name = f"{_ACCEPT}{_safe_name(run_uuid)}-{uuid.uuid4().hex[:8]}.parquet"
        self._write_table(table, name)
        return f"{self.base}/{name}"

    def accepted(self) -> dict[str, set[str]]:
        """KPI name (or `ALL_KPIS`) → the run uuids accepted as its baseline."""
        out: dict[str, set[str]] = {}
        for path in self._files(_ACCEPT):
            try:
                table = pq.read_table(path, filesystem=self.fs, columns=["run_uuid", "kpi"])
            except (OSError, pa.ArrowInvalid) as exc:
                self._quarantine(path, str(exc))
                continue
            for run, kpi in zip(table["run_uuid"].to_pylist(), table["kpi"].to_pylist(),
                                strict=True):
                out.setdefault(str(kpi), set()).add(str(run))
        return out

    def _files(self, prefix: str | None = None) -> list[str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except OSError as exc:
            raise ResultsError(f"cannot list history at {self!r}: {exc}") from None
        names = []
        for info in infos:
            name = info.base_name
            if info.type == pafs.FileType.File and name.endswith(".parquet") and (
                name.startswith(prefix) if prefix else name.startswith((_PART, _COMPACTED))
            ):
                names.append(info.path)
        return sorted(names)

    def _quarantine(self, path: str, reason: str) -> None:
        """Move an unreadable file aside so it stops poisoning every later query."""
        target = f"{self.base}/{QUARANTINE}/{path.rsplit('/', 1)[-1]}"
        logger.warning("history file %s is unreadable (%s): moved to %s", path, reason,
                       target)
        try:
            if isinstance(self.fs, pafs.LocalFileSystem):
                self.fs.create_dir(f"{self.base}/{QUARANTINE}", recursive=True)
            self.fs.move(path, target)
        except (OSError, pa.ArrowException) as exc:  # another reader moved it already
            logger.warning("could not quarantine %s: %s", path, exc)

    def _schema(self, files: list[str]) -> pa.Schema:
        """The unified schema of ``files``.

        Each part is checked first (its footer, version and base column types); one that
        fails is quarantined and named (and removed from ``files``) instead of failing
        every query. Label columns are text: a part with another type there is foreign.
        """
        schemas = []
        for path in list(files):
            try:
                schema = pq.read_schema(path, filesystem=self.fs)
            except FileNotFoundError:
                raise
            except (pa.ArrowInvalid, OSError) as exc:
                self._quarantine(path, str(exc)[:200])
                files.remove(path)
                continue
            problem = part_problem(schema)
            if problem is not None:
                self._quarantine(path, problem)
                files.remove(path)
                continue
            schemas.append(schema.remove_metadata())
        if not schemas:
            return pa.schema([])
        return pa.unify_schemas(schemas, promote_options="permissive")

    def _read_files(self, files: list[str], filter_expr: Any = None,
                    columns: list[str] | None = None,
                    schema: pa.Schema | None = None) -> pd.DataFrame | None:
        if not files:
            return None
        schema = schema if schema is not None else self._schema(files)
        if not files:
            return None
        try:
            dataset = ds.dataset(files, schema=schema, format="parquet", filesystem=self.fs)
            table = dataset.to_table(filter=filter_expr, columns=columns)
        except pa.ArrowInvalid:  # a file with a sound footer but broken data: find it
            for path in list(files):
                try:
                    pq.read_table(path, filesystem=self.fs)
                except pa.ArrowInvalid as exc:
                    self._quarantine(path, str(exc)[:200])
                    files.remove(path)
            if not files:
                return None
            dataset = ds.dataset(files, schema=schema, format="parquet", filesystem=self.fs)
            table = dataset.to_table(filter=filter_expr, columns=columns)
        frame = table.to_pandas()
        if frame.empty:
            return frame
        # Newest write of each run wins: re-appends and overlapping compactions collapse.
        newest = frame.groupby("run_uuid")[WRITTEN_AT].transform("max")
        frame = frame[frame[WRITTEN_AT] == newest]
        return frame.drop_duplicates(subset=["run_uuid", "kpi"], keep="last")

    def read(self, filter_expr: Any = None, *, files: list[str] | None = None,
             schema: pa.Schema | None = None) -> pd.DataFrame:
        """Read every row (optionally filtered by an Arrow expression), oldest first."""
        # A concurrent compaction removes the parts it merged: list again. Each retry sees a
        # listing a compaction made progress on, so the reader wins; on a machine loaded far
        # past its cores three tries lost in a row, hence more, with a short growing pause.
        for attempt in range(READ_ATTEMPTS):
            try:
                frame = self._read_files(files if files is not None and attempt == 0
                                         else self._files(), filter_expr,
                                         schema=schema if attempt == 0 else None)
                break
            except FileNotFoundError:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * (attempt + 1))
        if frame is None:
            return pd.DataFrame(columns=BASE_COLUMNS)
        frame = frame.drop(columns=[WRITTEN_AT]).sort_values("timestamp", kind="stable")
        return frame.reset_index(drop=True)

    def query(
        self,
        labels: Mapping[str, str | None],
        *,
        kpi: str | None = None,
        compared_label: str | None = None,
        ignored_labels: Iterable[str] = (),
        exclude_runs: Iterable[str] = (),
    ) -> pd.DataFrame:
        """Rows of the runs whose labels match, ordered by time (oldest first).

        Args:
            labels: The configuration to match (a run's labels).
            kpi: Only this KPI.
            compared_label: The dimension under test; it may differ.
            ignored_labels: Labels that may differ (platform versions, run ids...).
            exclude_runs: Run uuids to leave out (e.g. the run being judged).

        Returns:
            Matching rows sorted by ``timestamp``.
        """
        files = self._files()
        if not files:
            return pd.DataFrame(columns=BASE_COLUMNS)
        schema = self._schema(files)  # read once: the scan below reuses it
        if not files:  # every file was unreadable (and is quarantined now)
            return pd.DataFrame(columns=BASE_COLUMNS)
        known = set(schema.names)
        expr = None
        for name, value in matched_labels(labels, compared_label, ignored_labels).items():
            if name not in known:  # no stored run has this label: none can match a value
                if value in (None, ""):
                    continue
                return pd.DataFrame(columns=BASE_COLUMNS)
            if value in (None, ""):  # unset: rows without it match (`matched_labels`)
                term = pc.field(name).is_null() | (pc.field(name) == "")
            else:
                term = pc.field(name) == str(value)
            expr = term if expr is None else expr & term
        if kpi is not None:
            term = pc.field("kpi") == kpi
            expr = term if expr is None else expr & term
        frame = self.read(expr, files=files, schema=schema)
        excluded = set(exclude_runs)
        if excluded:
            frame = frame[~frame["run_uuid"].isin(excluded)]
        return frame.reset_index(drop=True)


def matched_labels(labels: Mapping[str, str | None], compared_label: str | None,
                   ignored_labels: Iterable[str]) -> dict[str, str | None]:
    """The labels a history row must match: all but the compared and ignored ones.

    An unset label (None or empty) matches a row that has it empty or not at all: a label a
    project adds later (the launch) leaves the histories of the runs that have it unset one
    configuration with the rows written before it existed. Every history reader matches so
    (`HistoryStore.query`, `tasks.publish.opensearch.OpenSearchHistory`).
    """
    skip = set(ignored_labels) | {compared_label} | set(BASE_COLUMNS) | set(RUN_COLUMNS)
    return {name: value for name, value in labels.items() if name not in skip}


def usable_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows a baseline may use: valid runs (older parts, without the column, are)."""
    if VALIDITY not in frame.columns or frame.empty:
        return frame
    status = frame[VALIDITY]
    return frame[status.isna() | (status == "valid")]


def _safe_name(run_uuid: str) -> str:
    """A file-name-safe, collision-free name: readable prefix + a hash of the whole id.

    ``run/a`` and ``run:a`` used to share one file (and lose each other's rows).
    """
    readable = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_uuid)[:80]
    return f"{readable}-{hashlib.sha256(run_uuid.encode()).hexdigest()[:16]}"
