"""The GPU encoders write the CPU encoders' bytes (cuda/compress/threshold.cu: per-tile compaction ordered
by a block scan, a scan of the tiles' counts and a gather, so entries are ascending whatever the launch
order), including the values where float comparisons are easy to get wrong, unaligned vectors (scalar
loads) and more tiles than the count scan has threads, and lead to the same sparse/bitmap choice."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparkgrad import compress, cuda
from sparkgrad._native import _core

pytestmark = pytest.mark.cuda

# around the 16-byte loads and the tiles (4096 floats, 2048 doubles), and many tiles
SIZES = [1, 15, 16, 17, 511, 512, 513, 2047, 2048, 4097, 100_003]
MANY_TILES = 5_000_011  # > 1024 tiles in both dtypes: the count scan's threads take several each


@pytest.fixture
def cp() -> Any:
    if not (cuda.built() and _core.cuda_available()):
        pytest.skip("CUDA build with a visible GPU is required")
    return pytest.importorskip("cupy")


def _residual(n: int, dtype: Any, density: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = (rng.normal(size=n) * 0.1).astype(dtype)
    special = np.array(
        [
            0.5,
            -0.5,
            np.nan,
            np.inf,
            -np.inf,
            -0.0,
            np.finfo(dtype).tiny / 4,
            np.nextafter(dtype(0.5), dtype(0)),
        ],
        dtype=dtype,
    )
    picks = rng.random(n) < density
    r[picks] = special[rng.integers(0, special.size, int(picks.sum()))]
    return r


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("density", [0.001, 0.05, 0.6])
@pytest.mark.parametrize("boundary", [None, 3])
def test_gpu_threshold_encode_is_byte_identical_to_cpu(
    cp: Any, n: int, dtype: Any, density: float, boundary: Any
) -> None:
    host = _residual(n, dtype, density, seed=n)
    cpu_residual = host.copy()
    expected = compress.threshold_encode(cpu_residual, 0.5, boundary)
    gpu_residual = cp.asarray(host)
    message = compress.threshold_encode(gpu_residual, 0.5, boundary)
    assert message.get().tobytes() == expected.tobytes()
    assert gpu_residual.get().tobytes() == cpu_residual.tobytes()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("density", [0.001, 0.05, 0.6])
def test_gpu_bitmap_and_format_choice_match_cpu(cp: Any, n: int, dtype: Any, density: float) -> None:
    host = _residual(n, dtype, density, seed=n + 1)
    cpu_residual, gpu_residual = host.copy(), cp.asarray(host)
    expected, expected_count = compress.bitmap_encode(cpu_residual, 0.5)
    message, count = compress.bitmap_encode(gpu_residual, 0.5)
    assert message.get().tobytes() == expected.tobytes() and count == expected_count
    assert gpu_residual.get().tobytes() == cpu_residual.tobytes()
    # the handler's choice (sparse when header + entries <= bitmap length) from the GPU's count
    smaller, dense = _core.encode_smaller(host.copy(), 0.5)
    sparse = compress.threshold_encode(cp.asarray(host), 0.5)
    gpu_dense = not (sparse.size <= n // 16 + 5)
    assert gpu_dense == dense
    chosen = (compress.bitmap_encode(cp.asarray(host), 0.5)[0] if gpu_dense else sparse).get()
    assert chosen.tobytes() == smaller.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [0, 1, 3], ids=["aligned", "offset1", "offset3"])
def test_gpu_threshold_encode_of_many_tiles_and_unaligned_views(cp: Any, dtype: Any, offset: int) -> None:
    host = _residual(MANY_TILES + offset, dtype, 0.01, seed=offset)
    cpu_residual = host[offset:].copy()
    expected = compress.threshold_encode(cpu_residual, 0.5)
    on_gpu = cp.asarray(host)
    gpu_residual = on_gpu[offset:]  # a view: 4 or 8 bytes past an aligned start when offset > 0
    assert (gpu_residual.data.ptr % 16 == 0) == (offset * np.dtype(dtype).itemsize % 16 == 0)
    message = compress.threshold_encode(gpu_residual, 0.5)
    assert message.get().tobytes() == expected.tobytes()
    assert on_gpu[offset:].get().tobytes() == cpu_residual.tobytes()
    assert on_gpu[:offset].get().tobytes() == host[:offset].tobytes()
