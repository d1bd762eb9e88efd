"""Native conv2d and pooling kernels against loop references and numerical gradients."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core

DTYPES = st.sampled_from([np.float32, np.float64])
SEEDS = st.integers(0, 2**31 - 1)


def tol(dtype):
    return {"rtol": 2e-4, "atol": 2e-4} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}


@st.composite
def geometries(draw, max_size=7):
    """(h, w, kernel, stride, pad_top_left, out_hw) covering truncate and asymmetric "same" padding."""
    mode = draw(st.sampled_from(["truncate", "same"]))
    h, w = draw(st.integers(1, max_size)), draw(st.integers(1, max_size))
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pads = (draw(st.integers(0, kernel[0] - 1)), draw(st.integers(0, kernel[1] - 1)))
    p, pad_top = ref.output_geometry(h, kernel[0], stride[0], pads[0], mode)
    q, pad_left = ref.output_geometry(w, kernel[1], stride[1], pads[1], mode)
    assume(p >= 1 and q >= 1)
    return h, w, kernel, stride, (pad_top, pad_left), (p, q)


def pool_kwargs(kernel, stride, pad):
    return {
        "kernel_h": kernel[0],
        "kernel_w": kernel[1],
        "stride_h": stride[0],
        "stride_w": stride[1],
        "pad_top": pad[0],
        "pad_left": pad[1],
    }


def conv_kwargs(stride, pad):
    return {"stride_h": stride[0], "stride_w": stride[1], "pad_top": pad[0], "pad_left": pad[1]}


# ---- pooling -------------------------------------------------------------------------------------


@given(
    geo=geometries(),
    kind=st.sampled_from(["max", "avg"]),
    n=st.integers(0, 3),
    c=st.integers(1, 3),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_pool2d_matches_reference(geo, kind, n, c, dtype, seed):
    h, w, kernel, stride, pad, (p, q) = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    y = np.full((n, c, p, q), np.nan, dtype)
    argmax = np.full((n, c, p, q), -1, np.int64)
    _core.pool2d_forward(kind, x, y, argmax=argmax, **pool_kwargs(kernel, stride, pad))
    expected, expected_argmax = ref.pool2d_forward(kind, x, (p, q), kernel, stride, pad)
    np.testing.assert_allclose(y, expected, **tol(dtype))
    if kind == "max":
        np.testing.assert_array_equal(argmax, expected_argmax)
    dy = rng.standard_normal((n, c, p, q)).astype(dtype)
    dx = np.full(x.shape, np.nan, dtype)
    _core.pool2d_backward(kind, dy, dx, argmax=argmax, **pool_kwargs(kernel, stride, pad))
    np.testing.assert_allclose(
        dx, ref.pool2d_backward(kind, dy, x.shape, kernel, stride, pad, argmax), **tol(dtype)
    )


# Max windows of 1 or 2 rows by 2 columns at their own stride, without padding: the vectorised paths
POOL_ROWS_X2 = {rows: pool_kwargs((rows, 2), (rows, 2), (0, 0)) for rows in (1, 2)}


def _max_pool(x, out_hw, **kwargs):
    y = np.full((*x.shape[:2], *out_hw), np.nan, x.dtype)
    argmax = np.full(y.shape, -1, np.int64)
    _core.pool2d_forward("max", x, y, argmax=argmax, **kwargs)
    return y, argmax


@given(
    h=st.integers(2, 21),
    w=st.integers(2, 21),
    n=st.integers(0, 2),
    c=st.integers(1, 3),
    dtype=DTYPES,
    seed=SEEDS,
    threads=st.sampled_from([1, 2]),
    rows=st.sampled_from([1, 2]),
)
def test_max_pool_windows_of_two_columns_match_reference(h, w, n, c, dtype, seed, threads, rows):
    """2x2 windows at stride 2 and 1x2 windows at stride (1, 2) without padding (vectorised, 8 and 4
    windows at a time plus the last 1-3 of a row): values from a few integers and -inf, so ties and all
    -inf windows are common; the first maximum wins."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([-np.inf, -1.0, 0.0, 1.0, 2.0], dtype), size=(n, c, h, w))
    out = (h // rows, w // 2)
    previous = sparkgrad.get_num_threads()
    sparkgrad.set_num_threads(threads)
    try:
        y, argmax = _max_pool(x, out, **POOL_ROWS_X2[rows])
    finally:
        sparkgrad.set_num_threads(previous)
    expected, expected_argmax = ref.pool2d_forward("max", x, out, (rows, 2), (rows, 2), (0, 0))
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(argmax, expected_argmax)


@given(m=st.integers(1, 10), k=st.integers(1, 10), dtype=DTYPES, seed=SEEDS, rows=st.sampled_from([1, 2]))
def test_max_pool_windows_of_two_columns_agree_with_the_general_loop_on_nan_and_inf(m, k, dtype, seed, rows):
    """The vectorised windows follow the general loop's rule, NaN included (a NaN never beats an earlier
    value; an all-NaN or -inf window gives its first value): "same" pooling of odd-sized input takes the
    general loop, and its windows inside the even part are the ones the vectorised path computes."""
    rng = np.random.default_rng(seed)
    values = np.array([np.nan, -np.inf, np.inf, -1.0, 0.0, 1.0], dtype)
    x = rng.choice(values, size=(2, 2, rows * m + 1, 2 * k + 1))
    general, general_argmax = _max_pool(x, (m + 1, k + 1), **POOL_ROWS_X2[rows])
    even = np.ascontiguousarray(x[:, :, : rows * m, : 2 * k])
    y, argmax = _max_pool(even, (m, k), **POOL_ROWS_X2[rows])
    np.testing.assert_array_equal(y, general[:, :, :m, :k])  # NaN in the same places
    at_rows, at_cols = np.divmod(general_argmax[:, :, :m, :k], 2 * k + 1)
    np.testing.assert_array_equal(argmax, at_rows * (2 * k) + at_cols)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize(
    ("kernel", "stride", "pad", "out"), [((2, 2), (2, 2), (0, 0), (3, 2)), ((3, 2), (2, 1), (1, 0), (3, 4))]
)
def test_pool2d_backward_matches_numerical_gradient(kind, kernel, stride, pad, out):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 2, 6, 5))
    dy = rng.standard_normal((2, 2, *out))
    kw = pool_kwargs(kernel, stride, pad)

    def forward(v):
        y, argmax = np.empty((2, 2, *out)), np.empty((2, 2, *out), np.int64)
        _core.pool2d_forward(kind, v, y, argmax=argmax, **kw)
        return y, argmax

    def objective(v):
        return float((forward(v)[0] * dy).sum())

    dx = np.empty_like(x)
    _core.pool2d_backward(kind, dy, dx, argmax=forward(x)[1], **kw)
    np.testing.assert_allclose(dx, ref.numerical_gradient(objective, x.copy()), rtol=1e-6, atol=1e-8)


