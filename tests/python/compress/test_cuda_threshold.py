"""The GPU encoders write the CPU encoders' bytes and leave the CPU's residual (cuda/compress/threshold.cu:
one pass whose tiles learn their offsets by a decoupled look-back, so entries are ascending whatever order
the blocks run in). Covered: tile boundaries and tails, more tiles than one look-back window (32) and
than the GPU holds at once, unaligned views (scalar loads), limits below, at and above the count, counts
around the bitmap's break-even (encode_smaller stops its sparse pass one entry past it and restores what
it moved), values where a float comparison or an undo by adding back would go wrong, both dtypes, the
encode that does not wait for the GPU, and streams and threads sharing the per-thread workspace."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from prerequisites import require_gpu
from sparkgrad import compress, cuda
from sparkgrad._native import _core

pytestmark = pytest.mark.cuda

TILE = {np.float32: 4096, np.float64: 2048}  # elements per tile (threshold.cu kTile)
# around the 16-byte loads and the tiles of both dtypes, and over two look-back windows of 32 tiles
SIZES = [0, 1, 15, 16, 17, 511, 512, 513, 2047, 2048, 2049, 4095, 4096, 4097, 100_003, 70 * 4096 + 5]
MANY_TILES = 5_000_011  # more tiles than an H200 holds resident at once, in both dtypes
LARGE = (1 << 24) + 3  # the benchmark's size, with a tail


@pytest.fixture
def cp() -> Any:
    return require_gpu()


def _specials(dtype: Any) -> np.ndarray:
    # the threshold (0.5) and its neighbour below, NaN, infinities, -0, a subnormal, and a value that
    # (v - t) + t does not give back (2^(mantissa bits) + 1): only a saved copy restores it
    big = 2.0 ** np.finfo(dtype).nmant + 1
    tiny = np.finfo(dtype).tiny / 4
    below = np.nextafter(dtype(0.5), dtype(0))
    return np.array([0.5, -0.5, np.nan, np.inf, -np.inf, -0.0, tiny, below, big, -big], dtype=dtype)


def _residual(n: int, dtype: Any, density: float, seed: int) -> np.ndarray:
    """Normal values (0.1 scale: a few qualify) with a `density` of them replaced by special values."""
    rng = np.random.default_rng(seed)
    r = (rng.normal(size=n) * 0.1).astype(dtype)
    special = _specials(dtype)
    picks = rng.random(n) < density
    r[picks] = special[rng.integers(0, special.size, int(picks.sum()))]
    return r


def _with_count(n: int, dtype: Any, count: int, seed: int) -> np.ndarray:
    """Exactly `count` elements qualify for threshold 0.5 (specials among them); the others stay below it,
    half of them at or below -0.25 (the bitmap's half code)."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(-0.49, 0.49, n).astype(dtype)
    qualifying = np.array([0.5, -0.5, np.inf, -np.inf, 2.0 ** np.finfo(dtype).nmant + 1, -3.0], dtype=dtype)
    at = rng.choice(n, count, replace=False)
    r[at] = qualifying[rng.integers(0, qualifying.size, count)]
    return r


def _expect_same_encode(cp: Any, host: np.ndarray, boundary: Any) -> None:
    cpu_residual = host.copy()
    expected = compress.threshold_encode(cpu_residual, 0.5, boundary)
    gpu_residual = cp.asarray(host)
    message = compress.threshold_encode(gpu_residual, 0.5, boundary)
    assert message.get().tobytes() == expected.tobytes()
    assert gpu_residual.get().tobytes() == cpu_residual.tobytes()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("density", [0.0, 0.001, 0.05, 0.6])
@pytest.mark.parametrize("boundary", [None, 0, 3])
def test_gpu_threshold_encode_is_byte_identical_to_cpu(
    cp: Any, n: int, dtype: Any, density: float, boundary: Any
) -> None:
    _expect_same_encode(cp, _residual(n, dtype, density, seed=n), boundary)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shift", [-1, 0, 1], ids=["below", "exact", "above"])
def test_gpu_threshold_encode_with_limit_around_the_count(cp: Any, dtype: Any, shift: int) -> None:
    host = _residual(70 * TILE[dtype] + 5, dtype, 0.05, seed=3)
    count = int((np.abs(host) >= 0.5).sum())
    _expect_same_encode(cp, host, count + shift)
    # a limit inside a tile, and one at a tile's first entry
    first_of_tile_9 = int((np.abs(host[: 9 * TILE[dtype]]) >= 0.5).sum())
    _expect_same_encode(cp, host, first_of_tile_9 + shift)


@pytest.mark.parametrize("n", [MANY_TILES, LARGE])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [0, 1, 3], ids=["aligned", "offset1", "offset3"])
def test_gpu_threshold_encode_of_many_tiles_and_unaligned_views(
    cp: Any, n: int, dtype: Any, offset: int
) -> None:
    host = _residual(n + offset, dtype, 0.01, seed=offset)
    cpu_residual = host[offset:].copy()
    expected = compress.threshold_encode(cpu_residual, 0.5)
    on_gpu = cp.asarray(host)
    gpu_residual = on_gpu[offset:]  # a view: 4 or 8 bytes past an aligned start when offset > 0
    assert (gpu_residual.data.ptr % 16 == 0) == (offset * np.dtype(dtype).itemsize % 16 == 0)
    message = compress.threshold_encode(gpu_residual, 0.5)
    assert message.get().tobytes() == expected.tobytes()
    assert on_gpu[offset:].get().tobytes() == cpu_residual.tobytes()
    assert on_gpu[:offset].get().tobytes() == host[:offset].tobytes()


