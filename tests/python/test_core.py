"""The native core's plumbing: BLAS GEMM, threading control and build information."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sparkgrad
from sparkgrad import _core
from sparkgrad.cli import main as cli_main


@given(
    m=st.integers(0, 40),
    n=st.integers(0, 40),
    k=st.integers(0, 40),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_gemm_matches_numpy(m, n, k, trans_a, trans_b, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    expected = (a.T if trans_a else a) @ (b.T if trans_b else b)
    got = _core.gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    assert got.dtype == dtype and got.shape == (m, n)
    np.testing.assert_allclose(got, expected, rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-4)


def test_gemm_accumulates_into_out_with_beta():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    out = np.ones((3, 5))
    _core.gemm(a, b, alpha=2.0, beta=0.5, out=out)
    np.testing.assert_allclose(out, 2.0 * a @ b + 0.5, rtol=1e-12)


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "message"),
    [
        (np.ones((2, 3), np.float32), np.ones((4, 2), np.float32), {}, r"\[gemm\] inner dimensions differ"),
        (np.ones((2, 3), np.int64), np.ones((3, 2), np.int64), {}, r"\[gemm\] a must be float32 or float64"),
        (np.ones((2, 3), np.float32), np.ones((3, 2), np.float64), {}, r"\[gemm\] b must have dtype float32"),
        (np.ones(3, np.float32), np.ones((3, 2), np.float32), {}, r"\[gemm\] a and b must be 2-D"),
        (np.ones((2, 3)), np.ones((3, 2)), {"beta": 1.0}, r"\[gemm\] beta != 0 needs an `out`"),
        (
            np.ones((2, 3)),
            np.ones((3, 2)),
            {"out": np.ones((3, 3))},
            r"\[gemm\] out must have shape \(2, 2\)",
        ),
        (np.ones((3, 2)).T, np.ones((3, 2)), {}, r"\[gemm\] a must be C-contiguous"),
    ],
)
def test_gemm_rejects_bad_arguments(a, b, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _core.gemm(a, b, **kwargs)


def test_set_num_threads_round_trips_and_validates():
    before = sparkgrad.get_num_threads()
    try:
        sparkgrad.set_num_threads(1)
        assert sparkgrad.get_num_threads() == 1
    finally:
        sparkgrad.set_num_threads(before)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        sparkgrad.set_num_threads(0)


def test_info_reports_build_facts(capsys):
    facts = sparkgrad.info()
    assert facts["openmp_threads"] >= 1
    assert "OpenBLAS" in facts["blas"]
    assert facts["cuda_available"] in (True, False)
    assert cli_main(["info"]) == 0
    printed = capsys.readouterr().out
    assert "OpenBLAS" in printed and "cuda_available" in printed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_take_arrays_whose_dtype_object_is_not_numpys_own(dtype):
    # an unpickled array (a Spark task's data) carries its own, equal dtype descriptor object
    a = pickle.loads(pickle.dumps(np.arange(6, dtype=dtype).reshape(2, 3)))
    b = pickle.loads(pickle.dumps(np.ones((3, 2), dtype=dtype)))
    assert a.dtype is not np.dtype(dtype) and a.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(_core.gemm(a, b), a @ b)
    update = pickle.loads(pickle.dumps(np.array([0.5, -2.0, 0.1], dtype=dtype)))
    residual = np.zeros(3, dtype=dtype)
    _core.accumulate(residual, update)
    np.testing.assert_array_equal(residual, update)
    with pytest.raises(ValueError, match="float32 or float64"):  # a byte-swapped dtype is not the same
        _core.gemm(a.astype(a.dtype.newbyteorder()), b)
