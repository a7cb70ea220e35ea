"""Untrusted overrides (PR comments, deployment forms): one schema, every project, any input."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from core.errors import ConfigError, UserError
from core.strict import StrictSettings
from projects import registry
from projects.config import resolve
from projects.plan import cells_of
from projects.untrusted import (
    MAX_PR_COMMENT,
    UntrustedPolicy,
    check_untrusted,
    parse_pr_args,
    policy_for,
)

PROJECTS = registry.available()  # a new project is probed like the others
# Each project's light preset when it has one (a scaffolded project may not): derived, never
# listed by hand, or a new project fails here only when hypothesis happens to draw it.
BASE = {p: ["light"] if "light" in (resolve(p, env={}).get("ci_presets") or {}) else []
        for p in PROJECTS}


def _comment(key: str, value_text: str) -> str:
    return f"/test something\nLooks good.\n/var {key}: {value_text}\n"


# -- the examples of the issue, and their class ------------------------------------------------

@pytest.mark.parametrize(("project", "key", "value", "words"), [
    # a mapping carrying keys nobody declared (where the trainer reads and writes)
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters",
     {"training_data_path": "/etc/passwd", "output_dir": "/tmp/out", "learning_rate": 0.002},
     "not a declared setting"),
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters",
     {"logging_dir": "/tmp/x"}, "not a declared setting"),
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters",
     {"r": 4, "deepspeed": "/etc/ds.json"}, "not a declared setting"),
    # images, wherever they sit
    ("fine_tuning", "tests.fine_tuning.test_settings.container_image", "evil.example/pwn",
     "image registry"),
    ("fine_tuning", "tests.fine_tuning.test_settings.container_image",
     ["quay.io/modh/fms-hf-tuning:v2.2.1", "evil.example/pwn"], "image registry"),
    ("fine_tuning", "tests.fine_tuning.test_extra_settings",
     [{"container_image": "docker.io/x"}], "image registry"),
    ("llm_serving", "tests.llm_serving.test_extra_settings",
     [{"runtime_image": "evil.example/x", "loadgen_image": "evil.example/y"}],
     "image registry"),
    # groups naming undeclared settings, or free mappings
    ("fine_tuning", "tests.fine_tuning.test_extra_settings",
     [{"hyper_parameters.output_dir": "/tmp/x"}], "not a declared setting"),
    ("fine_tuning", "tests.fine_tuning.skip_if", [{"nope": 1}], "not a declared setting"),
    ("fine_tuning", "tests.fine_tuning.test_extra_settings", ["just text"], "mapping"),
    # text with terminal escapes, bidi overrides; too long; too many values
    ("fine_tuning", "tests.fine_tuning.test_settings.name", "ok\x1b[2Jgone", "U+001B"),
    ("fine_tuning", "tests.fine_tuning.test_settings.name", "a\u202eb", "U+202E"),
    ("fine_tuning", "tests.fine_tuning.test_settings.name", "x" * 300, "characters"),
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters.r",
     list(range(1, 100)), "values"),
    # numbers that are not finite
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters.learning_rate",
     math.inf, "finite"),
    ("llm_serving", "tests.llm_serving.test_settings.concurrency", math.nan, "finite"),
])
def test_untrusted_values_are_refused_by_class(project: str, key: str, value: Any,
                                               words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)) as info:
        check_untrusted(key, value, policy_for(project), source="PR comment", line=3)
    assert info.value.line == 3 and "\n" not in str(info.value)


@pytest.mark.parametrize(("project", "key", "value"), [
    # names, not paths: refused by the project's strict model after the policy
    ("fine_tuning", "tests.fine_tuning.test_settings.dataset_name", "../../../../etc/passwd"),
    ("fine_tuning", "tests.fine_tuning.test_settings.dataset_name", "/etc/passwd"),
    ("fine_tuning", "tests.fine_tuning.test_settings.model_name", "a/../../b"),
    ("llm_serving", "tests.llm_serving.test_settings.model_name", "./x"),
    # bools are not numbers, huge numbers are out of bounds
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters.r", True),
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters.r", 10**20),
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters.max_seq_length", 10**10),
    ("fine_tuning", "tests.fine_tuning.test_settings.dataset_replication", 10**9),
    ("fine_tuning", "tests.fine_tuning.test_settings.hyper_parameters.num_train_epochs", 1e300),
    ("llm_serving", "tests.llm_serving.test_settings.duration_s", 2.5),
])
def test_values_the_policy_passes_are_typed_by_the_strict_model(project: str, key: str,
                                                                 value: Any) -> None:
    with pytest.raises(ConfigError):
        check_untrusted(key, value, policy_for(project), source="PR comment")
        resolve(project, presets=BASE[project], overrides={key: value}, env={})


def test_keys_outside_the_allow_list_are_refused_even_when_declared() -> None:
    policy = policy_for("fine_tuning")
    for key in ("export_artifacts.s3.endpoint_url", "analysis.history_uri",
                "tests.fine_tuning.multi_user.user_count", "pr_comment.allowed_keys",
                "pr_comment.image_registries", "matrix.max_cells"):
        with pytest.raises(ConfigError, match="may not set"):
            check_untrusted(key, "x", policy, source="PR comment")


def test_an_allowed_registry_admits_its_images_only() -> None:
    policy = UntrustedPolicy(keys=("tests.fine_tuning.test_settings.*",),
                             image_registries=("quay.io",),
                             model=registry.config_model("fine_tuning"))
    key = "tests.fine_tuning.test_settings.container_image"
    check_untrusted(key, "quay.io/modh/fms-hf-tuning:v2.3", policy, source="PR comment")
    for other in ("quay.io.evil.example/x", "docker.io/quay.io/x", "evil.example:443/quay.io"):
        with pytest.raises(ConfigError, match="image registry"):
            check_untrusted(key, other, policy, source="PR comment")


def test_the_comment_size_is_capped() -> None:
    with pytest.raises(ConfigError, match="over the"):
        parse_pr_args("x" * (MAX_PR_COMMENT + 1), policy_for("fine_tuning"))


def test_a_good_comment_still_works() -> None:
    policy = policy_for("fine_tuning")
    text = ("/var tests.fine_tuning.test_settings.hyper_parameters.learning_rate: [0.001, 0.002]"
            "\n/var tests.fine_tuning.test_extra_settings: [{hyper_parameters.peft_method: none}]"
            "\n/var tests.fine_tuning.skip_if: [{hyper_parameters.learning_rate: 0.002}]\n")
    overrides = parse_pr_args(text, policy)
    config = resolve("fine_tuning", presets=["light"], overrides=overrides, env={})
    assert len(cells_of(config, "fine_tuning")) == 2


# -- generated inputs -----------------------------------------------------------------------

def _declared_paths(model: type[BaseModel], prefix: str = "", depth: int = 0) -> list[str]:
    from projects.schema import models_in as _models_in

    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        inner = _models_in(info.annotation)
        if inner and depth < 6:
            out += _declared_paths(inner[0], f"{path}.", depth + 1)
    return out


_PATHS = {p: _declared_paths(registry.config_model(p)) for p in PROJECTS}

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["../../etc/passwd", "/etc/shadow", "evil.example/pwn", "quay.io/x:1",
                     "\x1b[2J", "\u202e", "a b c", "UPPER", "x" * 300, "0", "1e400"]),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5),
    st.dictionaries(st.one_of(st.text(max_size=12), st.sampled_from(
        ["output_dir", "training_data_path", "learning_rate", "r", "name", "container_image",
         "hyper_parameters.r", "hyper_parameters.output_dir", "dataset_name"])),
        inner, max_size=4)), max_leaves=12)
_raw_texts = st.sampled_from([
    ".inf", "-.inf", ".nan", "1e400", "true", "~", "&a [1, 2]", "{a: &x 1, b: *x}",
    "!!python/object/apply:os.system [id]", "[" * 200 + "]" * 200, "{a: {b: {c: {d: 1}}}}",
    "'unterminated", "[1, 2", "0x10", "0o17", "2001-01-01", "9999-12-31T23:59:59Z", "",
])


def _check_cells(project: str, config: Any) -> None:
    """What reached the cells is typed: names, declared keys, the base images, finite."""
    hooks = registry.load(project)
    base = resolve(project, presets=BASE[project], env={})
    base_images = {json.dumps(v) for k, v in _flat(base.get(f"tests.{project}.test_settings"))
                   if k.endswith("image")}
    for cell in cells_of(config, project):
        settings = hooks.settings_model.model_validate(cell.settings)
        for key, value in _flat(settings.model_dump()):
            if isinstance(value, float):
                assert math.isfinite(value)
            if key.endswith("image"):
                assert json.dumps(value) in base_images
            if key in ("dataset_name", "model_name"):
                assert not value.startswith("/") and ".." not in value.split("/")


def _flat(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [kv for k, v in data.items() for kv in _flat(v, f"{prefix}{k}.")]
    return [(prefix.rstrip(".").rsplit(".", 1)[-1], data)]


@given(project=st.sampled_from(PROJECTS), data=st.data(), value=_values,
       raw=st.one_of(st.none(), _raw_texts))
def test_generated_pr_comments_never_reach_a_cell_unvalidated(project: str, data: Any,
                                                              value: Any,
                                                              raw: str | None) -> None:
    key = data.draw(st.one_of(st.sampled_from(_PATHS[project]),
                              st.text(alphabet="abcdefgh._", min_size=1, max_size=20)))
    text = raw if raw is not None else json.dumps(value, allow_nan=True)
    try:
        overrides = parse_pr_args(_comment(key, text), policy_for(project))
        config = resolve(project, presets=BASE[project], overrides=overrides, env={})
        _check_cells(project, config)
    except UserError as exc:  # refused: one line, never a traceback
        assert "\n" not in str(exc)


def test_every_config_model_is_strict() -> None:
    for project in PROJECTS:
        for model in _all_models(registry.config_model(project)):
            assert issubclass(model, StrictSettings), model


def _all_models(model: type[BaseModel], seen: set[type] | None = None) -> set[type[BaseModel]]:
    from projects.schema import models_in as _models_in

    seen = seen if seen is not None else set()
    if model in seen:
        return seen
    seen.add(model)
    for info in model.model_fields.values():
        for inner in _models_in(info.annotation):
            _all_models(inner, seen)
    return seen


def _numeric_leaves(annotation: Any, metadata: list[Any]) -> list[tuple[type, list[Any]]]:
    """(int or float, the constraints that apply to it) for every number an annotation admits."""
    import typing

    if annotation in (int, float):
        return [(annotation, list(metadata))]
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric_leaves(typing.get_args(annotation)[0],
                               [*metadata, *annotation.__metadata__])
    return [leaf for arg in typing.get_args(annotation)
            for leaf in _numeric_leaves(arg, metadata)]


def _bounded(constraints: list[Any]) -> tuple[bool, bool]:
    import annotated_types as at

    flat = []
    for item in constraints:
        flat += list(getattr(item, "metadata", [])) or [item]
    return (any(isinstance(c, at.Ge | at.Gt) for c in flat),
            any(isinstance(c, at.Le | at.Lt) for c in flat))


def test_every_number_a_config_takes_is_bounded_and_every_image_is_an_image_ref() -> None:
    from core.strict import kinds_of
    from projects.schema import models_in as _models_in

    missing = []
    for project in PROJECTS:
        for model in _all_models(registry.config_model(project)):
            for name, info in model.model_fields.items():
                for kind, constraints in _numeric_leaves(info.annotation, info.metadata):
                    low, high = _bounded(constraints)
                    if not (low and high):
                        missing.append(f"{model.__name__}.{name} ({kind.__name__})")
                # a value naming an image (a block such as image_build holds none itself)
                if "image" in name and not name.endswith(("_minutes", "_registries")) \
                        and not list(_models_in(info.annotation)):
                    text = repr(info.annotation) + repr(info.metadata)
                    if "image" not in kinds_of(info.metadata) and "<image>" not in text:
                        missing.append(f"{model.__name__}.{name} is not an ImageRef")
    assert missing == []


def test_no_config_field_shadows_a_mapping_method() -> None:
    # Prefect walks task parameters with dict(model): a field named "keys" made it call a
    # list, and every run's first task failed with "'list' object is not callable"
    shadowing = {"keys", "items", "values", "get", "copy", "update", "pop"}
    for project in PROJECTS:
        for model in _all_models(registry.config_model(project)):
            assert not shadowing & set(model.model_fields), model


@pytest.mark.parametrize(("key", "value"), [
    ("clusters.sutest.lab.filters", {"hf_token": "abcd-secret"}),
    ("clusters.sutest.lab.filters", {"X-Api-Key": "abcd-secret"}),  # kebab, camel: one class
    ("clusters.sutest.lab.filters", {"hf-token": "abcd-secret"}),
    ("clusters.sutest.lab.filters", {"accessToken": "abcd-secret"}),
    ("clusters.sutest.lab.filters", {"nested": {"api_key": "abcd-secret"}}),
    ("prepare.gpu_operator.tolerations", [{"password": "abcd-secret"}]),
])
def test_a_secret_never_comes_as_an_override(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match="names a secret") as info:
        resolve("fine_tuning", presets=["light"], overrides={key: value}, env={})
    assert "abcd-secret" not in str(info.value)


def test_secret_references_may_be_overridden_and_url_passwords_may_not(
        tmp_path: Any) -> None:
    from core.redact import known_secrets
    from core.safeio import write_text

    config = resolve("fine_tuning", presets=["light"], overrides={
        "secrets.s3_credentials": "other.env"}, env={})
    assert config.get("secrets.s3_credentials") == "other.env"
    with pytest.raises(ConfigError, match="a credential inside a value") as info:
        resolve("fine_tuning", presets=["light"], overrides={
            "export_artifacts.s3.endpoint_url": "https://u:Url-pw-123@s3.example.com"}, env={})
    assert "Url-pw-123" not in str(info.value)
    for url in ("https://s3.example.com/b?access_token=Tok-query-123",  # other shapes too
                "https://s3.example.com/b#X-Api-Key=Tok-fragment-123",
                "https://Tok-userinfo-123@s3.example.com"):
        with pytest.raises(ConfigError, match="a credential inside a value") as info:
            resolve("fine_tuning", presets=["light"], overrides={
                "export_artifacts.s3.endpoint_url": url}, env={})
        assert "Tok-" not in str(info.value)
    assert "Url-pw-123" in known_secrets()  # and masked wherever it would be written
    write_text(tmp_path / "log.txt", "connecting with Url-pw-123 now")
    assert (tmp_path / "log.txt").read_text() == "connecting with *** now"


def test_a_data_name_never_resolves_outside_the_data_dir(tmp_path: Any) -> None:
    from projects.library.data import data_file

    data = tmp_path / "data"
    data.mkdir()
    (data / "ok.jsonl").write_text("{}\n")
    (tmp_path / "secret.txt").write_text("x")
    (data / "link.jsonl").symlink_to(tmp_path / "secret.txt")
    assert data_file(data, "ok.jsonl", key="k") == (data / "ok.jsonl").resolve()
    for name in ("link.jsonl", "../secret.txt", "missing.jsonl", str(tmp_path / "secret.txt")):
        with pytest.raises(ConfigError):
            data_file(data, name, key="k")


def test_a_deep_form_value_is_refused_not_a_recursion_error() -> None:
    value: Any = 1
    for _ in range(5000):
        value = [value]
    with pytest.raises(ConfigError, match="deeper than"):
        check_untrusted("tests.fine_tuning.test_settings.hyper_parameters.r", value,
                        policy_for("fine_tuning"), source="deployment form")
    nested: Any = {"r": 1}
    for _ in range(5000):
        nested = {"hyper_parameters": nested}
    with pytest.raises(ConfigError):
        check_untrusted("tests.fine_tuning.test_settings", nested,
                        policy_for("fine_tuning"), source="deployment form")