@given(
    kind=st.sampled_from(["max", "avg", "sum"]),
    shape=st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(1, 5), st.integers(1, 5)),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_global_pool_matches_reference(kind, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    y = np.full(shape[:2], np.nan, dtype)
    argmax = np.full(shape[:2], -1, np.int64) if kind == "max" else None
    _core.global_pool_forward(kind, x, y, argmax=argmax)
    expected, expected_argmax = ref.global_pool_forward(kind, x)
    np.testing.assert_allclose(y, expected, **tol(dtype))
    if kind == "max":
        np.testing.assert_array_equal(argmax, expected_argmax)
    dy = rng.standard_normal(shape[:2]).astype(dtype)
    dx = np.full(shape, np.nan, dtype)
    _core.global_pool_backward(kind, dy, dx, argmax=argmax)
    np.testing.assert_allclose(dx, ref.global_pool_backward(kind, dy, shape, argmax), **tol(dtype))


@pytest.mark.parametrize("kind", ["max", "avg", "sum"])
def test_global_pool_backward_matches_numerical_gradient(kind):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 3, 4))
    dy = rng.standard_normal((2, 3))

    def forward(v):
        y, argmax = np.empty((2, 3)), np.empty((2, 3), np.int64)
        _core.global_pool_forward(kind, v, y, argmax=argmax)
        return y, argmax

    dx = np.empty_like(x)
    _core.global_pool_backward(kind, dy, dx, argmax=forward(x)[1])
    expected = ref.numerical_gradient(lambda v: float((forward(v)[0] * dy).sum()), x.copy())
    np.testing.assert_allclose(dx, expected, rtol=1e-6, atol=1e-8)


