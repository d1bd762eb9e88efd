"""The GPU side of the native kernels: inventory and CuPy front doors of the CUDA twins.

Each kernel function has the name and arguments of its CPU twin in the native module (``bias_add``,
``activation_forward``, ``loss_score``, ``conv2d_forward``, ``updater_apply``, ...) but takes CuPy arrays
(anything exposing ``__cuda_array_interface__``: C-contiguous, float32 or float64, argmax int64), checks
their shapes and dtypes here and calls the CUDA kernel on the raw device pointers with the GIL released.
:func:`kernels_for` picks the CPU module or this one for an array, the single dispatch point by device.
In a build without CUDA every kernel raises ``RuntimeError("[op] sparkgrad was built without CUDA")``
after its arguments are checked.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad._native import _core

_FLOATS = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}  # dtype -> name, read per op
_MASK_LAYOUT = {"none": 0, "per_example": 1, "per_output": 2}
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
    return bool(_core.cuda_built())


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

    The CUDA ops return once their work is queued on that stream, in order with the CuPy operations the
    network runs between them; the host waits only where it reads a value (a loss, a count, ``.get()``).
    :func:`set_sync_each_op` makes every op wait for the device, for debugging.
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


def is_device_array(arr: Any) -> bool:
    """True for a GPU array (``__cuda_array_interface__``), False for anything else (host arrays)."""
    return not isinstance(arr, np.ndarray) and hasattr(arr, "__cuda_array_interface__")


def kernels_for(arr: Any) -> Any:
    """The kernel namespace for ``arr``'s device: this module for GPU arrays, the CPU native module else."""
    return sys.modules[__name__] if is_device_array(arr) else _core


# -- device array views -------------------------------------------------------------------------


@dataclass(frozen=True)
class _View:
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype


def _view(op: str, name: str, arr: Any, writable: bool = False) -> _View:
    """Pointer, shape and dtype of a C-contiguous device array, checked."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(arr) is cupy.ndarray:
        # CuPy's own attributes cost a fraction of building its interface dict, and every op reads several
        # arrays (CuPy arrays are never read-only)
        if not arr.flags.c_contiguous:
            raise ValueError(f"[{op}] {name} must be C-contiguous")
        return _View(arr.data.ptr, arr.shape, arr.dtype)
    if not is_device_array(arr):
        raise TypeError(
            f"[{op}] {name} must be a GPU array (__cuda_array_interface__), got {type(arr).__name__}"
        )
    cai = arr.__cuda_array_interface__
    shape = tuple(int(s) for s in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected: list[int] = []
        step = dtype.itemsize
        for size in reversed(shape):
            expected.insert(0, step)
            step *= size
        if any(s != e for s, e, size in zip(strides, expected, shape) if size > 1):
            raise ValueError(f"[{op}] {name} must be C-contiguous")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ValueError(f"[{op}] {name} must be writable")
    return _View(int(ptr), shape, dtype)


def _floats(op: str, **arrays: tuple[Any, bool]) -> tuple[dict[str, _View], str]:
    """Views of float arrays of one dtype (name -> (array, writable)), and that dtype's name."""
    views = {name: _view(op, name, arr, writable) for name, (arr, writable) in arrays.items()}
    dtypes = {v.dtype for v in views.values()}
    first = next(iter(views.values())).dtype
    if first not in _FLOATS:
        raise ValueError(f"[{op}] arrays must be float32 or float64, got {first}")
    if len(dtypes) > 1:
        raise ValueError(f"[{op}] arrays must share one dtype, got {', '.join(sorted(map(str, dtypes)))}")
    return views, _FLOATS[first]


def _shape(op: str, name: str, view: _View, expected: tuple[int, ...]) -> None:
    if view.shape != tuple(expected):
        raise ValueError(f"[{op}] {name} must have shape {tuple(expected)}, got {view.shape}")


def _argmax(op: str, argmax: Any, shape: tuple[int, ...], needed: bool) -> int:
    if argmax is None:
        if needed:
            raise ValueError(f"[{op}] max pooling needs an argmax array")
        return 0
    view = _view(op, "argmax", argmax, writable=True)
    if view.dtype != np.int64:
        raise ValueError(f"[{op}] argmax must have dtype int64, got {view.dtype}")
    _shape(op, "argmax", view, shape)
    return view.ptr


def _planes(op: str, name: str, view: _View) -> tuple[int, int, int]:
    """(n, c, inner) of a (N, C) or (N, C, H, W) array."""
    if len(view.shape) not in (2, 4):
        raise ValueError(f"[{op}] {name} must be (N, C) or (N, C, H, W), got shape {view.shape}")
    n, c = view.shape[:2]
    return n, c, int(np.prod(view.shape[2:], dtype=np.int64))


# -- kernels (same names and arguments as the CPU twins) ----------------------------------------


def gemm(
    a: Any,
    b: Any,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Any = None,
) -> Any:
    """``out = alpha * op(a) @ op(b) + beta * out`` for 2-D device arrays (cuBLAS), as the CPU twin:
    without ``out`` (only with ``beta == 0``) a new CuPy array is returned."""
    op = "gemm"
    v, dtype = _floats(op, a=(a, False), b=(b, False))
    for name in "ab":
        if len(v[name].shape) != 2:
            raise ValueError(f"[{op}] {name} must be 2-D, got shape {v[name].shape}")
    m, k = v["a"].shape[::-1] if trans_a else v["a"].shape
    kb, n = v["b"].shape[::-1] if trans_b else v["b"].shape
    if kb != k:
        raise ValueError(f"[{op}] inner dimensions differ: op(a) is {(m, k)}, op(b) is {(kb, n)}")
    if out is None:
        if beta != 0.0:
            raise ValueError(f"[{op}] beta != 0 needs an `out` array to accumulate into")
        import cupy

        out = cupy.empty((m, n), dtype=dtype)
    v.update(_floats(op, a=(a, False), out=(out, True))[0])
    _shape(op, "out", v["out"], (m, n))
    launch(
        _core.cuda_gemm,
        trans_a,
        trans_b,
        m,
        n,
        k,
        alpha,
        v["a"].ptr,
        v["a"].shape[1],
        v["b"].ptr,
        v["b"].shape[1],
        beta,
        v["out"].ptr,
        n,
        dtype,
    )
    return out


