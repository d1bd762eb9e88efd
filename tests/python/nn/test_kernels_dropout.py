"""Native inverted dropout: reference mask, thread-count independence, keep rate, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core


def run_dropout(x, retain, seed):
    y, mask = np.empty_like(x), np.empty_like(x)
    _core.dropout_forward(x, y, mask, retain, seed)
    return y, mask


@given(
    shape=st.sampled_from([(0,), (7,), (3, 5), (2, 3, 4, 4)]),
    retain=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**64 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_dropout_matches_reference(shape, retain, seed, dtype):
    rng = np.random.default_rng(seed % 2**32)
    x = rng.standard_normal(shape).astype(dtype)
    y, mask = run_dropout(x, retain, seed)
    expected_mask = ref.dropout_mask(x.size, retain, seed).reshape(shape).astype(dtype)
    np.testing.assert_array_equal(mask, expected_mask)
    np.testing.assert_array_equal(y, x * expected_mask)
    dy = rng.standard_normal(shape).astype(dtype)
    dx = np.empty_like(dy)
    _core.dropout_backward(dy, mask, dx)
    np.testing.assert_array_equal(dx, dy * mask)


def test_dropout_is_identical_for_one_and_two_threads():
    x = np.random.default_rng(1).standard_normal(300_000).astype(np.float32)  # above the parallel cutoff
    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(1)
        one = run_dropout(x, 0.6, 42)
        sparkgrad.set_num_threads(2)
        two = run_dropout(x, 0.6, 42)
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(one[1], two[1])
    np.testing.assert_array_equal(one[0], two[0])


@pytest.mark.parametrize("retain", [0.1, 0.5, 0.9, 1.0])
def test_dropout_keep_rate_and_scale(retain):
    n = 200_000
    _, mask = run_dropout(np.ones(n), retain, 123)
    kept = mask != 0
    assert set(np.unique(mask)) <= {0.0, 1.0 / retain}
    # 5 standard deviations of a binomial keep count.
    assert abs(kept.mean() - retain) <= 5 * np.sqrt(retain * (1 - retain) / n) + 1e-12
    assert abs(mask.mean() - 1.0) < 0.05  # inverted dropout keeps the expectation


def test_dropout_is_reproducible_per_seed_and_differs_across_seeds():
    x = np.ones(1000)
    a, b, c = run_dropout(x, 0.5, 7)[1], run_dropout(x, 0.5, 7)[1], run_dropout(x, 0.5, 8)[1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_dropout_in_place_on_x():
    x = np.arange(10.0)
    mask = np.empty_like(x)
    _core.dropout_forward(x, x, mask, 0.5, 3)
    np.testing.assert_array_equal(x, np.arange(10.0) * mask)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _core.dropout_forward(np.ones(3), np.ones(3), np.ones(3), 0.0, 1),
            r"\[dropout_forward\] retain must be in \(0, 1\]",
        ),
        (
            lambda: _core.dropout_forward(np.ones(3), np.ones(3), np.ones(3), 1.5, 1),
            r"\[dropout_forward\] retain must be in",
        ),
        (
            lambda: _core.dropout_forward(np.ones(3), np.ones(3), np.ones(2), 0.5, 1),
            r"\[dropout_forward\] mask must have shape",
        ),
        (
            lambda: _core.dropout_forward(np.ones(3), np.ones(3), np.ones(3, np.float32), 0.5, 1),
            r"\[dropout_forward\] mask must have dtype float64",
        ),
        (
            lambda: _core.dropout_backward(np.ones(3), np.ones(3), np.ones(4)),
            r"\[dropout_backward\] dx must have shape",
        ),
    ],
)
def test_dropout_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
