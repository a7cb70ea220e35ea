"""``TELLTALE_*`` settings read by pydantic-settings, seen when the environment changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.environment import default_data_dir, env_settings
from core.errors import ConfigError
from projects.llm_serving.install import default_venv


def test_settings_follow_the_environment(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("TELLTALE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "yes")
    assert default_data_dir() == tmp_path
    assert env_settings().force_reparse is True
    monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "0")  # a change is seen, not a stale cache
    assert env_settings().force_reparse is False
    monkeypatch.delenv("TELLTALE_FORCE_REPARSE")
    assert env_settings().force_reparse is False


def test_nested_and_flat_names_of_the_serving_venv(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.delenv("TELLTALE_SERVING_VENV", raising=False)
    monkeypatch.setenv("TELLTALE_SERVING__VENV", str(tmp_path / "nested"))
    assert default_venv() == tmp_path / "nested"
    monkeypatch.delenv("TELLTALE_SERVING__VENV")
    monkeypatch.setenv("TELLTALE_SERVING_VENV", str(tmp_path / "flat"))
    assert default_venv() == tmp_path / "flat"


def test_config_overrides_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # TELLTALE__a__b addresses a config key; the settings model ignores it
    monkeypatch.setenv("TELLTALE__tests__fine_tuning__test_settings__gpu", "2")
    assert "tests" not in env_settings().model_dump()


def test_a_malformed_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELLTALE_FORCE_REPARSE", "perhaps")
    with pytest.raises(ConfigError, match="TELLTALE_FORCE_REPARSE") as info:
        env_settings()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("variable", ["TELLTALE_RUNS_DIR", "TELLTALE_DATA_DIR"])
@pytest.mark.parametrize("shape", ["file", "under a file", "fifo"])
def test_a_directory_setting_that_cannot_be_one_names_its_variable(
        variable: str, shape: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    thing = tmp_path / "thing"
    if shape == "fifo":
        os.mkfifo(thing)
    else:
        thing.write_text("x")
    value = thing / "runs" if shape == "under a file" else thing
    monkeypatch.setenv(variable, str(value))
    with pytest.raises(ConfigError, match=f"environment variable {variable}: .*not a "
                                          "directory") as info:
        env_settings()
    assert "Value error" not in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv(variable, str(tmp_path / "new" / "dir"))  # may be made: fine
    assert env_settings()


def test_the_cli_says_which_variable_names_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    env = {**os.environ, "TELLTALE_RUNS_DIR": str(tmp_path / "afile")}
    proc = subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                           "--plan"], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: environment variable TELLTALE_RUNS_DIR: {tmp_path / 'afile'} is not a "
        "directory"]


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e9", "soon"])
def test_the_shared_api_idle_time_is_a_finite_bounded_number(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELLTALE_PREFECT_API_IDLE_MINUTES", value)
    with pytest.raises(ConfigError, match="TELLTALE_PREFECT_API_IDLE_MINUTES"):
        env_settings()


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e9", "soon"])
def test_the_spare_prometheus_minutes_are_a_finite_bounded_number(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELLTALE_SPARE_PROMETHEUS_MINUTES", value)
    with pytest.raises(ConfigError, match="TELLTALE_SPARE_PROMETHEUS_MINUTES"):
        env_settings()
    monkeypatch.setenv("TELLTALE_SPARE_PROMETHEUS_MINUTES", "0")  # 0: no spare, valid
    assert env_settings().spare_prometheus_minutes == 0