POOL = pool_kwargs((2, 2), (2, 2), (0, 0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _core.pool2d_forward("max", np.ones((1, 1, 4, 4)), np.ones((1, 1, 2, 2)), **POOL),
            r"\[pool2d_forward\] argmax is required",
        ),
        (
            lambda: _core.pool2d_forward("min", np.ones((1, 1, 4, 4)), np.ones((1, 1, 2, 2)), **POOL),
            r"\[pool2d_forward\] unknown pooling kind 'min'",
        ),
        (
            lambda: _core.pool2d_forward("avg", np.ones((1, 1, 4, 4)), np.ones((1, 2, 2, 2)), **POOL),
            r"\[pool2d_forward\] y must have shape \(1, 1, P, Q\)",
        ),
        (
            lambda: _core.pool2d_forward("avg", np.ones((1, 1, 4, 4)), np.ones((1, 1, 3, 2)), **POOL),
            r"\[pool2d_forward\] output size \(3, 2\) has pooling windows outside",
        ),
        (
            lambda: _core.pool2d_forward(
                "avg", np.ones((1, 1, 4, 4)), np.ones((1, 1, 2, 2)), **{**POOL, "stride_h": 0}
            ),
            r"\[pool2d_forward\] stride_h must be >= 1",
        ),
        (
            lambda: _core.pool2d_forward(
                "max",
                np.ones((1, 1, 4, 4)),
                np.ones((1, 1, 2, 2)),
                argmax=np.ones((1, 1, 2, 2), np.int32),
                **POOL,
            ),
            r"\[pool2d_forward\] argmax must have dtype int64",
        ),
        (
            lambda: _core.pool2d_backward(
                "max", np.ones((1, 1, 2, 2)), np.ones((1, 1, 4, 4)), argmax=np.full((1, 1, 2, 2), 16), **POOL
            ),
            r"\[pool2d_backward\] argmax value 16 is outside \[0, 16\)",
        ),
        (
            lambda: _core.pool2d_backward("avg", np.ones((1, 1, 2)), np.ones((1, 1, 4, 4)), **POOL),
            r"\[pool2d_backward\] dy must be 4-D",
        ),
        (
            lambda: _core.global_pool_forward("max", np.ones((2, 3, 2, 2)), np.ones((2, 3))),
            r"\[global_pool_forward\] argmax is required",
        ),
        (
            lambda: _core.global_pool_forward("avg", np.ones((2, 3, 2, 2)), np.ones((3, 2))),
            r"\[global_pool_forward\] y must have shape \(2, 3\)",
        ),
        (
            lambda: _core.global_pool_backward("sum", np.ones((2, 3)), np.ones((2, 3, 0, 2))),
            r"\[global_pool_backward\] dx must have a non-empty",
        ),
    ],
)
def test_pooling_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- convolution ---------------------------------------------------------------------------------


