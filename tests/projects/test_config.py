from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from projects import registry
from projects.config import (
    Config,
    ConfigError,
    json_schema,
    load_vars_file,
    parse_override,
    resolve,
)
from projects.untrusted import parse_pr_args

BASE = """\
ci_presets:
  a:
    x: 1
    extends: [b]
    y: a
  b:
    x: 2
    y: b
    z: b
  c:
    extends: d
  d:
    extends: [c]
  e:
    nested.inner: 5
  f:
    nested: {replaced: true}
  g:
    nested.replaced: false
  bad_key:
    nested.innr: 1
  lst:
    x: [2, 4]
x: 0
y: base
z: base
nested:
  inner: 1
  other: 2
placeholder: null
password: hunter2
"""


@pytest.fixture()
def base(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(BASE)
    return path


def test_extends_applies_in_place_and_last_write_wins(base: Path) -> None:
    cfg = resolve(base, ["a"], env={})
    # x: 1 then b sets 2 (extends after x) ; y: b's 'b' then 'a' (written after extends)
    assert cfg.get("x") == 2
    assert cfg.get("y") == "a"
    assert cfg.get("z") == "b"
    assert cfg.presets_applied == ("a", "b")  # child first, then parents


def test_several_presets_in_order(base: Path) -> None:
    assert resolve(base, ["a", "e"], env={}).get("nested.inner") == 5
    assert resolve(base, ["b", "a"], env={}).get("y") == "a"
    assert resolve(base, ["a", "b"], env={}).get("y") == "b"


def test_cycle_is_reported_with_its_path(base: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(base, ["c"], env={})
    assert "preset cycle: c -> d -> c" in str(info.value)
    assert str(base) in str(info.value)


def test_unknown_preset_lists_available(base: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown preset 'nope'; available presets: a, b"):
        resolve(base, ["nope"], env={})


@given(word=st.sampled_from(["light", "nightly", "scale_test", "lora_vs_full", "gating"]),
       at=st.integers(min_value=0, max_value=20), edit=st.sampled_from(["drop", "double", "swap"]))
def test_a_misspelt_preset_suggests_the_close_name(word: str, at: int,
                                                   edit: str) -> None:
    """Any one-letter slip of a real preset name (dropped, doubled, swapped) is suggested
    back."""
    i = at % len(word)
    typo = {"drop": word[:i] + word[i + 1:], "double": word[:i] + word[i] + word[i:],
            "swap": word[:i] + word[i + 1:i + 2] + word[i] + word[i + 2:]}[edit]
    if typo == word:
        return
    with pytest.raises(ConfigError, match=f"did you mean: [^?]*{word}"):
        resolve("fine_tuning", [typo], env={})


def test_a_misspelt_project_suggests_the_close_name() -> None:
    from core.errors import did_you_mean
    from projects import registry

    assert "fine_tuning" in did_you_mean("fine_tunin", registry.available())
    with pytest.raises(ConfigError, match="did you mean: llm_serving"):
        registry.load("llm_servng")


def test_unknown_key_names_closest_and_line(base: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(base, ["bad_key"], env={})
    message = str(info.value)
    assert "closest: inner" in message
    assert "ci_presets.bad_key.nested.innr" in message
    assert info.value.line == 21
    assert "\n" not in message


def test_override_cannot_create_a_key(base: Path) -> None:
    with pytest.raises(ConfigError, match="cannot create keys"):
        resolve(base, overrides={"nested.new": 1}, env={})


def test_mapping_replaces_whole_subtree_and_new_keys_then_exist(base: Path) -> None:
    cfg = resolve(base, ["f", "g"], env={})
    assert cfg.get("nested") == {"replaced": False}
    with pytest.raises(ConfigError):
        cfg.get("nested.inner")


def test_placeholder_null_can_be_set(base: Path) -> None:
    assert resolve(base, overrides={"placeholder": {"a": 1}}, env={}).get("placeholder") == {"a": 1}


def test_list_values_and_yaml_parsing_of_overrides(base: Path) -> None:
    assert resolve(base, ["lst"], env={}).get("x") == [2, 4]
    parsed = {k: parse_override(k, v) for k, v in {"x": "[2, 4]", "y": "4", "z": "'4'"}.items()}
    cfg = resolve(base, overrides=parsed, env={})
    assert cfg.get("x") == [2, 4]
    assert cfg.get("y") == 4
    assert cfg.get("z") == "4"


def test_override_text_is_parsed_exactly_once(base: Path) -> None:
    """'"run #5 nightly"' once is the string; twice it was 'run' (a comment)."""
    value = parse_override("y", '"run #5 nightly"')
    assert resolve(base, overrides={"y": value}, env={}).get("y") == "run #5 nightly"
    assert resolve(base, overrides={"y": "8001"}, env={}).get("y") == "8001"


BOMB = "[&l ['lol','lol','lol'], &m [*l,*l,*l,*l], &n [*m,*m,*m,*m], [*n,*n,*n,*n]]"


@pytest.mark.parametrize("text", ["{a: &a [1, 2], b: *a}", BOMB])
def test_untrusted_yaml_refuses_aliases(text: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="anchors and aliases"):
        parse_override("x", text)
    with pytest.raises(ConfigError, match="anchors and aliases"):
        parse_pr_args(f"/var x: {text}\n", None)
    vars_file = tmp_path / "vars.yaml"
    vars_file.write_text("x: &a [1, 2]\ny: *a\n")
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_vars_file(vars_file)


def test_untrusted_yaml_is_bounded() -> None:
    with pytest.raises(ConfigError, match="accepted from a user"):
        parse_override("x", "[" + "1," * 200_000 + "1]")


def test_precedence_base_presets_vars_env(base: Path) -> None:
    assert resolve(base, ["b"], env={}).get("x") == 2
    assert resolve(base, ["b"], overrides={"x": 3}, env={}).get("x") == 3
    cfg = resolve(base, ["b"], overrides={"x": 3}, env={"TELLTALE__x": "4",
                                                       "TELLTALE__nested__inner": "[1]"})
    assert cfg.get("x") == 4
    assert cfg.get("nested.inner") == [1]
    assert cfg.sources["x"].startswith("environment")


def test_env_defaults_to_os_environ(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELLTALE__y", "from-env")
    assert resolve(base).get("y") == "from-env"


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError) as info:
        resolve(path, env={})
    assert str(path) in str(info.value) and info.value.line is not None
    assert "malformed YAML" in str(info.value)


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        resolve(path, env={})


def test_malformed_override_value() -> None:
    with pytest.raises(ConfigError, match="malformed YAML"):
        parse_override("x", "[1")


def test_parse_pr_args() -> None:
    text = "/test fine_tuning light\n/var x: [1, 2]\nsome prose\n/var nested.inner: 7\n"
    assert parse_pr_args(text, None) == {"x": [1, 2], "nested.inner": 7}
    with pytest.raises(ConfigError) as info:
        parse_pr_args("ok\n/var novalue\n", None)
    assert info.value.line == 2


def test_vars_file(tmp_path: Path, base: Path) -> None:
    vars_file = tmp_path / "vars.yaml"
    vars_file.write_text("x: 9\nnested.inner: 3\n")
    cfg = resolve(base, overrides=load_vars_file(vars_file), env={})
    assert (cfg.get("x"), cfg.get("nested.inner")) == (9, 3)


def test_get_default_and_missing(base: Path) -> None:
    cfg = resolve(base, env={})
    assert cfg.get("nope", default=None) is None
    with pytest.raises(ConfigError, match="no such key"):
        cfg.get("nested.nope")


def test_get_returns_copies(base: Path) -> None:
    cfg = resolve(base, env={})
    cfg.get("nested")["inner"] = 99
    assert cfg.get("nested.inner") == 1


def test_set_main_thread_only_and_not_after_freeze(base: Path) -> None:
    cfg = resolve(base, env={})
    cfg.set("x", 5)
    assert cfg.get("x") == 5
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            cfg.set("x", 6)
        except ConfigError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])
    cfg.freeze()
    with pytest.raises(ConfigError, match="after freeze"):
        cfg.set("x", 7)
    assert cfg.get("x") == 5


def test_save_writes_three_files_with_secrets_redacted(base: Path, tmp_path: Path) -> None:
    cfg = resolve(base, ["a"], overrides={"y": "over"}, env={})
    out = tmp_path / "out"
    cfg.save(out)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["password"] == "***"
    assert "hunter2" not in (out / "config.yaml").read_text()
    assert (out / "presets_applied").read_text() == "a\nb\n"
    overrides = yaml.safe_load((out / "variable_overrides.yaml").read_text())
    assert overrides == {"y": "over"}
    # a credential never comes as an override (it would reach the Prefect database)
    with pytest.raises(ConfigError, match="names a secret"):
        resolve(base, ["a"], overrides={"password": "s3cr3t"}, env={})


def test_project_config_validates_blocks() -> None:
    cfg = resolve("fine_tuning", ["light"], env={})
    assert cfg.typed is not None
    with pytest.raises(ConfigError) as info:
        resolve("fine_tuning", overrides={"clusters.platform": "moon"}, env={})
    assert "clusters.platform" in str(info.value)
    # library blocks refuse unknown fields, even inside a replaced subtree
    with pytest.raises(ConfigError, match="clusters.create.colour"):
        resolve("fine_tuning", overrides={"clusters.create": {"colour": "red"}}, env={})


def test_project_presets_all_resolve() -> None:
    presets = resolve("fine_tuning", env={}).get("ci_presets")
    for name in ["light", "gpu", "metal", "not_metal", "keep", "single", "fms", "gating",
                 "sweep", "scale_test", "metal_quads"]:
        assert name in presets
        resolve("fine_tuning", [name], env={})


def test_unknown_project() -> None:
    with pytest.raises(ConfigError, match="unknown project 'nope'; available: fine_tuning"):
        resolve("nope", env={})


def test_json_schema_export() -> None:
    schema = json_schema("fine_tuning")
    assert schema["title"] == "FineTuningConfig"  # the engine's wrapper of the test block
    assert "clusters" in schema["properties"]
    assert schema["properties"]["tests"]["$ref"].endswith("/FineTuningTests")


def test_a_project_declares_its_test_block_and_the_engine_builds_the_file_model() -> None:
    from projects.contract import config_model_for, settings_model_of
    from projects.library import EngineConfig

    for name in registry.available():
        project = registry.load(name)
        assert issubclass(project.config_model, EngineConfig)
        assert project.config_model is config_model_for(name, project.test_model)  # once
        assert project.settings_model is settings_model_of(project.test_model)
        tests = project.config_model.model_fields["tests"].annotation
        assert list(tests.model_fields) == [name]


def test_config_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert isinstance(resolve("fine_tuning", env={}), Config)


def test_resolve_once_takes_the_active_config_only_for_the_same_request(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from projects.config import resolve_once, use_config

    monkeypatch.delenv("TELLTALE__x", raising=False)
    first = resolve(base, ["b"], overrides={"x": 3})
    with use_config(first):
        assert resolve_once(base, ["b"], {"x": 3}) is first  # the CLI's, not a second one
        assert resolve_once(base, ["b"], {"x": 4}) is not first
        assert resolve_once(base, [], {"x": 3}) is not first
        monkeypatch.setenv("TELLTALE__x", "5")  # the environment changed since
        assert resolve_once(base, ["b"], {"x": 3}).get("x") == 5
    assert resolve_once(base, ["b"], {"x": 3}) is not first  # none active