def bias_add(x: Any, b: Any) -> None:
    """``x[n, c, ...] += b[c]`` in place; x: (N, C) or (N, C, H, W)."""
    v, dtype = _floats("bias_add", x=(x, True), b=(b, False))
    n, c, inner = _planes("bias_add", "x", v["x"])
    _shape("bias_add", "b", v["b"], (c,))
    launch(_core.cuda_bias_add, v["x"].ptr, v["b"].ptr, n, c, inner, dtype)


def bias_grad(dy: Any, db: Any) -> None:
    """``db[c]`` = sum of dy over every axis but 1."""
    v, dtype = _floats("bias_grad", dy=(dy, False), db=(db, True))
    n, c, inner = _planes("bias_grad", "dy", v["dy"])
    _shape("bias_grad", "db", v["db"], (c,))
    launch(_core.cuda_bias_grad, v["dy"].ptr, v["db"].ptr, n, c, inner, dtype)


def _rows_cols(op: str, name: str, view: _View, softmax: bool) -> tuple[int, int]:
    if softmax and len(view.shape) != 2:
        raise ValueError(f"[{op}] softmax needs a 2-D {name}, got shape {view.shape}")
    if not view.shape:
        return 1, 1
    return view.shape[0], int(np.prod(view.shape[1:], dtype=np.int64))


def activation_forward(name: str, x: Any, y: Any, alpha: float = 0.0) -> None:
    """``y = f(x)``; softmax over axis 1 of a 2-D array. y may be x."""
    op = "activation_forward"
    v, dtype = _floats(op, x=(x, False), y=(y, True))
    _shape(op, "y", v["y"], v["x"].shape)
    rows, cols = _rows_cols(op, "x", v["x"], name == "softmax")
    launch(_core.cuda_activation_forward, name, alpha, v["x"].ptr, v["y"].ptr, rows, cols, dtype)


def activation_backward(name: str, x: Any, y: Any, dy: Any, dx: Any, alpha: float = 0.0) -> None:
    """``dx = dL/dx`` from x, y = f(x) and dy = dL/dy. dx may be dy."""
    op = "activation_backward"
    v, dtype = _floats(op, x=(x, False), y=(y, False), dy=(dy, False), dx=(dx, True))
    for other in ("y", "dy", "dx"):
        _shape(op, other, v[other], v["x"].shape)
    rows, cols = _rows_cols(op, "x", v["x"], name == "softmax")
    launch(
        _core.cuda_activation_backward,
        name,
        alpha,
        v["x"].ptr,
        v["y"].ptr,
        v["dy"].ptr,
        v["dx"].ptr,
        rows,
        cols,
        dtype,
    )


def _loss(
    gradient: bool, loss: str, activation: str, labels: Any, preout: Any, out: Any, mask: Any, alpha: float
) -> None:
    op = "loss_gradient" if gradient else "loss_score"
    arrays = {"labels": (labels, False), "preout": (preout, False), "out": (out, True)}
    if mask is not None:
        arrays["mask"] = (mask, False)
    v, dtype = _floats(op, **arrays)
    if len(v["preout"].shape) != 2:
        raise ValueError(f"[{op}] preout must be (N, C), got shape {v['preout'].shape}")
    n, c = v["preout"].shape
    _shape(op, "labels", v["labels"], (n, c))
    _shape(op, "grad" if gradient else "scores", v["out"], (n, c) if gradient else (n,))
    layout = "none"
    if mask is not None:
        shape = v["mask"].shape
        if shape in ((n,), (n, 1)):
            layout = "per_example"
        elif shape == (n, c):
            layout = "per_output"
        else:
            raise ValueError(f"[{op}] mask must have shape ({n},), ({n}, 1) or ({n}, {c}), got {shape}")
    launch(
        _core.cuda_loss,
        gradient,
        loss,
        activation,
        alpha,
        v["labels"].ptr,
        v["preout"].ptr,
        v["mask"].ptr if mask is not None else 0,
        _MASK_LAYOUT[layout],
        v["out"].ptr,
        n,
        c,
        dtype,
    )


def loss_score(
    loss: str, activation: str, labels: Any, preout: Any, scores: Any, mask: Any = None, alpha: float = 0.0
) -> None:
    """``scores`` (N,) = per-example loss of activation(preout) against labels, times mask."""
    _loss(False, loss, activation, labels, preout, scores, mask, alpha)


def loss_gradient(
    loss: str, activation: str, labels: Any, preout: Any, grad: Any, mask: Any = None, alpha: float = 0.0
) -> None:
    """``grad`` (N, C) = d(example loss)/d(preout), times mask; not divided by N."""
    _loss(True, loss, activation, labels, preout, grad, mask, alpha)


def dropout_forward(x: Any, y: Any, mask: Any, retain: float, seed: int) -> None:
    """Inverted dropout with the CPU's (seed, index) draw: the same mask as the CPU kernel."""
    op = "dropout_forward"
    v, dtype = _floats(op, x=(x, False), y=(y, True), mask=(mask, True))
    _shape(op, "y", v["y"], v["x"].shape)
    _shape(op, "mask", v["mask"], v["x"].shape)
    if not 0 <= seed < 2**64:
        raise ValueError(f"[{op}] seed must be in [0, 2**64), got {seed}")
    size = int(np.prod(v["x"].shape, dtype=np.int64))
    launch(_core.cuda_dropout_forward, v["x"].ptr, v["y"].ptr, v["mask"].ptr, size, retain, seed, dtype)


def dropout_backward(dy: Any, mask: Any, dx: Any) -> None:
    """``dx = dy * mask``."""
    op = "dropout_backward"
    v, dtype = _floats(op, dy=(dy, False), mask=(mask, False), dx=(dx, True))
    _shape(op, "mask", v["mask"], v["dy"].shape)
    _shape(op, "dx", v["dx"], v["dy"].shape)
    launch(
        _core.cuda_dropout_backward,
        v["dy"].ptr,
        v["mask"].ptr,
        v["dx"].ptr,
        int(np.prod(v["dy"].shape, dtype=np.int64)),
        dtype,
    )


