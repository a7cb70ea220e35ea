from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.lts import LtsKpi, LtsMetadata, LtsPayload
from blocks.opensearch import OpenSearchInstance
from core.errors import PermanentServiceError, TransientServiceError
from tasks.publish.opensearch import OpenSearchHistory, export_payloads
from tasks.retry import RetryPolicy
from tests.servers.opensearch import opensearch_server

FAST = RetryPolicy(attempts=3, backoff_base_s=0, jitter=0)


def payload(run: str, day: int, value: float, **labels: str) -> LtsPayload:
    base = {"model_name": "m1", "accelerator_count": "1", "ocp_version": "4.16"}
    base.update(labels)
    return LtsPayload(
        metadata=LtsMetadata(run_uuid=run, start=f"2026-01-{day:02d}T00:00:00+00:00",
                             status="success", exit_code=0),
        results={"train_runtime": 10.0},
        kpis={"tps": LtsKpi(value=value, unit="tokens/s", help="h", lower_better=False,
                            labels=base),
              "runtime": LtsKpi(value=100 / value, unit="s", help="h", lower_better=True,
                                labels=base)},
        regression={"tps": {"verdict": "no_change"}})


def test_one_document_per_run_overwritten_on_reexport() -> None:
    with opensearch_server(user="cpt", password="s3cret") as (url, state):
        instance = OpenSearchInstance(url=url, user="cpt", password="s3cret")
        written = export_payloads(instance, [payload("r1", 1, 10.0), payload("r2", 2, 11.0)],
                                  index="ft", kpi_index="ft-kpis", policy=FAST)
        assert written == {"telltale-ft": 2, "telltale-ft-kpis": 4}
        export_payloads(instance, [payload("r1", 1, 12.0)], index="ft", policy=FAST)
        docs = state.indices["telltale-ft"]["docs"]
        assert set(docs) == {"r1", "r2"}
        assert docs["r1"]["kpis"]["tps"]["value"] == 12.0
        assert docs["r1"]["labels"]["model_name"] == "m1" and docs["r1"]["valid"] is True
        assert state.indices["telltale-ft"]["mappings"]["properties"]["metadata"]
        assert set(state.indices["telltale-ft-kpis"]["docs"]) == {
            "r1-tps", "r1-runtime", "r2-tps", "r2-runtime"}
        assert "s3cret" not in repr(instance)
        # opensearch-py's bulk helper: one _bulk request per index and export, no per-doc PUTs
        assert [p for m, p in state.requests if m == "POST"].count("/_bulk") == 3


def test_transient_faults_are_retried() -> None:
    with opensearch_server() as (url, state):
        state.fail_next(2, 503)
        export_payloads(OpenSearchInstance(url=url), [payload("r1", 1, 10.0)], index="ft",
                        policy=FAST)
        assert set(state.indices["telltale-ft"]["docs"]) == {"r1"}


def test_refusals_are_permanent_and_not_retried() -> None:
    with opensearch_server(user="cpt", password="right") as (url, state):
        with pytest.raises(PermanentServiceError) as info:
            export_payloads(OpenSearchInstance(url=url, user="cpt", password="wrong"),
                            [payload("r1", 1, 10.0)], index="ft", policy=FAST)
        assert info.value.status == 401
        assert len(state.requests) == 1  # a 401 is never retried


def test_server_down_is_a_clear_transient_error() -> None:
    with opensearch_server() as (url, _):
        pass  # stopped: nothing listens there any more
    with pytest.raises(TransientServiceError, match="opensearch"):
        export_payloads(OpenSearchInstance(url=url, timeout_s=2), [payload("r1", 1, 1.0)],
                        index="ft", policy=FAST)


