from __future__ import annotations

import hashlib
import json
from pathlib import Path

import boto3
import pytest

from blocks.s3 import S3Target
from core.errors import PermanentServiceError, ResultsError, TransientServiceError
from tasks.publish.s3 import download_run, safe_target, upload_dir
from tests.servers.fault_proxy import fault_proxy


def make_run(root: Path) -> Path:
    (root / "000__cell" / "artifacts").mkdir(parents=True)
    (root / "000__cell" / "settings.yaml").write_text("gpu: 0\n")
    (root / "000__cell" / "exit_code").write_text("0\n")
    (root / "000__cell" / "artifacts" / "pod.log").write_text("x" * 1000)
    (root / "big.bin").write_bytes(bytes(range(256)) * (40 * 1024 * 4))  # 40 MiB: multipart
    (root / ".telltale-dirs.lock").write_text("")
    return root


def target(endpoint: str, bucket: str, **kwargs) -> S3Target:
    return S3Target(bucket=bucket, endpoint_url=endpoint, region="us-east-1",
                    access_key_id="testing", secret_access_key="testing", **kwargs)


def test_upload_with_manifest_and_export_url(tmp_path: Path, s3_server: str, s3_bucket: str) -> None:
    run = make_run(tmp_path / "run")
    result = upload_dir(run, target(s3_server, s3_bucket), "fine-tuning", "run-1", valid=False)
    assert result.url == f"s3://{s3_bucket}/telltale/fine-tuning/run-1/"
    assert (run / "export.url").read_text().strip() == result.url
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert "telltale/fine-tuning/run-1/000__cell/artifacts/pod.log" in keys
    assert "telltale/fine-tuning/run-1/manifest.json" in keys
    assert not any(k.endswith(".telltale-dirs.lock") for k in keys)
    manifest = json.loads(s3.get_object(Bucket=s3_bucket, Key=result.manifest_key)["Body"].read())
    assert manifest["valid"] is False
    big = next(f for f in manifest["files"] if f["path"] == "big.bin")
    assert big["sha256"] == hashlib.sha256((run / "big.bin").read_bytes()).hexdigest()
    body = s3.get_object(Bucket=s3_bucket, Key="telltale/fine-tuning/run-1/big.bin")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == big["sha256"]


def test_5xx_then_success_is_retried(tmp_path: Path, s3_server: str, s3_bucket: str) -> None:
    run = make_run(tmp_path / "run")
    with fault_proxy(s3_server) as (url, faults):
        faults.fail_next(3, 503)
        upload_dir(run, target(url, s3_bucket), "f", "r")
        assert faults.injected == 3
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    assert s3.head_object(Bucket=s3_bucket, Key="telltale/f/r/big.bin")["ContentLength"] == \
        (run / "big.bin").stat().st_size


def test_persistent_5xx_is_transient_and_4xx_permanent(tmp_path: Path, s3_server: str,
                                                      s3_bucket: str) -> None:
    run = make_run(tmp_path / "run")
    with fault_proxy(s3_server) as (url, faults):
        faults.fail_next(500, 500)
        with pytest.raises(TransientServiceError) as info:
            upload_dir(run, target(url, s3_bucket, max_attempts=2), "f", "r", workers=1)
        assert info.value.status == 500
    with pytest.raises(PermanentServiceError) as info:
        upload_dir(run, target(s3_server, "no-such-bucket"), "f", "r")
    assert info.value.status == 404
    assert (run / "000__cell" / "exit_code").exists()  # local artifacts untouched


def test_download_modes_and_mtime(tmp_path: Path, s3_server: str, s3_bucket: str) -> None:
    run = make_run(tmp_path / "run")
    t = target(s3_server, s3_bucket)
    upload_dir(run, t, "f", "r")
    url = f"s3://{s3_bucket}/telltale/f/r"
    important = download_run(url, tmp_path / "imp", mode="important", target=t)
    assert "000__cell/settings.yaml" in important and "big.bin" not in important
    cache = download_run(url, tmp_path / "cache", mode="cache", target=t)
    assert "000__cell/artifacts/pod.log" not in cache
    everything = download_run(url, tmp_path / "all", mode="all", target=t)
    assert "big.bin" in everything
    original = (run / "000__cell" / "settings.yaml").stat().st_mtime_ns
    assert (tmp_path / "all" / "000__cell" / "settings.yaml").stat().st_mtime_ns == original


