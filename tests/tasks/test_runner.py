from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import StepError
from tasks.artifacts import use_artifact_dir
from tasks.runner import CommandError, CommandTimeout, run, run_and_catch


def test_argv_runs_without_shell() -> None:
    result = run(["echo", "$HOME; rm -rf /"])
    assert result.stdout == "$HOME; rm -rf /\n"


def test_string_runs_in_strict_bash() -> None:
    assert run("echo a | tr a b").stdout == "b\n"
    with pytest.raises(CommandError) as info:  # pipefail: the failing stage fails the pipe
        run("false | cat")
    assert info.value.returncode == 1
    with pytest.raises(CommandError):  # nounset
        run("echo $TELLTALE_SURELY_UNSET_VARIABLE")
    with pytest.raises(CommandError):  # errexit: the script stops at the first failure
        run("false; echo after")
    assert "after" not in run("false; echo after", check=False).stdout


def test_errtrace_is_on() -> None:
    out = run("shopt -o errtrace nounset pipefail errexit").stdout
    assert out.count("on") == 4


def test_failure_carries_command_code_and_stderr_tail() -> None:
    with pytest.raises(CommandError) as info:
        run(["bash", "-c", "echo boom >&2; exit 3"])
    assert info.value.returncode == 3
    assert "boom" in info.value.stderr_tail and "exit 3" in str(info.value)


def test_timeout() -> None:
    with pytest.raises(CommandTimeout):
        run(["sleep", "5"], timeout=0.2)


def test_missing_program() -> None:
    with pytest.raises(StepError, match="program not found"):
        run(["telltale-no-such-program"])


def test_cwd_env_stdin(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("hello\n")
    result = run("cat; echo $GREETING; pwd", cwd=tmp_path, env={"GREETING": "hi"},
                 stdin_file=tmp_path / "in.txt")
    assert result.stdout.splitlines() == ["hello", "hi", str(tmp_path)]


def test_logs_to_step_dir(tmp_path: Path) -> None:
    with use_artifact_dir(tmp_path):
        run(["echo", "logged"])
        run("exit 4", check=False)
    log = (tmp_path / "commands.log").read_text()
    assert "$ echo logged" in log and "logged" in log and "# exit 4" in log


def test_run_and_catch_keeps_first_exception() -> None:
    calls: list[str] = []

    def ok() -> None:
        calls.append("ok")

    def bad(name: str) -> None:
        calls.append(name)
        raise RuntimeError(name)

    exc = None
    exc = run_and_catch(exc, bad, "first")
    exc = run_and_catch(exc, ok)
    exc = run_and_catch(exc, bad, "second")
    assert calls == ["first", "ok", "second"]
    assert str(exc) == "first"


def test_secrets_are_masked_in_logs_and_errors(tmp_path: Path) -> None:
    with use_artifact_dir(tmp_path):
        run(["echo", "token=s3cr3t"], secrets=["s3cr3t"])
        with pytest.raises(CommandError) as info:
            run(["bash", "-c", "echo pw s3cr3t >&2; exit 1", "s3cr3t"], secrets=["s3cr3t"])
    assert "s3cr3t" not in (tmp_path / "commands.log").read_text()
    assert "s3cr3t" not in str(info.value)
