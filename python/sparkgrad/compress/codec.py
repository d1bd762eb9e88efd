"""The codecs and the message format: Strom (2015) threshold encoding of gradient updates, in
Deeplearning4j's int32 message format, on the CPU and on CUDA GPUs.

A message is ``[n, N, bits, flag, payload...]``: ``N`` the dense length, ``bits`` the threshold's
float32 bit pattern, ``flag`` 0 for the sparse format (``n`` entries ``+(i+1)`` / ``-(i+1)`` in ascending
index order) and 1 for the bitmap format (word 0 holds ``N``; ``N // 16 + 1`` words of 2 bits per element,
with DL4J's asymmetric ``-t/2`` half code and no ``+t/2`` code).

The codecs work on numpy arrays on the CPU and on CuPy arrays with the CUDA kernels (when sparkgrad is
built with CUDA); each validates its arrays and dispatches to the native kernels of their device.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from sparkgrad import cuda
from sparkgrad._config import check_int
from sparkgrad._native import _core
from sparkgrad.device import is_gpu_array

HEADER_WORDS = 4
FLAG_SPARSE = 0
FLAG_BITMAP = 1
_FLAG_ANY = -1

Array = Any  # numpy.ndarray or cupy.ndarray

# ---------------------------------------------------------------------------------------------
# Device dispatch
# ---------------------------------------------------------------------------------------------


def _device_vector(op: str, name: str, arr: Any, writable: bool) -> tuple[int, int, np.dtype]:
    """(pointer, length, dtype) of a 1-D C-contiguous CuPy array."""
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is None:  # a GPU array known only through DLPack
        raise TypeError(
            f"[{op}] {name}: a GPU array without __cuda_array_interface__; pass cupy.from_dlpack(it)"
        )
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    if len(shape) != 1:
        raise ValueError(f"[{op}] {name} must be 1-D, got {len(shape)} dimensions")
    strides = cai.get("strides")
    if strides is not None and shape[0] > 1 and strides[0] != dtype.itemsize:
        raise ValueError(f"[{op}] {name} must be C-contiguous")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ValueError(f"[{op}] {name} must be writable")
    return int(ptr), int(shape[0]), dtype


def _device_message(op: str, message: Any) -> tuple[int, int]:
    ptr, length, dtype = _device_vector(op, "message", message, writable=False)
    if dtype != np.int32:
        raise ValueError(f"[{op}] message must have dtype int32, got {dtype}")
    return ptr, length


def _check_threshold(op: str, threshold: Any) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise TypeError(f"[{op}] threshold must be a number, got {type(threshold).__name__}")
    return float(threshold)


def _cupy() -> Any:
    import cupy

    return cupy


def _require_cuda_build(op: str) -> None:
    """Raises the native kernels' error of a CPU build before a device path allocates with CuPy."""
    if not _core.cuda_built():
        raise RuntimeError(f"[{op}] sparkgrad was built without CUDA")


def _array_gpu(arr: Any) -> int:
    """The ordinal of the GPU holding a device array (CuPy reads it from the pointer for foreign arrays)."""
    return int(_cupy().asarray(arr).device.id)


def _bitmap_words(n: int) -> int:
    """Length of a bitmap message for ``n`` elements (``bitmap_length`` in compress.h)."""
    return n // 16 + 5


# ---------------------------------------------------------------------------------------------
# Codecs
# ---------------------------------------------------------------------------------------------


