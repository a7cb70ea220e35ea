"""The report's first screen and its charts: the triage line, the cards and their commands,
baseline bands, change intervals, time axes, the CLI's help.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.discovery import discover
from analysis.parsing import parse_dirs
from analysis.pipeline import postprocess
from analysis.project import load_project
from analysis.report import (
    ReportContext,
)
from analysis.run_analysis import analyse_run
from tests.factories import make_result_dir


def test_line_figures_are_built_as_plotly_json() -> None:
    """The history and loss pages draw plotly figure dicts (plotly express cost ~0.5 s a
    1 000-run report): one line per group in its order, ISO timestamps, hover columns, and a
    name that closes a script tag stays inside the figure's JSON."""
    import pandas as pd

    from analysis.report_html import _figure_html, _lines

    frame = pd.DataFrame({
        "timestamp": pd.to_datetime(["2026-01-02 03:04:05", "2026-01-03 00:00:00", "2026-01-04 00:00:00"],
                                    utc=True),
        "value": [1.0, 2.0, 3.0], "run_uuid": ["a", "b", "c"],
        "configuration": ["</script><b>x", "plain", "</script><b>x"]})
    figure = _lines(frame, "timestamp", "value", "configuration", hover=["run_uuid"],
                    title="t [s]")
    assert [t["name"] for t in figure["data"]] == ["</script><b>x", "plain"]
    # told apart without colour: each line its own marker
    assert figure["data"][0]["marker"]["symbol"] != figure["data"][1]["marker"]["symbol"]
    assert figure["data"][0]["x"] == ["2026-01-02T03:04:05", "2026-01-04T00:00:00"]
    assert figure["data"][0]["customdata"].tolist() == [["a"], ["c"]]
    assert "run_uuid=%{customdata[0]}" in figure["data"][0]["hovertemplate"]
    page = _figure_html(figure)
    assert "Plotly.newPlot" in page and "</script><b>" not in page
    # the page's JSON reads back as the figure: numpy arrays as lists, escapes undone
    import re

    arguments = re.fullmatch(
        r"<div id='(plot-\w+)' class='plotly-graph-div'[^>]*></div><script>"
        r"Plotly\.newPlot\('\1',(.*)\);</script>", page).group(2)
    assert "<" not in arguments
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(arguments)
    layout, end = decoder.raw_decode(arguments, end + 1)
    assert arguments[end:] == ',{"responsive":true}' and layout == figure["layout"]
    assert data[0] == {**figure["data"][0], "y": [1.0, 3.0], "customdata": [["a"], ["c"]]}


def test_reports_name_configurations_by_what_differs_and_say_the_rest_once(
        tmp_path: Path) -> None:
    """Two configurations differing in one setting: their lines are named by it alone, the
    labels they share are said once, runs are named by start and id; a project without a
    loss curve gets no loss panel beside its resources."""
    from analysis.report_runs import _draw_resources

    make_result_dir(tmp_path / "t", "000__cell", settings={"gpu": 1})
    make_result_dir(tmp_path / "t", "001__cell", settings={"gpu": 2}, seed=1)
    outcome = postprocess(tmp_path / "t", "fine_tuning", tmp_path / "out",
                          history_uri=str(tmp_path / "h"))
    page = next((tmp_path / "out" / "report").glob("*_kpi_history.html")).read_text()
    names = set(re.findall(r'"name": ?"([^"]*)"', page))
    assert "accelerator_count=1 / accelerators_per_replica=1 / global_batch_size=4" in names
    assert not [n for n in names if "model_name" in n or "lora_alpha" in n]
    assert "Every configuration here shares" in page and "model_name=" in page.split(
        "Every configuration here shares")[1].split("</details>")[0]
    index = Path(outcome.report).read_text()
    assert "Triage" in index and "Every KPI" in index
    project = load_project("fine_tuning")
    found = discover(tmp_path / "t")
    runs = [analyse_run(project, r) for r in parse_dirs(found.results, project.parser)]
    serving_like = replace(project, loss_curve=None,
                           resource_rows=lambda r: [{"t_s": 0.0, "metric": "cpu", "value": 1.0}])
    html_text = _draw_resources(ReportContext(serving_like, runs, pd.DataFrame(), None, [],
                                              found), {})
    assert "loss per logging step" not in html_text and ": resources, s into the test window" in html_text


def test_help_lists_every_subcommand() -> None:

    out = subprocess.run([sys.executable, "-m", "analysis", "--help"], capture_output=True,
                         text=True, timeout=120).stdout
    for sub in ("history", "accept", "compare", "lts-schema"):
        assert f"python -m analysis {sub} " in out, out


def test_an_empty_triage_says_whether_anything_was_judged_and_why() -> None:
    from types import SimpleNamespace as NS

    from analysis.report_index import triage_headline

    def run(status: str) -> NS:
        return NS(validity=NS(status=status, reasons=["busy machine"]))

    def ctx(verdicts: list[str], runs: list[NS], history: str | None = "h") -> NS:
        return NS(verdicts=[NS(verdict=v) for v in verdicts], runs=runs, history_uri=history)

    assert triage_headline(ctx(["no_change"], [run("valid")])) == \
        "nothing to look at: no regression, suspect or noisier KPI"
    assert "invalid measurements" in triage_headline(
        ctx([], [run("invalid"), run("invalid")]))
    assert "no history given" in triage_headline(ctx([], [run("valid")], history=None))
    assert "not enough comparable valid runs" in triage_headline(
        ctx(["insufficient_history"], [run("valid")]))


