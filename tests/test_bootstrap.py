"""`./telltale`: the README's one command from a fresh clone (venv on first use, then the run).

The full install path (a new venv, torch, the lock) runs in CI itself: `.ci/run` builds its
venv with `./telltale setup --dev`. Here: what the script decides, with no network.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "telltale"


def _stamp(extras: str) -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()
                            + (ROOT / "requirements.lock").read_bytes()).hexdigest()[:16]
    return f"{extras} {digest}\n"


def _venv(tmp_path: Path, python_body: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{python_body}\n")
    python.chmod(0o755)
    return venv


def _run(venv: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TELLTALE_VENV": str(venv), **extra}
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=1200, check=False)


def test_no_arguments_and_unknown_projects_are_usage_errors(tmp_path: Path) -> None:
    venv = tmp_path / "absent"
    assert _run(venv).returncode == 2
    bad = _run(venv, "no_such_project", "--preset", "light")
    assert bad.returncode == 2 and "no project named 'no_such_project'" in bad.stderr
    close = _run(venv, "fine_tunning", "--preset", "light")
    assert close.returncode == 2 and "did you mean: fine_tuning?" in close.stderr
    assert _run(venv, "../etc").returncode == 2
    assert not venv.exists()  # nothing installed for a mistake


def test_help_lists_the_registered_projects_and_exits_0(tmp_path: Path) -> None:
    """The registry's projects (`projects.registry.available`): a scaffolded one too."""
    from projects import registry

    done = _run(tmp_path / "absent", "--help")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("projects:", 1)[1].splitlines()[0].split()
    assert listed == registry.available() and listed


def test_an_up_to_date_venv_runs_the_project_without_installing(tmp_path: Path) -> None:
    venv = _venv(tmp_path, f'exec "{sys.executable}" "$@"')  # this test's own venv
    (venv / ".telltale-stamp").write_text(_stamp("dev"))  # a dev venv serves a plain run
    done = _run(venv, "fine_tuning", "--list-presets")
    assert done.returncode == 0, done.stderr
    assert "light" in done.stdout
    assert "installing" not in done.stderr


def test_a_changed_lock_reinstalls(tmp_path: Path) -> None:
    # a 'python' that records its arguments and fails: the script must try to install
    log = tmp_path / "calls.log"
    venv = _venv(tmp_path, f'echo "$@" >> {log}; exit 3')
    (venv / ".telltale-stamp").write_text("local 0000000000000000\n")
    done = _run(venv, "fine_tuning", "--preset", "light")
    assert done.returncode == 3
    assert "installing into" in done.stderr
    assert "pip install --quiet --upgrade pip" in log.read_text()
    assert (venv / ".telltale-stamp").read_text() == "local 0000000000000000\n"  # not stamped


