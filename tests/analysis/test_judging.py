"""`analysis.judging.judge_runs`: one history query per configuration, same verdicts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

import analysis.judging as judging
from analysis.history import HistoryStore
from analysis.judging import judge_runs
from analysis.kpi import kpi_table
from analysis.project import load_project
from analysis.regression import verdict
from analysis.run_analysis import _analyse_tree
from analysis.settings import settings_for
from tests.factories import make_result_dir


class CountingStore:
    """A real `HistoryStore` that counts the queries made of it."""

    def __init__(self, store: HistoryStore) -> None:
        self.store, self.queries = store, 0

    def query(self, labels: Any, **kwargs: Any) -> pd.DataFrame:
        self.queries += 1
        return self.store.query(labels, **kwargs)


def test_one_query_per_configuration_and_the_verdicts_of_a_query_per_run(
        tmp_path: Path) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(16):
        make_result_dir(tmp_path / "tree", f"{i:03d}__cell",
                        settings={"model_name": "a" if i % 2 else "b"},
                        tokens_per_second=1000 - (300 if i >= 12 else 0) + i % 3,
                        start=start + timedelta(days=i), seed=i)
    project = load_project("fine_tuning")
    settings = settings_for(project, tmp_path / "tree")
    _, runs, _, _ = _analyse_tree(tmp_path / "tree", project, None, None, force=False,
                                  trust_cache=False)
    store = HistoryStore(str(tmp_path / "history"))
    store.append(kpi_table((r.run_uuid, r.timestamp, r.kpis) for r in runs))
    counting = CountingStore(store)
    rows = judge_runs(runs, counting, settings)  # type: ignore[arg-type]
    assert counting.queries == 2  # two models, 16 runs
    assert {r.verdict for r in rows if r.kpi == "train_tokens_per_second"} >= {
        "regression", "no_change", "insufficient_history"}
    for run in runs:  # the reference: a query per run, its own rows and later runs left out
        history = store.query(run.labels, compared_label=settings.comparison.compared_label,
                              ignored_labels=settings.comparison.ignored_labels,
                              exclude_runs=[run.run_uuid])
        history = history[history["timestamp"] < pd.Timestamp(run.timestamp)]
        for kpi in run.kpis:
            if kpi.ignored_for_regression:
                continue
            expected = verdict(history.loc[history["kpi"] == kpi.name, "value"].tolist(),
                               [kpi.value], "lower_better" if kpi.lower_better
                               else "higher_better")
            row = next(r for r in rows if r.run_uuid == run.run_uuid and r.kpi == kpi.name)
            assert (row.verdict, row.history_used, row.baseline) == (
                expected.kind, expected.history_used, expected.baseline)


def test_a_verdict_reads_the_newest_points_of_a_long_history(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    monkeypatch.setattr(judging, "HISTORY_LIMIT", 5)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(9):
        make_result_dir(tmp_path / "tree", f"{i:03d}__cell", start=start + timedelta(days=i),
                        seed=i)
    project = load_project("fine_tuning")
    _, runs, _, _ = _analyse_tree(tmp_path / "tree", project, None, None, force=False,
                                  trust_cache=False)
    store = HistoryStore(str(tmp_path / "history"))
    store.append(kpi_table((r.run_uuid, r.timestamp, r.kpis) for r in runs))
    rows = judge_runs(runs[-1:], store, settings_for(project, tmp_path / "tree"))
    assert rows and all(r.history_used == 5 for r in rows)
