"""``TELLTALE_*`` settings read by pydantic-settings, seen when the environment changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.environment import env_settings
from analysis.errors import ConfigError
from analysis.history import default_data_dir
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