def _nchw(op: str, name: str, view: _View) -> tuple[int, int, int, int]:
    if len(view.shape) != 4:
        raise ValueError(f"[{op}] {name} must be (N, C, H, W), got shape {view.shape}")
    return view.shape


def _conv_shape(op: str, x: tuple, w: tuple, y: tuple, strides: tuple[int, ...]) -> list[int]:
    n, c, h, wd = x
    k, cw, r, s = w
    stride_h, stride_w, pad_top, pad_left = strides
    if cw != c or min(k, r, s) < 1:
        raise ValueError(f"[{op}] w must have shape (K, {c}, R, S) with K, R, S >= 1, got {w}")
    if y[:2] != (n, k):
        raise ValueError(f"[{op}] output must be ({n}, {k}, P, Q), got shape {y}")
    if stride_h < 1 or stride_w < 1 or pad_top < 0 or pad_left < 0:
        raise ValueError(f"[{op}] strides must be >= 1 and padding >= 0, got {strides}")
    return [n, c, h, wd, k, r, s, y[2], y[3], stride_h, stride_w, pad_top, pad_left]


def _conv_geometry(op: str, v: dict, names: tuple[str, str, str], strides_pads: tuple[int, ...]) -> list[int]:
    """``_conv_shape`` of the image, kernel and output arrays ``names`` (each checked 4-D) of ``v``."""
    image, kernel, out = (_nchw(op, name, v[name]) for name in names)
    return _conv_shape(op, image, kernel, out, strides_pads)


def conv2d_forward(
    x: Any,
    w: Any,
    b: Any,
    y: Any,
    stride_h: int,
    stride_w: int,
    pad_top: int,
    pad_left: int,
    activation: str = "identity",
    algorithm: str = "auto",
) -> None:
    """``y (N, K, P, Q) = activation(conv(x (N, C, H, W), w (K, C, R, S)) + b)``; padding reads zeros.
    ``activation``: identity or relu (as the CPU kernel's fused epilogue); ``algorithm``: auto (cuDNN in a
    build with it, else im2col), cudnn or im2col (the own kernels: im2col + cuBLAS)."""
    op = "conv2d_forward"
    if activation not in ("identity", "relu"):
        raise ValueError(
            f"[{op}] activation must be identity or relu (the fused epilogues), got '{activation}'"
        )
    arrays = {"x": (x, False), "w": (w, False), "y": (y, True)}
    if b is not None:
        arrays["b"] = (b, False)
    v, dtype = _floats(op, **arrays)
    g = _conv_geometry(op, v, ("x", "w", "y"), (stride_h, stride_w, pad_top, pad_left))
    if b is not None:
        _shape(op, "b", v["b"], (g[4],))
    bias = v["b"].ptr if b is not None else 0
    relu = activation == "relu"
    launch(_core.cuda_conv2d, 0, g, v["x"].ptr, v["w"].ptr, bias, v["y"].ptr, relu, algorithm, dtype)


def conv2d_backward_input(
    dy: Any,
    w: Any,
    dx: Any,
    stride_h: int,
    stride_w: int,
    pad_top: int,
    pad_left: int,
    algorithm: str = "auto",
) -> None:
    """``dx (N, C, H, W)`` from dy (N, K, P, Q) and w (K, C, R, S)."""
    op = "conv2d_backward_input"
    v, dtype = _floats(op, dy=(dy, False), w=(w, False), dx=(dx, True))
    g = _conv_geometry(op, v, ("dx", "w", "dy"), (stride_h, stride_w, pad_top, pad_left))
    launch(_core.cuda_conv2d, 1, g, v["dy"].ptr, v["w"].ptr, 0, v["dx"].ptr, False, algorithm, dtype)


def conv2d_backward_weight(
    x: Any,
    dy: Any,
    dw: Any,
    stride_h: int,
    stride_w: int,
    pad_top: int,
    pad_left: int,
    algorithm: str = "auto",
) -> None:
    """``dw (K, C, R, S)`` from x (N, C, H, W) and dy (N, K, P, Q), summed over the batch."""
    op = "conv2d_backward_weight"
    v, dtype = _floats(op, x=(x, False), dy=(dy, False), dw=(dw, True))
    g = _conv_geometry(op, v, ("x", "dw", "dy"), (stride_h, stride_w, pad_top, pad_left))
    launch(_core.cuda_conv2d, 2, g, v["x"].ptr, v["dy"].ptr, 0, v["dw"].ptr, False, algorithm, dtype)


def _pool(backward: bool, kind: str, big: Any, small: Any, geometry: tuple[int, ...], argmax: Any) -> None:
    op = "pool2d_backward" if backward else "pool2d_forward"
    names = ("dx", "dy") if backward else ("x", "y")
    v, dtype = _floats(op, **{names[0]: (big, backward), names[1]: (small, not backward)})
    n, c, h, w = _nchw(op, names[0], v[names[0]])
    out = _nchw(op, names[1], v[names[1]])
    if out[:2] != (n, c):
        raise ValueError(f"[{op}] {names[1]} must be ({n}, {c}, P, Q), got shape {out}")
    kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left = geometry
    if min(kernel_h, kernel_w, stride_h, stride_w) < 1 or min(pad_top, pad_left) < 0:
        raise ValueError(f"[{op}] kernel and stride must be >= 1 and padding >= 0, got {geometry}")
    p, q = out[2], out[3]
    rows_ok = p == 0 or (pad_top < kernel_h and (p - 1) * stride_h - pad_top < h)
    cols_ok = q == 0 or (pad_left < kernel_w and (q - 1) * stride_w - pad_left < w)
    if not (rows_ok and cols_ok):  # every window must overlap the input (max and mean undefined otherwise)
        raise ValueError(f"[{op}] output size ({p}, {q}) has pooling windows outside the ({h}, {w}) input")
    g = [n, c, h, w, p, q, *geometry]
    ptr = _argmax(op, argmax, out, kind == "max")
    launch(
        _core.cuda_pool2d,
        backward,
        kind,
        g,
        v[names[0] if not backward else names[1]].ptr,
        v[names[1] if not backward else names[0]].ptr,
        ptr,
        dtype,
    )


