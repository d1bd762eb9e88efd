"""EncodingHandler on GPU arrays, decode_host_message and apply_message.

The device logic (binding the residual to the first update's GPU, format choice, host-only messages,
errors) runs on this CPU machine against a stand-in GPU: arrays that expose ``__cuda_array_interface__``
over host memory, and ``cuda_*`` kernels that run the CPU twins on those buffers and record which GPU was
current. The ``cuda`` cases run the same checks on real CuPy arrays where a CUDA build and a GPU exist.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from prerequisites import require_gpu
from sparkgrad import compress
from sparkgrad._native import _core
from sparkgrad.compress import (
    AdaptiveThresholdAlgorithm,
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualClippingPostProcessor,
)


class _StandInArray:
    """A 'GPU' array over host memory: what the handler sees of a CuPy array."""

    def __init__(self, host: np.ndarray, gpu: int, backend: _StandInGpu) -> None:
        self.host = np.ascontiguousarray(host)
        self.device = SimpleNamespace(id=gpu)
        self.data = SimpleNamespace(ptr=self.host.ctypes.data)
        self.dtype, self.shape = self.host.dtype, self.host.shape
        self._backend = backend
        backend.buffers[self.data.ptr] = self.host

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3}

    def get(self) -> np.ndarray:
        return self.host.copy()

    def __getitem__(self, index: slice) -> _StandInArray:  # a view over the same host buffer
        return _StandInArray(self.host[index], self.device.id, self._backend)

    def copy(self) -> _StandInArray:
        return _StandInArray(self.host.copy(), self._backend.current, self._backend)

    def fill(self, value: float) -> None:  # a CuPy kernel: it runs on the current GPU
        self._backend.kernel_devices.append(self._backend.current)
        self.host.fill(value)


class _StandInGpu:
    """The parts of CuPy and of the native ``cuda_*`` kernels the handler uses, on host buffers."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.current = 0
        self.kernel_devices: list[int] = []
        self.cuda = SimpleNamespace(Device=self._device)

    @contextlib.contextmanager
    def _device(self, gpu: int):
        previous, self.current = self.current, gpu
        try:
            yield
        finally:
            self.current = previous

    # cupy
    def asarray(self, arr):
        return arr if isinstance(arr, _StandInArray) else _StandInArray(np.array(arr), self.current, self)

    def zeros(self, n: int, dtype) -> _StandInArray:
        return _StandInArray(np.zeros(n, dtype), self.current, self)

    def empty(self, n: int, dtype) -> _StandInArray:
        return _StandInArray(np.full(n, -7, dtype), self.current, self)

    # kernels: the CPU twins on the host buffers behind the pointers
    def cuda_built(self) -> bool:
        return True

    def _ran(self) -> None:
        self.kernel_devices.append(self.current)

    def cuda_accumulate(self, residual, update, n, dtype) -> None:
        self._ran()
        _core.accumulate(self.buffers[residual], self.buffers[update])

    def cuda_threshold_encode(self, x, n, dtype, threshold, boundary, message) -> None:
        self._ran()
        encoded = _core.threshold_encode(self.buffers[x], threshold, boundary)
        self.buffers[message][: encoded.size] = encoded

    def cuda_message_entries(self, message) -> int:
        return int(self.buffers[message][0])

    def cuda_encode_smaller(self, x, n, dtype, threshold) -> tuple[np.ndarray, bool]:
        self._ran()
        return _core.encode_smaller(self.buffers[x], threshold)

    def cuda_bitmap_encode(self, x, n, dtype, threshold, out) -> int:
        self._ran()
        message, count = _core.bitmap_encode(self.buffers[x], threshold)
        self.buffers[out][:] = message
        return int(count)

    def cuda_decode(self, message, length, target, n, dtype, flag) -> None:
        self._ran()
        _core.decode(self.buffers[message], self.buffers[target], flag)

    def cuda_clip(self, residual, n, dtype, limit) -> None:
        self._ran()
        _core.clip(self.buffers[residual], limit)

    def __getattr__(self, name: str):  # every other native function: the real one
        return getattr(_core, name)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> _StandInGpu:
    """The stand-in GPU backend behind sparkgrad.compress (CuPy and the cuda_* kernels)."""
    backend = _StandInGpu()
    for module in ("codec", "thresholds", "handler"):  # each looks both up in its own namespace
        monkeypatch.setattr(f"sparkgrad.compress.{module}._cupy", lambda: backend)
        monkeypatch.setattr(f"sparkgrad.compress.{module}._core", backend)
    return backend


