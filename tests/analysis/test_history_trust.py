"""The history cannot be lost or poisoned: append-only runs, identities, self-checking parts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.history import (
    IDENTITY,
    QUARANTINE,
    SCHEMA_VERSION,
    HistoryConflictError,
    HistoryStore,
)
from analysis.history_schema import decoded
from analysis.kpi import Kpi, kpi_table


def rows(run: str, day: int, value: float, kpis: int = 3, identity: str | None = None,
         **labels: str) -> pd.DataFrame:
    base = {"model": "m1", **labels}
    frame = kpi_table([(run, f"2026-01-{day:02d}T00:00:00Z", [
        Kpi(name=f"k{i}", value=value + i, unit="u", help="h", lower_better=False, labels=base)
        for i in range(kpis)])])
    frame[IDENTITY] = pd.array([identity or f"id-{run}"] * len(frame), dtype="string")
    return frame


def test_a_rerun_with_fewer_kpis_is_refused_with_both_counts(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "h"))
    store.append(rows("r1", 1, 1.0, kpis=15))
    with pytest.raises(HistoryConflictError, match="5 KPI rows would replace the 15"):
        store.append(rows("r1", 1, 1.0, kpis=5))
    assert len(store.read()) == 15
    store.append(rows("r1", 1, 2.0, kpis=15))  # the same run re-parsed whole: fine
    assert store.read()["value"].min() == 2.0


def test_a_uuid_stored_for_another_run_is_refused_and_named(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "h"))
    store.append(rows("r1", 1, 1.0, identity="aaa"))
    with pytest.raises(HistoryConflictError, match="r1 is already stored for another run"):
        store.append(rows("r1", 2, 9.0, identity="bbb"))
    assert store.read()["value"].tolist() == [1.0, 2.0, 3.0]


def _write_part(store: HistoryStore, name: str, table: pa.Table) -> Path:
    path = Path(store.base) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _good(store: HistoryStore) -> None:
    store.append(rows("good1", 1, 1.0))
    store.append(rows("good2", 2, 2.0))


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows as a writer of text columns (an older Telltale, another tool) has them."""
    return pd.DataFrame({name: decoded(frame[name]) for name in frame.columns})


def _poison(frame: pd.DataFrame, **changes: object) -> pa.Table:
    frame = _as_text(frame)
    frame["_written_at"] = 1
    for column, value in changes.items():
        if value is None:
            frame = frame.drop(columns=[column])
        else:
            frame[column] = value
    return pa.Table.from_pandas(frame, preserve_index=False)


@pytest.mark.parametrize(("label", "table", "reason"), [
    ("value as text", lambda f: _poison(f, value="fast"), "column value is"),
    ("timestamp as integer", lambda f: _poison(f, timestamp=17), "column timestamp is int64"),
    ("no run_uuid", lambda f: _poison(f, run_uuid=None), "not a Telltale history part"),
    ("label as a number", lambda f: _poison(f, model=3), "label column model is int64"),
    ("foreign table", lambda f: pa.table({"a": [1], "b": ["x"]}), "not a Telltale history"),
    ("newer version", lambda f: _poison(f).replace_schema_metadata(
        {b"telltale.history.schema": str(SCHEMA_VERSION + 1).encode()}), "newer than"),
    ("lost flag", lambda f: _poison(f, lower_better="no"), "column lower_better"),
    ("timezone-naive time", lambda f: _poison(f, timestamp=pd.Timestamp("2026-01-03")),
     "column timestamp is timestamp"),
])
def test_a_poisoned_part_is_quarantined_named_and_the_rest_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, label: str, table: object,
        reason: str) -> None:
    store = HistoryStore(str(tmp_path / "h"))
    _good(store)
    bad = _write_part(store, "part-evil.parquet", table(rows("evil", 3, 9.0)))
    frame = store.read()
    assert sorted(frame["run_uuid"].unique()) == ["good1", "good2"], label
    assert (Path(store.base) / QUARANTINE / bad.name).exists() and not bad.exists()
    assert str(bad) in caplog.text and reason in caplog.text
    labels = {"model": "m1"}
    assert len(store.query(labels, kpi="k0")) == 2  # queries go on too
    store.append(rows("good3", 4, 3.0))
    assert len(store.read()) == 9


