"""The post-processing memo (`analysis.memo`): an unchanged tree answers from its outputs.

The class of fault it could have is a stale answer: an input changed and the memo still
answered. The property test builds generated trees and changes them every way an entry can
change; the CLI tests change each kind of input the command has (the tree, a flag, the
environment, the outputs, a history); the audit runs a post-processing with Python's audit
hooks on and fails when it opens or lists a path the memo does not witness.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import memo
from analysis.cli import main
from tests.factories import make_result_dir

REPO = Path(__file__).resolve().parents[2]


def _newest_change(root: Path) -> int:
    return max(max(s[2], s[3]) for _, _, s in memo.take_stamps([("t", root, True)]) if s)


def tick_past(root: Path) -> None:
    """Wait (on the clock, not a sleep) until a new change would get a newer time stamp.

    File systems stamp with a coarse clock (a few ms): two writes within one tick look
    alike. In use, `memo.SETTLED_NS` leaves a second; a test waits for the tick itself.
    """
    newest, probe = _newest_change(root), root.parent / f".tick-{root.name}"
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > newest:
            probe.unlink()
            return


# -- the stamps, on generated trees --------------------------------------------------------

# names as a results tree may hold them: spaces, tabs, line breaks, quotes, accents, bytes
# that are not UTF-8 (a surrogate escape), each a path the memo's lines must carry
names = st.text(st.sampled_from([*"abcxyz._- \t\n\"\\é", "\udcff"]), min_size=1,
                max_size=6).filter(lambda n: n not in {".", ".."})
contents = st.binary(max_size=40)
trees = st.recursive(contents, lambda sub: st.dictionaries(names, sub, min_size=1,
                                                           max_size=4), max_leaves=12)


def _build(root: Path, tree: object) -> None:
    if isinstance(tree, bytes):
        root.write_bytes(tree)
        return
    root.mkdir()
    assert isinstance(tree, dict)
    for name, sub in tree.items():
        _build(root / name, sub)


def _entries(root: Path) -> tuple[list[Path], list[Path]]:
    files, dirs = [], []
    for base, subdirs, found in os.walk(root):
        dirs += [Path(base, d) for d in subdirs]
        files += [Path(base, f) for f in found]
    return sorted(files), [root, *sorted(dirs)]


def _same_size_edit(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(bytes(b ^ 1 for b in data) if data else b"")  # same size (even 0)


MUTATIONS: dict[str, Callable[[Path, Path], None]] = {
    "a file rewritten, same size": lambda f, d: _same_size_edit(f),
    "a file appended to": lambda f, d: f.write_bytes(f.read_bytes() + b"x"),
    "a file removed": lambda f, d: f.unlink(),
    "a file added": lambda f, d: (d / "new-file").write_bytes(b""),
    "a dir added": lambda f, d: (d / "new-dir").mkdir(),
    "a file renamed": lambda f, d: f.rename(f.with_name(f.name + ".renamed")),
    "a file made a link": lambda f, d: (f.unlink(), f.symlink_to("/etc/hostname")),
    "a file's mode": lambda f, d: f.chmod(0o600 if f.stat().st_mode & 0o44 else 0o644),
    "a file's time set back": lambda f, d: os.utime(f, ns=(f.stat().st_atime_ns,
                                                           f.stat().st_mtime_ns)),
    "a file replaced by another": lambda f, d: (f.with_name("tmp").write_bytes(
        f.read_bytes()), os.replace(f.with_name("tmp"), f)),
}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees.filter(lambda t: isinstance(t, dict)), kind=st.sampled_from(sorted(MUTATIONS)),
       pick=st.integers(min_value=0, max_value=1000))
def test_every_change_to_a_generated_tree_is_seen(tmp_path_factory: pytest.TempPathFactory,
                                                  tree: object, kind: str, pick: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "SETTLED_NS", 0)  # tick_past waits for the clock instead
    root = tmp_path_factory.mktemp("tree") / "t"
    _build(root, tree)
    files, dirs = _entries(root)
    if not files:
        return
    tick_past(root)
    before = memo.Before([("tree", root, True)])
    assert before.held(), "an untouched tree holds"
    MUTATIONS[kind](files[pick % len(files)], dirs[pick % len(dirs)])
    assert not before.held(), f"{kind} was not seen"


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_the_trees_rechecked_beside_and_the_code_at_the_end_see_every_change(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`recheck_trees` (the command line starts it once the tree is read) and `held` (the
    rest at the end) together see what `held` alone sees: a change to the tree before
    the recheck, a change to the code after it."""
    monkeypatch.setattr(memo, "SETTLED_NS", 0)
    tree, code = tmp_path / "tree", tmp_path / "code"
    _build(tree, {"a": b"1", "d": {"b": b"2", "c": b"3"}})
    _build(code, {"m.py": b"x = 1", "pkg": {"n.py": b"y = 2"}})
    roots: list[memo.Root] = [("tree", tree, True), ("code:pkg", code, True)]
    for changed in ("none", "tree", "code"):
        tick_past(tree)
        tick_past(code)
        before = memo.Before(roots)
        if changed == "tree":  # before the tree is rechecked
            MUTATIONS[kind](*[_entries(tree)[0][1], _entries(tree)[1][1]])
        before.recheck_trees()
        if changed == "code":  # after: the rest is checked at the end
            MUTATIONS[kind](*[_entries(code)[0][1], _entries(code)[1][1]])
        assert before.held() == (changed == "none"), f"{kind} of the {changed} not seen"
        before.close()


