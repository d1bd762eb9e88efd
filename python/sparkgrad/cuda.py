"""The GPUs of this build: inventory, the stream the CUDA ops run on, and the debug switch.

The kernels have no GPU front door of their own: every native kernel (``sparkgrad._core``, a
:class:`~sparkgrad.device.Device`'s ``kernels`` on every device) takes host or device arrays alike: NumPy or
any buffer on the host; CuPy, any ``__cuda_array_interface__`` array or a CUDA DLPack producer on a GPU. It
checks its arguments once, then runs the CPU twin or the CUDA twin with the GIL released. A CUDA op runs
on CuPy's current stream of the current device and returns once its work is queued there, in order with the
CuPy operations the network runs between ops; the host waits only where it reads a value (a loss, a count,
``.get()``). In a build without CUDA every kernel given device arrays raises
``RuntimeError("[op] sparkgrad was built without CUDA")`` after its arguments are checked.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from sparkgrad._native import _core
from sparkgrad.device import is_gpu_array

_BUILT = bool(_core.cuda_built())


@dataclass(frozen=True)
class GpuInfo:
    """One GPU the CUDA runtime sees."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes


def built() -> bool:
    """Whether this build of sparkgrad has the CUDA kernels."""
    return _BUILT


def devices() -> list[GpuInfo]:
    """The GPUs the CUDA runtime sees (empty when no driver or GPU is present).

    Raises:
        RuntimeError: sparkgrad was built without CUDA.
    """
    return [
        GpuInfo(d["index"], d["name"], tuple(d["compute_capability"]), int(d["total_memory"]))
        for d in _core.cuda_devices()
    ]


def summary() -> list[str]:
    """Human-readable GPU lines for ``sparkgrad info``: each GPU, or why there is none."""
    if not built():
        return ["CUDA: not built (SPARKGRAD_ENABLE_CUDA=ON pip install . builds it)"]
    gpus = devices()
    if not gpus:
        return ["CUDA: built, no GPU visible"]
    lines = [f"CUDA: built, {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"]
    for g in gpus:
        major, minor = g.compute_capability
        lines.append(
            f"gpu {g.index}: {g.name}, compute capability {major}.{minor}, {g.total_memory / 2**30:.1f} GiB"
        )
    return lines


def launch(entry: Any, *args: Any) -> Any:
    """Calls the native CUDA entry point ``entry(*args)`` on CuPy's current stream of the current device.

    For the compression codecs' raw-pointer ``cuda_*`` entry points (sparkgrad.compress); the kernels take
    the stream themselves.
    """
    if _BUILT:
        import cupy

        _core.cuda_set_stream(cupy.cuda.get_current_stream().ptr)
    return entry(*args)


def set_sync_each_op(on: bool) -> None:
    """Debug switch: every CUDA op waits for the device before it returns, so an asynchronous fault (an
    illegal address, say) is raised by the op that caused it rather than by a later one. Off by default;
    ``SPARKGRAD_CUDA_SYNC=1`` in the environment turns it on at import."""
    _core.cuda_set_sync_each_op(bool(on))


def sync_each_op() -> bool:
    """Whether every CUDA op waits for the device (:func:`set_sync_each_op`)."""
    return bool(_core.cuda_sync_each_op())


# The GPU kernel front doors this module had, before every native kernel took device arrays itself.
_FORMER_KERNELS = frozenset(
    {
        "activation_backward",
        "activation_forward",
        "apply_weight_decay",
        "batchnorm_backward",
        "batchnorm_forward_inference",
        "batchnorm_forward_train",
        "bias_add",
        "bias_grad",
        "conv2d_backward_input",
        "conv2d_backward_weight",
        "conv2d_forward",
        "dropout_backward",
        "dropout_forward",
        "elementwise_backward",
        "elementwise_forward",
        "gemm",
        "global_pool_backward",
        "global_pool_forward",
        "l2_distance_backward",
        "l2_distance_forward",
        "l2_normalize_backward",
        "l2_normalize_forward",
        "loss_gradient",
        "loss_score",
        "lstm_backward",
        "lstm_forward",
        "pool2d_backward",
        "pool2d_forward",
        "regularize_gradient",
        "scale_shift",
        "simple_rnn_backward",
        "simple_rnn_forward",
        "updater_apply",
    }
)


def __getattr__(name: str) -> Any:
    """This module's former kernel names, deprecated (see the changelog): each GPU kernel front door is now
    the native kernel itself, ``kernels_for`` returns the native module for any array, ``is_device_array``
    is :func:`sparkgrad.device.is_gpu_array`."""
    if name in _FORMER_KERNELS:
        target: Any = getattr(_core, name)
        replacement = f"a Device's kernels.{name} (resolve_device('cuda:N').kernels), which take GPU arrays"
    elif name == "kernels_for":
        target, replacement = _kernels_for, "a Device's kernels, which take host and GPU arrays alike"
    elif name == "is_device_array":
        target, replacement = is_gpu_array, "sparkgrad.device.is_gpu_array"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"sparkgrad.cuda.{name} is deprecated and will be removed: use {replacement}",
        DeprecationWarning,
        stacklevel=2,
    )
    return target


def _kernels_for(arr: Any) -> Any:
    return _core


__all__ = ["GpuInfo", "built", "devices", "set_sync_each_op", "summary", "sync_each_op"]
