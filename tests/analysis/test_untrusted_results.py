"""Abuse probes on a results tree (it is untrusted input): each bounded to seconds.

Symlinks out of the tree, FIFOs, huge files, a log with no newline, deep nesting and a dir
name that is an HTML payload must each end as a recorded problem or a skipped dir, never as
a leak, a hang, a MemoryError or a RecursionError.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.discovery import discover
from analysis.parsing import MAX_LINE_CHARS, FileReader
from analysis.pipeline import postprocess
from core.errors import UserError
from tests.factories import make_result_dir

SECRET = "root:$6$not-a-real-hash:19000:0:99999:7:::"


def _postprocess(results: Path, out: Path) -> object:
    return postprocess(results, "fine_tuning", out, history_uri=None)


def test_symlinks_out_of_the_tree_are_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    results = tmp_path / "results"
    run = make_result_dir(results, "000__cell")
    (run / "config.yaml").symlink_to(secret)
    (run / ".uuid").unlink()
    (run / ".uuid").symlink_to(secret)
    linked_dir = tmp_path / "elsewhere"
    linked_dir.mkdir()
    (linked_dir / "pod.log").write_text(SECRET)
    outcome = _postprocess(results, tmp_path / "out")
    payload = (tmp_path / "out" / "lts_payload.json").read_text()
    assert SECRET not in payload and "not-a-real-hash" not in payload
    assert outcome.runs == 1  # the run is still parsed, its links reported
    problems = json.loads(payload)[0]["problems"]
    assert any("symlink" in p for p in problems), problems


def test_a_symlinked_settings_file_or_dir_is_skipped(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("password: " + SECRET + "\n")
    results = tmp_path / "results"
    run = results / "000__cell"
    run.mkdir(parents=True)
    (run / "settings.yaml").symlink_to(secret)
    (run / "exit_code").write_text("0\n")
    (results / "001__link").symlink_to(tmp_path, target_is_directory=True)
    found = discover(results)
    assert not found.results
    assert any("symlink" in s.reason for s in found.skipped)


def test_fifo_and_device_files_do_not_hang(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = make_result_dir(results, "000__cell")
    job = next(run.glob("*__run_fine_tuning_job"))
    (job / "artifacts" / "pod.log").unlink()
    os.mkfifo(job / "artifacts" / "pod.log")
    (job / "src" / "config_final.json").unlink()
    (job / "src" / "config_final.json").symlink_to("/dev/zero")
    reader = FileReader(run)
    assert reader.lines(f"{job.name}/artifacts/pod.log") is None
    assert reader.json(f"{job.name}/src/config_final.json") is None
    assert {p.message.split(":")[0] for p in reader.problems} >= {"not a regular file"}


def test_a_fifo_is_never_even_opened(tmp_path: Path) -> None:
    """Opening some special files acts (a FIFO's writer wakes up, some devices start): the
    reader checks before it opens. A writer blocked on the FIFO stays blocked."""
    import threading

    run = make_result_dir(tmp_path / "results", "000__cell")
    os.mkfifo(run / "presets_applied")
    woke = threading.Event()

    def writer() -> None:
        with open(run / "presets_applied", "wb"):  # blocks until a reader opens the FIFO
            woke.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    reader = FileReader(run)
    assert reader.text("presets_applied") is None
    assert reader.problems[0].message == "not a regular file: not read"
    assert not woke.wait(0.5)  # (load can only make this miss a bug, never fail a good run)
    with open(os.open(run / "presets_applied", os.O_RDONLY | os.O_NONBLOCK), "rb"):
        thread.join(timeout=600)  # release the writer
    assert woke.is_set()


def test_huge_uuid_is_refused_not_loaded(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = make_result_dir(results, "000__cell")
    with open(run / ".uuid", "wb") as stream:  # sparse: 1 GiB on paper, no disk used
        stream.truncate(1 << 30)
    reader = FileReader(run)
    assert reader.text(".uuid", max_bytes=4096) is None
    assert "over the 4096 read whole" in reader.problems[0].message


def test_a_log_without_newlines_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "pod.log"
    chunk = b"x" * (1 << 20)
    with open(log, "wb") as stream:
        for _ in range(64):  # 64 MiB on one line
            stream.write(chunk)
        stream.write(b"\n{'train_runtime': 1.0}\n")
    # VmHWM is the child's own peak; ru_maxrss would carry the forking pytest's across exec.
    code = (
        "from analysis.parsing import FileReader\n"
        f"reader = FileReader({str(tmp_path)!r})\n"
        "lines = list(reader.lines('pod.log'))\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
        "peak = int(status) // 1024\n"
        "print(len(lines), max(map(len, lines)), peak, reader.problems[0].message)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=True).stdout.split()
    count, longest, peak_mb = int(out[0]), int(out[1]), int(out[2])
    assert count == 2 and longest == MAX_LINE_CHARS
    assert peak_mb < 300, f"{peak_mb} MB peak for a 64 MiB line"
    assert "cut" in out[-1]


def test_deep_nesting_does_not_recurse(tmp_path: Path) -> None:
    """1 500 nested dirs raised RecursionError; here 600 under a recursion limit of 300."""
    results = tmp_path / "results"
    deep = results
    for _ in range(600):  # one-letter names keep the path far under PATH_MAX
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "settings.yaml").write_text("gpu: 0\n")
    (deep / "exit_code").write_text("0\n")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        found = discover(results)
    finally:
        sys.setrecursionlimit(limit)
    assert len(found.results) == 1


def test_html_in_a_dir_name_is_escaped_in_every_report_page(tmp_path: Path) -> None:
    payload = "<img src=x onerror=alert(3)>"
    results = tmp_path / "results"
    for index in range(4):  # enough runs for verdicts, so the regression page has rows
        make_result_dir(results / payload, f"00{index}__cell", seed=index)
    _ = postprocess(results, "fine_tuning", tmp_path / "out",
                    history_uri=str(tmp_path / "history"))
    for page in (tmp_path / "out" / "report").glob("*.html"):
        assert payload not in page.read_text(), page.name


def test_badly_typed_fields_are_problems_not_tracebacks(tmp_path: Path) -> None:
    results = tmp_path / "results"
    times = make_result_dir(results, "000__cell")
    (times / "test_start_end.json").write_text(json.dumps({"start": "garbage", "end": 12}))
    settings = make_result_dir(results, "001__cell")
    (settings / "settings.yaml").write_text("name: 7\nmodel_name: [1, 2]\nhyper_parameters: 3\n")
    make_result_dir(results, "002__cell")
    outcome = _postprocess(results, tmp_path / "out")
    assert outcome.runs == 2  # the run whose settings cannot be labelled is skipped, with why
    assert any("labels/KPIs could not be computed" in s["reason"] for s in outcome.skipped)
    payloads = json.loads((tmp_path / "out" / "lts_payload.json").read_text())
    assert any("start is not an ISO 8601 time" in p for p in payloads[0]["problems"])
    assert payloads[0]["metadata"]["end"] is None


# -- generated trees: any bytes in any result file end as a problem, a skip or a user error ----


_FILES = ["exit_code", ".uuid", "settings.yaml", "test_start_end.json", "config.yaml",
          "001__fine_tuning__run_fine_tuning_job/artifacts/pod.log",
          "001__fine_tuning__run_fine_tuning_job/artifacts/pod.json",
          "001__fine_tuning__run_fine_tuning_job/src/config_final.json"]
_contents = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"99999999999999999999", b"-1", b"1e400", b"nan", b"\xff\xfe",
                     b'{"start": "9999-12-31T00:00:00Z", "end": "0001-01-01"}',
                     b'{"start": 5, "end": [1]}', b"[" * 500 + b"]" * 500,
                     b"a: &a [1]\nb: *a\n", b"k:\n" + b"  k:\n" * 100, b"{'loss': 'nan'}",
                     b"{'train_runtime': '1e400', 'train_samples_per_second': 'inf'}",
                     b"dataset stats: {\"total_tokens\": 99999999999999999999999}"]))
_kinds = st.sampled_from(["file", "fifo", "link-out", "link-loop", "dir", "missing"])


@settings(max_examples=60)
@given(changes=st.lists(st.tuples(st.sampled_from(_FILES), _kinds, _contents), max_size=6),
       runs=st.integers(min_value=1, max_value=3))
def test_generated_trees_never_escape_as_another_error(
        tmp_path_factory: pytest.TempPathFactory, changes: list, runs: int) -> None:
    base = tmp_path_factory.mktemp("tree")
    results = base / "results"
    outside = base / "outside.txt"
    outside.write_text(SECRET)
    dirs = [make_result_dir(results, f"00{i}__cell", seed=i) for i in range(runs)]
    for index, (name, kind, content) in enumerate(changes):
        target = dirs[index % runs] / name
        if not target.parent.is_dir() or target.parent.is_symlink():
            continue
        if target.is_dir() and not target.is_symlink():
            continue
        if os.path.lexists(target):
            target.unlink()  # a file, a FIFO or a link

        if kind == "file":
            target.write_bytes(content)
        elif kind == "fifo":
            os.mkfifo(target)
        elif kind == "link-out":
            target.symlink_to(outside)
        elif kind == "link-loop":
            target.symlink_to(target)
        elif kind == "dir":
            target.mkdir()
    out = base / "out"
    try:
        postprocess(results, "fine_tuning", out, history_uri=str(base / "history"))
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    for written in out.rglob("*"):
        if written.is_file():
            assert SECRET.encode() not in written.read_bytes()


def test_a_secret_in_an_imported_trees_settings_reaches_no_output(tmp_path: Path) -> None:
    from core.redact import register_secret

    results = tmp_path / "results"
    make_result_dir(results, "000__cell", settings={"hf_token": "Hf-Tok3n-not-shown",
                                                    "note": "key Env-s3cret-xyz"})
    register_secret("Env-s3cret-xyz")  # as if read from a secret file of this run
    out = tmp_path / "out"
    postprocess(results, "fine_tuning", out, history_uri=str(tmp_path / "history"))
    for path in [*out.rglob("*"), *(tmp_path / "history").rglob("*")]:
        if path.is_file() and path.suffix != ".parquet":
            data = path.read_bytes()
            assert b"Hf-Tok3n-not-shown" not in data, path
            assert b"Env-s3cret-xyz" not in data, path