def test_the_work_after_the_stamps_is_handed_over_once_and_not_held(tmp_path: Path) -> None:
    """``then`` (the command line's discovery) runs once the stamps are taken; its answer
    is given once and not kept (~20 MB at 10 000 dirs); its error is raised by `wait`."""
    _build(tmp_path / "t", {"a": b"1"})
    answer = {"found": ["a"]}
    before = memo.Before([("tree", tmp_path / "t", True)], then=lambda listed: answer)
    assert before.take() == answer and before.take() is None
    before.close()
    failing = memo.Before([("tree", tmp_path / "t", True)], then=lambda listed: 1 // 0)
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    failing.close()


def test_a_change_within_the_settling_time_is_never_trusted(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _build(root, {"a": b"1"})
    assert not memo.Before([("tree", root, True)]).settled  # made just now


def test_an_absent_root_is_witnessed_as_absent(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "SETTLED_NS", 0)
    before = memo.Before([("history", tmp_path / "none", True)])
    assert before.held()
    (tmp_path / "none").mkdir()
    assert not before.held()


# -- the command ----------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(memo, "SETTLED_NS", 0)
    results = tmp_path / "results"
    for i in range(3):
        make_result_dir(results, f"{i:03d}__cell", tokens_per_second=1000.0 + i, seed=i)
    return results


class Cli:
    """``python -m analysis`` in this process; says whether the memo answered."""

    def __init__(self, tree: Path, out: Path, caplog: pytest.LogCaptureFixture,
                 capsys: pytest.CaptureFixture[str]) -> None:
        self.tree, self.out, self.caplog, self.capsys = tree, out, caplog, capsys
        caplog.set_level(logging.INFO, logger="telltale.analysis")

    def __call__(self, *extra: str) -> tuple[int, str, bool]:
        """Run it (after the clock ticked past the tree); (exit code, stdout, answered)."""
        tick_past(self.tree)
        self.caplog.clear()
        code = main([str(self.tree), "--project", "fine_tuning", "--out", str(self.out),
                     "--quiet", *extra])
        answered = any("nothing changed" in r.getMessage() for r in self.caplog.records)
        return code, self.capsys.readouterr().out, answered

    def settle(self, *extra: str) -> str:
        """Run until the memo answers (the first run writes the parse caches into the tree,
        so it leaves none; the second leaves one); the answer's stdout."""
        first = self(*extra)
        second = self(*extra)
        code, out, answered = self(*extra)
        assert answered and (memo_file := self.out / memo.MEMO_FILE).is_file(), memo_file
        assert (code, out) == second[:2] == first[:2]
        return out


@pytest.fixture
def cli(tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(tree, tmp_path / "out", caplog, capsys)


def test_an_unchanged_tree_answers_from_its_outputs_without_writing(cli: Cli) -> None:
    cli.settle()
    stamps = {p: p.stat().st_mtime_ns for p in cli.out.rglob("*")}
    code, out, answered = cli()
    assert answered and code == 0 and "3 run(s) parsed" in out
    assert {p: p.stat().st_mtime_ns for p in cli.out.rglob("*")} == stamps


@pytest.mark.parametrize("change", [
    "a result's log", "a new result dir", "a result dir removed", "the run's config.yaml",
    "an output removed", "an output edited", "a flag", "the environment", "--force",
    "TELLTALE_FORCE_REPARSE"])
def test_a_change_of_any_input_analyses_again(cli: Cli, change: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cli.settle()
    extra: list[str] = []
    log = next(cli.tree.glob("001__cell/*/artifacts/pod.log"))
    if change == "a result's log":
        log.write_text(log.read_text().replace("train_tokens_per_second", "train_tokens_per_secxnd"))
    elif change == "a new result dir":
        make_result_dir(cli.tree, "003__cell", seed=3)
    elif change == "a result dir removed":
        for path in sorted((cli.tree / "002__cell").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (cli.tree / "002__cell").rmdir()
    elif change == "the run's config.yaml":
        (cli.tree / "config.yaml").write_text("analysis: {}\n")
    elif change == "an output removed":
        (cli.out / "report" / "index.html").unlink()
    elif change == "an output edited":
        (cli.out / "kpis.prom").write_text("# EOF\n")
    elif change == "a flag":
        extra = ["--no-report"]
    elif change == "the environment":
        monkeypatch.setenv("TZ", "Asia/Tokyo")
    elif change == "--force":
        extra = ["--force"]
    else:
        monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "1")
    _, out, answered = cli(*extra)
    assert not answered, change
    if change == "an output removed":
        assert (cli.out / "report" / "index.html").is_file()
    if change == "a new result dir":
        assert "4 run(s) parsed" in out


def test_a_tree_named_by_a_link_is_witnessed_where_it_points(
        tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "latest"
    link.symlink_to(tree)
    cli = Cli(link, tmp_path / "out", caplog, capsys)
    cli.settle()
    make_result_dir(tree, "003__cell", seed=3)  # added where the link points
    assert not cli()[2]
    cli.settle()
    other = tmp_path / "other"
    make_result_dir(other, "000__cell", seed=5)
    link.unlink()
    link.symlink_to(other)  # the link retargeted
    assert "1 run(s) parsed" in cli()[1]


def test_the_shells_own_variables_and_a_second_terminal_still_answer(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    cli.settle()
    monkeypatch.setenv("_", "/usr/bin/other")
    monkeypatch.setenv("OLDPWD", "/elsewhere")
    assert cli()[2]


def test_a_read_only_history_is_witnessed_an_appended_one_never_memoised(
        cli: Cli, tmp_path: Path) -> None:
    history = tmp_path / "history"
    cli("--history", str(history))  # appends: no memo, ever
    assert not (cli.out / memo.MEMO_FILE).exists()
    cli("--history", str(history))
    assert not cli("--history", str(history))[2]
    cli.settle("--history", str(history), "--no-append")
    other = tmp_path / "other"
    make_result_dir(other, "000__cell", run_uuid="someone-else", seed=9)
    main([str(other), "--project", "fine_tuning", "--out", str(tmp_path / "o2"), "--quiet",
          "--history", str(history)])  # another writer appends to the history
    assert not cli("--history", str(history), "--no-append")[2]


def test_a_failed_run_leaves_no_memo_of_older_outputs(cli: Cli) -> None:
    cli.settle()
    for path in sorted(cli.tree.rglob("exit_code")):
        path.write_text("not a number\n")  # every result dir skipped: exit 2
    code, _, answered = cli()
    assert code == 2 and not answered
    assert not (cli.out / memo.MEMO_FILE).exists()


@pytest.mark.parametrize("planted", ["empty", "garbage", "a link", "a dir"])
def test_a_memo_file_that_is_no_memo_is_analysed_again_and_never_fails_the_run(
        cli: Cli, planted: str) -> None:
    cli.settle()
    path = cli.out / memo.MEMO_FILE
    path.unlink()
    if planted == "empty":
        path.write_bytes(b"")
    elif planted == "garbage":
        path.write_bytes(b'{"format": 1, "key": "x"}\n\xff\xfe\t\t\n')
    elif planted == "a link":
        path.symlink_to(cli.tree / "000__cell" / "settings.yaml")
    else:
        path.mkdir()
    code, out, answered = cli()
    assert code == 0 and not answered and "3 run(s) parsed" in out


def test_no_usable_temporary_dir_leaves_no_memo_and_still_runs(
        cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    for _ in range(3):
        code, out, answered = cli()
        assert code == 0 and not answered and "3 run(s) parsed" in out
    assert not (cli.out / memo.MEMO_FILE).exists()


def test_an_answer_imports_neither_pandas_nor_pyarrow(tree: Path, tmp_path: Path) -> None:
    """The memo is what makes a warm answer fast: the data libraries are never loaded."""
    script = f"""
import sys
from analysis import memo
memo.SETTLED_NS = 0
from analysis.cli import main
from tests.analysis.test_memo import tick_past
from pathlib import Path
argv = [{str(tree)!r}, "--project", "fine_tuning", "--out", {str(tmp_path / 'out')!r}, "--quiet"]
for _ in range(2):
    tick_past(Path({str(tree)!r}))
    assert main(argv) == 0
for name in ("pandas", "pyarrow", "numpy", "plotly"):
    sys.modules.pop(name, None)
heavy = [m for m in sys.modules if m.split(".")[0] in ("pandas", "pyarrow", "numpy", "plotly")]
for m in heavy:
    del sys.modules[m]
tick_past(Path({str(tree)!r}))
assert main(argv) == 0
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"pandas", "pyarrow", "numpy",
                                                         "plotly"}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


# -- the audit: everything a post-processing reads is witnessed ------------------------------

AUDIT = """
import json, os, sys
events = []
def hook(event, args):
    if event == "open" and args[0] is not None:
        path, mode, flags = args
        if isinstance(path, int):
            return
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & os.O_ACCMODE != os.O_RDONLY)
        if not writing:
            events.append(("open", os.fsdecode(path)))
    elif event in ("os.listdir", "os.scandir") and args and args[0] is not None:
        if not isinstance(args[0], int):
            events.append((event, os.fsdecode(args[0])))
sys.addaudithook(hook)
if os.environ["AUDIT_ALSO_READ"]:  # the audit's own check: a read it must see
    open(os.environ["AUDIT_ALSO_READ"]).close()
from analysis.cli import main
code = main(sys.argv[1:])
with open(os.environ["AUDIT_OUT"], "w") as stream:
    json.dump([code, events, sys.path], stream)
"""

# What a post-processing may read besides the witnessed roots, and why that is no input
# of its outputs (or is witnessed another way).
NOT_INPUTS = {
    "/proc": "the process's own facts (CPU count, memory), not the tree's",
    "/sys": "the machine's facts (cgroup limits), not the tree's",
    "/dev": "/dev/null, /dev/urandom",
    "/etc/localtime": "the zone names pandas loads; TZ is in the key, outputs are UTC",
    "/usr/share/zoneinfo": "as above",
    "/etc/ssl": "TLS roots (an S3 history is never memoised)",
}


def _unwitnessed(tmp_path: Path, argv: list[str], run: str, *,
                 also_read: Path | None = None) -> list[str]:
    """What one audited post-processing read that the memo does not witness."""
    (tmp_path / "audit.py").write_text(AUDIT)
    # one core: a child beside (`core.forked`) reads with the same code, but its hook's
    # events would stay in the child
    env = {**os.environ, "AUDIT_OUT": str(tmp_path / f"{run}.json"), "PYTHONPATH": str(REPO),
           "AUDIT_ALSO_READ": str(also_read or ""), "TELLTALE_BESIDE": "0"}
    proc = subprocess.run([sys.executable, str(tmp_path / "audit.py"), *argv], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    code, events, path = json.loads((tmp_path / f"{run}.json").read_text())
    assert code == 0
    # the import system and importlib.metadata list (and probe) each sys.path entry:
    # where modules and distributions are found, not inputs (the code is witnessed);
    # an editable install's path hook is such an entry, a name the import system probes
    events = [(kind, p) for kind, p in events if p not in path]
    assert any(_under(p, argv[0]) for _, p in events)  # the hook saw the tree's reads
    witnessed = [str(p) for _, p, _ in memo.code_roots()] + [
        *argv[:1], argv[argv.index("--out") + 1], *argv[argv.index("--history") + 1:][:1],
        sys.prefix, sys.base_prefix, sys.exec_prefix, *NOT_INPUTS]
    return sorted({p for _, p in events
                   if not any(_under(os.path.abspath(p), w) for w in witnessed)})


def test_everything_a_post_processing_reads_is_witnessed(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for i in range(3):
        make_result_dir(results, f"{i:03d}__cell", seed=i)
    argv = [str(results), "--project", "fine_tuning", "--out", str(tmp_path / "out"),
            "--quiet", "--history", str(tmp_path / "history")]
    for run in ("cold", "warm"):
        outside = _unwitnessed(tmp_path, argv, run)
        assert not outside, (f"{run} post-processing read what the memo does not witness "
                             f"(add it to analysis.memo's roots or key): {outside[:10]}")
    # and the audit sees a read that goes around the witnessed roots
    assert _unwitnessed(tmp_path, argv, "bypass", also_read=REPO / "README.md") == [
        str(REPO / "README.md")]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def test_a_tree_stamped_by_two_processes_is_witnessed_as_by_one(tmp_path: Path) -> None:
    """A warm Python's child stamps half of the tree itself (`memo.Before`'s ``share``):
    the same lines as one process writes, every dir listed for the discovery, and every
    kind of change seen in either half. Run in a fresh interpreter
    (`tests.analysis.memo_share_probe`): a test process has threads and never forks."""
    proc = subprocess.run([sys.executable, "-m", "tests.analysis.memo_share_probe",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["can_fork"]:
        pytest.skip("one usable core (or TELLTALE_BESIDE=0): the tree is stamped by one "
                    "process")
    assert out["failed"] == []
