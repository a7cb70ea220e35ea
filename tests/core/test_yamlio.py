"""The one YAML loader: depth, aliases and size bounded, every error one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError
from core.yamlio import MAX_UNTRUSTED_YAML, MAX_YAML_DEPTH, load_yaml, load_yaml_text


def _block_nesting(depth: int) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + f"{'  ' * depth}leaf: 1\n"


@pytest.mark.parametrize("text", [
    _block_nesting(300),                      # block mappings (the 46 KB example)
    "".join(f"{'  ' * i}-\n" for i in range(300)) + "  " * 300 + "- 1\n",  # block sequences
    "[" * 5000 + "]" * 5000,                  # flow sequences
    "{a: " * 3000 + "1" + "}" * 3000,         # flow mappings
])
@pytest.mark.parametrize("untrusted", [True, False])
def test_deep_yaml_is_one_line_error_not_a_recursion(text: str, untrusted: bool) -> None:
    with pytest.raises(ConfigError, match="deeper than") as info:
        load_yaml_text(text[:MAX_UNTRUSTED_YAML], source="x.yaml", untrusted=untrusted)
    assert "\n" not in str(info.value) and info.value.line is not None


def test_depth_at_the_limit_loads() -> None:
    data, _ = load_yaml_text(_block_nesting(MAX_YAML_DEPTH - 1), untrusted=True)
    assert data["k0"]["k1"] is not None


@given(depth=st.integers(min_value=1, max_value=3 * MAX_YAML_DEPTH),
       style=st.sampled_from(["block", "flow-seq", "flow-map"]))
def test_any_depth_either_loads_or_is_refused_in_one_line(depth: int, style: str) -> None:
    text = {"block": _block_nesting(depth - 1), "flow-seq": "[" * depth + "]" * depth,
            "flow-map": "{a: " * depth + "1" + "}" * depth}[style]
    try:
        load_yaml_text(text, untrusted=True)
        assert depth <= MAX_YAML_DEPTH
    except ConfigError as exc:
        assert depth > MAX_YAML_DEPTH and "\n" not in str(exc)


@given(text=st.text(max_size=300))
def test_random_text_never_escapes_as_another_error(text: str) -> None:
    try:
        load_yaml_text(text, untrusted=True)
    except ConfigError as exc:
        assert "\n" not in str(exc)


@given(data=st.recursive(st.one_of(st.none(), st.booleans(), st.integers(),
                                   st.text(max_size=20)),
                         lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                 st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4)),
                         max_leaves=20))
def test_what_yaml_writes_reads_back(data: object) -> None:
    text = yaml.safe_dump(data)
    assert load_yaml_text(text, untrusted=True)[0] == data


@pytest.mark.parametrize("text", ["a: &x 1\nb: *x\n", "- &x [1]\n- *x\n", "a: &x {b: 1}\n"])
def test_aliases_and_anchors_are_refused_in_untrusted_text(text: str) -> None:
    with pytest.raises(ConfigError, match="anchors"):
        load_yaml_text(text, untrusted=True)
    load_yaml_text(text, untrusted=False)  # a project's own config may use them


@pytest.mark.parametrize("text", ["t: 99999-01-01\n", "a: !!python/object:os.system x\n",
                                  "a: !!binary 'x'\n", "d: 2001-02-30\n"])
def test_constructor_errors_are_config_errors(text: str) -> None:
    try:
        load_yaml_text(text, untrusted=True)
    except ConfigError as exc:
        assert "\n" not in str(exc)


def test_files_are_read_bounded(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_yaml(fifo, untrusted=True)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (MAX_UNTRUSTED_YAML * 4 + 10) + "\n")
    with pytest.raises(ConfigError, match="over the"):
        load_yaml(big, untrusted=True)
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "real.yaml")
    (tmp_path / "real.yaml").write_text("a: 1\n")
    assert load_yaml(link)[0] == {"a": 1}
    with pytest.raises(ConfigError, match="symbolic link"):
        load_yaml(link, follow_links=False)


@given(word=st.sampled_from(["y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on",
                             "On", "ON", "off", "Off", "OFF"]),
       where=st.sampled_from(["{}", "key: {}", "- {}", "a: {{b: [{}]}}"]))
def test_yaml_11_booleans_stay_words(word: str, where: str) -> None:
    """--var x=off, a label 'NO', a mode 'on': words, as YAML 1.2 reads them."""
    value, _ = load_yaml_text(where.format(word))
    assert word in repr(value) and "True" not in repr(value) and "False" not in repr(value)


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("False", False),
                                                ("TRUE", True), ("k: false", {"k": False})])
def test_true_and_false_are_still_booleans(text: str, expected: object) -> None:
    assert load_yaml_text(text)[0] == expected


def test_off_reaches_a_literal_setting_through_var() -> None:
    """The example that found it: ``--var analysis.validity.mode=off`` was refused."""
    from projects.config import parse_override, resolve

    value = parse_override("analysis.validity.mode", "off")
    config = resolve("fine_tuning", ["light"], overrides={"analysis.validity.mode": value},
                     env={})
    assert config.model.analysis.validity.mode == "off"
