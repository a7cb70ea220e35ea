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
from projects.library.runs import FORKED, FRESH, launch_label
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
                        st.text(max_size=20).map(lambda t: f"{FORKED}{t}")))
def test_only_a_forked_launch_is_labelled_forked(launch: object) -> None:
    assert launch_label(launch) == ("forked" if isinstance(launch, str)
                                    and launch.startswith(FORKED) else "")
