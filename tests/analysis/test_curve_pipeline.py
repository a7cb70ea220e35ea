"""A sweep judged as one curve through post-processing: nights of llm_serving sweeps (the
recorded GuideLLM result scaled per load), the last one slower only above concurrency 4:
one curve verdict in ``curves.json``, the outcome, the report's curve page and first line —
next to the per-cell verdicts, which stay."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from analysis.pipeline import PostprocessOutcome, postprocess
from tests.factories import serving_cell

LOADS = (1, 2, 4, 8, 16)


def _night(root: Path, night: int, rng: np.random.Generator,
           slower: dict[int, float] | None = None, extra: dict | None = None) -> Path:
    results = root / f"night{night}"
    start = datetime(2026, 11, 1, 2, tzinfo=UTC) + timedelta(days=night)
    for index, load in enumerate(LOADS):
        factor = (slower or {}).get(load, 1.0)
        serving_cell(results / f"{index:03d}__cell", concurrency=load, run_id=f"night-{night}",
                     start=start + timedelta(minutes=index),
                     latency=load ** 0.3 * factor * float(np.exp(rng.normal(0, 0.02))),
                     throughput=load ** 0.8 / factor * float(np.exp(rng.normal(0, 0.02))),
                     extra=extra)
    return results


def _nights(root: Path, count: int, seed: int, *, slower: dict[int, float] | None = None,
            extra: dict | None = None) -> tuple[str, PostprocessOutcome]:
    """``count`` nights of one sweep post-processed into one history (the last one
    ``slower`` at those loads; every one with ``extra`` settings): the history and the last
    night's outcome (with its report)."""
    rng = np.random.default_rng(seed)
    history = str(root / "history")
    outcomes = []
    for night in range(count):
        last = night == count - 1
        outcomes.append(postprocess(
            _night(root, night, rng, slower=slower if last else None, extra=extra),
            "llm_serving", root / f"out{night}", history_uri=history, report=last))
        assert len(outcomes[-1].curves) == 1
    return history, outcomes[-1]


def test_a_sweep_slower_above_concurrency_4_is_one_curve_verdict(tmp_path: Path) -> None:
    _, before = _nights(tmp_path / "steady", 6, seed=7)
    assert before.curves[0].verdict.kind == "unchanged", before.curves[0].verdict
    _, last = _nights(tmp_path / "slower", 7, seed=7, slower={8: 1.4, 16: 1.4})
    [curve] = last.curves
    assert curve.verdict.kind == "regression"
    assert curve.verdict.load_range == (8.0, 16.0)
    assert curve.verdict.history_curves == 6
    assert len(curve.run_uuids) == len(LOADS)
    written = json.loads(Path(last.files["curves"]).read_text())
    assert written[0]["verdict"]["load_range"] == [8.0, 16.0]
    report = Path(last.report or "").parent
    index = (report / "index.html").read_text()
    assert "1 curve regression (concurrency 8–16)" in index
    page = next(report.glob("*_curve_band.html")).read_text()
    assert "regression at concurrency 8–16" in page and "history median (6 runs)" in page


def test_each_cell_of_a_judged_sweep_carries_its_curve_in_its_payload(tmp_path: Path) -> None:
    """The LTS payloads (what OpenSearch and Horreum receive) hold the curve's verdict."""
    from analysis.lts import LtsPayload

    _, outcome = _nights(tmp_path, 4, seed=3)
    payloads = [LtsPayload.model_validate(p) for p in
                json.loads(Path(outcome.files["lts"]).read_text())]
    assert len(payloads) == len(LOADS)
    assert {p.curve.verdict for p in payloads if p.curve} == {"unchanged"}
    assert all(p.curve is not None and p.curve.history_curves == 3 for p in payloads)


def test_compare_compares_the_curve_kpis_of_two_selections(tmp_path: Path) -> None:
    """``compare`` with the project's curve: its knee and frontier, one value per run's
    sweep, next to the per-cell KPIs."""
    from analysis.compare import compare_frames
    from analysis.history import HistoryStore
    from projects import registry

    history, _ = _nights(tmp_path, 5, seed=11, slower=dict.fromkeys(LOADS, 1.5),
                         extra={"slo": {"ttft_ms": 5000, "request_latency_s": 60}})
    frame = HistoryStore(history).read()
    spec = registry.load("llm_serving").curve
    rows = compare_frames(frame, "2026-11-01..2026-11-04T12:00", "2026-11-05..", curve=spec,
                          ignored_labels=["run_id", "run_uuid"])
    curve_rows = {r.kpi: r for r in rows if "concurrency=curve" in r.configuration}
    assert set(curve_rows) >= {"frontier_throughput", "knee_load", "throughput_at_knee"}
    frontier = curve_rows["frontier_throughput"]
    assert (frontier.runs_a, frontier.runs_b) == (4, 1)
    assert frontier.change_pct < -20  # 1.5 x slower everywhere: less throughput per budget
    without = compare_frames(frame, "2026-11-01..2026-11-04T12:00", "2026-11-05..",
                             ignored_labels=["run_id", "run_uuid"])
    assert not [r for r in without if "concurrency=curve" in r.configuration]
