"""Devices: where a network's buffers live and its kernels run.

A :class:`Device` bundles what a network needs to run somewhere: its ``name`` (``"cpu"``, ``"cuda:0"``),
its array module ``xp`` (NumPy or CuPy: allocation and array arithmetic), its kernel namespace
``kernels``, whether an array is its own (``owns``), the copies across the host boundary
(``from_host``/``to_host``) and the ``scope`` in which its allocations and kernels run. On the CPU and on
every GPU ``kernels`` is the native module ``sparkgrad._core`` itself: each kernel takes host or device
arrays, checks them once and runs the CPU or the CUDA twin for the arrays' device (a GPU op on CuPy's
current stream of the current device, which ``scope`` selects). Networks use nothing else, so the
device-independent logic (memory ownership, array interop) runs the same against any backend behind this
interface; the test suite checks it on a CPU-only machine against an emulated device backed by the CPU
kernels.

:func:`resolve_device` turns ``"cpu"``, ``"cuda"`` (GPU 0) or ``"cuda:N"`` into a Device (the same
object for the same spec) and checks that the GPU can be used.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, ContextManager

import numpy as np

from sparkgrad._native import _core

_DLPACK_CPU = 1  # DLDeviceType kDLCPU


def is_gpu_array(arr: Any) -> bool:
    """True for an array in GPU memory: one exposing ``__cuda_array_interface__`` (CuPy, Numba, PyTorch)
    or a DLPack producer on a non-CPU device."""
    if isinstance(arr, np.ndarray):
        return False
    if hasattr(arr, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(arr, "__dlpack_device__", None)
    return dlpack_device is not None and int(dlpack_device()[0]) != _DLPACK_CPU


class Device:
    """Where arrays live and kernels run (base class; use :func:`resolve_device` to get one).

    Args:
        name: ``"cpu"`` or ``"cuda:N"`` (other backends, such as a test double, pick their own).
        xp: the array module (``numpy``-compatible: ``empty``, ``zeros``, ``copyto``, ...).
        kernels: the kernel namespace (``sparkgrad._core``, or a stand-in with its names and arguments).
    """

    def __init__(self, name: str, xp: Any, kernels: Any) -> None:
        self.name = name
        self.xp = xp
        self.kernels = kernels

    def __repr__(self) -> str:
        return f"Device({self.name!r})"

    def owns(self, arr: Any) -> bool:
        """Whether ``arr`` is an array of this device (usable by its kernels without a copy)."""
        raise NotImplementedError  # every backend overrides this

    def from_host(self, arr: np.ndarray) -> Any:
        """A NumPy array in this device's memory: the array itself on the CPU, a copy elsewhere."""
        raise NotImplementedError  # every backend overrides this

    def to_host(self, arr: Any) -> np.ndarray:
        """An array of this device in host memory: the array itself on the CPU, a copy elsewhere."""
        raise NotImplementedError  # every backend overrides this

    def scope(self) -> ContextManager[Any]:
        """Context in which this device's allocations and kernels run (the current GPU)."""
        return contextlib.nullcontext()

    def from_gpu(self, arr: Any) -> Any:
        """A GPU array this device does not own, as one of its arrays (a view where possible).

        Raises:
            TypeError: this device cannot take GPU arrays.
        """
        raise TypeError(
            f"a GPU array ({type(arr).__name__}) was given to a network on {self.name}: move the network "
            "with .to('cuda:N') or pass a NumPy array"
        )

    def asarray(self, arr: Any, dtype: Any = None) -> Any:
        """``arr`` (host or device array, or anything NumPy takes) as a C-contiguous array of this device.

        Host data crosses to the device once; an array the device owns is used as is when it already
        has the layout and ``dtype``.

        Args:
            arr: the array.
            dtype: the wanted dtype (None keeps the array's).

        Returns:
            an array of this device.
        """
        if self.owns(arr):
            return self.xp.ascontiguousarray(arr, dtype=dtype)
        if is_gpu_array(arr):
            return self.xp.ascontiguousarray(self.from_gpu(arr), dtype=dtype)
        return self.from_host(np.ascontiguousarray(arr, dtype=dtype))


