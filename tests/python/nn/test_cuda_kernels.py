"""The CUDA twins against their CPU twins, and the one front door of every kernel (sparkgrad._core) for
device arrays.

The `cuda` cases need a CUDA build, a GPU and CuPy; they skip elsewhere. They call each kernel as a network
does (its Device's ``kernels``: the native module, given CuPy arrays). Tolerances: elementwise kernels may
differ from the CPU by a few ulps (the GPU has its own exp/log/tanh), so 16 eps relative; kernels that sum L
terms get L * eps times the sum of the terms' magnitudes. The interop checks (views of
``__cuda_array_interface__``, DLPack and buffer objects, shapes, dtypes, devices, errors) run on any machine
with fake device arrays.
"""

from __future__ import annotations

import array
import ctypes
from typing import Any

import numpy as np
import pytest

from prerequisites import require_gpu
from sparkgrad import cuda
from sparkgrad._native import _core

DTYPES = [np.float32, np.float64]
ACTIVATIONS = ["identity", "relu", "leakyrelu", "elu", "tanh", "sigmoid", "softmax", "softplus", "hardtanh"]
UPDATERS = [
    "sgd",
    "nesterovs",
    "adam",
    "adamax",
    "nadam",
    "amsgrad",
    "rmsprop",
    "adagrad",
    "adadelta",
    "noop",
]
LOSSES = [
    ("mcxent", "softmax"),
    ("negativeloglikelihood", "softmax"),
    ("mse", "identity"),
    ("l1", "tanh"),
    ("l2", "identity"),
    ("xent", "sigmoid"),
    ("hinge", "identity"),
    ("squared_hinge", "identity"),
    ("kl_divergence", "softmax"),
]
ELEMENTWISE_ULPS = 16


class FakeDeviceArray:
    """Only a __cuda_array_interface__: what the front door sees of a GPU array, without a GPU."""

    def __init__(
        self,
        shape: tuple,
        dtype: Any = np.float32,
        strides: tuple | None = None,
        readonly: bool = False,
        ptr: int = 0x10000,
    ):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (ptr, readonly),
            "strides": strides,
            "version": 3,
        }


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeDlpackDeviceArray:
    """Only the DLPack protocol, on CUDA device `device` (kDLCUDA = 2): a DLPack 1.0 tensor at a fake
    address, for the front door's DLPack reading without a GPU. The struct lives as long as this object."""

    def __init__(self, shape: tuple, dtype: Any = np.float32, device: int = 0, readonly: bool = False):
        self.device = device
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        dt = np.dtype(dtype)
        code = {"f": 2, "i": 0, "u": 1}[dt.kind]
        self._tensor = _DLManagedTensorVersioned(
            1, 0, None, None, 1 if readonly else 0,
            _DLTensor(0x10000, _DLDevice(2, device), len(shape), _DLDataType(code, 8 * dt.itemsize, 1),
                      self._shape, None, 0),
        )  # fmt: skip

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)

    def __dlpack__(self, stream: Any = None, max_version: Any = None) -> Any:
        # no capsule destructor: the tensor belongs to this object, not to the consumer
        return _PyCapsule_New(ctypes.addressof(self._tensor), b"dltensor_versioned", None)


class HostDlpack:
    """Only the DLPack protocol of a NumPy array (the CPU); `legacy`: a producer from before DLPack 1.0,
    whose __dlpack__ takes no max_version."""

    def __init__(self, arr: np.ndarray, legacy: bool = False):
        self.arr, self.legacy = arr, legacy

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.arr.__dlpack_device__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self.legacy and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.arr.__dlpack__(stream=stream, **kwargs)


# -- device-independent: the front door's views of every kind of array ---------------------------


