"""An emulated device for tests: the device-independent logic of sparkgrad (dispatch, memory ownership,
array interop) checked on a CPU-only machine behind the same :class:`~sparkgrad.device.Device` interface
as a GPU.

Its arrays are a type of their own (:class:`DeviceArray`, in host memory) that refuses to mix with NumPy
arrays the way CuPy arrays do, and refuses to become one implicitly (``np.asarray``, ``np.array``, a host
kernel): the only way to the host is :meth:`EmulatedDevice.to_host`, which counts the download. Its kernel
namespace is the native module, the one every real device uses (run on the host arrays inside the device
arrays: the CPU twins), behind a check that every array argument is a device array and that the call runs
inside the device's scope; it counts the copies across the host boundary. Since the kernels are the
CPU's, training on it gives bitwise the CPU's parameters.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from sparkgrad._native import _core
from sparkgrad.device import Device

_DOWNLOAD = "download it explicitly with device.to_host(arr), which counts the copy"


class DeviceArray(NDArrayOperatorsMixin):
    """An array of the emulated device: a host array inside, not an ``np.ndarray`` outside. Like a CuPy
    array it does not mix with host arrays (ufuncs, NumPy functions, indexing and assignment with a NumPy
    operand raise TypeError; scalars are fine) and it does not turn into one implicitly: ``np.asarray``,
    ``np.array`` and host kernels raise TypeError (:meth:`EmulatedDevice.to_host` downloads, counted).
    Reading a scalar (``float``, ``int``, ``bool``, ``.item()``) is allowed, as on CuPy."""

    __slots__ = ("_a",)
    __array_priority__ = 100

    def __init__(self, a: np.ndarray) -> None:
        assert type(a) is np.ndarray, type(a)
        object.__setattr__(self, "_a", a)

    # -- no implicit way to the host ----------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(f"implicit conversion of a device array to a NumPy array is not allowed: {_DOWNLOAD}")

    def tolist(self) -> Any:
        raise TypeError(f"tolist() of a device array: {_DOWNLOAD}")

    def __iter__(self) -> Any:
        raise TypeError(f"iterating over a device array: {_DOWNLOAD}")

    def __reduce__(self) -> Any:
        raise TypeError(f"pickling a device array: {_DOWNLOAD}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # __array_interface__, __array_struct__, ...: host conversions
            raise AttributeError(name)
        value = getattr(self._a, name)
        if name in ("ctypes", "data", "base"):
            raise TypeError(f"{name} of a device array: {_DOWNLOAD}")
        if not callable(value):
            return _wrap(value)

        def method(*args: Any, **kwargs: Any) -> Any:
            _reject_host(f"{name}()", args + tuple(kwargs.values()))
            return _wrap(value(*_unwrap(args), **_unwrap(kwargs)))

        return method

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._a, name, value)  # shape, strides: in place, as on NumPy

    def __len__(self) -> int:
        return len(self._a)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __index__(self) -> int:
        return self._a.__index__()

    def __complex__(self) -> complex:
        return complex(self._a)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self._a.shape}, dtype={self._a.dtype})"

    def __copy__(self) -> DeviceArray:
        return DeviceArray(self._a.copy())

    def __deepcopy__(self, memo: Any) -> DeviceArray:
        return DeviceArray(self._a.copy())

    # -- device arithmetic ---------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, out: Any = None, **kwargs: Any) -> Any:
        outs = out or ()
        _reject_host(f"ufunc {ufunc.__name__}", inputs + tuple(outs))
        if outs:
            kwargs["out"] = tuple(_unwrap(outs))
        result = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if outs:
            return outs[0] if len(outs) == 1 else outs
        return _wrap(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # a NumPy function given device arrays runs on the device, as CuPy's do
        _reject_host(f"np.{func.__name__}", tuple(args) + tuple(kwargs.values()))
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, key: Any) -> Any:
        _reject_host("indexing", key if isinstance(key, tuple) else (key,))
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        _reject_host("assignment", (key if isinstance(key, tuple) else (key,)) + (value,))
        self._a[_unwrap(key)] = _unwrap(value)


def _is_host(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _unwrap(x: Any) -> Any:
    """The host arrays inside device arrays (in lists, tuples and dicts too): what NumPy and the CPU
    kernels run on."""
    if isinstance(x, DeviceArray):
        return x._a
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(result: Any) -> Any:
    if _is_host(result):
        return DeviceArray(result)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap(r) for r in result)
    return result


class _Guard(threading.local):
    """Per thread: how deep this thread is inside xp functions, where NumPy's own internals may index
    with host arrays. Another thread's xp call opens nothing here."""

    inside_xp = 0