class _CpuDevice(Device):
    """Host memory, NumPy and the OpenMP kernels of ``sparkgrad._core``."""

    def __init__(self) -> None:
        super().__init__("cpu", np, _core)

    def owns(self, arr: Any) -> bool:
        return isinstance(arr, np.ndarray)

    def from_host(self, arr: np.ndarray) -> np.ndarray:
        return arr

    def to_host(self, arr: Any) -> np.ndarray:
        return arr


class _CudaDevice(Device):
    """GPU ``index`` through CuPy (arrays, ``cupy.cuda.Device`` as the scope) and the native kernels, which
    run their CUDA twins for CuPy arrays."""

    def __init__(self, index: int, cupy: Any) -> None:
        super().__init__(f"cuda:{index}", cupy, _core)
        self.index = index
        self._gpu = cupy.cuda.Device(index)

    def owns(self, arr: Any) -> bool:
        return isinstance(arr, self.xp.ndarray) and arr.device.id == self.index

    def from_host(self, arr: np.ndarray) -> Any:
        with self._gpu:
            return self.xp.asarray(arr)

    def to_host(self, arr: Any) -> np.ndarray:
        with self._gpu:
            return self.xp.asnumpy(arr)

    def scope(self) -> ContextManager[Any]:
        return self._gpu

    def from_gpu(self, arr: Any) -> Any:
        cp = self.xp
        with self._gpu:
            view = cp.asarray(arr) if hasattr(arr, "__cuda_array_interface__") else cp.from_dlpack(arr)
            # an array on another GPU is copied here (peer copy); one on this GPU is used in place
            return view if view.device.id == self.index else cp.array(view, copy=True)


CPU: Device = _CpuDevice()
"""The host: NumPy arrays and the native CPU kernels (``resolve_device("cpu")``)."""

_SPEC = re.compile(r"cuda(?::(\d+))?")


def resolve_device(spec: Any) -> Device:
    """The device named by ``spec``.

    Args:
        spec: ``"cpu"``, ``"cuda"`` (GPU 0), ``"cuda:N"`` or a :class:`Device` (returned as is).

    Returns:
        the Device (the same object for the same spec).

    Raises:
        TypeError: ``spec`` is neither a string nor a Device.
        ValueError: a malformed spec.
        RuntimeError: a GPU was asked for and sparkgrad was built without CUDA, CuPy is not installed or
            there is no such GPU (the message says which and how to fix it).
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"device: expected 'cpu', 'cuda', 'cuda:N' or a Device, got {type(spec).__name__}")
    if spec == "cpu":
        return CPU
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N' (N >= 0), got {spec!r}")
    return _cuda_device(int(match.group(1) or 0))


@functools.cache
def _cuda_device(index: int) -> Device:
    from sparkgrad import cuda

    name = f"cuda:{index}"
    if not cuda.built():
        raise RuntimeError(
            f"device {name!r}: sparkgrad was built without CUDA; reinstall with "
            "SPARKGRAD_ENABLE_CUDA=ON pip install . (needs nvcc), or use device='cpu'"
        )
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError(
            f"device {name!r}: GPU arrays need CuPy, which is not installed; pip install cupy-cuda13x "
            "(the package matching your CUDA major version)"
        ) from e
    count = len(cuda.devices())
    if index >= count:
        visible = f"GPUs 0..{count - 1}" if count else "no GPU"
        raise RuntimeError(
            f"device {name!r}: no such GPU, the CUDA runtime sees {visible} (check the driver and "
            "CUDA_VISIBLE_DEVICES)"
        )
    return _CudaDevice(index, cupy)


__all__ = ["CPU", "Device", "is_gpu_array", "resolve_device"]
