"""Malformed messages and bad arguments: a clear error naming the problem, and nothing modified."""

from __future__ import annotations

import numpy as np
import pytest

import sparkgrad
from sparkgrad import compress

N = 40
T_BITS = 1056964608  # 0.5f


def _sparse(*entries: int, n: int = N) -> np.ndarray:
    return np.array([len(entries), n, T_BITS, 0, *entries], dtype=np.int32)


def _bitmap(n: int = N) -> np.ndarray:
    return np.array([n, n, T_BITS, 1] + [0] * (n // 16 + 1), dtype=np.int32)


def _with(message: np.ndarray, index: int, value: int) -> np.ndarray:
    out = message.copy()
    out[index] = value
    return out


MALFORMED = {
    "short": (np.array([0, N, T_BITS], dtype=np.int32), "header words"),
    "empty": (np.array([], dtype=np.int32), "header words"),
    "flag": (_with(_sparse(1), 3, 2), "flag"),
    "negative flag": (_with(_sparse(1), 3, -1), "flag"),
    "length word": (_with(_sparse(1), 1, N + 1), "elements"),
    "count too large": (_with(_sparse(1, 2), 0, 3), "entries"),
    "count negative": (_with(_sparse(), 0, -1), "entries"),
    "zero index": (_sparse(1, 0, 3), "entry 1 is 0"),
    "index past end": (_sparse(N + 1), "outside"),
    "negative index past end": (_sparse(2, -(N + 1)), "entry 1"),
    "int min index": (_sparse(np.iinfo(np.int32).min), "outside"),
    "nan threshold": (_with(_sparse(1), 2, 0x7FC00000), "threshold"),
    "zero threshold": (_with(_sparse(1), 2, 0), "threshold"),
    "negative threshold": (_with(_sparse(1), 2, -1082130432), "threshold"),
    "inf threshold": (_with(_sparse(1), 2, 0x7F800000), "threshold"),
    "bitmap length": (_bitmap()[:-1], "words"),
    "bitmap extra word": (np.append(_bitmap(), 0).astype(np.int32), "words"),
    "bitmap word 0": (_with(_bitmap(), 0, 3), "word 0"),
    "bitmap bits past end": (_with(_bitmap(), 4 + N // 16, 1 << (N % 16)), "beyond"),
    "bitmap sign bit past end": (_with(_bitmap(), 4 + N // 16, -(1 << 31)), "beyond"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_malformed_message_raises_and_leaves_target_untouched(name, dtype) -> None:
    message, match = MALFORMED[name]
    target = np.random.default_rng(0).normal(size=N).astype(dtype)
    before = target.copy()
    decoders = [compress.decode]
    if len(message) > 3:
        decoders.append(compress.bitmap_decode if message[3] == 1 else compress.threshold_decode)
    for fn in decoders:
        with pytest.raises(ValueError, match=match):
            fn(message, target)
        assert target.tobytes() == before.tobytes()


def test_decoder_rejects_the_other_flag() -> None:
    target = np.zeros(N, dtype=np.float32)
    with pytest.raises(ValueError, match=r"\[threshold_decode\] message flag"):
        compress.threshold_decode(_bitmap(), target)
    with pytest.raises(ValueError, match=r"\[bitmap_decode\] message flag"):
        compress.bitmap_decode(_sparse(1), target)
    assert not target.any()


@pytest.mark.parametrize(
    ("message", "target", "match"),
    [
        (_sparse(1).astype(np.int64), np.zeros(N, np.float32), "message must have dtype int32"),
        (_sparse(1).astype(np.float32), np.zeros(N, np.float32), "message must have dtype int32"),
        (_sparse(1).reshape(1, -1), np.zeros(N, np.float32), "message must be 1-D"),
        (_sparse(1), np.zeros(N, np.int32), "target must have dtype float32 or float64"),
        (_sparse(1), np.zeros(N, np.float16), "target must have dtype float32 or float64"),
        (_sparse(1), np.zeros(2 * N, np.float32)[::2], "target must be C-contiguous"),
        (_sparse(1), np.zeros((N, 1), np.float32), "target must be 1-D"),
        (_sparse(1), np.zeros(N - 1, np.float32), "target has 39"),
    ],
)
def test_decode_argument_errors(message, target, match) -> None:
    before = target.copy()
    with pytest.raises(ValueError, match=match):
        compress.decode(message, target)
    np.testing.assert_array_equal(target, before)


def test_decode_rejects_readonly_and_foreign_targets() -> None:
    target = np.zeros(N, np.float32)
    target.flags.writeable = False
    with pytest.raises(ValueError, match="target must be writable"):
        compress.decode(_sparse(1), target)
    with pytest.raises(ValueError, match="message must be a numpy array"):
        compress.decode(list(_sparse(1)), np.zeros(N, np.float32))


@pytest.mark.parametrize(
    ("threshold", "error", "match"),
    [
        (0.0, ValueError, "threshold must be"),
        (-1.0, ValueError, "threshold must be"),
        (float("nan"), ValueError, "threshold must be"),
        (float("inf"), ValueError, "threshold must be"),
        (1e-50, ValueError, "threshold must be"),  # rounds to 0 as float32
        (1e39, ValueError, "threshold must be"),  # overflows float32
        ("0.1", TypeError, "threshold must be a number"),
        (None, TypeError, "threshold must be a number"),
    ],
)
@pytest.mark.parametrize("encoder", ["threshold_encode", "bitmap_encode"])
def test_encode_rejects_bad_thresholds(threshold, error, match, encoder) -> None:
    residual = np.linspace(-1, 1, 33).astype(np.float32)
    before = residual.copy()
    with pytest.raises(error, match=match):
        getattr(compress, encoder)(residual, threshold)
    np.testing.assert_array_equal(residual, before)


@pytest.mark.parametrize(
    ("residual", "match"),
    [
        (np.zeros(8, np.int32), "residual must have dtype float32 or float64"),
        (np.zeros((2, 4), np.float32), "residual must be 1-D"),
        (np.zeros(16, np.float64)[::2], "residual must be C-contiguous"),
        ([0.5, 1.0], "residual must be a numpy array"),
    ],
)
@pytest.mark.parametrize("encoder", ["threshold_encode", "bitmap_encode"])
def test_encode_rejects_bad_residuals(residual, match, encoder) -> None:
    with pytest.raises(ValueError, match=match):
        getattr(compress, encoder)(residual, 0.1)


def test_encode_rejects_readonly_residual_and_bad_boundary() -> None:
    residual = np.ones(8, np.float32)
    residual.flags.writeable = False
    with pytest.raises(ValueError, match="residual must be writable"):
        compress.threshold_encode(residual, 0.5)
    residual = np.ones(8, np.float32)
    for boundary in (-1, 1.5, "3"):
        with pytest.raises(ValueError, match="boundary"):
            compress.threshold_encode(residual, 0.5, boundary)
    assert np.all(residual == 1)


def test_header_accessors_reject_bad_messages() -> None:
    for bad in (np.array([1, 2], np.int32), np.zeros(4, np.int64), [0, 1, 2, 3]):
        for fn in (compress.message_threshold, compress.message_length):
            with pytest.raises(ValueError, match="message"):
                fn(bad)


class _FakeDeviceArray:
    """Quacks like a CuPy array (never dereferenced: the stand-ins throw first)."""

    def __init__(self, n: int, typestr: str = "<f4") -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (0, False), "version": 3}


class _DlpackOnlyGpuArray:
    """A GPU array known only through DLPack (kDLCUDA = 2): sparkgrad.device.is_gpu_array says GPU."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def test_codecs_name_the_conversion_for_a_dlpack_only_gpu_array() -> None:
    # the codecs read GPU arrays through __cuda_array_interface__: not "must be a numpy array"
    for encode in (compress.threshold_encode, compress.bitmap_encode):
        with pytest.raises(
            TypeError, match=r"a GPU array without __cuda_array_interface__.*cupy\.from_dlpack"
        ):
            encode(_DlpackOnlyGpuArray(), 0.5)


@pytest.mark.skipif(sparkgrad.cuda_available(), reason="a GPU is available: the CUDA path runs for real")
def test_device_arrays_need_a_cuda_build() -> None:
    with pytest.raises(RuntimeError, match=r"\[threshold_encode\] .*CUDA"):
        compress.threshold_encode(_FakeDeviceArray(8), 0.5)
    with pytest.raises(RuntimeError, match=r"\[decode\] .*CUDA"):
        compress.decode(_FakeDeviceArray(5, "<i4"), _FakeDeviceArray(8))
    with pytest.raises(ValueError, match="message must have dtype int32"):
        compress.decode(_FakeDeviceArray(5), _FakeDeviceArray(8))
    with pytest.raises(TypeError, match="both"):
        compress.decode(_sparse(1), _FakeDeviceArray(N))
