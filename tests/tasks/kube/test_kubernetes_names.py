"""Every Kubernetes name the config can set is typed: a non-name is refused, never applied.

The class, not the example: every text setting of every registered project's config model
(the engine's blocks and the project's own) is set in turn to a value no Kubernetes name
accepts. Either the config refuses it (a user error, exit 2 before anything runs) or the
value appears in no name field of any manifest a kubernetes plan writes — for every preset.
A new text setting that reaches a name untyped fails here.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from core.errors import ConfigError
from core.yamlio import load_yaml
from projects import registry
from projects.config import resolve
from tasks.platforms.plan import plan_run
from tests.tasks.kube.test_upstream_manifests import CLUSTER_VARS, COMPUTE_VARS, _presets

# under 8 characters, so a text field named like a secret never registers it as one (a
# registered secret is masked in every file written, and would hide the leak)
BAD = "Bad_N.{}"
# keys whose values Kubernetes resolves as object names
NAME_KEYS = {"name", "namespace", "claimName", "storageClassName", "serviceAccountName",
             "secretName", "startingCSV", "source", "sourceNamespace", "configMap",
             "priorityClassName", "runtimeClassName", "schedulerName", "nodeName",
             "targetNamespaces", "from"}


def _is_text(annotation: Any) -> bool:
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_text(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_text(a) for a in typing.get_args(annotation) if a is not type(None))
    return False


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def text_settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of every text field (a str, or a union holding one) below ``model``."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        if _is_text(field.annotation):
            out.append(path)
        for sub in _models(field.annotation):
            out += text_settings(sub, f"{path}.")
    return out


def _planned(name: str, presets: list[str], where: Path,
             overrides: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The manifests of a kubernetes plan; None when the config or the plan refuses it."""
    try:
        config = resolve(name, presets, overrides={**CLUSTER_VARS.get(name, {}), **overrides},
                         env={})
        plan_run(registry.load(name), config, "kubernetes", where)
    except (ConfigError, ValueError):
        return None
    return [load_yaml(f)[0] for f in sorted((where / "manifests").rglob("*.yaml"))]


def _names_in(value: Any, key: str | None = None) -> list[str]:
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in _names_in(v, k)]
    if isinstance(value, list):
        return [n for v in value for n in _names_in(v, key)]
    return [value] if key in NAME_KEYS and isinstance(value, str) else []


@pytest.mark.parametrize("name", registry.available())
def test_no_text_setting_reaches_a_manifest_name_untyped(name: str, tmp_path: Path) -> None:
    model = registry.config_model(name)
    assert model is not None
    settings = text_settings(model)
    assert len(settings) > 20, settings  # the walk sees the engine's blocks and the project's
    # the base and the preset whose cluster plan writes the most manifests (nodes of their
    # own and a PR image too); every preset, each on its own, cost minutes for no other leak
    sizes = {tuple(p): len(_planned(name, p, tmp_path / "probe" / "+".join(p or ["base"]),
                                    COMPUTE_VARS) or []) for p in _presets(name)}
    presets = [[], list(max(sizes, key=lambda p: sizes[p]))]
    assert sizes[tuple(presets[1])] > 5, sizes
    leaks = []
    for number, path in enumerate(settings):
        bad = BAD.format(number)
        for preset in presets:
            manifests = _planned(name, preset, tmp_path / path / "+".join(preset or ["base"]),
                                 {**COMPUTE_VARS, path: bad})
            if manifests is None:
                break  # refused: the type holds it, in every preset alike
            if any(bad in n for m in manifests for n in _names_in(m)):
                leaks.append(f"{path} ({'+'.join(preset) or 'base'})")
                break
    assert not leaks, f"untyped settings that reach a Kubernetes name: {leaks}"