@given(
    geo=geometries(),
    n=st.integers(0, 3),
    c=st.integers(1, 3),
    k=st.integers(1, 3),
    with_bias=st.booleans(),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_conv2d_matches_reference(geo, n, c, k, with_bias, dtype, seed):
    h, w, kernel, stride, pad, (p, q) = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c, *kernel)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if with_bias else None
    kw = conv_kwargs(stride, pad)
    y = np.full((n, k, p, q), np.nan, dtype)
    _core.conv2d_forward(x, wt, b, y, **kw)
    np.testing.assert_allclose(y, ref.conv2d_forward(x, wt, b, (p, q), stride, pad), **tol(dtype))
    dy = rng.standard_normal((n, k, p, q)).astype(dtype)
    dx = np.full(x.shape, np.nan, dtype)
    _core.conv2d_backward_input(dy, wt, dx, **kw)
    np.testing.assert_allclose(dx, ref.conv2d_backward_input(dy, wt, x.shape, stride, pad), **tol(dtype))
    dw = np.full(wt.shape, np.nan, dtype)
    _core.conv2d_backward_weight(x, dy, dw, **kw)
    np.testing.assert_allclose(dw, ref.conv2d_backward_weight(x, dy, wt.shape, stride, pad), **tol(dtype))


@given(
    geo=geometries(max_size=9),
    n=st.integers(16, 41),
    c=st.integers(1, 4),
    k=st.integers(1, 4),
    with_bias=st.booleans(),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_conv2d_groups_images_of_small_planes_like_the_reference(geo, n, c, k, with_bias, dtype, seed):
    # Batches of >= 16 images with small output planes share one GEMM per group of images (n / 8 per
    # group at most, the last group shorter when n is not a multiple): every pass against the reference.
    h, w, kernel, stride, pad, (p, q) = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c, *kernel)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if with_bias else None
    dy = rng.standard_normal((n, k, p, q)).astype(dtype)
    kw = conv_kwargs(stride, pad)
    y, dx, dw = (
        np.full((n, k, p, q), np.nan, dtype),
        np.full(x.shape, np.nan, dtype),
        np.full(wt.shape, np.nan, dtype),
    )
    _core.conv2d_forward(x, wt, b, y, **kw)
    _core.conv2d_backward_input(dy, wt, dx, **kw)
    _core.conv2d_backward_weight(x, dy, dw, **kw)
    np.testing.assert_allclose(y, ref.conv2d_forward(x, wt, b, (p, q), stride, pad), **tol(dtype))
    np.testing.assert_allclose(dx, ref.conv2d_backward_input(dy, wt, x.shape, stride, pad), **tol(dtype))
    # dw sums n * p * q products per entry: the float32 tolerance grows with that reduction length.
    scale = {"rtol": 1e-4, "atol": 1e-6 * n * p * q} if dtype == np.float32 else tol(dtype)
    np.testing.assert_allclose(dw, ref.conv2d_backward_weight(x, dy, wt.shape, stride, pad), **scale)


@given(
    geo=geometries(max_size=9),
    n=st.sampled_from([0, 1, 3, 17, 40]),
    c=st.integers(1, 4),
    k=st.integers(1, 4),
    with_y=st.booleans(),
    threads=st.sampled_from([1, 2]),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_conv2d_forward_backward_weight_matches_reference(geo, n, c, k, with_y, threads, dtype, seed):
    # One im2col of x for y = conv(x, w) (None: skipped) and dw: both against the reference and the same
    # bits as the two front doors (y is computed as conv2d_forward computes it, dw is conv2d_backward_weight).
    h, w, kernel, stride, pad, (p, q) = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c, *kernel)).astype(dtype)
    dy = rng.standard_normal((n, k, p, q)).astype(dtype)
    kw = conv_kwargs(stride, pad)
    y = np.full((n, k, p, q), np.nan, dtype) if with_y else None
    dw = np.full(wt.shape, np.nan, dtype)
    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(threads)
        _core.conv2d_forward_backward_weight(x, wt, dy, y, dw, **kw)
        alone_y, alone_dw = np.empty((n, k, p, q), dtype), np.empty(wt.shape, dtype)
        _core.conv2d_forward(x, wt, None, alone_y, **kw)
        _core.conv2d_backward_weight(x, dy, alone_dw, **kw)
    finally:
        sparkgrad.set_num_threads(before)
    scale = {"rtol": 1e-4, "atol": 1e-6 * max(1, n * p * q)} if dtype == np.float32 else tol(dtype)
    np.testing.assert_allclose(dw, ref.conv2d_backward_weight(x, dy, wt.shape, stride, pad), **scale)
    np.testing.assert_array_equal(dw, alone_dw)
    if with_y:
        np.testing.assert_allclose(y, ref.conv2d_forward(x, wt, None, (p, q), stride, pad), **tol(dtype))
        np.testing.assert_array_equal(y, alone_y)


