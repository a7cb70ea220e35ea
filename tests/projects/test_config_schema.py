"""The model is the schema (#42): config files hold what differs, every declared key is
settable, an undeclared one is refused with the model's keys, and no cell changed.

``tests/data/preset_cells.json`` was written by the code *before* the files lost their
defaults and placeholders (commit 79165f4): each project's cells for the base and every
preset, as (name, canonical settings, skip reason). The same presets must plan the same
cells now, so every history keeps matching and a resumed run finds its cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from core.errors import ConfigError
from core.yamlio import load_yaml
from projects import registry, schema
from projects.config import resolve
from projects.matrix import canonical_settings
from projects.plan import cells_of

BEFORE = json.loads((Path(__file__).resolve().parents[1] / "data" /
                     "preset_cells.json").read_text())


def _planned(project: str, preset: str | None) -> list[list[Any]]:
    config = resolve(project, [preset] if preset else [], env={})
    return [[c.name, json.dumps(canonical_settings(c.settings), sort_keys=True, default=str),
             c.skip_reason] for c in cells_of(config, project)]


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_every_preset_plans_the_cells_it_planned_before(case: str) -> None:
    project, preset = case.split("/")
    assert project in registry.available()
    assert _planned(project, None if preset == "(base)" else preset) == BEFORE[case]


def test_every_preset_of_the_shipped_projects_is_in_the_record() -> None:
    """A preset added later has no 'before'; the record covers the presets it was made from
    (a project or preset removed would leave a case that fails above)."""
    for project in {case.split("/")[0] for case in BEFORE}:
        presets = {case.split("/")[1] for case in BEFORE if case.startswith(project + "/")}
        assert "(base)" in presets and len(presets) > 3


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _redundant(model: type[BaseModel], node: dict[str, Any], parts: list[str]) -> list[str]:
    """Keys of a config file whose value is a null placeholder or the model's default."""
    out = []
    for key, value in node.items():
        path = [*parts, str(key)]
        level = schema.level_at(model, path)
        if value is None:
            out.append(".".join(path) + " (null)")
            continue
        default = schema.default_of(level.field) if level.field is not None \
            else schema.NO_DEFAULT
        if default is not schema.NO_DEFAULT and _same(value, default):
            out.append(".".join(path) + f" (= the default {value!r})")
        elif isinstance(value, dict) and (level.model is not None or level.free):
            out += _redundant(model, value, path)
    return out


@pytest.mark.parametrize("project", registry.available())
def test_config_files_hold_only_what_differs_from_the_model(project: str) -> None:
    data, _ = load_yaml(registry.project_dir(project) / "config.yaml")
    data.pop("ci_presets", None)  # presets are changes by definition
    assert _redundant(registry.config_model(project), data, []) == []


def test_the_scaffold_config_is_short() -> None:
    template = Path(__file__).resolve().parents[2] / "flows" / "scaffold" / "config.yaml.tmpl"
    assert len(template.read_text().splitlines()) <= 60


def _declared_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key a model declares through its blocks (free mappings not entered)."""
    out = []
    for name in model.model_fields:
        path = f"{prefix}{name}"
        out.append(path)
        level = schema.level_at(model, [name])
        if level.model is not None:
            out += _declared_paths(level.model, f"{path}.")
    return out


def _value_at(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


@pytest.mark.parametrize("project", registry.available())
def test_every_key_the_model_declares_can_be_set(project: str) -> None:
    """No placeholder needed: a key the file never names is set by an override; the only
    refusal left is a setting of a feature that is off (it would do nothing)."""
    base = resolve(project, env={}).as_dict()
    for path in _declared_paths(registry.config_model(project)):
        value = _value_at(base, path)
        if value is None or path == "ci_presets" or path.endswith(".enabled"):
            continue
        try:
            resolve(project, overrides={path: value}, env={})
        except ConfigError as exc:
            assert "enabled is false" in str(exc), (path, str(exc))


def test_a_key_absent_from_the_file_is_set_like_any_other() -> None:
    data, _ = load_yaml(registry.project_dir("fine_tuning") / "config.yaml")
    assert "clusters" not in data  # the file restates no engine default
    config = resolve("fine_tuning", overrides={
        "clusters.cleanup_on_exit": False,
        "tests.fine_tuning.test_settings.hyper_parameters.warmup_ratio": 0.1}, env={})
    assert config.model.clusters.cleanup_on_exit is False
    assert config.get("tests.fine_tuning.test_settings.hyper_parameters.warmup_ratio") == 0.1


_NAME = st.from_regex(r"[a-z][a-z_]{0,14}", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(project=st.sampled_from(registry.available()), data=st.data(), bad=_NAME)
def test_an_undeclared_key_is_refused_with_the_models_keys(project: str, data: st.DataObject,
                                                           bad: str) -> None:
    model = registry.config_model(project)
    paths = [p for p in _declared_paths(model) if schema.level_at(model, p.split(".")).model]
    parent = data.draw(st.sampled_from(paths))
    keys = schema.level_at(model, parent.split(".")).keys
    if bad in keys:
        return
    with pytest.raises(ConfigError) as info:
        resolve(project, overrides={f"{parent}.{bad}": 1}, env={})
    message = str(info.value)
    assert "unknown key" in message and f"no {bad!r} under {parent}" in message
    named = [k for k in keys if k in message]
    assert named or f"{len(keys)} keys exist" in message, message


def test_the_closest_keys_come_from_the_model_not_the_file() -> None:
    with pytest.raises(ConfigError, match="closest: warmup_ratio"):
        resolve("fine_tuning", overrides={
            "tests.fine_tuning.test_settings.hyper_parameters.warmup_rati": 0.1}, env={})


def test_no_key_below_a_leaf() -> None:
    with pytest.raises(ConfigError, match="'clusters.keep' is a bool, not a mapping"):
        resolve("fine_tuning", overrides={"clusters.keep.deeper": 1}, env={})
    with pytest.raises(ConfigError, match="clusters.kubeconfig has no keys below it"):
        resolve("fine_tuning", overrides={"clusters.kubeconfig.deeper": 1}, env={})


def test_a_block_that_is_off_takes_its_first_key() -> None:
    """``taint`` is None until set: its keys exist (the model declares them)."""
    config = resolve("fine_tuning", overrides={
        "clusters.sutest.compute.machineset.enabled": True,
        "clusters.sutest.compute.machineset.taint.value": "sutest"}, env={})
    taint = config.model.clusters.sutest.compute.machineset.taint
    assert taint is not None and taint.value == "sutest"
