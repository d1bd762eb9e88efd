"""Native LSTM, GRU and SimpleRnn kernels (cpp/src/nn/lstm.cpp, gru.cpp, simple_rnn.cpp) against the
step-by-step NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad import _core

ELEMENTWISE = ["tanh", "sigmoid", "identity", "softplus", "hardtanh"]


def _tol(dtype, steps: int, width: int) -> dict:
    """Round-off bound: a step sums ``width`` products and the state carries error over ``steps``."""
    eps = float(np.finfo(dtype).eps)
    bound = 8 * eps * steps * width
    return {"rtol": bound, "atol": bound}


def _flat_views(arrays, dtype) -> list:
    """NaN-filled arrays shaped like ``arrays``, views one after another into one flat buffer (a layer's
    gradient in the network), where the LSTM backward writes [dW; dRW; db] with one product."""
    flat = np.full(sum(a.size for a in arrays), np.nan, dtype)
    views, offset = [], 0
    for a in arrays:
        views.append(flat[offset : offset + a.size].reshape(a.shape))
        offset += a.size
    return views


def _run(x, w, rw, b, dh, mask, h0, c0, act, gate, flat=False):
    n, t, _ = x.shape
    h = rw.shape[0]
    hs, cs, act_c = (np.full((n, t, h), np.nan, x.dtype) for _ in range(3))
    gates = np.full((n, t, 4 * h), np.nan, x.dtype)
    kw = {"mask": mask, "h0": h0, "c0": c0, "activation": act, "gate_activation": gate}
    _core.lstm_forward(x, w, rw, b, hs, cs, gates, act_c, **kw)
    grads = [np.full(x.shape, np.nan, x.dtype)]
    params = (w, rw, b)
    grads += _flat_views(params, x.dtype) if flat else [np.full(a.shape, np.nan, x.dtype) for a in params]
    dgates = np.empty_like(gates)
    _core.lstm_backward(x, w, rw, hs, cs, gates, act_c, dh, dgates, *grads[1:], dx=grads[0], **kw)
    return hs, cs, grads


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3),
    t=st.integers(1, 5),
    c=st.integers(1, 4),
    h=st.integers(1, 4),
    masked=st.booleans(),
    state=st.booleans(),
    act=st.sampled_from(ELEMENTWISE),
    gate=st.sampled_from(["sigmoid", "hardtanh"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
    flat=st.booleans(),
)
def test_lstm_forward_backward_match_reference(n, t, c, h, masked, state, act, gate, dtype, seed, flat):
    rng = np.random.default_rng(seed)
    x, w, rw = (
        rng.normal(size=(n, t, c)),
        0.5 * rng.normal(size=(c, 4 * h)),
        0.5 * rng.normal(size=(h, 4 * h)),
    )
    b, dh = 0.5 * rng.normal(size=4 * h), rng.normal(size=(n, t, h))
    mask = rng.integers(0, 2, (n, t)).astype(np.float64) if masked else None
    h0, c0 = (rng.normal(size=(n, h)), rng.normal(size=(n, h))) if state else (None, None)
    cast = [None if a is None else a.astype(dtype) for a in (x, w, rw, b, dh, mask, h0, c0)]
    # the reference runs on the cast inputs in float64, so only the kernel's own round-off differs
    x, w, rw, b, dh, mask, h0, c0 = [None if a is None else a.astype(np.float64) for a in cast]
    hs, cs, grads = _run(*cast, act, gate, flat=flat)
    ref_hs, ref_cs = ref.lstm_forward(x, w, rw, b, mask, h0, c0, act, gate)
    tol = _tol(dtype, t, c + h)
    np.testing.assert_allclose(hs, ref_hs, **tol)
    np.testing.assert_allclose(cs, ref_cs, **tol)
    if gate == "hardtanh" or act == "hardtanh":
        return  # central differences are not exact at the kinks; the network gradient checks cover them
    expected = ref.lstm_backward(x, w, rw, b, dh, mask, h0, c0, act, gate)
    # central differences carry ~eps64 * |loss| / 1e-6 of round-off on top of the kernel's own
    fd = 1e-6 * (1 + np.abs(dh).sum())
    for name, got, want in zip(("dx", "dw", "drw", "db"), grads, expected):
        bound = _tol(dtype, t, c + h)["atol"] * (1 + np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=bound + fd, err_msg=name)


def test_lstm_masked_steps_output_zero_and_restart_state():
    rng = np.random.default_rng(3)
    x, w, rw, b = (
        rng.normal(size=(1, 4, 2)),
        rng.normal(size=(2, 8)),
        rng.normal(size=(2, 8)),
        rng.normal(size=8),
    )
    mask = np.array([[1.0, 0.0, 1.0, 1.0]])
    hs, cs, _ = _run(x, w, rw, b, np.ones((1, 4, 2)), mask, None, None, "tanh", "sigmoid")
    assert np.all(hs[0, 1] == 0) and np.all(cs[0, 1] == 0)
    # after the masked step the layer continues from a zero state: as if the sequence began at step 2
    tail, _, _ = _run(x[:, 2:].copy(), w, rw, b, np.ones((1, 2, 2)), None, None, None, "tanh", "sigmoid")
    np.testing.assert_allclose(hs[:, 2:], tail, rtol=1e-12, atol=1e-12)


def test_lstm_kernel_errors_name_the_argument():
    x, w, rw, b = np.zeros((2, 3, 4)), np.zeros((4, 8)), np.zeros((2, 8)), np.zeros(8)
    out = [np.zeros((2, 3, 2)), np.zeros((2, 3, 2)), np.zeros((2, 3, 8)), np.zeros((2, 3, 2))]
    with pytest.raises(ValueError, match=r"\[lstm_forward\] w must have shape \(4, 4H\)"):
        _core.lstm_forward(x, np.zeros((4, 7)), rw, b, *out)
    with pytest.raises(ValueError, match=r"\[lstm_forward\] mask must have shape \(2, 3\)"):
        _core.lstm_forward(x, w, rw, b, *out, mask=np.ones((3, 2)))
    with pytest.raises(ValueError, match="softmax"):
        _core.lstm_forward(x, w, rw, b, *out, activation="softmax")
    with pytest.raises(ValueError, match=r"\[lstm_forward\] act_c must have dtype float64"):
        _core.lstm_forward(x, w, rw, b, *out[:3], out[3].astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lstm_backward_first_step_truncates_like_a_sequence_starting_there(dtype):
    """Gradients from first_step on equal those of the tail run from the state the head ended in."""
    rng = np.random.default_rng(8)
    n, t, c, h, k = 3, 6, 2, 3, 4
    x, w, rw = (rng.normal(size=s).astype(dtype) for s in ((n, t, c), (c, 4 * h), (h, 4 * h)))
    b, dh = rng.normal(size=4 * h).astype(dtype), rng.normal(size=(n, t, h)).astype(dtype)
    hs, cs, act_c = (np.empty((n, t, h), dtype) for _ in range(3))
    gates = np.empty((n, t, 4 * h), dtype)
    _core.lstm_forward(x, w, rw, b, hs, cs, gates, act_c)
    grads = [np.empty_like(a) for a in (x, w, rw, b)]
    _core.lstm_backward(
        x, w, rw, hs, cs, gates, act_c, dh, np.empty_like(gates), *grads[1:], dx=grads[0], first_step=k
    )
    h0, c0 = hs[:, k - 1].copy(), cs[:, k - 1].copy()
    tail = _run(x[:, k:].copy(), w, rw, b, dh[:, k:].copy(), None, h0, c0, "tanh", "sigmoid")[2]
    tol = _tol(dtype, t, c + h)
    assert np.all(grads[0][:, :k] == 0)
    np.testing.assert_allclose(grads[0][:, k:], tail[0], **tol)
    for got, want in zip(grads[1:], tail[1:]):
        np.testing.assert_allclose(got, want, **tol)
    with pytest.raises(ValueError, match=r"first_step must be in \[0, 6\)"):
        _core.lstm_backward(
            x, w, rw, hs, cs, gates, act_c, dh, np.empty_like(gates), *grads[1:], first_step=6
        )


# ---- SimpleRnn -----------------------------------------------------------------------------------


def _run_rnn(x, w, rw, b, dh, mask, h0, act, first_step=0):
    n, t, _ = x.shape
    h = rw.shape[0]
    hs, act_out = (np.full((n, t, h), np.nan, x.dtype) for _ in range(2))
    kw = {"mask": mask, "h0": h0, "activation": act, "alpha": 0.3}
    _core.simple_rnn_forward(x, w, rw, b, hs, act_out, **kw)
    grads = [np.full(a.shape, np.nan, x.dtype) for a in (x, w, rw, b)]
    dz = np.full_like(hs, np.nan)
    _core.simple_rnn_backward(
        x, w, rw, hs, act_out, dh, dz, *grads[1:], dx=grads[0], first_step=first_step, **kw
    )
    return hs, act_out, grads


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3),
    t=st.integers(1, 5),
    c=st.integers(1, 4),
    h=st.integers(1, 4),
    masked=st.booleans(),
    state=st.booleans(),
    act=st.sampled_from([*ELEMENTWISE, "relu", "leakyrelu", "elu", "softmax"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_simple_rnn_forward_backward_match_reference(n, t, c, h, masked, state, act, dtype, seed):
    rng = np.random.default_rng(seed)
    x, w, rw = rng.normal(size=(n, t, c)), 0.5 * rng.normal(size=(c, h)), 0.5 * rng.normal(size=(h, h))
    b, dh = 0.5 * rng.normal(size=h), rng.normal(size=(n, t, h))
    mask = rng.integers(0, 2, (n, t)).astype(np.float64) if masked else None
    h0 = rng.normal(size=(n, h)) if state else None
    cast = [None if a is None else a.astype(dtype) for a in (x, w, rw, b, dh, mask, h0)]
    x, w, rw, b, dh, mask, h0 = [None if a is None else a.astype(np.float64) for a in cast]
    hs, act_out, grads = _run_rnn(*cast, act)
    ref_hs = ref.simple_rnn_forward(x, w, rw, b, mask, h0, act, 0.3)
    tol = _tol(dtype, t, c + h)
    np.testing.assert_allclose(hs, ref_hs, **tol)
    if mask is not None:  # act is the activation before the mask: equal to hs on present steps
        present = mask[:, :, None] != 0
        np.testing.assert_array_equal(np.where(present, act_out, 0), hs)
    if act in ("hardtanh", "relu", "leakyrelu", "elu"):
        return  # central differences are not exact at the kinks; the network gradient checks cover them
    expected = ref.simple_rnn_backward(x, w, rw, b, dh, mask, h0, act, 0.3)
    fd = 1e-6 * (1 + np.abs(dh).sum())
    for name, got, want in zip(("dx", "dw", "drw", "db"), grads, expected):
        bound = tol["atol"] * (1 + np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=bound + fd, err_msg=name)


def test_simple_rnn_masked_steps_output_zero_and_restart_state():
    rng = np.random.default_rng(4)
    x, w, rw, b = (
        rng.normal(size=(1, 4, 2)),
        rng.normal(size=(2, 3)),
        rng.normal(size=(3, 3)),
        rng.normal(size=3),
    )
    mask = np.array([[1.0, 0.0, 1.0, 1.0]])
    hs, _, grads = _run_rnn(x, w, rw, b, np.ones((1, 4, 3)), mask, None, "tanh")
    assert np.all(hs[0, 1] == 0) and np.all(grads[0][0, 1] == 0)
    tail, _, _ = _run_rnn(x[:, 2:].copy(), w, rw, b, np.ones((1, 2, 3)), None, None, "tanh")
    np.testing.assert_allclose(hs[:, 2:], tail, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_simple_rnn_backward_first_step_truncates_like_a_sequence_starting_there(dtype):
    """Gradients from first_step on equal those of the tail run from the state the head ended in."""
    rng = np.random.default_rng(9)
    n, t, c, h, k = 3, 6, 2, 3, 4
    x, w, rw = (0.5 * rng.normal(size=s).astype(dtype) for s in ((n, t, c), (c, h), (h, h)))
    b, dh = rng.normal(size=h).astype(dtype), rng.normal(size=(n, t, h)).astype(dtype)
    hs, _, grads = _run_rnn(x, w, rw, b, dh, None, None, "tanh", first_step=k)
    tail = _run_rnn(x[:, k:].copy(), w, rw, b, dh[:, k:].copy(), None, hs[:, k - 1].copy(), "tanh")[2]
    tol = _tol(dtype, t, c + h)
    assert np.all(grads[0][:, :k] == 0)
    np.testing.assert_allclose(grads[0][:, k:], tail[0], **tol)
    for got, want in zip(grads[1:], tail[1:]):
        np.testing.assert_allclose(got, want, **tol)


# ---- GRU -----------------------------------------------------------------------------------------


def _run_gru(x, w, rw, b, dh, mask, h0, act="tanh", gate="sigmoid", first_step=0):
    n, t, _ = x.shape
    h = rw.shape[0]
    hs = np.full((n, t, h), np.nan, x.dtype)
    gates = np.full((n, t, 3 * h), np.nan, x.dtype)
    kw = {"mask": mask, "h0": h0, "activation": act, "gate_activation": gate}
    _core.gru_forward(x, w, rw, b, hs, gates, **kw)
    grads = [np.full(a.shape, np.nan, x.dtype) for a in (x, w, rw, b)]
    dgates = np.full_like(gates, np.nan)
    _core.gru_backward(x, w, rw, hs, gates, dh, dgates, *grads[1:], dx=grads[0], first_step=first_step, **kw)
    return hs, gates, grads


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3),
    t=st.integers(1, 5),
    c=st.integers(1, 4),
    h=st.integers(1, 4),
    masked=st.booleans(),
    state=st.booleans(),
    act=st.sampled_from(ELEMENTWISE),
    gate=st.sampled_from(["sigmoid", "hardtanh"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_gru_forward_backward_match_reference(n, t, c, h, masked, state, act, gate, dtype, seed):
    rng = np.random.default_rng(seed)
    x, w, rw = (
        rng.normal(size=(n, t, c)),
        0.5 * rng.normal(size=(c, 3 * h)),
        0.5 * rng.normal(size=(h, 3 * h)),
    )
    b, dh = 0.5 * rng.normal(size=3 * h), rng.normal(size=(n, t, h))
    mask = rng.integers(0, 2, (n, t)).astype(np.float64) if masked else None
    h0 = rng.normal(size=(n, h)) if state else None
    cast = [None if a is None else a.astype(dtype) for a in (x, w, rw, b, dh, mask, h0)]
    # the reference runs on the cast inputs in float64, so only the kernel's own round-off differs
    x, w, rw, b, dh, mask, h0 = [None if a is None else a.astype(np.float64) for a in cast]
    hs, _, grads = _run_gru(*cast, act, gate)
    tol = _tol(dtype, t, c + h)
    np.testing.assert_allclose(hs, ref.gru_forward(x, w, rw, b, mask, h0, act, gate), **tol)
    if gate == "hardtanh" or act == "hardtanh":
        return  # central differences are not exact at the kinks; the network gradient checks cover them
    expected = ref.gru_backward(x, w, rw, b, dh, mask, h0, act, gate)
    # central differences carry ~eps64 * |loss| / 1e-6 of round-off on top of the kernel's own
    fd = 1e-6 * (1 + np.abs(dh).sum())
    for name, got, want in zip(("dx", "dw", "drw", "db"), grads, expected):
        bound = tol["atol"] * (1 + np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=bound + fd, err_msg=name)


def test_gru_masked_steps_output_zero_and_restart_state():
    rng = np.random.default_rng(6)
    x, w, rw, b = (
        rng.normal(size=(1, 4, 2)),
        rng.normal(size=(2, 9)),
        rng.normal(size=(3, 9)),
        rng.normal(size=9),
    )
    mask = np.array([[1.0, 0.0, 1.0, 1.0]])
    hs, _, grads = _run_gru(x, w, rw, b, np.ones((1, 4, 3)), mask, None)
    assert np.all(hs[0, 1] == 0) and np.all(grads[0][0, 1] == 0)
    # after the masked step the layer continues from a zero state: as if the sequence began at step 2
    tail, _, _ = _run_gru(x[:, 2:].copy(), w, rw, b, np.ones((1, 2, 3)), None, None)
    np.testing.assert_allclose(hs[:, 2:], tail, rtol=1e-12, atol=1e-12)
    unmasked, _, _ = _run_gru(x, w, rw, b, np.ones((1, 4, 3)), None, None)
    assert not np.allclose(unmasked[:, 2:], tail)  # the mask changes the answer


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_backward_first_step_truncates_like_a_sequence_starting_there(dtype):
    """Gradients from first_step on equal those of the tail run from the state the head ended in."""
    rng = np.random.default_rng(10)
    n, t, c, h, k = 3, 6, 2, 3, 4
    x, w, rw = (0.5 * rng.normal(size=s).astype(dtype) for s in ((n, t, c), (c, 3 * h), (h, 3 * h)))
    b, dh = rng.normal(size=3 * h).astype(dtype), rng.normal(size=(n, t, h)).astype(dtype)
    hs, _, grads = _run_gru(x, w, rw, b, dh, None, None, first_step=k)
    tail = _run_gru(x[:, k:].copy(), w, rw, b, dh[:, k:].copy(), None, hs[:, k - 1].copy())[2]
    tol = _tol(dtype, t, c + h)
    assert np.all(grads[0][:, :k] == 0)
    np.testing.assert_allclose(grads[0][:, k:], tail[0], **tol)
    for got, want in zip(grads[1:], tail[1:]):
        np.testing.assert_allclose(got, want, **tol)


def test_gru_kernel_errors_name_the_argument():
    x, w, rw, b = np.zeros((2, 3, 4)), np.zeros((4, 6)), np.zeros((2, 6)), np.zeros(6)
    out = [np.zeros((2, 3, 2)), np.zeros((2, 3, 6))]
    with pytest.raises(ValueError, match=r"\[gru_forward\] w must have shape \(4, 3H\)"):
        _core.gru_forward(x, np.zeros((4, 7)), rw, b, *out)
    with pytest.raises(ValueError, match=r"\[gru_forward\] gates must have shape \(2, 3, 6\)"):
        _core.gru_forward(x, w, rw, b, out[0], np.zeros((2, 3, 8)))
    with pytest.raises(ValueError, match=r"\[gru_forward\] mask must have shape \(2, 3\)"):
        _core.gru_forward(x, w, rw, b, *out, mask=np.ones((3, 2)))
    with pytest.raises(ValueError, match="softmax"):
        _core.gru_forward(x, w, rw, b, *out, activation="softmax")
    grads = [np.zeros_like(a) for a in (w, rw, b)]
    with pytest.raises(ValueError, match=r"\[gru_backward\] first_step must be in \[0, 3\)"):
        _core.gru_backward(x, w, rw, *out, out[0], np.zeros_like(out[1]), *grads, first_step=3)


def _blas_threads_exact(dtype, products) -> bool:
    """Whether OpenBLAS's own GEMM gives the same bits on one and two threads for ``products`` ((m, n, k,
    transpose a) of the kernels' sizes). Where its kernels pick a different accumulation order by the
    call's shape and threading (seen with its Haswell kernels on an AMD EPYC, float32 and some float64
    products), no kernel of ours can make the bits thread-independent."""
    rng = np.random.default_rng(0)
    before = sparkgrad.get_num_threads()
    try:
        for m, n_cols, k, trans_a in products:
            a = rng.normal(size=(k, m) if trans_a else (m, k)).astype(dtype)
            b = rng.normal(size=(k, n_cols)).astype(dtype)
            out = []
            for threads in (1, 2):
                sparkgrad.set_num_threads(threads)
                out.append(_core.gemm(a, b, trans_a))
            if not np.array_equal(*out):
                return False
    finally:
        sparkgrad.set_num_threads(before)
    return True


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cell", ["lstm", "gru", "simple_rnn"])
@pytest.mark.parametrize("n, h", [(40, 128), (64, 256)])
def test_recurrent_kernels_are_bit_identical_for_any_thread_count(dtype, cell, n, h):
    """Rows of a step are split over threads above the fork threshold (n * h >= 4096), and so are the
    column panels of a step's product (the larger shape's LSTM backward also cuts k): same bits, where
    OpenBLAS's GEMM itself gives the same bits on one and two threads; elsewhere (its kernels' choice,
    see _blas_threads_exact) the two agree within float rounding over the longest reduction."""
    rng = np.random.default_rng(5)
    t, c = 3, 5
    g = {"lstm": 4, "gru": 3, "simple_rnn": 1}[cell] * h
    x, w, rw = (0.3 * rng.normal(size=s).astype(dtype) for s in ((n, t, c), (c, g), (h, g)))
    b, dh = rng.normal(size=g).astype(dtype), rng.normal(size=(n, t, h)).astype(dtype)
    mask = rng.integers(0, 2, (n, t)).astype(dtype)
    h0 = rng.normal(size=(n, h)).astype(dtype)
    before = sparkgrad.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            if cell == "lstm":
                hs, cs, grads = _run(x, w, rw, b, dh, mask, h0, h0, "tanh", "sigmoid")
                # and the gradient as one flat buffer: [dW; dRW; db] in one product
                flat = _run(x, w, rw, b, dh, mask, h0, h0, "tanh", "sigmoid", flat=True)[2]
                results.append([hs, cs, *grads, *flat])
            elif cell == "gru":
                hs, gates, grads = _run_gru(x, w, rw, b, dh, mask, h0)
                results.append([hs, gates, *grads])
            else:
                hs, act_out, grads = _run_rnn(x, w, rw, b, dh, mask, h0, "tanh")
                results.append([hs, act_out, *grads])
    finally:
        sparkgrad.set_num_threads(before)
    # the kernels' products: a step's, the gradients' over all steps (transposed), dx's
    products = [(n, g, c + h, False), (c + h + 1, g, n * t, True), (h, g, n * t, True), (n * t, c, g, False)]
    if _blas_threads_exact(dtype, products):
        for one, two in zip(*results):
            np.testing.assert_array_equal(one, two)
        return
    # rounding of reductions up to n * t or g terms, carried through t steps: a few ulps times sqrt(length)
    tolerance = 64 * t * np.finfo(dtype).eps * np.sqrt(max(n * t, g))
    for one, two in zip(*results):
        np.testing.assert_allclose(one, two, rtol=0, atol=tolerance * max(1.0, float(np.abs(one).max())))


def test_simple_rnn_kernel_errors_name_the_argument():
    x, w, rw, b = np.zeros((2, 3, 4)), np.zeros((4, 2)), np.zeros((2, 2)), np.zeros(2)
    out = [np.zeros((2, 3, 2)), np.zeros((2, 3, 2))]
    with pytest.raises(ValueError, match=r"\[simple_rnn_forward\] rw must have shape \(2, 2\)"):
        _core.simple_rnn_forward(x, w, np.zeros((3, 2)), b, *out)
    with pytest.raises(ValueError, match=r"\[simple_rnn_forward\] mask must have shape \(2, 3\)"):
        _core.simple_rnn_forward(x, w, rw, b, *out, mask=np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"\[simple_rnn_forward\] act must have dtype float64"):
        _core.simple_rnn_forward(x, w, rw, b, out[0], out[1].astype(np.float32))
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        _core.simple_rnn_forward(x, w, rw, b, *out, activation="swish")
    grads = [np.zeros_like(a) for a in (w, rw, b)]
    with pytest.raises(ValueError, match=r"\[simple_rnn_backward\] first_step must be in \[0, 3\)"):
        _core.simple_rnn_backward(x, w, rw, *out, out[0], np.zeros_like(out[0]), *grads, first_step=3)


@pytest.mark.parametrize("cell, n, h", [("lstm", 64, 256), ("gru", 64, 256), ("simple_rnn", 64, 512)])
def test_recurrent_kernels_are_right_where_the_step_products_are_cut_into_panels(cell, n, h):
    """Step products above 1e6 multiply-adds run as column panels, here of 8-56 columns, the LSTM's
    float32 backward also with k in two chunks, where OpenBLAS has small-matrix kernels
    (FixedOperandGemm): float64 against the NumPy forward and directional derivatives of the loss
    sum(dh * hs), float32 against float64."""
    rng = np.random.default_rng(11)
    t, c = 3, 5
    g = {"lstm": 4, "gru": 3, "simple_rnn": 1}[cell] * h
    x, w, rw = rng.normal(size=(n, t, c)), rng.normal(size=(c, g)) / c, rng.normal(size=(h, g)) / np.sqrt(h)
    b, dh, h0 = 0.1 * rng.normal(size=g), rng.normal(size=(n, t, h)), rng.normal(size=(n, h))

    def run(x, w, rw, b, dh, h0):
        if cell == "lstm":
            hs, _, grads = _run(x, w, rw, b, dh, None, h0, h0, "tanh", "sigmoid")
        elif cell == "gru":
            hs, _, grads = _run_gru(x, w, rw, b, dh, None, h0)
        else:
            hs, _, grads = _run_rnn(x, w, rw, b, dh, None, h0, "tanh")
        return hs, grads

    hs, grads = run(x, w, rw, b, dh, h0)
    if cell == "lstm":
        expected = ref.lstm_forward(x, w, rw, b, None, h0, h0, "tanh", "sigmoid")[0]
    elif cell == "gru":
        expected = ref.gru_forward(x, w, rw, b, None, h0)
    else:
        expected = ref.simple_rnn_forward(x, w, rw, b, None, h0, "tanh", 0.3)
    np.testing.assert_allclose(hs, expected, **_tol(np.float64, t, c + h))
    inputs = [x, w, rw, b]
    for i, grad in enumerate(grads):
        direction = rng.normal(size=inputs[i].shape)
        eps = 1e-6
        loss = []
        for sign in (1, -1):
            moved = list(inputs)
            moved[i] = inputs[i] + sign * eps * direction
            loss.append(float(np.sum(dh * run(*moved, dh, h0)[0])))
        numeric = (loss[0] - loss[1]) / (2 * eps)
        # central differences: O(eps^2) truncation and ~eps64 * |loss| / eps of round-off
        assert float(np.sum(grad * direction)) == pytest.approx(numeric, rel=1e-6, abs=1e-6)
    hs32, grads32 = run(*(a.astype(np.float32) for a in (x, w, rw, b, dh, h0)))
    tol = _tol(np.float32, t, c + h)
    np.testing.assert_allclose(hs32, hs, **tol)
    for got, want in zip(grads32, grads):
        np.testing.assert_allclose(got, want, rtol=0, atol=tol["atol"] * (1 + np.abs(want).max()))
