"""The one writer and the one bounded reader (core.safeio), and that nothing bypasses them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.safeio import (
    OutputError,
    UnreadableInputError,
    UnsafeOutputError,
    atomic_open,
    copy_file,
    open_append,
    read_bounded,
    write_bytes,
    write_text,
    write_text_parts,
)
from tests.code_tree import python_files

REPO = Path(__file__).resolve().parents[2]

# Writes that may not go through core.safeio, each with its reason. Keep this short.
EXEMPT: dict[str, str] = {
    "core/safeio.py": "the writer itself",
    # standalone scripts that run in other images (the load generator's, the user pods'),
    # with the standard library only; they write into a fresh dir of their own
    "projects/llm_serving/workload/load.py": "runs in the load generator's image",
    "tasks/kube/user_pod_script.py": "runs inside each user pod",
    "tasks/platforms/fanout.py": "the fan-out launcher runs as its own process per user",
    # a Prometheus TSDB copied for a re-query (a directory tree, Prometheus' own files)
    "tasks/observe/snapshot.py": "copies Prometheus' data dir for the re-query",
}

_WRITE_METHODS = {"write_text", "write_bytes", "to_parquet", "to_csv", "to_json", "write_table",
                  "write_to_dataset", "copyfile", "copy2", "copytree", "copyfileobj", "fdopen",
                  "symlink_to", "hardlink_to", "dump"}
_RENAMES = {("os", "replace"), ("os", "rename"), ("shutil", "copy"), ("shutil", "move")}


def _mode(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "mode" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    if len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
        return str(call.args[1].value)
    return None


def _exempt(lines: list[str], lineno: int) -> bool:
    """A call marked ``# safeio-exempt: <reason>`` on its line or the line above."""
    return any("# safeio-exempt:" in lines[i] for i in (lineno - 1, lineno - 2) if i >= 0)


_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")


def _writes(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines()
    # streams opened by the safe writers: writing into them is what they are for
    safe = {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, ast.With)
            for item in node.items if isinstance(item.optional_vars, ast.Name)
            and isinstance(item.context_expr, ast.Call)
            and getattr(item.context_expr.func, "id", getattr(item.context_expr.func, "attr", ""))
            in ("atomic_open", "open_append")}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _exempt(lines, node.lineno):
            continue
        if any(isinstance(arg, ast.Name) and arg.id in safe for arg in node.args):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            mode = _mode(node) or "r"
            if any(c in mode for c in "wax+"):
                found.append(f"{path}:{node.lineno}: open(..., {mode!r})")
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner is None and isinstance(func.value, ast.Attribute):
                owner = func.value.attr
            if (owner, func.attr) == ("os", "open"):
                flags = ast.get_source_segment(text, node.args[1]) if len(node.args) > 1 else ""
                if any(f in (flags or "") for f in _WRITE_FLAGS) and "O_NOFOLLOW" not in flags:
                    found.append(f"{path}:{node.lineno}: os.open(..., writable, following links)")
                continue
            if func.attr == "to_json" and owner == "__pydantic_serializer__":
                continue
            if func.attr in _WRITE_METHODS and not (func.attr == "dump" and owner == "yaml"
                                                    and len(node.args) < 2):
                if func.attr == "dump" and owner not in ("json", "yaml", "pickle"):
                    continue
                found.append(f"{path}:{node.lineno}: .{func.attr}(...)")
            elif (owner, func.attr) in _RENAMES:
                found.append(f"{path}:{node.lineno}: {owner}.{func.attr}(...)")
            elif func.attr == "open" and owner not in ("os", "tarfile", "zipfile", "gzip",
                                                       "bz2", "lzma") and node.args[:0] == []:
                mode = _mode(node) if not node.args else (
                    str(node.args[0].value) if isinstance(node.args[0], ast.Constant) else None)
                if mode and any(c in mode for c in "wax+"):
                    found.append(f"{path}:{node.lineno}: .open({mode!r})")
    return found


def test_no_code_writes_a_file_but_through_safeio() -> None:
    offenders = []
    for rel, path in python_files():
        if rel not in EXEMPT:
            offenders += _writes(path)
    assert offenders == [], "write through core.safeio:\n" + "\n".join(offenders)


def test_the_scan_sees_each_kind_of_write(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os, json, shutil\nopen(p, 'w')\nopen(p, mode='ab')\n"
                      "p.write_text('x')\nframe.to_parquet(p)\nos.replace(a, b)\n"
                      "json.dump(d, f)\nshutil.copy(a, b)\np.open('w')\nopen(p)\n"
                      "os.open(p, os.O_WRONLY | os.O_CREAT)\n"
                      "os.open(p, os.O_RDONLY)\n"
                      "# safeio-exempt: a reason\nos.replace(a, b)\n")
    assert len(_writes(sample)) == 9


