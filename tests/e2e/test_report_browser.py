"""The report in a real browser: read in ten seconds, at the widths people use (#45).

A generated history (four configurations of fine_tuning over 36 nights) gives the newest
report a confirmed regression, a suspect, a KPI whose spread grew and an invalid run. Every
page, and the compare page of the last nights against the ten before, is opened in Chromium
(Debian's headless shell, driven by Playwright) at 1 280 and 1 920 px: no page is wider than
the window, no two text boxes of a chart overlap (titles, axis titles and tick labels,
legend entries, annotations), no chart is drawn wider than its box or over the page's text,
and the index's first screen (the top 800 px) holds the summary line and the first verdict
card with its chart.

Screenshots of every page go to ``TELLTALE_SCREENSHOTS`` (default
``<repo>/.test-output/report-screens``) for a person to look at.

Needs ``playwright`` (the dev extra) and ``chromium-headless-shell`` (Debian: `.ci/run`
installs it; Playwright's own browser download is not reachable here). Without the
browser the test is skipped, unless ``TELLTALE_REQUIRE_BROWSER`` is set (CI), where that
fails.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from analysis.judging import NOT_JUDGED
from analysis.pipeline import postprocess
from analysis.validity import HOST_FILE, HostWindow
from tests.factories import DEFAULT_SETTINGS, built_once, make_result_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BROWSER = os.environ.get("TELLTALE_BROWSER", "/usr/bin/chromium-headless-shell")
WIDTHS = (1280, 1920)
FIRST_SCREEN = 800
SCREENS = Path(os.environ.get("TELLTALE_SCREENSHOTS", Path(__file__).resolve().parents[2]
                              / ".test-output" / "report-screens"))


def _browser_or_skip() -> str:
    required = bool(os.environ.get("TELLTALE_REQUIRE_BROWSER"))
    try:
        import playwright  # noqa: F401
    except ImportError:
        if required:
            pytest.fail("TELLTALE_REQUIRE_BROWSER is set but playwright is not installed")
        pytest.skip("playwright is not installed (the dev extra has it)")
    path = shutil.which(BROWSER) or (BROWSER if Path(BROWSER).is_file() else None)
    if path is None:
        if required:
            pytest.fail(f"TELLTALE_REQUIRE_BROWSER is set but {BROWSER} is missing "
                        "(apt-get install chromium-headless-shell)")
        pytest.skip(f"no browser at {BROWSER} (apt-get install chromium-headless-shell)")
    return path


def _rank(r: int) -> dict[str, Any]:
    """The default settings with another LoRA rank: a configuration of its own."""
    return {"hyper_parameters": {**DEFAULT_SETTINGS["hyper_parameters"], "r": r}}


CELLS = {"000__cell": _rank(4), "001__cell": _rank(8), "002__cell": _rank(16)}


def _night(root: Path, night: int, start: datetime, rng: random.Random,
           nights: int) -> None:
    """One night's result dir: three cells, the shapes of the history built in."""
    last = night == nights - 1
    for name, settings in CELLS.items():
        tps, runtime = 1000 * (1 + rng.gauss(0, 0.004)), 40 * (1 + rng.gauss(0, 0.004))
        if name == "000__cell" and night >= nights - 2:
            tps *= 0.8  # a regression: slow two nights running (confirmed by the second)
        if name == "001__cell" and last:
            tps *= 0.8  # a suspect: slow on the newest night only
        if name == "002__cell" and night >= nights - 16:
            runtime = 40 * (1 + rng.gauss(0, 0.03))  # the spread grew ~8x, same level
        make_result_dir(root, name, settings=settings, start=start + timedelta(days=night),
                        tokens_per_second=tps, runtime=runtime, seed=night * 10 + int(name[:3]))
    if last:  # and a run of a fourth configuration on a busy machine: invalid, not judged
        busy = make_result_dir(root, "003__cell", settings=_rank(32),
                               start=start + timedelta(days=night), tokens_per_second=300,
                               runtime=130, seed=999)
        (busy / HOST_FILE).write_text(HostWindow(
            cores=2, window_s=40, cpu_total_s=80, cpu_busy_s=78, run_cpu_s=20,
            load1_max=6.0, other_runnable_mean=4.0).model_dump_json())


