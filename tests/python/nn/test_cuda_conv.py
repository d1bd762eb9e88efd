"""The GPU convolutions against the CPU twin, through the kernels a network on the GPU calls: cuDNN where the
build has it (``algorithm="auto"`` and ``"cudnn"``) and the own im2col + cuBLAS kernels (``"im2col"``), over
the geometries a network asks for (same and truncate padding, strides, 1x1, uneven "same" padding that
cuDNN cannot express), float32 and float64, with the fused bias and relu. Each bound is the worst case of
a sum of ``terms`` products each rounded once: ``terms`` x eps x the largest product, as in
test_cuda_kernels.py. Runs on a GPU machine only (marker ``cuda``)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from prerequisites import require_gpu
from sparkgrad._native import _core
from sparkgrad.device import resolve_device

ULPS = 16  # as test_cuda_kernels.py: each product and partial sum rounds at most a few ulps

# (n, c, h, w, k, r, s, stride_h, stride_w, pad_top, pad_left, p, q)
GEOMETRIES = {
    "same3x3": (4, 3, 12, 10, 8, 3, 3, 1, 1, 1, 1, 12, 10),
    "truncate5x5": (3, 2, 11, 9, 4, 5, 5, 1, 1, 0, 0, 7, 5),
    "stride2": (2, 5, 13, 12, 6, 3, 3, 2, 2, 1, 1, 7, 6),
    "pointwise": (5, 16, 7, 7, 9, 1, 1, 1, 1, 0, 0, 7, 7),
    "rect": (3, 4, 9, 8, 5, 3, 2, 2, 1, 1, 0, 5, 7),
    # DL4J "same" with stride 2 on an even size: one row and column of padding, all at the bottom/right
    "uneven_same": (2, 3, 8, 8, 4, 3, 3, 2, 2, 0, 0, 4, 4),
}
UNEVEN = {"uneven_same"}


@pytest.fixture(scope="module")
def cp() -> Any:
    return require_gpu()


@pytest.fixture(scope="module")
def kernels(cp: Any) -> Any:
    return resolve_device("cuda:0").kernels


def _has_cudnn(kernels: Any, cp: Any) -> bool:
    """Whether this build runs convolutions through cuDNN: an explicit request on a shape it can compute
    either runs or says that sparkgrad was built without it."""
    x, w, y = (
        cp.ones((1, 1, 3, 3), np.float32),
        cp.ones((1, 1, 3, 3), np.float32),
        cp.empty((1, 1, 1, 1), np.float32),
    )
    try:
        kernels.conv2d_forward(x, w, None, y, 1, 1, 0, 0, algorithm="cudnn")
    except ValueError as e:
        assert "built without cuDNN" in str(e), e
        return False
    return True


def _check(got: Any, want: np.ndarray, terms: int, largest_product: float) -> None:
    eps = np.finfo(want.dtype).eps
    error = np.abs(got.get() - want)
    assert np.all(np.isfinite(got.get())), "non-finite or unwritten output"
    assert error.max() <= terms * ULPS * eps * largest_product, (
        error.max(),
        terms * ULPS * eps * largest_product,
    )


def _run(kernels: Any, cp: Any, name: str, dtype: Any, algorithm: str, relu: bool, seed: int) -> None:
    n, c, h, w, k, r, s, sh, sw, pt, pl, p, q = GEOMETRIES[name]
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c, h, w)).astype(dtype)
    wt = rng.normal(size=(k, c, r, s)).astype(dtype)
    b = rng.normal(size=(k,)).astype(dtype)
    dy = rng.normal(size=(n, k, p, q)).astype(dtype)
    geo = (sh, sw, pt, pl)
    act = "relu" if relu else "identity"
    y, dx, dw = np.empty((n, k, p, q), dtype), np.empty_like(x), np.empty_like(wt)
    _core.conv2d_forward(x, wt, b, y, *geo, activation=act)
    _core.conv2d_backward_input(dy, wt, dx, *geo)
    _core.conv2d_backward_weight(x, dy, dw, *geo)
    # poisoned outputs: every element must be written
    gy, gdx, gdw = (cp.full(a.shape, np.nan, dtype) for a in (y, dx, dw))
    gx, gw, gdy = cp.asarray(x), cp.asarray(wt), cp.asarray(dy)
    kernels.conv2d_forward(gx, gw, cp.asarray(b), gy, *geo, activation=act, algorithm=algorithm)
    kernels.conv2d_backward_input(gdy, gw, gdx, *geo, algorithm=algorithm)
    kernels.conv2d_backward_weight(gx, gdy, gdw, *geo, algorithm=algorithm)
    xw = float(np.abs(x).max() * np.abs(wt).max())
    _check(gy, y, c * r * s + 1, xw + float(np.abs(b).max()))
    _check(gdx, dx, k * r * s, float(np.abs(dy).max() * np.abs(wt).max()))
    _check(gdw, dw, n * p * q, float(np.abs(dy).max() * np.abs(x).max()))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algorithm", ["auto", "cudnn", "im2col"])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_gpu_convolution_matches_the_cpu(
    kernels: Any, cp: Any, name: str, algorithm: str, dtype: Any
) -> None:
    if algorithm == "cudnn" and not _has_cudnn(kernels, cp):
        pytest.skip("this build has no cuDNN")
    if algorithm == "cudnn" and name in UNEVEN:
        pytest.skip("cuDNN cannot pad unevenly: test_cudnn_refuses_uneven_padding")
    for seed, relu in ((1, False), (2, True)):
        _run(kernels, cp, name, dtype, algorithm, relu, seed)


@pytest.mark.cuda
def test_cudnn_refuses_uneven_padding_by_name(kernels: Any, cp: Any) -> None:
    if not _has_cudnn(kernels, cp):
        pytest.skip("this build has no cuDNN")
    n, c, h, w, k, r, s, sh, sw, pt, pl, p, q = GEOMETRIES["uneven_same"]
    x, wt, y = (
        cp.ones((n, c, h, w), np.float32),
        cp.ones((k, c, r, s), np.float32),
        cp.empty((n, k, p, q), np.float32),
    )
    with pytest.raises(
        ValueError, match=r"\[conv2d_forward\] algorithm 'cudnn': cuDNN pads both sides evenly"
    ):
        kernels.conv2d_forward(x, wt, None, y, sh, sw, pt, pl, algorithm="cudnn")


@pytest.mark.cuda
def test_cudnn_is_deterministic_and_shares_plans_between_threads(kernels: Any, cp: Any) -> None:
    """The weight gradient sums over the batch: an algorithm reducing with atomics would change its last
    bits from run to run. Four threads on their own CuPy streams run the same shapes (one plan, found by
    whichever thread came first) and must give the bits of the first run."""
    rng = np.random.default_rng(7)
    x = cp.asarray(rng.normal(size=(32, 16, 20, 20)).astype(np.float32))
    dy = cp.asarray(rng.normal(size=(32, 24, 20, 20)).astype(np.float32))
    first = cp.empty((24, 16, 3, 3), np.float32)
    kernels.conv2d_backward_weight(x, dy, first, 1, 1, 1, 1)
    want = first.get().tobytes()
    results: list[bytes] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with cp.cuda.Device(0), cp.cuda.Stream(non_blocking=True) as stream:
                for _ in range(3):
                    dw = cp.empty((24, 16, 3, 3), np.float32)
                    kernels.conv2d_backward_weight(x, dy, dw, 1, 1, 1, 1)
                    stream.synchronize()
                    results.append(dw.get().tobytes())
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results and all(r == want for r in results)


@pytest.mark.cuda
def test_cudnn_convolution_runs_on_cupys_current_stream(kernels: Any, cp: Any) -> None:
    # x is filled by CuPy on a non-blocking stream; a convolution queued elsewhere could read it unfilled
    with cp.cuda.Stream(non_blocking=True) as stream:
        x = cp.zeros((64, 32, 32, 32), np.float32)
        for _ in range(20):
            x += 0.5
        w = cp.ones((8, 32, 1, 1), np.float32)
        y = cp.empty((64, 8, 32, 32), np.float32)
        kernels.conv2d_forward(x, w, None, y, 1, 1, 0, 0)
        stream.synchronize()
    assert float(y.min()) == float(y.max()) == 320.0  # 32 channels x 10
