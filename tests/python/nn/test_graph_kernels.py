"""Native vertex kernels (element-wise ops, scale/shift, L2 normalize, L2 distance) against the NumPy
references in tests/python/reference/nn.py and numerical gradients; argument checks."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core

DTYPES = st.sampled_from([np.float32, np.float64])
SEEDS = st.integers(0, 2**31 - 1)
SHAPES = st.sampled_from([(0, 3), (1, 1), (4, 5), (3, 2, 3, 2), (2, 1, 1, 7)])
PROPERTY = settings(max_examples=40, deadline=None)


def tol(dtype, terms: int = 1):
    """float32: a few ulps per accumulated term (relative); float64 far tighter."""
    eps = np.finfo(dtype).eps
    return {"rtol": 4 * eps * terms, "atol": 4 * eps * terms}


@PROPERTY
@given(
    op=st.sampled_from(ref.ELEMENTWISE_OPS),
    k=st.integers(1, 4),
    shape=SHAPES,
    dtype=DTYPES,
    seed=SEEDS,
    threads=st.sampled_from([1, 2]),
)
def test_elementwise_forward_backward_match_reference(op, k, shape, dtype, seed, threads):
    k = 2 if op == "subtract" else k
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(shape).astype(dtype) for _ in range(k)]
    dy = rng.standard_normal(shape).astype(dtype)
    previous = sparkgrad.get_num_threads()
    sparkgrad.set_num_threads(threads)
    try:
        y = np.full(shape, np.nan, dtype)
        _core.elementwise_forward(op, inputs, y)
        dx = [np.full(shape, np.nan, dtype) for _ in range(k)]
        _core.elementwise_backward(op, inputs, dy, dx)
    finally:
        sparkgrad.set_num_threads(previous)
    np.testing.assert_allclose(y, ref.elementwise(op, inputs), **tol(dtype, k))
    for got, expected in zip(dx, ref.elementwise_backward(op, inputs, dy)):
        np.testing.assert_allclose(got, expected, **tol(dtype, k))


def test_elementwise_max_routes_ties_to_the_first_input():
    a = np.array([[1.0, 2.0, 3.0]])
    b = np.array([[1.0, 5.0, 3.0]])
    da, db = np.empty_like(a), np.empty_like(a)
    _core.elementwise_backward("max", [a, b], np.array([[10.0, 20.0, 30.0]]), [da, db])
    np.testing.assert_array_equal(da, [[10.0, 0.0, 30.0]])
    np.testing.assert_array_equal(db, [[0.0, 20.0, 0.0]])


def test_elementwise_product_gradient_is_exact_with_zeros():
    a, b, c = np.array([0.0, 2.0]), np.array([3.0, 0.0]), np.array([5.0, 7.0])
    dx = [np.empty(2) for _ in range(3)]
    _core.elementwise_backward("product", [a, b, c], np.ones(2), dx)
    np.testing.assert_array_equal(dx[0], [15.0, 0.0])
    np.testing.assert_array_equal(dx[1], [0.0, 14.0])
    np.testing.assert_array_equal(dx[2], [0.0, 0.0])


@PROPERTY
@given(shape=SHAPES, scale=st.floats(-5, 5), shift=st.floats(-5, 5), dtype=DTYPES, seed=SEEDS)
def test_scale_shift_matches_reference(shape, scale, shift, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    y = np.empty_like(x)
    _core.scale_shift(x, y, scale, shift)
    expected = x.astype(np.float64) * np.float64(dtype(scale)) + np.float64(dtype(shift))
    np.testing.assert_allclose(y, expected, rtol=4 * np.finfo(dtype).eps, atol=20 * np.finfo(dtype).eps)
    _core.scale_shift(x, x, scale, shift)  # in place
    np.testing.assert_array_equal(x, y)


@PROPERTY
@given(shape=SHAPES, tiny=st.booleans(), eps=st.sampled_from([1e-8, 1e-3]), dtype=DTYPES, seed=SEEDS)
def test_l2_normalize_matches_reference(shape, tiny, eps, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if tiny and len(x):  # the first example's norm falls below eps: the clamped branch
        x[0] *= 1e-6 * eps
    x = x.astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, norms = np.empty_like(x), np.empty(shape[0], dtype)
    _core.l2_normalize_forward(x, y, norms, eps)
    d = int(np.prod(shape[1:]))
    np.testing.assert_allclose(y, ref.l2_normalize(x, eps), **tol(dtype, d))
    dx = np.empty_like(x)
    _core.l2_normalize_backward(y, norms, dy, dx, eps)
    # (dy - y <dy, y>) / max(norm, eps): the numerator's rounding (a d-term dot product, one product, one
    # difference) is relative to |dy|, not to dx, which cancels to 0 for d = 1 (y = +-1 within an ulp);
    # the division scales it by 1 / max(norm, eps). One bound per example.
    rows = x.reshape(len(x), d).astype(np.float64)
    divisor = np.maximum(np.sqrt((rows**2).sum(axis=1)), eps)
    bound = 4 * (d + 1) * np.finfo(dtype).eps * np.abs(dy.reshape(len(x), d)).max(axis=1, initial=0) / divisor
    error = np.abs(dx.astype(np.float64) - ref.l2_normalize_backward(x, dy, eps)).reshape(len(x), d)
    assert np.all(error <= bound[:, None]), (error.max(axis=1, initial=0), bound)
    _core.l2_normalize_backward(y, norms, dy, dy, eps)  # dx may be dy
    np.testing.assert_array_equal(dy, dx)


@PROPERTY
@given(shape=SHAPES, same=st.booleans(), dtype=DTYPES, seed=SEEDS)
def test_l2_distance_matches_reference(shape, same, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(dtype)
    b = a.copy() if same else rng.standard_normal(shape).astype(dtype)  # same: zero distance, eps branch
    dy = rng.standard_normal(shape[0]).astype(dtype)
    y = np.empty(shape[0], dtype)
    _core.l2_distance_forward(a, b, y)
    d = int(np.prod(shape[1:]))
    np.testing.assert_allclose(y, ref.l2_distance(a, b), **tol(dtype, d))
    da, db = np.empty_like(a), np.empty_like(a)
    _core.l2_distance_backward(a, b, y, dy, da, db, 1e-8)
    expected_a, expected_b = ref.l2_distance_backward(a, b, dy, 1e-8)
    np.testing.assert_allclose(da, expected_a, **tol(dtype, d))
    np.testing.assert_allclose(db, expected_b, **tol(dtype, d))


def test_l2_kernels_backward_match_numerical_gradient():
    rng = np.random.default_rng(3)
    x, b, w = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def normalized(v):
        y, norms = np.empty_like(v), np.empty(3)
        _core.l2_normalize_forward(v, y, norms, 1e-8)
        return y, norms

    y, norms = normalized(x)
    dx = np.empty_like(x)
    _core.l2_normalize_backward(y, norms, w.copy(), dx, 1e-8)
    numeric = ref.numerical_gradient(lambda v: float((normalized(v)[0] * w).sum()), x.copy())
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)

    def distance(v):
        out = np.empty(3)
        _core.l2_distance_forward(v, b, out)
        return out

    da, db = np.empty_like(x), np.empty_like(x)
    _core.l2_distance_backward(x, b, distance(x), w[:, 0].copy(), da, db, 1e-8)
    numeric = ref.numerical_gradient(lambda v: float((distance(v) * w[:, 0]).sum()), x.copy())
    np.testing.assert_allclose(da, numeric, rtol=1e-6, atol=1e-8)


def test_vertex_kernels_release_the_gil():
    """Two threads run large element-wise products concurrently and both get exact results."""
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(1 << 18) for _ in range(2)]
    expected = arrays[0] * arrays[1]
    results = [np.empty(1 << 18) for _ in range(4)]

    def work(out):
        for _ in range(5):
            _core.elementwise_forward("product", arrays, out)

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in results:
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _core.elementwise_forward("mean", [np.ones(2)], np.ones(2)),
            "unknown element-wise op 'mean'",
        ),
        (lambda: _core.elementwise_forward("add", [], np.ones(2)), "at least one array"),
        (lambda: _core.elementwise_forward("subtract", [np.ones(2)] * 3, np.ones(2)), "exactly 2 inputs"),
        (
            lambda: _core.elementwise_forward("add", [np.ones(2), np.ones(3)], np.ones(2)),
            r"inputs\[1\] must have shape",
        ),
        (
            lambda: _core.elementwise_forward("add", [np.ones(2, np.float32)], np.ones(2)),
            r"inputs\[0\] must have dtype float64",
        ),
        (lambda: _core.elementwise_backward("add", [np.ones(2)], np.ones(2), []), "one array per input"),
        (
            lambda: _core.l2_normalize_forward(np.ones((2, 3)), np.ones((2, 3)), np.ones(3), 1e-8),
            "norms must have shape",
        ),
        (
            lambda: _core.l2_normalize_forward(np.ones((2, 3)), np.ones((2, 3)), np.ones(2), 0.0),
            "eps must be",
        ),
        (
            lambda: _core.l2_distance_forward(np.ones((2, 3)), np.ones((2, 2)), np.ones(2)),
            "b must have shape",
        ),
    ],
)
def test_vertex_kernels_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_elementwise_backward_rejects_aliased_outputs():
    a, b, dy = np.ones(3), np.ones(3), np.ones(3)
    with pytest.raises(ValueError, match=r"dx\[1\] must not overlap"):
        _core.elementwise_backward("product", [a, b], dy, [np.empty(3), a])
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="y must not overlap x"):
        _core.l2_normalize_forward(x, x, np.ones(2), 1e-8)
