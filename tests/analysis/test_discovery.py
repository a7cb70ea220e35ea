from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import memo
from analysis.discovery import discover
from core.errors import ResultsError


def _dir(root: Path, rel: str, settings: str | None = "a: 1\n", code: str | None = "0") -> Path:
    path = root / rel
    path.mkdir(parents=True, exist_ok=True)
    if settings is not None:
        (path / "settings.yaml").write_text(settings)
    if code is not None:
        (path / "exit_code").write_text(code)
    return path


def test_rules(tmp_path: Path) -> None:
    _dir(tmp_path, ".", settings="shared: root\nlevel: 0\n", code=None)
    _dir(tmp_path, "a", settings="level: 1\nnested: {x: 1, y: 1}\n")
    _dir(tmp_path, "a/b", settings="level: 2\nnested: {y: 2}\n", code="3")
    hidden = _dir(tmp_path, "c")
    (hidden / "skip").write_text("")
    _dir(tmp_path, "c/d")
    _dir(tmp_path, "e", code="oops")
    _dir(tmp_path, "f", code=None)
    _dir(tmp_path, "g", settings="[unclosed\n")
    found = discover(tmp_path)
    rels = {r.rel_path: r for r in found.results}
    assert sorted(rels) == ["a", "a/b", "c/d"]
    assert rels["a/b"].settings == {"shared": "root", "level": 2, "nested": {"x": 1, "y": 2}}
    assert rels["a/b"].exit_code == 3  # failed runs are kept
    reasons = {Path(s.path).name: s.reason for s in found.skipped}
    assert "not an integer" in reasons["e"]
    assert reasons["f"] == "no exit_code file"
    assert "malformed YAML" in reasons["g"]
    assert "." not in rels  # root has settings but no exit_code: skipped, recorded
    assert "no exit_code" in reasons[tmp_path.name]


def test_missing_root() -> None:
    with pytest.raises(ResultsError, match="results dir not found"):
        discover("/nonexistent/telltale")


def test_settings_index_follows_changes_and_survives_damage(tmp_path: Path) -> None:
    import json
    import os

    from analysis.discovery import INDEX_FILE

    run = _dir(tmp_path, "a", settings="level: 1\nwhen: 2024-01-01\n")
    first = discover(tmp_path).results[0].settings
    # a YAML date does not survive JSON: that file is not indexed, it is read each time
    assert not (tmp_path / INDEX_FILE).exists() and first["when"].isoformat() == "2024-01-01"

    (run / "settings.yaml").write_text("level: 1\n")
    assert discover(tmp_path).results[0].settings == {"level": 1}
    assert json.loads((tmp_path / INDEX_FILE).read_text())["settings"]["a"][3] == {"level": 1}

    # same size, new content, a different mtime: the entry is stale and not used
    (run / "settings.yaml").write_text("level: 2\n")
    st = (run / "settings.yaml").stat()
    os.utime(run / "settings.yaml", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert discover(tmp_path).results[0].settings == {"level": 2}

    (tmp_path / INDEX_FILE).write_text("{not json")  # damaged: ignored, then rewritten
    assert discover(tmp_path).results[0].settings == {"level": 2}
    assert json.loads((tmp_path / INDEX_FILE).read_text())["version"] == 1


def test_unwritable_index_is_no_error(tmp_path: Path) -> None:
    from analysis.discovery import INDEX_FILE

    _dir(tmp_path, "a")
    (tmp_path / INDEX_FILE).mkdir()  # neither readable as an index nor replaceable
    assert discover(tmp_path).results[0].settings == {"a": 1}
    assert discover(tmp_path).results[0].settings == {"a": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(INDEX_FILE)] == [INDEX_FILE]


def test_only_the_named_projects_runs_are_taken_from_a_mixed_tree(tmp_path: Path) -> None:
    """A default runs folder holds every project's runs: the others are skipped, named."""
    import json
    import subprocess
    import sys

    from tests.factories import make_result_dir

    for i in range(3):
        make_result_dir(tmp_path / f"ft-{i}", seed=i)
    for i in range(2):  # another project's cells: named by their step dirs
        cell = tmp_path / f"serving-{i}" / "000__cell"
        (cell / "001__llm_serving__run_load").mkdir(parents=True)
        (cell / "settings.yaml").write_text("concurrency: 1\n")
        (cell / "exit_code").write_text("0\n")
    scaffolded = tmp_path / "demo" / "000__cell"  # a project no step dir names: cell.json
    scaffolded.mkdir(parents=True)
    (scaffolded / "settings.yaml").write_text("x: 1\n")
    (scaffolded / "exit_code").write_text("0\n")
    (scaffolded / "cell.json").write_text(json.dumps({"name": "base", "project": "demo"}))
    found = discover(tmp_path, project="fine_tuning")
    assert len(found.results) == 3
    reasons = sorted(s.reason for s in found.skipped)
    assert reasons == ["a run of project demo, not fine_tuning"] + [
        "a run of project llm_serving, not fine_tuning"] * 2
    assert len(discover(tmp_path).results) == 6  # no project: every result dir
    done = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path), "--project",
                           "fine_tuning", "--out", str(tmp_path / ".out"), "--no-report"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "3 run(s) parsed" in done.stdout
    assert "skipped 2 dir(s): a run of project llm_serving, not fine_tuning" in done.stdout


