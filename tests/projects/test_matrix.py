from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=25, deadline=None)
@given(epochs=st.one_of(st.integers(1, 50), st.lists(st.integers(1, 50), min_size=1,
                                                      max_size=3, unique=True)),
       rate=st.sampled_from([1, 0.001, 2e-4]))
def test_cells_keep_the_values_as_written(epochs: object, rate: object) -> None:
    """The typed block validates the matrix, but each cell keeps the values as the config
    wrote them (an int stays an int where the model takes a float): the history keys a
    cell by the hash of exactly those, and a coerced ``1.0`` would start every series anew."""
    import json

    config = resolve("fine_tuning", ["light"], env={}, overrides={
        "tests.fine_tuning.test_settings.hyper_parameters.num_train_epochs": epochs,
        "tests.fine_tuning.test_settings.hyper_parameters.learning_rate": rate})
    cells = cells_of(config, "fine_tuning")
    wanted = epochs if isinstance(epochs, list) else [epochs]
    assert [c.settings["hyper_parameters"]["num_train_epochs"] for c in cells] == wanted
    assert all(json.dumps(c.settings["hyper_parameters"]["learning_rate"]) == json.dumps(rate)
               for c in cells)
