"""Native embedding lookup: gather and scatter-add against NumPy, thread-count independence, index checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core


@given(
    vocab=st.integers(1, 40),
    dim=st.integers(1, 9),
    n=st.integers(0, 60),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
    threads=st.sampled_from([1, 2, 3]),
)
def test_embedding_matches_reference(vocab, dim, n, seed, dtype, threads):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((vocab, dim)).astype(dtype)
    indices = rng.integers(0, vocab, n).astype(np.int64)
    dy = rng.standard_normal((n, dim)).astype(dtype)
    start = rng.standard_normal((vocab, dim)).astype(dtype)  # the backward accumulates into dw
    y, dw = np.empty((n, dim), dtype=dtype), start.copy()
    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(threads)
        _core.embedding_forward(indices, w, y)
        _core.embedding_backward(indices, dy, dw)
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(y, ref.embedding_forward(indices, w))
    # added to what dw held, each row's positions in order: the reference's order exactly
    np.testing.assert_array_equal(dw, ref.embedding_backward(indices, dy, start))


def test_embedding_backward_is_identical_for_any_thread_count():
    # above the parallel cutoff, with many repeats per row: a different summation order would show
    rng = np.random.default_rng(3)
    indices = rng.integers(0, 50, 20_000).astype(np.int64)
    dy = rng.standard_normal((20_000, 8)).astype(np.float32)
    results = []
    before = sparkgrad.get_num_threads()
    try:
        for threads in (1, 2, 3):
            sparkgrad.set_num_threads(threads)
            dw = np.zeros((50, 8), dtype=np.float32)
            _core.embedding_backward(indices, dy, dw)
            results.append(dw)
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(
        results[0], ref.embedding_backward(indices, dy, np.zeros((50, 8), np.float32))
    )


@pytest.mark.parametrize("bad", [-1, 5, 2**40])
@pytest.mark.parametrize("op", ["forward", "backward"])
def test_out_of_range_index_is_an_error_naming_it_and_writes_nothing(op, bad):
    w = np.ones((5, 3))
    rows = np.full((4, 3), 7.0)
    indices = np.array([0, 4, bad, bad], dtype=np.int64)
    before_w, before_rows = w.copy(), rows.copy()
    with pytest.raises(
        ValueError, match=rf"\[embedding_{op}\] index {bad} at position 2 is outside \[0, 5\)"
    ):
        if op == "forward":
            _core.embedding_forward(indices, w, rows)
        else:
            _core.embedding_backward(indices, rows, w)
    np.testing.assert_array_equal(w, before_w)
    np.testing.assert_array_equal(rows, before_rows)


def test_embedding_arguments_are_checked():
    w, y = np.ones((5, 3), np.float32), np.empty((2, 3), np.float32)
    with pytest.raises(ValueError, match="indices must have dtype int64"):
        _core.embedding_forward(np.array([0, 1], dtype=np.int32), w, y)
    with pytest.raises(ValueError, match="y must have shape"):
        _core.embedding_forward(np.array([0, 1, 2]), w, y)
    with pytest.raises(ValueError, match="y must have dtype float32"):
        _core.embedding_forward(np.array([0, 1]), w, np.empty((2, 3)))