def _updates(seed: int, n: int, steps: int, dtype) -> list[np.ndarray]:
    """Updates whose scale swings by orders of magnitude: sparse, bitmap and empty steps all occur."""
    rng = np.random.default_rng(seed)
    scales = rng.choice([1e-6, 1e-3, 1e-2, 0.3, 3.0], steps)
    return [(rng.normal(size=n) * s).astype(dtype) for s in scales]


def _handlers(n: int, dtype: str, adaptive: bool) -> tuple[EncodingHandler, EncodingHandler]:
    def make() -> EncodingHandler:
        algorithm = AdaptiveThresholdAlgorithm(1e-2) if adaptive else FixedThresholdAlgorithm(0.5)
        return EncodingHandler(n, algorithm, ResidualClippingPostProcessor(2.0, 3), dtype=dtype)

    return make(), make()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_device_handler_sends_the_host_handlers_bytes(gpu, dtype, adaptive) -> None:
    n = 2000
    host, device = _handlers(n, dtype, adaptive)
    formats = set()
    with gpu.cuda.Device(1):
        for it, update in enumerate(_updates(5, n, 30, dtype)):
            expected = host.encode(update, it, 0)
            message = device.encode(gpu.asarray(update), it, 0)
            if expected is None:
                assert message is None
            else:
                assert isinstance(message, np.ndarray)  # only the message comes to the host
                assert message.tobytes() == expected.tobytes()
                formats.add(int(message[3]))
            assert device.residual.get().tobytes() == host.residual.tobytes()
            assert (device.last_threshold, device.last_was_dense, device.last_sparsity) == (
                host.last_threshold,
                host.last_was_dense,
                host.last_sparsity,
            )
    assert formats == {compress.FLAG_SPARSE, compress.FLAG_BITMAP}
    assert set(gpu.kernel_devices) == {1}
    assert (host.device, device.device) == ("cpu", "cuda:1")


@pytest.mark.parametrize("boundary", [None, 0, 5])
def test_device_threshold_encode_reads_the_count_from_the_header(gpu, boundary) -> None:
    host = np.random.default_rng(2).normal(size=1000).astype(np.float32)
    expected = compress.threshold_encode(host.copy(), 0.5, boundary)
    residual = gpu.asarray(host)
    message = compress.threshold_encode(residual, 0.5, boundary)  # a copy of the buffer's message words
    assert message.get().tobytes() == expected.tobytes()
    out = gpu.asarray(np.full(4 + 1000, -7, np.int32))
    compress.threshold_encode_into(gpu.asarray(host), 0.5, out, boundary)
    assert out.get()[: expected.size].tobytes() == expected.tobytes()


def test_residual_follows_the_first_updates_gpu(gpu) -> None:
    handler = EncodingHandler(8, FixedThresholdAlgorithm(0.5), NoOpResidualPostProcessor())
    assert handler.device is None
    with gpu.cuda.Device(2):
        update = gpu.asarray(np.full(8, 0.25, np.float32))
    handler.encode(update, 0, 0)  # the current device is 0: the kernels still run on the residual's GPU 2
    assert handler.device == "cuda:2"
    assert handler.residual.device.id == 2
    np.testing.assert_array_equal(handler.residual.get(), np.full(8, 0.25, np.float32))
    assert set(gpu.kernel_devices) == {2}


def test_update_on_another_device_is_rejected(gpu) -> None:
    host = np.ones(8, np.float32)
    handler = EncodingHandler(8)
    handler.encode(gpu.asarray(host), 0, 0)
    residual = handler.residual.get()
    with pytest.raises(ValueError, match=r"update: the handler's residual is on cuda:0, got .* on cpu"):
        handler.encode(host, 1, 0)
    with gpu.cuda.Device(1), pytest.raises(ValueError, match=r"is on cuda:0, got an update on cuda:1"):
        handler.encode(gpu.asarray(host), 1, 0)
    cpu_handler = EncodingHandler(8)
    cpu_handler.encode(host, 0, 0)
    with pytest.raises(ValueError, match=r"residual is on cpu, got an update on cuda:0"):
        cpu_handler.encode(gpu.asarray(host), 1, 0)
    np.testing.assert_array_equal(handler.residual.get(), residual)  # rejected updates changed nothing


@pytest.mark.parametrize(
    ("update", "match"),
    [
        (np.ones(8, np.float64), r"expected a float32 array of shape \(8,\), got float64 \(8,\)"),
        (np.ones(9, np.float32), r"expected a float32 array of shape \(8,\), got float32 \(9,\)"),
        (np.ones((2, 4), np.float32), r"update must be 1-D"),
    ],
)
def test_device_update_of_wrong_dtype_or_shape_is_rejected(gpu, update, match) -> None:
    handler = EncodingHandler(8)
    with pytest.raises(ValueError, match=match):
        handler.encode(gpu.asarray(update), 0, 0)
    assert handler.device is None  # a rejected first update binds nothing