def pool2d_forward(
    kind: str,
    x: Any,
    y: Any,
    kernel_h: int,
    kernel_w: int,
    stride_h: int,
    stride_w: int,
    pad_top: int,
    pad_left: int,
    argmax: Any = None,
) -> None:
    """Max / avg pooling of x (N, C, H, W) into y (N, C, P, Q); max writes argmax (int64, y's shape)."""
    _pool(False, kind, x, y, (kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left), argmax)


def pool2d_backward(
    kind: str,
    dy: Any,
    dx: Any,
    kernel_h: int,
    kernel_w: int,
    stride_h: int,
    stride_w: int,
    pad_top: int,
    pad_left: int,
    argmax: Any = None,
) -> None:
    """dx (N, C, H, W) from dy (N, C, P, Q); max needs the forward's argmax."""
    _pool(True, kind, dx, dy, (kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left), argmax)


def _global_pool(backward: bool, kind: str, big: Any, small: Any, argmax: Any) -> None:
    op = "global_pool_backward" if backward else "global_pool_forward"
    names = ("dx", "dy") if backward else ("x", "y")
    v, dtype = _floats(op, **{names[0]: (big, backward), names[1]: (small, not backward)})
    n, c, h, w = _nchw(op, names[0], v[names[0]])
    if h * w == 0:  # as the CPU twin: max would read past an empty plane, avg would divide by zero
        raise ValueError(f"[{op}] {names[0]} must have a non-empty (H, W) plane")
    _shape(op, names[1], v[names[1]], (n, c))
    ptr = _argmax(op, argmax, (n, c), kind == "max")
    src, dst = (v[names[1]], v[names[0]]) if backward else (v[names[0]], v[names[1]])
    launch(_core.cuda_global_pool, backward, kind, src.ptr, dst.ptr, ptr, n * c, h * w, dtype)


def global_pool_forward(kind: str, x: Any, y: Any, argmax: Any = None) -> None:
    """Global max / avg / sum pooling of x (N, C, H, W) into y (N, C)."""
    _global_pool(False, kind, x, y, argmax)


def global_pool_backward(kind: str, dy: Any, dx: Any, argmax: Any = None) -> None:
    """dx (N, C, H, W) from dy (N, C); max needs argmax."""
    _global_pool(True, kind, dx, dy, argmax)


def _channels(op: str, v: dict[str, _View], data: str, names: tuple[str, ...]) -> list[int]:
    g = list(_planes(op, data, v[data]))
    for name in names:
        _shape(op, name, v[name], (g[1],))
    return g


def _check_eps(op: str, eps: float, decay: float = 0.0) -> None:
    if not eps > 0:
        raise ValueError(f"[{op}] eps must be > 0, got {eps}")
    if not 0 <= decay <= 1:
        raise ValueError(f"[{op}] decay must be in [0, 1], got {decay}")


def batchnorm_forward_train(
    x: Any,
    gamma: Any,
    beta: Any,
    y: Any,
    batch_mean: Any,
    batch_var: Any,
    running_mean: Any,
    running_var: Any,
    decay: float,
    eps: float,
) -> None:
    """Normalizes x with its per-channel batch statistics; updates the running averages in place."""
    op = "batchnorm_forward_train"
    _check_eps(op, eps, decay)
    v, dtype = _floats(
        op,
        x=(x, False),
        gamma=(gamma, False),
        beta=(beta, False),
        y=(y, True),
        batch_mean=(batch_mean, True),
        batch_var=(batch_var, True),
        running_mean=(running_mean, True),
        running_var=(running_var, True),
    )
    g = _channels(op, v, "x", ("gamma", "beta", "batch_mean", "batch_var", "running_mean", "running_var"))
    _shape(op, "y", v["y"], v["x"].shape)
    launch(
        _core.cuda_batchnorm_forward_train,
        g,
        *(
            v[k].ptr
            for k in ("x", "gamma", "beta", "y", "batch_mean", "batch_var", "running_mean", "running_var")
        ),
        decay,
        eps,
        dtype,
    )


def batchnorm_forward_inference(
    x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, y: Any, eps: float
) -> None:
    """Normalizes x with the running statistics."""
    op = "batchnorm_forward_inference"
    _check_eps(op, eps)
    v, dtype = _floats(
        op,
        x=(x, False),
        gamma=(gamma, False),
        beta=(beta, False),
        running_mean=(running_mean, False),
        running_var=(running_var, False),
        y=(y, True),
    )
    g = _channels(op, v, "x", ("gamma", "beta", "running_mean", "running_var"))
    _shape(op, "y", v["y"], v["x"].shape)
    launch(
        _core.cuda_batchnorm_forward_inference,
        g,
        *(v[k].ptr for k in ("x", "gamma", "beta", "running_mean", "running_var", "y")),
        eps,
        dtype,
    )


def batchnorm_backward(
    x: Any, dy: Any, gamma: Any, batch_mean: Any, batch_var: Any, dx: Any, dgamma: Any, dbeta: Any, eps: float
) -> None:
    """dx, dgamma, dbeta of the training-mode forward."""
    op = "batchnorm_backward"
    _check_eps(op, eps)
    v, dtype = _floats(
        op,
        x=(x, False),
        dy=(dy, False),
        gamma=(gamma, False),
        batch_mean=(batch_mean, False),
        batch_var=(batch_var, False),
        dx=(dx, True),
        dgamma=(dgamma, True),
        dbeta=(dbeta, True),
    )
    g = _channels(op, v, "x", ("gamma", "batch_mean", "batch_var", "dgamma", "dbeta"))
    _shape(op, "dy", v["dy"], v["x"].shape)
    _shape(op, "dx", v["dx"], v["x"].shape)
    launch(
        _core.cuda_batchnorm_backward,
        g,
        *(v[k].ptr for k in ("x", "dy", "gamma", "batch_mean", "batch_var", "dx", "dgamma", "dbeta")),
        eps,
        dtype,
    )


def _flat(op: str, v: dict[str, _View], names: tuple[str, ...]) -> int:
    n = v[names[0]].shape
    if len(n) != 1:
        raise ValueError(f"[{op}] {names[0]} must be 1-D, got shape {n}")
    for name in names[1:]:
        _shape(op, name, v[name], n)
    return n[0]


