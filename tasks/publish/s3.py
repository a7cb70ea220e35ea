"""Export a run's artifact dir to S3, with a sha256 manifest, and fetch it back safely.

Upload layout: ``s3://<bucket>/<prefix>/<flow>/<run id>/<relative path>``. The manifest
(``manifest.json``, uploaded last) lists every file with its size and sha256, and says whether
the run is *valid* (a failed test still exports, marked invalid). ``export.url`` in the local
artifact dir records where it went.

Speed: files are uploaded by a thread pool (many small files dominate artifact dirs) and big
files in multipart chunks by boto3's transfer manager. Faults: boto3's *standard* retry mode
retries 5xx, throttling and connection errors with backoff; what still fails becomes a
`TransientServiceError` (5xx/throttling/connection) or `PermanentServiceError` (4xx).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field

from blocks.s3 import S3Target
from core.errors import PermanentServiceError, ResultsError, TransientServiceError
from core.safeio import write_text
from tasks.publish import DOWNLOAD_MODES

__all__ = [
    "DOWNLOAD_MODES",
    "ExportResult",
    "download_run",
    "iter_files",
    "map_s3_error",
    "s3_append_lock",
    "safe_target",
    "upload_dir",
    "upload_tree",
]

logger = logging.getLogger("telltale.s3")

MANIFEST = "manifest.json"
EXPORT_URL = "export.url"
# Never exported: lock/pid files, and credentials (a created cluster's kubeconfig).
_SKIP = {".telltale-dirs.lock", "workload.pid", "kubeconfig", "kubeadmin-password"}
_CHUNK = 8 * 1024 * 1024
# What "important" fetches: everything post-processing reads, not the bulky rest.
_IMPORTANT_SUFFIXES = (".yaml", ".yml", ".json", ".log", ".uuid", ".version", ".createdAt",
                       "exit_code", "presets_applied", "skip")


class ExportResult(BaseModel):
    """What an upload did."""

    url: str
    files: int
    bytes: int
    seconds: float
    valid: bool
    manifest_key: str = Field(description="Key of the uploaded manifest.")
    complete: bool = Field(default=True, description="Every file and the final manifest "
                                                     "were uploaded.")


def map_s3_error(exc: BaseException, what: str) -> Exception:
    """Translate a botocore/boto3 error into Telltale's transient/permanent errors."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        ReadTimeoutError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

    if isinstance(exc, S3UploadFailedError):  # boto3 wraps the ClientError it caught
        inner = exc.__cause__ or exc.__context__
        if inner is not None:
            return map_s3_error(inner, what)
        return TransientServiceError(f"{what}: {exc}", service="s3")
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        message = f"{what}: {code} {exc.response.get('Error', {}).get('Message', '')}".strip()
        if (status or 0) >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
            return TransientServiceError(message, service="s3", status=status)
        return PermanentServiceError(message, service="s3", status=status)
    if isinstance(exc, EndpointConnectionError | BotoConnectionError | ReadTimeoutError):
        return TransientServiceError(f"{what}: {exc}", service="s3")
    if isinstance(exc, BotoCoreError):
        return PermanentServiceError(f"{what}: {exc}", service="s3")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def iter_files(root: Path) -> Iterator[Path]:
    """Every regular file under ``root`` to export (lock and pid files excluded), sorted."""
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name not in _SKIP \
                and not path.name.startswith(".telltale_parse_cache.json."):
            yield path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def upload_dir(root: str | Path, target: S3Target, flow: str, run_id: str, *,
               valid: bool = True, workers: int = 8) -> ExportResult:
    """Upload ``root`` under ``<prefix>/<flow>/<run_id>/`` with a manifest; write export.url.

    Args:
        root: The run's artifact dir.
        target: Bucket, prefix, endpoint and credentials.
        flow: Flow name (first path level under the prefix).
        run_id: Run id (second level).
        valid: False when the test failed: the export is kept but marked invalid.
        workers: Files uploaded at once.

    Returns:
        The `ExportResult`.

    Raises:
        TransientServiceError: The server kept failing (5xx, throttling, unreachable).
        PermanentServiceError: A 4xx (bad bucket, credentials...).
    """
    return upload_tree(root, target, target.uri(flow, run_id), valid=valid, workers=workers,
                       meta={"flow": flow, "run_id": run_id})


