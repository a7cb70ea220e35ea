from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.discovery import discover
from analysis.parsing import parse_dirs
from analysis.pipeline import postprocess
from analysis.project import load_project
from analysis.report import (
    ReportContext,
    run_name,
    shape_errors,
    shape_kpi_table,
    shape_loss_curve,
)
from analysis.run_analysis import analyse_run
from analysis.settings import settings_for
from tests.factories import DEFAULT_SETTINGS, make_result_dir


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analysis", *args], capture_output=True,
                          text=True, timeout=600)


def test_cli_writes_every_output(tmp_path: Path) -> None:
    results = tmp_path / "results"
    make_result_dir(results, "000__cell")
    make_result_dir(results, "001__cell", exit_code=2, broken={"summary"})
    out = tmp_path / "out"
    proc = run_cli(str(results), "--project", "fine_tuning", "--out", str(out),
                   "--history", str(tmp_path / "hist"))
    assert proc.returncode == 0, proc.stderr
    assert "2 run(s) parsed (1 failed" in proc.stdout
    frame = pd.read_parquet(out / "kpis.parquet")
    assert set(frame["kpi"]) >= {"train_tokens_per_second", "train_runtime"}
    payloads = json.loads((out / "lts_payload.json").read_text())
    assert [p["metadata"]["status"] for p in payloads] == ["success", "failed"]
    assert (out / "kpis.prom").read_text().endswith("# EOF\n")
    summary = yaml.safe_load((out / "regression_summary.yaml").read_text())
    assert summary["counts"]["insufficient_history"] > 0
    index = (out / "report" / "index.html").read_text()
    assert "2 run(s), 1 failed" in index
    page = next((out / "report").glob("*_loss_curve.html")).read_text()
    # pages share one offline plotly.js (it was embedded in every page: 4.8 MB each)
    assert "Plotly.newPlot" in page and "plotly.js v" not in page
    assert "<script src='plotly.min.js'>" in page
    assert (out / "report" / "plotly.min.js").read_text().count("plotly.js v") >= 1
    assert "<svg" in index and "train_tokens_per_second" in index  # headlines, sparklines
    # progress on stderr: each stage's end line (a quick stage says nothing else)
    assert re.search(r"^parse: 2 run\(s\) in \d+\.\d s$", proc.stderr, re.M), proc.stderr
    assert re.search(r"^judge: 2 run\(s\) in ", proc.stderr, re.M)
    assert re.search(r"^report: \d+ page\(s\) in ", proc.stderr, re.M)
    quiet = run_cli(str(results), "--project", "fine_tuning", "--out", str(out),
                    "--no-report", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_progress_lines_each_tenth_once_the_stage_is_slow(
        caplog: pytest.LogCaptureFixture) -> None:
    """Tenths are logged only after QUIET_S seconds; the end line always."""
    from core.progress import QUIET_S, StageProgress

    now = [0.0]
    caplog.set_level(logging.INFO, logger="telltale.analysis")
    progress = StageProgress("parse", 1000, clock=lambda: now[0])
    for i in range(1000):
        now[0] = i * (2 * QUIET_S / 1000)  # half the stage quick, half slow
        progress.advance()
    progress.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:-1] == [f"parse: {n:,}/1,000 run(s) ({n // 10} %), "
                          f"{n / ((n - 1) * 2 * QUIET_S / 1000):,.0f}/s"
                          for n in range(600, 1000, 100)]
    assert lines[-1] == f"parse: 1,000 run(s) in {999 * 2 * QUIET_S / 1000:.1f} s"


def test_cli_user_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli(str(tmp_path / "nope"), "--project", "fine_tuning", "--out", str(tmp_path))
    assert proc.returncode == 2 and "results dir not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = run_cli(str(tmp_path / "empty"), "--project", "fine_tuning", "--out", str(tmp_path))
    assert proc.returncode == 2 and "no result dir" in proc.stderr
    proc = run_cli(str(tmp_path), "--project", "nope", "--out", str(tmp_path))
    assert proc.returncode == 2 and "unknown project 'nope'" in proc.stderr


