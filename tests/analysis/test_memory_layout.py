"""What keeps a 10 000-run post-processing small (#43) keeps its outputs exactly as before.

The peak figures themselves are measured in ``benchmarks/analysis_bounds.py``, never here;
these tests hold the mechanisms: the runs table built column by column equals the table of
one dict per run, the KPI table's dictionary-encoded labels decode to the text table and reach
every file as text, equal validities are one object, Arrow's buffers come from the C
library in the CLI and the variable saying so never reaches a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.arrow_memory import POOL_ENV
from analysis.history import FINGERPRINT
from analysis.history_schema import decoded, write_parquet
from analysis.kpi import Kpi, kpi_table
from analysis.pipeline import postprocess
from analysis.run_analysis import runs_table
from tests.factories import make_result_dir

REPO = Path(__file__).resolve().parents[2]

_NAMES = st.sampled_from(["model", "lr", "test_path", "status", "cell", "exit_code", "gpu"])
_LABELS = st.dictionaries(_NAMES, st.text(max_size=6), max_size=5)


def _run(i: int, labels: dict[str, str], start: str | None, presets: list[str] | None,
         problems: int) -> Any:
    return SimpleNamespace(run_uuid=f"uuid-{i}", start=start, end="2026-12-03T00:00:00+00:00",
                           status="success", presets=presets,
                           result=SimpleNamespace(exit_code=i % 3, rel_path=f"{i:03d}__cell",
                                                  problems=[None] * problems),
                           name=f"cell {i}", labels=labels)


def _one_dict_per_run(runs: list[Any]) -> pd.DataFrame:
    """The table as it was built before: a label named like a column wins (a dict's update)."""
    return pd.DataFrame([{
        "run_uuid": r.run_uuid, "start": r.start, "end": r.end, "status": r.status,
        "exit_code": r.result.exit_code, "test_path": r.result.rel_path, "cell": r.name,
        "presets": ",".join(r.presets or []),
        "problems": len(r.result.problems), **r.labels} for r in runs])


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(_LABELS, st.none() | st.just("2026-12-01T00:00:00+00:00"),
                               st.none() | st.lists(st.sampled_from(["light", "gpu"]),
                                                    max_size=2),
                               st.integers(0, 3)), min_size=1, max_size=6))
def test_the_runs_table_built_by_column_is_the_table_of_one_dict_per_run(
        rows: list[tuple[dict[str, str], str | None, list[str] | None, int]]) -> None:
    runs = [_run(i, *row) for i, row in enumerate(rows)]
    pd.testing.assert_frame_equal(runs_table(runs), _one_dict_per_run(runs))


def test_equal_validities_are_one_object_and_their_reasons_stay_apart(tmp_path: Path) -> None:
    tree = tmp_path / "results"
    for i in range(3):
        make_result_dir(tree, f"{i:03d}__cell", seed=i)
    make_result_dir(tree, "003__cell", exit_code=1, seed=3)
    outcome = postprocess(tree, "fine_tuning", tmp_path / "out", report=False)
    validity = outcome.validity
    valid = [v for v in validity.values() if v.status == "valid"]
    assert len(valid) == 3 and len({id(v) for v in valid}) == 1
    (failed,) = [v for v in validity.values() if v.status == "failed"]
    assert failed.reasons == ["the workload exited 1"] and valid[0].reasons == []
    written = pd.read_parquet(tmp_path / "out" / "runs.parquet")
    assert sorted(written["test_path"]) == sorted(validity)


_PROBE = """
import json, os, subprocess, sys
from analysis.arrow_memory import use_system_allocator
backend = use_system_allocator()
child = subprocess.run([sys.executable, "-c",
                        "import os; print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"backend": backend, "env": os.environ.get("ARROW_DEFAULT_MEMORY_POOL"),
                  "child": child, "again": use_system_allocator()}))
"""


