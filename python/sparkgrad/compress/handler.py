"""The encoding handler: the per-thread residual and threshold state that turns updates into messages."""

from __future__ import annotations

from typing import Any, Union

import numpy as np

from sparkgrad import cuda
from sparkgrad._config import check_int, check_range
from sparkgrad._native import _core
from sparkgrad.compress.codec import Array, _array_gpu, _cupy, _device_vector
from sparkgrad.compress.thresholds import (
    AdaptiveThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualClippingPostProcessor,
    ResidualPostProcessor,
    ThresholdAlgorithm,
)
from sparkgrad.device import is_gpu_array


def _device_name(gpu: int | None) -> str:
    return "cpu" if gpu is None else f"cuda:{gpu}"


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
            (:func:`~sparkgrad.compress.sharing.update_scale`,
            :data:`~sparkgrad.compress.sharing.UPDATE_COMBINATIONS`).
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
        # A host residual's per-block magnitude bounds (_core.residual_bounds) while they hold: a step that
        # adds at a support refreshes only its blocks, and the count reads only the blocks that reach the
        # threshold, so a row-sparse step costs what it touched and sent, not a pass over the residual.
        # Made by the first support step, dropped by a dense add until the next support step recomputes
        # them (one pass). A GPU residual keeps the dense count: a pass costs microseconds there.
        self._bounds: np.ndarray | None = None
        self._bounds_hold = False
        self._gpu: int | None = None  # the residual's GPU once a device update bound it there
        self._bound = False
        self._last_threshold: float | None = None
        self._last_sparsity: float | None = None
        self._last_was_dense: bool | None = None

    def encode(
        self, update: Array, iteration: int, epoch: int, *, support: Array | None = None
    ) -> np.ndarray | None:
        """Adds ``update`` to the residual and encodes it.

        Args:
            update: 1-D array of ``num_params`` elements of the handler's dtype: numpy, or a CuPy array
                on the GPU the residual lives on (the first update decides; see the class docstring).
            iteration: global iteration count (drives the post-processor).
            epoch: epoch count.
            support: indices (an integer array on ``update``'s device) outside which ``update`` is
                exactly zero, e.g. a row-sparse step's (``network.update_support()``): only those
                elements are added to the residual, with the same result as adding the whole vector (a
                residual never holds -0.0, the one value ``+ 0.0`` changes). None: the whole vector.

        Returns:
            The int32 message as a host numpy array (sparse or bitmap, whichever is smaller), or None
            when no element reaches the threshold.
        """
        on_device = self._check_update(update)
        iteration = check_int("iteration", iteration, minimum=0)
        epoch = check_int("epoch", epoch, minimum=0)
        if support is not None:
            support = self._check_support(support, on_device)
        if not on_device:
            return self._step(update, iteration, epoch, support)
        with _cupy().cuda.Device(self._gpu):  # the native kernels launch on the current device
            return self._step(update, iteration, epoch, support)

    def _check_support(self, support: Any, on_device: bool) -> Any:
        """``support`` as an integer array of the update's device whose values index the residual."""
        xp = _cupy() if on_device else np
        if is_gpu_array(support) != on_device or not hasattr(support, "dtype"):
            raise ValueError(
                f"support: expected an integer array on the update's device, got {type(support).__name__}"
            )
        if support.ndim != 1 or support.dtype.kind not in "iu":
            raise ValueError(
                f"support: expected a 1-D integer array, got {support.dtype} of shape {support.shape}"
            )
        low, high = (int(xp.min(support)), int(xp.max(support))) if support.size else (0, 0)
        if low < 0 or high >= self._n:
            raise ValueError(f"support: indices must be in [0, {self._n}), got [{low}, {high}]")
        return support

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

    def _step(self, update: Array, iteration: int, epoch: int, support: Array | None) -> np.ndarray | None:
        """One encoding step on the residual's device (the current device for a GPU residual)."""
        on_device = self._gpu is not None
        if on_device:
            rptr, n, dtype = _device_vector("encode", "residual", self._residual, writable=True)
        if not on_device:  # residual += scale * update, at the support only when given
            at = None if support is None else np.ascontiguousarray(support, dtype=np.int64)
            _core.accumulate(self._residual, np.ascontiguousarray(update), self._scale, at=at)
            if at is None:
                self._bounds_hold = False
            else:
                self._refresh_bounds(at)
        elif support is not None:  # the same sum, at the support only
            part = update[support]
            if self._scale != 1.0:
                part = part * part.dtype.type(self._scale)
            self._residual[support] += part  # type: ignore[index]
        else:
            if self._scale != 1.0:
                update = update * update.dtype.type(self._scale)
            uptr, _, _ = _device_vector("encode", "update", update, writable=False)
            cuda.launch(_core.cuda_accumulate, rptr, uptr, n, dtype)
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
            bounds = self._bounds if self._bounds_hold else None
            message, dense = _core.encode_smaller(self._residual, float(threshold), bounds)
        self._last_threshold = float(threshold)
        self._last_was_dense = bool(dense)
        if not dense and message[0] == 0:
            self._last_sparsity = 0.0
            return None
        if dense:
            self._last_sparsity = None
        else:  # a row-sparse step's message may be measured against fewer than N (reference_length)
            written = None if support is None else int(support.size)
            reference = self._algorithm.reference_length(self._n, written)
            self._last_sparsity = message.shape[0] / reference
        if self._bounds_hold and type(self._post) is ResidualClippingPostProcessor:
            # clipping only shrinks magnitudes: it reads the blocks reaching its limit, the bounds hold
            self._post.process_residual(
                iteration, epoch, self._last_threshold, self._residual, bounds=self._bounds
            )
            return message
        self._post.process_residual(iteration, epoch, self._last_threshold, self._residual)
        # what another post-processor does is unknown
        if type(self._post) is not NoOpResidualPostProcessor:
            self._bounds_hold = False
        return message

    def _refresh_bounds(self, support: np.ndarray) -> None:
        """The host residual's bounds after an add at ``support``: refreshed there while they hold,
        else computed over the whole residual."""
        if self._bounds is None:
            self._bounds = np.empty(_core.bounds_length(self._n), dtype=self._dtype)
        _core.residual_bounds(self._residual, self._bounds, support if self._bounds_hold else None)
        self._bounds_hold = True

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
        """Last sparse message length (header included) / the algorithm's ``reference_length`` (N, or
        fewer for a row-sparse step with ``written_cap``); 0.0 after an empty step; None if dense."""
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


__all__ = ["EncodingHandler"]