def test_dlpack_and_buffer_objects_run_on_the_host_path() -> None:
    rng = np.random.default_rng(0)
    x, b = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    want = x + b
    for legacy in (False, True):
        got = x.copy()
        _core.bias_add(HostDlpack(got, legacy), HostDlpack(b, legacy))  # written through the DLPack view
        np.testing.assert_array_equal(got, want)
    got = x.copy()
    _core.bias_add(memoryview(got), array.array("f", b.tolist()))  # the buffer protocol
    np.testing.assert_array_equal(got, want)
    read_only = x.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"\[bias_add\] x must be writable"):
        _core.bias_add(HostDlpack(read_only), b)  # DLPack 1.0 says read-only
    with pytest.raises(ValueError, match=r"\[bias_add\] x must be writable"):
        _core.bias_add(memoryview(read_only), b)
    with pytest.raises(ValueError, match=r"\[scale_shift\] y must be writable"):
        _core.scale_shift(np.float32(1), np.float32(0))  # a scalar is never silently written through a copy


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: _core.bias_add(np.zeros((2, 3), np.float32), FakeDeviceArray((3,))),
            TypeError,
            r"\[bias_add\] b is on a GPU but x is a host array: every array of one call must be on the same",
        ),
        (
            lambda: _core.bias_add(FakeDlpackDeviceArray((2, 3)), np.zeros(3, np.float32)),
            TypeError,
            r"\[bias_add\] b is a host array but x is on cuda:0",
        ),
        (
            lambda: _core.bias_add(FakeDlpackDeviceArray((2, 3)), FakeDlpackDeviceArray((3,), device=1)),
            TypeError,
            r"\[bias_add\] b is on cuda:1 but x is on cuda:0",
        ),
        (
            lambda: _core.bias_add(FakeDeviceArray((2, 3)), [1.0, 2.0, 3.0]),
            TypeError,
            r"\[bias_add\] b must be an array \(NumPy, CuPy, __cuda_array_interface__, DLPack or buffer\), "
            "got list",
        ),
        (
            lambda: _core.bias_add(FakeDeviceArray((2, 3)), FakeDeviceArray((4,))),
            ValueError,
            r"b must have shape \(3,\)",
        ),
        (
            lambda: _core.bias_add(FakeDeviceArray((2, 3)), FakeDeviceArray((3,), np.float64)),
            ValueError,
            r"\[bias_add\] b must have dtype float32, got float64",
        ),
        (
            lambda: _core.bias_add(FakeDlpackDeviceArray((2, 3)), FakeDlpackDeviceArray((3,), np.int64)),
            ValueError,
            r"\[bias_add\] b must have dtype float32, got int64",
        ),
        (
            lambda: _core.bias_add(FakeDeviceArray((2, 3), np.int32), FakeDeviceArray((3,), np.int32)),
            ValueError,
            r"\[bias_add\] x must be float32 or float64, got int32",
        ),
        (
            lambda: _core.bias_add(FakeDeviceArray((2, 3), strides=(4, 8)), FakeDeviceArray((3,))),
            ValueError,
            r"\[bias_add\] x must be C-contiguous",
        ),
        (
            lambda: _core.bias_add(FakeDeviceArray((2, 3), readonly=True), FakeDeviceArray((3,))),
            ValueError,
            r"\[bias_add\] x must be writable",
        ),
        (
            lambda: _core.bias_add(FakeDlpackDeviceArray((2, 3), readonly=True), FakeDlpackDeviceArray((3,))),
            ValueError,
            r"\[bias_add\] x must be writable",
        ),
        (
            lambda: _core.activation_forward(
                "softmax", FakeDeviceArray((2, 3, 4)), FakeDeviceArray((2, 3, 4))
            ),
            ValueError,
            r"x must be 2-D \(N, C\) for softmax",
        ),
        (
            lambda: _core.loss_score(
                "mse",
                "identity",
                FakeDeviceArray((4, 3)),
                FakeDeviceArray((4, 3)),
                FakeDeviceArray((4,)),
                mask=FakeDeviceArray((3,)),
            ),
            ValueError,
            "mask must have shape",
        ),
        (
            lambda: _core.pool2d_forward(
                "max", FakeDeviceArray((1, 1, 4, 4)), FakeDeviceArray((1, 1, 2, 2)), 2, 2, 2, 2, 0, 0
            ),
            ValueError,
            "argmax is required for max pooling",
        ),
        (
            lambda: _core.pool2d_forward(
                "avg", FakeDeviceArray((1, 1, 4, 4)), FakeDeviceArray((1, 1, 5, 5)), 2, 2, 2, 2, 0, 0
            ),
            ValueError,
            "windows outside",
        ),
        (
            lambda: _core.conv2d_forward(
                FakeDeviceArray((1, 2, 5, 5)),
                FakeDeviceArray((3, 1, 3, 3)),
                None,
                FakeDeviceArray((1, 3, 3, 3)),
                1,
                1,
                0,
                0,
            ),
            ValueError,
            r"w must have shape \(K, 2, R, S\)",
        ),
        (
            lambda: _core.updater_apply("adam", FakeDeviceArray((5,)), FakeDeviceArray((5,)), 0),
            ValueError,
            r"state must have shape \(10,\)",
        ),
        (  # beta1 = 1 makes the bias correction 1 - beta1^t zero
            lambda: _core.updater_apply("adam", FakeDeviceArray((5,)), FakeDeviceArray((10,)), 0, beta1=1.0),
            ValueError,
            r"beta1 must be in \[0, 1\)",
        ),
        (  # max pooling would read past an empty plane
            lambda: _core.global_pool_forward(
                "max",
                FakeDeviceArray((2, 3, 0, 4)),
                FakeDeviceArray((2, 3)),
                FakeDeviceArray((2, 3), np.int64),
            ),
            ValueError,
            r"x must have a non-empty \(H, W\) plane",
        ),
        (
            lambda: _core.batchnorm_forward_inference(
                *(FakeDeviceArray(s) for s in [(2, 3), (3,), (3,), (3,), (3,), (2, 3)]), eps=-1.0
            ),
            ValueError,
            "eps must be >= 0",
        ),
        (
            lambda: _core.embedding_forward(
                np.array([0, 1]), FakeDeviceArray((5, 3)), FakeDeviceArray((2, 3))
            ),
            TypeError,
            r"\[embedding_forward\] w is on a GPU but indices is a host array",
        ),
        (
            lambda: _core.embedding_backward(
                FakeDeviceArray((2,), np.int64), FakeDeviceArray((3, 3)), FakeDeviceArray((5, 3))
            ),
            ValueError,
            r"\[embedding_backward\] dy must have shape \(2, 3\)",
        ),
        (
            lambda: _core.gru_forward(**_fakes({**GRU_FORWARD, "gates": (2, 3, 20)})),
            ValueError,
            r"\[gru_forward\] gates must have shape \(2, 3, 15\)",
        ),
        (
            lambda: _core.gru_backward(**_fakes({**GRU_BACKWARD, "h0": (3, 5)})),
            ValueError,
            r"\[gru_backward\] h0 must have shape \(2, 5\)",
        ),
        (
            lambda: _core.gemm(FakeDeviceArray((2, 3)), FakeDeviceArray((4, 5)), out=FakeDeviceArray((2, 5))),
            ValueError,
            "inner dimensions differ",
        ),
        (
            lambda: _core.gemm(
                FakeDeviceArray((2, 3)), FakeDeviceArray((3, 5)), out=np.zeros((2, 5), np.float32)
            ),
            TypeError,
            r"\[gemm\] out is a host array but a is on a GPU",
        ),
    ],
)
def test_front_door_rejects_bad_arrays_before_any_kernel_runs(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


@pytest.mark.skipif(cuda.built(), reason="the CPU build's stand-ins")
def test_cpu_build_reports_cuda_absent() -> None:
    assert cuda.summary() == ["CUDA: not built (SPARKGRAD_ENABLE_CUDA=ON pip install . builds it)"]
    with pytest.raises(RuntimeError, match="built without CUDA"):
        cuda.devices()


def test_former_kernel_front_doors_are_deprecated_aliases() -> None:
    with pytest.warns(DeprecationWarning, match=r"sparkgrad\.cuda\.bias_add is deprecated"):
        assert cuda.bias_add is _core.bias_add
    with pytest.warns(DeprecationWarning, match=r"sparkgrad\.cuda\.kernels_for is deprecated"):
        assert cuda.kernels_for(FakeDeviceArray((3,))) is _core
    with pytest.warns(DeprecationWarning, match=r"use sparkgrad\.device\.is_gpu_array"):
        assert cuda.is_device_array(FakeDeviceArray((3,)))
    with pytest.raises(AttributeError):
        cuda.no_such_kernel  # noqa: B018


def test_sync_each_op_is_a_switch() -> None:
    before = cuda.sync_each_op()
    try:
        cuda.set_sync_each_op(True)
        assert cuda.sync_each_op() is True
        cuda.set_sync_each_op(False)
        assert cuda.sync_each_op() is False
    finally:
        cuda.set_sync_each_op(before)


# -- GPU vs CPU (CUDA build + GPU + CuPy) ----------------------------------------------------------


@pytest.fixture
def cp() -> Any:
    return require_gpu()


def _close(gpu: Any, cpu: np.ndarray, terms: int = 1, scale: np.ndarray | float | None = None) -> None:
    """GPU result within `terms` * eps (times the magnitude `scale`, default |cpu|) of the CPU's."""
    eps = np.finfo(cpu.dtype).eps
    got = gpu.get()
    magnitude = np.abs(cpu) if scale is None else scale
    tol = max(terms, 1) * ELEMENTWISE_ULPS * eps * (magnitude + np.finfo(cpu.dtype).tiny)
    assert np.all(np.abs(got - cpu) <= tol), float(np.max(np.abs(got - cpu) - tol))


def _rand(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
    return rng.normal(size=shape).astype(dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_matches_cpu(cp: Any, name: str, dtype: Any) -> None:
    rng = np.random.default_rng(0)
    x = _rand(rng, (37, 11), dtype) * 3
    dy = _rand(rng, (37, 11), dtype)
    y, dx = np.empty_like(x), np.empty_like(x)
    _core.activation_forward(name, x, y, alpha=0.3)
    _core.activation_backward(name, x, y, dy, dx, alpha=0.3)
    gy, gdx = cp.empty_like(cp.asarray(x)), cp.empty_like(cp.asarray(x))
    _core.activation_forward(name, cp.asarray(x), gy, alpha=0.3)
    _core.activation_backward(name, cp.asarray(x), gy, cp.asarray(dy), gdx, alpha=0.3)
    terms = 11 if name == "softmax" else 1  # softmax sums a row
    _close(gy, y, terms, scale=np.abs(y).max(axis=1, keepdims=True) if name == "softmax" else None)
    # backward: f'(x) comes from y (1 - y^2 cancels near |y| = 1), so the error scales with |dy| too
    row = (np.abs(dy) * np.abs(y)).sum(axis=1, keepdims=True) if name == "softmax" else 0
    _close(gdx, dx, terms, scale=np.abs(dx) + np.abs(dy) + row)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_matches_cpu(cp: Any, dtype: Any) -> None:
    rng = np.random.default_rng(2)
    w = _rand(rng, (50, 7), dtype)
    indices = rng.integers(0, 50, 3000)  # many repeats per row: the summation order shows
    dy = _rand(rng, (3000, 7), dtype)
    y, dw = np.empty((3000, 7), dtype), np.zeros((50, 7), dtype)
    _core.embedding_forward(indices, w, y)
    _core.embedding_backward(indices, dy, dw)
    gy, gdw = cp.empty((3000, 7), dtype), cp.zeros((50, 7), dtype)
    _core.embedding_forward(cp.asarray(indices), cp.asarray(w), gy)
    _core.embedding_backward(cp.asarray(indices), cp.asarray(dy), gdw)
    np.testing.assert_array_equal(gy.get(), y)
    np.testing.assert_array_equal(gdw.get(), dw)  # the CPU's sums in the CPU's order
    bad = cp.asarray(np.array([3, 50, 7, -1]))
    with pytest.raises(
        ValueError, match=r"\[embedding_forward\] index 50 at position 1 is outside \[0, 50\)"
    ):
        _core.embedding_forward(bad, cp.asarray(w), cp.empty((4, 7), dtype))
    with pytest.raises(ValueError, match=r"\[embedding_backward\] index 50 at position 1"):
        _core.embedding_backward(bad, cp.empty((4, 7), dtype), gdw)
    np.testing.assert_array_equal(gdw.get(), dw)  # nothing written


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_matches_cpu(cp: Any, dtype: Any) -> None:
    rng = np.random.default_rng(1)
    x, b = _rand(rng, (6, 5, 4, 3), dtype), _rand(rng, (5,), dtype)
    gx = cp.asarray(x)
    _core.bias_add(x, b)
    _core.bias_add(gx, cp.asarray(b))
    np.testing.assert_array_equal(gx.get(), x)  # one rounding of the same sum
    db, gdb = np.empty(5, dtype), cp.empty(5, dtype)
    _core.bias_grad(x, db)
    _core.bias_grad(gx, gdb)
    _close(gdb, db, 1, scale=np.abs(x).sum(axis=(0, 2, 3)))  # both sum in double, then round once


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 70, 33), (2, 1, 40), (1, 33, 1), (70000, 2, 3)])
def test_swap_last_axes_matches_cpu(cp: Any, dtype: Any, shape: tuple) -> None:
    """Tiles cut at the edges, and more items than a grid's z dimension (the kernel strides over them)."""
    x = _rand(np.random.default_rng(5), shape, dtype)
    y, gy = np.empty((shape[0], shape[2], shape[1]), dtype), cp.empty((shape[0], shape[2], shape[1]), dtype)
    _core.swap_last_axes(x, y)
    _core.swap_last_axes(cp.asarray(x), gy)
    np.testing.assert_array_equal(gy.get(), y)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("loss", "activation"), LOSSES)
