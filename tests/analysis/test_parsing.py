from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from analysis.discovery import discover
from analysis.parsing import CACHE_FILE, parse_dirs, parse_one
from projects.fine_tuning.parser import FineTuningParser, FineTuningResult
from tests.factories import make_result_dir

PARSER = FineTuningParser()


def _only(root: Path):
    found = discover(root)
    assert len(found.results) == 1
    return found.results[0]


def test_telltale_layout(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "000__cell", tokens_per_second=1500, run_uuid="u-1")
    result = parse_one(_only(tmp_path), PARSER)
    assert isinstance(result, FineTuningResult)
    assert result.run_uuid == "u-1"
    assert result.summary.train_tokens_per_second == 1500
    assert result.workload.exit_code == 0 and result.workload.finish_reason == "Completed"
    assert result.platform.ocp_version == "4.16.3"
    assert result.platform.accelerator_type == "NVIDIA-A100-SXM4-40GB"
    assert result.trainer_config["peft_method"] == "lora"
    assert result.problems == []


def test_field_tool_layout(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "run", layout="topsail", generation=5)
    result = parse_one(_only(tmp_path), PARSER)
    assert result.platform.rhoai_version == "2.13.0"
    assert result.config_text and "fine_tuning" in result.config_text
    assert result.summary.train_tokens_per_second == 1200
    assert result.problems == []


def test_broken_files_degrade_gracefully(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "bad", exit_code=1,
                    broken={"config_json", "pod_json", "summary", "capture", "uuid"})
    result = parse_one(_only(tmp_path), PARSER)
    files = {p.file.split("/")[-1] for p in result.problems}
    assert {"config_final.json", "pod.json", ".uuid", "*__cluster__capture_environment"} <= files
    bad_json = next(p for p in result.problems if p.file.endswith("config_final.json"))
    assert "invalid JSON" in bad_json.message and bad_json.line == 1
    assert result.trainer_config is None and result.summary is None
    assert len(result.progress)  # the log itself still parsed
    assert result.failed


def test_cache_hits_and_invalidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_result_dir(tmp_path, "000__cell", tokens_per_second=100)
    result_dir = _only(tmp_path)
    first = parse_one(result_dir, PARSER)
    header, body, apart = (json.loads(line)
                           for line in (run / CACHE_FILE).read_text().splitlines())
    assert header["version"] == PARSER.version and apart == {}
    assert "001__fine_tuning__run_fine_tuning_job/artifacts/pod.log" in header["fingerprints"]
    # a poisoned cache value proves the second parse read the cache
    body["summary"]["train_runtime"] = 999.0
    (run / CACHE_FILE).write_text(json.dumps(header) + "\n" + json.dumps(body) + "\n")
    assert parse_one(result_dir, PARSER).summary.train_runtime == 999.0
    # the env var forces a re-parse
    monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "1")
    assert parse_one(result_dir, PARSER).summary.train_runtime == first.summary.train_runtime
    monkeypatch.delenv("TELLTALE_FORCE_REPARSE")
    # a changed file invalidates
    log = run / "001__fine_tuning__run_fine_tuning_job/artifacts/pod.log"
    log.write_text(log.read_text().replace("'train_runtime': 40", "'train_runtime': 41"))
    os.utime(log, ns=(1, 1))
    assert parse_one(result_dir, PARSER).summary.train_runtime == 41
    # a newly appearing file that was missing invalidates too
    (run / ".uuid").unlink()
    parse_one(result_dir, PARSER)
    (run / ".uuid").write_text("fresh\n")
    assert parse_one(result_dir, PARSER).run_uuid == "fresh"


def test_stale_parser_version_rebuilds(tmp_path: Path) -> None:
    run = make_result_dir(tmp_path, "000__cell")
    parse_one(_only(tmp_path), PARSER)
    header, body, _ = (json.loads(line) for line in (run / CACHE_FILE).read_text().splitlines())
    header["version"] = "0.0"
    body["run_uuid"] = "stale"
    (run / CACHE_FILE).write_text(json.dumps(header) + "\n" + json.dumps(body) + "\n")
    assert parse_one(_only(tmp_path), PARSER).run_uuid != "stale"


def test_parallel_parse_matches_serial(tmp_path: Path) -> None:
    for i in range(24):
        make_result_dir(tmp_path, f"{i:03d}__cell", tokens_per_second=100 + i, seed=i)
    found = discover(tmp_path).results
    parallel = parse_dirs(found, PARSER, project="fine_tuning", workers=2, use_cache=False)
    serial = parse_dirs(found, PARSER, use_cache=False)
    assert [r.model_dump() for r in parallel] == [r.model_dump() for r in serial]
    assert [r.summary.train_tokens_per_second for r in parallel] == [100 + i for i in range(24)]