def test_history_query_filters_by_labels_and_pages() -> None:
    with opensearch_server() as (url, state):
        instance = OpenSearchInstance(url=url)
        runs = [payload(f"r{i:02d}", i + 1, 10.0 + i) for i in range(25)]
        runs.append(payload("other", 3, 99.0, model_name="m2"))
        runs.append(payload("newer-ocp", 27, 50.0, ocp_version="4.17"))
        export_payloads(instance, runs, index="ft", policy=FAST)
        history = OpenSearchHistory(instance, "ft", page_size=10, policy=FAST)
        labels = {"model_name": "m1", "accelerator_count": "1", "ocp_version": "4.16"}
        frame = history.query(labels, kpi="tps", exclude_runs=["r24"])
        assert frame["run_uuid"].tolist() == [f"r{i:02d}" for i in range(24)]
        assert frame["value"].tolist() == [10.0 + i for i in range(24)]
        searches = [r for r in state.requests if r[1].endswith("/_search")]
        assert len(searches) == 3  # 10 + 10 + 5: paginated, never one huge page
        ignoring = history.query(labels, kpi="tps", ignored_labels=["ocp_version"])
        assert "newer-ocp" in ignoring["run_uuid"].tolist()
        assert "other" not in ignoring["run_uuid"].tolist()
        assert OpenSearchHistory(instance, "missing", policy=FAST).query(labels).empty
        # past max_runs, the newest runs are kept (the verdict's baseline), oldest first
        capped = OpenSearchHistory(instance, "ft", page_size=4, max_runs=8, policy=FAST)
        assert capped.query(labels, kpi="tps")["run_uuid"].tolist() == [
            f"r{i:02d}" for i in range(17, 25)]


def test_postprocess_judges_against_opensearch_history(tmp_path) -> None:
    import json
    from datetime import UTC, datetime, timedelta

    from analysis.lts import LtsPayload
    from analysis.pipeline import postprocess
    from tests.factories import make_result_dir

    start = datetime(2026, 1, 1, tzinfo=UTC)
    with opensearch_server() as (url, _):
        instance = OpenSearchInstance(url=url)
        history = OpenSearchHistory(instance, "fine-tuning", policy=FAST)
        outcome = None
        for i in range(5):
            make_result_dir(tmp_path / f"r{i}", "000__cell", start=start + timedelta(days=i),
                            tokens_per_second=1000 + i % 2 * 3, seed=i)  # no trend
            outcome = postprocess(tmp_path / f"r{i}", "fine_tuning", tmp_path / f"o{i}",
                                  history=history, report=False)
            payloads = [LtsPayload.model_validate(p) for p in json.loads(
                (tmp_path / f"o{i}" / "lts_payload.json").read_text())]
            export_payloads(instance, payloads, index="fine-tuning", policy=FAST)
        kinds = {v.kpi: v.verdict for v in outcome.verdicts}
        assert kinds["train_tokens_per_second"] == "no_change"
        assert all(v.verdict != "insufficient_history" and v.history_used >= 3
                   for v in outcome.verdicts)


# A run's label: absent (written before the label existed), empty (unset), or a value.
_LABEL_STATES = st.sampled_from([None, "", "forked", "other"])


@pytest.fixture(scope="module")
def search_server() -> Iterator[str]:
    """One OpenSearch stand-in for the generated examples (each writes its own index)."""
    with opensearch_server() as (url, _):
        yield url


@given(states=st.lists(_LABEL_STATES, min_size=1, max_size=8),
       wanted=st.sampled_from(["", "forked"]))
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_history_reader_matches_an_unset_label_alike(
        tmp_path_factory: pytest.TempPathFactory, search_server: str,
        states: list[str | None], wanted: str) -> None:
    """An unset label matches the runs that have it empty or not at all, and only those,
    in the Parquet history and in OpenSearch (`analysis.history.matched_labels`): a label a
    project adds later (the launch) keeps the old runs of a configuration its history."""
    import uuid

    from analysis.history import HistoryStore
    from analysis.kpi import Kpi, kpi_table

    expected = {f"r{i}" for i, s in enumerate(states) if (s or "") == wanted}
    store = HistoryStore(str(tmp_path_factory.mktemp("hist")))
    payloads = []
    for i, state in enumerate(states):
        labels = {"model_name": "m1"} if state is None else {"model_name": "m1",
                                                             "launch": state}
        store.append(kpi_table([(f"r{i}", f"2026-01-{i + 1:02d}T00:00:00+00:00", [
            Kpi(name="tps", value=1.0 + i, unit="u", help="h", lower_better=False,
                labels=labels)])]))
        payloads.append(payload(f"r{i}", i + 1, 1.0 + i, **({} if state is None
                                                             else {"launch": state})))
    query = {"model_name": "m1", "launch": wanted}
    assert set(store.query(query, kpi="tps")["run_uuid"]) == expected
    instance = OpenSearchInstance(url=search_server)
    index = f"ft-{uuid.uuid4().hex[:12]}"
    export_payloads(instance, payloads, index=index, policy=FAST)
    found = OpenSearchHistory(instance, index, policy=FAST).query(
        {**query, "accelerator_count": "1", "ocp_version": "4.16"}, kpi="tps")
    assert set(found["run_uuid"]) == expected
