from __future__ import annotations

import multiprocessing
from pathlib import Path

import pandas as pd
import pytest

from analysis.history import HistoryStore, default_history_uri
from analysis.kpi import Kpi, kpi_table
from core.errors import ResultsError


def rows(run: str, ts: str, value: float, **labels: str) -> pd.DataFrame:
    base = {"model": "m1", "image": "img:1", "os": "fedora"}
    base.update(labels)
    kpis = [Kpi(name=n, value=value * f, unit="u", help="h", lower_better=False, labels=base)
            for n, f in (("tps", 1.0), ("runtime", 2.0))]
    return kpi_table([(run, ts, kpis)])


def fill(store: HistoryStore) -> None:
    store.append(rows("r3", "2026-01-03T00:00:00Z", 3.0))
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    store.append(rows("r2", "2026-01-02T00:00:00Z", 2.0, image="img:2"))
    store.append(rows("r4", "2026-01-04T00:00:00Z", 4.0, model="m2"))
    store.append(rows("r5", "2026-01-05T00:00:00Z", 5.0, os="rhel"))


def check_queries(store: HistoryStore) -> None:
    labels = {"model": "m1", "image": "img:1", "os": "fedora"}
    exact = store.query(labels, kpi="tps")
    assert exact["run_uuid"].tolist() == ["r1", "r3"]  # ordered by time, not by write
    loose = store.query(labels, kpi="tps", compared_label="image", ignored_labels=["os"])
    assert loose["run_uuid"].tolist() == ["r1", "r2", "r3", "r5"]
    assert store.query(labels, kpi="tps", exclude_runs=["r1"])["run_uuid"].tolist() == ["r3"]
    assert store.query({**labels, "unknown_label": "x"}).empty


def test_local_store(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "hist"))
    assert store.read().empty
    fill(store)
    check_queries(store)
    assert len(store.read()) == 10


def test_append_is_idempotent_per_run(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "hist"))
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.5))
    frame = store.read()
    assert len(frame) == 2 and sorted(frame["value"]) == [1.5, 3.0]
    store.append(rows("r2", "2026-01-02T00:00:00Z", 2.0))
    assert store.compact() == 3  # each write is its own file until compacted
    store.append(rows("r1", "2026-01-01T00:00:00Z", 7.0))  # re-append after compaction
    frame = store.read()
    assert len(frame) == 4
    assert frame.loc[(frame.run_uuid == "r1") & (frame.kpi == "tps"), "value"].tolist() == [7.0]


def test_schema_evolution_new_label(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "hist"))
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    store.append(rows("r2", "2026-01-02T00:00:00Z", 2.0, gpu="a100"))
    assert store.query({"model": "m1", "gpu": "a100"}, kpi="tps")["run_uuid"].tolist() == ["r2"]
    assert len(store.read()) == 4


def _append_many(uri: str, worker: int) -> None:
    import analysis.history

    analysis.history.AUTO_COMPACT_PARTS = 3  # compactions race all the time
    store = HistoryStore(uri)
    for i in range(40):
        store.append(rows(f"w{worker}-{i}", f"2026-01-01T00:{i:02d}:00Z", float(i)))


