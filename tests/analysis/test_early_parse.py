"""The command line's early parse: warm dirs analysed beside its imports, then taken in.

``python -m analysis`` analyses warm dirs from the first on in the memo's child while it
imports pandas and pyarrow, then while it serves them from the last down
(`analysis.cli._prepare`, `analysis.run_analysis.serve_early`, `parse_dirs`'
``helper``); the pipeline takes the child's runs in when they were analysed as it analyses
(the key the child's runs come back with), else serves them again. The whole command against one core is
`tests/analysis/test_beside.py`; here the pieces, with the child's side played in this
process: what the early path imports, what `serve_claimed` serves, that every dir is taken
in once whichever side served it (both, for a race's last index), and that runs analysed
otherwise are served again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analysis.discovery import discover
from analysis.parsing import Helper, Served, parse_dirs, serve_claimed
from analysis.project import load_project
from analysis.run_analysis import Analyser, Prepared, _analyse_tree, serve_early
from analysis.settings import ValidityPolicy
from core.forked import Claims
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
        "import analysis.cli, analysis.memo, core.forked\n"
        "from analysis.discovery import available_projects, discover\n"
        "from analysis.parsing import BESIDE_MAX_RUNS, Helper, serve_claimed\n"
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


def _claims(indices: list[int]) -> Any:
    """A claim function giving ``indices``, then None."""
    given = iter(indices)
    return lambda: next(given, None)


def test_serve_claimed_serves_what_is_claimed_and_names_the_cold(tmp_path: Path) -> None:
    tree = _tree(tmp_path, 8)
    found = _warm(tree)
    _make_cold(found[2])
    parser = load_project("fine_tuning").parser
    served, missed = serve_claimed(found, parser, lambda i, r: (i, r.rel_path),
                                   _claims([0, 1, 2, 3, 4]))
    assert served == [(i, (i, found[i].rel_path)) for i in (0, 1, 3, 4)]
    assert missed == [2]
    assert serve_claimed(found, parser, lambda i, r: i, _claims([])) == ([], [])


def test_claims_from_both_ends_cover_every_index_once() -> None:
    claims = Claims()
    assert [claims.front(6), claims.front(6)] == [0, 1]
    assert [claims.back(6), claims.back(6), claims.back(6)] == [5, 4, 3]
    assert claims.front(6) == 2
    assert claims.front(6) is None and claims.back(6) is None
    leaving = Claims()  # the child leaves the last two to the parent
    assert [leaving.front(6, leave=2) for _ in range(5)] == [0, 1, 2, 3, None]
    assert [leaving.back(6), leaving.back(6), leaving.back(6)] == [5, 4, None]
    stopped = Claims()
    assert stopped.front(3) == 0
    stopped.stop()
    assert stopped.front(3) is None and stopped.back(3) is None


def test_a_dir_whose_analysis_fails_ends_the_serving_before_it(tmp_path: Path) -> None:
    found = _warm(_tree(tmp_path, 5))

    def then(index: int, result: Any) -> int:
        if index == 3:
            raise ValueError("bad run")
        return index

    served, missed = serve_claimed(found, load_project("fine_tuning").parser, then,
                                   _claims(list(range(5))))
    assert served == [(0, 0), (1, 1), (2, 2)] and missed == []


def test_a_forced_parse_serves_nothing_ahead(tmp_path: Path, monkeypatch: Any) -> None:
    found = _warm(_tree(tmp_path, 3))
    monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "1")
    assert serve_claimed(found, load_project("fine_tuning").parser, lambda i, r: i,
                         _claims([0, 1, 2])) == ([], [])


def _helped(found: list[Any], parser: Any, front: int, *, race: bool = False,
            stop_at: int | None = None) -> tuple[Helper, Served]:
    """A helper whose child served ``front`` dirs from the first on (played here).

    ``race``: it also served the index the parse will claim last (both claimed it);
    ``stop_at``: its analysis of that dir raised (claimed, never served).
    """
    claims = Claims()

    def then(index: int, result: Any) -> Any:
        if index == stop_at:
            raise ValueError("bad run")
        return ("early", index, result.rel_path)

    count = iter(range(front))
    served = serve_claimed(found, parser, then,
                           lambda: claims.front(len(found)) if next(count, None) is not None
                           else None)
    if race:  # the parse's last claim is front's index: the child served it too
        served[0].append((front, ("early", front, found[front].rel_path)))
    return Helper(claims, lambda: served), served


@pytest.mark.parametrize(("dirs", "project"), [(6, None), (40, "fine_tuning")])
@pytest.mark.parametrize("race", [False, True])
def test_every_dir_is_taken_in_once_whichever_side_served_it(
        tmp_path: Path, dirs: int, project: str | None, race: bool) -> None:
    """On both paths of `parse_dirs`: one process, and warm windows with cold workers."""
    found = _warm(_tree(tmp_path, dirs))
    _make_cold(found[1])
    parser = load_project("fine_tuning").parser
    front = dirs // 2
    helper, served = _helped(found, parser, front, race=race)
    assert served[1] == [1] and len(served[0]) == front - 1 + race
    taken: list[int] = []

    def after(index: int, value: Any) -> Any:
        taken.append(index)
        return value

    values = parse_dirs(found, parser, project=project, helper=helper, after=after,
                        then=lambda i, r: ("late", i, r.rel_path))
    assert sorted(taken) == list(range(dirs))  # each index once
    assert values == [("early" if i < front and i != 1 else "late", i, found[i].rel_path)
                      for i in range(dirs)]  # this side's answer where both served


def test_a_dir_the_child_left_is_served_here_and_raises_here(tmp_path: Path) -> None:
    found = _warm(_tree(tmp_path, 6))
    parser = load_project("fine_tuning").parser
    helper, served = _helped(found, parser, 4, stop_at=2)
    assert [i for i, _ in served[0]] == [0, 1]  # dir 2 claimed, not served; 3 never claimed
    values = parse_dirs(found, parser, helper=helper, then=lambda i, r: ("late", i))
    assert values[:2] == [("early", 0, found[0].rel_path), ("early", 1, found[1].rel_path)]
    assert values[2:] == [("late", i) for i in range(2, 6)]


def test_a_forced_parse_dismisses_the_helper(tmp_path: Path) -> None:
    found = _warm(_tree(tmp_path, 4))
    parser = load_project("fine_tuning").parser
    helper, _ = _helped(found, parser, 2)
    values = parse_dirs(found, parser, helper=helper, force=True,
                        then=lambda i, r: ("late", i))
    assert values == [("late", i) for i in range(4)]
    assert helper.claims.front(4) is None  # stopped


def test_prepared_runs_are_taken_in_only_when_analysed_alike(tmp_path: Path) -> None:
    tree = _tree(tmp_path, 4)
    _warm(tree)
    hooks = load_project("fine_tuning")
    found = discover(tree, project="fine_tuning")

    def prepared(policy: ValidityPolicy) -> tuple[Prepared, Served]:
        """The child's side played here: it serves every dir before the parse starts."""
        analyser = Analyser(hooks, found, None, None, policy)
        claims = Claims()
        key, served = serve_early(analyser, claims)
        assert key == analyser.key
        return Prepared(found, claims, lambda: (key, served)), served

    alike, served = prepared(ValidityPolicy())
    assert len(served[0]) == 4
    _, runs, _, _ = _analyse_tree(tree, hooks, None, None, force=False, trust_cache=False,
                                  prepared=alike)
    assert all(r is v[0] for r, (_, v) in zip(runs, served[0], strict=True))
    # analysed under another policy (every run too short): not this analysis's runs
    other, served = prepared(ValidityPolicy(min_window_s=86_400))
    assert other.answer()[0] != alike.answer()[0]  # type: ignore[index]
    assert {v[0].validity.status for _, v in served[0]} == {"invalid"}
    _, runs, _, _ = _analyse_tree(tree, hooks, None, None, force=False, trust_cache=False,
                                  prepared=other)
    assert {r.validity.status for r in runs} == {"valid"}
    assert not any(r is v[0] for r, (_, v) in zip(runs, served[0], strict=True))
    # the discovery alone is used as it is
    _, runs, _, _ = _analyse_tree(tmp_path / "nowhere", hooks, None, None, force=False,
                                  trust_cache=False, prepared=Prepared(found))
    assert len(runs) == 4