def _gpu_encode_smaller(cp: Any, residual: Any) -> tuple[np.ndarray, bool]:
    return cuda.launch(_core.cuda_encode_smaller, residual.data.ptr, residual.size, residual.dtype, 0.5)


def _expect_same_choice(cp: Any, host: np.ndarray) -> bool:
    cpu_residual = host.copy()
    expected, expected_bitmap = _core.encode_smaller(cpu_residual, 0.5)
    gpu_residual = cp.asarray(host)
    message, bitmap = _gpu_encode_smaller(cp, gpu_residual)
    assert isinstance(message, np.ndarray) and message.dtype == np.int32
    assert (bitmap, message.tobytes()) == (expected_bitmap, expected.tobytes())
    assert gpu_residual.get().tobytes() == cpu_residual.tobytes()
    return bool(bitmap)


@pytest.mark.parametrize("n", [1, 16, 17, 40, 4097, 100_003, (1 << 20) + 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_encode_smaller_chooses_and_encodes_as_the_cpu(cp: Any, n: int, dtype: Any) -> None:
    payload = n // 16 + 1  # the bitmap's payload words: sparse is smaller up to this many entries
    formats = set()
    for count in sorted({0, 1, payload - 1, payload, payload + 1, payload + 2, n // 2, n}):
        if 0 <= count <= n:
            formats.add(_expect_same_choice(cp, _with_count(n, dtype, count, seed=count)))
    assert formats == ({False} if n <= payload else {False, True})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_encode_smaller_of_messages_longer_than_the_first_copy(cp: Any, dtype: Any) -> None:
    n = 1 << 20  # bitmap payload 65537 words; the first copy takes 4096 words or 1.25x the last message
    for count in (100, 50_000, 60_000, 5_000, 65_537, 65_538, 20_000, 0, 65_537):
        _expect_same_choice(cp, _with_count(n, dtype, count, seed=count))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("density", [0.001, 0.05, 0.6])
def test_gpu_bitmap_encode_matches_cpu(cp: Any, dtype: Any, density: float) -> None:
    host = _residual(100_003, dtype, density, seed=7)
    cpu_residual, gpu_residual = host.copy(), cp.asarray(host)
    expected, expected_count = compress.bitmap_encode(cpu_residual, 0.5)
    message, count = compress.bitmap_encode(gpu_residual, 0.5)
    assert message.get().tobytes() == expected.tobytes() and count == expected_count
    assert gpu_residual.get().tobytes() == cpu_residual.tobytes()


def _sleep_kernel(cp: Any) -> Any:
    """A one-thread kernel that keeps its stream busy for `ms` milliseconds of wall time."""
    return cp.RawKernel(
        r"""
        __device__ unsigned long long now() {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            return t;
        }
        extern "C" __global__ void sleep_ms(int ms) {
            const unsigned long long end = now() + 1000000ull * ms;
            while (now() < end) {}
        }""",
        "sleep_ms",
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threshold_encode_into_returns_before_the_gpu_has_run(cp: Any, dtype: Any) -> None:
    n = 300_001
    host = _residual(n, dtype, 0.01, seed=11)
    cpu_residual = host.copy()
    expected = compress.threshold_encode(cpu_residual, 0.5, 1000)
    out = cp.full(compress.HEADER_WORDS + 1000, -7, dtype=np.int32)
    compress.threshold_encode_into(cp.asarray(host), 0.5, out, 1000)  # warm: the workspace is allocated
    gpu_residual = cp.asarray(host)
    out.fill(-7)
    cp.cuda.Device().synchronize()  # the copies above ran on the default stream, which `stream` ignores
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        _sleep_kernel(cp)((1,), (1,), (np.int32(300),))  # the stream is busy for 0.3 s
        compress.threshold_encode_into(gpu_residual, 0.5, out, 1000)
        queued = cp.cuda.Event()
        queued.record()
        assert not queued.done  # returned without waiting for the stream
        stream.synchronize()
    entries = int(out[0].get())
    assert out[: compress.HEADER_WORDS + entries].get().tobytes() == expected.tobytes()
    assert gpu_residual.get().tobytes() == cpu_residual.tobytes()


def test_threshold_encode_into_checks_its_buffer(cp: Any) -> None:
    residual = cp.asarray(np.array([1.0, 0.0, -1.0], np.float32))
    with pytest.raises(ValueError, match=r"out must hold at least 7 words, got 6"):
        compress.threshold_encode_into(residual, 0.5, cp.zeros(6, np.int32))
    with pytest.raises(ValueError, match="out must have dtype int32"):
        compress.threshold_encode_into(residual, 0.5, cp.zeros(7, np.int64))
    with pytest.raises(TypeError, match="both be numpy arrays or both CuPy arrays"):
        compress.threshold_encode_into(residual, 0.5, np.zeros(7, np.int32))
    np.testing.assert_array_equal(residual.get(), [1.0, 0.0, -1.0])  # refused before anything moved
    out = cp.zeros(5, np.int32)
    compress.threshold_encode_into(residual, 0.5, out, boundary=1)
    bits = int(np.array([0.5], np.float32).view(np.int32)[0])
    assert out.get().tolist() == [1, 3, bits, 0, 1]


def test_encodes_queued_on_two_streams_by_one_thread_are_ordered(cp: Any) -> None:
    """The workspace's tile states serve one launch at a time: an encode queued on another stream (or on a
    new stream that reuses a destroyed one's handle) waits for the previous one."""
    hosts = [_residual(70 * 4096 + 5 + k, np.float32, 0.05, seed=20 + k) for k in range(12)]
    expected = [compress.threshold_encode(h.copy(), 0.5) for h in hosts]
    residuals = [cp.asarray(h) for h in hosts]
    outs = [cp.empty(compress.HEADER_WORDS + h.size, np.int32) for h in hosts]
    cp.cuda.Device().synchronize()  # the copies above ran on the default stream, which the others ignore
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    sleep = _sleep_kernel(cp)
    for k, (residual, out) in enumerate(zip(residuals, outs)):
        if k < 8:
            stream = streams[k % 2]
        else:
            stream = cp.cuda.Stream(non_blocking=True)  # destroyed after its encode is queued
        with stream:
            if k % 4 == 0:
                sleep((1,), (1,), (np.int32(20),))  # the earlier encode may still be waiting
            compress.threshold_encode_into(residual, 0.5, out)
        del stream
    cp.cuda.Device().synchronize()
    for out, message in zip(outs, expected):
        assert out[: message.size].get().tobytes() == message.tobytes()


def test_two_threads_encode_on_their_own_streams(cp: Any) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(seed: int) -> None:
        try:
            device = cp.cuda.Device(0)
            with device, cp.cuda.Stream(non_blocking=True):
                start.wait()
                for step in range(12):
                    n = [4097, 300_001, 70 * 4096 + 5, 1 << 20][step % 4] + seed
                    dtype = np.float32 if step % 3 else np.float64
                    host = _residual(n, dtype, [0.001, 0.05, 0.6][step % 3], seed=seed * 100 + step)
                    _expect_same_encode(cp, host, None if step % 2 else 777)
                    _expect_same_choice(cp, host)
        except BaseException as exc:  # noqa: BLE001  (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