def test_a_version_1_part_is_read_with_a_null_identity(tmp_path: Path) -> None:
    store = HistoryStore(str(tmp_path / "h"))
    old = rows("old", 1, 1.0).drop(columns=[IDENTITY])
    old["_written_at"] = 1
    _write_part(store, "part-old.parquet", pa.Table.from_pandas(_as_text(old),
                                                                 preserve_index=False))
    store.append(rows("new", 2, 2.0))
    frame = store.read()
    assert sorted(frame["run_uuid"].unique()) == ["new", "old"]
    assert frame.loc[frame.run_uuid == "old", IDENTITY].isna().all()
    store.append(rows("old", 1, 5.0, identity="whatever"))  # no stored identity: matches


_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sampled_from(["a", "b", "c", "d"]),
              st.integers(min_value=1, max_value=5), st.sampled_from(["same", "other"])),
    st.tuples(st.just("compact")),
), min_size=1, max_size=12)


@settings(max_examples=40)
@given(ops=_ops)
def test_interleavings_never_lose_or_duplicate_a_row(tmp_path_factory: pytest.TempPathFactory,
                                                     ops: list[tuple]) -> None:
    store = HistoryStore(str(tmp_path_factory.mktemp("h") / "h"))
    expected: dict[str, int] = {}  # run -> KPI rows stored
    owner: dict[str, str] = {}  # run -> the identity first stored under its uuid
    for step, op in enumerate(ops):
        if op[0] == "compact":
            store.compact()
            continue
        _, run, kpis, who = op
        identity = f"id-{run}" if who == "same" else f"other-{run}-{step}"
        stored = expected.get(run)
        refused = stored is not None and (kpis < stored or owner[run] != identity)
        try:
            store.append(rows(run, 1, float(step), kpis=kpis, identity=identity))
        except HistoryConflictError:
            assert refused
            continue
        assert not refused
        expected[run] = kpis
        owner.setdefault(run, identity)
        frame = store.read()
        counts = frame.groupby("run_uuid").size().to_dict()
        assert counts == expected
        assert not frame.duplicated(subset=["run_uuid", "kpi"]).any()


# -- the tree side: what reaches the history ---------------------------------------------------

def test_cells_sharing_a_uuid_are_refused_at_parse(tmp_path: Path) -> None:
    from analysis.pipeline import postprocess
    from core.errors import ResultsError
    from tests.factories import make_result_dir

    results = tmp_path / "results"
    make_result_dir(results, "000__cell", run_uuid="same-uuid")
    make_result_dir(results, "001__cell", run_uuid="same-uuid", settings={"gpu": 1})
    with pytest.raises(ResultsError, match="share the run uuid same-uuid"):
        postprocess(results, "fine_tuning", tmp_path / "out",
                    history_uri=str(tmp_path / "h"))
    assert not (tmp_path / "h").exists()


def test_a_second_run_reusing_a_stored_uuid_is_refused(tmp_path: Path) -> None:
    from analysis.pipeline import postprocess
    from tests.factories import make_result_dir

    history = str(tmp_path / "h")
    first = tmp_path / "first"
    make_result_dir(first, "000__cell", run_uuid="u-1")
    postprocess(first, "fine_tuning", tmp_path / "o1", history_uri=history, report=False)
    second = tmp_path / "second"
    make_result_dir(second, "000__cell", run_uuid="u-1", settings={"gpu": 1})
    with pytest.raises(HistoryConflictError, match="u-1 is already stored for another run"):
        postprocess(second, "fine_tuning", tmp_path / "o2", history_uri=history, report=False)
    assert len(HistoryStore(history).read()) > 0


