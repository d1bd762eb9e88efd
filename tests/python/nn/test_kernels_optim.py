"""Native updaters and regularization against the DL4J reference formulas, step by step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import nn as ref

from sparkgrad import _core

HYPER = {"lr": 0.05, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6, "momentum": 0.7, "rms_decay": 0.9, "rho": 0.85}


@pytest.mark.parametrize(("kind", "blocks"), sorted(ref.UPDATER_STATE.items()))
def test_updater_state_size(kind, blocks):
    assert _core.updater_state_size(kind, 7) == 7 * blocks
    assert _core.updater_state_size(kind, 0) == 0


@given(
    kind=st.sampled_from(sorted(ref.UPDATER_STATE)),
    n=st.integers(0, 50),
    steps=st.integers(1, 6),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_updater_apply_matches_reference_over_iterations(kind, n, steps, dtype, seed):
    rng = np.random.default_rng(seed)
    state = np.zeros(_core.updater_state_size(kind, n), dtype)
    ref_state = state.astype(np.float64)
    for iteration in range(steps):
        grad = rng.standard_normal(n).astype(dtype)
        expected, ref_state = ref.updater_step(kind, grad, ref_state, iteration, **HYPER)
        _core.updater_apply(
            kind,
            grad,
            state,
            iteration,
            learning_rate=HYPER["lr"],
            beta1=HYPER["beta1"],
            beta2=HYPER["beta2"],
            epsilon=HYPER["eps"],
            momentum=HYPER["momentum"],
            rms_decay=HYPER["rms_decay"],
            rho=HYPER["rho"],
        )
        rtol = 2e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(grad, expected, rtol=rtol, atol=1e-6 if dtype == np.float32 else 1e-13)
        np.testing.assert_allclose(state, ref_state, rtol=rtol, atol=1e-6 if dtype == np.float32 else 1e-13)


def test_adam_first_step_is_learning_rate_times_sign():
    # With zero state, DL4J Adam's first update is lr * g / (|g| + eps * ...) ~= lr * sign(g).
    grad = np.array([0.5, -2.0, 3.0])
    state = np.zeros(6)
    _core.updater_apply("adam", grad, state, 0, learning_rate=0.01, epsilon=1e-12)
    np.testing.assert_allclose(grad, [0.01, -0.01, 0.01], rtol=1e-9)


@given(
    n=st.integers(0, 40),
    l1=st.floats(0, 1),
    l2=st.floats(0, 1),
    coeff=st.floats(0, 1),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_regularization_matches_reference(n, l1, l2, coeff, dtype, seed):
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(n).astype(dtype)
    params[: n // 5] = 0  # sign(0) == 0
    grad = rng.standard_normal(n).astype(dtype)
    expected = ref.regularize_gradient(params.astype(np.float64), grad.astype(np.float64), l1, l2)
    _core.regularize_gradient(params, grad, l1, l2)
    np.testing.assert_allclose(grad, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    update = rng.standard_normal(n).astype(dtype)
    expected = update.astype(np.float64) + coeff * params
    _core.apply_weight_decay(params, update, coeff)
    np.testing.assert_allclose(update, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


def test_regularization_works_on_multidimensional_weight_views():
    params = np.arange(-3.0, 3.0).reshape(2, 3)
    grad = np.zeros((2, 3))
    _core.regularize_gradient(params, grad, 0.5, 0.1)
    np.testing.assert_allclose(grad, 0.1 * params + 0.5 * np.sign(params))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _core.updater_state_size("lamb", 3), r"\[updater_state_size\] unknown updater 'lamb'"),
        (
            lambda: _core.updater_apply("adam", np.ones(3), np.zeros(3), 0),
            r"\[updater_apply\] state must have shape \(6,\)",
        ),
        (
            lambda: _core.updater_apply("sgd", np.ones(3), np.zeros(0), -1),
            r"\[updater_apply\] iteration must be >= 0",
        ),
        (
            lambda: _core.updater_apply("adam", np.ones(3), np.zeros(6), 0, beta1=1.0),
            r"\[updater_apply\] beta1 must be in \[0, 1\)",
        ),
        (
            lambda: _core.updater_apply("adam", np.ones(3, np.float32), np.zeros(6), 0),
            r"\[updater_apply\] state must have dtype float32",
        ),
        (
            lambda: _core.updater_apply("sgd", np.ones((3, 1)), np.zeros(0), 0),
            r"\[updater_apply\] gradient must be 1-D",
        ),
        (
            lambda: _core.regularize_gradient(np.ones(3), np.ones(4), 0.1, 0.1),
            r"\[regularize_gradient\] grad must have shape",
        ),
        (
            lambda: _core.apply_weight_decay(np.ones(3, np.int64), np.ones(3), 0.1),
            r"\[apply_weight_decay\] params must be float32",
        ),
    ],
)
def test_optim_kernels_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_rejected_update_leaves_state_untouched():
    grad, state = np.ones(3), np.full(5, 0.25)
    with pytest.raises(ValueError):
        _core.updater_apply("adam", grad, state, 0)
    np.testing.assert_array_equal(grad, 1.0)
    np.testing.assert_array_equal(state, 0.25)
