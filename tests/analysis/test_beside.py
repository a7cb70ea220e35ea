"""A post-processing on both cores writes what one core writes (`core.forked` in `analysis`).

``python -m analysis`` forks the memo's stamps of the tree, half of each window of warm
dirs, the tables and the report (`docs/performance.md`). Each command here runs in a fresh
single-threaded interpreter, where it forks (an audit hook counts the forks), and again with
``TELLTALE_BESIDE=0``; every output must be the same to the byte (the report's pages but for
the random ids plotly gives each chart).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import make_result_dir

REPO = Path(__file__).resolve().parents[2]
DIRS = 40  # over twice parsing's _PARALLEL_MIN: a window is split

COUNTING = """
import json, os, sys
forks = []
sys.addaudithook(lambda event, args: forks.append(1) if event == "os.fork" else None)
if os.environ.get("EARLY_SERVES"):
    # the early parse's child claims this many dirs (no more), then the command's serving
    # from the last down may start: a set share each side; each side says what it did
    import analysis.parsing as pa, analysis.run_analysis as ra, core.forked as cf
    limit, (gate_read, gate_write) = int(os.environ["EARLY_SERVES"]), os.pipe()
    serve_early, back, parse_dirs = ra.serve_early, cf.Claims.back, ra.parse_dirs
    class Limited:
        def __init__(self, claims):
            self.claims, self.left = claims, limit
        def front(self, n, leave=0):  # its own share: not the dirs the child leaves
            self.left -= 1
            return self.claims.front(n) if self.left >= 0 else None
    def early(analyser, claims):
        try:
            key, served = serve_early(analyser, Limited(claims))
        finally:
            os.write(gate_write, b"x")
        sys.stderr.write(f"EARLY {len(served[0])} {served[1]}\\n")
        return key, served
    def gated(self, n, opened=[]):
        if not opened:  # this side's writer closed: a child that died ends the wait
            os.close(gate_write)
            os.read(gate_read, 1)
            opened.append(1)
        return back(self, n)
    def taking(*args, helper=None, **kwargs):
        if helper is not None:
            def finish(finish=helper.finish):
                served = finish()
                sys.stderr.write(f"TAKEN {len(served[0]) if served else 0}\\n")
                return served
            helper = pa.Helper(helper.claims, finish)
        return parse_dirs(*args, helper=helper, **kwargs)
    ra.serve_early, cf.Claims.back, ra.parse_dirs = early, gated, taking