def test_concurrent_appends_and_compactions_lose_no_row(tmp_path: Path) -> None:
    uri = str(tmp_path / "hist")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(uri, w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    frame = HistoryStore(uri).read()
    assert len(frame) == 3 * 40 * 2
    assert frame["run_uuid"].nunique() == 120


def test_s3_store(s3_bucket: str) -> None:
    store = HistoryStore(f"s3://{s3_bucket}/history/fine_tuning")
    fill(store)
    check_queries(store)
    store.append(rows("r1", "2026-01-01T00:00:00Z", 9.0))
    assert store.compact() >= 2
    frame = store.read()
    assert len(frame) == 10
    assert frame.loc[(frame.run_uuid == "r1") & (frame.kpi == "tps"), "value"].tolist() == [9.0]


def test_s3_endpoint_in_uri(s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    host = s3_server.split("://", 1)[1]
    store = HistoryStore(f"s3://{s3_bucket}/h?endpoint_override={host}&scheme=http")
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    assert len(store.read()) == 2


def test_bad_uris() -> None:
    with pytest.raises(ResultsError, match="unsupported history URI"):
        HistoryStore("gs://bucket/x")
    with pytest.raises(ResultsError, match="no bucket"):
        HistoryStore("s3:///x")


def test_default_uri(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TELLTALE_DATA_DIR", str(tmp_path))
    assert default_history_uri("fine_tuning") == str(tmp_path / "history" / "fine_tuning")


def test_run_ids_that_sanitise_alike_keep_their_own_rows(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "hist"))
    store.append(rows("run/a", "2026-01-01T00:00:00Z", 1.0))
    store.append(rows("run:a", "2026-01-02T00:00:00Z", 2.0))
    assert sorted(store.read()["run_uuid"].unique()) == ["run/a", "run:a"]


def test_compaction_never_reverts_a_concurrent_re_append(tmp_path: Path) -> None:
    uri = str(tmp_path / "hist")
    store = HistoryStore(uri)
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    store.append(rows("r2", "2026-01-02T00:00:00Z", 2.0))
    read_files = store._read_files

    def racing(files, *args, **kwargs):  # another writer re-appends r1 mid-compaction
        frame = read_files(files, *args, **kwargs)
        HistoryStore(uri).append(rows("r1", "2026-01-01T00:00:00Z", 9.0))
        return frame

    store._read_files = racing  # type: ignore[method-assign]
    store.compact()
    frame = HistoryStore(uri).read()
    assert frame.loc[(frame.run_uuid == "r1") & (frame.kpi == "tps"), "value"].tolist() == [9.0]


def test_a_truncated_part_file_is_quarantined_not_fatal(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "hist"))
    store.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    store.append(rows("r2", "2026-01-02T00:00:00Z", 2.0, gpu="a100"))
    broken = sorted((tmp_path / "hist").glob("part-r1*.parquet"))[0]
    broken.write_bytes(broken.read_bytes()[:100])  # a crash mid-upload
    assert store.query({"model": "m1", "gpu": "a100"}, kpi="tps")["run_uuid"].tolist() == ["r2"]
    assert (tmp_path / "hist" / "quarantine" / broken.name).is_file()
    assert sorted(store.read()["run_uuid"].unique()) == ["r2"]  # later queries work too


def test_one_append_of_many_runs_is_one_file_and_mixed_labels_stay_apart(
        tmp_path: Path) -> None:
    """A post-processing of many runs appends one file (10 000 files took 250 s and 2 GB);
    a KPI without a label other KPIs have gets a null there, not the string 'None'."""
    frame = kpi_table([
        (f"r{i}", f"2026-01-{i + 1:02d}T00:00:00Z",
         [Kpi(name="tps", value=float(i), unit="u", help="h", lower_better=False,
              labels={"model": "m1"}),
          Kpi(name="cpu", value=1.0, unit="%", help="h", lower_better=True,
              labels={"model": "m1", "node": "n1"})])
        for i in range(30)])
    assert frame.loc[frame.kpi == "tps", "node"].isna().all()
    assert frame.loc[frame.kpi == "cpu", "node"].eq("n1").all()
    store = HistoryStore(str(tmp_path / "hist"))
    assert store.append(frame) == 60
    files = list((tmp_path / "hist").glob("*.parquet"))
    assert len(files) == 1 and files[0].name.startswith("part-r0-") and "+29-" in files[0].name
    assert store.query({"model": "m1"}, kpi="tps")["run_uuid"].tolist() == [
        f"r{i}" for i in range(30)]
    store.append(frame.assign(value=frame["value"] + 100))  # the newest write still wins
    assert store.read()["value"].min() >= 100


def test_rows_read_back_from_a_history_append_again(tmp_path: Path) -> None:
    """A frame read from a history dataset carries ``_written_at``: re-appending it (an
    import, a seeding from another history) replaces that write time, never duplicates it."""
    first = HistoryStore(str(tmp_path / "first"))
    first.append(rows("r1", "2026-01-01T00:00:00Z", 1.0))
    again = pd.read_parquet(tmp_path / "first")
    assert "_written_at" in again.columns
    store = HistoryStore(str(tmp_path / "hist"))
    store.bulk_append(again.assign(run_uuid="r0"))
    store.append(again)
    assert sorted(store.read()["run_uuid"]) == ["r0", "r0", "r1", "r1"]