def _probe(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_arrow_takes_the_c_librarys_allocator_and_no_child_inherits_the_setting() -> None:
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    assert _probe(env) == {"backend": "system", "env": None, "child": "None",
                           "again": "system"}
    # a user's own choice wins, and stays theirs for the children
    chosen = _probe({**env, POOL_ENV: "jemalloc"})
    assert chosen["env"] == chosen["child"] == "jemalloc"
    assert chosen["backend"] == chosen["again"] != "system"


def test_the_command_line_sets_the_allocator_before_pyarrow_is_imported(
        tmp_path: Path) -> None:
    """Arrow's C++ side reads the pool when pyarrow is imported: later is too late.

    Set later, the Python-side default says "system" too, but the C++ side (the Parquet
    writer) still allocates from mimalloc: that pool must never have been used.
    """
    tree = tmp_path / "results"
    make_result_dir(tree, "000__cell")
    # The command ends through core.exit.exit_now (no code runs after its __main__), which
    # runs the atexit handlers: the probe is one, registered before the command starts.
    code = ("import atexit, runpy, sys; sys.argv = ['analysis', *sys.argv[1:]]\n"
            "def probe():\n"
            "    import pyarrow as pa\n"
            "    try:\n        unused = pa.mimalloc_memory_pool().max_memory() == 0\n"
            "    except NotImplementedError:  # a pyarrow built without it\n"
            "        unused = True\n"
            "    print('pool', pa.default_memory_pool().backend_name, unused, flush=True)\n"
            "atexit.register(probe)\n"
            "runpy.run_module('analysis', run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    done = subprocess.run([sys.executable, "-c", code, str(tree), "--project", "fine_tuning",
                           "--out", str(tmp_path / "out"), "--no-report", "--quiet"],
                          cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "pool system True", done.stderr[-2000:]


_TRACE = st.dictionaries(st.sampled_from(["x", "y", "name", "hovertext"]),
                         st.lists(st.floats(allow_nan=True) | st.text(max_size=8), max_size=4)
                         | st.text(max_size=12), max_size=4)


@settings(max_examples=60, deadline=None)
@given(data=st.lists(_TRACE, max_size=4) | _TRACE, layout=_TRACE)
def test_a_figure_written_in_parts_is_the_figure_written_whole(data: Any, layout: Any) -> None:
    """Each trace's JSON a part of its own (`figure_parts`) writes the text the whole data's
    JSON did, escapes included (``</script>`` in a name never closes the script)."""
    from analysis.report_html import _figure_html, _script_json, figure_parts

    figure = {"data": data, "layout": layout}
    text = "".join(figure_parts(figure))
    div = text.split("'", 2)[1]
    assert text == (f"<div id='{div}' class='plotly-graph-div' style='height:100%; "
                    f"width:100%;'></div><script>Plotly.newPlot('{div}',{_script_json(data)},"
                    f"{_script_json(layout)},{{\"responsive\":true}});</script>")
    assert "</script>" not in text[:-len("</script>")]
    assert _figure_html(figure).count("Plotly.newPlot") == 1


def test_a_history_page_with_nothing_to_draw_is_whole_and_carries_no_plotly(
        tmp_path: Path) -> None:
    """Only a page of charts is drawn in parts (and so carries plotly.js): a history with
    nothing to draw stays one line, and a report of only such pages needs no plotly.js."""
    from analysis.discovery import discover
    from analysis.project import load_project
    from analysis.report import REPORT_KINDS
    from analysis.report_context import ReportContext

    make_result_dir(tmp_path / "results", "001__cell")
    ctx = ReportContext(load_project("fine_tuning"), [], pd.DataFrame(), None, [],
                        discover(tmp_path / "results"))
    assert REPORT_KINDS["kpi_history"](ctx, {}) == "<p class='empty'>no history yet</p>"
    tree = tmp_path / "one"
    make_result_dir(tree, "000__cell")
    outcome = postprocess(tree, "fine_tuning", tmp_path / "out")
    assert outcome.report is not None
    page = next((tmp_path / "out" / "report").glob("*_kpi_history.html")).read_text()
    assert page.count("Plotly.newPlot") >= 1 and "<script src='plotly.min.js'>" in page


_LABEL_VALUES = st.none() | st.text(max_size=5)
_KPI_RUNS = st.lists(st.tuples(
    st.dictionaries(st.sampled_from(["model", "lr", "gpu", "zone"]),
                    st.text(max_size=5), max_size=4),
    st.lists(st.sampled_from(["k1", "k2", "k3"]), max_size=3, unique=True), _LABEL_VALUES),
    min_size=1, max_size=6)


def _one_row_each(runs: list[tuple[dict[str, str], list[str], str | None]]) -> pd.DataFrame:
    """The KPI table as text, one dict per row: what the encoded table decodes to."""
    rows = [{"run_uuid": f"r{i}", "kpi": name, "value": float(n), **labels,
             FINGERPRINT: extra} for i, (labels, names, extra) in enumerate(runs)
            for n, name in enumerate(names)]
    keys = sorted({k for labels, names, _ in runs if names for k in labels})
    frame = pd.DataFrame(rows, columns=["run_uuid", "kpi", "value", *keys, FINGERPRINT])
    return frame.astype({"value": "float64",
                         **{c: "string" for c in ["run_uuid", "kpi", *keys, FINGERPRINT]}})


@settings(max_examples=80, deadline=None)
@given(runs=_KPI_RUNS)
def test_the_encoded_kpi_table_decodes_to_the_text_table_and_is_written_as_text(
        runs: list[tuple[dict[str, str], list[str], str | None]], tmp_path_factory: Any) -> None:
    frame = kpi_table([(f"r{i}", None, [Kpi(name=name, value=float(n), unit="u", help="h",
                                            lower_better=False, labels=labels)
                                        for n, name in enumerate(names)])
                       for i, (labels, names, _) in enumerate(runs)],
                      run_columns={FINGERPRINT: [extra for _, _, extra in runs]})
    expected = _one_row_each(runs)
    labels = [c for c in expected.columns if c not in ("run_uuid", "kpi", "value")]
    assert [c for c in frame.columns if c in labels] == labels
    assert all(isinstance(frame[c].dtype, pd.CategoricalDtype) for c in labels)
    text = pd.DataFrame({c: decoded(frame[c]) for c in expected.columns})
    pd.testing.assert_frame_equal(text, expected)
    # groups and order as text: a grouping by an encoded label is the grouping by its text
    for column in labels:
        assert ([k for k, _ in frame.groupby(column, sort=True, dropna=False)]
                == [k for k, _ in text.groupby(column, sort=True, dropna=False)])
    path = tmp_path_factory.mktemp("kpis") / "kpis.parquet"
    with path.open("wb") as stream:
        write_parquet(frame, stream, rows_per_group=2)
    schema = pq.read_schema(path)
    assert not any(pa.types.is_dictionary(t) for t in schema.types)
    read = pd.read_parquet(path)
    pd.testing.assert_frame_equal(read[list(expected.columns)], expected)


def test_a_written_column_is_typed_by_all_its_rows_not_its_first_row_group(
        tmp_path: Path) -> None:
    frame = pd.DataFrame({"late": [None, None, "x"],
                          "code": pd.Categorical(["a", None, "a"])})
    path = tmp_path / "t.parquet"
    with path.open("wb") as stream:
        write_parquet(frame, stream, rows_per_group=1)
    table = pq.read_table(path)
    assert [str(t) for t in table.schema.types] == ["large_string", "large_string"]
    assert table.column("late").to_pylist() == [None, None, "x"]
    assert table.column("code").to_pylist() == ["a", None, "a"]
    with (tmp_path / "empty.parquet").open("wb") as stream:
        write_parquet(frame.iloc[:0], stream)
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


def test_every_parquet_file_of_the_analysis_is_written_as_text() -> None:
    """Audit: a table leaves post-processing as Parquet through `write_parquet` (the
    history's parts through `normalised`): an encoded label never reaches a file."""
    allowed = {"history_schema.py": "write_parquet", "history.py": "_write_table"}
    offenders = []
    for path in sorted((REPO / "analysis").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ".to_parquet(" in line or "write_table(" in line or "ParquetWriter(" in line:
                if path.name not in allowed:
                    offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_the_report_is_drawn_once_the_runs_kpi_objects_are_gone(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The KPI table holds every value by then: the runs' own KPI objects (~4 KB a run,
    40 MB at 10 000) are never held through the report, nor copied into its child."""
    import analysis.report_index as report_index

    held: list[int] = []
    real = report_index.render_report

    def spy(out: Path, hooks: Any, runs: Any, *args: Any, **kwargs: Any) -> Path:
        held.append(sum(len(run.kpis) for run in runs))
        return real(out, hooks, runs, *args, **kwargs)

    monkeypatch.setattr(report_index, "render_report", spy)
    monkeypatch.setenv("TELLTALE_BESIDE", "0")  # drawn here: a child forked at that moment
    # would hold what this process holds, but its spy's count would stay in the child
    for i in range(3):
        make_result_dir(tmp_path / "r", f"{i:03d}__cell", seed=i)
    outcome = postprocess(tmp_path / "r", "fine_tuning", tmp_path / "o", report=True)
    assert held == [0] and outcome.kpi_rows > 0