def test_matching_lines_equal_the_line_by_line_parse(tmp_path: Path) -> None:
    """The C-speed scan yields the same metrics and line numbers as reading every line."""
    from analysis.parsing import FileReader
    from projects.fine_tuning.logparse import parse_numbered_lines, parse_train_log
    from tests.factories import train_log

    text = train_log(noise_lines=40_000, seed=3)  # ~3 MB: several 1 MiB blocks
    lines = text.splitlines(keepends=True)
    middle = len(lines) // 2
    lines.insert(middle, "{'loss'}\n")  # an unparsable metrics line: a problem
    (tmp_path / "pod.log").write_text("".join(lines) + "{'loss': 1.0, 'epoch': 9.0}")
    reader = FileReader(tmp_path)
    fast = parse_numbered_lines(reader.matching_lines("pod.log", "{"))
    with open(tmp_path / "pod.log", encoding="utf-8", newline="") as stream:
        slow = parse_train_log(stream)
    # Line numbers count "\n" (what an editor and grep -n show); iterating the text
    # stream also counted the progress bars' bare "\r" as line ends.
    assert fast.problems == [("".join(lines[:middle]).count("\n") + 1,
                              "unparsable metrics line")]
    assert fast.model_copy(update={"problems": []}) == slow.model_copy(update={"problems": []})
    assert fast.summary is not None and len(fast.progress) == len(slow.progress) > 0


def test_a_log_problem_names_its_line(tmp_path: Path) -> None:
    """The parser scans by byte offsets; the problem it records still names the line."""
    run = make_result_dir(tmp_path, "000__cell", noise_lines=30_000)  # > 1 MiB: two blocks
    log = next(run.glob("*__run_fine_tuning_job")) / "artifacts" / "pod.log"
    lines = log.read_text().splitlines(keepends=True)
    where = len(lines) * 3 // 4
    lines.insert(where, "  7%|#  | 7/100 {'loss'}\n")
    log.write_text("".join(lines))
    parsed = parse_one(_only(tmp_path), PARSER, use_cache=False)
    assert [(p.line, p.message) for p in parsed.problems if p.file.endswith("pod.log")] == \
        [(where + 1, "unparsable metrics line")]


def test_matching_lines_bound_an_endless_line(tmp_path: Path) -> None:
    from analysis.parsing import MAX_LINE_CHARS, FileReader

    with open(tmp_path / "pod.log", "wb") as stream:
        stream.write(b"{" + b"x" * (3 << 20) + b"\nplain\n{'loss': 2.0}\n")
    reader = FileReader(tmp_path)
    found = list(reader.matching_lines("pod.log", "{"))
    assert [n for n, _ in found] == [1, 3]
    assert len(found[0][1]) == MAX_LINE_CHARS and found[1][1] == "{'loss': 2.0}"
    assert any("cut" in p.message for p in reader.problems)