@given(
    geo=geometries(max_size=9),
    n=st.sampled_from([0, 1, 3, 17]),
    c=st.integers(1, 4),
    k=st.integers(1, 4),
    with_bias=st.booleans(),
    activation=st.sampled_from(["identity", "relu"]),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_conv2d_backward_input_epilogue_matches_reference(geo, n, c, k, with_bias, activation, dtype, seed):
    # The bias and relu epilogue of the input gradient (a transposed convolution's forward), on every
    # path: stride 1 (the flipped forward, its own epilogue), strided col2im, phase planes.
    h, w, kernel, stride, pad, (p, q) = geo
    rng = np.random.default_rng(seed)
    wt = rng.standard_normal((k, c, *kernel)).astype(dtype)
    b = rng.standard_normal(c).astype(dtype) if with_bias else None
    dy = rng.standard_normal((n, k, p, q)).astype(dtype)
    dx = np.full((n, c, h, w), np.nan, dtype)
    _core.conv2d_backward_input(dy, wt, dx, **conv_kwargs(stride, pad), b=b, activation=activation)
    want = ref.conv2d_backward_input(dy, wt, dx.shape, stride, pad)
    if with_bias:
        want = want + b[None, :, None, None]
    if activation == "relu":
        want = np.maximum(want, 0)
    np.testing.assert_allclose(dx, want, **tol(dtype))


def test_conv2d_backward_input_epilogue_rejects_bad_arguments():
    dy, wt, dx = np.ones((1, 3, 2, 2)), np.ones((3, 2, 2, 2)), np.ones((1, 2, 3, 3))
    with pytest.raises(ValueError, match=r"\[conv2d_backward_input\] b must have shape \(2,\)"):
        _core.conv2d_backward_input(dy, wt, dx, **conv_kwargs((1, 1), (0, 0)), b=np.ones(3))
    with pytest.raises(ValueError, match=r"\[conv2d_backward_input\] activation must be identity or relu"):
        _core.conv2d_backward_input(dy, wt, dx, **conv_kwargs((1, 1), (0, 0)), activation="tanh")
    with pytest.raises(ValueError, match=r"\[conv2d_forward_backward_weight\] dw must have shape"):
        _core.conv2d_forward_backward_weight(
            dx, wt, dy, None, np.ones((2, 2, 2, 2)), **conv_kwargs((1, 1), (0, 0))
        )


def test_conv2d_chunks_large_batches_like_small_ones():
    # 1x1 kernels over a 64x64 image: the column matrix of 300 images exceeds one chunk (2^22 elements).
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 1, 64, 64)).astype(np.float32)
    wt = rng.standard_normal((2, 1, 1, 1)).astype(np.float32)
    y = np.empty((300, 2, 64, 64), np.float32)
    _core.conv2d_forward(x, wt, None, y, stride_h=1, stride_w=1, pad_top=0, pad_left=0)
    np.testing.assert_allclose(y, x * wt[:, 0, 0, 0][None, :, None, None], rtol=1e-6)
    dw = np.empty_like(wt)
    _core.conv2d_backward_weight(x, y, dw, stride_h=1, stride_w=1, pad_top=0, pad_left=0)
    np.testing.assert_allclose(dw[:, 0, 0, 0], (x * y).sum(axis=(0, 2, 3)), rtol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "stride", "pad", "out", "algorithm"),
    [
        ((2, 2, 4, 5), (3, 2, 2, 2), (1, 1), (0, 0), (3, 4), "auto"),
        ((2, 2, 4, 5), (3, 2, 2, 2), (2, 1), (1, 1), (3, 5), "auto"),
        ((2, 2, 4, 5), (3, 2, 2, 2), (2, 2), (0, 1), (2, 3), "auto"),  # "same" on 4x5
        # Winograd F(2x2, 3x3), forced on shapes below its automatic channel count, with every padding
        ((2, 3, 5, 6), (2, 3, 3, 3), (1, 1), (1, 1), (5, 6), "winograd"),
        ((2, 3, 5, 6), (2, 3, 3, 3), (1, 1), (0, 2), (3, 8), "winograd"),
        ((2, 3, 5, 6), (2, 3, 3, 3), (1, 1), (2, 0), (7, 4), "winograd"),
    ],
)
def test_conv2d_backward_matches_numerical_gradient(x_shape, w_shape, stride, pad, out, algorithm):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape)
    wt = rng.standard_normal(w_shape)
    n_out = w_shape[0]
    b = rng.standard_normal(n_out)
    dy = rng.standard_normal((x_shape[0], n_out, *out))
    kw = {**conv_kwargs(stride, pad), "algorithm": algorithm}

    def objective(x_, w_):
        y = np.empty((x_shape[0], n_out, *out))
        _core.conv2d_forward(x_, w_, b, y, **kw)
        return float((y * dy).sum())

    dx, dw = np.empty_like(x), np.empty_like(wt)
    _core.conv2d_backward_input(dy, wt, dx, **kw)
    _core.conv2d_backward_weight(x, dy, dw, **kw)
    np.testing.assert_allclose(
        dx, ref.numerical_gradient(lambda v: objective(v, wt), x.copy()), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        dw, ref.numerical_gradient(lambda v: objective(x, v), wt.copy()), rtol=1e-6, atol=1e-8
    )
    db = np.empty(n_out)
    _core.bias_grad(dy, db)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)))