@pytest.mark.parametrize("mask_shape", [None, (13,), (13, 7)])
def test_loss_matches_cpu(cp: Any, loss: str, activation: str, dtype: Any, mask_shape: tuple | None) -> None:
    rng = np.random.default_rng(2)
    preout = _rand(rng, (13, 7), dtype)
    labels = np.eye(7, dtype=dtype)[rng.integers(0, 7, 13)]
    if loss in ("hinge", "squared_hinge"):
        labels = labels * 2 - 1
    mask = None if mask_shape is None else (rng.random(mask_shape) > 0.3).astype(dtype)
    gmask = None if mask is None else cp.asarray(mask)
    scores, grad = np.empty(13, dtype), np.empty((13, 7), dtype)
    _core.loss_score(loss, activation, labels, preout, scores, mask=mask, alpha=0.0)
    _core.loss_gradient(loss, activation, labels, preout, grad, mask=mask, alpha=0.0)
    gs, gg = cp.empty(13, dtype), cp.empty((13, 7), dtype)
    _core.loss_score(loss, activation, cp.asarray(labels), cp.asarray(preout), gs, mask=gmask)
    _core.loss_gradient(loss, activation, cp.asarray(labels), cp.asarray(preout), gg, mask=gmask)
    # a score sums 7 columns of log / exp terms (plus a 7-term log-sum-exp)
    _close(gs, scores, 14, scale=np.abs(scores) + np.abs(preout).sum(axis=1) + 1)
    _close(gg, grad, 7, scale=np.abs(grad) + 1)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("retain", [0.1, 0.5, 0.9])
def test_dropout_mask_is_bit_identical(cp: Any, dtype: Any, retain: float) -> None:
    x = _rand(np.random.default_rng(3), (1000, 33), dtype)
    y, mask = np.empty_like(x), np.empty_like(x)
    _core.dropout_forward(x, y, mask, retain, 2**63 + 12345)
    gy, gmask = cp.empty_like(cp.asarray(x)), cp.empty_like(cp.asarray(x))
    _core.dropout_forward(cp.asarray(x), gy, gmask, retain, 2**63 + 12345)
    assert gmask.get().tobytes() == mask.tobytes()
    assert gy.get().tobytes() == y.tobytes()
    dx, gdx = np.empty_like(x), cp.empty_like(gy)
    _core.dropout_backward(x, mask, dx)
    _core.dropout_backward(cp.asarray(x), gmask, gdx)
    assert gdx.get().tobytes() == dx.tobytes()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("stride", "pad"), [((1, 1), (0, 0)), ((2, 1), (1, 2))])
def test_conv2d_matches_cpu(cp: Any, dtype: Any, stride: tuple, pad: tuple) -> None:
    rng = np.random.default_rng(4)
    n, c, h, w, k, r, s = 3, 4, 9, 8, 5, 3, 2
    p = (h + 2 * pad[0] - r) // stride[0] + 1
    q = (w + 2 * pad[1] - s) // stride[1] + 1
    x, wt, b = _rand(rng, (n, c, h, w), dtype), _rand(rng, (k, c, r, s), dtype), _rand(rng, (k,), dtype)
    dy = _rand(rng, (n, k, p, q), dtype)
    geo = (*stride, *pad)
    y, dx, dw = np.empty((n, k, p, q), dtype), np.empty_like(x), np.empty_like(wt)
    _core.conv2d_forward(x, wt, b, y, *geo)
    _core.conv2d_backward_input(dy, wt, dx, *geo)
    _core.conv2d_backward_weight(x, dy, dw, *geo)
    gx, gw, gdy = cp.asarray(x), cp.asarray(wt), cp.asarray(dy)
    gy, gdx, gdw = cp.empty(y.shape, dtype), cp.empty(x.shape, dtype), cp.empty(wt.shape, dtype)
    _core.conv2d_forward(gx, gw, cp.asarray(b), gy, *geo)
    _core.conv2d_backward_input(gdy, gw, gdx, *geo)
    _core.conv2d_backward_weight(gx, gdy, gdw, *geo)
    bound = np.abs(x).max() * np.abs(wt).max()
    _close(gy, y, c * r * s + 1, scale=bound)
    _close(gdx, dx, k * r * s, scale=np.abs(dy).max() * np.abs(wt).max())
    _close(gdw, dw, n * p * q, scale=np.abs(dy).max() * np.abs(x).max())


@pytest.mark.cuda
def test_conv2d_batch_beyond_one_scratch_chunk_matches_cpu(cp: Any) -> None:
    # 64 channels in, 8 out, 3x3 on 64x64 planes: (576 + 8) x 4096 scratch entries an image, so the
    # 2**26-element scratch holds 28 images and a batch of 30 runs as a chunk of 28 and one of 2
    rng = np.random.default_rng(5)
    n, c, h, w, k = 30, 64, 64, 64, 8
    x, wt, b = (
        _rand(rng, (n, c, h, w), np.float32),
        _rand(rng, (k, c, 3, 3), np.float32),
        _rand(rng, (k,), np.float32),
    )
    dy = _rand(rng, (n, k, h, w), np.float32)
    geo = (1, 1, 1, 1)
    y, dx, dw = np.empty((n, k, h, w), np.float32), np.empty_like(x), np.empty_like(wt)
    _core.conv2d_forward(x, wt, b, y, *geo)
    _core.conv2d_backward_input(dy, wt, dx, *geo)
    _core.conv2d_backward_weight(x, dy, dw, *geo)
    gx, gw, gdy = cp.asarray(x), cp.asarray(wt), cp.asarray(dy)
    gy, gdx, gdw = (
        cp.empty(y.shape, np.float32),
        cp.empty(x.shape, np.float32),
        cp.empty(wt.shape, np.float32),
    )
    _core.conv2d_forward(gx, gw, cp.asarray(b), gy, *geo)
    _core.conv2d_backward_input(gdy, gw, gdx, *geo)
    _core.conv2d_backward_weight(gx, gdy, gdw, *geo)
    _close(gy, y, c * 9 + 1, scale=np.abs(x).max() * np.abs(wt).max())
    _close(gdx, dx, k * 9, scale=np.abs(dy).max() * np.abs(wt).max())
    _close(gdw, dw, n * h * w, scale=np.abs(dy).max() * np.abs(x).max())


@pytest.mark.cuda
def test_kernels_run_in_order_on_cupys_current_stream(cp: Any) -> None:
    # On a non-blocking stream the legacy default stream does not wait for queued CuPy work: a kernel
    # launched there would read x before the additions finished. On CuPy's current stream it reads 50.
    stream = cp._core.Stream(non_blocking=True)
    with stream:
        x = cp.zeros(1 << 24, np.float32)
        for _ in range(50):
            x += 1
        y = cp.empty_like(x)
        _core.activation_forward("identity", x, y)
        out = _core.gemm(y[:64].reshape(8, 8), cp.eye(8, dtype=np.float32))
    stream.synchronize()
    assert float(y.min()) == 50.0 and float(y.max()) == 50.0
    np.testing.assert_array_equal(out.get(), np.full((8, 8), 50.0, np.float32))


@pytest.mark.cuda
def test_every_kind_of_gpu_array_runs_the_cuda_twin(cp: Any) -> None:
    """A CuPy array, a bare __cuda_array_interface__ and a CUDA DLPack producer: one view, one kernel."""

    class Interface:
        def __init__(self, arr: Any) -> None:
            self.arr, self.__cuda_array_interface__ = arr, arr.__cuda_array_interface__

    class Dlpack:
        def __init__(self, arr: Any) -> None:
            self.arr = arr

        def __dlpack_device__(self) -> Any:
            return self.arr.__dlpack_device__()

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self.arr.__dlpack__(**kwargs)

    rng = np.random.default_rng(13)
    x, b = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    for wrap in (lambda a: a, Interface, Dlpack):
        gx = cp.asarray(x)
        _core.bias_add(wrap(gx), wrap(cp.asarray(b)))
        np.testing.assert_array_equal(gx.get(), x + b)  # one rounding of the same sum
    with pytest.raises(TypeError, match=r"\[bias_add\] b is a host array but x is on cuda:0"):
        _core.bias_add(cp.asarray(x), b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_matches_cpu(cp: Any, dtype: Any, kind: str) -> None:
    rng = np.random.default_rng(5)
    x = _rand(rng, (2, 3, 7, 6), dtype)
    geo = (3, 2, 2, 2, 1, 0)  # kernel 3x2, stride 2x2, padding top 1
    y = np.empty((2, 3, 4, 3), dtype)
    argmax = np.empty(y.shape, np.int64) if kind == "max" else None
    _core.pool2d_forward(kind, x, y, *geo, argmax=argmax)
    dy = _rand(rng, y.shape, dtype)
    dx = np.empty_like(x)
    _core.pool2d_backward(kind, dy, dx, *geo, argmax=argmax)
    gy, gdx = cp.empty(y.shape, dtype), cp.empty(x.shape, dtype)
    gargmax = cp.empty(y.shape, np.int64) if kind == "max" else None
    _core.pool2d_forward(kind, cp.asarray(x), gy, *geo, argmax=gargmax)
    _core.pool2d_backward(kind, cp.asarray(dy), gdx, *geo, argmax=gargmax)
    if kind == "max":
        np.testing.assert_array_equal(gargmax.get(), argmax)
        np.testing.assert_array_equal(gy.get(), y)
    else:
        _close(gy, y, 6, scale=np.abs(x).max())
    _close(gdx, dx, 6, scale=np.abs(dy).max())
    for gkind in ("max", "avg", "sum"):
        gy2, y2 = cp.empty((2, 3), dtype), np.empty((2, 3), dtype)
        am, gam = (np.empty((2, 3), np.int64), cp.empty((2, 3), np.int64)) if gkind == "max" else (None, None)
        _core.global_pool_forward(gkind, x, y2, argmax=am)
        _core.global_pool_forward(gkind, cp.asarray(x), gy2, argmax=gam)
        _close(gy2, y2, 1, scale=np.abs(x).sum(axis=(2, 3)))  # summed in double, rounded once
        dx2, gdx2 = np.empty_like(x), cp.empty(x.shape, dtype)
        _core.global_pool_backward(gkind, y2, dx2, argmax=am)
        _core.global_pool_backward(gkind, cp.asarray(y2), gdx2, argmax=gam)
        np.testing.assert_array_equal(gdx2.get(), dx2)


@pytest.mark.cuda
def test_out_of_range_argmax_is_refused_with_the_debug_switch_and_dropped_without(cp: Any) -> None:
    geo = (2, 2, 2, 2, 0, 0)
    dy = cp.ones((1, 1, 2, 2), np.float32)
    argmax = cp.asarray(np.array([0, 2, 9, 16], np.int64).reshape(1, 1, 2, 2))  # 16: outside the 4x4 plane
    dx = cp.full((1, 1, 4, 4), np.nan, np.float32)
    before = cuda.sync_each_op()
    try:
        cuda.set_sync_each_op(True)
        with pytest.raises(ValueError, match=r"\[pool2d_backward\] an argmax value is outside \[0, 16\)"):
            _core.pool2d_backward("max", dy, dx, *geo, argmax=argmax)
        cuda.set_sync_each_op(False)
        _core.pool2d_backward("max", dy, dx, *geo, argmax=argmax)
    finally:
        cuda.set_sync_each_op(before)
    expected = np.zeros(16, np.float32)
    expected[[0, 2, 9]] = 1.0  # the window at 16 sends its gradient nowhere
    np.testing.assert_array_equal(dx.get().ravel(), expected)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 5), (4, 3, 5, 6)])