@pytest.mark.parametrize("block", [7, 64, 1000])
def test_matching_lines_exact_across_block_boundaries(tmp_path: Path, block: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny blocks cut lines everywhere: every match, its text and its number stay exact."""
    import random

    import analysis.file_reader as file_reader

    monkeypatch.setattr(file_reader, "_BLOCK", block)
    rng = random.Random(block)
    lines = []
    for i in range(400):
        text = "".join(rng.choice("ab {}\r") for _ in range(rng.randrange(0, 150)))
        lines.append(f"{i}:{text}")
    data = "\n".join(lines)  # no newline at the end: the last line is a carry
    (tmp_path / "pod.log").write_text(data, newline="")
    reader = file_reader.FileReader(tmp_path)
    found = list(reader.matching_lines("pod.log", "{"))
    expected = [(n, line) for n, line in enumerate(data.split("\n"), start=1) if "{" in line]
    assert found == expected and len(found) > 100
    # the scan itself gives byte offsets; their lines, asked in any order, are the same
    spans = list(reader.matching_spans("pod.log", "{"))
    raw = data.encode()
    assert all(raw[offset:].startswith(line.encode()) for offset, line in spans)
    offsets = [offset for offset, _ in spans]
    assert reader.line_numbers("pod.log", offsets[::-1]) == [n for n, _ in found][::-1]


def test_bulky_fields_stored_apart_are_read_only_when_wanted(tmp_path: Path) -> None:
    """A warm post-processing of many runs reads the old runs' caches without their loss
    curves (stored on a line of their own), which it would drop anyway."""
    make_result_dir(tmp_path, "000__cell")
    result_dir = _only(tmp_path)
    fresh = parse_one(result_dir, PARSER, apart=("progress",))
    assert len(fresh.progress) > 0
    lines = (tmp_path / "000__cell" / CACHE_FILE).read_text().splitlines()
    assert json.loads(lines[0])["apart"] == ["progress"] and "progress" not in lines[1]
    lean = parse_one(result_dir, PARSER, apart=("progress",), skip=("progress",))
    assert len(lean.progress) == 0 and lean.summary == fresh.summary
    assert parse_one(result_dir, PARSER) == fresh  # not skipped: the whole result again
    # in a batch, only the results before skip_before come without it
    both = parse_dirs([result_dir, result_dir], PARSER, apart=("progress",), skip_before=1)
    assert [len(r.progress) for r in both] == [0, len(fresh.progress)]



def test_workers_send_the_older_runs_without_their_bulky_fields(tmp_path: Path) -> None:
    """A cold parse in worker processes: the runs before skip_before come lean (the parent
    validated their loss curves only to drop them), their caches still hold everything."""
    for i in range(20):
        make_result_dir(tmp_path, f"{i:03d}__cell", seed=i)
    found = discover(tmp_path).results
    parsed = parse_dirs(found, PARSER, project="fine_tuning", workers=2, apart=("progress",),
                        skip_before=18)
    assert [len(r.progress) > 0 for r in parsed] == [False] * 18 + [True] * 2
    assert all(r.summary is not None for r in parsed)
    again = parse_dirs(found, PARSER, workers=1, apart=("progress",))  # warm: from the caches
    assert all(len(r.progress) > 0 for r in again)


@given(noise=st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc"]),
                              min_size=1, max_size=3000), max_size=12),
       reason=st.text(alphabet="abcdefghij (): 0123456789", min_size=1, max_size=80))
def test_a_failed_workloads_tail_shows_its_reason_and_no_wall_of_text(
        tmp_path_factory: pytest.TempPathFactory, noise: list[str], reason: str) -> None:
    """Whatever follows it (a JSON summary, a traceback), the workload's last error: line is
    in the tail, and no tail line is longer than TAIL_WIDTH and the cut note."""
    from analysis.file_reader import TAIL_WIDTH, read_tail

    assume(not any(n.strip().lower().startswith("error:") for n in noise))
    path = tmp_path_factory.mktemp("tail") / "pod.log"
    lines = ["started", f"error: {reason}", *[n.replace("\n", " ").replace("\r", " ")
                                             for n in noise]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tail = read_tail(path) or ""
    assert f"error: {reason}".strip()[:TAIL_WIDTH] in tail
    assert all(len(line) <= TAIL_WIDTH + 30 for line in tail.splitlines())


def test_the_cache_keeps_the_engines_inputs_until_one_of_their_files_changes(
        tmp_path: Path) -> None:
    """The fingerprint and the validity checks' inputs come with a warm parse; a change to
    any file (or listing) they read reads them again, like a parsed file's change."""
    from analysis.parsing import engine_inputs
    from analysis.validity import HOST_FILE, HostWindow

    run = make_result_dir(tmp_path, "000__cell")
    host = HostWindow(cores=2, window_s=10, cpu_total_s=20, cpu_busy_s=5, run_cpu_s=4)
    (run / HOST_FILE).write_text(host.model_dump_json())
    first = engine_inputs(parse_one(_only(tmp_path), PARSER))
    assert first.fingerprint["openshift"] == "4.16.3"
    assert first.machine.host == host
    header = json.loads((run / CACHE_FILE).read_text().splitlines()[0])
    assert {HOST_FILE, "000__cluster__capture_environment/nodes.json",
            "000__cluster__capture_environment/ocp_version.yml"} <= set(header["fingerprints"])
    # warm: served from the cache (a change that keeps size and mtime is not seen, as for
    # every file the cache stamps)
    version = run / "000__cluster__capture_environment/ocp_version.yml"
    stamp = version.stat()
    version.write_text("openshiftVersion: 4.16.4\n")
    os.utime(version, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert engine_inputs(parse_one(_only(tmp_path), PARSER)).fingerprint["openshift"] == \
        "4.16.3"
    # a real change is read again: the file's stamp...
    os.utime(version, ns=(1, 1))
    assert engine_inputs(parse_one(_only(tmp_path), PARSER)).fingerprint["openshift"] == \
        "4.16.4"
    busy = host.model_copy(update={"run_cpu_s": 0.5})
    (run / HOST_FILE).write_text(busy.model_dump_json() + " ")
    assert engine_inputs(parse_one(_only(tmp_path), PARSER)).machine.host == busy
    # ...or a capture file that appears where there was none
    (run / "000__cluster__capture_environment/operators.json").write_text(
        json.dumps({"rhods-operator.2.25.0": {"version": "2.25.0"}}))
    assert engine_inputs(parse_one(_only(tmp_path), PARSER)).fingerprint[
        "operator:rhods-operator"] == "2.25.0"
    step = run / "002__capture__prometheus" / "prometheus"
    step.mkdir(parents=True)
    import pandas as pd

    pd.DataFrame({"query": ["cpu_throttled_share"], "labels": ["{}"],
                  "timestamp": pd.to_datetime([0], unit="s", utc=True),
                  "value": [0.5]}).to_parquet(step / "series.parquet")
    (run / HOST_FILE).unlink()  # a cluster's cell: throttling from its Prometheus capture
    assert engine_inputs(parse_one(_only(tmp_path), PARSER)).machine.throttled_share == 0.5
    # workers parse cold dirs in other processes: the inputs come back with the result
    for i in range(1, 20):
        make_result_dir(tmp_path, f"{i:03d}__cell", seed=i)
    found = discover(tmp_path, project="fine_tuning").results
    results = parse_dirs(found, PARSER, project="fine_tuning", workers=2)
    assert all(engine_inputs(r).fingerprint.get("openshift") for r in results)
    assert all(getattr(r, "_engine", None) is not None for r in results)
