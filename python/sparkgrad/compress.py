"""Strom (2015) threshold encoding of gradient updates, in Deeplearning4j's int32 message format.

A message is ``[n, N, bits, flag, payload...]``: ``N`` the dense length, ``bits`` the threshold's
float32 bit pattern, ``flag`` 0 for the sparse format (``n`` entries ``+(i+1)`` / ``-(i+1)`` in ascending
index order) and 1 for the bitmap format (word 0 holds ``N``; ``N // 16 + 1`` words of 2 bits per element,
with DL4J's asymmetric ``-t/2`` half code and no ``+t/2`` code).

The codecs work on numpy arrays on the CPU and on CuPy arrays with the CUDA kernels (when sparkgrad is
built with CUDA). The threshold algorithms and residual post-processors are configuration dataclasses
(JSON/YAML round trip, equality on hyper-parameters only); their scalar rules live here, once, while
every vector pass (accumulate, count, encode, clip) is native.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from sparkgrad import cuda
from sparkgrad._config import MAX_SCALE, Config, check_int, check_range
from sparkgrad._native import _core
from sparkgrad.device import is_gpu_array

HEADER_WORDS = 4
FLAG_SPARSE = 0
FLAG_BITMAP = 1
_FLAG_ANY = -1
DEFAULT_DECAY_RATE = 0.5 ** (1 / 20)
# Configured thresholds lie in [MIN_THRESHOLD, MAX_THRESHOLD]: the message header stores the threshold as
# float32, and below the smallest normal float32 it would round to a subnormal or to 0 (which every
# decoder rejects); above MAX_SCALE one encoded step alone would wreck a float32 network.
MIN_THRESHOLD = float(np.finfo(np.float32).tiny)
"""The smallest threshold a threshold algorithm may use: the smallest normal float32."""
MAX_THRESHOLD = MAX_SCALE
"""The largest threshold a threshold algorithm may use."""
# Sparse messages longer than N/16 + 4 words are sent as bitmaps, so sparsity ratios stay below 1.
MAX_SPARSITY = 1.0

Array = Any  # numpy.ndarray or cupy.ndarray

# ---------------------------------------------------------------------------------------------
# Device dispatch
# ---------------------------------------------------------------------------------------------


def _without_codec(arr: Any) -> bool:
    """Whether ``arr`` is an array of a device the codecs have no kernels for: neither NumPy nor a CUDA
    array (another backend behind :class:`~sparkgrad.device.Device`, such as the tests' emulated device).
    Its data crosses to the host explicitly, through its device's ``to_host`` / ``from_host``."""
    return not isinstance(arr, np.ndarray) and not is_gpu_array(arr)


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


def _device_name(gpu: int | None) -> str:
    return "cpu" if gpu is None else f"cuda:{gpu}"


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


def apply_message(message: np.ndarray, network: Any, scratch: Array) -> None:
    """Applies a host message (from a peer or off the network) to a replica: ``scratch`` receives the
    decoded message on its device (:func:`decode_message_into`), then ``network.apply_update(scratch)``.
    The step every gradient-sharing replica takes for each message; ``scratch`` keeps the decoded message
    afterwards.

    Args:
        message: 1-D int32 numpy message.
        network: anything with ``apply_update`` taking an array of ``scratch``'s device.
        scratch: 1-D float32/float64 numpy or CuPy array of the network's parameter length (or an array
            of ``network.device`` that the codecs have no kernels for: decoded on the host, uploaded).
    """
    _decode_on_device(message, network, scratch)
    network.apply_update(scratch)


def _decode_on_device(message: np.ndarray, network: Any, scratch: Array) -> None:
    """:func:`decode_message_into` for the scratch of ``network``'s device: decoded on the host and
    uploaded (``device.from_host``) for a device the codecs have no kernels for."""
    if not _without_codec(scratch):
        decode_message_into(message, scratch)
        return
    device = network.device
    host = np.zeros(scratch.shape, scratch.dtype)
    decode_host_message(message, host)
    with device.scope():
        device.xp.copyto(scratch, device.from_host(host))


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


def pack_message(message: np.ndarray) -> bytes | None:
    """The packed wire form of a sparse host message, as an ``UPDATE`` frame carries it, or None when the
    message does not pack (a bitmap, entries not strictly ascending) or packing would not make it smaller.

    The form: the 4 header words (little-endian int32), one sign bit per entry (bit ``k % 8`` of byte
    ``k // 8``, set for a negative entry), then per entry the gap to the previous index minus one (for the
    first, its index) as an unsigned LEB128 varint. A gap at the densities of gradient sharing takes one
    or two bytes against an int32 entry's four. The encoders of this module write ascending entries.

    Args:
        message: 1-D int32 numpy message.

    Returns:
        The packed bytes, or None (send the message as it is).
    """
    return _core.pack_message(message)


def unpack_message(packed: bytes | memoryview) -> np.ndarray:
    """The int32 sparse message of a packed one (:func:`pack_message`), every byte checked.

    Args:
        packed: the packed bytes (from the network: any content).

    Returns:
        A new int32 message; :func:`decode` still validates it against its target.

    Raises:
        ValueError: naming what is wrong (header, sign bits, a varint over 5 bytes or overlong, an index
            at or beyond the length in word 1, bytes missing or left over).
    """
    return _core.unpack_message(packed)


# ---------------------------------------------------------------------------------------------
# Threshold algorithms
# ---------------------------------------------------------------------------------------------


def _check_config_threshold(field: str, value: Any) -> float:
    """A configured threshold: finite, in [MIN_THRESHOLD, MAX_THRESHOLD]."""
    return check_range(field, value, MIN_THRESHOLD, MAX_THRESHOLD)


def _check_state(field: str, value: Any, high: float) -> float:
    """State fields: NaN (unset) or a finite number in [0, high]."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(value):
        return math.nan
    return check_range(field, value, 0.0, high)


class ThresholdAlgorithm(Config, abc.ABC):
    """Chooses each step's encoding threshold (DL4J ``ThresholdAlgorithm``)."""

    @abc.abstractmethod
    def calculate_threshold(
        self,
        iteration: int,
        epoch: int,
        last_threshold: float | None,
        last_was_dense: bool | None,
        last_sparsity_ratio: float | None,
        updates: Array,
    ) -> float:
        """Threshold for this step.

        Args:
            iteration: global iteration count.
            epoch: epoch count.
            last_threshold: previous step's threshold (None on a handler's first step).
            last_was_dense: whether the previous message was a bitmap (None on the first step).
            last_sparsity_ratio: previous sparse message length (header included) / N; None when the
                previous step was dense or is unknown.
            updates: the residual with this step's update already added (read only), on the
                handler's device: a CuPy array for a GPU handler, so a statistic over it is computed
                with the array's own module (a device reduction, one scalar to the host).

        Returns:
            The threshold (> 0).
        """

    @abc.abstractmethod
    def new_reducer(self) -> ThresholdAlgorithmReducer:
        """A reducer that combines the states of several instances (one per worker thread)."""

    def clone(self) -> ThresholdAlgorithm:
        """An independent copy with the same hyper-parameters and state."""
        return dataclasses.replace(self)  # type: ignore[type-var]

    def to_finite_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the fields holding NaN (state not set yet, which ``from_dict`` gives
        back as its NaN default): the form JSON carries, which has no NaN (control payloads,
        checkpoints)."""
        return {k: v for k, v in self.to_dict().items() if not (isinstance(v, float) and math.isnan(v))}


class ThresholdAlgorithmReducer(abc.ABC):
    """Combines threshold-algorithm states: ``add`` instances, ``merge`` reducers, ``final_result``."""

    @abc.abstractmethod
    def add(self, algorithm: ThresholdAlgorithm | None) -> None:
        """Adds one instance's state (None is ignored)."""

    @abc.abstractmethod
    def merge(self, other: ThresholdAlgorithmReducer) -> None:
        """Adds everything another reducer of the same kind has seen."""

    @abc.abstractmethod
    def final_result(self) -> ThresholdAlgorithm:
        """A fresh instance carrying the combined state."""


@dataclasses.dataclass
class FixedThresholdAlgorithm(ThresholdAlgorithm):
    """Always the same threshold.

    Args:
        threshold: the threshold, in [MIN_THRESHOLD, MAX_THRESHOLD] (about [1.2e-38, 1e6]).
    """

    threshold: float

    def __post_init__(self) -> None:
        self.threshold = _check_config_threshold("threshold", self.threshold)

    def calculate_threshold(
        self,
        iteration: int,
        epoch: int,
        last_threshold: float | None,
        last_was_dense: bool | None,
        last_sparsity_ratio: float | None,
        updates: Array,
    ) -> float:
        return self.threshold

    def new_reducer(self) -> ThresholdAlgorithmReducer:
        return _FixedReducer()


class _FixedReducer(ThresholdAlgorithmReducer):
    """Keeps the last added instance (a merge keeps the first non-None one), as DL4J does."""

    def __init__(self) -> None:
        self.instance: ThresholdAlgorithm | None = None

    def add(self, algorithm: ThresholdAlgorithm | None) -> None:
        if algorithm is not None:
            self.instance = algorithm

    def merge(self, other: ThresholdAlgorithmReducer) -> None:
        if not isinstance(other, _FixedReducer):
            raise TypeError(f"cannot merge {type(other).__name__} into a FixedThresholdAlgorithm reducer")
        if self.instance is None:
            self.instance = other.instance

    def final_result(self) -> ThresholdAlgorithm:
        if self.instance is None:
            raise ValueError("FixedThresholdAlgorithm reducer: no instance was added")
        return self.instance.clone()


@dataclasses.dataclass
class _AdaptiveBase(ThresholdAlgorithm):
    """Shared state and first-step logic of the adaptive algorithms; state is excluded from equality."""

    if TYPE_CHECKING:  # every subclass declares these fields, in its own order
        initial_threshold: float
        last_threshold: float
        last_sparsity: float

    def _previous(
        self,
        last_threshold: float | None,
        last_was_dense: bool | None,
        last_sparsity_ratio: float | None,
    ) -> tuple[float, float] | None:
        """(threshold to adapt from, previous sparsity), or None on the very first step (state seeded)."""
        stored: float = self.last_threshold
        if last_threshold is None and math.isnan(stored):
            self.last_threshold = self.initial_threshold
            return None
        start = stored if last_threshold is None else float(last_threshold)
        if last_sparsity_ratio is not None:
            prev = float(last_sparsity_ratio)
        elif last_was_dense:
            prev = 1.0 / 16.0
        elif not math.isnan(self.last_sparsity):
            prev = self.last_sparsity
        else:
            raise ValueError(
                f"{type(self).__name__}: no previous sparsity (last_sparsity_ratio is None, "
                "last_was_dense is not True and no stored last_sparsity)"
            )
        self.last_sparsity = prev
        return start, prev


@dataclasses.dataclass
class AdaptiveThresholdAlgorithm(_AdaptiveBase):
    """Keeps the sparsity of the messages between two targets by decaying/growing the threshold.

    Args:
        initial_threshold: first threshold, in [MIN_THRESHOLD, MAX_THRESHOLD].
        min_target_sparsity: below it the threshold shrinks by ``decay_rate``; in (0, 1].
        max_target_sparsity: above it the threshold grows by ``1 / decay_rate``; in [min, 1].
        decay_rate: in [0.5, 1); the default halves/doubles the threshold in 20 steps.
        last_threshold: state, nan until set, else in [0, MAX_THRESHOLD]; not part of equality.
        last_sparsity: state, nan until set, else in [0, MAX_SPARSITY]; not part of equality.
    """

    initial_threshold: float = 1e-4
    min_target_sparsity: float = 1e-4
    max_target_sparsity: float = 1e-2
    decay_rate: float = DEFAULT_DECAY_RATE
    last_threshold: float = dataclasses.field(default=math.nan, compare=False)
    last_sparsity: float = dataclasses.field(default=math.nan, compare=False)

    def __post_init__(self) -> None:
        self.initial_threshold = _check_config_threshold("initial_threshold", self.initial_threshold)
        self.min_target_sparsity = check_range(
            "min_target_sparsity", self.min_target_sparsity, 0.0, MAX_SPARSITY, low_inclusive=False
        )
        self.max_target_sparsity = check_range(
            "max_target_sparsity", self.max_target_sparsity, 0.0, MAX_SPARSITY, low_inclusive=False
        )
        if self.min_target_sparsity > self.max_target_sparsity:
            raise ValueError(
                f"min_target_sparsity: must be <= max_target_sparsity ({self.max_target_sparsity}), "
                f"got {self.min_target_sparsity}"
            )
        self.decay_rate = check_range("decay_rate", self.decay_rate, 0.5, 1.0, high_inclusive=False)
        self.last_threshold = _check_state("last_threshold", self.last_threshold, MAX_THRESHOLD)
        self.last_sparsity = _check_state("last_sparsity", self.last_sparsity, MAX_SPARSITY)

    def calculate_threshold(
        self,
        iteration: int,
        epoch: int,
        last_threshold: float | None,
        last_was_dense: bool | None,
        last_sparsity_ratio: float | None,
        updates: Array,
    ) -> float:
        previous = self._previous(last_threshold, last_was_dense, last_sparsity_ratio)
        if previous is None:
            return self.initial_threshold
        start, prev = previous
        if self.min_target_sparsity <= prev <= self.max_target_sparsity:
            return start  # DL4J leaves the stored threshold as it was
        self.last_threshold = (
            start * self.decay_rate if prev < self.min_target_sparsity else start / self.decay_rate
        )
        return self.last_threshold

    def new_reducer(self) -> ThresholdAlgorithmReducer:
        return _AveragingReducer(self, skip_nan_sparsity=True)


# With ``start_at_target``, a message denser than this multiple of the target makes the threshold rise twice
# as fast: the residual of the first steps grows past a threshold taken from one update, and rising 3.5% a
# step kept bitmap-sized messages for an epoch (measured in docs/guides/performance.md, "Gradient sharing").
CATCH_UP_SPARSITY = 4.0
"""With ``start_at_target``: above this multiple of the target sparsity the threshold rises twice as fast."""


@dataclasses.dataclass
class TargetSparsityThresholdAlgorithm(_AdaptiveBase):
    """Moves the threshold every step toward one sparsity target.

    Args:
        initial_threshold: first threshold, in [MIN_THRESHOLD, MAX_THRESHOLD]; with ``start_at_target``
            the first threshold's upper bound.
        sparsity_target: in (0, 1/16).
        decay_rate: in [0.5, 1).
        start_at_target: the first threshold is the one that sends ``sparsity_target`` of the first
            residual (its ``ceil(sparsity_target * n)``-th largest magnitude), at most ``initial_threshold``
            and at least MIN_THRESHOLD, so the first messages already carry the update instead of waiting
            tens of steps for the threshold to come down from a guess; and while a message carries more
            than ``CATCH_UP_SPARSITY`` x the target (the residual outgrows a threshold taken from one
            update) the threshold rises at ``1 / decay_rate**2`` a step instead of ``1 / decay_rate``.
            False starts at ``initial_threshold`` and always moves by ``decay_rate``, as DL4J does.
        last_threshold: state, nan until set, else in [0, MAX_THRESHOLD]; not part of equality.
        last_sparsity: state, nan until set, else in [0, MAX_SPARSITY]; not part of equality.
    """

    initial_threshold: float = 1e-4
    sparsity_target: float = 1e-3
    decay_rate: float = DEFAULT_DECAY_RATE
    start_at_target: bool = False
    last_threshold: float = dataclasses.field(default=math.nan, compare=False)
    last_sparsity: float = dataclasses.field(default=math.nan, compare=False)

    def __post_init__(self) -> None:
        self.initial_threshold = _check_config_threshold("initial_threshold", self.initial_threshold)
        self.sparsity_target = check_range(
            "sparsity_target",
            self.sparsity_target,
            0.0,
            1.0 / 16.0,
            low_inclusive=False,
            high_inclusive=False,
        )
        self.decay_rate = check_range("decay_rate", self.decay_rate, 0.5, 1.0, high_inclusive=False)
        if not isinstance(self.start_at_target, bool):
            raise ValueError(f"start_at_target: expected a bool, got {self.start_at_target!r}")
        self.last_threshold = _check_state("last_threshold", self.last_threshold, MAX_THRESHOLD)
        self.last_sparsity = _check_state("last_sparsity", self.last_sparsity, MAX_SPARSITY)

    def calculate_threshold(
        self,
        iteration: int,
        epoch: int,
        last_threshold: float | None,
        last_was_dense: bool | None,
        last_sparsity_ratio: float | None,
        updates: Array,
    ) -> float:
        previous = self._previous(last_threshold, last_was_dense, last_sparsity_ratio)
        if previous is None:
            if self.start_at_target:
                self.last_threshold = self._threshold_at_target(updates)
            return self.last_threshold
        start, prev = previous
        if prev < self.sparsity_target:
            start *= self.decay_rate
        elif prev > self.sparsity_target:
            catching_up = self.start_at_target and prev > CATCH_UP_SPARSITY * self.sparsity_target
            start /= self.decay_rate**2 if catching_up else self.decay_rate
        self.last_threshold = start
        return start

    def new_reducer(self) -> ThresholdAlgorithmReducer:
        return _AveragingReducer(self, skip_nan_sparsity=False)

    def _threshold_at_target(self, residual: Array) -> float:
        """The magnitude that ``sparsity_target`` of ``residual`` reaches, within [MIN_THRESHOLD,
        initial_threshold] (initial_threshold when nothing is finite and positive there)."""
        xp = _cupy() if is_gpu_array(residual) else np
        magnitudes = xp.abs(residual.ravel())
        k = min(magnitudes.size, max(1, math.ceil(self.sparsity_target * magnitudes.size)))
        kth = float(xp.partition(magnitudes, magnitudes.size - k)[magnitudes.size - k])
        if not (math.isfinite(kth) and kth > 0):
            return self.initial_threshold
        return min(max(kth, MIN_THRESHOLD), self.initial_threshold)


class _AveragingReducer(ThresholdAlgorithmReducer):
    """Averages last_threshold / last_sparsity over the added instances (DL4J's reducers).

    The adaptive reducer skips NaN sparsities in the sum but still counts the instance; the
    target-sparsity reducer always adds the sparsity. Both are DL4J's behaviour.
    """

    def __init__(self, template: _AdaptiveBase, skip_nan_sparsity: bool) -> None:
        self.template = template
        self.skip_nan_sparsity = skip_nan_sparsity
        self.sum_threshold = 0.0
        self.sum_sparsity = 0.0
        self.count = 0

    def add(self, algorithm: ThresholdAlgorithm | None) -> None:
        if algorithm is None:
            return
        if type(algorithm) is not type(self.template):
            raise TypeError(
                f"cannot add a {type(algorithm).__name__} to a {type(self.template).__name__} reducer"
            )
        if math.isnan(algorithm.last_threshold):
            return
        self.sum_threshold += algorithm.last_threshold
        sparsity: float = algorithm.last_sparsity
        if not (self.skip_nan_sparsity and math.isnan(sparsity)):
            self.sum_sparsity += sparsity
        self.count += 1

    def merge(self, other: ThresholdAlgorithmReducer) -> None:
        if not isinstance(other, _AveragingReducer) or type(other.template) is not type(self.template):
            raise TypeError(
                f"cannot merge {type(other).__name__} into a {type(self.template).__name__} reducer"
            )
        self.sum_threshold += other.sum_threshold
        self.sum_sparsity += other.sum_sparsity
        self.count += other.count

    def final_result(self) -> ThresholdAlgorithm:
        result = dataclasses.replace(self.template, last_threshold=math.nan, last_sparsity=math.nan)
        if self.count > 0:
            result.last_threshold = self.sum_threshold / self.count
            result.last_sparsity = self.sum_sparsity / self.count
        return result


# ---------------------------------------------------------------------------------------------
# Residual post-processors
# ---------------------------------------------------------------------------------------------


class ResidualPostProcessor(Config, abc.ABC):
    """Modifies the residual in place after each encoding step (DL4J ``ResidualPostProcessor``)."""

    @abc.abstractmethod
    def process_residual(self, iteration: int, epoch: int, last_threshold: float, residual: Array) -> None:
        """Post-processes ``residual`` in place.

        Args:
            iteration: global iteration count.
            epoch: epoch count.
            last_threshold: threshold used in this step.
            residual: 1-D float32/float64 numpy or CuPy array.
        """

    def clone(self) -> ResidualPostProcessor:
        """An independent copy."""
        return dataclasses.replace(self)  # type: ignore[type-var]


@dataclasses.dataclass
class ResidualClippingPostProcessor(ResidualPostProcessor):
    """Every ``frequency`` iterations (never at 0), clips the residual to ``+-threshold * multiple``.

    Args:
        threshold_multiple_clip_value: clip multiple of the current threshold, in [1, MAX_SCALE] (the
            clip limit, threshold times multiple, then stays far inside float32 range).
        frequency: clip on iterations that are positive multiples of it (>= 1).
    """

    threshold_multiple_clip_value: float = 5.0
    frequency: int = 5

    def __post_init__(self) -> None:
        self.threshold_multiple_clip_value = check_range(
            "threshold_multiple_clip_value", self.threshold_multiple_clip_value, 1.0, MAX_SCALE
        )
        self.frequency = check_int("frequency", self.frequency, minimum=1)

    def process_residual(self, iteration: int, epoch: int, last_threshold: float, residual: Array) -> None:
        if iteration <= 0 or iteration % self.frequency != 0:
            return
        limit = float(last_threshold) * self.threshold_multiple_clip_value
        if not is_gpu_array(residual):
            _core.clip(residual, limit)
            return
        ptr, n, dtype = _device_vector("clip", "residual", residual, writable=True)
        cuda.launch(_core.cuda_clip, ptr, n, dtype, limit)


@dataclasses.dataclass
class NoOpResidualPostProcessor(ResidualPostProcessor):
    """Leaves the residual alone."""

    def process_residual(self, iteration: int, epoch: int, last_threshold: float, residual: Array) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# Encoding handler
# ---------------------------------------------------------------------------------------------


class EncodingHandler:
    """Per-thread residual + threshold state that turns updates into messages (DL4J ``EncodingHandler``).

    Each step adds the update to the residual, asks the threshold algorithm for a threshold, counts the
    qualifying elements and emits whichever of the sparse and bitmap messages is smaller, encoding the
    residual exactly once, so no residual mass is lost. Use one handler per thread; the native passes
    release the GIL.

    Device: the residual lives where the updates live, decided by the first :meth:`encode`. NumPy
    updates keep it in host memory; CuPy updates (anything with ``__cuda_array_interface__``) on GPU
    ``k`` move it to GPU ``k``, where every later step runs (accumulate, threshold count, format choice,
    encode, post-processing) and only the finished int32 message is copied to the host. The messages
    are byte-identical to the CPU handler's. Every later update must be on the same device.

    Args:
        num_params: length of the flat update vector (>= 1).
        threshold_algorithm: cloned; default ``AdaptiveThresholdAlgorithm()``.
        residual_post_processor: cloned; default ``ResidualClippingPostProcessor(5.0, 5)``.
        dtype: ``"float32"`` or ``"float64"`` (residual and update dtype).
        update_scale: each update is multiplied by this before it joins the residual, in (0, 1]: ``1 /
            sqrt(workers)`` by default, ``1 / workers`` for their mean, 1 for DL4J's sum
            (:func:`update_scale`, :data:`UPDATE_COMBINATIONS`).
    """

    def __init__(
        self,
        num_params: int,
        threshold_algorithm: ThresholdAlgorithm | None = None,
        residual_post_processor: ResidualPostProcessor | None = None,
        dtype: Union[str, np.dtype, type] = "float32",
        update_scale: float = 1.0,
    ) -> None:
        self._n = check_int("num_params", num_params, minimum=1, maximum=2**31 - 1)
        self._scale = check_range("update_scale", update_scale, 0.0, 1.0, low_inclusive=False)
        try:
            self._dtype = np.dtype(dtype)
        except TypeError as exc:
            raise ValueError(f"dtype: expected float32 or float64, got {dtype!r}") from exc
        if self._dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float32 or float64, got {self._dtype}")
        algorithm = AdaptiveThresholdAlgorithm() if threshold_algorithm is None else threshold_algorithm
        if not isinstance(algorithm, ThresholdAlgorithm):
            raise TypeError(
                f"threshold_algorithm: expected a ThresholdAlgorithm, got {type(algorithm).__name__}"
            )
        post = ResidualClippingPostProcessor() if residual_post_processor is None else residual_post_processor
        if not isinstance(post, ResidualPostProcessor):
            raise TypeError(
                f"residual_post_processor: expected a ResidualPostProcessor, got {type(post).__name__}"
            )
        self._algorithm = algorithm.clone()
        self._post = post.clone()
        # allocated where the first update lives: a host residual made here would be dropped, after being
        # zero-filled, when a GPU update binds (docs/guides/performance.md, "Threshold encoding" under GPU)
        self._residual: Array | None = None
        self._gpu: int | None = None  # the residual's GPU once a device update bound it there
        self._bound = False
        self._last_threshold: float | None = None
        self._last_sparsity: float | None = None
        self._last_was_dense: bool | None = None

    def encode(self, update: Array, iteration: int, epoch: int) -> np.ndarray | None:
        """Adds ``update`` to the residual and encodes it.

        Args:
            update: 1-D array of ``num_params`` elements of the handler's dtype: numpy, or a CuPy array
                on the GPU the residual lives on (the first update decides; see the class docstring).
            iteration: global iteration count (drives the post-processor).
            epoch: epoch count.

        Returns:
            The int32 message as a host numpy array (sparse or bitmap, whichever is smaller), or None
            when no element reaches the threshold.
        """
        on_device = self._check_update(update)
        iteration = check_int("iteration", iteration, minimum=0)
        epoch = check_int("epoch", epoch, minimum=0)
        if not on_device:
            return self._step(update, iteration, epoch)
        with _cupy().cuda.Device(self._gpu):  # the native kernels launch on the current device
            return self._step(update, iteration, epoch)

    def _check_update(self, update: Any) -> bool:
        """Validates ``update`` against the handler (binding the residual's device on the first call);
        returns whether it is a device array."""
        on_device = is_gpu_array(update)
        if on_device:
            _, n, dtype = _device_vector("encode", "update", update, writable=False)
            shape: tuple[int, ...] = (n,)
            gpu: int | None = _array_gpu(update)
        else:
            if not isinstance(update, np.ndarray):
                raise ValueError(
                    f"update: expected a numpy or CuPy {self._dtype} array of shape ({self._n},), got "
                    f"{type(update).__name__}"
                )
            shape, dtype, gpu = update.shape, update.dtype, None
        if dtype != self._dtype or shape != (self._n,):
            raise ValueError(
                f"update: expected a {self._dtype} array of shape ({self._n},), got {dtype} {shape}"
            )
        if not self._bound:
            if gpu is not None:
                with _cupy().cuda.Device(gpu):
                    self._residual = _cupy().zeros(self._n, dtype=self._dtype)
            else:
                self._residual = np.zeros(self._n, dtype=self._dtype)
            self._gpu, self._bound = gpu, True
        elif gpu != self._gpu:
            raise ValueError(
                f"update: the handler's residual is on {_device_name(self._gpu)}, got an update on "
                f"{_device_name(gpu)} (use one handler per device)"
            )
        return on_device

    def _step(self, update: Array, iteration: int, epoch: int) -> np.ndarray | None:
        """One encoding step on the residual's device (the current device for a GPU residual)."""
        on_device = self._gpu is not None
        if self._scale != 1.0:
            update = update * update.dtype.type(self._scale)
        if on_device:
            rptr, n, dtype = _device_vector("encode", "residual", self._residual, writable=True)
            uptr, _, _ = _device_vector("encode", "update", update, writable=False)
            cuda.launch(_core.cuda_accumulate, rptr, uptr, n, dtype)
        else:
            _core.accumulate(self._residual, np.ascontiguousarray(update))
        threshold = self._algorithm.calculate_threshold(
            iteration,
            epoch,
            self._last_threshold,
            self._last_was_dense,
            None if self._last_was_dense else self._last_sparsity,
            self._residual,
        )
        if on_device:
            message, dense = cuda.launch(_core.cuda_encode_smaller, rptr, n, dtype, float(threshold))
        else:
            message, dense = _core.encode_smaller(self._residual, float(threshold))
        self._last_threshold = float(threshold)
        self._last_was_dense = bool(dense)
        if not dense and message[0] == 0:
            self._last_sparsity = 0.0
            return None
        self._last_sparsity = None if dense else message.shape[0] / self._n
        self._post.process_residual(iteration, epoch, self._last_threshold, self._residual)
        return message

    @property
    def residual(self) -> Array:
        """The residual: a read-only view of the host residual, or a copy of a GPU residual (on its GPU);
        zeros before the first update."""
        if self._residual is None:
            view = np.zeros(self._n, dtype=self._dtype)
        elif self._gpu is not None:
            with _cupy().cuda.Device(self._gpu):
                return self._residual.copy()
        else:
            view = self._residual.view()
        view.flags.writeable = False
        return view

    @property
    def device(self) -> str | None:
        """Where the residual lives: ``"cpu"``, ``"cuda:N"``, or None before the first update."""
        return _device_name(self._gpu) if self._bound else None

    @property
    def last_threshold(self) -> float | None:
        """Threshold of the last step (None before the first)."""
        return self._last_threshold

    @property
    def last_sparsity(self) -> float | None:
        """Last sparse message length (header included) / N; 0.0 after an empty step; None if dense."""
        return self._last_sparsity

    @property
    def last_was_dense(self) -> bool | None:
        """Whether the last message was a bitmap (None before the first step)."""
        return self._last_was_dense

    @property
    def update_scale(self) -> float:
        """The factor each update is multiplied by before it joins the residual."""
        return self._scale

    @property
    def threshold_algorithm(self) -> ThresholdAlgorithm:
        """This handler's own algorithm instance (with its state), e.g. to feed a reducer."""
        return self._algorithm

    @property
    def residual_post_processor(self) -> ResidualPostProcessor:
        """This handler's own post-processor instance."""
        return self._post


# How gradient sharing combines the workers' updates, by the factor each worker's update is scaled by before
# it is encoded (bench/python/bench_convergence.py measures them against local training and DDP):
# - "auto" (default): "sum" when every trained layer's updater divides its step by a running average of
#   the squared gradients (Adam, AdaMax, Nadam, AmsGrad, RmsProp: :data:`SUMMED_UPDATERS`), else "sqrt".
#   Those updaters step about their learning rate per element whatever the gradient's size, so N workers'
#   steps summed are N steps such as local training takes; with a worker's own update applied in full
#   ("full", below) the sum needed fewer epochs than "sqrt" in every cell of the study for them (MLP,
#   CNN, LSTM; 2 to 16 workers; on Spark too). Summed, AdaGrad's first steps (its full learning rate on
#   every element) and momentum's amplified steps overshoot from 8 workers on, so they keep "sqrt"
#   (docs/guides/performance.md, "The default combination sums Adam and RmsProp").
# - "sqrt": 1 / sqrt(workers), the square-root scaling rule of an N-times larger batch (Krizhevsky 2014;
#   Malladi et al. 2022 for adaptive updaters). The workers' updates agree in their signal and not in
#   their noise, so their sum grows the step N-fold and the noise sqrt(N)-fold; this keeps the noise of one
#   worker's step.
# - "mean": 1 / workers, DDP's averaged step (exact for SGD); adaptive updaters then step less than DDP,
#   whose updater sees the averaged, less noisy gradient.
# - "sum": 1, DL4J's and Strom's.
UPDATE_COMBINATIONS = ("auto", "sqrt", "mean", "sum")
"""The ways the updates of N workers training at once combine (:func:`update_scale`)."""
DEFAULT_UPDATE_COMBINATION = "auto"
"""Each worker sends its update whole with the Adam family and RmsProp, divided by sqrt(N) otherwise."""
SUMMED_UPDATERS = ("adam", "adamax", "nadam", "amsgrad", "rmsprop")
"""The updater kinds whose updates ``"auto"`` sums: each divides its step by a running average of the
squared gradients."""


def update_combination_for(combination: str, updaters: Iterable[Any]) -> str:
    """``combination`` with ``"auto"`` resolved for a network trained by ``updaters`` (its updater
    configurations, e.g. ``network.updaters``): ``"sum"`` when every one that trains parameters is of a
    kind in :data:`SUMMED_UPDATERS`, else ``"sqrt"``."""
    if combination not in UPDATE_COMBINATIONS:
        raise ValueError(
            f"update_combination: expected one of {', '.join(UPDATE_COMBINATIONS)}, got {combination!r}"
        )
    if combination != "auto":
        return combination
    kinds = {getattr(u, "kind", None) for u in updaters} - {"noop"}  # a frozen layer takes no step
    return "sum" if kinds and kinds <= set(SUMMED_UPDATERS) else "sqrt"


def update_scale(combination: str, workers: int, updaters: Iterable[Any] = ()) -> float:
    """The :class:`EncodingHandler` ``update_scale`` of ``workers`` workers combined by ``combination``
    (one of :data:`UPDATE_COMBINATIONS`; ``"auto"`` decided by ``updaters``, see
    :func:`update_combination_for`)."""
    resolved = update_combination_for(combination, updaters)
    return {"mean": 1.0 / workers, "sum": 1.0, "sqrt": 1.0 / math.sqrt(workers)}[resolved]


# What a worker applies to its own replica of its own update (bench/python/bench_convergence.py's "+encoded"
# contenders measure DL4J's choice against the default):
# - "full" (default): the whole scaled update, at once; only the peers see it through the threshold. The
#   replica runs ahead of the controller's parameters by exactly its unsent residual, which it keeps when it
#   takes the controller's parameters (take_params). Its own steps are then never held back by its encoder,
#   so momentum builds on the steps it took: with Nesterov momentum it needed fewer epochs than "encoded"
#   and never fell after reaching the target (docs/guides/performance.md, "A worker's own update").
# - "encoded": only what its message carries, as DL4J's and Strom's workers do: every replica applies the
#   same messages, and an element of the update moves the replica by one threshold a step however large it
#   is, a delay that momentum turns into overshoot.
OWN_UPDATES = ("full", "encoded")
"""What a gradient-sharing worker applies to its own replica of its own update (:func:`share_update`)."""
DEFAULT_OWN_UPDATE = "full"
"""A worker applies its whole (scaled) update to its own replica at once."""


def check_own_update(own_update: Any) -> str:
    """``own_update`` if it is one of :data:`OWN_UPDATES`, else a ValueError naming the argument."""
    if own_update not in OWN_UPDATES:
        raise ValueError(f"own_update: expected one of {', '.join(OWN_UPDATES)}, got {own_update!r}")
    return str(own_update)


def share_update(
    handler: EncodingHandler,
    network: Any,
    update: Array,
    iteration: int,
    epoch: int,
    own_update: str,
    scratch: Array,
) -> np.ndarray | None:
    """A gradient-sharing worker's own step: encodes ``update`` with ``handler`` and applies it to the
    worker's replica as ``own_update`` says (:data:`OWN_UPDATES`). SharedTrainingMaster's workers and
    ParallelWrapper's threads both take their step here. On a device the codecs have no kernels for
    (neither the CPU nor a CUDA GPU) the update is encoded on the host, downloaded with the replica's
    ``device.to_host``, and the decoded message is uploaded with its ``from_host``.

    Args:
        handler: the worker's encoder (its ``update_scale`` scales what the replica applies too).
        network: the worker's replica (``apply_update`` on ``update``'s device).
        update: the update the replica's updater computed.
        iteration: the replica's iteration count (drives the threshold algorithm).
        epoch: the replica's epoch count.
        own_update: ``"full"`` or ``"encoded"``.
        scratch: the decode buffer on the replica's device; holds the message decoded afterwards.

    Returns:
        The message to send to the peers, or None when nothing reached the threshold.
    """
    # a device the codecs have no kernels for: the residual lives on the host, the update goes there
    # through the device's counted download
    on_host = network.device.to_host(update) if _without_codec(update) else update
    message = handler.encode(on_host, iteration, epoch)
    if own_update == "full":
        scale = handler.update_scale
        network.apply_update(update if scale == 1.0 else update * update.dtype.type(scale))
    if message is None:
        return None
    if own_update == "full":
        _decode_on_device(message, network, scratch)
    else:
        apply_message(message, network, scratch)
    return message


def take_params(network: Any, params: Array, handler: EncodingHandler, own_update: str) -> None:
    """A worker's replica takes the controller's (or the wrapped network's) parameters: with ``"full"``
    its own unsent residual, which it already applied and has not sent, stays applied."""
    network.set_params(params)
    if own_update == "full" and handler.device is not None:  # None: no update yet, the residual is zero
        network.apply_update(handler.residual)


# The default threshold algorithm of gradient sharing (SharedTrainingMaster, ParallelWrapper). Its 3e-3
# target needed as few or fewer epochs than 1e-3 in every cell of the convergence study (3 models, 5
# updaters, 2 to 16 workers, on Spark too), the packed wire paying for the denser messages
# (docs/guides/performance.md, "Packed messages and the 3e-3 default"); DL4J's default is
# AdaptiveThresholdAlgorithm() with ResidualClippingPostProcessor(5.0, 5).
DEFAULT_INITIAL_THRESHOLD = 2e-2
"""The first threshold of :func:`default_threshold_algorithm`."""
DEFAULT_SPARSITY_TARGET = 3e-3
"""The fraction of a message's elements :func:`default_threshold_algorithm` aims to send."""


def default_threshold_algorithm() -> TargetSparsityThresholdAlgorithm:
    """A fresh ``TargetSparsityThresholdAlgorithm(DEFAULT_INITIAL_THRESHOLD, DEFAULT_SPARSITY_TARGET,
    start_at_target=True)``.

    Starting at the first update's target quantile is what makes the first epoch count: from the fixed
    2e-2 start the threshold needs about 100 steps to come down to the updates, so with 8 workers a digits
    epoch (11 steps each) sent nothing; it costs bytes in the first epoch only. Measured with
    ``bench/python/bench_convergence.py`` (the numbers: the Performance guide, "Gradient sharing: how the
    workers' updates combine"); DL4J's start is ``start_at_target=False``."""
    return TargetSparsityThresholdAlgorithm(
        DEFAULT_INITIAL_THRESHOLD, DEFAULT_SPARSITY_TARGET, start_at_target=True
    )


__all__ = [
    "DEFAULT_UPDATE_COMBINATION",
    "UPDATE_COMBINATIONS",
    "SUMMED_UPDATERS",
    "update_combination_for",
    "update_scale",
    "DEFAULT_OWN_UPDATE",
    "OWN_UPDATES",
    "check_own_update",
    "share_update",
    "take_params",
    "decode_message_into",
    "DEFAULT_INITIAL_THRESHOLD",
    "DEFAULT_SPARSITY_TARGET",
    "CATCH_UP_SPARSITY",
    "default_threshold_algorithm",
    "AdaptiveThresholdAlgorithm",
    "EncodingHandler",
    "FixedThresholdAlgorithm",
    "MAX_THRESHOLD",
    "MIN_THRESHOLD",
    "NoOpResidualPostProcessor",
    "ResidualClippingPostProcessor",
    "ResidualPostProcessor",
    "TargetSparsityThresholdAlgorithm",
    "ThresholdAlgorithm",
    "ThresholdAlgorithmReducer",
    "apply_message",
    "bitmap_decode",
    "bitmap_encode",
    "decode",
    "decode_host_message",
    "message_indices",
    "message_length",
    "message_threshold",
    "pack_message",
    "threshold_decode",
    "threshold_encode",
    "threshold_encode_into",
    "unpack_message",
]
