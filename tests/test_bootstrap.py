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


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TELLTALE_VENV": str(venv)}
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
