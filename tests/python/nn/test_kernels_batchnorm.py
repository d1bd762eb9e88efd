"""Native batch normalization against the NumPy reference and numerical gradients."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import nn as ref

from sparkgrad import _core


def tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-9, "atol": 1e-10}


def affine_bound(x, gamma, beta, mean, var, eps, terms):
    """Per-element rounding bound of y = scale * x + shift, the kernel's folded form: scale = gamma /
    sqrt(var + eps) and shift = beta - mean * scale are rounded to x's dtype, so y carries a few ulps of
    |scale * x| + |shift|, which cancel where x is near the mean (y -> beta; scale ~ 316 |gamma| once the
    variance is 0, as for one example); statistics of ``terms`` values add ``terms`` ulps of them."""
    u = np.finfo(x.dtype).eps
    x64 = np.abs(x.astype(np.float64))
    axes = (0,) + tuple(range(2, x.ndim))
    scale = np.abs(ref._per_channel(gamma, x)) / np.sqrt(ref._per_channel(var, x) + eps)
    magnitude = scale * (x64.max(axis=axes, keepdims=True) + np.abs(ref._per_channel(mean, x)))
    return 4 * (terms + 2) * u * (magnitude + np.abs(ref._per_channel(beta, x)))


def train_forward(x, gamma, beta, running_mean, running_var, decay=0.9, eps=1e-5):
    c = x.shape[1]
    y, mean, var = np.empty_like(x), np.empty(c, x.dtype), np.empty(c, x.dtype)
    _core.batchnorm_forward_train(x, gamma, beta, y, mean, var, running_mean, running_var, decay, eps)
    return y, mean, var


@given(
    shape=st.one_of(
        st.tuples(st.integers(1, 8), st.integers(1, 5)),
        st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    ),
    decay=st.floats(0.0, 1.0),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_batchnorm_matches_reference(shape, decay, dtype, seed):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (3 * rng.standard_normal(shape) + 1).astype(dtype)
    gamma, beta = rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)
    running_mean, running_var = rng.standard_normal(c).astype(dtype), rng.random(c).astype(dtype)
    rm0, rv0 = running_mean.astype(np.float64), running_var.astype(np.float64)
    eps = 1e-5
    y, mean, var = train_forward(x, gamma, beta, running_mean, running_var, decay, eps)
    ey, emean, evar = ref.batchnorm_forward_train(x, gamma, beta, eps)
    m = x.size // c  # each channel's statistics reduce m values
    assert np.all(np.abs(y - ey) <= affine_bound(x, gamma, beta, emean, evar, eps, m)), np.abs(y - ey).max()
    np.testing.assert_allclose(mean, emean, **tol(dtype))
    np.testing.assert_allclose(var, evar, **tol(dtype))
    np.testing.assert_allclose(running_mean, decay * rm0 + (1 - decay) * emean, **tol(dtype))
    np.testing.assert_allclose(running_var, decay * rv0 + (1 - decay) * evar, **tol(dtype))

    y_inf = np.empty_like(x)
    _core.batchnorm_forward_inference(x, gamma, beta, running_mean, running_var, y_inf, eps)
    ey_inf = ref.batchnorm_forward_inference(x, gamma, beta, running_mean, running_var, eps)
    bound = affine_bound(x, gamma, beta, running_mean, running_var, eps, 1)
    assert np.all(np.abs(y_inf - ey_inf) <= bound), np.abs(y_inf - ey_inf).max()

    dy = rng.standard_normal(shape).astype(dtype)
    dx, dgamma, dbeta = np.empty_like(x), np.empty(c, dtype), np.empty(c, dtype)
    _core.batchnorm_backward(x, dy, gamma, mean, var, dx, dgamma, dbeta, eps)
    edx, edgamma, edbeta = ref.batchnorm_backward(x, dy, gamma, mean, var, eps)
    np.testing.assert_allclose(dx, edx, **tol(dtype))
    np.testing.assert_allclose(dgamma, edgamma, **tol(dtype))
    np.testing.assert_allclose(dbeta, edbeta, **tol(dtype))


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 2, 3)])
def test_batchnorm_backward_matches_numerical_gradient(shape):
    rng = np.random.default_rng(11)
    c = shape[1]
    x = rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(c), rng.standard_normal(c)
    dy = rng.standard_normal(shape)

    def objective(x_, gamma_, beta_):
        y, _, _ = train_forward(x_, gamma_, beta_, np.zeros(c), np.ones(c))
        return float((y * dy).sum())

    _, mean, var = train_forward(x, gamma, beta, np.zeros(c), np.ones(c))
    dx, dgamma, dbeta = np.empty_like(x), np.empty(c), np.empty(c)
    _core.batchnorm_backward(x, dy, gamma, mean, var, dx, dgamma, dbeta, 1e-5)
    np.testing.assert_allclose(
        dx, ref.numerical_gradient(lambda v: objective(v, gamma, beta), x.copy()), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        dgamma, ref.numerical_gradient(lambda v: objective(x, v, beta), gamma.copy()), rtol=1e-6
    )
    np.testing.assert_allclose(
        dbeta, ref.numerical_gradient(lambda v: objective(x, gamma, v), beta.copy()), rtol=1e-6
    )


def test_batchnorm_rejects_bad_arguments_before_touching_running_stats():
    x, c = np.ones((4, 3)), 3
    running_mean = np.full(c, 0.5)
    args = [x, np.ones(c), np.ones(c), np.empty_like(x), np.empty(c), np.empty(c), running_mean, np.ones(c)]
    with pytest.raises(ValueError, match=r"\[batchnorm_forward_train\] running_var must have shape \(3,\)"):
        _core.batchnorm_forward_train(*args[:7], np.ones(4), 0.9, 1e-5)
    with pytest.raises(ValueError, match=r"\[batchnorm_forward_train\] decay must be in \[0, 1\]"):
        _core.batchnorm_forward_train(*args, 1.5, 1e-5)
    with pytest.raises(ValueError, match=r"\[batchnorm_forward_train\] x must be \(N, C\) or \(N, C, H, W\)"):
        _core.batchnorm_forward_train(np.ones(3), *args[1:], 0.9, 1e-5)
    np.testing.assert_array_equal(running_mean, 0.5)
    with pytest.raises(ValueError, match=r"\[batchnorm_forward_inference\] gamma must have dtype float64"):
        _core.batchnorm_forward_inference(
            x, np.ones(c, np.float32), np.ones(c), np.ones(c), np.ones(c), x.copy(), 1e-5
        )
    with pytest.raises(ValueError, match=r"\[batchnorm_backward\] dx must have shape \(4, 3\)"):
        _core.batchnorm_backward(
            x, x, np.ones(c), np.ones(c), np.ones(c), np.ones((3, 4)), np.ones(c), np.ones(c), 1e-5
        )
    with pytest.raises(ValueError, match=r"\[batchnorm_backward\] eps must be >= 0"):
        _core.batchnorm_backward(
            x, x, np.ones(c), np.ones(c), np.ones(c), x.copy(), np.ones(c), np.ones(c), -1.0
        )