def updater_apply(
    kind: str,
    gradient: Any,
    state: Any,
    iteration: int,
    learning_rate: float = 0.0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    momentum: float = 0.9,
    rms_decay: float = 0.95,
    rho: float = 0.95,
) -> None:
    """Turns the flat gradient (in place) into the update to subtract and advances the flat state."""
    op = "updater_apply"
    # the CPU twin's checks (beta = 1 would divide by a zero bias correction)
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"[{op}] beta1 must be in [0, 1), got {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"[{op}] beta2 must be in [0, 1), got {beta2}")
    if not epsilon >= 0.0:
        raise ValueError(f"[{op}] epsilon must be >= 0, got {epsilon}")
    v, dtype = _floats(op, gradient=(gradient, True), state=(state, True))
    n = _flat(op, v, ("gradient",))
    _shape(op, "state", v["state"], (_core.updater_state_size(kind, n),))
    hyper = [learning_rate, beta1, beta2, epsilon, momentum, rms_decay, rho]
    launch(_core.cuda_updater_apply, kind, v["gradient"].ptr, v["state"].ptr, n, iteration, hyper, dtype)


def regularize_gradient(params: Any, grad: Any, l1: float, l2: float) -> None:
    """``grad += l2 * params + l1 * sign(params)``, in place."""
    v, dtype = _floats("regularize_gradient", params=(params, False), grad=(grad, True))
    n = int(np.prod(v["params"].shape, dtype=np.int64))
    _shape("regularize_gradient", "grad", v["grad"], v["params"].shape)
    launch(_core.cuda_regularize_gradient, v["params"].ptr, v["grad"].ptr, n, l1, l2, dtype)


def apply_weight_decay(params: Any, update: Any, coeff: float) -> None:
    """``update += coeff * params``, in place."""
    v, dtype = _floats("apply_weight_decay", params=(params, False), update=(update, True))
    n = int(np.prod(v["params"].shape, dtype=np.int64))
    _shape("apply_weight_decay", "update", v["update"], v["params"].shape)
    launch(_core.cuda_apply_weight_decay, v["params"].ptr, v["update"].ptr, n, coeff, dtype)


# -- recurrent and graph-vertex kernels (same names and arguments as the CPU twins) ---------------


def _overlaps(a: _View, b: _View) -> bool:
    """Whether two device arrays share memory."""
    size_a = int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
    size_b = int(np.prod(b.shape, dtype=np.int64)) * b.dtype.itemsize
    return size_a > 0 and size_b > 0 and a.ptr < b.ptr + size_b and b.ptr < a.ptr + size_a


def _size(view: _View) -> int:
    return int(np.prod(view.shape, dtype=np.int64))


def _check_finite_eps(op: str, eps: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"[{op}] eps must be a finite number > 0, got {eps}")


def _rows(op: str, name: str, view: _View) -> tuple[int, int]:
    """(n, d) of an (N, ...) array viewed as N rows."""
    if not view.shape:
        raise ValueError(f"[{op}] {name} must have a batch axis, got a 0-d array")
    n = view.shape[0]
    return n, 0 if n == 0 else _size(view) // n


def _with_optional(arrays: dict[str, tuple[Any, bool]], **optional: Any) -> dict[str, tuple[Any, bool]]:
    """``arrays`` plus the read-only optional arrays that are not None."""
    return {**arrays, **{name: (arr, False) for name, arr in optional.items() if arr is not None}}


def _recurrent_shape(op: str, v: dict[str, _View], gates: int) -> tuple[int, int, int, int]:
    """(n, t, c, h) from x (N, T, C) and w (C, gates * H): 4 gates for the LSTM, 1 for SimpleRnn; checks
    rw (H, gates * H) and the optional mask (N, T), h0 and the LSTM's c0 (N, H)."""
    x, w = v["x"].shape, v["w"].shape
    width = "H" if gates == 1 else f"{gates}H"
    if len(x) != 3:
        raise ValueError(f"[{op}] x must be 3-D (N, T, C), got shape {x}")
    if len(w) != 2:
        raise ValueError(f"[{op}] w must be 2-D (C, {width}), got shape {w}")
    n, t, c = x
    if n < 1:
        raise ValueError(f"[{op}] x.shape[0] (examples) must be >= 1, got {n}")
    if t < 1:
        raise ValueError(f"[{op}] x.shape[1] (time steps) must be >= 1, got {t}")
    if w[0] != c or w[1] % gates != 0 or w[1] == 0:
        raise ValueError(f"[{op}] w must have shape ({c}, {width}) with H >= 1, got {w}")
    h = w[1] // gates
    _shape(op, "rw", v["rw"], (h, gates * h))
    for name, shape in (("mask", (n, t)), ("h0", (n, h)), ("c0", (n, h))):
        if name in v:
            _shape(op, name, v[name], shape)
    return n, t, c, h


def _ptr(v: dict[str, _View], name: str) -> int:
    """The device pointer of an optional array, 0 when absent."""
    return v[name].ptr if name in v else 0


