"""Native bias, activation and loss kernels against the NumPy references and numerical gradients."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core

DTYPES = st.sampled_from([np.float32, np.float64])
SEEDS = st.integers(0, 2**31 - 1)


def tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}


@st.composite
def channel_shapes(draw):
    n, c = draw(st.integers(0, 5)), draw(st.integers(1, 6))
    return (n, c) if draw(st.booleans()) else (n, c, draw(st.integers(1, 5)), draw(st.integers(1, 5)))


@given(shape=channel_shapes(), dtype=DTYPES, seed=SEEDS)
def test_bias_add_and_grad_match_reference(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    expected = ref.bias_add(x, b)
    _core.bias_add(x, b)
    np.testing.assert_allclose(x, expected, **tol(dtype))
    db = np.full(shape[1], np.nan, dtype)
    _core.bias_grad(x, db)
    np.testing.assert_allclose(db, ref.bias_grad(x), **tol(dtype))


@given(
    n=st.integers(1, 300),
    c=st.integers(1, 130),
    inner=st.sampled_from([1, 1, 7, 64]),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_bias_grad_of_large_batches_matches_reference_for_any_thread_count(n, c, inner, dtype, seed):
    # Large enough for the blocked, parallel reduction (n * c * inner >= 2^15 for most draws).
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((n, c, inner, 1) if inner > 1 else (n, c)).astype(dtype)
    before = sparkgrad.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            db = np.full(c, np.nan, dtype)
            _core.bias_grad(dy, db)
            results.append(db)
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])
    # Sums in double of exact inputs: one final rounding to dtype, plus the double additions.
    magnitude = np.abs(dy.astype(np.float64)).sum(axis=tuple(a for a in range(dy.ndim) if a != 1))
    bound = np.finfo(dtype).eps * np.abs(ref.bias_grad(dy)) + dy.size * np.finfo(np.float64).eps * magnitude
    assert np.all(np.abs(results[0] - ref.bias_grad(dy)) <= bound)


@given(
    name=st.sampled_from(ref.ACTIVATIONS),
    rows=st.integers(0, 6),
    cols=st.integers(1, 7),
    extra=st.sampled_from([(), (3,), (2, 2)]),
    alpha=st.floats(0.0, 2.0),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_activation_forward_backward_match_reference(name, rows, cols, extra, alpha, dtype, seed):
    shape = (rows, cols) if name == "softmax" else (rows, cols, *extra)
    rng = np.random.default_rng(seed)
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y = np.empty_like(x)
    _core.activation_forward(name, x, y, alpha=alpha)
    np.testing.assert_allclose(y, ref.activation(name, x, alpha), **tol(dtype))
    dx = np.empty_like(x)
    _core.activation_backward(name, x, y, dy, dx, alpha=alpha)
    np.testing.assert_allclose(dx, ref.activation_backward(name, x, dy, alpha), **tol(dtype))
    # In place: y aliases x, dx aliases dy.
    x_inplace = x.copy()
    _core.activation_forward(name, x_inplace, x_inplace, alpha=alpha)
    np.testing.assert_array_equal(x_inplace, y)
    _core.activation_backward(name, x, y, dy, dy, alpha=alpha)
    np.testing.assert_array_equal(dy, dx)


def test_softmax_is_stable_for_huge_inputs():
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]], np.float32)
    y = np.empty_like(x)
    _core.activation_forward("softmax", x, y)
    np.testing.assert_allclose(y, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("name", ref.ACTIVATIONS)
def test_activation_backward_matches_numerical_gradient(name):
    rng = np.random.default_rng(7)
    x = 2 * rng.standard_normal((4, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep clear of relu / hardtanh kinks
    x[np.abs(np.abs(x) - 1) < 1e-3] = 0.5
    dy = rng.standard_normal(x.shape)
    alpha = 0.3

    def objective(v):
        out = np.empty_like(v)
        _core.activation_forward(name, v, out, alpha=alpha)
        return float((out * dy).sum())

    y = np.empty_like(x)
    _core.activation_forward(name, x, y, alpha=alpha)
    dx = np.empty_like(x)
    _core.activation_backward(name, x, y, dy, dx, alpha=alpha)
    np.testing.assert_allclose(dx, ref.numerical_gradient(objective, x.copy()), rtol=1e-6, atol=1e-7)


# Output activations each loss is checked with (log losses need probabilities in (0, 1)).
LOSS_ACTIVATIONS = {
    "mcxent": ["softmax", "sigmoid"],
    "negativeloglikelihood": ["softmax"],
    "xent": ["sigmoid", "softmax"],
    "kl_divergence": ["softmax", "sigmoid"],
    "mse": ["identity", "tanh", "softmax", "leakyrelu"],
    "l2": ["identity", "sigmoid", "elu"],
    "l1": ["identity", "softplus", "softmax"],
    "hinge": ["identity", "tanh"],
    "squared_hinge": ["identity", "hardtanh"],
}
LOSS_CASES = [(loss, act) for loss, acts in LOSS_ACTIVATIONS.items() for act in acts]


def make_labels(loss, rng, n, c):
    if loss in ("mcxent", "negativeloglikelihood"):
        return np.eye(c)[rng.integers(0, c, n)]
    if loss == "kl_divergence":
        y = rng.random((n, c)) * (rng.random((n, c)) > 0.3)
        return y / np.maximum(y.sum(axis=1, keepdims=True), 1e-12)
    if loss == "xent":
        return rng.random((n, c))
    if loss in ("hinge", "squared_hinge"):
        return rng.choice([-1.0, 1.0], (n, c))
    return rng.standard_normal((n, c))


@given(
    case=st.sampled_from(LOSS_CASES),
    n=st.integers(0, 6),
    c=st.integers(1, 6),
    mask_kind=st.sampled_from([None, "example", "example2d", "output"]),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_loss_score_and_gradient_match_reference(case, n, c, mask_kind, dtype, seed):
    loss, act = case
    rng = np.random.default_rng(seed)
    labels = make_labels(loss, rng, n, c).astype(dtype)
    preout = (2 * rng.standard_normal((n, c))).astype(dtype)
    mask = {
        None: None,
        "example": (rng.random(n) > 0.3).astype(dtype),
        "example2d": rng.random((n, 1)).astype(dtype),
        "output": (rng.random((n, c)) > 0.3).astype(dtype),
    }[mask_kind]
    scores = np.full(n, np.nan, dtype)
    _core.loss_score(loss, act, labels, preout, scores, mask=mask, alpha=0.2)
    np.testing.assert_allclose(scores, ref.loss_score(loss, act, labels, preout, mask, 0.2), **tol(dtype))
    grad = np.full((n, c), np.nan, dtype)
    _core.loss_gradient(loss, act, labels, preout, grad, mask=mask, alpha=0.2)
    expected = ref.loss_gradient(loss, act, labels, preout, mask, 0.2)
    np.testing.assert_allclose(grad, expected, rtol=1e-3 if dtype == np.float32 else 1e-9, atol=1e-5)


@pytest.mark.parametrize(("loss", "act"), LOSS_CASES)
@pytest.mark.parametrize("masked", [False, True])
def test_loss_gradient_matches_numerical_gradient(loss, act, masked):
    rng = np.random.default_rng(3)
    n, c = 4, 3
    labels = make_labels(loss, rng, n, c)
    preout = rng.standard_normal((n, c))
    mask = rng.random(n) if masked else None  # per-example weights: the gradient stays exact

    def objective(z):
        scores = np.empty(n)
        _core.loss_score(loss, act, labels, z, scores, mask=mask, alpha=0.2)
        return float(scores.sum())

    grad = np.empty((n, c))
    _core.loss_gradient(loss, act, labels, preout, grad, mask=mask, alpha=0.2)
    np.testing.assert_allclose(grad, ref.numerical_gradient(objective, preout.copy()), rtol=1e-5, atol=1e-7)


def test_mcxent_softmax_score_is_stable_and_clipped():
    preout = np.array([[500.0, -500.0], [0.0, 0.0]])
    labels = np.array([[0.0, 1.0], [1.0, 0.0]])
    scores = np.empty(2)
    _core.loss_score("mcxent", "softmax", labels, preout, scores)
    np.testing.assert_allclose(scores, [-np.log(1e-10), np.log(2.0)])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _core.bias_add(np.ones((2, 3)), np.ones(4)), r"\[bias_add\] b must have shape \(3,\)"),
        (
            lambda: _core.bias_add(np.ones(3), np.ones(3)),
            r"\[bias_add\] x must be \(N, C\) or \(N, C, H, W\)",
        ),
        (
            lambda: _core.bias_add(np.ones((2, 3), np.float32), np.ones(3)),
            r"\[bias_add\] b must have dtype float32",
        ),
        (lambda: _core.bias_grad(np.ones((2, 3), np.int32), np.ones(3)), r"\[bias_grad\] dy must be float32"),
        (
            lambda: _core.activation_forward("gelu", np.ones(2), np.ones(2)),
            r"\[activation_forward\] unknown activation",
        ),
        (
            lambda: _core.activation_forward("softmax", np.ones(3), np.ones(3)),
            r"\[activation_forward\] x must be 2-D \(N, C\) for softmax",
        ),
        (
            lambda: _core.activation_forward("relu", np.ones(3), np.ones(4)),
            r"\[activation_forward\] y must have shape",
        ),
        (
            lambda: _core.activation_backward("relu", np.ones(3), np.ones(3), np.ones(3), np.ones(3)[::-1]),
            r"\[activation_backward\] dx must be C-contiguous",
        ),
        (
            lambda: _core.loss_score("mse", "identity", np.ones((2, 3)), np.ones((2, 3)), np.ones(3)),
            r"\[loss_score\] scores must have shape \(2,\)",
        ),
        (
            lambda: _core.loss_gradient(
                "mse", "identity", np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)), mask=np.ones(3)
            ),
            r"\[loss_gradient\] mask must have shape",
        ),
        (
            lambda: _core.loss_gradient(
                "cosine", "identity", np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3))
            ),
            r"\[loss_gradient\] unknown loss 'cosine'",
        ),
        (
            lambda: _core.loss_score("mse", "identity", np.ones((2, 4)), np.ones((2, 3)), np.ones(2)),
            r"\[loss_score\] labels must have shape \(2, 3\)",
        ),
    ],
)
def test_dense_kernels_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_read_only_output_is_rejected_without_writing():
    y = np.zeros(3)
    y.flags.writeable = False
    with pytest.raises(ValueError, match=r"\[activation_forward\] y must be writable"):
        _core.activation_forward("relu", np.ones(3), y)
    np.testing.assert_array_equal(y, 0.0)


def test_threaded_gemm_on_the_openmp_pool_from_concurrent_python_threads():
    # OpenBLAS hands its jobs to the OpenMP pool (common/blas.cpp); big products from several Python
    # threads at once must neither deadlock nor mix up results.
    rng = np.random.default_rng(13)
    mats = [(rng.standard_normal((300, 200)), rng.standard_normal((200, 250))) for _ in range(4)]
    results: dict[int, np.ndarray] = {}
    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(2)
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, _core.gemm(*mats[i])))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sparkgrad.set_num_threads(before)
    for i, (a, b) in enumerate(mats):
        np.testing.assert_allclose(results[i], a @ b, rtol=1e-10, atol=1e-10)
