"""An emulated device for tests: the device-independent logic of sparkgrad (dispatch, memory ownership,
array interop) checked on a CPU-only machine behind the same :class:`~sparkgrad.device.Device` interface
as a GPU.

Its arrays are a type of their own (:class:`DeviceArray`, in host memory) that refuses to mix with NumPy
arrays the way CuPy arrays do; its kernel namespace is the native module, the one every real device uses
(which takes a DeviceArray as a host array and runs the CPU twins), behind a check that every array
argument is a device array and that the call runs inside the device's scope; it counts the copies across
the host boundary. Since the kernels are the CPU's, training on it gives bitwise the CPU's parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkgrad._native import _core
from sparkgrad.device import Device


class DeviceArray(np.ndarray):
    """An array of the emulated device. Like a CuPy array it does not mix with host arrays: ufuncs,
    indexing and assignment with a NumPy operand raise TypeError (scalars are fine)."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, out: Any = None, **kwargs: Any) -> Any:
        outs = out or ()
        _reject_host(f"ufunc {ufunc.__name__}", inputs + tuple(outs))
        base = [x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in inputs]
        if outs:
            kwargs["out"] = tuple(o.view(np.ndarray) for o in outs)
        result = getattr(ufunc, method)(*base, **kwargs)
        if outs:
            return outs[0] if len(outs) == 1 else outs
        return _wrap(result)

    def __getitem__(self, key: Any) -> Any:
        _reject_host("indexing", key if isinstance(key, tuple) else (key,))
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        _reject_host("assignment", (key if isinstance(key, tuple) else (key,)) + (value,))
        super().__setitem__(key, value)


def _is_host(x: Any) -> bool:
    return isinstance(x, np.ndarray) and not isinstance(x, DeviceArray)


_INSIDE_XP = [0]  # > 0 while an xp function runs: NumPy's own internals may index with host arrays


def _reject_host(where: str, values: tuple) -> None:
    if _INSIDE_XP[0]:
        return
    for x in values:
        if _is_host(x) or (isinstance(x, (list, tuple)) and any(_is_host(v) for v in x)):
            raise TypeError(f"{where}: a host array mixed with device arrays")


def _wrap(result: Any) -> Any:
    if _is_host(result):
        return result.view(DeviceArray)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap(r) for r in result)
    return result


class _ArrayModule:
    """``xp`` of the emulated device: NumPy's functions returning device arrays, refusing host arrays
    and any call outside the device's scope (where a GPU would allocate on the wrong device)."""

    def __init__(self, dev: EmulatedDevice) -> None:
        self._dev = dev

    def __getattr__(self, name: str) -> Any:
        f = getattr(np, name)
        if isinstance(f, type) or not callable(f):
            return f

        def run(*args: Any, **kwargs: Any) -> Any:
            self._dev.check_scope(f"xp.{name}")
            _reject_host(f"xp.{name}", args + tuple(kwargs.values()))
            _INSIDE_XP[0] += 1
            try:
                return _wrap(f(*args, **kwargs))
            finally:
                _INSIDE_XP[0] -= 1

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
                    if isinstance(x, np.ndarray) and not isinstance(x, DeviceArray):  # _is_host, inline
                        raise TypeError(f"[{name}] a host array was passed to a device kernel")
            return f(*args, **kwargs)

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
        return np.array(arr, copy=True).view(DeviceArray)

    def to_host(self, arr: Any) -> np.ndarray:
        assert isinstance(arr, DeviceArray), type(arr)
        self.downloads += 1
        return np.array(arr.view(np.ndarray), copy=True)

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
        return None if arr is None else np.array(arr, copy=True).view(DeviceArray)
