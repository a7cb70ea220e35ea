"""The command line's early parse: warm dirs analysed beside its imports, then taken in.

``python -m analysis`` analyses the first warm dirs in the memo's child while it imports
pandas and pyarrow (`analysis.__main__._prepare`, `analysis.run_analysis.serve_early`); the
pipeline takes them in when they were analysed as it analyses (`Prepared.key`) and serves
the rest. The whole command against one core is `tests/analysis/test_beside.py`; here the
pieces: what the early path imports, where `serve_until` stops, that a served run is taken
in once and never served again, and that runs analysed otherwise are served again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analysis.discovery import discover
from analysis.parsing import parse_dirs, serve_until
from analysis.project import load_project
from analysis.run_analysis import Analyser, Prepared, _analyse_tree, serve_early
from analysis.settings import ValidityPolicy
from tests.factories import make_result_dir

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "pyarrow", "numpy", "scipy", "plotly")


def _tree(root: Path, dirs: int) -> Path:
    tree = root / "results"
    for i in range(dirs):
        make_result_dir(tree, f"{i:03d}__cell", seed=i, tokens_per_second=1000.0 + 7 * i)
    return tree


def _make_cold(result: Any) -> None:
    """A file the dir was parsed from changes: its parse cache no longer holds."""
    log = Path(result.path) / "001__fine_tuning__run_fine_tuning_job" / "artifacts" / \
        "pod.log"
    log.write_text(log.read_text() + "one more line\n")


def _warm(tree: Path) -> list[Any]:
    """The tree's result dirs, their parse caches written."""
    found = discover(tree).results
    parse_dirs(found, load_project("fine_tuning").parser)
    return found


def test_the_early_parse_imports_nothing_heavy() -> None:
    """What the child imports before it serves: a heavy import there is a slower child.

    Every registered project's hooks too (their modules are imported by `load_project`).
    """
    script = (
        "import json, sys\n"
        "import analysis.__main__, analysis.memo, core.forked\n"
        "from analysis.discovery import available_projects, discover\n"
        "from analysis.parsing import BESIDE_MAX_RUNS, serve_until\n"
        "from analysis.project import load_project\n"
        "from analysis.run_analysis import Analyser, Prepared, serve_early\n"
        "from analysis.settings import settings_for\n"
        "for name in available_projects():\n"
        "    hooks = load_project(name)\n"
        "    settings_for(hooks, '.')\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=True)
    assert json.loads(proc.stdout) == []


def test_serve_until_serves_from_the_first_and_stops_where_asked(tmp_path: Path) -> None:
    tree = _tree(tmp_path, 8)
    found = _warm(tree)
    _make_cold(found[2])
    parser = load_project("fine_tuning").parser
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 5  # asked before each dir: dirs 0-4, then stop

    served, missed = serve_until(found, parser, lambda i, r: (i, r.rel_path), stop)
    assert [i for i, _ in served] == [0, 1, 3, 4]
    assert [value for _, value in served] == [(i, found[i].rel_path) for i in (0, 1, 3, 4)]
    assert missed == [2]
    assert serve_until(found, parser, lambda i, r: i, lambda: True) == ([], [])


def test_a_dir_whose_analysis_fails_ends_the_serving_before_it(tmp_path: Path) -> None:
    found = _warm(_tree(tmp_path, 5))

    def then(index: int, result: Any) -> int:
        if index == 3:
            raise ValueError("bad run")
        return index

    served, missed = serve_until(found, load_project("fine_tuning").parser, then,
                                 lambda: False)
    assert served == [(0, 0), (1, 1), (2, 2)] and missed == []


def test_a_forced_parse_serves_nothing_ahead(tmp_path: Path, monkeypatch: Any) -> None:
    found = _warm(_tree(tmp_path, 3))
    monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "1")
    assert serve_until(found, load_project("fine_tuning").parser, lambda i, r: i,
                       lambda: False) == ([], [])


@pytest.mark.parametrize(("dirs", "project"), [(6, None), (40, "fine_tuning")])
def test_served_dirs_are_taken_in_once_and_never_served_again(
        tmp_path: Path, dirs: int, project: str | None) -> None:
    """On both paths of `parse_dirs`: one process, and warm windows with cold workers."""
    found = _warm(_tree(tmp_path, dirs))
    _make_cold(found[1])
    parser = load_project("fine_tuning").parser
    count = iter(range(dirs // 2))
    served = serve_until(found, parser, lambda i, r: ("early", i, r.rel_path),
                         lambda: next(count, None) is None)
    assert served[1] == [1] and len(served[0]) == dirs // 2 - 1
    taken: list[int] = []

    def after(index: int, value: Any) -> Any:
        taken.append(index)
        return value

    values = parse_dirs(found, parser, project=project, served=served, after=after,
                        then=lambda i, r: ("late", i, r.rel_path))
    assert sorted(taken) == list(range(dirs))  # each index once
    assert values == [("early" if i < dirs // 2 and i != 1 else "late", i, found[i].rel_path)
                      for i in range(dirs)]
    # forced: nothing served ahead is taken
    values = parse_dirs(found, parser, project=project, served=served, force=True,
                        then=lambda i, r: ("late", i))
    assert values == [("late", i) for i in range(dirs)]


def test_prepared_runs_are_taken_in_only_when_analysed_alike(tmp_path: Path) -> None:
    tree = _tree(tmp_path, 4)
    _warm(tree)
    hooks = load_project("fine_tuning")
    found = discover(tree, project="fine_tuning")
    alike = serve_early(Analyser(hooks, found, None, None, ValidityPolicy()), lambda: False)
    assert len(alike.served[0]) == 4 and alike.key is not None
    _, runs, _, _ = _analyse_tree(tree, hooks, None, None, force=False, trust_cache=False,
                                  prepared=alike)
    assert [r for r in runs] == [v[0] for _, v in alike.served[0]]
    assert all(r is v[0] for r, (_, v) in zip(runs, alike.served[0], strict=True))
    # analysed under another policy (every run too short): not this analysis's runs
    strict = ValidityPolicy(min_window_s=86_400)
    other = serve_early(Analyser(hooks, found, None, None, strict), lambda: False)
    assert other.key != alike.key
    assert {v[0].validity.status for _, v in other.served[0]} == {"invalid"}
    _, runs, _, _ = _analyse_tree(tree, hooks, None, None, force=False, trust_cache=False,
                                  prepared=other)
    assert {r.validity.status for r in runs} == {"valid"}
    assert not any(r is v[0] for r, (_, v) in zip(runs, other.served[0], strict=True))
    # the discovery alone is used as it is
    _, runs, _, _ = _analyse_tree(tmp_path / "nowhere", hooks, None, None, force=False,
                                  trust_cache=False, prepared=Prepared(found))
    assert len(runs) == 4