def threshold_encode(residual: Array, threshold: float, boundary: int | None = None) -> Array:
    """Sparse threshold encoding; the residual is modified in place.

    Every element with ``|residual[i]| >= threshold`` emits one entry and moves toward zero by exactly
    ``threshold`` (the float32 value stored in the header).

    Args:
        residual: 1-D C-contiguous float32/float64 numpy (or CuPy) array, modified in place.
        threshold: positive threshold (rounded to float32, as stored in the message).
        boundary: encode at most this many entries, lowest indices first; others keep their residual.

    Returns:
        The int32 message; header-only (``n == 0``) when nothing qualifies. For a CuPy residual a CuPy
        array of exactly the message's size (the call waits once to learn it; see
        :func:`threshold_encode_into`, which does not wait).
    """
    op = "threshold_encode"
    t = _check_threshold(op, threshold)
    limit = -1 if boundary is None else check_int("boundary", boundary, minimum=0)
    if not is_gpu_array(residual):
        return _core.threshold_encode(residual, t, limit)
    ptr, n, dtype = _device_vector(op, "residual", residual, writable=True)
    _require_cuda_build(op)
    out = _cupy().empty(_sparse_capacity(n, limit), dtype=np.int32)
    cuda.launch(_core.cuda_threshold_encode, ptr, n, dtype, t, limit, out.data.ptr)
    # a copy of the message's size: a view would keep the worst-case buffer (as large as the residual) alive
    return out[: HEADER_WORDS + cuda.launch(_core.cuda_message_entries, out.data.ptr)].copy()