def test_malicious_keys_are_refused(tmp_path: Path, s3_server: str, s3_bucket: str) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    s3.put_object(Bucket=s3_bucket, Key="telltale/f/evil/ok.txt", Body=b"fine")
    s3.put_object(Bucket=s3_bucket, Key="telltale/f/evil/../../escape.txt", Body=b"bad")
    s3.put_object(Bucket=s3_bucket, Key="telltale/f/evil/manifest.json", Body=json.dumps({
        "complete": True, "files": [{"path": "ok.txt", "size": 4,
                                     "sha256": hashlib.sha256(b"fine").hexdigest()}]}))
    with pytest.raises(ResultsError, match="refusing key"):
        download_run(f"s3://{s3_bucket}/telltale/f/evil", tmp_path / "dest", mode="all",
                     target=target(s3_server, s3_bucket))
    assert not (tmp_path / "dest" / "ok.txt").exists()  # checked before anything is written
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize("key", ["../x", "/etc/passwd", "a/../../x", "a//b", "a\\..\\x", ""])
def test_safe_target_refuses(tmp_path: Path, key: str) -> None:
    with pytest.raises(ResultsError):
        safe_target(tmp_path, key)
    assert safe_target(tmp_path, "a/b.txt") == (tmp_path / "a" / "b.txt").resolve()