def lstm_forward(
    x: Any,
    w: Any,
    rw: Any,
    b: Any,
    hs: Any,
    cs: Any,
    gates: Any,
    act_c: Any,
    mask: Any = None,
    h0: Any = None,
    c0: Any = None,
    activation: str = "tanh",
    gate_activation: str = "sigmoid",
    alpha: float = 0.0,
    gate_alpha: float = 0.0,
) -> None:
    """LSTM over x (N, T, C) with w (C, 4H), rw (H, 4H), b (4H), gate order [a, f, o, i] (DL4J).

    Args:
        x: (N, T, C) input sequence.
        w: (C, 4H) input weights.
        rw: (H, 4H) recurrent weights.
        b: (4H) bias.
        hs: (N, T, H) output: hidden states.
        cs: (N, T, H) output: cell states.
        act_c: (N, T, H) output: activation(cell) before masking.
        gates: (N, T, 4H) output: the activated gate values.
        mask: (N, T) or None; multiplies h and c per step.
        h0: (N, H) initial hidden state or None (zeros).
        c0: (N, H) initial cell state or None (zeros).
        activation: elementwise activation of the block input and the cell output.
        gate_activation: elementwise activation of the gates.
        alpha: alpha of ``activation``.
        gate_alpha: alpha of ``gate_activation``.
    """
    op = "lstm_forward"
    arrays = {
        "x": (x, False),
        "w": (w, False),
        "rw": (rw, False),
        "b": (b, False),
        "hs": (hs, True),
        "cs": (cs, True),
        "gates": (gates, True),
        "act_c": (act_c, True),
    }
    v, dtype = _floats(op, **_with_optional(arrays, mask=mask, h0=h0, c0=c0))
    n, t, c, h = _recurrent_shape(op, v, 4)
    _shape(op, "b", v["b"], (4 * h,))
    for name in ("hs", "cs", "act_c"):
        _shape(op, name, v[name], (n, t, h))
    _shape(op, "gates", v["gates"], (n, t, 4 * h))
    launch(
        _core.cuda_lstm_forward,
        [n, t, c, h],
        *(v[k].ptr for k in ("x", "w", "rw", "b")),
        *(_ptr(v, k) for k in ("mask", "h0", "c0")),
        *(v[k].ptr for k in ("hs", "cs", "gates", "act_c")),
        activation,
        gate_activation,
        alpha,
        gate_alpha,
        dtype,
    )


def lstm_backward(
    x: Any,
    w: Any,
    rw: Any,
    hs: Any,
    cs: Any,
    gates: Any,
    act_c: Any,
    dh: Any,
    dgates: Any,
    dw: Any,
    drw: Any,
    db: Any,
    dx: Any = None,
    mask: Any = None,
    h0: Any = None,
    c0: Any = None,
    activation: str = "tanh",
    gate_activation: str = "sigmoid",
    alpha: float = 0.0,
    gate_alpha: float = 0.0,
    first_step: int = 0,
) -> None:
    """Backward of :func:`lstm_forward` given dh = dL/dhs (N, T, H).

    Args:
        x: the forward's input sequence.
        w: the forward's input weights.
        rw: the forward's recurrent weights.
        hs: the forward's hidden states.
        cs: the forward's cell states.
        gates: the forward's activated gates.
        act_c: the forward's activation(cell).
        mask: the forward's mask or None.
        h0: the forward's initial hidden state or None.
        c0: the forward's initial cell state or None.
        dh: (N, T, H) gradient of the loss with respect to hs.
        dgates: (N, T, 4H) output: dL/d(pre-activations).
        dw: output shaped like w.
        drw: output shaped like rw.
        db: output shaped like the bias (4H).
        dx: (N, T, C) output or None.
        first_step: steps before it get no gradient (truncated BPTT), 0 <= first_step < T.
    """
    op = "lstm_backward"
    arrays = {
        "x": (x, False),
        "w": (w, False),
        "rw": (rw, False),
        "hs": (hs, False),
        "cs": (cs, False),
        "gates": (gates, False),
        "act_c": (act_c, False),
        "dh": (dh, False),
        "dgates": (dgates, True),
        "dw": (dw, True),
        "drw": (drw, True),
        "db": (db, True),
    }
    if dx is not None:
        arrays["dx"] = (dx, True)
    v, dtype = _floats(op, **_with_optional(arrays, mask=mask, h0=h0, c0=c0))
    n, t, c, h = _recurrent_shape(op, v, 4)
    if not 0 <= first_step < t:
        raise ValueError(f"[{op}] first_step must be in [0, {t}), got {first_step}")
    for name in ("hs", "cs", "act_c", "dh"):
        _shape(op, name, v[name], (n, t, h))
    for name in ("gates", "dgates"):
        _shape(op, name, v[name], (n, t, 4 * h))
    _shape(op, "dw", v["dw"], (c, 4 * h))
    _shape(op, "drw", v["drw"], (h, 4 * h))
    _shape(op, "db", v["db"], (4 * h,))
    if dx is not None:
        _shape(op, "dx", v["dx"], (n, t, c))
    launch(
        _core.cuda_lstm_backward,
        [n, t, c, h],
        *(v[k].ptr for k in ("x", "w", "rw")),
        *(_ptr(v, k) for k in ("mask", "h0", "c0")),
        *(v[k].ptr for k in ("hs", "cs", "gates", "act_c", "dh", "dgates")),
        _ptr(v, "dx"),
        *(v[k].ptr for k in ("dw", "drw", "db")),
        first_step,
        activation,
        gate_activation,
        alpha,
        gate_alpha,
        dtype,
    )


def _times_derivative(activation: str, alpha: float, y: Any, d: Any) -> None:
    """``d *= f'(z)`` in place for the (N, H) activations ``y = f(z)`` of one step, written in terms of y
    as the CPU kernel does (the backward keeps no pre-activations)."""
    if activation == "softmax":
        d -= (d * y).sum(axis=1, keepdims=True)
        d *= y
    elif activation in ("relu", "leakyrelu", "elu"):
        low = {"relu": 0.0, "leakyrelu": alpha, "elu": y + alpha}[activation]
        d *= (y > 0) + (y <= 0) * low
    elif activation == "tanh":
        d *= 1.0 - y * y
    elif activation == "sigmoid":
        d *= y * (1.0 - y)
    elif activation == "softplus":
        import cupy

        d *= -cupy.expm1(-y)
    elif activation == "hardtanh":
        d *= (y > -1) & (y < 1)
    elif activation != "identity":
        raise ValueError(f"[simple_rnn_backward] unknown activation {activation!r}")