def test_batchnorm_matches_cpu(cp: Any, dtype: Any, shape: tuple) -> None:
    rng = np.random.default_rng(6)
    c = shape[1]
    x, dy = _rand(rng, shape, dtype) * 2 + 1, _rand(rng, shape, dtype)
    gamma, beta = _rand(rng, (c,), dtype), _rand(rng, (c,), dtype)
    host = {k: np.zeros(c, dtype) for k in ("mean", "var")}
    host.update(rm=np.zeros(c, dtype), rv=np.ones(c, dtype))
    dev = {k: cp.asarray(v) for k, v in host.items()}
    y, gy = np.empty_like(x), cp.empty(shape, dtype)
    _core.batchnorm_forward_train(
        x, gamma, beta, y, host["mean"], host["var"], host["rm"], host["rv"], 0.9, 1e-5
    )
    _core.batchnorm_forward_train(
        cp.asarray(x),
        cp.asarray(gamma),
        cp.asarray(beta),
        gy,
        dev["mean"],
        dev["var"],
        dev["rm"],
        dev["rv"],
        0.9,
        1e-5,
    )
    count = x.size // c  # statistics are double sums of `count` values, rounded once
    for key in host:
        _close(dev[key], host[key], 1, scale=np.abs(host[key]) + 1e-3)
    _close(gy, y, 4, scale=np.abs(y) + np.abs(beta).max() + 1)
    dx, dg, db = np.empty_like(x), np.empty(c, dtype), np.empty(c, dtype)
    gdx, gdg, gdb = cp.empty(shape, dtype), cp.empty(c, dtype), cp.empty(c, dtype)
    _core.batchnorm_backward(x, dy, gamma, host["mean"], host["var"], dx, dg, db, 1e-5)
    _core.batchnorm_backward(
        cp.asarray(x), cp.asarray(dy), cp.asarray(gamma), dev["mean"], dev["var"], gdx, gdg, gdb, 1e-5
    )
    _close(gdb, db, 1, scale=np.abs(dy).sum() + 1)
    _close(gdg, dg, 4, scale=np.abs(dy).sum() * 4 + 1)
    _close(gdx, dx, 8, scale=np.abs(dx) + np.abs(dy).max() * np.abs(gamma).max() * 4 / np.sqrt(count) + 1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", UPDATERS)
def test_updater_matches_cpu(cp: Any, dtype: Any, kind: str) -> None:
    rng = np.random.default_rng(7)
    n = 1001
    state = np.abs(_rand(rng, (_core.updater_state_size(kind, n),), dtype)) * 0.01
    gstate = cp.asarray(state)
    for iteration in range(3):
        g = _rand(rng, (n,), dtype)
        gg = cp.asarray(g)
        _core.updater_apply(kind, g, state, iteration, learning_rate=0.01)
        _core.updater_apply(kind, gg, gstate, iteration, learning_rate=0.01)
        _close(gg, g, 4, scale=np.abs(g) + 1e-6)
        _close(gstate, state, 4, scale=np.abs(state) + 1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_regularization_and_gemm_match_cpu(cp: Any, dtype: Any) -> None:
    rng = np.random.default_rng(8)
    w, g = _rand(rng, (500,), dtype), _rand(rng, (500,), dtype)
    gg, gw = cp.asarray(g), cp.asarray(w)
    _core.regularize_gradient(w, g, 1e-3, 1e-2)
    _core.regularize_gradient(gw, gg, 1e-3, 1e-2)
    _close(gg, g, 2, scale=np.abs(g) + np.abs(w) * 1e-2 + 1e-3)
    u, gu = g.copy(), gg.copy()
    _core.apply_weight_decay(w, u, 0.05)
    _core.apply_weight_decay(gw, gu, 0.05)
    _close(gu, u, 2, scale=np.abs(u) + np.abs(w) * 0.05)
    a, b = _rand(rng, (17, 40), dtype), _rand(rng, (23, 40), dtype)
    c = cp.empty((17, 23), dtype)
    assert _core.gemm(cp.asarray(a), cp.asarray(b), trans_b=True, out=c) is c
    _close(c, a @ b.T, 40, scale=np.abs(a) @ np.abs(b).T)
    _close(
        _core.gemm(cp.asarray(a), cp.asarray(b), trans_b=True, alpha=0.5),
        0.5 * a @ b.T,
        40,
        scale=np.abs(a) @ np.abs(b).T,
    )


# -- recurrent and graph-vertex kernels ----------------------------------------------------------


def _fakes(shapes: dict[str, tuple], dtype: Any = np.float32) -> dict[str, FakeDeviceArray]:
    """Fake device arrays at disjoint addresses (16 MiB apart), one per name."""
    return {
        name: FakeDeviceArray(shape, dtype, ptr=(i + 1) << 24)
        for i, (name, shape) in enumerate(shapes.items())
    }


# n, t, c, h = 2, 3, 4, 5
LSTM_FORWARD = {
    "x": (2, 3, 4),
    "w": (4, 20),
    "rw": (5, 20),
    "b": (20,),
    "hs": (2, 3, 5),
    "cs": (2, 3, 5),
    "gates": (2, 3, 20),
    "act_c": (2, 3, 5),
}
LSTM_BACKWARD = {
    **{k: v for k, v in LSTM_FORWARD.items() if k != "b"},
    "dh": (2, 3, 5),
    "dgates": (2, 3, 20),
    "dw": (4, 20),
    "drw": (5, 20),
    "db": (20,),
}


def _lstm_forward(shapes: dict[str, tuple] = LSTM_FORWARD, **kwargs: Any) -> None:
    _core.lstm_forward(**_fakes(shapes), **kwargs)


def _lstm_backward(shapes: dict[str, tuple] = LSTM_BACKWARD, **kwargs: Any) -> None:
    _core.lstm_backward(**_fakes(shapes), **kwargs)


def _with(shapes: dict[str, tuple], **changes: tuple) -> dict[str, tuple]:
    return {**shapes, **changes}


def _elementwise(kind: str, shapes: list[tuple], y: tuple = (4, 3)) -> None:
    f = _fakes({"y": y, **{f"in{i}": s for i, s in enumerate(shapes)}})
    _core.elementwise_forward(kind, [f[f"in{i}"] for i in range(len(shapes))], f["y"])


def _elementwise_backward(n_inputs: int, n_dx: int, dx0_is_dy: bool = False) -> None:
    f = _fakes(
        {
            "dy": (4, 3),
            **{f"in{i}": (4, 3) for i in range(n_inputs)},
            **{f"dx{i}": (4, 3) for i in range(n_dx)},
        }
    )
    dx = [f["dy"] if (i == 0 and dx0_is_dy) else f[f"dx{i}"] for i in range(n_dx)]
    _core.elementwise_backward("add", [f[f"in{i}"] for i in range(n_inputs)], f["dy"], dx)


def _l2_normalize(
    x: tuple = (4, 3), y: tuple = (4, 3), norms: tuple = (4,), eps: float = 1e-8, alias: bool = False
) -> None:
    f = _fakes({"x": x, "y": y, "norms": norms})
    _core.l2_normalize_forward(f["x"], f["x"] if alias else f["y"], f["norms"], eps)


def _l2_distance_backward(alias: bool) -> None:
    f = _fakes({"a": (4, 3), "b": (4, 3), "y": (4,), "dy": (4,), "da": (4, 3), "db": (4, 3)})
    _core.l2_distance_backward(f["a"], f["b"], f["y"], f["dy"], f["da"], f["da"] if alias else f["db"], 1e-8)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: _lstm_forward(_with(LSTM_FORWARD, x=(6, 4))), ValueError, r"x must be 3-D \(N, T, C\)"),
        (lambda: _lstm_forward(_with(LSTM_FORWARD, x=(0, 3, 4))), ValueError, r"x.shape\[0\] \(examples\)"),
        (lambda: _lstm_forward(_with(LSTM_FORWARD, w=(4, 18))), ValueError, r"w must have shape \(4, 4H\)"),
        (lambda: _lstm_forward(_with(LSTM_FORWARD, rw=(5, 16))), ValueError, r"rw must have shape \(5, 20\)"),
        (lambda: _lstm_forward(_with(LSTM_FORWARD, b=(5,))), ValueError, r"b must have shape \(20,\)"),
        (lambda: _lstm_forward(_with(LSTM_FORWARD, gates=(2, 3, 5))), ValueError, "gates must have shape"),
        (
            lambda: _lstm_forward(_with(LSTM_FORWARD, mask=(3, 2))),
            ValueError,
            r"mask must have shape \(2, 3\)",
        ),
        (lambda: _lstm_forward(_with(LSTM_FORWARD, h0=(2, 4))), ValueError, r"h0 must have shape \(2, 5\)"),
        (lambda: _lstm_forward(activation="softmax"), ValueError, "softmax is not an elementwise activation"),
        (lambda: _lstm_forward(gate_activation="swish"), ValueError, "unknown activation"),
        (
            lambda: _core.lstm_forward(
                **_fakes(LSTM_FORWARD), h0=FakeDeviceArray((2, 5), np.float64, ptr=1 << 30)
            ),
            ValueError,
            r"\[lstm_forward\] h0 must have dtype float32, got float64",
        ),
        (lambda: _lstm_backward(first_step=3), ValueError, r"first_step must be in \[0, 3\), got 3"),
        (lambda: _lstm_backward(first_step=-1), ValueError, r"first_step must be in \[0, 3\)"),
        (
            lambda: _lstm_backward(_with(LSTM_BACKWARD, dx=(2, 3, 5))),
            ValueError,
            r"dx must have shape \(2, 3, 4\)",
        ),
        (
            lambda: _lstm_backward(_with(LSTM_BACKWARD, drw=(4, 20))),
            ValueError,
            r"drw must have shape \(5, 20\)",
        ),
        (lambda: _elementwise("add", [(4, 3), (3, 4)]), ValueError, r"inputs\[1\] must have shape \(4, 3\)"),
        (
            lambda: _elementwise("subtract", [(4, 3)] * 3),
            ValueError,
            "subtract needs exactly 2 inputs, got 3",
        ),
        (lambda: _elementwise("median", [(4, 3)]), ValueError, "unknown element-wise op 'median'"),
        (lambda: _elementwise("add", []), ValueError, "at least one array"),
        (
            lambda: _core.elementwise_forward(
                "add", FakeDeviceArray((4, 3)), FakeDeviceArray((4, 3), ptr=1 << 30)
            ),
            TypeError,
            r"\[elementwise_forward\] inputs must be a list of arrays, got FakeDeviceArray",
        ),
        (lambda: _elementwise_backward(2, 1), ValueError, r"dx must hold one array per input \(2\), got 1"),
        (lambda: _elementwise_backward(2, 2, dx0_is_dy=True), ValueError, r"dx\[0\] must not overlap"),
        (
            lambda: _core.scale_shift(FakeDeviceArray((4, 3)), FakeDeviceArray((3, 4), ptr=1 << 30), 2.0),
            ValueError,
            r"y must have shape \(4, 3\)",
        ),
        (lambda: _l2_normalize(eps=0.0), ValueError, r"eps must be a finite number > 0, got 0$"),
        (lambda: _l2_normalize(eps=float("inf")), ValueError, "eps must be a finite number > 0"),
        (lambda: _l2_normalize(norms=(3,)), ValueError, r"norms must have shape \(4,\)"),
        (lambda: _l2_normalize(x=(), y=()), ValueError, "x must have a batch axis"),
        (lambda: _l2_normalize(alias=True), ValueError, "y must not overlap x"),
        (lambda: _l2_distance_backward(alias=True), ValueError, "da and db must not overlap"),
        (
            lambda: _core.l2_distance_forward(**_fakes({"a": (4, 3), "b": (4, 3), "y": (4, 1)})),
            ValueError,
            r"y must have shape \(4,\)",
        ),
    ],
)
def test_recurrent_and_vertex_front_doors_reject_bad_arguments(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


SIMPLE_RNN_FORWARD = {"x": (2, 3, 4), "w": (4, 5), "rw": (5, 5), "b": (5,), "hs": (2, 3, 5), "act": (2, 3, 5)}
SIMPLE_RNN_BACKWARD = {
    **{k: v for k, v in SIMPLE_RNN_FORWARD.items() if k != "b"},
    **{"dh": (2, 3, 5), "dz": (2, 3, 5), "dw": (4, 5), "drw": (5, 5), "db": (5,)},
}
GRU_FORWARD = {"x": (2, 3, 4), "w": (4, 15), "rw": (5, 15), "b": (15,), "hs": (2, 3, 5), "gates": (2, 3, 15)}
GRU_BACKWARD = {
    **{k: v for k, v in GRU_FORWARD.items() if k != "b"},
    **{"dh": (2, 3, 5), "dgates": (2, 3, 15), "dw": (4, 15), "drw": (5, 15), "db": (15,)},
}
CONV = {"x": (2, 3, 8, 8), "w": (4, 3, 3, 3), "b": (4,), "y": (2, 4, 6, 6)}
POOL = {"x": (2, 3, 4, 4), "y": (2, 3, 2, 2)}
POOL_GEOMETRY = {"kernel_h": 2, "kernel_w": 2, "stride_h": 2, "stride_w": 2, "pad_top": 0, "pad_left": 0}
BATCHNORM = ("x", "gamma", "beta", "y", "batch_mean", "batch_var", "running_mean", "running_var")


def _f(*shapes: tuple, dtype: Any = np.float32) -> list[FakeDeviceArray]:
    return list(_fakes({str(i): s for i, s in enumerate(shapes)}, dtype).values())


# valid arguments for every kernel: each passes every front-door check
VALID_CALLS = {
    "bias_add": lambda: _core.bias_add(*_f((4, 3), (3,))),
    "bias_grad": lambda: _core.bias_grad(*_f((4, 3, 2, 2), (3,))),
    "activation_forward": lambda: _core.activation_forward("softmax", *_f((4, 3), (4, 3))),
    "activation_backward": lambda: _core.activation_backward(
        "elu", *_f((4, 3), (4, 3), (4, 3), (4, 3)), alpha=1.0
    ),
    "loss_score": lambda: _core.loss_score(
        "mcxent", "softmax", *_f((4, 3), (4, 3), (4,)), mask=_f((4, 1))[0]
    ),
    "loss_gradient": lambda: _core.loss_gradient(
        "mse", "identity", *_f((4, 3), (4, 3), (4, 3)), mask=_f((4, 3))[0]
    ),
    "dropout_forward": lambda: _core.dropout_forward(*_f((4, 3), (4, 3), (4, 3)), 0.5, 2**64 - 1),
    "dropout_backward": lambda: _core.dropout_backward(*_f((4, 3), (4, 3), (4, 3))),
    "conv2d_forward": lambda: _core.conv2d_forward(
        **_fakes(CONV), stride_h=1, stride_w=1, pad_top=0, pad_left=0
    ),
    "conv2d_backward_input": lambda: _core.conv2d_backward_input(
        *_f((2, 4, 6, 6), (4, 3, 3, 3), (2, 3, 8, 8)), 1, 1, 0, 0
    ),
    "conv2d_backward_weight": lambda: _core.conv2d_backward_weight(
        *_f((2, 3, 8, 8), (2, 4, 6, 6), (4, 3, 3, 3)), 1, 1, 0, 0
    ),
    "pool2d_forward": lambda: _core.pool2d_forward(
        "max", **_fakes(POOL), **POOL_GEOMETRY, argmax=_f((2, 3, 2, 2), dtype=np.int64)[0]
    ),
    "pool2d_backward": lambda: _core.pool2d_backward("avg", *_f((2, 3, 2, 2), (2, 3, 4, 4)), **POOL_GEOMETRY),
    "global_pool_forward": lambda: _core.global_pool_forward("sum", *_f((2, 3, 4, 4), (2, 3))),
    "global_pool_backward": lambda: _core.global_pool_backward(
        "max", *_f((2, 3), (2, 3, 4, 4)), argmax=_f((2, 3), dtype=np.int64)[0]
    ),
    "batchnorm_forward_train": lambda: _core.batchnorm_forward_train(
        **_fakes({k: (2, 3) if k in ("x", "y") else (3,) for k in BATCHNORM}), decay=0.9, eps=1e-5
    ),
    "batchnorm_forward_inference": lambda: _core.batchnorm_forward_inference(
        *_f((2, 3), (3,), (3,), (3,), (3,), (2, 3)), eps=1e-5
    ),
    "batchnorm_backward": lambda: _core.batchnorm_backward(
        *_f((2, 3), (2, 3), (3,), (3,), (3,), (2, 3), (3,), (3,)), eps=1e-5
    ),
    "lstm_forward": lambda: _core.lstm_forward(
        **_fakes({**LSTM_FORWARD, "mask": (2, 3), "h0": (2, 5), "c0": (2, 5)})
    ),
    "lstm_backward": lambda: _core.lstm_backward(
        **_fakes({**LSTM_BACKWARD, "dx": (2, 3, 4), "mask": (2, 3)}), first_step=2
    ),
    "simple_rnn_forward": lambda: _core.simple_rnn_forward(
        **_fakes({**SIMPLE_RNN_FORWARD, "mask": (2, 3), "h0": (2, 5)}), activation="softmax"
    ),
    "simple_rnn_backward": lambda: _core.simple_rnn_backward(
        **_fakes({**SIMPLE_RNN_BACKWARD, "dx": (2, 3, 4), "h0": (2, 5)}), first_step=1
    ),
    "elementwise_forward": lambda: _elementwise("max", [(4, 3)] * 3),
    "elementwise_backward": lambda: _elementwise_backward(2, 2),
    "scale_shift": lambda: _core.scale_shift(FakeDeviceArray((4, 3)), FakeDeviceArray((4, 3)), 2.0, 1.0),
    "l2_normalize_forward": lambda: _l2_normalize(),
    "l2_normalize_backward": lambda: _core.l2_normalize_backward(
        **_fakes({"y": (4, 3), "norms": (4,), "dy": (4, 3), "dx": (4, 3)}), eps=1e-8
    ),
    "l2_distance_forward": lambda: _core.l2_distance_forward(**_fakes({"a": (4, 3), "b": (4, 3), "y": (4,)})),
    "l2_distance_backward": lambda: _l2_distance_backward(alias=False),
    "updater_apply": lambda: _core.updater_apply("adam", *_f((5,), (10,)), 0, learning_rate=0.1),
    "regularize_gradient": lambda: _core.regularize_gradient(*_f((5,), (5,)), 1e-3, 1e-2),
    "apply_weight_decay": lambda: _core.apply_weight_decay(*_f((5,), (5,)), 0.1),
    "gemm": lambda: _core.gemm(*_f((2, 3), (5, 3)), trans_b=True, beta=1.0, out=_f((2, 5))[0]),
}


def test_every_kernel_has_a_valid_device_call() -> None:
    assert sorted(VALID_CALLS) == sorted(cuda._FORMER_KERNELS)  # every kernel that has a CUDA twin


@pytest.mark.skipif(cuda.built(), reason="the CPU build's stand-ins")
@pytest.mark.parametrize("op", sorted(VALID_CALLS))
def test_cpu_build_kernels_take_device_arrays_and_report_cuda_absent(op: str) -> None:
    # valid device arrays pass every front-door check and reach the native stand-in, which refuses the op
    # (no pointer is ever dereferenced)
    with pytest.raises(RuntimeError, match=rf"\[{op}\] sparkgrad was built without CUDA"):
        VALID_CALLS[op]()


@pytest.mark.skipif(cuda.built(), reason="the CPU build's stand-ins")
@pytest.mark.parametrize("op", ["gru_forward", "gru_backward"])
def test_cpu_build_gru_takes_device_arrays_and_reports_cuda_absent(op: str) -> None:
    # kernels added after the former sparkgrad.cuda front doors (VALID_CALLS lists those)
    calls = {
        "gru_forward": lambda: _core.gru_forward(**_fakes({**GRU_FORWARD, "mask": (2, 3), "h0": (2, 5)})),
        "gru_backward": lambda: _core.gru_backward(**_fakes({**GRU_BACKWARD, "dx": (2, 3, 4)}), first_step=1),
    }
    with pytest.raises(RuntimeError, match=rf"\[{op}\] sparkgrad was built without CUDA"):
        calls[op]()


def test_device_arrays_of_every_kind_reach_the_same_checks() -> None:
    # the DLPack view of a CUDA tensor reads as a __cuda_array_interface__ one does
    with pytest.raises(
        ValueError, match=r"\[simple_rnn_forward\] act must have shape \(2, 3, 5\), got \(2, 3, 4\)"
    ):
        _core.simple_rnn_forward(
            **{k: FakeDlpackDeviceArray(s) for k, s in {**SIMPLE_RNN_FORWARD, "act": (2, 3, 4)}.items()}
        )


LSTM_CASES = [  # (case, activation, gate activation, alpha)
    ("plain", "tanh", "sigmoid", 0.0),
    ("state_mask_truncated", "tanh", "sigmoid", 0.0),
    ("softplus", "softplus", "sigmoid", 0.0),
    ("elu_hardtanh", "elu", "hardtanh", 1.0),
]


def _within(gpu: Any, cpu: np.ndarray, tol: np.ndarray | float) -> None:
    got = gpu.get()
    assert np.all(np.abs(got - cpu) <= tol), float(np.max(np.abs(got - cpu) - tol))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("case", "activation", "gate", "alpha"), LSTM_CASES)
