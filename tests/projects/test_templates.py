from __future__ import annotations

from pathlib import Path

import pytest

from projects.config import ConfigError, resolve, use_config
from projects.templates import from_config, render_command_args, step_key


def deploy(namespace: str, replicas: int, image: str = "img:1", labels: dict[str, str] | None = None) -> None:
    """A step used by the tests."""


deploy.telltale_group = "app"  # type: ignore[attr-defined]


@pytest.fixture()
def setup(tmp_path: Path):
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text("app:\n  ns: demo\n  replicas: 2\n  empty: null\n")
    config = resolve(cfg_path, env={})
    template = tmp_path / "command_args.yaml.j2"
    return config, template


def write(template: Path, text: str) -> Path:
    template.write_text(text)
    return template


def test_step_key_forms() -> None:
    assert step_key(deploy) == "app deploy"
    assert step_key(deploy, prefix="sutest", suffix="gpu") == "sutest/app deploy/gpu"


def test_from_config_merges_extra_and_validates(setup) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: {{ app.ns }}\n  replicas: {{ app.replicas }}\n"
                    "sutest/app deploy:\n  namespace: other\n  replicas: SET_AT_RUNTIME\n")
    assert from_config(deploy, config=config, template=template) == {
        "namespace": "demo", "replicas": 2, "image": "img:1", "labels": None}
    args = from_config(deploy, prefix="sutest", extra={"replicas": "3"}, config=config,
                       template=template)
    assert args["namespace"] == "other" and args["replicas"] == 3


def test_uses_current_config(setup) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: x\n  replicas: 1\n")
    with use_config(config):
        assert from_config(deploy, template=template)["namespace"] == "x"


def test_leftover_set_at_runtime(setup) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: x\n  replicas: SET_AT_RUNTIME\n")
    with pytest.raises(ConfigError, match="app deploy.replicas is still SET_AT_RUNTIME"):
        from_config(deploy, config=config, template=template)


def test_undefined_value_is_an_error_with_line(setup) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: x\n  replicas: {{ app.missing }}\n")
    with pytest.raises(ConfigError) as info:
        render_command_args(config, template)
    assert "undefined value" in str(info.value) and info.value.line == 3


def test_syntax_error(setup) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: {{ app.ns \n")
    with pytest.raises(ConfigError, match="template syntax error"):
        render_command_args(config, template)


def test_raise_exception_and_log_warning(setup, caplog) -> None:
    config, template = setup
    write(template, "{{ 'careful' | log_warning }}app deploy:\n  namespace: x\n  replicas: 1\n")
    render_command_args(config, template)
    assert "careful" in caplog.text
    write(template, "{% if app.replicas > 1 %}{{ raise_exception('too many replicas') }}{% endif %}\n")
    with pytest.raises(ConfigError, match="too many replicas"):
        render_command_args(config, template)


def test_or_env(setup, monkeypatch) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: {{ app.empty | or_env('NS_FROM_ENV') }}\n"
                    "  replicas: 1\n")
    monkeypatch.setenv("NS_FROM_ENV", "envns")
    assert from_config(deploy, config=config, template=template)["namespace"] == "envns"
    monkeypatch.delenv("NS_FROM_ENV")
    with pytest.raises(ConfigError, match=r"\$NS_FROM_ENV is not in the environment"):
        from_config(deploy, config=config, template=template)


def test_signature_validation(setup) -> None:
    config, template = setup
    write(template, "app deploy:\n  namespace: x\n  replicas: many\n")
    with pytest.raises(ConfigError, match="argument replicas of deploy"):
        from_config(deploy, config=config, template=template)
    write(template, "app deploy:\n  namespace: x\n  replicas: 1\n  colour: red\n")
    with pytest.raises(ConfigError, match="argument colour"):
        from_config(deploy, config=config, template=template)
    write(template, "app other:\n  a: 1\n")
    with pytest.raises(ConfigError, match="no entry 'app deploy'"):
        from_config(deploy, config=config, template=template)


def test_helpers_in_untaken_branches_stay_silent(setup, caplog, monkeypatch) -> None:
    config, template = setup
    write(template, "{% if app.replicas > 5 %}{{ 'never' | log_warning }}"
                    "{{ raise_exception('never') }}{% endif %}"
                    "app deploy:\n  namespace: {{ 'fixed' | or_env('NS_LATE') }}\n  replicas: 1\n")
    monkeypatch.setenv("NS_LATE", "late")
    assert from_config(deploy, config=config, template=template)["namespace"] == "fixed"
    assert "never" not in caplog.text
