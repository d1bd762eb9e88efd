"""Threshold algorithms, which choose each encoding step's threshold, and residual post-processors, which
modify the residual after it (DL4J's ``ThresholdAlgorithm`` and ``ResidualPostProcessor``).

Both are configuration dataclasses (JSON/YAML round trip, equality on hyper-parameters only); their
scalar rules live here, once, while every vector pass (accumulate, count, encode, clip) is native.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad import cuda
from sparkgrad._config import MAX_SCALE, Config, check_int, check_range
from sparkgrad._native import _core
from sparkgrad.compress.codec import Array, _cupy, _device_vector
from sparkgrad.device import is_gpu_array

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
            last_sparsity_ratio: previous sparse message length (header included) / the previous
                step's :meth:`reference_length` (N unless the algorithm says otherwise); None when the
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

    def max_step_growth(self) -> float:
        """The most :meth:`calculate_threshold` raises the threshold in one step, a factor >= 1: the
        controller lets a worker's threshold exceed another worker's latest by this factor per update the
        worker is ahead of it (:mod:`sparkgrad.transport.policies`), so a worker that runs ahead of a
        stalled one is not refused for climbing as its algorithm does. 1 here (the threshold never
        rises); an algorithm whose threshold rises says by how much."""
        return 1.0

    def reference_length(self, n: int, written: int | None) -> int:
        """The length a step's message is measured against (the denominator of the next step's
        ``last_sparsity_ratio``): ``n``, the vector's length, here.

        Args:
            n: the length of the encoded vector.
            written: how many elements the step's update could change (a row-sparse step's support,
                :meth:`sparkgrad.compress.EncodingHandler.encode`'s ``support``); None when any.
        """
        return n

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

    def max_step_growth(self) -> float:
        return 1.0 / self.decay_rate

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
        written_cap: a message of a row-sparse step (one whose handler was given the elements it wrote)
            aims at no more entries than the step wrote: ``min(sparsity_target * N, written)``, which
            is ``sparsity_target`` of ``min(N, written / sparsity_target)``
            (:meth:`reference_length`). Without it a large embedding table's messages grow with its rows
            (at 17M parameters, 51,000 entries a step for the ~8,600 a step writes; the residual of rows
            written long ago makes up the rest) and so does the step's cost. False measures every message
            against N, as DL4J does.
        last_threshold: state, nan until set, else in [0, MAX_THRESHOLD]; not part of equality.
        last_sparsity: state, nan until set, else in [0, MAX_SPARSITY]; not part of equality.
    """

    initial_threshold: float = 1e-4
    sparsity_target: float = 1e-3
    decay_rate: float = DEFAULT_DECAY_RATE
    start_at_target: bool = False
    written_cap: bool = True
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
        if not isinstance(self.written_cap, bool):
            raise ValueError(f"written_cap: expected a bool, got {self.written_cap!r}")
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

    def max_step_growth(self) -> float:
        return 1.0 / self.decay_rate ** (2 if self.start_at_target else 1)

    def new_reducer(self) -> ThresholdAlgorithmReducer:
        return _AveragingReducer(self, skip_nan_sparsity=False)

    def reference_length(self, n: int, written: int | None) -> int:
        if written is None or not self.written_cap:
            return n
        return max(1, min(n, math.ceil(written / self.sparsity_target)))

    def _threshold_at_target(self, residual: Array) -> float:
        """The magnitude that ``sparsity_target`` of ``residual`` reaches, within [MIN_THRESHOLD,
        initial_threshold] (initial_threshold when nothing is finite and positive there)."""
        xp = _cupy() if is_gpu_array(residual) else np
        flat = residual.ravel()
        k = min(flat.size, max(1, math.ceil(self.sparsity_target * flat.size)))
        # The k-th largest magnitude is 0 unless k values are non-zero, and then it is the k-th largest of
        # the non-zeros: a large table's first row-sparse residual is mostly zeros, and partitioning all
        # of it (17M values) took a quarter of a second of every task's first step.
        if int(xp.count_nonzero(flat)) < k:
            return self.initial_threshold
        magnitudes = xp.abs(flat[flat != 0])
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

    def process_residual(
        self,
        iteration: int,
        epoch: int,
        last_threshold: float,
        residual: Array,
        bounds: np.ndarray | None = None,
    ) -> None:
        """Clips ``residual`` in place on the iterations ``frequency`` names.

        Args:
            bounds: a host residual's magnitude bounds per block and per group of blocks that hold
                (``_core.residual_bounds``, kept by :class:`~sparkgrad.compress.EncodingHandler` after
                row-sparse steps): only the blocks whose bound (and their group's) reaches the limit are
                read, the same result, and their bounds lowered to the limit. A step that touched a few
                rows of a large table then clips in what it touched instead of a pass over every
                parameter.
        """
        if iteration <= 0 or iteration % self.frequency != 0:
            return
        limit = float(last_threshold) * self.threshold_multiple_clip_value
        if not is_gpu_array(residual):
            _core.clip(residual, limit, bounds)
            return
        ptr, n, dtype = _device_vector("clip", "residual", residual, writable=True)
        cuda.launch(_core.cuda_clip, ptr, n, dtype, limit)


@dataclasses.dataclass
class NoOpResidualPostProcessor(ResidualPostProcessor):
    """Leaves the residual alone."""

    def process_residual(self, iteration: int, epoch: int, last_threshold: float, residual: Array) -> None:
        return None


__all__ = [
    "CATCH_UP_SPARSITY",
    "DEFAULT_DECAY_RATE",
    "MAX_SPARSITY",
    "MAX_THRESHOLD",
    "MIN_THRESHOLD",
    "AdaptiveThresholdAlgorithm",
    "FixedThresholdAlgorithm",
    "NoOpResidualPostProcessor",
    "ResidualClippingPostProcessor",
    "ResidualPostProcessor",
    "TargetSparsityThresholdAlgorithm",
    "ThresholdAlgorithm",
    "ThresholdAlgorithmReducer",
]