def test_an_analysis_error_is_raised_where_one_process_raises_it(tmp_path: Path) -> None:
    """The command serves from the last down: the first error it meets is not the first dir
    that fails; one process serving in index order raises that one, and so does this."""
    found = _warm(_tree(tmp_path, 8))
    parser = load_project("fine_tuning").parser
    helper, _ = _helped(found, parser, 2)

    def then(index: int, result: Any) -> int:
        if index in (4, 6):
            raise ValueError(f"bad run {index}")
        return index

    with pytest.raises(ValueError, match="bad run 4"):
        parse_dirs(found, parser, helper=helper, then=then)
    with pytest.raises(ValueError, match="bad run 4"):
        parse_dirs(found, parser, then=then)


def test_the_child_hands_the_discovery_over_before_it_loads_the_project(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The command serves from the last down as soon as it has its imports: it never waits
    for the child's project and settings; the key comes back with the child's runs."""
    import argparse

    import analysis.cli as cli
    import analysis.project as project_module
    from core.forked import Handoff

    tree = _tree(tmp_path, 5)
    _warm(tree)
    args = argparse.Namespace(results_dir=str(tree), project="fine_tuning", force=False,
                              strict=False, fail_on_regression=False)
    claims, handoff = Claims(), Handoff()
    loads = project_module.load_project
    given_first: list[bool] = []

    def load_project(name: str) -> Any:
        given_first.append(handoff._given is not None)  # noqa: SLF001 - the order checked
        return loads(name)

    monkeypatch.setattr(project_module, "load_project", load_project)
    # this process plays the child: its parent is another pid
    key, (served, missed) = cli._prepare(args, claims, handoff, parent=-1, listed=None)
    assert given_first == [True]
    found, helping = handoff.take()
    assert helping and [r.rel_path for r in found.results] == \
        [r.rel_path for r in discover(tree, project="fine_tuning").results]
    assert [i for i, _ in served] == list(range(5)) and missed == []
    hooks = load_project("fine_tuning")
    settings = cli._settings(hooks, args)
    assert key == Analyser(hooks, found, None, None, settings.validity, settings.mode).key
    handoff.close()


def test_runs_analysed_otherwise_are_served_again_though_the_child_claimed_them(
        tmp_path: Path) -> None:
    """A key that differs is known only once the child has served: what it claimed is
    served here afterwards, each dir once."""
    tree = _tree(tmp_path, 8)
    found = _warm(tree)
    hooks = load_project("fine_tuning")
    discovery = discover(tree, project="fine_tuning")
    claims = Claims()
    other = Analyser(hooks, discovery, None, None, ValidityPolicy(min_window_s=86_400))
    count = iter(range(3))
    served = serve_claimed(found, hooks.parser, other,
                           lambda: claims.front(len(found)) if next(count, None) is not None
                           else None)
    assert len(served[0]) == 3
    _, runs, _, _ = _analyse_tree(tree, hooks, None, None, force=False, trust_cache=False,
                                  prepared=Prepared(discovery, claims,
                                                    lambda: (other.key, served)))
    assert [r.validity.status for r in runs] == ["valid"] * 8
    assert [r.result.rel_path for r in runs] == [r.rel_path for r in found]


def test_the_child_leaves_the_command_a_dir_for_every_eight_it_served(tmp_path: Path) -> None:
    """It stops that early: its answer is pickled while the command serves those."""
    tree = _tree(tmp_path, 40)
    _warm(tree)
    hooks = load_project("fine_tuning")
    found = discover(tree, project="fine_tuning")
    claims = Claims()
    _, (served, missed) = serve_early(Analyser(hooks, found, None, None, ValidityPolicy()),
                                      claims)
    assert [i for i, _ in served] == list(range(36)) and missed == []
    assert [claims.back(40) for _ in range(5)] == [39, 38, 37, 36, None]