def test_lstm_matches_cpu(cp: Any, dtype: Any, case: str, activation: str, gate: str, alpha: float) -> None:
    rng = np.random.default_rng(9)
    n, t, c, h = 3, 7, 5, 6
    x, dh = _rand(rng, (n, t, c), dtype), _rand(rng, (n, t, h), dtype)
    w, b = _rand(rng, (c, 4 * h), dtype) * 0.5, _rand(rng, (4 * h,), dtype) * 0.5
    rw = _rand(rng, (h, 4 * h), dtype) * 0.03
    # every row and column of |rw| sums below 1 and every activation is 1-Lipschitz: the recurrence does
    # not amplify errors, which then add up over the t steps (the bounds below rely on it)
    assert np.abs(rw).sum(axis=1).max() < 1 and np.abs(rw).sum(axis=0).max() < 1
    opts: dict[str, np.ndarray] = {}
    first_step = 0
    if case == "state_mask_truncated":
        mask = (rng.random((n, t)) > 0.3).astype(dtype)
        opts = {"mask": mask, "h0": _rand(rng, (n, h), dtype), "c0": _rand(rng, (n, h), dtype)}
        first_step = 3
    kw = {"activation": activation, "gate_activation": gate, "alpha": alpha}
    dev_opts = {k: cp.asarray(v) for k, v in opts.items()}
    fwd = {k: np.empty((n, t, h), dtype) for k in ("hs", "cs", "gates", "act_c")}
    fwd["gates"] = np.empty((n, t, 4 * h), dtype)
    _core.lstm_forward(x, w, rw, b, **fwd, **opts, **kw)
    gfwd = {k: cp.empty(v.shape, dtype) for k, v in fwd.items()}
    gx, gw, grw = cp.asarray(x), cp.asarray(w), cp.asarray(rw)
    _core.lstm_forward(gx, gw, grw, cp.asarray(b), **gfwd, **dev_opts, **kw)

    eps = ELEMENTWISE_ULPS * np.finfo(dtype).eps
    h_prev = np.concatenate([opts.get("h0", np.zeros((n, h), dtype))[:, None], fwd["hs"][:, :-1]], axis=1)
    z_bound = (np.abs(x) @ np.abs(w) + np.abs(b) + np.abs(h_prev) @ np.abs(rw)).max()
    s_f = max(1.0, z_bound, np.abs(fwd["cs"]).max(), np.abs(opts.get("c0", 0)).max())
    # per step: a (c + h)-term pre-activation plus a few roundings, relative to s_f; o * act(c) multiplies
    # an error by up to s_f again; the steps add up
    err_f = eps * t * (c + h + 2) * s_f * (1 + s_f)
    for key, value in fwd.items():
        _within(gfwd[key], value, err_f)

    dx = np.empty_like(x) if case != "state_mask_truncated" else None
    grads = {"dgates": np.empty((n, t, 4 * h), dtype), "dw": np.empty_like(w), "drw": np.empty_like(rw)}
    grads["db"] = np.empty_like(b)
    bwd_kw = {**opts, **kw, "first_step": first_step}
    _core.lstm_backward(x, w, rw, *fwd.values(), dh, **grads, dx=dx, **bwd_kw)
    ggrads = {k: cp.empty(v.shape, dtype) for k, v in grads.items()}
    gdx = None if dx is None else cp.empty(x.shape, dtype)
    _core.lstm_backward(
        gx, gw, grw, *gfwd.values(), cp.asarray(dh), **ggrads, dx=gdx, **{**bwd_kw, **dev_opts}
    )

    dg = grads["dgates"]
    rows = n * t
    s_b = max(1.0, np.abs(dg).max(), np.abs(dh).max())
    # dgates: the forward's error (relative to s_b) plus a 4h-term dz RW^T product and a few roundings a step
    err_z = eps * s_b * (1 + s_f) * t * (c + 5 * h + 10)
    _within(ggrads["dgates"], dg, err_z)
    flat_dg, flat_x = np.abs(dg.reshape(rows, 4 * h)), np.abs(x.reshape(rows, c))
    flat_h = np.abs(h_prev.reshape(rows, h))
    # weight gradients sum `rows` products: their own rounding plus every row's dgates error
    _within(
        ggrads["dw"], grads["dw"], eps * rows * (flat_x.T @ flat_dg) + flat_x.sum(axis=0)[:, None] * err_z
    )
    _within(
        ggrads["drw"], grads["drw"], eps * rows * (flat_h.T @ flat_dg) + flat_h.sum(axis=0)[:, None] * err_z
    )
    _within(ggrads["db"], grads["db"], eps * rows * flat_dg.sum(axis=0) + rows * err_z)
    if dx is not None:
        dx_tol = eps * 4 * h * (flat_dg @ np.abs(w).T) + np.abs(w).sum(axis=1)[None, :] * err_z
        _within(gdx, dx, dx_tol.reshape(n, t, c))
    if first_step:
        assert not ggrads["dgates"][:, :first_step].get().any()  # truncated steps get exactly zero


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["tanh", "relu", "softplus", "elu", "hardtanh", "softmax"])
@pytest.mark.parametrize("state_mask_truncated", [False, True])
def test_simple_rnn_matches_cpu(cp: Any, dtype: Any, activation: str, state_mask_truncated: bool) -> None:
    rng = np.random.default_rng(12)
    n, t, c, h = 3, 7, 5, 6
    x, dh = _rand(rng, (n, t, c), dtype), _rand(rng, (n, t, h), dtype)
    w, rw, b = (_rand(rng, s, dtype) * 0.4 for s in ((c, h), (h, h), (h,)))
    opt = {"activation": activation, "alpha": 0.7}
    first_step = 0
    if state_mask_truncated:
        opt["mask"] = (rng.random((n, t)) < 0.7).astype(dtype)
        opt["h0"] = _rand(rng, (n, h), dtype)
        first_step = 2
    hs, act = np.empty((n, t, h), dtype), np.empty((n, t, h), dtype)
    _core.simple_rnn_forward(x, w, rw, b, hs, act, **opt)
    grads = {
        k: np.empty(s, dtype)
        for k, s in (("dz", hs.shape), ("dw", w.shape), ("drw", rw.shape), ("db", b.shape))
    }
    dx = np.empty_like(x)
    _core.simple_rnn_backward(x, w, rw, hs, act, dh, **grads, dx=dx, first_step=first_step, **opt)
    g = {k: cp.asarray(v) for k, v in opt.items() if k in ("mask", "h0")}
    gx, gw, grw, gdh = (cp.asarray(a) for a in (x, w, rw, dh))
    ghs, gact = cp.empty(hs.shape, dtype), cp.empty(hs.shape, dtype)
    _core.simple_rnn_forward(gx, gw, grw, cp.asarray(b), ghs, gact, activation=activation, alpha=0.7, **g)
    ggrads = {k: cp.empty(v.shape, dtype) for k, v in grads.items()}
    gdx = cp.empty(x.shape, dtype)
    _core.simple_rnn_backward(
        gx, gw, grw, ghs, gact, gdh, **ggrads, dx=gdx, first_step=first_step, activation=activation,
        alpha=0.7, **g,
    )  # fmt: skip
    # a step sums c + h products and carries its error through t steps
    tol = 16 * float(np.finfo(dtype).eps) * t * (c + h)
    np.testing.assert_allclose(ghs.get(), hs, rtol=tol, atol=tol)
    for k in grads:
        scale = 1 + np.abs(grads[k]).max()
        np.testing.assert_allclose(ggrads[k].get(), grads[k], rtol=0, atol=tol * scale, err_msg=k)
    np.testing.assert_allclose(gdx.get(), dx, rtol=0, atol=tol * (1 + np.abs(dx).max()))
    if first_step:
        assert not ggrads["dz"][:, :first_step].get().any()  # truncated steps get exactly zero


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation, gate", [("tanh", "sigmoid"), ("softplus", "hardtanh")])
@pytest.mark.parametrize("state_mask_truncated", [False, True])
def test_gru_matches_cpu(cp: Any, dtype: Any, activation: str, gate: str, state_mask_truncated: bool) -> None:
    rng = np.random.default_rng(13)
    n, t, c, h = 3, 7, 5, 6
    x, dh = _rand(rng, (n, t, c), dtype), _rand(rng, (n, t, h), dtype)
    w, rw, b = (_rand(rng, s, dtype) * 0.4 for s in ((c, 3 * h), (h, 3 * h), (3 * h,)))
    opt: dict[str, Any] = {"activation": activation, "gate_activation": gate}
    first_step = 0
    if state_mask_truncated:
        opt["mask"] = (rng.random((n, t)) < 0.7).astype(dtype)
        opt["h0"] = _rand(rng, (n, h), dtype)
        first_step = 2
    hs, gates = np.empty((n, t, h), dtype), np.empty((n, t, 3 * h), dtype)
    _core.gru_forward(x, w, rw, b, hs, gates, **opt)
    grads = {
        k: np.empty(s, dtype)
        for k, s in (("dgates", gates.shape), ("dw", w.shape), ("drw", rw.shape), ("db", b.shape))
    }
    dx = np.empty_like(x)
    _core.gru_backward(x, w, rw, hs, gates, dh, **grads, dx=dx, first_step=first_step, **opt)
    gopt = {k: cp.asarray(v) if k in ("mask", "h0") else v for k, v in opt.items()}
    gx, gw, grw, gdh = (cp.asarray(a) for a in (x, w, rw, dh))
    ghs, ggates = cp.empty(hs.shape, dtype), cp.empty(gates.shape, dtype)
    _core.gru_forward(gx, gw, grw, cp.asarray(b), ghs, ggates, **gopt)
    ggrads = {k: cp.empty(v.shape, dtype) for k, v in grads.items()}
    gdx = cp.empty(x.shape, dtype)
    _core.gru_backward(gx, gw, grw, ghs, ggates, gdh, **ggrads, dx=gdx, first_step=first_step, **gopt)
    # a step sums c + h products (twice: the gates, then the candidate) and carries its error through t steps
    tol = 32 * float(np.finfo(dtype).eps) * t * (c + h)
    np.testing.assert_allclose(ghs.get(), hs, rtol=tol, atol=tol)
    np.testing.assert_allclose(ggates.get(), gates, rtol=tol, atol=tol)
    for k in grads:
        scale = 1 + np.abs(grads[k]).max()
        np.testing.assert_allclose(ggrads[k].get(), grads[k], rtol=0, atol=tol * scale, err_msg=k)
    np.testing.assert_allclose(gdx.get(), dx, rtol=0, atol=tol * (1 + np.abs(dx).max()))
    if first_step:
        assert not ggrads["dgates"][:, :first_step].get().any()  # truncated steps get exactly zero