_GUARD = _Guard()


def _reject_host(where: str, values: tuple) -> None:
    if _GUARD.inside_xp:
        return
    for x in values:
        if _is_host(x) or (isinstance(x, (list, tuple)) and any(_is_host(v) for v in x)):
            raise TypeError(f"{where}: a host array mixed with device arrays")


class _ArrayModule:
    """``xp`` of the emulated device: NumPy's functions returning device arrays, refusing host arrays
    and any call outside the device's scope (where a GPU would allocate on the wrong device)."""

    ndarray = DeviceArray

    def __init__(self, dev: EmulatedDevice) -> None:
        self._dev = dev

    def __getattr__(self, name: str) -> Any:
        f = getattr(np, name)
        if isinstance(f, type) or not callable(f):
            return f

        def run(*args: Any, **kwargs: Any) -> Any:
            self._dev.check_scope(f"xp.{name}")
            _reject_host(f"xp.{name}", args + tuple(kwargs.values()))
            _GUARD.inside_xp += 1
            try:
                return _wrap(f(*_unwrap(args), **_unwrap(kwargs)))
            finally:
                _GUARD.inside_xp -= 1

        return run


class _Kernels:
    """The emulated device's kernel namespace: ``_core``'s kernels, taking device arrays only, inside the
    device's scope (the native checks do the rest: dtype, C order, shapes, one device)."""

    def __init__(self, dev: EmulatedDevice) -> None:
        self._dev = dev

    def __getattr__(self, name: str) -> Any:
        f = getattr(_core, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            self._dev.check_scope(name)
            self._dev.calls.append((name, args, kwargs))
            for value in args + tuple(kwargs.values()):
                for x in value if isinstance(value, (list, tuple)) else [value]:
                    if _is_host(x):
                        raise TypeError(f"[{name}] a host array was passed to a device kernel")
            return _wrap(f(*_unwrap(args), **_unwrap(kwargs)))

        return run


class EmulatedDevice(Device):
    """A device backed by the CPU kernels whose arrays are :class:`DeviceArray`; counts host copies."""

    def __init__(self) -> None:
        super().__init__("emulated:0", _ArrayModule(self), _Kernels(self))
        self.uploads = self.downloads = self.depth = 0
        self.calls: list[tuple[str, tuple, dict]] = []  # every kernel call: (name, args, kwargs)

    def owns(self, arr: Any) -> bool:
        return isinstance(arr, DeviceArray)

    def from_host(self, arr: np.ndarray) -> Any:
        assert _is_host(arr), type(arr)
        self.uploads += 1
        return DeviceArray(np.array(arr, copy=True))

    def to_host(self, arr: Any) -> np.ndarray:
        assert isinstance(arr, DeviceArray), type(arr)
        self.downloads += 1
        return np.array(arr._a, copy=True)

    def scope(self) -> Any:
        dev = self

        class _Scope:
            def __enter__(self) -> None:
                dev.depth += 1

            def __exit__(self, *exc: Any) -> None:
                dev.depth -= 1

        return _Scope()

    def check_scope(self, op: str) -> None:
        if self.depth == 0:
            raise RuntimeError(f"[{op}] ran outside the device scope")

    def reset_counts(self) -> None:
        self.uploads = self.downloads = 0

    def put(self, arr: Any) -> Any:
        """A host array as a device array, outside the copy counts (test inputs)."""
        return None if arr is None else DeviceArray(np.array(arr, copy=True))

    @staticmethod
    def peek(arr: Any) -> np.ndarray:
        """A device array's contents as a host copy, outside the copy counts (test assertions)."""
        assert isinstance(arr, DeviceArray), type(arr)
        return np.array(arr._a, copy=True)
