"""swap_last_axes: a sequence's (N, T, C) as (N, C, T) planes and back (the 1-D window layers), against
NumPy's transpose for both dtypes, tile edges and thread counts, and its argument checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgrad import _core
from sparkgrad.spark.threads import native_threads


@given(
    n=st.integers(0, 5),
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    dtype=st.sampled_from([np.float32, np.float64]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_swap_last_axes_is_numpys_transpose(n, rows, cols, dtype, threads, seed) -> None:
    """Sizes around the 8x8 vector blocks and 16x16 tiles; NaN, infinities and -0.0 copied bit for bit."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, rows, cols)).astype(dtype)
    if x.size:
        x.flat[rng.integers(0, x.size, 3)] = np.array([np.nan, -np.inf, -0.0], dtype)
    y = np.full((n, cols, rows), 7.0, dtype)
    with native_threads(threads):
        _core.swap_last_axes(x, y)
    expected = np.ascontiguousarray(x.transpose(0, 2, 1))
    assert y.tobytes() == expected.tobytes()


def test_swap_last_axes_over_many_items_and_threads() -> None:
    """Enough items for the OpenMP split: the same bits with one and two threads."""
    x = np.random.default_rng(3).normal(size=(300, 37, 61)).astype(np.float32)
    outputs = []
    for threads in (1, 2):
        y = np.empty((300, 61, 37), np.float32)
        with native_threads(threads):
            _core.swap_last_axes(x, y)
        outputs.append(y)
    np.testing.assert_array_equal(outputs[0], x.transpose(0, 2, 1))
    np.testing.assert_array_equal(outputs[1], outputs[0])


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32), r"y must have shape \(2, 4, 3\)"),
        (np.zeros((3, 4), np.float32), np.zeros((4, 3), np.float32), r"x must be .*\(N, rows, cols\)"),
        (np.zeros((2, 3, 4), np.float32), np.zeros((2, 4, 3), np.float64), "y must have dtype float32"),
        (np.zeros((2, 3, 4), np.float32)[:, ::-1], np.zeros((2, 4, 3), np.float32), "x must be C-contiguous"),
    ],
)
def test_swap_last_axes_names_a_bad_argument(x, y, message) -> None:
    with pytest.raises(ValueError, match=rf"\[swap_last_axes\] {message}"):
        _core.swap_last_axes(x, y)


def test_swap_last_axes_refuses_to_write_its_input() -> None:
    x = np.zeros((2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[swap_last_axes\] y must not be x"):
        _core.swap_last_axes(x, x)