def test_a_second_first_use_waits_for_the_install_under_way_and_installs_nothing(
        tmp_path: Path) -> None:
    """Two first uses at once pip-installed into one venv together and broke it: the second
    waits for the first's lock beside the venv, then finds the venv built."""
    from core.filelock import dir_lock
    from tests.factories import someone_waits_for_lock, wait_until

    log = tmp_path / "calls.log"
    venv = _venv(tmp_path, f'echo "$@" >> {log}')  # a half-built venv: no stamp yet
    env = {**os.environ, "TELLTALE_VENV": str(venv)}
    with dir_lock(tmp_path, "venv.lock"):  # the first use's install, under way
        second = subprocess.Popen([str(SCRIPT), "fine_tuning", "--preset", "light"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: someone_waits_for_lock(tmp_path / "venv.lock")
                   or second.poll() is not None, "the second use waiting for the install")
        (venv / ".telltale-stamp").write_text(_stamp("local"))  # the first one is done
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    assert "waiting for the install into" in err and "installing" not in err
    assert "-m flows.fine_tuning --preset light" in log.read_text().splitlines()
    assert "pip" not in log.read_text()


def test_pyproject_alone_keeps_prefect_off_the_releases_that_break_its_server() -> None:
    """`pip install .` without the lock must not resolve what the lock avoids (DESIGN §12):
    fastapi 0.165 crashes the first flow run, SQLAlchemy 2.1 stops cron schedules firing."""
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    requirements = {Requirement(r).name.lower(): Requirement(r)
                    for r in deps["project"]["dependencies"]}
    for name, bad, good in [("fastapi", "0.165.0", "0.150.0"),
                            ("sqlalchemy", "2.1.0", "2.0.58"),
                            ("kubernetes", "37.0.2", "37.0.1")]:
        spec = requirements[name].specifier
        assert bad not in spec and good in spec, (name, str(spec))
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8").lower()
    for name, requirement in requirements.items():  # the lock satisfies the declared bounds
        pinned = [line.split("==")[1] for line in lock.splitlines()
                  if line.replace("_", "-").startswith(name.replace("_", "-") + "==")]
        if pinned:
            assert pinned[0] in requirement.specifier, (name, pinned[0])


def test_setup_writes_the_projects_bytecode_even_where_python_would_not(tmp_path: Path) -> None:
    """With PYTHONDONTWRITEBYTECODE=1 every process compiled the project's modules again
    (0.3-0.5 s of a warm post-processing); `./telltale setup` writes their bytecode ahead."""
    import importlib.util

    source = ROOT / "core" / "errors.py"
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.unlink(missing_ok=True)  # another worker's import just reads the source meanwhile
    venv = _venv(tmp_path, f'exec "{sys.executable}" "$@"')
    (venv / ".telltale-stamp").write_text(_stamp("dev"))
    done = subprocess.run([str(SCRIPT), "setup", "--dev"], capture_output=True, text=True,
                          env={**os.environ, "TELLTALE_VENV": str(venv),
                               "PYTHONDONTWRITEBYTECODE": "1"}, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stderr
    # valid for the source as it is: the header holds the source's mtime and size
    header = cached.read_bytes()[8:16]
    stat = source.stat()
    assert int.from_bytes(header[:4], "little") == int(stat.st_mtime) & 0xFFFFFFFF
    assert int.from_bytes(header[4:], "little") == stat.st_size & 0xFFFFFFFF


def test_a_run_compiles_the_projects_bytecode_beside_it(tmp_path: Path) -> None:
    """A run starts the compile in the background: its output never reaches the run's."""
    log = tmp_path / "calls.log"
    venv = _venv(tmp_path, f'echo "$@" >> {log}')
    (venv / ".telltale-stamp").write_text(_stamp("local"))
    done = _run(venv, "fine_tuning", "--preset", "light")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    waited = subprocess.run(["sh", "-c", f"until grep -q compileall {log}; do sleep 0.1; "
                             "done"], timeout=300, check=False)
    assert waited.returncode == 0
    calls = log.read_text().splitlines()
    assert "-m flows.fine_tuning --preset light" in calls
    assert any(c.startswith("-m compileall -q analysis ") for c in calls)


def _test_command_venv(tmp_path: Path, build_exit: int) -> tuple[Path, Path, Path]:
    """A dev venv whose 'python' plays the serving build (it ends, with ``build_exit``, once
    ``release`` exists) and pytest (it records whether the build ran beside it, then waits
    for ``stop`` unless that exists). Returns (venv, release, record)."""
    release, record, stop = tmp_path / "release", tmp_path / "record", tmp_path / "stop"
    venv = _venv(tmp_path, f"""case "$2" in
  projects.llm_serving.install)
    until [ -e {release} ]; do sleep 0.05; done
    echo "pip: a broken wheel" >&2; exit {build_exit} ;;
  pytest)
    if kill -0 "$TELLTALE_SERVING_BUILD_PID"; then echo "alive $TELLTALE_SERVING_BUILD_PID" \\
      > {record}; else echo gone > {record}; fi
    until [ -e {stop} ]; do sleep 0.05; done ;;
esac""")
    (venv / ".telltale-stamp").write_text(_stamp("dev"))
    stop.touch()
    return venv, release, record


def test_the_test_command_builds_the_serving_venv_beside_the_suite(tmp_path: Path) -> None:
    """The build is one core's work for ~3 min: pytest starts beside it (its tests that need
    the venv wait for the process named in TELLTALE_SERVING_BUILD_PID), and the command ends
    once both have, with pytest's status."""
    from tests.factories import wait_until

    venv, release, record = _test_command_venv(tmp_path, build_exit=0)
    err = tmp_path / "stderr"
    scratch = tmp_path / "tmp"  # its temporary dirs and the build's log
    scratch.mkdir()
    with err.open("w") as stream:
        command = subprocess.Popen([str(SCRIPT), "test", "-q"], env={
            **os.environ, "TELLTALE_VENV": str(venv), "TMPDIR": str(scratch)},
            stdout=subprocess.DEVNULL, stderr=stream, text=True)
        try:
            wait_until(lambda: record.exists() or command.poll() is not None,
                       "pytest started")
            assert record.read_text().startswith("alive "), "pytest ran before the build"
            # pytest ended; the command waits for the build, and says so
            wait_until(lambda: "waiting for the serving venv's build" in err.read_text()
                       or command.poll() is not None, "the command waiting for the build")
            assert command.poll() is None, err.read_text()
        finally:
            release.touch()  # the build ends (a failure above leaves no fake behind)
            command.wait(timeout=600)
    assert command.returncode == 0, err.read_text()
    assert "building the serving venv failed" not in err.read_text()
    assert list(scratch.iterdir()) == []  # nothing of the session's is left behind


def test_a_failed_serving_build_fails_the_test_command_with_its_log(tmp_path: Path) -> None:
    venv, release, _ = _test_command_venv(tmp_path, build_exit=4)
    release.touch()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = _run(venv, "test", "-q", TMPDIR=str(scratch))
    assert done.returncode == 1, done.stderr  # pytest passed; the build did not
    assert "building the serving venv failed (exit 4)" in done.stderr
    assert "pip: a broken wheel" in done.stderr
    # the failed build's log is kept, and named; the session's dirs are gone
    (log,) = scratch.iterdir()
    assert log.name.startswith("telltale-serving-build.") and str(log) in done.stderr


@pytest.mark.parametrize(("signal_name", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_test_command_stops_the_serving_build(
        tmp_path: Path, signal_name: str, status: int) -> None:
    """Ctrl-C (SIGINT to the terminal's foreground group), or a CI's cancel (SIGTERM), ends
    pytest; the build, in a session of its own, is stopped with it, not left installing."""
    import signal

    from tests.factories import process_gone, terminal_job, wait_until

    venv, release, record = _test_command_venv(tmp_path, build_exit=0)
    (tmp_path / "stop").unlink()  # pytest runs until interrupted
    # like a terminal's job: a suite run in a CI's background shell ignores SIGINT, and so
    # would the command (a shell cannot trap what it was started ignoring)
    scratch = tmp_path / "tmp"  # its temporary dirs and the build's log
    scratch.mkdir()
    command = terminal_job([str(SCRIPT), "test"], {**os.environ, "TELLTALE_VENV": str(venv),
                                                   "TMPDIR": str(scratch)})
    try:
        wait_until(lambda: record.exists() or command.poll() is not None, "pytest started")
        build = int(record.read_text().split()[1])
        os.killpg(command.pid, getattr(signal, signal_name))
        command.communicate(timeout=600)
        assert command.returncode == status
        assert process_gone(build), "the serving build outlived the interrupted test command"
        assert list(scratch.iterdir()) == []  # its dirs and the cut build's log went too
    finally:
        release.touch()  # a fake build left behind by a failure ends too
        (tmp_path / "stop").touch()
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()


def test_a_serving_test_waits_for_the_build_beside_the_suite(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serving_venv_or_skip` beside a build under way: it waits for the builder to end and
    then finds the venv (it skipped at once, the venv not built yet)."""
    import threading

    from projects.llm_serving.install import MARKER
    from tests.factories import serving_venv_or_skip

    venv = tmp_path / "serving"
    builder = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys; sys.stdin.read(); v = pathlib.Path(sys.argv[1]); "
        "(v / 'bin').mkdir(parents=True); (v / 'bin' / 'python').touch(); "
        f"(v / '{MARKER}').write_text('{{}}')"), str(venv)], stdin=subprocess.PIPE)
    monkeypatch.setenv("TELLTALE_SERVING__VENV", str(venv))
    monkeypatch.setenv("TELLTALE_SERVING_BUILD_PID", str(builder.pid))
    monkeypatch.delenv("TELLTALE_REQUIRE_SERVING", raising=False)
    ended: list[BaseException | None] = []

    def check() -> None:
        try:
            serving_venv_or_skip()
            ended.append(None)
        except BaseException as exc:  # pytest's Skipped is not an Exception
            ended.append(exc)

    waiter = threading.Thread(target=check)
    waiter.start()
    waiter.join(0.5)
    assert builder.stdin is not None
    builder.stdin.close()  # the build ends, the venv built
    builder.wait(timeout=600)
    waiter.join(600)
    assert ended == [None], ended


def test_a_first_test_command_starts_the_serving_build_once_pydantic_is_in(
        tmp_path: Path) -> None:
    """From a fresh clone both venvs are built: the serving build (it imports pydantic) starts
    once the dev venv has pydantic, beside the dev venv's torch and the rest, and does not
    hold the dev venv's lock (a second first use would have waited for it)."""
    import fcntl

    from tests.factories import wait_until

    log, started, release, record = (tmp_path / n for n in (
        "calls.log", "started", "release", "record"))
    venv = _venv(tmp_path, f"""echo "$@" >> {log}
case "$*" in
  "-m projects.llm_serving.install")
    touch {started}; until [ -e {release} ]; do sleep 0.05; done ;;
  *"install --quiet torch==2.13.0"*)  # a bounded wait: is the build under way already?
    i=0; until [ -e {started} ] || [ $i -ge 2400 ]; do sleep 0.05; i=$((i + 1)); done
    if [ -e {started} ]; then echo "torch beside the build" >> {log}; fi ;;
  "-m pytest"*) touch {record} ;;
esac""")  # a venv with no stamp: to be installed
    command = subprocess.Popen([str(SCRIPT), "test"], env={
        **os.environ, "TELLTALE_VENV": str(venv)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: record.exists() or command.poll() is not None, "pytest started")
        calls = log.read_text().splitlines()
        pydantic = next(i for i, c in enumerate(calls) if "pydantic pydantic-settings" in c)
        torch = next(i for i, c in enumerate(calls) if "torch==2.13.0" in c)
        assert pydantic < torch and "torch beside the build" in calls, calls
        with (tmp_path / "venv.lock").open("w") as lock:  # free while the build runs
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        release.touch()
        out, err = command.communicate(timeout=600)
    assert command.returncode == 0, err
    assert log.read_text().count("-m projects.llm_serving.install") == 1