def upload_tree(root: str | Path, target: S3Target, url: str, *, valid: bool = True,
                workers: int = 8, meta: dict[str, str] | None = None) -> ExportResult:
    """Upload every file under ``root`` to ``url`` (``s3://bucket/key/prefix``) + manifest.

    See `upload_dir`; this is the same for any destination prefix (e.g. a replot's
    ``<run>/plot``). The bucket comes from ``url``; endpoint and credentials from ``target``.
    """
    from boto3.s3.transfer import TransferConfig

    base = Path(root)
    started = time.monotonic()
    files = [p for p in iter_files(base) if p.name not in (MANIFEST, EXPORT_URL)]
    bucket, _, key_root = url[len("s3://"):].partition("/")
    key_root = key_root.strip("/")
    config = TransferConfig(multipart_threshold=_CHUNK, multipart_chunksize=_CHUNK,
                            max_concurrency=4, use_threads=True)
    entries: list[dict[str, Any]] = []

    def put(path: Path, client: Any) -> dict[str, Any]:
        rel = path.relative_to(base).as_posix()
        digest = _sha256(path)
        key = f"{key_root}/{rel}"
        # mtime travels along so a download restores it and the parse caches stay valid.
        metadata = {"sha256": digest, "mtime-ns": str(path.stat().st_mtime_ns)}
        try:
            client.upload_file(str(path), bucket, key, Config=config,
                               ExtraArgs={"Metadata": metadata})
        except Exception as exc:
            raise map_s3_error(exc, f"upload {rel}") from exc
        return {"path": rel, "size": path.stat().st_size, "sha256": digest}

    def manifest(complete: bool, error: str | None = None) -> dict[str, Any]:
        data = {**(meta or {}), "valid": valid, "complete": complete,
                "exported_at": datetime.now(UTC).isoformat(),
                "files": entries, "bytes": sum(e["size"] for e in entries)}
        if error:
            data["error"] = error[:500]
        return data

    def put_manifest(client: Any, data: dict[str, Any]) -> None:
        write_text(base / MANIFEST, json.dumps(data, indent=1))
        try:
            client.upload_file(str(base / MANIFEST), bucket, f"{key_root}/{MANIFEST}")
        except Exception as exc:
            raise map_s3_error(exc, "upload manifest") from exc

    with target.client() as client:
        # First a manifest saying "incomplete": an export cut short (a 403 mid-way, a
        # crash) is marked as such, and replot refuses it, instead of objects with no
        # manifest at all.
        put_manifest(client, manifest(False))
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for entry in pool.map(lambda p: put(p, client), files):
                    entries.append(entry)
        except Exception as exc:
            try:
                put_manifest(client, manifest(False, f"{type(exc).__name__}: {exc}"))
            except Exception as marker_error:  # the server refuses even that: say so
                logger.error("export to s3://%s/%s is partial and unmarked: %s", bucket,
                             key_root, marker_error)
            raise
        final = manifest(True)
        put_manifest(client, final)
    url = f"s3://{bucket}/{key_root}/"
    write_text(base / EXPORT_URL, url + "\n")
    result = ExportResult(url=url, files=len(entries), bytes=final["bytes"],
                          seconds=time.monotonic() - started, valid=valid,
                          manifest_key=f"{key_root}/{MANIFEST}")
    logger.info("exported %d files (%.1f MB) to %s in %.1fs%s", result.files,
                result.bytes / 1e6, url, result.seconds, "" if valid else " (marked invalid)")
    return result


