"""Native layer-normalization and multi-head attention kernels (cpp/src/nn/layer_norm.cpp, attention.cpp)
against the pure-NumPy references: forward values, the backward against the reference's formula and
central differences, masked keys, thread-count bit identity and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core


def _tol(dtype, terms: int) -> dict:
    """Round-off of a value built from sums of ``terms`` products (and a normalization) in ``dtype``."""
    bound = 16 * float(np.finfo(dtype).eps) * max(terms, 1)
    return {"rtol": bound, "atol": bound}


def _layer_norm(x, gain, bias, dy, eps=1e-5):
    rows, c = x.shape
    y, mean, rstd = (np.full(s, np.nan, x.dtype) for s in ((rows, c), (rows,), (rows,)))
    _core.layer_norm_forward(x, gain, bias, y, mean, rstd, eps=eps)
    dx, dgain = np.full_like(x, np.nan), np.full_like(gain, np.nan)
    dbias = None if bias is None else np.full_like(gain, np.nan)
    _core.layer_norm_backward(x, dy, gain, mean, rstd, dx, dgain, dbias)
    return y, mean, rstd, dx, dgain, dbias


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 150),
    c=st.integers(1, 40),
    has_bias=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3, 0.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_layer_norm_matches_reference(rows, c, has_bias, eps, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(rows, c)) * rng.uniform(0.1, 5) + rng.normal()).astype(dtype)
    gain, bias = rng.normal(size=c).astype(dtype), rng.normal(size=c).astype(dtype) if has_bias else None
    dy = rng.normal(size=(rows, c)).astype(dtype)
    y, mean, rstd, dx, dgain, dbias = _layer_norm(x, gain, bias, dy, eps)
    x64, g64 = x.astype(np.float64), gain.astype(np.float64)
    want_y, want_mean, want_rstd = ref.layer_norm_forward(
        x64, g64, None if bias is None else bias.astype(np.float64), eps
    )
    # rstd amplifies x's rounding by up to 1/sqrt(eps) relative to the row's spread
    amp = float(np.max(np.abs(x64 - want_mean[:, None]) * want_rstd[:, None], initial=1.0))
    tol = _tol(dtype, c)
    np.testing.assert_allclose(mean, want_mean, rtol=tol["rtol"], atol=tol["atol"] * float(np.abs(x64).max()))
    np.testing.assert_allclose(rstd, want_rstd, rtol=tol["rtol"] * c, atol=0)
    np.testing.assert_allclose(
        y, want_y, rtol=tol["rtol"] * c, atol=tol["atol"] * c * amp * float(np.abs(g64).max() + 1)
    )
    want_dx, want_dgain, want_dbias = ref.layer_norm_backward(x64, dy.astype(np.float64), g64, eps)
    scale = float(np.abs(dy).max() * (np.abs(g64).max() + 1) * want_rstd.max())
    np.testing.assert_allclose(dx, want_dx, rtol=0, atol=tol["atol"] * c * amp * scale)
    col = float(np.abs(dy).max()) * rows * amp
    np.testing.assert_allclose(dgain, want_dgain, rtol=0, atol=tol["atol"] * col)
    if has_bias:
        np.testing.assert_allclose(dbias, want_dbias, rtol=0, atol=tol["atol"] * col)


def test_layer_norm_backward_matches_central_differences():
    rng = np.random.default_rng(3)
    x, gain, bias, dy = (
        rng.normal(size=(4, 6)),
        rng.normal(size=6),
        rng.normal(size=6),
        rng.normal(size=(4, 6)),
    )
    _, _, _, dx, dgain, dbias = _layer_norm(x, gain, bias, dy)

    def loss_of(xv=x, gv=gain, bv=bias):
        return float((ref.layer_norm_forward(xv, gv, bv, 1e-5)[0] * dy).sum())

    np.testing.assert_allclose(
        dx, ref.numerical_gradient(lambda v: loss_of(xv=v), x.copy()), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        dgain, ref.numerical_gradient(lambda v: loss_of(gv=v), gain.copy()), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        dbias, ref.numerical_gradient(lambda v: loss_of(bv=v), bias.copy()), rtol=1e-6, atol=1e-8
    )


def _attention(q, k, v, heads, scale, mask, dy):
    n, tq, _ = q.shape
    tk = k.shape[1]
    weights = np.full((n, heads, tq, tk), np.nan, q.dtype)
    y = np.full((n, tq, v.shape[2]), np.nan, q.dtype)
    _core.attention_forward(q, k, v, weights, y, heads, scale, mask=mask)
    dq, dk, dv = (np.full_like(a, np.nan) for a in (q, k, v))
    _core.attention_backward(q, k, v, weights, dy, np.empty_like(weights), dq, dk, dv, heads, scale)
    return weights, y, dq, dk, dv


def _attention_inputs(rng, n, tq, tk, heads, d, dv, masked, dtype):
    q, k = rng.normal(size=(n, tq, heads * d)), rng.normal(size=(n, tk, heads * d))
    v, dy = rng.normal(size=(n, tk, heads * dv)), rng.normal(size=(n, tq, heads * dv))
    mask = None
    if masked:
        mask = (rng.random((n, tk)) < 0.6).astype(dtype)
        mask[0] = 0  # an example with no present key
    return (*(a.astype(dtype) for a in (q, k, v, dy)), mask)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3),
    tq=st.integers(1, 6),
    tk=st.integers(1, 6),
    heads=st.integers(1, 3),
    d=st.integers(1, 4),
    dv=st.integers(1, 4),
    masked=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_attention_matches_reference(n, tq, tk, heads, d, dv, masked, dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v, dy, mask = _attention_inputs(rng, n, tq, tk, heads, d, dv, masked, dtype)
    scale = 1 / np.sqrt(d)
    weights, y, dq, dk, dv_ = _attention(q, k, v, heads, scale, mask, dy)
    as64 = [a.astype(np.float64) for a in (q, k, v)]
    want_w, want_y = ref.attention_forward(*as64, heads, scale, mask)
    tol = _tol(dtype, d + tk)
    np.testing.assert_allclose(weights, want_w, **tol)
    np.testing.assert_allclose(y, want_y, rtol=tol["rtol"], atol=tol["atol"] * float(np.abs(v).max()))
    if mask is not None:  # masked keys: weight exactly 0
        assert np.all(weights[np.broadcast_to(mask[:, None, None, :] == 0, weights.shape)] == 0)
        assert np.all(y[0] == 0)  # no present key: zero output
    # backward: the float64 kernel against central differences of the reference, in a small case
    if dtype == np.float64 and n * tq * tk <= 24:
        dy64 = dy.astype(np.float64)

        def loss(index):
            def f(a):
                args = list(as64)
                args[index] = a
                return float((ref.attention_forward(*args, heads, scale, mask)[1] * dy64).sum())

            return f

        for index, got in enumerate((dq, dk, dv_)):
            want = ref.numerical_gradient(loss(index), as64[index].copy())
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "tq, tk, d, dv",
    [
        (37, 70, 19, 17),  # small products: full register blocks and partial ones on both sides
        (64, 64, 16, 16),  # the transformer benchmark's heads: full blocks only
        (130, 129, 20, 16),  # products above the small-product bound go to BLAS
    ],
)
def test_attention_matches_reference_across_the_product_blocks(tq, tk, d, dv, dtype):
    rng = np.random.default_rng(tq + tk)
    q, k, v, dy, mask = _attention_inputs(rng, 2, tq, tk, 2, d, dv, True, dtype)
    scale = 1 / np.sqrt(d)
    weights, y, dq, dk, dv_ = _attention(q, k, v, 2, scale, mask, dy)
    as64 = [a.astype(np.float64) for a in (q, k, v)]
    want_w, want_y = ref.attention_forward(*as64, 2, scale, mask)
    want_dq, want_dk, want_dv = ref.attention_backward(*as64, want_w, dy.astype(np.float64), 2, scale)
    tol = _tol(dtype, d + tk + tq)
    np.testing.assert_allclose(weights, want_w, **tol)
    for got, want in ((y, want_y), (dq, want_dq), (dk, want_dk), (dv_, want_dv)):
        np.testing.assert_allclose(got, want, rtol=tol["rtol"], atol=tol["atol"] * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32])
def test_attention_float32_backward_matches_float64(dtype):
    rng = np.random.default_rng(7)
    q, k, v, dy, mask = _attention_inputs(rng, 3, 5, 7, 2, 4, 3, True, np.float64)
    scale = 0.5
    want = _attention(q, k, v, 2, scale, mask, dy)
    got = _attention(*(a.astype(dtype) for a in (q, k, v)), 2, scale, mask.astype(dtype), dy.astype(dtype))
    tol = _tol(dtype, 4 + 7)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol["rtol"], atol=tol["atol"] * float(np.abs(w).max()))


def test_a_mask_changes_the_answer_and_masked_keys_are_invisible():
    rng = np.random.default_rng(2)
    q, k, v, dy, _ = _attention_inputs(rng, 2, 4, 5, 2, 3, 3, False, np.float64)
    mask = np.ones((2, 5))
    mask[:, 3:] = 0
    full = _attention(q, k, v, 2, 0.5, None, dy)
    masked = _attention(q, k, v, 2, 0.5, mask, dy)
    assert not np.allclose(full[1], masked[1])
    noisy_k, noisy_v = k.copy(), v.copy()
    noisy_k[:, 3:], noisy_v[:, 3:] = 100 * rng.normal(size=(2, 2, 6)), 100 * rng.normal(size=(2, 2, 6))
    noisy = _attention(q, noisy_k, noisy_v, 2, 0.5, mask, dy)
    np.testing.assert_array_equal(noisy[1], masked[1])
    np.testing.assert_array_equal(noisy[2], masked[2])  # dq
    assert np.all(masked[3][:, 3:] == 0) and np.all(masked[4][:, 3:] == 0)  # no gradient to masked keys


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_are_bit_identical_for_any_thread_count(dtype):
    """Rows of layer norm and (example, head) pairs of attention are split over threads; the column sums
    add fixed row blocks in order: the same bits for 1 and 2 threads."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(700, 96)).astype(dtype)
    gain, bias, dy = (
        rng.normal(size=96).astype(dtype),
        rng.normal(size=96).astype(dtype),
        rng.normal(size=x.shape).astype(dtype),
    )
    q, k, v, dya, mask = _attention_inputs(rng, 8, 24, 24, 4, 16, 16, True, dtype)
    before = sparkgrad.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            results.append([*_layer_norm(x, gain, bias, dy), *_attention(q, k, v, 4, 0.25, mask, dya)])
    finally:
        sparkgrad.set_num_threads(before)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