def _build_report(root: Path) -> str:
    """36 nights post-processed into ``root``; the last night's outcome, as JSON.

    The 35 earlier nights in one post-processing (one tree, a night a folder), the newest
    alone: the history holds KPI rows, not verdicts, so the newest night's verdicts are the
    ones 35 nightly post-processings left (checked: the same 16), in ~1 s instead of ~22
    (29 CPU-s of the suite). The earlier runs' cells carry their night's folder
    (``night07/000__cell``); configurations are compared by their labels, not by cell.
    """
    history = str(root / "history")
    start = datetime(2026, 10, 1, 2, 30, tzinfo=UTC)
    rng = random.Random(45)
    nights = 36
    for night in range(nights - 1):
        _night(root / "earlier" / f"night{night:02d}", night, start, rng, nights)
    postprocess(root / "earlier", "fine_tuning", root / "out-earlier", history_uri=history,
                report=False)
    results = root / f"night{nights - 1:02d}"
    _night(results, nights - 1, start, rng, nights)
    outcome = postprocess(results, "fine_tuning", root / f"out{nights - 1:02d}",
                          history_uri=history, report=True)
    # and the compare page of the last two nights against the ten before
    from analysis.compare import compare_frames, comparison_html
    from analysis.history import HistoryStore
    from core.safeio import write_text

    frame = HistoryStore(history).read()
    stamp = (start + timedelta(days=nights - 2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    before = (start + timedelta(days=nights - 12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    a, b = f"{before}..{stamp}", f"{stamp}.."
    write_text(root / f"out{nights - 1:02d}" / "report" / "compare.html",
               comparison_html(compare_frames(frame, a, b), a, b))
    return outcome.model_dump_json()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """The newest night's report over 35 earlier nights (real post-processing), built once
    for the session: its two tests may run on two workers."""
    from analysis.pipeline import PostprocessOutcome

    root, outcome = built_once(tmp_path_factory, "report-browser", _build_report)
    yield root / "out35" / "report", PostprocessOutcome.model_validate_json(outcome)


@pytest.fixture(scope="module")
def serving_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An llm_serving sweep's report (its curve and distribution pages): eight cells, four
    concurrencies by two shapes, each the recorded GuideLLM result of a light run with its
    figures scaled by the concurrency (real post-processing, no history)."""
    import json

    import yaml

    from projects.llm_serving.parser import WORKLOAD_GLOB
    from projects.llm_serving.workload.load import _verdict

    root = tmp_path_factory.mktemp("serving-report")
    recorded = json.loads((Path(__file__).resolve().parents[1] / "data" /
                           "guidellm_light.json").read_text())
    index = 0
    for shape in ((64, 32), (256, 128)):
        for concurrency in (1, 2, 4, 8):
            cell = root / "results" / f"{index:03d}__cell"
            job = cell / WORKLOAD_GLOB.replace("*", "001") / "artifacts"
            job.mkdir(parents=True)
            data = json.loads(json.dumps(recorded))
            for bench in data.get("benchmarks", []):
                for name, metric in bench.get("metrics", {}).items():
                    successful = metric.get("successful") if isinstance(metric, dict) else None
                    if isinstance(successful, dict) and isinstance(successful.get("mean"),
                                                                   float):
                        factor = concurrency ** (0.8 if "per_second" in name else 0.3)
                        successful["mean"] *= factor
            (job / "guidellm.json").write_text(json.dumps(data))
            _, summary = _verdict(str(job / "guidellm.json"), ["generation_delay_ttft"])
            (job / "load.json").write_text(json.dumps(summary))
            (cell / "settings.yaml").write_text(yaml.safe_dump({
                "model_name": "tiny-opt", "concurrency": concurrency,
                "prompt_tokens": shape[0], "output_tokens": shape[1], "duration_s": 10,
                "request_format": "completions"}))
            (cell / "exit_code").write_text("0\n")
            (cell / ".uuid").write_text(f"serving-{index:03d}\n")
            # every cell in the same second: a time axis of one instant (plotly drew its
            # milliseconds, labels into the y axis's)
            (cell / "test_start_end.json").write_text(json.dumps(
                {"start": "2026-11-27T04:22:25.500000+00:00",
                 "end": "2026-11-27T04:22:40+00:00"}))
            index += 1
    outcome = postprocess(root / "results", "llm_serving", root / "out", report=True)
    assert outcome.report
    return Path(outcome.report).parent


def test_the_generated_history_has_every_kind_the_report_must_show(
        report: tuple[Path, Any]) -> None:
    _, outcome = report
    kinds = {(v.test_path, v.kpi): v.verdict for v in outcome.verdicts}
    assert kinds[("000__cell", "train_tokens_per_second")] == "regression"
    assert kinds[("001__cell", "train_tokens_per_second")] == "suspect"
    assert "noisier" in {k for (cell, _), k in kinds.items() if cell == "002__cell"}
    assert {k for (cell, _), k in kinds.items() if cell == "003__cell"} == {NOT_JUDGED}


_LAYOUT_PROBE = """() => {
  const boxes = [];
  document.querySelectorAll('.plotly-graph-div').forEach((graph, g) => {
    const add = (selector, kind) => graph.querySelectorAll(selector).forEach((e) => {
      const r = e.getBoundingClientRect();
      if (r.width > 0 && r.height > 0 && (e.textContent || '').trim())
        boxes.push({graph: g, kind, text: e.textContent.trim().slice(0, 60),
                    box: [r.left, r.top, r.right, r.bottom]});
    });
    add('.gtitle', 'title');
    add('.g-xtitle text, .g-x2title text, .g-x3title text, .g-x4title text', 'axis title');
    add('.g-ytitle text, .g-y2title text, .g-y3title text, .g-y4title text', 'axis title');
    add('.xaxislayer-above text', 'x ticks');
    add('.yaxislayer-above text', 'y ticks');
    add('.legendtext', 'legend');
    add('.annotation-text', 'annotation');
  });
  const rect = (e) => { const r = e.getBoundingClientRect();
                        return [r.left, r.top, r.right, r.bottom]; };
  // each chart's drawing and the box the page gives it
  const graphs = [...document.querySelectorAll('.plotly-graph-div')].map((g) => (
    {box: rect(g.parentElement), svg: rect(g.querySelector('.main-svg'))}));
  // the page's own text, outside the charts
  const texts = [...document.querySelectorAll('h1, h2, h3, p, dt, dd, li, td, th, code')]
    .filter((e) => !e.closest('.plotly-graph-div') && (e.textContent || '').trim()
                   && e.checkVisibility())  // not the folded part of a <details>
    .map((e) => ({text: e.textContent.trim().slice(0, 60), box: rect(e)}));
  return {width: document.documentElement.scrollWidth, view: window.innerWidth, boxes,
          graphs, texts};
}"""


def _meet(a: list[float], b: list[float]) -> bool:
    """Whether two boxes (left, top, right, bottom) share more than a pixel each way."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 1 and min(a[3], b[3]) - max(a[1], b[1]) > 1


def _chart_problems(probe: dict[str, Any]) -> list[str]:
    """Charts drawn wider or taller than their box, and page text drawn over a chart."""
    found = []
    for i, graph in enumerate(probe["graphs"]):
        (l1, _, r1, _), (l2, _, r2, _) = graph["box"], graph["svg"]
        if r2 > r1 + 1 or l2 < l1 - 1:
            found.append(f"chart {i} is drawn {r2 - l2:.0f} px wide in a {r1 - l1:.0f} px box")
        found += [f"chart {i} is drawn over {t['text']!r}" for t in probe["texts"]
                  if _meet(t["box"], graph["svg"])]
    return found


def _overlaps(boxes: list[dict[str, Any]]) -> list[str]:
    """Pairs of text boxes of one chart that overlap (ticks of one axis among themselves
    are plotly's to space, and are left out)."""
    found = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if a["graph"] != b["graph"] or (a["kind"] == b["kind"] and "ticks" in a["kind"]):
                continue
            # one pixel of slack: glyph boxes of neighbouring lines touch
            if _meet(a["box"], b["box"]):
                found.append(f"{a['kind']} {a['text']!r} / {b['kind']} {b['text']!r}")
    return found


def test_every_page_fits_its_window_and_no_chart_text_overlaps(
        report: tuple[Path, Any], serving_report: Path) -> None:
    from playwright.sync_api import sync_playwright

    path = _browser_or_skip()
    out, _ = report
    pages = sorted(out.glob("*.html"))
    assert {out / "index.html", out / "compare.html"} <= set(pages) and len(pages) > 3
    serving = sorted(serving_report.glob("*.html"))
    assert [p for p in serving if "kpi_curve" in p.name] and [
        p for p in serving if "distribution" in p.name]
    pages += [p for p in serving if p.name != "index.html"]
    curve = next(p for p in serving if "kpi_curve" in p.name).read_text()
    assert "tiny-opt / 64 / 32" in curve and " / \"" not in curve  # no empty label shown
    SCREENS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": FIRST_SCREEN})
                for html_file in pages:
                    page.goto(html_file.as_uri())
                    # every chart drawn (plotly writes its svg), before anything is measured
                    page.wait_for_function(
                        "[...document.querySelectorAll('.plotly-graph-div')]"
                        ".every((g) => g.querySelector('.main-svg'))", timeout=60_000)
                    probe = page.evaluate(_LAYOUT_PROBE)
                    where = f"{html_file.name} at {width} px"
                    if probe["width"] > probe["view"]:
                        problems.append(f"{where}: {probe['width']} px wide")
                    problems += [f"{where}: {o}" for o in _overlaps(probe["boxes"])]
                    problems += [f"{where}: {o}" for o in _chart_problems(probe)]
                    shot = (f"{'serving-' if html_file.parent == serving_report else ''}"
                            f"{html_file.stem}-{width}.png")
                    page.screenshot(path=str(SCREENS / shot), full_page=True)
                    if html_file.name == "index.html":
                        problems += _first_screen(page, where)
                page.close()
        finally:
            browser.close()
    assert not problems, "\n".join(problems)


def _first_screen(page: Any, where: str) -> list[str]:
    """The summary line and the first verdict card, chart included, within the top 800 px."""
    found = page.evaluate("""() => {
      const line = document.querySelector('.verdict-line');
      const card = document.querySelector('.card');
      const chart = card && card.querySelector('.main-svg');
      const bottom = (e) => e ? e.getBoundingClientRect().bottom : null;
      return {line: bottom(line), lineText: line ? line.textContent : '',
              card: bottom(card), chart: bottom(chart),
              title: card ? card.querySelector('h3').textContent : ''};
    }""")
    problems = []
    if found["line"] is None or found["line"] > FIRST_SCREEN:
        problems.append(f"{where}: the summary line is not on the first screen")
    if "1 regression" not in found["lineText"] or "1 suspect" not in found["lineText"]:
        problems.append(f"{where}: the summary line says {found['lineText']!r}")
    if found["chart"] is None or found["chart"] > FIRST_SCREEN:
        problems.append(f"{where}: the first card's chart ends at {found['chart']} px")
    if not found["title"].startswith("Regression"):
        problems.append(f"{where}: the first card is {found['title']!r}, not the regression")
    return problems