def threshold_encode_into(residual: Array, threshold: float, out: Array, boundary: int | None = None) -> None:
    """:func:`threshold_encode` into a caller's buffer; for a CuPy residual it returns as soon as the
    encoding is queued on the current stream, without waiting for the GPU.

    The message is ``out[:HEADER_WORDS + out[0]]``: word 0 holds the number of entries once the encoding
    has run (for a CuPy residual: after the next synchronisation with the stream, which the caller may
    need anyway, to copy the message to the host say). Words past the message are left undefined.

    Args:
        residual: 1-D C-contiguous float32/float64 numpy (or CuPy) array, modified in place.
        threshold: positive threshold (rounded to float32, as stored in the message).
        out: 1-D C-contiguous writable int32 array on the residual's device, of at least
            ``HEADER_WORDS + min(N, boundary)`` words (``HEADER_WORDS + N`` without a boundary).
        boundary: encode at most this many entries, lowest indices first; others keep their residual.
    """
    op = "threshold_encode"
    t = _check_threshold(op, threshold)
    limit = -1 if boundary is None else check_int("boundary", boundary, minimum=0)
    if is_gpu_array(residual) != is_gpu_array(out):
        raise TypeError(f"[{op}] residual and out must both be numpy arrays or both CuPy arrays")
    if not is_gpu_array(residual):
        if (
            not isinstance(out, np.ndarray)
            or out.ndim != 1
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(f"[{op}] out must be a writable 1-D C-contiguous array")
        _check_out(op, out.dtype, out.shape[0], int(np.size(residual)), limit)
        message = _core.threshold_encode(residual, t, limit)
        out[: message.size] = message
        return
    ptr, n, dtype = _device_vector(op, "residual", residual, writable=True)
    optr, length, odtype = _device_vector(op, "out", out, writable=True)
    _check_out(op, odtype, length, n, limit)
    _require_cuda_build(op)
    cuda.launch(_core.cuda_threshold_encode, ptr, n, dtype, t, limit, optr)


def _check_out(op: str, dtype: np.dtype, length: int, n: int, limit: int) -> None:
    """Raises unless an output buffer of ``length`` words of ``dtype`` holds any sparse message of ``n``
    elements with at most ``limit`` entries."""
    if dtype != np.int32:
        raise ValueError(f"[{op}] out must have dtype int32, got {dtype}")
    capacity = _sparse_capacity(n, limit)
    if length < capacity:
        raise ValueError(f"[{op}] out must hold at least {capacity} words, got {length}")


def _sparse_capacity(n: int, limit: int) -> int:
    """Words of the longest sparse message of ``n`` elements with at most ``limit`` entries (< 0: any)."""
    return HEADER_WORDS + (n if limit < 0 else min(n, limit))


def bitmap_encode(residual: Array, threshold: float) -> tuple[Array, int]:
    """Bitmap encoding (2 bits per element); the residual is modified in place.

    ``|r| >= t`` sends ``+-t``; otherwise ``r <= -t/2`` sends ``-t/2`` (DL4J's half code; there is no
    ``+t/2`` code, so positive values below ``t`` stay in the residual).

    Args:
        residual: 1-D C-contiguous float32/float64 numpy (or CuPy) array, modified in place.
        threshold: positive threshold.

    Returns:
        ``(message, number of elements encoded)``; the message has ``N // 16 + 5`` words.
    """
    op = "bitmap_encode"
    t = _check_threshold(op, threshold)
    if not is_gpu_array(residual):
        message, count = _core.bitmap_encode(residual, t)
        return message, int(count)
    ptr, n, dtype = _device_vector(op, "residual", residual, writable=True)
    _require_cuda_build(op)
    out = _cupy().empty(_bitmap_words(n), dtype=np.int32)
    count = cuda.launch(_core.cuda_bitmap_encode, ptr, n, dtype, t, out.data.ptr)
    return out, int(count)


def _decode(message: Array, target: Array, flag: int, op: str) -> None:
    if is_gpu_array(target) != is_gpu_array(message):
        raise TypeError(f"[{op}] message and target must both be numpy arrays or both CuPy arrays")
    if not is_gpu_array(target):
        _core.decode(message, target, flag)
        return
    mptr, length = _device_message(op, message)
    tptr, n, dtype = _device_vector(op, "target", target, writable=True)
    cuda.launch(_core.cuda_decode, mptr, length, tptr, n, dtype, flag)


def threshold_decode(message: Array, target: Array) -> None:
    """``target[i] += +-threshold`` for each entry of a sparse message (accumulates).

    Args:
        message: int32 sparse message (flag 0).
        target: 1-D float32/float64 array of the encoded length; untouched if the message is malformed.
    """
    _decode(message, target, FLAG_SPARSE, "threshold_decode")


def bitmap_decode(message: Array, target: Array) -> None:
    """Adds a bitmap message (flag 1) into ``target`` (accumulates).

    Args:
        message: int32 bitmap message.
        target: 1-D float32/float64 array of the encoded length; untouched if the message is malformed.
    """
    _decode(message, target, FLAG_BITMAP, "bitmap_decode")


def decode(message: Array, target: Array) -> None:
    """Adds a message of either format into ``target``, dispatching on its flag (word 3).

    The header, length, flag, threshold and every index are validated first: a malformed message raises
    ``ValueError`` and leaves ``target`` untouched.

    Args:
        message: int32 message.
        target: 1-D float32/float64 array of the encoded length.
    """
    _decode(message, target, _FLAG_ANY, "decode")


def subtract_message(message: Array, target: Array) -> None:
    """``target -= `` a sparse message decoded, touching only the message's indices: O(entries) where
    decoding into a zeroed vector and subtracting it costs two passes over ``target``, with results
    bit-identical to those two passes (an index the message repeats moves by its entries summed from zero
    in message order, as :func:`decode` accumulates them). How a gradient-sharing replica applies a sparse
    message to its parameters (:func:`~sparkgrad.compress.apply_message`).

    The message is validated first (a bitmap, or any malformed message, raises ``ValueError`` and leaves
    ``target`` untouched; apply a bitmap with :func:`decode_message_into` and a subtraction).

    Args:
        message: 1-D int32 sparse message (flag 0), a numpy array, or for a CuPy ``target`` a numpy or
            CuPy array (a host message is copied to the target's GPU).
        target: 1-D C-contiguous writable float32/float64 numpy or CuPy array of the encoded length.
    """
    op = "subtract_message"
    if not is_gpu_array(target):
        if is_gpu_array(message):
            raise TypeError(f"[{op}] a CuPy message needs a CuPy target")
        _core.subtract_sparse(message, target)
        return
    tptr, n, dtype = _device_vector(op, "target", target, writable=True)
    _require_cuda_build(op)
    cupy = _cupy()
    with cupy.cuda.Device(_array_gpu(target)):
        if isinstance(message, np.ndarray):
            if message.dtype != np.int32 or message.ndim != 1:
                raise ValueError(f"[{op}] message must be a 1-D int32 array")
            message = cupy.asarray(message)
        mptr, length = _device_message(op, message)
        cuda.launch(_core.cuda_subtract_sparse, mptr, length, tptr, n, dtype)


def decode_host_message(message: np.ndarray, target: Array) -> None:
    """Adds a host message (as it came off the network) into ``target`` in host or GPU memory.

    For a GPU target the message is copied to the target's GPU and decoded there, so a GPU worker
    applies received messages without moving its parameters; validation (malformed messages raise
    ``ValueError`` and leave ``target`` untouched) is :func:`decode`'s.

    Args:
        message: 1-D int32 numpy message.
        target: 1-D float32/float64 numpy or CuPy array of the encoded length.
    """
    if not isinstance(message, np.ndarray):
        raise TypeError(f"[decode] message must be a host numpy array, got {type(message).__name__}")
    if not is_gpu_array(target):
        decode(message, target)
        return
    cupy = _cupy()
    with cupy.cuda.Device(_array_gpu(target)):
        decode(cupy.asarray(message), target)


def decode_message_into(message: np.ndarray, scratch: Array) -> None:
    """Overwrites ``scratch`` with a host message decoded (zeros where it sends nothing), on ``scratch``'s
    device.

    Args:
        message: 1-D int32 numpy message.
        scratch: 1-D float32/float64 numpy or CuPy array of the encoded length.
    """
    on_device = is_gpu_array(scratch)
    # CuPy kernels expect their array's GPU to be the current one
    with _cupy().cuda.Device(_array_gpu(scratch)) if on_device else contextlib.nullcontext():
        scratch.fill(0)
    decode_host_message(message, scratch)


def _header(op: str, message: Array) -> np.ndarray:
    if is_gpu_array(message):
        _device_message(op, message)
        message = _cupy().asnumpy(message[:HEADER_WORDS])
    if not isinstance(message, np.ndarray) or message.dtype != np.int32 or message.ndim != 1:
        raise ValueError(f"[{op}] message must be a 1-D int32 array")
    if message.shape[0] < HEADER_WORDS:
        raise ValueError(
            f"[{op}] message must hold at least {HEADER_WORDS} header words, got {message.shape[0]}"
        )
    return message[:HEADER_WORDS]


def message_threshold(message: Array) -> float:
    """The threshold stored in word 2 of a message.

    Args:
        message: int32 message.

    Returns:
        The float32 threshold as a Python float.
    """
    return float(_header("message_threshold", message)[2:3].view(np.float32)[0])


def message_length(message: Array) -> int:
    """The dense length ``N`` stored in word 1 of a message.

    Args:
        message: int32 message.

    Returns:
        Length of the vector the message decodes into.
    """
    return int(_header("message_length", message)[1])


def message_indices(message: np.ndarray) -> np.ndarray | None:
    """The indices a sparse host message changes (``abs(entry) - 1`` for each entry, in its order), or None
    for a bitmap, which may change any. For a message :func:`decode` accepts.

    Args:
        message: 1-D int32 numpy message.

    Returns:
        An int32 array of indices (repeats kept), or None.
    """
    header = _header("message_indices", message)
    if header[3] == 1:
        return None
    return np.abs(message[HEADER_WORDS : HEADER_WORDS + int(header[0])]) - 1


__all__ = [
    "FLAG_BITMAP",
    "FLAG_SPARSE",
    "HEADER_WORDS",
    "bitmap_decode",
    "bitmap_encode",
    "decode",
    "decode_host_message",
    "decode_message_into",
    "message_indices",
    "message_length",
    "message_threshold",
    "subtract_message",
    "threshold_decode",
    "threshold_encode",
    "threshold_encode_into",
]