LAYER_NORM_FORWARD = {"x": (6, 4), "gain": (4,), "bias": (4,), "y": (6, 4), "mean": (6,), "rstd": (6,)}
LAYER_NORM_BACKWARD = {
    **{k: LAYER_NORM_FORWARD[k] for k in ("x", "gain", "mean", "rstd")},
    **{"dy": (6, 4), "dx": (6, 4), "dgain": (4,), "dbias": (4,)},
}
ATTENTION_FORWARD = {"q": (2, 3, 4), "k": (2, 5, 4), "v": (2, 5, 6), "weights": (2, 2, 3, 5), "y": (2, 3, 6)}
ATTENTION_BACKWARD = {
    **{k: ATTENTION_FORWARD[k] for k in ("q", "k", "v", "weights")},
    **{"dy": (2, 3, 6), "dweights": (2, 2, 3, 5), "dq": (2, 3, 4), "dk": (2, 5, 4), "dv": (2, 5, 6)},
}


@pytest.mark.skipif(cuda.built(), reason="the CPU build's stand-ins")
@pytest.mark.parametrize(
    "op", ["layer_norm_forward", "layer_norm_backward", "attention_forward", "attention_backward"]
)
def test_cpu_build_attention_kernels_take_device_arrays_and_report_cuda_absent(op: str) -> None:
    calls = {
        "layer_norm_forward": lambda: _core.layer_norm_forward(**_fakes(LAYER_NORM_FORWARD), eps=1e-5),
        "layer_norm_backward": lambda: _core.layer_norm_backward(**_fakes(LAYER_NORM_BACKWARD)),
        "attention_forward": lambda: _core.attention_forward(
            **_fakes({**ATTENTION_FORWARD, "mask": (2, 5)}), heads=2, scale=0.5
        ),
        "attention_backward": lambda: _core.attention_backward(
            **_fakes(ATTENTION_BACKWARD), heads=2, scale=0.5
        ),
    }
    with pytest.raises(RuntimeError, match=rf"\[{op}\] sparkgrad was built without CUDA"):
        calls[op]()