def test_kernel_errors_name_the_argument():
    x, g = np.zeros((3, 4)), np.ones(4)
    stats = [np.zeros(3), np.zeros(3)]
    with pytest.raises(ValueError, match=r"\[layer_norm_forward\] gain must have shape \(4,\), got \(3,\)"):
        _core.layer_norm_forward(x, np.ones(3), None, np.zeros_like(x), *stats)
    with pytest.raises(ValueError, match=r"\[layer_norm_forward\] eps must be finite and > 0"):
        _core.layer_norm_forward(x, g, None, np.zeros_like(x), *stats, eps=0.0)
    with pytest.raises(ValueError, match=r"\[layer_norm_backward\] rstd must have shape \(3,\)"):
        _core.layer_norm_backward(x, x, g, stats[0], np.zeros(2), np.zeros_like(x), np.zeros(4))
    q, k, v = np.zeros((2, 3, 4)), np.zeros((2, 5, 4)), np.zeros((2, 5, 6))
    w, y = np.zeros((2, 2, 3, 5)), np.zeros((2, 3, 6))
    with pytest.raises(
        ValueError,
        match=r"\[attention_forward\] q's last axis \(4\) must be a positive multiple of heads \(3\)",
    ):
        _core.attention_forward(q, k, v, w, y, 3, 1.0)
    with pytest.raises(ValueError, match=r"\[attention_forward\] mask must have shape \(2, 5\)"):
        _core.attention_forward(q, k, v, w, y, 2, 1.0, mask=np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"\[attention_forward\] weights must have shape \(2, 2, 3, 5\)"):
        _core.attention_forward(q, k, v, np.zeros((2, 2, 5, 3)), y, 2, 1.0)
    with pytest.raises(ValueError, match=r"\[attention_backward\] dq must have shape \(2, 3, 4\)"):
        _core.attention_backward(
            q, k, v, w, y, np.zeros_like(w), np.zeros((2, 3, 3)), np.zeros_like(k), np.zeros_like(v), 2, 1.0
        )