@pytest.mark.parametrize(("written", "name"), [
    ({"name": "base", "project": "fine_tuning"}, "base"),
    ({"name": "lora-r16 · 2 gpus", "project": "fine_tuning"}, "lora-r16 · 2 gpus"),
    ({"name": "a\x1b[2Jb"}, None),  # a control character: never a name to print
    ({"name": "x" * 129}, None),
    ({"name": 7}, None),
    (["base"], None),
    ("{not json", None),
])
def test_a_cell_is_named_as_its_flow_named_it(tmp_path: Path, written: object,
                                               name: str | None) -> None:
    """``ResultDir.name`` is what every output calls the run: the terminal's ``cell base``,
    not ``001__cell``; a dir without a usable ``cell.json`` is its relative path."""
    import json

    cell = _dir(tmp_path, "run/001__cell")
    (cell / "cell.json").write_text(written if isinstance(written, str)
                                    else json.dumps(written))
    (result,) = discover(tmp_path).results
    assert result.cell == name
    assert result.name == (name or "run/001__cell")


_NAMES = st.sampled_from(["a", "b", "c", ".hidden", "cell", "001__fine_tuning__x", "zz",
                          "link"])  # never a file's name: settings.yaml, exit_code, skip


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.tuples(st.lists(_NAMES, min_size=1, max_size=3),
                                st.sampled_from(["result", "matrix", "skip", "failed",
                                                 "plain", "link"])),
                      min_size=1, max_size=12))
def test_the_memo_walks_listings_discover_what_a_walk_of_its_own_does(
        tmp_path_factory: pytest.TempPathFactory,
        shape: list[tuple[list[str], str]]) -> None:
    """The command line's discovery reads the tree's dirs as the memo's stamps walk listed
    them (`analysis.memo.Listings`): the same result dirs, settings, skips and order as
    a discovery that lists every dir itself — hidden dirs, skip files, links and the
    ``--out`` dir the stamps leave out included."""
    root = tmp_path_factory.mktemp("tree")
    out = root / "zz"  # an --out inside the tree: not stamped, still discovered
    for names, kind in shape:
        path = root.joinpath(*names)
        if kind == "link":
            if not path.exists() and path.parent.is_dir():
                path.symlink_to(root)
            continue
        path.mkdir(parents=True, exist_ok=True)
        if kind in ("result", "matrix", "skip", "failed"):
            (path / "settings.yaml").write_text(f"depth: {len(names)}\n")
        if kind in ("result", "skip", "failed"):
            (path / "exit_code").write_text("1" if kind == "failed" else "0")
        if kind == "skip":
            (path / "skip").write_text("")
    listings: memo.Listings = {}
    for _ in memo.take_stamps([("tree", root.resolve(), True)], exclude=[out.resolve()],
                              listings=listings):
        pass
    mine = discover(root, project="fine_tuning", listed=listings)
    theirs = discover(root, project="fine_tuning")
    assert mine.model_dump() == theirs.model_dump()