CONV = conv_kwargs((1, 1), (0, 0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _core.conv2d_forward(
                np.ones((1, 2, 4, 4)), np.ones((3, 1, 2, 2)), None, np.ones((1, 3, 3, 3)), **CONV
            ),
            r"\[conv2d_forward\] w must have shape \(K, 2, R, S\)",
        ),
        (
            lambda: _core.conv2d_forward(
                np.ones((1, 2, 4, 4)), np.ones((3, 2, 2, 2)), None, np.ones((1, 2, 3, 3)), **CONV
            ),
            r"\[conv2d_forward\] y must have shape \(1, 3, P, Q\)",
        ),
        (
            lambda: _core.conv2d_forward(
                np.ones((1, 2, 4, 4)), np.ones((3, 2, 2, 2)), np.ones(2), np.ones((1, 3, 3, 3)), **CONV
            ),
            r"\[conv2d_forward\] b must have shape \(3,\)",
        ),
        (
            lambda: _core.conv2d_forward(
                np.ones((2, 4, 4)), np.ones((3, 2, 2, 2)), None, np.ones((1, 3, 3, 3)), **CONV
            ),
            r"\[conv2d_forward\] x must be 4-D",
        ),
        (
            lambda: _core.conv2d_forward(
                np.ones((1, 2, 4, 4)),
                np.ones((3, 2, 2, 2)),
                None,
                np.ones((1, 3, 3, 3)),
                **{**CONV, "pad_top": -1},
            ),
            r"\[conv2d_forward\] pad_top must be >= 0",
        ),
        (
            lambda: _core.conv2d_backward_input(
                np.ones((1, 3, 3, 3), np.float32), np.ones((3, 2, 2, 2)), np.ones((1, 2, 4, 4)), **CONV
            ),
            r"\[conv2d_backward_input\] w must have dtype float32",
        ),
        (
            lambda: _core.conv2d_backward_weight(
                np.ones((1, 2, 4, 4)), np.ones((2, 3, 3, 3)), np.ones((3, 2, 2, 2)), **CONV
            ),
            r"\[conv2d_backward_weight\] dy must have shape \(1, 3, P, Q\)",
        ),
    ],
)
def test_conv2d_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_conv2d_same_result_for_one_and_two_threads_and_restores_blas_threads():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 3, 9, 9))
    wt = rng.standard_normal((4, 3, 3, 3))
    dy = rng.standard_normal((6, 4, 7, 7))
    kw = conv_kwargs((1, 1), (0, 0))

    def run():
        y, dx, dw = np.empty((6, 4, 7, 7)), np.empty_like(x), np.empty_like(wt)
        _core.conv2d_forward(x, wt, None, y, **kw)
        _core.conv2d_backward_input(dy, wt, dx, **kw)
        _core.conv2d_backward_weight(x, dy, dw, **kw)
        return y, dx, dw

    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(1)
        one = run()
        sparkgrad.set_num_threads(2)
        two = run()
        assert "(2 threads)" in _core.blas_info()  # the single-threaded BLAS hold was released
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])
    np.testing.assert_array_equal(one[2], two[2])  # a fixed number of partials, not one per thread


