from __future__ import annotations

import pytest

from projects.config import ConfigError, resolve
from projects.matrix import expand
from projects.plan import cells_of


def test_cartesian_product_in_key_order() -> None:
    cells = expand({"a": [1, 2], "b": "x", "c": [3, 4]})
    assert [c.name for c in cells] == ["a=1,c=3", "a=1,c=4", "a=2,c=3", "a=2,c=4"]
    assert all(not isinstance(v, list) for c in cells for v in c.settings.values())


def test_raw_lists_stay_lists() -> None:
    cells = expand({"hp": {"raw_lists": ["mods"], "mods": ["q", "v"], "lr": [1, 2]}})
    assert len(cells) == 2
    assert cells[0].settings["hp"] == {"mods": ["q", "v"], "lr": 1}


def test_extra_settings_groups_merge_over_base() -> None:
    cells = expand({"a": 1, "hp": {"m": "lora", "r": [4, 8]}},
                   [{"hp.m": "lora"}, {"hp.m": "none", "a": 2}])
    assert len(cells) == 4
    assert [c.group for c in cells] == [0, 0, 1, 1]
    assert cells[2].settings == {"a": 2, "hp": {"m": "none", "r": 4}}


def test_extra_settings_unknown_key() -> None:
    with pytest.raises(ConfigError, match=r"test_extra_settings\[0\]: unknown setting 'nope'"):
        expand({"a": 1}, [{"nope": 1}])


def test_skip_if_marks_cells() -> None:
    cells = expand({"a": [1, 2], "hp": {"b": [3, 4]}}, skip_if=[{"a": 2, "hp.b": 3}])
    reasons = [c.skip_reason for c in cells]
    assert reasons == [None, None, "skip_if[0]: a=2, hp.b=3", None]


def test_empty_dimension_is_an_error() -> None:
    with pytest.raises(ConfigError, match="empty list"):
        expand({"a": []})


def test_sweep_preset_expands() -> None:
    cells = cells_of(resolve("fine_tuning", ["sweep"], env={}), "fine_tuning")
    assert len(cells) == 4
    assert sum(c.skip_reason is not None for c in cells) == 1
