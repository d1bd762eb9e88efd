"""Winograd F(2x2, 3x3) convolutions (algorithm="winograd") against the loop references, with error
bounds derived from the unit roundoff and each output's reduction (reference.nn.winograd_*_bound)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core

DTYPES = st.sampled_from([np.float32, np.float64])
SEEDS = st.integers(0, 2**31 - 1)
UNIT_ROUNDOFF = {np.float32: 2.0**-24, np.float64: 2.0**-53}


@st.composite
def stride_one_3x3(draw, max_size=9):
    """(h, w, pad_top_left, out_hw) for 3x3 stride-1 convolutions, "truncate" and "same" padding."""
    mode = draw(st.sampled_from(["truncate", "same"]))
    h, w = draw(st.integers(1, max_size)), draw(st.integers(1, max_size))
    pads = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    p, pad_top = ref.output_geometry(h, 3, 1, pads[0], mode)
    q, pad_left = ref.output_geometry(w, 3, 1, pads[1], mode)
    assume(p >= 1 and q >= 1)
    return h, w, (pad_top, pad_left), (p, q)


def geometry(pad):
    return {"stride_h": 1, "stride_w": 1, "pad_top": pad[0], "pad_left": pad[1]}


def flipped(wt):
    """The kernel of dx as a forward convolution of dy: flipped in space, channels transposed."""
    return np.ascontiguousarray(wt[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))


@given(
    geo=stride_one_3x3(),
    n=st.integers(0, 3),
    c=st.integers(1, 6),
    k=st.integers(1, 6),
    with_bias=st.booleans(),
    relu=st.booleans(),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_winograd_matches_reference_within_the_rounding_bound(geo, n, c, k, with_bias, relu, dtype, seed):
    h, w, pad, (p, q) = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c, 3, 3)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if with_bias else None
    dy = rng.standard_normal((n, k, p, q)).astype(dtype)
    kw = {**geometry(pad), "algorithm": "winograd"}
    u = UNIT_ROUNDOFF[dtype]

    y = np.full((n, k, p, q), np.nan, dtype)
    _core.conv2d_forward(x, wt, b, y, **kw, activation="relu" if relu else "identity")
    expected = ref.conv2d_forward(x, wt, b, (p, q), (1, 1), pad)
    if relu:
        expected = np.maximum(expected, 0.0)  # relu only shrinks the error
    bound = ref.winograd_forward_bound(x, wt, b, (p, q), pad, u)
    assert np.all(np.abs(y - expected) <= bound)

    dx = np.full(x.shape, np.nan, dtype)
    _core.conv2d_backward_input(dy, wt, dx, **kw)
    expected = ref.conv2d_backward_input(dy, wt, x.shape, (1, 1), pad)
    bound = ref.winograd_forward_bound(dy, flipped(wt), None, (h, w), (2 - pad[0], 2 - pad[1]), u)
    assert np.all(np.abs(dx - expected) <= bound)

    dw = np.full(wt.shape, np.nan, dtype)
    _core.conv2d_backward_weight(x, dy, dw, **kw)
    expected = ref.conv2d_backward_weight(x, dy, wt.shape, (1, 1), pad)
    assert np.all(np.abs(dw - expected) <= ref.winograd_weight_bound(x, dy, pad, u))


def _all_passes(x, wt, b, dy, pad, algorithm):
    kw = {**geometry(pad), "algorithm": algorithm}
    y, dx, dw = np.empty(dy.shape, x.dtype), np.empty_like(x), np.empty_like(wt)
    _core.conv2d_forward(x, wt, b, y, **kw)
    _core.conv2d_backward_input(dy, wt, dx, **kw)
    _core.conv2d_backward_weight(x, dy, dw, **kw)
    return y, dx, dw


def test_winograd_same_bits_for_one_and_two_threads():
    # 12 images of 28x28: 2352 tiles, so the weight gradient's 8 partial sums hold several blocks each.
    rng = np.random.default_rng(9)
    x = rng.standard_normal((12, 8, 28, 28)).astype(np.float32)
    wt = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    dy = rng.standard_normal((12, 8, 28, 28)).astype(np.float32)
    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(1)
        one = _all_passes(x, wt, b, dy, (1, 1), "winograd")
        sparkgrad.set_num_threads(2)
        two = _all_passes(x, wt, b, dy, (1, 1), "winograd")
    finally:
        sparkgrad.set_num_threads(before)
    for a, c in zip(one, two):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize(
    ("c", "k", "kernel", "expected"),
    [(16, 16, 3, "winograd"), (15, 32, 3, "im2col"), (32, 8, 3, "im2col"), (16, 16, 5, "im2col")],
)
def test_auto_picks_winograd_for_3x3_with_enough_channels(c, k, kernel, expected):
    rng = np.random.default_rng(c * 100 + k)
    x = rng.standard_normal((2, c, 9, 9)).astype(np.float32)
    wt = rng.standard_normal((k, c, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    dy = rng.standard_normal((2, k, 9 - kernel + 1, 9 - kernel + 1)).astype(np.float32)
    auto = _all_passes(x, wt, b, dy, (0, 0), "auto")
    for a, e in zip(auto, _all_passes(x, wt, b, dy, (0, 0), expected)):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("algorithm", ["im2col", "winograd"])
def test_fused_relu_equals_relu_of_the_identity_output(algorithm):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8, 10, 11)).astype(np.float32)
    wt = rng.standard_normal((9, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32)
    plain, fused = np.empty((3, 9, 10, 11), np.float32), np.empty((3, 9, 10, 11), np.float32)
    kw = {**geometry((1, 1)), "algorithm": algorithm}
    _core.conv2d_forward(x, wt, b, plain, **kw)
    _core.conv2d_forward(x, wt, b, fused, **kw, activation="relu")
    np.testing.assert_array_equal(fused, np.maximum(plain, 0))


X, W5, W3, Y = np.ones((1, 2, 6, 6)), np.ones((3, 2, 5, 5)), np.ones((3, 2, 3, 3)), np.ones((1, 3, 4, 4))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _core.conv2d_forward(
                X, W5, None, np.ones((1, 3, 2, 2)), **geometry((0, 0)), algorithm="winograd"
            ),
            r"\[conv2d_forward\] algorithm 'winograd' needs 3x3 kernels, stride 1 and padding <= 2, got 5x5",
        ),
        (
            lambda: _core.conv2d_backward_weight(
                X, Y, W3, stride_h=2, stride_w=1, pad_top=0, pad_left=0, algorithm="winograd"
            ),
            r"\[conv2d_backward_weight\] algorithm 'winograd' needs .* stride 2x1",
        ),
        (
            lambda: _core.conv2d_backward_input(Y, W3, X, **geometry((0, 0)), algorithm="fft"),
            r"\[conv2d_backward_input\] unknown algorithm 'fft', expected one of auto im2col winograd",
        ),
        (
            lambda: _core.conv2d_forward(X, W3, None, Y, **geometry((0, 0)), activation="tanh"),
            r"\[conv2d_forward\] activation must be identity or relu \(the fused epilogues\), got 'tanh'",
        ),
    ],
)
def test_conv2d_rejects_bad_algorithm_and_activation(call, message):
    with pytest.raises(ValueError, match=message):
        call()
