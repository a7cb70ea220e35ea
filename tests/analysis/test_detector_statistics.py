"""The detector's small statistics are numpy's own, to the last bit.

`analysis.detector` computes means, medians, the winsorised standard deviation and the 5-run
outlier shield without numpy's call overhead (they run thousands of times a series); these
properties hold them to numpy's reference formulas on generated arrays, so a verdict or a
change point never moves because a statistic was computed faster.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from analysis.detector import _shield, _trimmed_mean, _winsorised_std, mean_of, median_of

# finite values of every scale the detector meets (logs of KPIs, raw values, rounding dust)
_VALUES = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0.0, 1.0, -1.0, 1e-12, 100.0]),
)


def _series(min_size: int = 1, max_size: int = 300) -> st.SearchStrategy[np.ndarray]:
    return arrays(np.float64, st.integers(min_size, max_size), elements=_VALUES)


@settings(max_examples=400, deadline=None)
@given(_series())
def test_mean_of_is_numpys_mean(x: np.ndarray) -> None:
    assert mean_of(x) == float(np.mean(x))


@settings(max_examples=400, deadline=None)
@given(_series())
def test_median_of_is_numpys_median(x: np.ndarray) -> None:
    before = x.copy()
    assert median_of(x) == float(np.median(x))
    assert np.array_equal(x, before)  # the caller's array is left as it was


def test_median_of_an_empty_array_is_nan_like_numpys() -> None:
    assert np.isnan(median_of(np.array([])))


@settings(max_examples=400, deadline=None)
@given(_series())
def test_winsorised_std_is_numpys_quantile_clip_and_std(x: np.ndarray) -> None:
    lo, hi = np.quantile(x, [0.05, 0.95])
    assert _winsorised_std(x) == float(np.std(np.clip(x, lo, hi)))


@settings(max_examples=300, deadline=None)
@given(_series(), st.floats(0.2, 0.3))
def test_trimmed_mean_is_the_mean_of_the_middle(x: np.ndarray, trim: float) -> None:
    n = len(x)
    k = int(n * trim)
    if k:
        expected = float(np.mean(np.sort(x)[k:n - k]))
    else:
        expected = float(np.median(x)) if n <= 4 else float(np.mean(x))
    assert _trimmed_mean(x, trim) == expected


@settings(max_examples=300, deadline=None)
@given(_series(min_size=5), st.floats(0.01, 100.0), st.floats(1.0, 8.0))
def test_the_shield_is_the_reflected_five_run_median(x: np.ndarray, sigma: float,
                                                     z: float) -> None:
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, 2, mode="reflect"), 5)
    local = np.median(windows, axis=1)
    expected = x.copy()
    mask = np.abs(x - local) > z * sigma
    expected[mask] = local[mask]
    assert np.array_equal(_shield(x, sigma, z), expected)