def test_conv2d_from_concurrent_python_threads():
    # The GIL is released: several Python threads convolve at once and the shared BLAS hold is restored.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((8, 2, 10, 10)).astype(np.float32)
    wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    expected = ref.conv2d_forward(x, wt, None, (8, 8), (1, 1), (0, 0))
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                y = np.empty((8, 3, 8, 8), np.float32)
                _core.conv2d_forward(x, wt, None, y, **conv_kwargs((1, 1), (0, 0)))
                results.append(y)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(2)
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "(2 threads)" in _core.blas_info()
    finally:
        sparkgrad.set_num_threads(before)
    assert not errors and len(results) == 60
    for y in results:
        np.testing.assert_allclose(y, expected, **tol(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("c", "k", "hw"), [(16, 16, 28), (16, 32, 14), (32, 16, 14)])
def test_conv2d_on_shapes_whose_gemms_run_in_pieces(dtype, c, k, hw) -> None:
    """16-32 channels over 14x14-28x28 planes: GEMMs of more than 1e6 multiply-adds, which the kernels cut
    into column pieces (gemm_in_small_pieces); the hypothesis tests' small planes never reach that size.
    Each result is a sum of K products, so |error| <= gamma_K * (sum of |products|) (Higham), doubled for
    the float64 reference's own rounding; the sums of |products| are the same passes on |inputs|."""
    rng = np.random.default_rng(c * k + hw)
    n, same = 3, ((1, 1), (1, 1))
    x, wt = rng.standard_normal((n, c, hw, hw)).astype(dtype), rng.standard_normal((k, c, 3, 3)).astype(dtype)
    dy = rng.standard_normal((n, k, hw, hw)).astype(dtype)
    unit = np.finfo(dtype).eps / 2

    def bound(terms: int, magnitudes: np.ndarray) -> np.ndarray:
        return 2 * terms * unit / (1 - terms * unit) * magnitudes

    y, dx, dw = (
        np.full(dy.shape, np.nan, dtype),
        np.full(x.shape, np.nan, dtype),
        np.full(wt.shape, np.nan, dtype),
    )
    _core.conv2d_forward(x, wt, None, y, 1, 1, 1, 1)
    _core.conv2d_backward_input(dy, wt, dx, 1, 1, 1, 1)
    _core.conv2d_backward_weight(x, dy, dw, 1, 1, 1, 1)
    ax, aw, ady = np.abs(x), np.abs(wt), np.abs(dy)
    assert np.all(
        np.abs(y - ref.conv2d_forward(x, wt, None, (hw, hw), *same))
        <= bound(c * 9, ref.conv2d_forward(ax, aw, None, (hw, hw), *same))
    )
    assert np.all(
        np.abs(dx - ref.conv2d_backward_input(dy, wt, x.shape, *same))
        <= bound(k * 9, ref.conv2d_backward_input(ady, aw, x.shape, *same))
    )
    assert np.all(
        np.abs(dw - ref.conv2d_backward_weight(x, dy, wt.shape, *same))
        <= bound(n * hw * hw, ref.conv2d_backward_weight(ax, ady, wt.shape, *same))
    )