def test_attention_front_doors_reject_mixed_devices() -> None:
    arrays: dict[str, Any] = _fakes(ATTENTION_FORWARD)
    arrays["y"] = np.zeros((2, 3, 6), np.float32)
    with pytest.raises(TypeError, match=r"\[attention_forward\] y is a host array but q is on a GPU"):
        _core.attention_forward(**arrays, heads=2, scale=0.5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_bias", [False, True])
def test_layer_norm_matches_cpu(cp: Any, dtype: Any, has_bias: bool) -> None:
    rng = np.random.default_rng(21)
    rows, c = 150, 40  # more rows than one of the column sums' blocks
    x, dy = _rand(rng, (rows, c), dtype), _rand(rng, (rows, c), dtype)
    gain, bias = _rand(rng, (c,), dtype), _rand(rng, (c,), dtype) if has_bias else None
    cpu = [np.empty(s, dtype) for s in ((rows, c), (rows,), (rows,))]
    _core.layer_norm_forward(x, gain, bias, *cpu, eps=1e-5)
    grads = [np.empty_like(x), np.empty_like(gain), np.empty_like(gain) if has_bias else None]
    _core.layer_norm_backward(x, dy, gain, cpu[1], cpu[2], *grads)
    g = [cp.asarray(a) if a is not None else None for a in (x, dy, gain, bias)]
    gpu = [cp.empty(a.shape, dtype) for a in cpu]
    _core.layer_norm_forward(g[0], g[2], g[3], *gpu, eps=1e-5)
    ggrads = [cp.empty(a.shape, dtype) if a is not None else None for a in grads]
    _core.layer_norm_backward(g[0], g[1], g[2], gpu[1], gpu[2], *ggrads)
    for got, want in zip(gpu, cpu):
        _close(got, want, terms=c, scale=1 + np.abs(want).max())
    _close(ggrads[0], grads[0], terms=c, scale=1 + np.abs(grads[0]).max())
    for got, want in zip(ggrads[1:], grads[1:]):
        if want is not None:
            _close(got, want, terms=rows, scale=1 + np.abs(want).max())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_cpu(cp: Any, dtype: Any, masked: bool) -> None:
    rng = np.random.default_rng(22)
    n, tq, tk, heads, d, dv = 3, 5, 7, 2, 4, 3
    q, k, v = (_rand(rng, s, dtype) for s in ((n, tq, heads * d), (n, tk, heads * d), (n, tk, heads * dv)))
    dy = _rand(rng, (n, tq, heads * dv), dtype)
    mask = None
    if masked:
        mask = (rng.random((n, tk)) < 0.6).astype(dtype)
        mask[0] = 0  # no present key: zero weights and output
    weights, y = np.empty((n, heads, tq, tk), dtype), np.empty((n, tq, heads * dv), dtype)
    _core.attention_forward(q, k, v, weights, y, heads, 0.5, mask=mask)
    grads = [np.empty_like(a) for a in (q, k, v)]
    _core.attention_backward(q, k, v, weights, dy, np.empty_like(weights), *grads, heads, 0.5)
    gq, gk, gv, gdy = (cp.asarray(a) for a in (q, k, v, dy))
    gmask = None if mask is None else cp.asarray(mask)
    gweights, gy = cp.empty(weights.shape, dtype), cp.empty(y.shape, dtype)
    _core.attention_forward(gq, gk, gv, gweights, gy, heads, 0.5, mask=gmask)
    ggrads = [cp.empty(a.shape, dtype) for a in (q, k, v)]
    _core.attention_backward(gq, gk, gv, gweights, gdy, cp.empty(weights.shape, dtype), *ggrads, heads, 0.5)
    _close(gweights, weights, terms=d + tk, scale=1.0)
    _close(gy, y, terms=d + 2 * tk, scale=1 + np.abs(y).max())
    for got, want in zip(ggrads, grads):
        _close(got, want, terms=d + dv + 2 * tk, scale=1 + np.abs(want).max())
    if masked:
        assert not gweights.get()[np.broadcast_to(mask[:, None, None, :] == 0, weights.shape)].any()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["add", "subtract", "product", "average", "max"])