def test_non_array_update_is_rejected() -> None:
    with pytest.raises(ValueError, match="update: expected a numpy or CuPy float32 array"):
        EncodingHandler(3).encode([1.0, 2.0, 3.0], 0, 0)


def test_decode_host_message_into_device_target(gpu) -> None:
    n = 100
    residual = np.random.default_rng(0).normal(size=n).astype(np.float32)
    for message in (
        compress.threshold_encode(residual.copy(), 0.5),
        compress.bitmap_encode(residual.copy(), 0.5)[0],
    ):
        expected = np.ones(n, np.float32)
        compress.decode(message, expected)
        with gpu.cuda.Device(3):
            target = gpu.asarray(np.ones(n, np.float32))
        compress.decode_host_message(message, target)
        np.testing.assert_array_equal(target.get(), expected)
    assert set(gpu.kernel_devices) == {3}


def test_decode_host_message_rejects_bad_input_and_leaves_target_untouched(gpu) -> None:
    target = gpu.asarray(np.arange(10, dtype=np.float32))
    malformed = np.array([1, 10, 1056964608, 0, 11], dtype=np.int32)  # index 10 is out of range
    with pytest.raises(ValueError):
        compress.decode_host_message(malformed, target)
    with pytest.raises(ValueError, match="message must have dtype int32"):
        compress.decode_host_message(malformed.astype(np.int64), target)
    with pytest.raises(TypeError, match="message must be a host numpy array"):
        compress.decode_host_message(gpu.asarray(malformed), target)
    np.testing.assert_array_equal(target.get(), np.arange(10, dtype=np.float32))


def test_decode_host_message_into_host_target_is_decode() -> None:
    message = compress.threshold_encode(np.array([0.0, 1.0, -1.0], np.float32), 0.5)
    target = np.zeros(3, np.float32)
    compress.decode_host_message(message, target)
    np.testing.assert_array_equal(target, [0.0, 0.5, -0.5])


def test_apply_message_zeroes_decodes_and_applies_on_the_scratch_gpu(gpu) -> None:
    n = 100
    message = compress.threshold_encode(np.random.default_rng(1).normal(size=n).astype(np.float32), 0.5)
    expected = np.zeros(n, np.float32)
    compress.decode(message, expected)
    with gpu.cuda.Device(3):
        scratch = gpu.asarray(np.full(n, 9.0, np.float32))  # the previous message's leftovers
    applied: list[np.ndarray] = []
    compress.apply_message(message, SimpleNamespace(apply_update=lambda u: applied.append(u.get())), scratch)
    assert len(applied) == 1
    np.testing.assert_array_equal(applied[0], expected)
    np.testing.assert_array_equal(scratch.get(), expected)  # the decoded message stays in the scratch
    assert set(gpu.kernel_devices) == {3}  # zeroing and decoding both ran on the scratch's GPU


def test_apply_message_on_the_host() -> None:
    message = compress.threshold_encode(np.array([0.0, 1.0, -1.0], np.float32), 0.5)
    scratch = np.full(3, 9.0, np.float32)
    applied: list[np.ndarray] = []
    compress.apply_message(message, SimpleNamespace(apply_update=lambda u: applied.append(u.copy())), scratch)
    np.testing.assert_array_equal(applied[0], [0.0, 0.5, -0.5])


# -- real GPU ---------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cupy_handler_sends_the_host_handlers_bytes(dtype) -> None:
    cupy = require_gpu()

    n = 50_001
    host, gpu_handler = _handlers(n, dtype, adaptive=True)
    formats = set()
    for it, update in enumerate(_updates(11, n, 40, dtype)):
        expected = host.encode(update, it, 0)
        message = gpu_handler.encode(cupy.asarray(update), it, 0)
        if expected is None:
            assert message is None
            continue
        assert isinstance(message, np.ndarray)
        assert message.tobytes() == expected.tobytes()
        formats.add(int(message[3]))
        target = cupy.zeros(n, dtype=dtype)
        compress.decode_host_message(message, target)
        reference = np.zeros(n, dtype)
        compress.decode(expected, reference)
        assert cupy.asnumpy(target).tobytes() == reference.tobytes()
    assert cupy.asnumpy(gpu_handler.residual).tobytes() == host.residual.tobytes()
    assert formats == {compress.FLAG_SPARSE, compress.FLAG_BITMAP}
    assert gpu_handler.device == "cuda:0"