def test_strict_mode_refuses_incomplete_payload(tmp_path: Path) -> None:
    make_result_dir(tmp_path / "r", "000__cell", broken={"summary"})
    proc = run_cli(str(tmp_path / "r"), "--project", "fine_tuning", "--out",
                   str(tmp_path / "o"), "--strict")
    assert proc.returncode == 2 and "incomplete" in proc.stderr
    assert not list((tmp_path / "o").glob(".lts_payload.spool*"))  # the spool is gone


def test_lts_payloads_come_back_from_the_spool_whole_and_in_order(tmp_path: Path) -> None:
    """Payloads are spooled to disk while the runs are analysed (only their metadata stays
    in memory) and written with their verdicts once these are known."""
    for i in range(20):  # enough for the parallel parse: results arrive out of order
        make_result_dir(tmp_path / "r", f"{i:03d}__cell", tokens_per_second=1000 + i, seed=i,
                        exit_code=1 if i == 3 else 0)
    outcome = postprocess(tmp_path / "r", "fine_tuning", tmp_path / "o",
                          history_uri=str(tmp_path / "h"))
    payloads = json.loads((tmp_path / "o" / "lts_payload.json").read_text())
    assert [p["metadata"]["test_path"] for p in payloads] == [f"{i:03d}__cell"
                                                              for i in range(20)]
    assert all(p["kpis"] and p["results"] and p["regression"] for p in payloads)
    assert payloads[3]["metadata"]["status"] == "failed"
    assert payloads[5]["metadata"]["settings"]["model_name"] == "tiny-llama"
    assert payloads[5]["results"]["train_tokens_per_second"] == 1005
    assert outcome.runs == 20 and not list((tmp_path / "o").glob(".lts_payload.spool*"))
    runs = pd.read_parquet(tmp_path / "o" / "runs.parquet")
    assert runs["status"].tolist().count("failed") == 1


def test_history_gives_verdicts_and_regression_is_flagged(tmp_path: Path) -> None:
    hist = str(tmp_path / "hist")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(8):  # a stable history
        make_result_dir(tmp_path / f"h{i}", "000__cell", start=start + timedelta(days=i),
                        tokens_per_second=1000 + (i % 3), runtime=40 + (i % 2) * 0.1, seed=i)
        postprocess(tmp_path / f"h{i}", "fine_tuning", tmp_path / f"o{i}", history_uri=hist,
                    report=False)
    for j, tps in enumerate((800, 790)):  # two slow runs: the second is confirmed
        make_result_dir(tmp_path / f"s{j}", "000__cell", start=start + timedelta(days=20 + j),
                        tokens_per_second=tps, runtime=40, seed=100 + j)
        outcome = postprocess(tmp_path / f"s{j}", "fine_tuning", tmp_path / f"so{j}",
                              history_uri=hist)
    verdicts = {v.kpi: v for v in outcome.verdicts}
    assert verdicts["train_tokens_per_second"].verdict == "regression"
    assert verdicts["train_tokens_per_second"].change_pct < -15
    assert verdicts["train_runtime"].verdict == "no_change"
    assert "avg_tokens_per_sample" not in verdicts  # ignored for regression
    regression_page = next((tmp_path / "so1" / "report").glob("*_regression.html")).read_text()
    assert "regression" in regression_page