def simple_rnn_forward(
    x: Any,
    w: Any,
    rw: Any,
    b: Any,
    hs: Any,
    act: Any,
    mask: Any = None,
    h0: Any = None,
    activation: str = "tanh",
    alpha: float = 0.0,
) -> None:
    """SimpleRnn over x (N, T, C) with w (C, H), rw (H, H), b (H), as the CPU twin.

    There is no fused CUDA kernel: one GEMM projects the input of every step, then each step is one GEMM
    and one activation op over time-major (T, N, H) work arrays.

    Args:
        x: (N, T, C) input sequence.
        w: (C, H) input weights.
        rw: (H, H) recurrent weights.
        b: (H) bias.
        hs: (N, T, H) output: the step outputs.
        act: (N, T, H) output: the activations before the mask.
        mask: (N, T) or None; multiplies each step's output.
        h0: (N, H) initial state or None (zeros).
        activation: the activation.
        alpha: its alpha.
    """
    op = "simple_rnn_forward"
    arrays = {"x": (x, False), "w": (w, False), "rw": (rw, False), "b": (b, False), "hs": (hs, True)}
    v, _ = _floats(op, **_with_optional({**arrays, "act": (act, True)}, mask=mask, h0=h0))
    n, t, c, h = _recurrent_shape(op, v, 1)
    _shape(op, "b", v["b"], (h,))
    for name in ("hs", "act"):
        _shape(op, name, v[name], (n, t, h))
    import cupy

    zx = gemm(x.reshape(n * t, c), w)
    bias_add(zx, b)
    z = cupy.ascontiguousarray(zx.reshape(n, t, h).transpose(1, 0, 2))
    a, out, rec = cupy.empty_like(z), cupy.empty_like(z), cupy.empty((n, h), z.dtype)
    m = None if mask is None else cupy.ascontiguousarray(mask.T)[:, :, None]
    for step in range(t):
        prev = out[step - 1] if step > 0 else h0
        if prev is not None:
            gemm(prev, rw, out=rec)
            z[step] += rec
        activation_forward(activation, z[step], a[step], alpha=alpha)
        if m is None:
            out[step] = a[step]
        else:
            cupy.multiply(a[step], m[step], out=out[step])
    hs[...] = out.transpose(1, 0, 2)
    act[...] = a.transpose(1, 0, 2)


def simple_rnn_backward(
    x: Any,
    w: Any,
    rw: Any,
    hs: Any,
    act: Any,
    dh: Any,
    dz: Any,
    dw: Any,
    drw: Any,
    db: Any,
    dx: Any = None,
    mask: Any = None,
    h0: Any = None,
    activation: str = "tanh",
    alpha: float = 0.0,
    first_step: int = 0,
) -> None:
    """Backward of :func:`simple_rnn_forward` given dh = dL/dhs (N, T, H), as the CPU twin: one GEMM per
    step back through time, then one GEMM per weight gradient.

    Args:
        x: the forward's input sequence.
        w: the forward's input weights.
        rw: the forward's recurrent weights.
        hs: the forward's step outputs.
        act: the forward's activations before the mask.
        mask: the forward's mask or None.
        h0: the forward's initial state or None.
        activation: the forward's activation.
        alpha: its alpha.
        dh: (N, T, H) gradient of the loss with respect to hs.
        dz: (N, T, H) output: dL/d(pre-activations).
        dw: output shaped like w.
        drw: output shaped like rw.
        db: output shaped like the bias (H).
        dx: (N, T, C) output or None.
        first_step: steps before it get no gradient (truncated BPTT), 0 <= first_step < T.
    """
    op = "simple_rnn_backward"
    arrays = {
        "x": (x, False),
        "w": (w, False),
        "rw": (rw, False),
        "hs": (hs, False),
        "act": (act, False),
        "dh": (dh, False),
        "dz": (dz, True),
        "dw": (dw, True),
        "drw": (drw, True),
        "db": (db, True),
    }
    if dx is not None:
        arrays["dx"] = (dx, True)
    v, _ = _floats(op, **_with_optional(arrays, mask=mask, h0=h0))
    n, t, c, h = _recurrent_shape(op, v, 1)
    if not 0 <= first_step < t:
        raise ValueError(f"[{op}] first_step must be in [0, {t}), got {first_step}")
    for name in ("hs", "act", "dh", "dz"):
        _shape(op, name, v[name], (n, t, h))
    _shape(op, "dw", v["dw"], (c, h))
    _shape(op, "drw", v["drw"], (h, h))
    _shape(op, "db", v["db"], (h,))
    if dx is not None:
        _shape(op, "dx", v["dx"], (n, t, c))
    import cupy

    h_prev = cupy.empty((n, t, h), hs.dtype)  # the state each step started from
    h_prev[:, 0] = 0.0 if h0 is None else h0
    h_prev[:, 1:] = hs[:, :-1]
    a = cupy.ascontiguousarray(act.transpose(1, 0, 2))
    d = cupy.ascontiguousarray(dh.transpose(1, 0, 2))
    m = None if mask is None else cupy.ascontiguousarray(mask.T)[:, :, None]
    rec = cupy.empty((n, h), d.dtype)
    d[:first_step] = 0.0  # truncated BPTT: no gradient before the backward window
    for step in range(t - 1, first_step - 1, -1):
        if step < t - 1:
            gemm(d[step + 1], rw, trans_b=True, out=rec)
            d[step] += rec
        if m is not None:
            d[step] *= m[step]
        _times_derivative(activation, alpha, a[step], d[step])
    dz[...] = d.transpose(1, 0, 2)
    dz_rows = dz.reshape(n * t, h)
    gemm(x.reshape(n * t, c), dz_rows, trans_a=True, out=dw)
    gemm(h_prev.reshape(n * t, h), dz_rows, trans_a=True, out=drw)
    bias_grad(dz_rows, db)
    if dx is not None:
        gemm(dz_rows, w, trans_b=True, out=dx.reshape(n * t, c))


def _array_list(op: str, name: str, arrays: Sequence[Any], writable: bool) -> dict[str, tuple[Any, bool]]:
    """``name[i]`` -> (array, writable) for a list of arrays."""
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, Sequence):
        raise TypeError(f"[{op}] {name} must be a list of GPU arrays, got {type(arrays).__name__}")
    return {f"{name}[{i}]": (arr, writable) for i, arr in enumerate(arrays)}


def elementwise_forward(kind: str, inputs: Sequence[Any], y: Any) -> None:
    """``y`` = add / subtract / product / average / max of the same-shape arrays in inputs (subtract: 2)."""
    op = "elementwise_forward"
    v, dtype = _floats(op, y=(y, True), **_array_list(op, "inputs", inputs, False))
    names = [f"inputs[{i}]" for i in range(len(inputs))]
    for name in names:
        _shape(op, name, v[name], v["y"].shape)
    launch(
        _core.cuda_elementwise_forward,
        kind,
        [v[name].ptr for name in names],
        v["y"].ptr,
        _size(v["y"]),
        dtype,
    )