from analysis.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("FORKS " + json.dumps(len(forks)) + "\\n")
sys.exit(code)
"""
OUTPUTS = ("kpis.parquet", "runs.parquet", "kpis.prom", "lts_payload.json", "regression.json",
           "regression_summary.yaml")


def _analysis(tree: Path, out: Path, *extra: str, beside: bool, early: int | None = None
              ) -> tuple[int, str, int]:
    """(exit code, stdout, forks) of one ``python -m analysis`` command.

    ``early``: the early parse's child claims that many dirs, the command the rest (see
    ``COUNTING``).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "TELLTALE_BESIDE": "1" if beside else "0"}
    env.pop("EARLY_SERVES", None)
    if early is not None:
        env["EARLY_SERVES"] = str(early)
    proc = subprocess.run([sys.executable, "-c", COUNTING, str(tree), "--project",
                           "fine_tuning", "--out", str(out), "--quiet", *extra], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    forks = re.search(r"FORKS (\d+)", proc.stderr)
    assert forks or proc.returncode != 0, proc.stderr
    said = re.sub(r"(EARLY|TAKEN) .*\n", "", proc.stderr.split("FORKS")[0])
    counts = re.findall(r"(EARLY|TAKEN) (\d+)(.*)\n", proc.stderr)
    return proc.returncode, proc.stdout + said + "".join(
        f"{kind} {n}{rest}\n" for kind, n, rest in counts), int(forks.group(1)) if forks else -1


def _page(path: Path) -> str:
    return re.sub(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", "ID",
                  path.read_text())


def _tree(root: Path) -> Path:
    tree = root / "results"
    for i in range(DIRS):
        broken = {"summary"} if i == 27 else {"pod_json"} if i == 5 else None
        make_result_dir(tree, f"{i:03d}__cell", seed=i, exit_code=1 if i == 30 else 0,
                        tokens_per_second=1000.0 + 13 * i, broken=broken)
    return tree


def test_both_cores_write_every_output_as_one_core_does(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert _analysis(tree, tmp_path / "cold", beside=False)[0] == 0  # the parse caches
    one = _analysis(tree, tmp_path / "one", beside=False)
    both = _analysis(tree, tmp_path / "both", beside=True)
    assert one[0] == both[0] == 0
    assert one[2] == 0 and both[2] >= 4, "stamps, half the parse, the tables, the report"
    assert one[1].replace(str(tmp_path / "one"), "OUT") == \
        both[1].replace(str(tmp_path / "both"), "OUT")  # the summary: counts and files
    for name in OUTPUTS:
        assert (tmp_path / "one" / name).read_bytes() == \
            (tmp_path / "both" / name).read_bytes(), name
    pages = sorted(p.name for p in (tmp_path / "one" / "report").glob("*.html"))
    assert pages == sorted(p.name for p in (tmp_path / "both" / "report").glob("*.html"))
    for name in pages:
        assert _page(tmp_path / "one" / "report" / name) == \
            _page(tmp_path / "both" / "report" / name), name
    payloads = json.loads((tmp_path / "both" / "lts_payload.json").read_text())
    assert len(payloads) == DIRS  # every run's, the child's half included, in order
    assert [p["metadata"]["run_uuid"] for p in payloads] == [
        p["metadata"]["run_uuid"] for p in
        json.loads((tmp_path / "one" / "lts_payload.json").read_text())]


def test_an_error_in_the_childs_half_is_the_commands_error(tmp_path: Path) -> None:
    tree = _tree(tmp_path)  # dir 27 (the child's half) has no summary: incomplete
    assert _analysis(tree, tmp_path / "cold", beside=False)[0] == 0
    code_one, said_one, _ = _analysis(tree, tmp_path / "one", "--strict", beside=False)
    code_both, said_both, _ = _analysis(tree, tmp_path / "both", "--strict", beside=True)
    assert code_one == code_both == 2
    assert "incomplete" in said_both and said_both.replace(
        str(tmp_path / "both"), "OUT") == said_one.replace(str(tmp_path / "one"), "OUT")
    assert not list((tmp_path / "both").glob(".lts_payload.spool*"))


def _outputs_match(one: Path, both: Path) -> None:
    for name in OUTPUTS:
        assert (one / name).read_bytes() == (both / name).read_bytes(), name


@pytest.mark.parametrize("early", [DIRS, 7])
def test_runs_analysed_during_the_imports_are_the_runs_one_core_makes(
        tmp_path: Path, early: int) -> None:
    """The child claims every dir, or 7 (the command serves the rest from the last down), a
    cold one among them (then parsed afresh), a broken one, and a failed run further on."""
    tree = _tree(tmp_path)
    assert _analysis(tree, tmp_path / "cold", beside=False)[0] == 0
    log = tree / "003__cell" / "001__fine_tuning__run_fine_tuning_job" / "artifacts" / \
        "pod.log"
    log.write_text(log.read_text() + "one more line\n")  # dir 3 is cold again
    one = _analysis(tree, tmp_path / "one", beside=False)
    log.write_text(log.read_text() + "and another\n")
    both = _analysis(tree, tmp_path / "both", beside=True, early=early)
    assert one[0] == both[0] == 0
    assert f"EARLY {early - 1} [3]" in both[1]  # dir 3 was found cold, the others served
    assert f"TAKEN {early - 1}" in both[1]  # and taken in: the analyses were alike
    summary = both[1].split("EARLY")[0]
    assert one[1].replace(str(tmp_path / "one"), "OUT") == \
        summary.replace(str(tmp_path / "both"), "OUT")
    _outputs_match(tmp_path / "one", tmp_path / "both")


def test_an_error_met_early_is_the_commands_error_where_it_would_be(tmp_path: Path) -> None:
    tree = _tree(tmp_path)  # cpt mode: the runs' payloads lack presets and config
    assert _analysis(tree, tmp_path / "cold", beside=False)[0] == 0
    code_one, said_one, _ = _analysis(tree, tmp_path / "one", "--strict", beside=False)
    code_both, said_both, _ = _analysis(tree, tmp_path / "both", "--strict", beside=True,
                                        early=DIRS)
    assert "EARLY 0 []" in said_both  # the early parse stopped at the first
    assert code_one == code_both == 2
    assert "incomplete" in said_one and said_both.split("EARLY")[0].replace(
        str(tmp_path / "both"), "OUT") == said_one.replace(str(tmp_path / "one"), "OUT")
