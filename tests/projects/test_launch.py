"""A local workload's launch (fresh or forked from the warm Python) is a label."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.discovery import discover
from analysis.kpi import label_strings
from analysis.parsing import parse_one
from analysis.project import load_project
from projects.library.runs import FORKED, FRESH, MIXED, launch_label, users_launch
from tests.factories import make_result_dir


def _labels_with(root: Path, process: Any) -> dict[str, str]:
    run = make_result_dir(root)
    job = next(run.glob("*__fine_tuning__run_fine_tuning_job"))
    (job / "artifacts" / "pod.json").unlink()  # a local process: its process.json instead
    (job / "artifacts" / "process.json").write_text(json.dumps(process))
    project = load_project("fine_tuning")
    parsed = parse_one(discover(root).results[0], project.parser, force=True, use_cache=False)
    assert not parsed.problems, parsed.problems
    return label_strings(project.labels(parsed))


@pytest.mark.parametrize(("launch", "label"), [
    (FRESH, ""), (f"{FORKED} 4242", "forked"), (f"{FORKED} 4242, which died", "forked"),
    (None, ""), (12, ""), ({"a": 1}, ""), ("x" * 10_000, "")])
def test_the_launch_of_a_local_process_is_its_label(tmp_path: Path, launch: Any,
                                                    label: str) -> None:
    process = {"job_name": "c", "exit_code": 0, "finish_reason": "Completed"}
    if launch is not None:
        process["launch"] = launch
    assert _labels_with(tmp_path, process)["launch"] == label


def test_a_pod_has_no_launch(tmp_path: Path) -> None:
    make_result_dir(tmp_path)
    project = load_project("fine_tuning")
    parsed = parse_one(discover(tmp_path).results[0], project.parser, force=True,
                       use_cache=False)
    assert label_strings(project.labels(parsed))["launch"] == ""


@settings(max_examples=100)
@given(launch=st.one_of(st.none(), st.integers(), st.text(max_size=60),
                        st.text(max_size=20).map(lambda t: f"{FORKED}{t}"),
                        st.text(max_size=20).map(lambda t: f"{MIXED}{t}")))
def test_only_a_forked_launch_is_labelled_forked(launch: object) -> None:
    expected = "" if not isinstance(launch, str) else "forked" if launch.startswith(FORKED) \
        else "mixed" if launch.startswith(MIXED) else ""
    assert launch_label(launch) == expected


def _users_labels(root: Path, launches: list[Any]) -> dict[str, str]:
    """The labels of a fan-out's result dir whose users were launched as ``launches`` say."""
    run = make_result_dir(root)
    job = next(run.glob("*__fine_tuning__run_fine_tuning_job"))
    log = (job / "artifacts" / "pod.log").read_text()
    for index, launch in enumerate(launches):
        user = job / "users" / f"user-{index:03d}"
        user.mkdir(parents=True)
        timings = {"index": index, "exit_code": 0, "launched_at": 1.0, "ready_at": 1.1,
                   "released_at": 1.2, "started_at": 1.3, "ended_at": 9.0}
        if launch is not None:
            timings["launch"] = launch
        (user / "timings.json").write_text(json.dumps(timings))
        (user / "pod.log").write_text(log)
    project = load_project("fine_tuning")
    parsed = parse_one(discover(root).results[0], project.parser, force=True, use_cache=False)
    return label_strings(project.labels(parsed))


@pytest.mark.parametrize(("launches", "label"), [
    ([f"{FORKED} 7", f"{FORKED} 7"], "forked"), ([FRESH, FRESH], ""), ([None, None], ""),
    ([f"{FORKED} 7", FRESH], "mixed"), ([f"{FORKED} 7", None], "forked"),
    ([f"{FORKED} 7", 12], "forked")])
def test_a_fan_outs_users_launch_is_its_label(tmp_path: Path, launches: list[Any],
                                              label: str) -> None:
    """Users forked from the warm Python (`tasks.platforms.fanout`) are a forked run; users
    launched both ways (its warm Python died mid-run) are neither kind's baseline."""
    labels = _users_labels(tmp_path, launches)
    assert labels["launch"] == label and labels["user_count"] == str(len(launches))


@given(launches=st.lists(st.one_of(st.none(), st.just(FRESH), st.integers(),
                                   st.text(max_size=10).map(lambda t: f"{FORKED} {t}")),
                         max_size=8))
def test_the_users_launch_is_forked_only_when_every_user_that_ran_forked(
        launches: list[object]) -> None:
    found = users_launch(launches)
    ran = [launch for launch in launches if isinstance(launch, str)]
    forked = [launch for launch in ran if launch.startswith(FORKED)]
    if not forked:
        assert found is None
    elif len(forked) == len(ran):
        assert found == forked[0] and launch_label(found) == "forked"
    else:
        assert launch_label(found) == "mixed" and f"{len(forked)} of {len(ran)}" in str(found)