def test_the_first_screen_is_one_line_worst_first() -> None:
    from types import SimpleNamespace as NS

    from analysis.report_index import triage_line

    def run(status: str) -> NS:
        return NS(validity=NS(status=status, reasons=["busy machine"]))

    def ctx(verdicts: list[str], runs: list[NS]) -> NS:
        return NS(verdicts=[NS(verdict=v) for v in verdicts], runs=runs, history_uri="h",
                  curves=())

    kinds = ["no_change"] * 9 + ["suspect", "regression", "not_judged", "regression",
                                 "noisier"]
    assert triage_line(ctx(kinds, [run("valid")])) == (
        "2 regressions, 1 suspect, 1 noisier KPI, 9 unchanged, 1 not judged")
    line = triage_line(ctx(["not_judged"] * 3, [run("invalid")]))
    assert line.startswith("3 not judged: the 1 run(s) are invalid measurements")


def test_a_history_chart_carries_its_baseline_band_and_level() -> None:
    """Each configuration's history is drawn over its level (per segment between change
    points) and a ± 2-noise-SD band: where the newest run lands is readable at a glance."""
    from analysis.report_html import level_band

    rng = np.random.default_rng(3)
    values = list(100 * (1 + rng.normal(0, 0.01, 30))) + list(80 * (1 + rng.normal(0, 0.01, 10)))
    level, low, high = level_band(values, [30])
    assert level[0] == pytest.approx(100, rel=0.01) and level[-1] == pytest.approx(80, rel=0.01)
    width = (high[0] - low[0]) / level[0]
    assert 0.02 < width < 0.06  # ± 2 SD of 1 % noise, read within the levels (not the step)
    assert np.all(low <= level) and np.all(level <= high)
    flat, flat_low, flat_high = level_band([5.0, -5.0, 5.0, -5.0], [])
    assert np.all(flat_low <= flat) and np.all(flat <= flat_high)


def test_the_first_screen_has_a_card_per_regression_whose_commands_work(
        tmp_path: Path) -> None:
    """A confirmed regression gets a card: its chart, the change with an interval that
    holds it, and accept/compare commands that run as printed on this history."""
    import html
    import shlex

    from analysis.compare import compare_frames
    from analysis.history import HistoryStore

    hist = str(tmp_path / "hist")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(10):
        make_result_dir(tmp_path / f"h{i}", "000__cell", start=start + timedelta(days=i),
                        tokens_per_second=1000 + (i % 3), runtime=40, seed=i)
        postprocess(tmp_path / f"h{i}", "fine_tuning", tmp_path / f"o{i}", history_uri=hist,
                    report=False)
    for j, tps in enumerate((800, 795)):
        make_result_dir(tmp_path / f"s{j}", "000__cell", start=start + timedelta(days=20 + j),
                        tokens_per_second=tps, runtime=40, seed=100 + j)
        outcome = postprocess(tmp_path / f"s{j}", "fine_tuning", tmp_path / f"so{j}",
                              history_uri=hist)
    (judged,) = [v for v in outcome.verdicts if v.kpi == "train_tokens_per_second"]
    assert judged.verdict == "regression"
    index = (tmp_path / "so1" / "report" / "index.html").read_text()
    first_card = index.index("<section class='card'")
    assert index.index("class='verdict-line'") < first_card  # the line, then the cards
    card = index[first_card:index.index("</section>", first_card)]
    assert "Regression: train_tokens_per_second" in card and "Plotly.newPlot" in card
    low, high = map(float, re.search(r"95 % interval ([-+][\d.]+)% \.\. ([-+][\d.]+)%",
                                     card).groups())
    assert low <= judged.change_pct <= high < 0
    assert "first bad run" in card and "this run" in card
    compare = html.unescape(re.search(r"<code>(python -m analysis compare [^<]*)</code>",
                                      card).group(1))
    args = shlex.split(compare)
    a, b = args[-2], args[-1]
    rows = compare_frames(HistoryStore(hist).read(), a, b, kpis=["train_tokens_per_second"])
    assert [r.verdict for r in rows] == ["worse"]
    assert html.unescape(re.search(r"<code>(python -m analysis accept [^<]*)</code>",
                                   card).group(1)).endswith(
        f"{judged.run_uuid} --kpi train_tokens_per_second")


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(4, 200), noise=st.floats(0.0, 0.2),
       shift=st.floats(-0.9, 3.0), new=st.integers(1, 6), level=st.sampled_from(
           [-50.0, 1e-6, 1.0, 1e6]))
def test_a_changes_interval_holds_the_change_on_any_line(
        seed: int, n: int, noise: float, shift: float, new: int, level: float) -> None:
    from analysis.report_cards import change_interval

    rng = np.random.default_rng(seed)
    values = level * (1 + rng.normal(0, noise, n))
    first = max(n - new, 1)
    values[first:] *= 1 + shift
    change = shift * 100
    found = change_interval(values.tolist(), [first], first, n - 1, 30, change)
    if found is None:
        return
    low, high = found
    assert math.isfinite(low) and math.isfinite(high)
    slack = 1e-9 * max(1.0, abs(change))  # exp(log1p(x)) rounds
    assert low - slack <= change <= high + slack


def test_a_time_axis_of_one_instant_is_widened_to_hours() -> None:
    from analysis.report_html import time_axis

    same = pd.Series(pd.to_datetime(["2026-11-27T04:22:25.999Z"] * 3, utc=True))
    assert time_axis(same) == {"range": ["2026-11-27T03:22:25", "2026-11-27T05:22:25"]}
    spread = pd.Series(pd.to_datetime(["2026-11-27T04:00Z", "2026-11-28T04:00Z"], utc=True))
    assert time_axis(spread) == {} and time_axis(pd.Series([], dtype="object")) == {}
