from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.regression import change_points, noise_scale, verdict


def series(levels: list[tuple[float, int]], cv: float = 0.02, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = np.concatenate([np.full(n, level) for level, n in levels])
    return values * (1 + rng.normal(0, cv, len(values)))


@pytest.mark.parametrize("seed", range(5))
def test_known_steps_are_found_exactly(seed: int) -> None:
    values = series([(100, 60), (85, 60), (110, 60)], cv=0.02, seed=seed)
    found = change_points(values, "higher_better")
    assert len(found) == 2
    assert abs(found[0] - 60) <= 2 and abs(found[1] - 120) <= 2


@pytest.mark.parametrize("seed", range(5))
def test_stable_series_has_no_change_point(seed: int) -> None:
    assert change_points(series([(100, 300)], cv=0.05, seed=seed), "lower_better") == []


def test_single_outlier_is_not_a_change_point() -> None:
    values = series([(100, 100)], seed=1)
    values[40] = 180.0
    values[70] = 20.0
    assert change_points(values, "higher_better") == []


def test_slow_drift_is_not_a_change_point() -> None:
    rng = np.random.default_rng(3)
    values = np.linspace(100, 130, 400) * (1 + rng.normal(0, 0.01, 400))
    assert change_points(values, "higher_better") == []


def test_nan_zero_constant_and_short() -> None:
    assert change_points([5.0] * 50, "higher_better") == []
    assert change_points([0.0] * 50, "higher_better") == []
    assert change_points([0.0] * 10 + [1.0] * 10, "higher_better") == [10]
    values = list(series([(100, 30), (70, 30)], seed=2))
    values[5] = math.nan
    values[40] = math.nan
    assert change_points(values, "higher_better") == [30]
    assert change_points([1.0, 2.0], "higher_better") == []
    assert noise_scale([1.0]) == 0.0


def test_direction_is_validated() -> None:
    with pytest.raises(ValueError):
        change_points([1.0] * 10, "sideways")  # type: ignore[arg-type]


def test_verdict_kinds_and_direction() -> None:
    history = list(series([(100, 20)], cv=0.01, seed=4))
    assert verdict(history[:2], 100, "higher_better").kind == "insufficient_history"
    assert verdict(history, [80, 81], "higher_better").kind == "regression"
    assert verdict(history, [80, 81], "lower_better").kind == "improvement"
    assert verdict(history, [120, 121], "higher_better").kind == "improvement"
    assert verdict(history, 100.3, "higher_better").kind == "no_change"
    v = verdict(history, [80, 81], "higher_better")
    assert v.magnitude == pytest.approx(-0.195, abs=0.02)
    assert 0.9 <= v.confidence <= 1 and v.baseline == pytest.approx(100, abs=1)
    assert "baseline" in v.explanation


def test_single_latest_outlier_needs_confirmation() -> None:
    history = list(series([(100, 20)], cv=0.01, seed=5))
    assert verdict(history, 70, "higher_better").kind == "no_change"
    assert verdict(history + [71], 70, "higher_better").kind == "regression"


def test_baseline_is_the_current_level_not_old_history() -> None:
    history = list(series([(100, 30), (80, 30)], cv=0.01, seed=6))
    v = verdict(history, [80.5, 79.8], "higher_better")
    assert v.kind == "no_change" and v.baseline == pytest.approx(80, abs=1)


def test_nan_latest_and_zero_baseline() -> None:
    assert verdict([1.0, 1.0, 1.0], math.nan, "higher_better").kind == "insufficient_history"
    v = verdict([0.0] * 10, [5.0, 5.0], "lower_better")
    assert v.kind == "regression" and v.magnitude == 1.0


def test_deterministic() -> None:
    values = series([(100, 200), (95, 200)], cv=0.03, seed=9)
    assert change_points(values, "higher_better") == change_points(values, "higher_better")