def test_elementwise_vertex_matches_cpu_exactly(cp: Any, dtype: Any, kind: str) -> None:
    rng = np.random.default_rng(10)
    k = 2 if kind == "subtract" else 3
    inputs = [_rand(rng, (37, 11), dtype) for _ in range(k)]
    for i in range(1, k):  # ties, so max's rule (the first maximal input takes dy) decides
        tie = rng.random((37, 11)) < 0.3
        inputs[i][tie] = inputs[i - 1][tie]
    dy = _rand(rng, (37, 11), dtype)
    y, dx = np.empty_like(dy), [np.empty_like(dy) for _ in range(k)]
    _core.elementwise_forward(kind, inputs, y)
    _core.elementwise_backward(kind, inputs, dy, dx)
    ginputs = [cp.asarray(a) for a in inputs]
    gy, gdx = cp.empty(y.shape, dtype), [cp.empty(y.shape, dtype) for _ in range(k)]
    _core.elementwise_forward(kind, ginputs, gy)
    _core.elementwise_backward(kind, ginputs, cp.asarray(dy), gdx)
    # the same additions and multiplications in the same order, none a multiply-add pair the GPU could
    # fuse: every rounding is the CPU's
    np.testing.assert_array_equal(gy.get(), y)
    for got, want in zip(gdx, dx):
        np.testing.assert_array_equal(got.get(), want)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_shift_and_l2_vertices_match_cpu(cp: Any, dtype: Any) -> None:
    rng = np.random.default_rng(11)
    n, d, eps = 9, 13, 1e-8
    x, dy = _rand(rng, (n, d), dtype), _rand(rng, (n, d), dtype)
    x[3] = 0  # norm clamped to eps
    x[5] *= 1e-12  # norm below eps
    y = np.empty_like(x)
    _core.scale_shift(x, y, 1.7, -0.3)
    gy = cp.empty(x.shape, dtype)
    _core.scale_shift(cp.asarray(x), gy, 1.7, -0.3)
    _close(gy, y, 1, scale=np.abs(x * 1.7) + 0.3)  # the GPU may fuse x * scale + shift

    norms, gnorms = np.empty(n, dtype), cp.empty(n, dtype)
    _core.l2_normalize_forward(x, y, norms, eps)
    _core.l2_normalize_forward(cp.asarray(x), gy, gnorms, eps)
    _close(gnorms, norms, d)  # a d-term sum of squares in double, rounded once
    _close(gy, y, d)
    dx, gdx = np.empty_like(x), cp.empty(x.shape, dtype)
    _core.l2_normalize_backward(y, norms, dy, dx, eps)  # the CPU's forward outputs for both
    _core.l2_normalize_backward(cp.asarray(y), cp.asarray(norms), cp.asarray(dy), gdx, eps)
    dot = np.abs(dy * y).sum(axis=1, keepdims=True)
    _close(gdx, dx, d, scale=(np.abs(dy) + np.abs(y) * dot) / norms[:, None])

    a, b = x, _rand(rng, (n, d), dtype)
    b[4] = a[4]  # distance 0: the backward divides by eps
    dist, gdist = np.empty(n, dtype), cp.empty(n, dtype)
    _core.l2_distance_forward(a, b, dist)
    _core.l2_distance_forward(cp.asarray(a), cp.asarray(b), gdist)
    _close(gdist, dist, d)
    ddist = _rand(rng, (n,), dtype)
    da, db = np.empty_like(a), np.empty_like(a)
    gda, gdb = cp.empty(a.shape, dtype), cp.empty(a.shape, dtype)
    _core.l2_distance_backward(a, b, dist, ddist, da, db, eps)
    _core.l2_distance_backward(
        cp.asarray(a), cp.asarray(b), cp.asarray(dist), cp.asarray(ddist), gda, gdb, eps
    )
    _close(gda, da, 1)  # (a - b) * dy / max(y, eps) in double, rounded once
    _close(gdb, db, 1)


CONV_FAKES = {"x": (2, 3, 8, 8), "w": (4, 3, 3, 3), "y": (2, 4, 6, 6)}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda f: _core.conv2d_backward_weight(f["x"], f["y"], f["w"], 1, 1, 0, 0, algorithm="winograd"),
            r"\[conv2d_backward_weight\] algorithm 'winograd' has no GPU kernel, use auto, cudnn or im2col",
        ),
        (
            lambda f: _core.conv2d_backward_input(f["y"], f["w"], f["x"], 1, 1, 0, 0, algorithm="fft"),
            r"\[conv2d_backward_input\] unknown algorithm 'fft', expected one of auto im2col winograd cudnn",
        ),
        (
            lambda f: _core.conv2d_forward(f["x"], f["w"], None, f["y"], 1, 1, 0, 0, activation="tanh"),
            r"\[conv2d_forward\] activation must be identity or relu \(the fused epilogues\), got 'tanh'",
        ),
    ],
)
def test_conv2d_front_doors_reject_winograd_and_unfused_activations(call: Any, message: str) -> None:
    # Checked before any kernel runs: the GPU has cuDNN and im2col + cuBLAS, and fuses relu only.
    with pytest.raises(ValueError, match=message):
        call(_fakes(CONV_FAKES))
