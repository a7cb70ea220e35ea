"""Every line a command prints goes through the one printer (`core.terminal.say`).

An audit over the package's source (AST, not grep): a call to ``print``, ``sys.stdout.write``
or ``sys.stderr.write`` anywhere in flows/, tasks/, projects/, analysis/, blocks/ and
deployments/ fails it, except in the listed workload programs — their standard output is the
workload's log, written to a file and parsed by us, never shown raw on a terminal — and in
the printer itself. And, through each entry point that prints a config or a result, hostile
input comes out escaped.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.code_tree import python_files

ROOT = Path(__file__).resolve().parents[1]
# program -> why its own print is not terminal output
WORKLOAD_PROGRAMS = {
    "core/terminal.py": "the printer itself",
    "projects/fine_tuning/workload/train_local.py": "the trainer's log lines (parsed)",
    "projects/fine_tuning/data/generate.py": "a data generator run by hand",
    "projects/llm_serving/workload/build_model.py": "a workload step's log (captured)",
    "projects/llm_serving/workload/load.py": "the load generator's log (captured)",
    "projects/llm_serving/workload/vllm_server.py": "the vLLM server's log (server.log)",
    "tasks/kube/user_pod_script.py": "runs inside a user pod; its log is the pod's",
    "tasks/platforms/fanout.py": "a local user process; its log is the user's",
}


def _printing_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            lines.append(node.lineno)
        elif (isinstance(func, ast.Attribute) and func.attr in ("write", "writelines")
              and isinstance(func.value, ast.Attribute)
              and func.value.attr in ("stdout", "stderr")
              and isinstance(func.value.value, ast.Name) and func.value.value.id == "sys"):
            lines.append(node.lineno)
    return lines


def _own_parsers(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "ArgumentParser"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "argparse"]


def test_no_code_prints_around_the_printer() -> None:
    offenders = []
    for rel, path in python_files(skip_scaffold=True):
        if rel in WORKLOAD_PROGRAMS:
            continue
        offenders += [f"{rel}:{line}" for line in _printing_calls(path)]
        offenders += [f"{rel}:{line} (argparse's own parser echoes input raw)"
                      for line in _own_parsers(path)]
    assert not offenders, ("print through core.terminal.say (secrets masked, controls "
                           f"escaped): {offenders}")


def test_the_audit_would_see_a_bypass(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nprint('x')\nsys.stdout.write('y')\nsys.stderr.write('z')\n")
    assert _printing_calls(bad) == [2, 3, 4]
    bad.write_text("import argparse\nparser = argparse.ArgumentParser(prog='x')\n")
    assert _own_parsers(bad) == [2]
    assert all((ROOT / p).is_file() for p in WORKLOAD_PROGRAMS), "a listed program moved"


HOSTILE = st.sampled_from(["\x1b[2J", "\x1b]52;c;ZXZpbA==\x07", "\u202e", "\x9b31m", "\r",
                           "\x1b]8;;https://evil.example\x07"])


@settings(max_examples=25, deadline=None)
@given(bad=HOSTILE, text=st.text("abcXYZ-_", min_size=1, max_size=12))
def test_say_escapes_every_control_whatever_the_mode(bad: str, text: str) -> None:
    import contextlib
    import io

    from core.terminal import UNSAFE_CHARACTERS, say

    for keep in (False, True):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            say(f"{text}{bad}{text}", keep_newlines=keep)
        assert not UNSAFE_CHARACTERS & set(out.getvalue()[:-1]), repr(out.getvalue())


@pytest.mark.parametrize("entry", [
    ["-m", "flows.fine_tuning", "--show-config"],
    ["-m", "analysis", "accept", "--history", "{dir}/history", "--run-uuid"],
])
def test_entry_points_that_echo_input_escape_it(entry: list[str], tmp_path: Path) -> None:
    """--show-config prints a value given on the command line; accept echoes the run id."""
    evil = "x\x1b]52;c;ZXZpbA==\x07\u202ey"
    argv = [a.replace("{dir}", str(tmp_path)) for a in entry]
    if "--show-config" in argv:
        argv += ["--preset", "light", "--var",
                 f"tests.fine_tuning.test_settings.dataset_name={evil}"]
    else:
        argv += [evil, "--reason", evil]
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    both = out.stdout + out.stderr
    assert "\x1b" not in both and "\u202e" not in both and "\x07" not in both, both[-2000:]


def test_an_analysis_error_naming_a_hostile_uuid_is_escaped(tmp_path: Path) -> None:
    """Two result dirs sharing a .uuid are refused, naming it: a uuid written by anyone
    who can write the results tree, so it is printed escaped."""
    from tests.factories import make_result_dir

    evil = "run\x1b]52;c;ZXZpbA==\x07\u202eid"
    results = tmp_path / "results"
    for name in ("000__cell", "001__cell"):
        make_result_dir(results, name, run_uuid=evil)
    proc = subprocess.run([sys.executable, "-m", "analysis", str(results), "--project",
                           "fine_tuning", "--out", str(tmp_path / "out"), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    both = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "run" in both, both[-2000:]
    assert "\x1b" not in both and "\u202e" not in both and "\x07" not in both, both[-2000:]