def safe_target(root: Path, relative: str) -> Path:
    """Resolve ``relative`` under ``root``, refusing anything that would escape it.

    Raises:
        ResultsError: Absolute paths, ``..`` components, or a resolved path outside ``root``.
    """
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts or "\\" in relative \
            or any(part in ("", ".") for part in relative.split("/")):
        raise ResultsError(f"refusing key {relative!r}: it would escape {root}")
    target = (root / pure).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ResultsError(f"refusing key {relative!r}: it would escape {root}")
    return target


def _wanted(rel: str, mode: Literal["cache", "important", "all"]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if mode == "all":
        return True
    if mode == "cache":  # enough to re-run post-processing from the parse caches
        return name in ("settings.yaml", "exit_code", "skip", ".uuid",
                        ".telltale_parse_cache.json", "config.yaml", "presets_applied")
    return name.endswith(_IMPORTANT_SUFFIXES) or name == ".telltale_parse_cache.json"


def _manifest_of(client: Any, bucket: str, prefix: str, url: str) -> dict[str, Any]:
    """The export's manifest; refuse an export without one or marked incomplete."""
    try:
        body = client.get_object(Bucket=bucket, Key=f"{prefix}{MANIFEST}")["Body"].read()
    except Exception as exc:
        error = map_s3_error(exc, f"read {MANIFEST}")
        if getattr(error, "status", None) == 404 or "NoSuchKey" in str(error):
            raise ResultsError(f"{url} has no {MANIFEST}: not a Telltale export, or one "
                               "cut short before it began") from None
        raise error from exc
    try:
        manifest = json.loads(body[:64 * 1024 * 1024])
    except ValueError:
        raise ResultsError(f"{url}: {MANIFEST} is not JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ResultsError(f"{url}: {MANIFEST} has no file list")
    if manifest.get("complete") is False:
        raise ResultsError(f"{url} is a partial export ({manifest.get('error') or 'cut short'})"
                           ": its files cannot be trusted")
    return manifest


def download_run(url: str, dest: str | Path, *, mode: Literal["cache", "important", "all"],
                 target: S3Target) -> list[str]:
    """Fetch an exported run (``s3://bucket/prefix/flow/run-id``) into ``dest``.

    The export's manifest decides: no manifest, or one marked incomplete, stops the fetch;
    only the files it lists are fetched, and each must match its recorded size and sha256.
    Every key is checked with `safe_target` first: a key that would land outside ``dest``
    stops the download with an error, before anything is written. Directory markers
    (``somedir/``, as S3 consoles create) are skipped.

    Returns:
        The relative paths fetched.

    Raises:
        ResultsError: No or partial manifest, an escaping key, or a file whose content is
            not what the manifest recorded.
    """
    if mode not in DOWNLOAD_MODES:
        raise ResultsError(f"unknown download mode {mode!r}; choose {', '.join(DOWNLOAD_MODES)}")
    if not url.startswith("s3://"):
        raise ResultsError(f"not an s3:// URL: {url}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = prefix.strip("/") + "/"
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    fetched: list[str] = []
    with target.client() as client:
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                      Prefix=prefix)
            keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
        except Exception as exc:
            raise map_s3_error(exc, f"list {url}") from exc
        if not keys:
            raise ResultsError(f"nothing exported under {url}")
        manifest = _manifest_of(client, bucket, prefix, url)
        expected = {str(e.get("path")): e for e in manifest["files"] if isinstance(e, dict)}
        plan = [(key, key[len(prefix):]) for key in keys if not key.endswith("/")]
        targets = {rel: safe_target(root, rel) for _, rel in plan}  # all checked up front
        for key, rel in plan:
            if rel not in expected or not _wanted(rel, mode):
                continue  # not part of this export (e.g. a later replot's plot/), or unwanted
            path = targets[rel]
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                client.download_file(bucket, key, str(path))
                head = client.head_object(Bucket=bucket, Key=key)
            except Exception as exc:
                raise map_s3_error(exc, f"download {rel}") from exc
            entry = expected[rel]
            if path.stat().st_size != entry.get("size") or _sha256(path) != entry.get("sha256"):
                raise ResultsError(f"{url}{rel} does not match the export's manifest "
                                   "(size or sha256): refusing a corrupted or altered run")
            mtime = (head.get("Metadata") or {}).get("mtime-ns")
            if mtime and mtime.isdigit():
                os.utime(path, ns=(int(mtime), int(mtime)))
            fetched.append(rel)
    os.utime(root)
    return fetched


LOCK_KEY = ".append.lock"
LOCK_LEASE_S = 120.0
"""A history lock object older than this is a crashed writer's: it may be taken over."""
LOCK_WAIT_S = 600.0


def s3_append_lock(target: S3Target, project: str, *, lease_s: float = LOCK_LEASE_S,
                   wait_s: float = LOCK_WAIT_S, sleep: Callable[[float], None] = time.sleep,
                   ) -> Callable[[], contextlib.AbstractContextManager[object]]:
    """The append lock of an ``s3://`` history (`analysis.history.AppendLock`).

    A lease object ``<history>/.append.lock`` created with a conditional put
    (``If-None-Match: *``: exactly one writer's create succeeds), holding its owner and its
    expiry; released by deleting it (``If-Match`` its own ETag, so a writer never deletes a
    successor's lock). A lock past its expiry (a writer that died holding it) is removed the
    same way — conditionally on the ETag that was seen expired — and the put tried again.

    Args:
        target: The export's S3 block (one identity for every S3 path).
        project: Whose history.
        lease_s: How long a held lock is honoured (an append takes seconds).
        wait_s: How long to wait for another writer before giving up.
        sleep: The pause between tries (tests pass a no-op).

    Raises:
        TransientServiceError: Still held by another writer after ``wait_s``.
    """
    key = f"{target.uri('history', project)[len(f's3://{target.bucket}/'):]}/{LOCK_KEY}"

    @contextlib.contextmanager
    def hold() -> Iterator[object]:
        from botocore.exceptions import ClientError

        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        with target.client() as client:
            deadline = time.monotonic() + wait_s
            pause = 0.05
            while True:
                body = json.dumps({"owner": owner, "expires": time.time() + lease_s})
                try:
                    etag = client.put_object(Bucket=target.bucket, Key=key, Body=body.encode(),
                                             IfNoneMatch="*")["ETag"]
                    break
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in (
                            "PreconditionFailed", "ConditionalRequestConflict"):
                        raise map_s3_error(exc, f"lock {key}") from exc
                if _remove_if_expired(client, target.bucket, key):
                    continue  # a dead writer's: try again at once
                if time.monotonic() > deadline:
                    raise TransientServiceError(
                        f"history lock s3://{target.bucket}/{key} still held by another "
                        f"writer after {wait_s:.0f} s", service="s3")
                sleep(pause)
                pause = min(pause * 2, 2.0)
            try:
                yield owner
            finally:
                try:
                    client.delete_object(Bucket=target.bucket, Key=key, IfMatch=etag)
                except ClientError as exc:  # expired and taken over meanwhile: not ours
                    logger.warning("history lock %s not released: %s", key, exc)

    return hold


def _remove_if_expired(client: Any, bucket: str, key: str) -> bool:
    """Delete a lock object whose lease ran out, only if it is still the one read.

    Returns:
        True when the lock is gone (expired and removed, or released meanwhile).
    """
    from botocore.exceptions import ClientError

    try:
        answer = client.get_object(Bucket=bucket, Key=key)
        expires = float(json.loads(answer["Body"].read(4096)).get("expires", 0))
    except ClientError:
        return True  # released meanwhile: the next put may win
    except (ValueError, TypeError, AttributeError):
        expires = 0.0  # not a lock we can read: treat it as a dead writer's
    if expires >= time.time():
        return False
    try:
        client.delete_object(Bucket=bucket, Key=key, IfMatch=answer["ETag"])
    except ClientError:
        return False  # another writer took it over first
    return True