def elementwise_backward(kind: str, inputs: Sequence[Any], dy: Any, dx: Sequence[Any]) -> None:
    """``dx[i] = dL/d inputs[i]`` from dy; max routes dy to the first maximal input."""
    op = "elementwise_backward"
    v, dtype = _floats(
        op,
        dy=(dy, False),
        **_array_list(op, "inputs", inputs, False),
        **_array_list(op, "dx", dx, True),
    )
    if len(dx) != len(inputs):
        raise ValueError(f"[{op}] dx must hold one array per input ({len(inputs)}), got {len(dx)}")
    names_in = [f"inputs[{i}]" for i in range(len(inputs))]
    names_dx = [f"dx[{i}]" for i in range(len(dx))]
    for name in names_in + names_dx:
        _shape(op, name, v[name], v["dy"].shape)
    for i, name in enumerate(names_dx):
        others = ["dy", *names_in, *names_dx[:i]]
        if any(_overlaps(v[name], v[other]) for other in others):
            raise ValueError(f"[{op}] {name} must not overlap dy, an input or another dx")
    launch(
        _core.cuda_elementwise_backward,
        kind,
        [v[name].ptr for name in names_in],
        v["dy"].ptr,
        [v[name].ptr for name in names_dx],
        _size(v["dy"]),
        dtype,
    )


def scale_shift(x: Any, y: Any, scale: float = 1.0, shift: float = 0.0) -> None:
    """``y = x * scale + shift``; y may be x."""
    op = "scale_shift"
    v, dtype = _floats(op, x=(x, False), y=(y, True))
    _shape(op, "y", v["y"], v["x"].shape)
    launch(_core.cuda_scale_shift, v["x"].ptr, v["y"].ptr, _size(v["x"]), scale, shift, dtype)


def l2_normalize_forward(x: Any, y: Any, norms: Any, eps: float) -> None:
    """``y = x / max(||x_i||, eps)`` per example (row of the (N, ...) array); norms (N,). y may not be x."""
    op = "l2_normalize_forward"
    _check_finite_eps(op, eps)
    v, dtype = _floats(op, x=(x, False), y=(y, True), norms=(norms, True))
    _shape(op, "y", v["y"], v["x"].shape)
    n, d = _rows(op, "x", v["x"])
    _shape(op, "norms", v["norms"], (n,))
    if _overlaps(v["x"], v["y"]):
        raise ValueError(f"[{op}] y must not overlap x")
    launch(_core.cuda_l2_normalize_forward, v["x"].ptr, v["y"].ptr, v["norms"].ptr, n, d, eps, dtype)


def l2_normalize_backward(y: Any, norms: Any, dy: Any, dx: Any, eps: float) -> None:
    """``dx`` from y, norms and dy of :func:`l2_normalize_forward`; dx may be dy."""
    op = "l2_normalize_backward"
    _check_finite_eps(op, eps)
    v, dtype = _floats(op, y=(y, False), norms=(norms, False), dy=(dy, False), dx=(dx, True))
    _shape(op, "dy", v["dy"], v["y"].shape)
    _shape(op, "dx", v["dx"], v["y"].shape)
    n, d = _rows(op, "y", v["y"])
    _shape(op, "norms", v["norms"], (n,))
    launch(
        _core.cuda_l2_normalize_backward,
        v["y"].ptr,
        v["norms"].ptr,
        v["dy"].ptr,
        v["dx"].ptr,
        n,
        d,
        eps,
        dtype,
    )


def l2_distance_forward(a: Any, b: Any, y: Any) -> None:
    """``y (N,) = ||a_i - b_i||_2`` per example of the (N, ...) arrays a and b."""
    op = "l2_distance_forward"
    v, dtype = _floats(op, a=(a, False), b=(b, False), y=(y, True))
    _shape(op, "b", v["b"], v["a"].shape)
    n, d = _rows(op, "a", v["a"])
    _shape(op, "y", v["y"], (n,))
    launch(_core.cuda_l2_distance_forward, v["a"].ptr, v["b"].ptr, v["y"].ptr, n, d, dtype)


def l2_distance_backward(a: Any, b: Any, y: Any, dy: Any, da: Any, db: Any, eps: float) -> None:
    """``da = dy (a - b) / max(y, eps)``, ``db = -da``."""
    op = "l2_distance_backward"
    _check_finite_eps(op, eps)
    v, dtype = _floats(
        op, a=(a, False), b=(b, False), y=(y, False), dy=(dy, False), da=(da, True), db=(db, True)
    )
    for name in ("b", "da", "db"):
        _shape(op, name, v[name], v["a"].shape)
    n, d = _rows(op, "a", v["a"])
    _shape(op, "y", v["y"], (n,))
    _shape(op, "dy", v["dy"], (n,))
    pairs = (("da", "db"), ("da", "a"), ("da", "b"), ("db", "a"), ("db", "b"))
    if any(_overlaps(v[p], v[q]) for p, q in pairs):
        raise ValueError(f"[{op}] da and db must not overlap each other, a or b")
    launch(
        _core.cuda_l2_distance_backward,
        *(v[k].ptr for k in ("a", "b", "y", "dy", "da", "db")),
        n,
        d,
        eps,
        dtype,
    )


__all__ = [
    "GpuInfo",
    "activation_backward",
    "activation_forward",
    "apply_weight_decay",
    "batchnorm_backward",
    "batchnorm_forward_inference",
    "batchnorm_forward_train",
    "bias_add",
    "bias_grad",
    "built",
    "conv2d_backward_input",
    "conv2d_backward_weight",
    "conv2d_forward",
    "devices",
    "dropout_backward",
    "dropout_forward",
    "elementwise_backward",
    "elementwise_forward",
    "gemm",
    "global_pool_backward",
    "global_pool_forward",
    "is_device_array",
    "kernels_for",
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
    "set_sync_each_op",
    "simple_rnn_backward",
    "simple_rnn_forward",
    "summary",
    "sync_each_op",
    "updater_apply",
]