def test_history_append_uses_the_blocks_identity_not_the_environment(
        tmp_path: Path, s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One S3 access path: uploads and the Parquet history share the block's credentials."""
    import pandas as pd

    from analysis.history import HistoryStore
    from tasks.artifacts import use_artifact_dir
    from tasks.publish.export import append_history

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    run = tmp_path / "run"
    run.mkdir()
    kpis = tmp_path / "kpis.parquet"
    pd.DataFrame({"run_uuid": ["u1"], "kpi": ["k"], "value": [1.0], "unit": ["s"],
                  "lower_better": [True], "ignored_for_regression": [False],
                  "timestamp": [pd.Timestamp("2026-11-23", tz="UTC")]}).to_parquet(kpis)
    block = target(s3_server, s3_bucket)
    with use_artifact_dir(tmp_path / "steps"):
        append_history.fn(block, str(kpis), "fine_tuning")
    stored = HistoryStore(block.history_uri("fine_tuning"), filesystem=block.filesystem()).read()
    assert list(stored["run_uuid"]) == ["u1"]


def test_an_export_cut_short_is_marked_partial_and_refused(tmp_path: Path, s3_server: str,
                                                           s3_bucket: str) -> None:
    run = make_run(tmp_path / "run")
    with fault_proxy(s3_server) as (proxy, faults):
        block = target(proxy, s3_bucket, max_attempts=1)
        faults.fail_after(1, count=1_000, status=403)  # the first manifest, then refused
        with pytest.raises(PermanentServiceError):
            upload_dir(run, block, "fine-tuning", "run-1")
        faults.pending.clear()
    direct = target(s3_server, s3_bucket)
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    manifest = json.loads(s3.get_object(Bucket=s3_bucket, Key="telltale/fine-tuning/run-1/"
                                        "manifest.json")["Body"].read())
    assert manifest["complete"] is False  # marked before the first file went up
    with pytest.raises(ResultsError, match="partial export"):
        download_run(f"s3://{s3_bucket}/telltale/fine-tuning/run-1", tmp_path / "dest",
                     mode="all", target=direct)


def test_replot_downloads_are_verified_against_the_manifest(tmp_path: Path, s3_server: str,
                                                            s3_bucket: str) -> None:
    run = make_run(tmp_path / "run")
    block = target(s3_server, s3_bucket)
    result = upload_dir(run, block, "fine-tuning", "run-2")
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    base = result.manifest_key.rsplit("/", 1)[0]
    s3.put_object(Bucket=s3_bucket, Key=f"{base}/somedir/", Body=b"")  # a console's marker
    fetched = download_run(result.url.rstrip("/"), tmp_path / "ok", mode="all", target=block)
    assert "000__cell/artifacts/pod.log" in fetched and "somedir/" not in fetched
    s3.put_object(Bucket=s3_bucket, Key=f"{base}/000__cell/artifacts/pod.log", Body=b"altered")
    with pytest.raises(ResultsError, match="does not match the export's manifest"):
        download_run(result.url.rstrip("/"), tmp_path / "bad", mode="all", target=block)


def test_the_s3_append_lock_is_exclusive_and_taken_over_when_expired(
        s3_server: str, s3_bucket: str) -> None:
    """A lease object created with a conditional put: one holder at a time; a dead holder's
    lock is taken over once it expires; a release never deletes a successor's lock."""
    from tasks.publish.s3 import LOCK_KEY, s3_append_lock

    block = target(s3_server, s3_bucket)
    key = f"telltale/history/fine_tuning/{LOCK_KEY}"
    first = s3_append_lock(block, "fine_tuning", sleep=lambda s: None)
    second = s3_append_lock(block, "fine_tuning", wait_s=0, sleep=lambda s: None)
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    with first():
        assert json.loads(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())["owner"]
        with pytest.raises(TransientServiceError, match="still held by another writer"):
            with second():
                pass
    assert "Contents" not in s3.list_objects_v2(Bucket=s3_bucket, Prefix=key)  # released
    # a writer that died holding it: its lease ran out, the next one takes over
    s3.put_object(Bucket=s3_bucket, Key=key, Body=b'{"owner": "dead", "expires": 0}',
                  IfNoneMatch="*")
    with second() as owner:
        assert json.loads(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())[
            "owner"] == owner
    # and one that is not a lock at all (unreadable) counts as a dead writer's too
    s3.put_object(Bucket=s3_bucket, Key=key, Body=b"garbage")
    with second():
        pass


def test_s3_history_appends_of_one_uuid_store_one_identity(s3_server: str, s3_bucket: str,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """Two exports appending the same run uuid with two identities at once, through the
    block's lock: one is stored, the other refused (widened check, as the local test)."""
    import threading

    import pandas as pd

    from analysis.history import IDENTITY, HistoryConflictError, HistoryStore
    from tasks.publish.s3 import s3_append_lock

    block = target(s3_server, s3_bucket)
    original = HistoryStore._check_append
    inside = threading.Semaphore(0)

    def widened(self: HistoryStore, frame: pd.DataFrame) -> None:
        inside.release()
        inside.acquire(timeout=1.0)
        original(self, frame)

    monkeypatch.setattr(HistoryStore, "_check_append", widened)
    results: list[str] = []

    def write(identity: str) -> None:
        frame = pd.DataFrame({"run_uuid": ["u1"], "kpi": ["k"], "value": [1.0], "unit": ["s"],
                              "lower_better": [True], "ignored_for_regression": [False],
                              "timestamp": [pd.Timestamp("2026-11-23", tz="UTC")],
                              IDENTITY: [identity]})
        store = HistoryStore(block.history_uri("fine_tuning"), filesystem=block.filesystem(),
                             lock=s3_append_lock(block, "fine_tuning"))
        try:
            store.append(frame)
            results.append("stored")
        except HistoryConflictError:
            results.append("refused")

    threads = [threading.Thread(target=write, args=(i,)) for i in ("aaa", "bbb")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["refused", "stored"]
    stored = HistoryStore(block.history_uri("fine_tuning"), filesystem=block.filesystem()).read()
    assert stored[IDENTITY].nunique() == 1
