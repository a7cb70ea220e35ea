"""`analysis.construct.constructor` makes the same objects as ``model_construct``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from analysis.construct import constructor
from analysis.kpi import Kpi
from analysis.lts import LtsKpi
from analysis.pipeline import VerdictRow

VALUES = {
    Kpi: {"name": "train_tokens_per_second", "value": 1.5, "unit": "tokens/s", "help": "h",
          "lower_better": False, "ignored_for_regression": False, "format": "{:.1f}",
          "labels": {"model": "m"}},
    LtsKpi: {"value": 1.5, "unit": "s", "help": "h", "lower_better": True,
             "ignored_for_regression": True, "labels": {"a": "b"}},
    VerdictRow: {"run_uuid": "r", "test_path": "p", "cell": "base", "kpi": "k", "unit": "s",
                 "latest": 2.0,
                 "repeats": [2.0], "baseline": 1.0, "change_pct": 100.0,
                 "verdict": "regression", "confidence": 0.9, "suspect": False,
                 "history_used": 5, "explanation": "since run 3, +100 %",
                 "validity": "valid", "since_runs": 2, "what_changed": ["torch 1 → 2"],
                 "suspects": ["cpu +5%"], "mde_pct": 3.5},
}


@pytest.mark.parametrize("model", list(VALUES), ids=lambda m: m.__name__)
def test_same_object_as_model_construct(model: type[BaseModel]) -> None:
    values = VALUES[model]
    assert set(values) == set(model.model_fields)  # the test covers every field
    fast, slow = constructor(model)(**values), model.model_construct(**values)
    assert fast == slow and type(fast) is model
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_copy(update={"unit": "x"}).unit == "x"
    assert model.model_validate(fast.model_dump()) == fast  # the values are valid as given


def test_a_missing_or_unknown_field_is_refused() -> None:
    make = constructor(LtsKpi)
    partial = {k: v for k, v in VALUES[LtsKpi].items() if k != "labels"}
    with pytest.raises(TypeError, match="missing \\['labels'\\]"):
        make(**partial)
    with pytest.raises(TypeError, match="unknown \\['extra'\\]"):
        make(**VALUES[LtsKpi], extra=1)


def test_a_model_with_aliases_gets_model_construct() -> None:
    class Aliased(BaseModel):
        value: int = Field(alias="v")

    made = constructor(Aliased)(v=3)
    assert made.value == 3 and made == Aliased.model_construct(v=3)


@pytest.mark.parametrize(("history", "latest"), [
    ([], 5.0), ([1.0, 2.0], [3.0, 4.0, 6.0]), ([1.0], [float("nan")]), ([], [float("inf")]),
    ([1, 2], 7),
])
def test_a_constructed_insufficient_history_verdict_is_the_validated_one(
        history: list[float], latest: float | list[float]) -> None:
    """`regression.verdict` constructs the verdict of a short history: the same object,
    field by field and as JSON, as validation makes of the same values."""
    from analysis.regression import Verdict, verdict

    made = verdict(history, latest, "higher_better")
    assert made.kind == "insufficient_history"
    validated = Verdict.model_validate(made.model_dump())
    assert made == validated
    assert made.model_dump_json() == validated.model_dump_json()
    assert {type(v) for v in (made.magnitude, made.confidence)} == {float}
    assert type(made.history_used) is int
    assert made.latest is None or type(made.latest) is float