names = st.text(alphabet="abcdefghij._-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", ".."))


@given(name=names, data=st.binary(max_size=2048), link_kind=st.sampled_from(
    ["file", "dir", "dangling", "self"]))
def test_a_symlinked_target_is_never_followed(tmp_path_factory: pytest.TempPathFactory,
                                              name: str, data: bytes, link_kind: str) -> None:
    root = tmp_path_factory.mktemp("out")
    outside = tmp_path_factory.mktemp("outside")
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    target = root / name
    pointee = {"file": victim, "dir": outside, "dangling": outside / "nothing",
               "self": target}[link_kind]
    target.symlink_to(pointee)
    for write in (lambda: write_bytes(target, data), lambda: write_text(target, "x"),
                  lambda: open_append(target).close()):
        with pytest.raises(UnsafeOutputError) as error:
            write()
        assert str(target) in str(error.value)
    assert victim.read_bytes() == b"precious"
    assert not (outside / "nothing").exists()
    assert target.is_symlink()
    assert sorted(p.name for p in root.iterdir()) == [name]  # no temporary file left


@given(data=st.binary(max_size=4096))
def test_atomic_write_round_trips_and_replaces(tmp_path_factory: pytest.TempPathFactory,
                                               data: bytes) -> None:
    root = tmp_path_factory.mktemp("out")
    target = root / "f.bin"
    write_bytes(target, b"old")
    write_bytes(target, data)
    assert target.read_bytes() == data
    assert [p.name for p in root.iterdir()] == ["f.bin"]


@given(parts=st.lists(st.text(max_size=200), max_size=8))
def test_a_text_written_in_parts_is_the_text_written_whole(
        tmp_path_factory: pytest.TempPathFactory, parts: list[str]) -> None:
    root = tmp_path_factory.mktemp("out")
    write_text_parts(root / "parts.html", iter(parts))  # an iterator: read once
    write_text(root / "whole.html", "".join(parts))
    assert (root / "parts.html").read_bytes() == (root / "whole.html").read_bytes()
    assert sorted(p.name for p in root.iterdir()) == ["parts.html", "whole.html"]


def test_a_page_written_in_parts_masks_secrets_in_each_and_fails_whole(
        tmp_path: Path) -> None:
    from core.redact import known_secrets, register_secret, restore_secrets

    before = known_secrets()
    register_secret("Parts-secret-9876")
    try:
        target = write_text_parts(tmp_path / "page.html",
                                  ["<p>a</p>", "<p>Parts-secret-9876</p>", "<p>b</p>"])
    finally:
        restore_secrets(before)
    assert target.read_text() == "<p>a</p><p>***</p><p>b</p>"

    def cut() -> Iterator[str]:
        yield "<p>new</p>"
        raise RuntimeError("a figure failed")

    with pytest.raises(RuntimeError):
        write_text_parts(target, cut())
    assert target.read_text() == "<p>a</p><p>***</p><p>b</p>"  # the old page, whole
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "kpis.parquet"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_open(target) as stream:
        stream.write(b"half")
        raise RuntimeError("cut")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["kpis.parquet"]


def test_a_full_disk_leaves_nothing_under_the_final_name_and_names_the_file(
        tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes write() fail mid-file (EFBIG) the way a full disk does (ENOSPC)
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "from core.safeio import write_bytes, OutputError\n"
        "try:\n"
        f"    write_bytes({str(tmp_path / 'runs.parquet')!r}, b'x' * 100000)\n"
        "except OutputError as exc:\n"
        "    print(exc); sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert str(tmp_path / "runs.parquet") in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_output_error_is_an_oserror_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "dir" / "f"
    with pytest.raises(OutputError) as error:
        write_text(missing, "x")
    assert isinstance(error.value, OSError)
    assert str(missing) in str(error.value)


def test_copy_file_refuses_a_link_source(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnreadableInputError):
        copy_file(tmp_path / "link", tmp_path / "copy")
    copy_file(tmp_path / "real", tmp_path / "copy")
    assert (tmp_path / "copy").read_text() == "x"


def test_bounded_read_refuses_fifos_devices_links_and_large_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    link = tmp_path / "link"
    link.symlink_to(big)
    for path, reason in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"),
                         (big, "over the 100"), (link, "symbolic link"),
                         (tmp_path / "none", "not found"), (tmp_path, "not a regular file")):
        with pytest.raises(UnreadableInputError) as error:
            read_bounded(path, 100, what="PR comment")
        assert reason in str(error.value) and "PR comment" in str(error.value)
    assert read_bounded(link, 200, follow_links=True) == b"x" * 101