def test_a_resumed_run_that_lost_its_log_cannot_shrink_its_history(tmp_path: Path) -> None:
    from analysis.pipeline import postprocess
    from tests.factories import make_result_dir, train_log

    history = str(tmp_path / "h")
    results = tmp_path / "results"
    run = make_result_dir(results, "000__cell", run_uuid="u-2")
    postprocess(results, "fine_tuning", tmp_path / "o1", history_uri=history, report=False)
    stored = len(HistoryStore(history).read())
    log = run / "001__fine_tuning__run_fine_tuning_job" / "artifacts" / "pod.log"
    log.write_text(train_log(summary=False))  # cut short: fewer KPIs than stored
    with pytest.raises(HistoryConflictError, match=f"would replace the {stored} stored"):
        postprocess(results, "fine_tuning", tmp_path / "o2", history_uri=history,
                    report=False)
    assert len(HistoryStore(history).read()) == stored


def test_exit_0_without_kpis_fails_the_analysis(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.factories import make_result_dir

    results = tmp_path / "results"
    make_result_dir(results, "000__cell", broken={"log"})
    done = subprocess.run([sys.executable, "-m", "analysis", str(results), "--project",
                           "fine_tuning", "--out", str(tmp_path / "out"), "--no-report",
                           "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "exited 0 but yielded no KPI" in done.stderr


def test_two_writers_never_both_pass_the_identity_check(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two analyses storing one .uuid with two identities at the same moment: the check and
    the write are one step under the append lock, so the second sees the first and is
    refused. The check is widened on purpose: each writer, once inside, waits for the other
    to come in too — which, under the lock, it cannot (the wait ends by its limit)."""
    import threading

    original = HistoryStore._check_append
    inside = threading.Semaphore(0)
    overlaps: list[bool] = []

    def widened(self: HistoryStore, frame: pd.DataFrame) -> None:
        inside.release()
        overlaps.append(inside.acquire(timeout=1.0) and inside.acquire(timeout=0))
        original(self, frame)

    monkeypatch.setattr(HistoryStore, "_check_append", widened)
    results: dict[str, str] = {}

    def write(identity: str) -> None:
        try:
            HistoryStore(str(tmp_path / "h")).append(rows("r1", 1, 1.0, identity=identity))
            results[identity] = "stored"
        except HistoryConflictError:
            results[identity] = "refused"

    threads = [threading.Thread(target=write, args=(i,)) for i in ("aaa", "bbb")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values()) == ["refused", "stored"], results
    assert HistoryStore(str(tmp_path / "h")).read()[IDENTITY].nunique() == 1


def _append_in_process(args: tuple[str, str, object]) -> str:
    history, identity, barrier = args
    barrier.wait()  # type: ignore[attr-defined]
    try:
        HistoryStore(history).append(rows("r1", 1, 1.0, identity=identity))
        return "stored"
    except HistoryConflictError:
        return "refused"


def test_concurrent_processes_store_one_identity_for_a_uuid(tmp_path: Path) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(4)
        with context.Pool(4) as pool:
            outcomes = pool.map(_append_in_process, [
                (str(tmp_path / "h"), f"id-{n}", barrier) for n in range(4)])
    assert outcomes.count("stored") == 1, outcomes
    assert HistoryStore(str(tmp_path / "h")).read()[IDENTITY].nunique() == 1


@settings(max_examples=25, deadline=None)
@given(naive=st.booleans(), label=st.one_of(st.integers(-5, 5), st.floats(allow_nan=True),
                                            st.none(), st.text(max_size=5), st.booleans()),
       value=st.one_of(st.integers(0, 10**6), st.floats(0, 1e6), st.integers(0, 9).map(str)))
def test_any_column_types_are_normalised_and_every_read_works(
        tmp_path_factory: pytest.TempPathFactory, naive: bool, label: object,
        value: object) -> None:
    store = HistoryStore(str(tmp_path_factory.mktemp("h")))
    store.append(rows("base", 1, 1.0))
    odd = rows("odd", 2, 1.0)
    odd["model"] = [label] * len(odd)
    odd["value"] = [value] * len(odd)
    if naive:
        odd["timestamp"] = pd.to_datetime(odd["timestamp"]).dt.tz_localize(None)
    store.append(odd)
    frame = store.read()
    assert sorted(frame["run_uuid"].unique()) == ["base", "odd"]
    assert str(frame["timestamp"].dtype).endswith("UTC]")
    assert not list((Path(store.base) / QUARANTINE).glob("*"))
