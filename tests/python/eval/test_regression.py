"""RegressionEvaluation against scikit-learn/NumPy, masks and exactness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn import metrics

from sparkgrad.eval import RegressionEvaluation

seeds = st.integers(0, 2**32 - 1)


@given(seeds, st.integers(2, 200), st.integers(1, 4), st.sampled_from([0.0, 1.0, 1e6]), st.floats(0.01, 3))
def test_regression_matches_sklearn(seed: int, n: int, cols: int, offset: float, noise: float) -> None:
    rng = np.random.default_rng(seed)
    y = offset + rng.normal(size=(n, cols))
    p = y + noise * rng.normal(size=(n, cols))
    ev = RegressionEvaluation()
    ev.eval(y, p)
    for c in range(cols):
        assert ev.mean_squared_error(c) == pytest.approx(
            metrics.mean_squared_error(y[:, c], p[:, c]), rel=1e-12
        )
        assert ev.mean_absolute_error(c) == pytest.approx(
            metrics.mean_absolute_error(y[:, c], p[:, c]), rel=1e-12
        )
        assert ev.root_mean_squared_error(c) == pytest.approx(
            np.sqrt(np.mean((y[:, c] - p[:, c]) ** 2)), rel=1e-12
        )
        # The exact sums make R^2 and Pearson immune to the large offset (two-pass references).
        assert ev.r_squared(c) == pytest.approx(metrics.r2_score(y[:, c], p[:, c]), rel=1e-9, abs=1e-9)
        assert ev.relative_squared_error(c) == pytest.approx(1 - metrics.r2_score(y[:, c], p[:, c]), rel=1e-9)
        yc, pc = y[:, c] - y[:, c].mean(), p[:, c] - p[:, c].mean()
        expected_pc = np.sum(yc * pc) / np.sqrt(np.sum(yc * yc) * np.sum(pc * pc))
        assert ev.pearson_correlation(c) == pytest.approx(expected_pc, rel=1e-9, abs=1e-12)
        assert ev.example_count(c) == n
    assert ev.average_r_squared() == pytest.approx(
        metrics.r2_score(y, p, multioutput="uniform_average"), rel=1e-9, abs=1e-9
    )
    assert ev.average_mean_squared_error() == pytest.approx(metrics.mean_squared_error(y, p), rel=1e-12)
    assert ev.average_mean_absolute_error() == pytest.approx(metrics.mean_absolute_error(y, p), rel=1e-12)
    assert ev.average_root_mean_squared_error() == pytest.approx(
        np.mean([ev.root_mean_squared_error(c) for c in range(cols)]), rel=1e-15
    )
    assert ev.average_relative_squared_error() == pytest.approx(
        1 - ev.average_r_squared(), rel=1e-9, abs=1e-12
    )
    assert np.isfinite(ev.average_pearson_correlation())


@given(seeds, st.integers(2, 100), st.integers(1, 3))
def test_regression_per_output_mask(seed: int, n: int, cols: int) -> None:
    rng = np.random.default_rng(seed)
    y, p = rng.normal(size=(n, cols)), rng.normal(size=(n, cols))
    mask = rng.random((n, cols)) < 0.7
    ev = RegressionEvaluation(column_names=[f"out{c}" for c in range(cols)])
    ev.eval(y, p, mask=mask.astype(np.float64))
    for c in range(cols):
        keep = mask[:, c]
        assert ev.example_count(c) == int(keep.sum())
        if keep.sum() >= 2:
            single = RegressionEvaluation()
            single.eval(y[keep, c], p[keep, c])
            assert ev.mean_squared_error(c) == single.mean_squared_error(0)
            np.testing.assert_equal(ev.r_squared(c), single.r_squared(0))
    assert "out0" in ev.stats()


def test_regression_constant_labels_and_stats_layout() -> None:
    ev = RegressionEvaluation()
    ev.eval(np.ones((4, 1)), np.array([[1.0], [1.5], [0.5], [1.0]]))
    assert ev.relative_squared_error(0) == float("inf")
    assert np.isnan(ev.pearson_correlation(0))
    lines = ev.stats().splitlines()
    assert lines[0].split() == ["Column", "MSE", "MAE", "RMSE", "RSE", "PC", "R^2"]
    assert lines[1].startswith("col_0") and "1.25000e-01" in lines[1]


def test_regression_errors() -> None:
    ev = RegressionEvaluation()
    with pytest.raises(ValueError, match="no data"):
        ev.average_r_squared()
    with pytest.raises(ValueError, match="labels contains infinite"):
        ev.eval(np.array([[np.inf]]), np.array([[1.0]]))
    with pytest.raises(ValueError, match="predictions contains NaN"):
        ev.eval(np.array([[1.0]]), np.array([[np.nan]]))
    ev.eval(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="labels has 3 columns"):
        ev.eval(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="col"):
        ev.mean_squared_error(2)
    with pytest.raises(ValueError, match="column_names"):
        RegressionEvaluation(num_columns=3, column_names=["a"])
    assert ev.example_count(0) == 2