@given(size=st.integers(min_value=0, max_value=3000), cap=st.integers(min_value=0,
                                                                       max_value=3000))
def test_bounded_read_takes_exactly_what_fits(tmp_path_factory: pytest.TempPathFactory,
                                              size: int, cap: int) -> None:
    path = tmp_path_factory.mktemp("in") / "f"
    path.write_bytes(b"y" * size)
    if size <= cap:
        assert read_bounded(path, cap) == b"y" * size
    else:
        with pytest.raises(UnreadableInputError):
            read_bounded(path, cap)


@given(depth=st.integers(min_value=0, max_value=3), where=st.integers(min_value=0, max_value=3))
def test_a_link_anywhere_below_an_output_root_is_refused(
        tmp_path_factory: pytest.TempPathFactory, depth: int, where: int) -> None:
    from core.safeio import output_root

    root = tmp_path_factory.mktemp("out")
    outside = tmp_path_factory.mktemp("outside")
    parts = [f"d{i}" for i in range(depth + 1)]
    where = min(where, depth)
    current = root
    for index, part in enumerate(parts):
        current = current / part
        if index == where:
            current.symlink_to(outside, target_is_directory=True)
            break
        current.mkdir()
    target = root.joinpath(*parts, "index.html")
    with output_root(root), pytest.raises(UnsafeOutputError, match="on its way"):
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, "page")
    assert not any(outside.rglob("index.html"))
    write_text(target, "outside any root: the caller's own choice")  # no root: allowed


def test_the_root_itself_may_be_a_link(tmp_path: Path) -> None:
    from core.safeio import output_root

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "named").symlink_to(real, target_is_directory=True)
    with output_root(tmp_path / "named"):
        (tmp_path / "named" / "sub").mkdir()
        write_text(tmp_path / "named" / "sub" / "f.txt", "ok")
    assert (real / "sub" / "f.txt").read_text() == "ok"


def test_a_shared_file_is_linked_and_a_link_that_cannot_be_made_is_a_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plotly.js once per runs root: hard-linked into each report; where the filesystem
    refuses links (another device), each report gets a copy; a symlinked target is refused."""
    import errno
    import os

    from analysis.report_html import _plotlyjs, _write_plotlyjs
    from core.safeio import UnsafeOutputError, link_file

    shared = tmp_path / "runs" / ".telltale"
    reports = [tmp_path / "runs" / f"r{i}" / "report" for i in range(3)]
    for report in reports:
        report.mkdir(parents=True)
        _write_plotlyjs(report / "plotly.min.js", shared)
    inodes = {(r / "plotly.min.js").stat().st_ino for r in reports}
    assert len(inodes) == 1
    assert (reports[0] / "plotly.min.js").read_bytes() == _plotlyjs().read_bytes()

    def no_link(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    other = tmp_path / "elsewhere" / "report"
    other.mkdir(parents=True)
    _write_plotlyjs(other / "plotly.min.js", shared)
    assert (other / "plotly.min.js").stat().st_ino not in inodes
    assert (other / "plotly.min.js").read_bytes() == _plotlyjs().read_bytes()
    monkeypatch.undo()
    (tmp_path / "evil").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafeOutputError):
        link_file(reports[0] / "plotly.min.js", tmp_path / "evil")


def test_plotly_js_is_copied_byte_for_byte_whatever_secrets_are_registered(
        tmp_path: Path) -> None:
    """A third-party asset is not our data: a registered secret that happens to occur in
    plotly.js is not masked there (it broke the plots once), and a shared copy that an
    earlier version masked is replaced rather than linked on."""
    import re

    from analysis.report_html import _plotlyjs, _write_plotlyjs
    from core.redact import register_secret

    original = _plotlyjs().read_bytes()
    # a quoted token of plotly.js, long enough to count as a secret
    token = next(m.group(1).decode() for m in re.finditer(rb'"([0-9A-Za-z]{12,40})"', original))
    register_secret(token)
    shared = tmp_path / "runs" / ".telltale"
    report = tmp_path / "runs" / "r" / "report"
    report.mkdir(parents=True)
    _write_plotlyjs(report / "plotly.min.js", shared)
    assert (report / "plotly.min.js").read_bytes() == original
    alone = tmp_path / "alone"
    alone.mkdir()
    _write_plotlyjs(alone / "plotly.min.js")
    assert (alone / "plotly.min.js").read_bytes() == original
    (masked,) = shared.glob("plotly-*.min.js")
    masked.unlink()
    masked.write_bytes(original.replace(token.encode(), b"********"))
    again = tmp_path / "runs" / "s" / "report"
    again.mkdir(parents=True)
    _write_plotlyjs(again / "plotly.min.js", shared)
    assert (again / "plotly.min.js").read_bytes() == original
    assert not (tmp_path / "target").exists()