def test_report_shapes(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "000__cell", settings={"gpu": 1})
    make_result_dir(tmp_path, "001__cell", settings={"gpu": 2}, exit_code=1,
                    broken={"pod_json"})
    project = load_project("fine_tuning")
    found = discover(tmp_path)
    runs = [analyse_run(project, r) for r in parse_dirs(found.results, project.parser)]
    ctx = ReportContext(project, runs, pd.DataFrame(), None, [], found)
    table = shape_kpi_table(ctx)
    assert list(table["gpu"]) == [1, 2] and "hyper_parameters.r" not in table.columns
    # the KPI values come from the KPI table, in each KPI's display format
    from analysis.kpi import kpi_table

    frame = kpi_table((r.run_uuid, r.timestamp, r.kpis) for r in runs)
    table = shape_kpi_table(ReportContext(project, runs, frame, None, [], found))
    expected = {k.name: k.display() for k in runs[0].kpis}
    assert table.loc[0, "train_tokens_per_second [tokens/s]"] == \
        expected["train_tokens_per_second"]
    # runs named by cell, start and run id, not by their dirs alone (every first cell is
    # 000__cell): these dirs have no cell.json, so their dir stands for the cell's name
    assert set(shape_loss_curve(ctx)["run"]) == {run_name(r) for r in runs}
    assert all(name.split(" · ")[1] == "2026-01-01 00:00"
               for name in shape_loss_curve(ctx)["run"])
    named = runs[0].model_copy(update={"cell": "base", "labels": {"run_id": "25f0bdb0-4c4f"}})
    assert run_name(named) == "base · 2026-01-01 00:00 · 25f0bdb0"
    errors = shape_errors(ctx)
    assert set(errors["kind"]) == {"failed run", "parse problem"}


def test_kpi_history_shape_without_matching_kpis(tmp_path: Path) -> None:
    from analysis.report import shape_kpi_history

    make_result_dir(tmp_path, "000__cell")
    project = load_project("fine_tuning")
    found = discover(tmp_path)
    runs = [analyse_run(project, r) for r in parse_dirs(found.results, project.parser)]
    from analysis.kpi import kpi_table

    frame = kpi_table((r.run_uuid, r.timestamp, r.kpis) for r in runs)
    ctx = ReportContext(project, runs, frame, None, [], found)
    assert shape_kpi_history(ctx, ["no_such_kpi"]).empty


def test_kpi_history_shape_without_label_columns_and_large_history(tmp_path: Path) -> None:
    """Current runs with no configuration labels next to a labelled history: no IndexError,
    and no cartesian join (10 000 history runs stay linear)."""
    from analysis.report import shape_kpi_history

    make_result_dir(tmp_path, "000__cell")
    project = load_project("fine_tuning")
    found = discover(tmp_path)
    runs = [analyse_run(project, r) for r in parse_dirs(found.results, project.parser)]
    current = pd.DataFrame({"run_uuid": ["now"], "timestamp": [pd.Timestamp("2026-11-23",
                                                                             tz="UTC")],
                            "kpi": ["train_runtime"], "value": [40.0], "unit": ["s"]})
    n = 10_000
    history = pd.DataFrame({
        "run_uuid": [f"r{i}" for i in range(n)], "kpi": "train_runtime", "value": 41.0,
        "unit": "s", "timestamp": pd.date_range("2020-01-01", periods=n, freq="h", tz="UTC"),
        "model_name": "tiny-llama", "platform": "local"})
    ctx = ReportContext(project, runs, current, history, [], found)
    shaped = shape_kpi_history(ctx)
    assert list(shaped["run_uuid"]) == ["now"]  # other configurations are not its history
    labelled = current.assign(model_name="tiny-llama", platform="local")
    shaped = shape_kpi_history(ReportContext(project, runs, labelled, history, [], found))
    assert len(shaped) == n + 1


