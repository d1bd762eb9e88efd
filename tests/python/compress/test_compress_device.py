"""The codecs on each device (numpy on cpu, CuPy on cuda): same bytes as the NumPy reference, malformed
messages rejected with the target untouched. The cuda cases run on a CUDA build with a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from reference import compress as ref

from sparkgrad import compress
from sparkgrad.compress import ResidualClippingPostProcessor

SIZES = [0, 1, 17, 1000, 300_001]


def _xp(device: str):
    if device == "cuda":
        import cupy

        return cupy
    return np


def _host(arr) -> np.ndarray:
    return arr.get() if hasattr(arr, "get") else np.asarray(arr)


def _residual(n: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = rng.normal(size=n)
    r[rng.random(n) < 0.05] = 0.5  # exactly the threshold
    return r.astype(dtype)


def _encode_into(xp, residual, boundary):
    """threshold_encode_into a buffer with spare words, then the message it holds."""
    n = residual.shape[0]
    out = xp.full(4 + (n if boundary is None else min(n, boundary)) + 3, -7, dtype=np.int32)
    compress.threshold_encode_into(residual, 0.5, out, boundary)
    return out[: 4 + int(_host(out[:1])[0])]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("boundary", [None, 7])
@pytest.mark.parametrize("into", [False, True], ids=["threshold_encode", "threshold_encode_into"])
def test_threshold_encode_on_device_matches_reference(device, n, dtype, boundary, into) -> None:
    xp = _xp(device)
    host = _residual(n, dtype)
    expected, expected_residual = ref.threshold_encode(host, 0.5, boundary)
    residual = xp.asarray(host)
    if into:
        message = _encode_into(xp, residual, boundary)
    else:
        message = compress.threshold_encode(residual, 0.5, boundary)
    assert _host(message).tobytes() == expected.tobytes()
    assert _host(residual).tobytes() == expected_residual.tobytes()
    target = xp.zeros(n, dtype=dtype)
    compress.decode(message, target)
    np.testing.assert_array_equal(_host(target), ref.decode(expected, np.zeros(n, dtype)))


@pytest.mark.parametrize(
    ("out", "error", "match"),
    [
        (np.zeros(6, np.int32), ValueError, r"out must hold at least 7 words, got 6"),
        (np.zeros(7, np.int64), ValueError, "out must have dtype int32"),
        (np.zeros((7, 1), np.int32), ValueError, "1-D"),
    ],
)
def test_threshold_encode_into_refuses_a_buffer_before_encoding(device, out, error, match) -> None:
    xp = _xp(device)
    residual = xp.asarray(np.array([1.0, 0.0, -1.0], np.float32))
    with pytest.raises(error, match=match):
        compress.threshold_encode_into(residual, 0.5, xp.asarray(out))
    np.testing.assert_array_equal(_host(residual), [1.0, 0.0, -1.0])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bitmap_on_device_matches_reference(device, n, dtype) -> None:
    xp = _xp(device)
    host = _residual(n, dtype, seed=1)
    expected, expected_count, expected_residual = ref.bitmap_encode(host, 0.5)
    residual = xp.asarray(host)
    message, count = compress.bitmap_encode(residual, 0.5)
    assert _host(message).tobytes() == expected.tobytes()
    assert count == expected_count
    assert _host(residual).tobytes() == expected_residual.tobytes()
    target = xp.ones(n, dtype=dtype)
    compress.bitmap_decode(message, target)
    np.testing.assert_array_equal(_host(target), ref.decode(expected, np.ones(n, dtype)))


@pytest.mark.parametrize(
    "message",
    [
        [1, 10, 1056964608, 0, 11],
        [2, 10, 1056964608, 0, 1, 0],
        [1, 10, 1056964608, 3, 1],
        [10, 10, 1056964608, 1, 1 << 10],
        [1, 10, 0, 0, 1],
    ],
)
def test_malformed_message_on_device_leaves_target_untouched(device, message) -> None:
    xp = _xp(device)
    target = xp.arange(10, dtype=np.float32)
    with pytest.raises(ValueError):
        compress.decode(xp.asarray(np.array(message, dtype=np.int32)), target)
    np.testing.assert_array_equal(_host(target), np.arange(10, dtype=np.float32))


def test_residual_clipping_on_device(device) -> None:
    xp = _xp(device)
    host = np.linspace(-3, 3, 101)
    residual = xp.asarray(host)
    ResidualClippingPostProcessor(2.0, 5).process_residual(10, 0, 0.5, residual)
    np.testing.assert_array_equal(_host(residual), np.clip(host, -1.0, 1.0))