def test_errors_page_shows_a_failed_runs_own_last_words(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = make_result_dir(results, "000__cell", exit_code=1, broken={"summary"})
    log = next(run.glob("*__run_fine_tuning_job")) / "artifacts" / "pod.log"
    log.write_text(log.read_text() + "Traceback (most recent call last):\n"
                   "ValueError: peft_method 'prefix' is not supported\n\n")
    out = tmp_path / "out"
    assert run_cli(str(results), "--project", "fine_tuning", "--out", str(out)).returncode == 0
    page = next((out / "report").glob("*_errors.html")).read_text()
    assert "exit code 1: " in page and "ValueError: peft_method" in page
    # ... and links its logs, relative to the page
    assert "001__fine_tuning__run_fine_tuning_job/artifacts/pod.log</a>" in page
    href = page.split("<a href='", 2)[2].split("'", 1)[0]  # the first is the index link
    assert ((out / "report") / href).resolve() == log.resolve()


def test_cli_applies_the_projects_ignored_labels_and_accepts(tmp_path: Path) -> None:
    """``python -m analysis --history`` selects history like the run did (the project's
    ignored labels: run ids, paths, versions), and ``accept`` moves the baseline."""
    history = str(tmp_path / "history")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(5):  # four earlier runs in one tree, then the judged one
        results = tmp_path / ("results4" if i == 4 else "earlier")
        make_result_dir(results, f"{i:03d}__cell", start=start + timedelta(days=i), seed=i,
                        tokens_per_second=1200.0 + i % 2 * 3, runtime=40.0)  # no trend
    for name in ("earlier", "results4"):
        proc = run_cli(str(tmp_path / name), "--project", "fine_tuning", "--out",
                       str(tmp_path / f"out-{name}"), "--history", history, "--no-report")
        assert proc.returncode == 0, proc.stderr
    verdicts = json.loads((tmp_path / "out-results4" / "regression.json").read_text())
    assert verdicts and all(v["history_used"] == 4 for v in verdicts), verdicts

    # a slower run: a suspect regression; accepting the slow level makes it the baseline
    slow = tmp_path / "slow"
    make_result_dir(slow, "000__cell", start=start + timedelta(days=9), seed=9,
                    tokens_per_second=800.0, run_uuid="slow-run")
    run_cli(str(slow), "--project", "fine_tuning", "--out", str(tmp_path / "outs"),
            "--history", history, "--no-report")
    judged = {v["kpi"]: v for v in json.loads((tmp_path / "outs" / "regression.json")
                                              .read_text())}
    assert judged["train_tokens_per_second"]["suspect"]
    bad = run_cli("accept", "--history", history, "no-such-run")
    assert bad.returncode == 2 and "not in the history" in bad.stderr
    ok = run_cli("accept", "--history", history, "slow-run", "--kpi",
                 "train_tokens_per_second", "--by", "perf-team")
    assert ok.returncode == 0, ok.stderr
    for i in range(10, 13):  # two later runs in one tree, then the judged one
        later = tmp_path / ("later12" if i == 12 else "later")
        make_result_dir(later, f"{i:03d}__cell", start=start + timedelta(days=i), seed=i,
                        tokens_per_second=801.0 + i)
    for name, out in (("later", "o-later"), ("later12", "o12")):
        run_cli(str(tmp_path / name), "--project", "fine_tuning", "--out", str(tmp_path / out),
                "--history", history, "--no-report")
    last = {v["kpi"]: v for v in json.loads((tmp_path / "o12" / "regression.json")
                                            .read_text())}
    assert last["train_tokens_per_second"]["verdict"] == "no_change", last
    assert last["train_tokens_per_second"]["baseline"] < 850


def test_history_lines_follow_the_regressions_configuration_and_mark_changes(
        tmp_path: Path) -> None:
    """One line per configuration the regression compares (learning_rate is one), with the
    change points found on that line and the current run's verdict marked."""
    history = str(tmp_path / "history")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(24):
        lr = 0.0003 if i % 2 else 0.001
        tps = (1200.0 if i < 14 else 900.0) + (i % 3)
        hp = {**DEFAULT_SETTINGS["hyper_parameters"], "learning_rate": lr}
        results = tmp_path / ("r23" if i == 23 else "earlier")  # 23 earlier runs in one tree
        make_result_dir(results, f"{i:03d}__cell", start=start + timedelta(days=i), seed=i,
                        tokens_per_second=tps, settings={"hyper_parameters": hp})
    settings = settings_for(load_project("fine_tuning"), tmp_path / "r23")
    postprocess(tmp_path / "earlier", "fine_tuning", tmp_path / "seed", history_uri=history,
                settings=settings, report=False)
    outcome = postprocess(tmp_path / "r23", "fine_tuning", tmp_path / "final",
                          history_uri=history, settings=settings, append_history=False)
    page = next((tmp_path / "final" / "report").glob("*_kpi_history.html")).read_text()
    assert "learning_rate=0.0003" in page and "learning_rate=0.001" not in page
    assert "change point: a new level starts here" in page
    index = (tmp_path / "final" / "report" / "index.html").read_text()
    assert "<svg" in index and outcome.verdicts


def test_older_runs_drop_their_bulky_and_analysis_only_fields(tmp_path: Path) -> None:
    """Bounded memory over 10 000 runs: only the newest runs keep per-step data (for the
    loss-curve page); every run's payload still has its loss summary and KPIs."""
    from analysis.run_analysis import KEEP_BULKY, _analyse_tree

    results = tmp_path / "results"
    for i in range(KEEP_BULKY + 5):
        make_result_dir(results, f"{i:03d}__cell", seed=i)
    project = load_project("fine_tuning")
    _, runs, _, (failed, _) = _analyse_tree(results, project, None, None, force=False,
                                            trust_cache=False)
    assert failed == 0 and len(runs) == KEEP_BULKY + 5
    assert [len(r.result.progress) > 0 for r in runs] == [False] * 5 + [True] * KEEP_BULKY
    # what only the KPIs read goes too (~8 KB a run); what the report reads stays
    assert [r.result.summary is not None for r in runs] == [False] * 5 + [True] * KEEP_BULKY
    assert [r.result.resources is None for r in runs[:5]] == [True] * 5
    assert all(r.result.settings and r.result.run_uuid for r in runs)
    assert all(r.payload.results.get("last_loss") is not None for r in runs)
    assert all(r.kpis for r in runs)
    # what runs of one configuration repeat is held once: the slimmed results' fields set
    # and settings (each was a copy a run: ~2.5 KB, 25 MB over 10 000 runs); a run's KPIs
    # share its labels
    older = [r.result for r in runs[:5]]
    assert len({id(r.__pydantic_fields_set__) for r in older}) == 1
    assert len({id(r.settings) for r in older}) == 1
    assert all(k.labels is r.labels for r in runs for k in r.kpis)
    # ...and each is still its model: what it dumps validates back to the same result
    model = type(older[0])
    assert all(model.model_validate(r.model_dump()) == r for r in older)
    assert all(r._engine is None for r in older)
    # warm, the older runs' caches are read without their curves: same payloads
    _, warm, _, _ = _analyse_tree(results, project, None, None, force=False, trust_cache=False)
    assert [r.payload.results for r in warm] == [r.payload.results for r in runs]


def test_resource_capture_gives_kpis_and_a_report_page(tmp_path: Path) -> None:
    """A cell with a Prometheus capture (the file the capture writes): KPIs and a page."""
    import pandas as pd

    results = tmp_path / "results"
    cell = make_result_dir(results, "000__cell")
    step = cell / "002__observe__capture_prometheus" / "prometheus"
    step.mkdir(parents=True)
    stamps = pd.date_range("2026-01-01", periods=6, freq="s", tz="UTC")
    pd.DataFrame({
        "query": ["cpu_cores_used"] * 6 + ["memory_used_bytes"] * 6,
        "labels": ["{}"] * 12,
        "timestamp": list(stamps) * 2,
        "value": [1.0, 2.0, 2.0, 2.0, 2.0, 3.0] + [2e9] * 5 + [4e9],
    }).to_parquet(step / "series.parquet", index=False)
    out = tmp_path / "out"
    proc = run_cli(str(results), "--project", "fine_tuning", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    kpis = pd.read_parquet(out / "kpis.parquet").set_index("kpi")["value"]
    assert kpis["cpu_cores_used_mean"] == 2.0 and kpis["cpu_cores_used_max"] == 3.0
    assert kpis["memory_used_max"] == 4.0
    assert kpis["tokens_per_cpu_core_second"] == kpis["train_tokens_per_second"] / 2.0
    assert "gpu_utilization_mean" not in kpis  # not measured: no KPI, not a zero
    page = next((out / "report").glob("*_resources.html")).read_text()
    assert "CPU cores in use" in page and "memory in use (GB)" in page
    assert ": loss per logging step" in page  # the cell's own timeline next to it


def test_the_verdict_table_reads_like_prose(tmp_path: Path) -> None:
    """Human titles, worst first, a move inside the noise grey and saying so, the long
    explanation one line with the rest on demand, cells by their names."""
    from analysis.pipeline import VerdictRow
    from analysis.report import REPORT_KINDS
    from analysis.report_html import VERDICT_TITLES

    long_why = "the newest 2 run(s) are 12 % below the baseline " + "and more " * 30
    rows = [VerdictRow(run_uuid=f"run-{i}", test_path="001__cell", cell=name, kpi=f"k{i}",
                       unit="tokens/s", latest=1.0, baseline=1.0, change_pct=change,
                       verdict=kind, confidence=0.5, history_used=5, explanation=why,
                       mde_pct=356.0)
            for i, (name, kind, change, why) in enumerate([
                ("base", "no_change", 163.1, "inside the noise"),
                ("lora-r16", "improvement", 8.0, "better"),
                ("base", "regression", -12.0, long_why),
                ("base", "suspect", -9.0, "one run out of line")])]
    make_result_dir(tmp_path, "001__cell")
    ctx = ReportContext(load_project("fine_tuning"), [], pd.DataFrame(), None, rows,
                        discover(tmp_path))
    page = REPORT_KINDS["regression"](ctx, {})
    head = re.findall(r"<th>(.*?)</th>", page)
    assert head[:2] == ["cell", "KPI"] and set(VERDICT_TITLES.values()) >= set(head)
    assert not [h for h in head if "_" in h]  # no snake_case title
    # values read inside the change, not in five columns of their own
    assert not {"confidence", "unit", "baseline", "this run"} & set(head)
    assert "1 vs 1 tokens/s · " in page
    order = re.findall(r"<td>(k\d)</td>", page)
    assert order == ["k2", "k3", "k1", "k0"]  # regression, suspect, improvement, no change
    assert "<b style='color:#b7950b'>-9.0 %</b>" in page  # a suspect is beyond the noise
    assert "+163.1 % · within noise (MDE 356 %)" in page and "color:#888" in page
    assert "<b style='color:#c0392b'>-12.0 %</b>" in page
    assert "<details><summary>the newest 2 run(s) are 12 % below" in page
    assert "001__cell" not in page and "<td>lora-r16</td>" in page


def test_regression_page_shows_every_regression_then_the_newest_rows(tmp_path: Path) -> None:
    """Past MAX_TABLE_ROWS verdicts, the page keeps the news and the newest of the rest."""
    from analysis.pipeline import VerdictRow
    from analysis.report import REPORT_KINDS
    from analysis.report_html import MAX_TABLE_ROWS

    def row(i: int, kind: str) -> VerdictRow:
        return VerdictRow(run_uuid=f"run-{i}", test_path=f"p{i:05d}", kpi="k", unit="u",
                          latest=1.0, baseline=1.0, change_pct=0.0, verdict=kind,
                          confidence=0.5, history_used=5, explanation="e")

    total = MAX_TABLE_ROWS + 50
    news = {3, 40, total - 60}
    verdicts = [row(i, "regression" if i in news else "no_change") for i in range(total)]
    make_result_dir(tmp_path, "000__cell")
    ctx = ReportContext(load_project("fine_tuning"), [], pd.DataFrame(), None, verdicts,
                        discover(tmp_path))
    page = REPORT_KINDS["regression"](ctx, {})
    shown = [int(p[1:]) for p in re.findall(r"<td>(p\d{5})</td>", page)]
    assert len(shown) == MAX_TABLE_ROWS
    assert shown[:3] == sorted(news)  # the regressions first
    rest = [i for i in range(total) if i not in news][-(MAX_TABLE_ROWS - 3):]
    assert shown[3:] == rest
    assert f"showing {MAX_TABLE_ROWS} of {total} rows" in page
