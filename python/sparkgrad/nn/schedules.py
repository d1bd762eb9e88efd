"""Hyper-parameter schedules (DL4J's ``org.nd4j.linalg.schedule.ISchedule`` family).

A schedule maps the network's counters to a value: :meth:`Schedule.value_at` ``(iteration, epoch)``.
Every updater's ``learning_rate`` (and the ``momentum`` of
:class:`~sparkgrad.nn.updaters.Nesterovs`) accepts a schedule in place of a number. At each training
step the network evaluates it with its ``iteration_count`` and ``epoch_count`` *before* that step
increments them, as DL4J does: the first step of a fresh network uses ``value_at(0, 0)``, and
``epoch_count`` is the number of epochs completed, so an EPOCH schedule changes only between epochs.
Weight decay, which DL4J scales by the learning rate, uses the scheduled value of the same step.

``schedule_type`` (:class:`ScheduleType`, ``"iteration"`` or ``"epoch"``) picks the counter ``t`` the
formula reads. Schedules are configurations: they validate their arguments on construction
(``ValueError`` naming the argument) and round-trip through JSON, YAML and model files with the
updater that holds them. They hold no state, so one schedule may serve several layers.

Values are computed in float64 (Python floats) with DL4J's formulas; the kernels receive them as the
same scalar a constant learning rate would be.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from typing import Any

from sparkgrad._config import (
    MAX_SCALE,
    Config,
    check_int,
    check_non_negative,
    check_number,
    check_positive,
    check_range,
    coerce_enum,
)


class ScheduleType(str, enum.Enum):  # noqa: UP042 - as the other settings enums
    """Which counter a schedule reads (DL4J's ``ScheduleType``)."""

    ITERATION = "iteration"
    EPOCH = "epoch"


class Schedule(Config):
    """Base of every schedule: a pure function of ``(iteration, epoch)`` (DL4J's ``ISchedule``)."""

    def value_at(self, iteration: int, epoch: int) -> float:
        """The value at 0-based ``iteration`` and ``epoch`` (the network's counters before the step)."""
        raise NotImplementedError


def _check_type(value: Any) -> ScheduleType:
    return coerce_enum(ScheduleType, value, "schedule_type")


def _count(schedule_type: ScheduleType | str, iteration: int, epoch: int) -> int:
    return int(iteration if schedule_type is ScheduleType.ITERATION else epoch)


def _check_value(field: str, value: Any) -> float:
    """A schedule's own value (initial or mapped): finite, in [0, MAX_SCALE]."""
    return check_non_negative(field, value, MAX_SCALE)


@dataclasses.dataclass
class FixedSchedule(Schedule):
    """The same value at every step (DL4J's ``FixedSchedule``): a constant where a schedule is expected.

    Args:
        value: in [0, 1e6].
    """

    value: float

    def __post_init__(self) -> None:
        self.value = _check_value("value", self.value)

    def value_at(self, iteration: int, epoch: int) -> float:
        return self.value


@dataclasses.dataclass
class MapSchedule(Schedule):
    """Piecewise constant: the value of the largest key ``<= t`` (DL4J's ``MapSchedule``).

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        values: ``{start: value}``; the keys are non-negative integers and must include 0.

    Keys read back from JSON/YAML (strings of decimal digits) are converted to integers.
    """

    schedule_type: ScheduleType | str
    values: dict[int, float]

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        if not isinstance(self.values, dict) or not self.values:
            raise ValueError(f"values: expected a non-empty dict of start -> value, got {self.values!r}")
        parsed: dict[int, float] = {}
        for key, value in self.values.items():
            if isinstance(key, str) and key.strip().isdigit():  # JSON/YAML keys are strings
                key = int(key)
            start = check_int("values key", key, minimum=0)
            parsed[start] = _check_value(f"values[{start}]", value)
        if 0 not in parsed:
            raise ValueError(f"values: must contain a value for position 0, got keys {sorted(parsed)}")
        self.values = dict(sorted(parsed.items()))

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        result = self.values[0]
        for start, value in self.values.items():  # sorted by start
            if start > t:
                break
            result = value
        return result


@dataclasses.dataclass
class ExponentialSchedule(Schedule):
    """``initial_value * gamma ** t`` (DL4J's ``ExponentialSchedule``).

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        initial_value: the value at ``t = 0``, in [0, 1e6].
        gamma: the factor per step, > 0 (a gamma above 1 grows; training refuses a learning rate that
            leaves [0, 1e6]).
    """

    schedule_type: ScheduleType | str
    initial_value: float
    gamma: float

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        self.initial_value = _check_value("initial_value", self.initial_value)
        self.gamma = check_positive("gamma", self.gamma)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        try:
            return self.initial_value * math.pow(self.gamma, t)
        except OverflowError:
            return math.inf


@dataclasses.dataclass
class InverseSchedule(Schedule):
    """``initial_value / (1 + gamma * t) ** power`` (DL4J's ``InverseSchedule``).

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        initial_value: the value at ``t = 0``, in [0, 1e6].
        gamma: >= 0.
        power: a finite number (positive decays).
    """

    schedule_type: ScheduleType | str
    initial_value: float
    gamma: float
    power: float

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        self.initial_value = _check_value("initial_value", self.initial_value)
        self.gamma = check_non_negative("gamma", self.gamma)
        self.power = check_number("power", self.power)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        try:
            return self.initial_value / math.pow(1.0 + self.gamma * t, self.power)
        except OverflowError:
            return 0.0 if self.power > 0 else math.inf


@dataclasses.dataclass
class PolySchedule(Schedule):
    """Polynomial decay to zero: ``initial_value * (1 - t / max_iter) ** power`` for ``t < max_iter``,
    0 from ``max_iter`` on (mirrors DL4J's ``PolySchedule``).

    Deliberate difference: DL4J's documentation gives this decay (Caffe's "poly" policy) but its code
    computes ``(1 + t / max_iter) ** power``, which grows with ``t`` and then drops to 0 at
    ``max_iter``; sparkgrad implements the documented decay.

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        initial_value: the value at ``t = 0``, in [0, 1e6].
        power: >= 0 (1: linear decay).
        max_iter: the iteration or epoch where the value reaches 0, >= 1.
    """

    schedule_type: ScheduleType | str
    initial_value: float
    power: float
    max_iter: int

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        self.initial_value = _check_value("initial_value", self.initial_value)
        self.power = check_non_negative("power", self.power)
        self.max_iter = check_int("max_iter", self.max_iter, minimum=1)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        if t >= self.max_iter:
            return 0.0
        return self.initial_value * math.pow(1.0 - t / self.max_iter, self.power)


@dataclasses.dataclass
class SigmoidSchedule(Schedule):
    """``initial_value / (1 + exp(-gamma * (t - step_size)))`` (DL4J's ``SigmoidSchedule``).

    A positive ``gamma`` rises to ``initial_value`` around ``step_size``; a negative one decays from it
    (Caffe's "sigmoid" policy), so ``gamma`` may have either sign.

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        initial_value: the limit value, in [0, 1e6].
        gamma: the steepness, a finite number.
        step_size: the midpoint (value ``initial_value / 2``), >= 0.
    """

    schedule_type: ScheduleType | str
    initial_value: float
    gamma: float
    step_size: int

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        self.initial_value = _check_value("initial_value", self.initial_value)
        self.gamma = check_number("gamma", self.gamma)
        self.step_size = check_int("step_size", self.step_size, minimum=0)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        try:
            denominator = 1.0 + math.exp(-self.gamma * (t - self.step_size))
        except OverflowError:  # exp beyond float range: the value is 0 (as Java's 1/inf)
            return 0.0
        return self.initial_value / denominator


@dataclasses.dataclass
class StepSchedule(Schedule):
    """``initial_value * decay_rate ** floor(t / step)`` (DL4J's ``StepSchedule``).

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        initial_value: the value at ``t = 0``, in [0, 1e6].
        decay_rate: the factor applied every ``step``, > 0.
        step: the length of a step, > 0 (a float, as in DL4J).
    """

    schedule_type: ScheduleType | str
    initial_value: float
    decay_rate: float
    step: float

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        self.initial_value = _check_value("initial_value", self.initial_value)
        self.decay_rate = check_positive("decay_rate", self.decay_rate)
        self.step = check_positive("step", self.step)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        try:
            return self.initial_value * math.pow(self.decay_rate, math.floor(t / self.step))
        except OverflowError:
            return math.inf


@dataclasses.dataclass
class RampSchedule(Schedule):
    """Linear warm-up over the first ``num_iter`` iterations: ``base.value_at(i, e) * (i + 1) / num_iter``
    for ``i < num_iter - 1``, then ``base`` itself (DL4J's ``RampSchedule``).

    The value at iteration 0 is ``base / num_iter`` (not 0) and the full base value is reached at
    iteration ``num_iter - 1``. The ramp always counts iterations, as in DL4J; the base schedule may
    be of either type. This is the gradual warm-up of Goyal et al. (2017) for large effective batches.

    Args:
        base_schedule: the schedule (or constant, as a number) the ramp scales.
        num_iter: the length of the ramp in iterations, >= 1.
    """

    base_schedule: Schedule | float
    num_iter: int

    def __post_init__(self) -> None:
        if not isinstance(self.base_schedule, Schedule):
            if isinstance(self.base_schedule, bool) or not isinstance(self.base_schedule, numbers.Real):
                raise ValueError(
                    f"base_schedule: expected a schedule or a number, got {self.base_schedule!r}"
                )
            self.base_schedule = _check_value("base_schedule", self.base_schedule)
        self.num_iter = check_int("num_iter", self.num_iter, minimum=1)

    def value_at(self, iteration: int, epoch: int) -> float:
        base = value_of(self.base_schedule, iteration, epoch)
        if iteration >= self.num_iter - 1:
            return base
        return base * ((iteration + 1) / self.num_iter)


@dataclasses.dataclass
class CycleSchedule(Schedule):
    """One-cycle policy (Smith 2018; DL4J's ``CycleSchedule``).

    Within each cycle of ``cycle_length`` (position ``p = t % cycle_length``,
    ``s = (cycle_length - annealing_length) // 2``): a linear rise from ``initial_learning_rate`` to
    ``max_learning_rate`` over ``s`` steps, a linear fall back over ``s`` steps, then annealing
    ``initial_learning_rate * annealing_decay ** (annealing_length - (cycle_length - p))``.
    :meth:`of` gives DL4J's three-argument defaults.

    Args:
        schedule_type: ``"iteration"`` or ``"epoch"``.
        initial_learning_rate: the value at the start of a cycle, in [0, 1e6].
        max_learning_rate: the peak, in [0, 1e6].
        cycle_length: >= 2.
        annealing_length: >= 0, with ``(cycle_length - annealing_length) // 2 >= 1``.
        annealing_decay: the factor per annealing step, in (0, 1e6].
    """

    schedule_type: ScheduleType | str
    initial_learning_rate: float
    max_learning_rate: float
    cycle_length: int
    annealing_length: int
    annealing_decay: float = 0.1

    def __post_init__(self) -> None:
        self.schedule_type = _check_type(self.schedule_type)
        self.initial_learning_rate = _check_value("initial_learning_rate", self.initial_learning_rate)
        self.max_learning_rate = _check_value("max_learning_rate", self.max_learning_rate)
        self.cycle_length = check_int("cycle_length", self.cycle_length, minimum=2)
        self.annealing_length = check_int(
            "annealing_length", self.annealing_length, minimum=0, maximum=self.cycle_length - 2
        )
        self.annealing_decay = check_positive("annealing_decay", self.annealing_decay, MAX_SCALE)

    @classmethod
    def of(
        cls, schedule_type: ScheduleType | str, max_learning_rate: float, cycle_length: int
    ) -> CycleSchedule:
        """DL4J's defaults: start at a tenth of the peak, anneal over the last tenth of the cycle
        (rounded, half up) with a decay of 0.1."""
        length = check_int("cycle_length", cycle_length, minimum=2)
        peak = _check_value("max_learning_rate", max_learning_rate)
        return cls(schedule_type, peak * 0.1, peak, length, math.floor(length * 0.1 + 0.5), 0.1)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = _count(self.schedule_type, iteration, epoch)
        step_size = (self.cycle_length - self.annealing_length) // 2
        increment = (self.max_learning_rate - self.initial_learning_rate) / step_size
        p = t % self.cycle_length
        if p < step_size:
            return self.initial_learning_rate + increment * p
        if p < 2 * step_size:
            return self.max_learning_rate - increment * (p - step_size)
        exponent = self.annealing_length - (self.cycle_length - p)
        return self.initial_learning_rate * math.pow(self.annealing_decay, exponent)


def value_of(value: Schedule | float, iteration: int, epoch: int) -> float:
    """``value.value_at(iteration, epoch)`` for a schedule, ``value`` itself for a number."""
    if isinstance(value, Schedule):
        return float(value.value_at(iteration, epoch))
    return float(value)


def check_scheduled(
    field: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_inclusive: bool = False,
    high_inclusive: bool = True,
) -> Any:
    """Validate a hyper-parameter that is a number or a schedule (ValueError naming ``field``).

    A number must be finite and in ``(low, high]`` (``low_inclusive`` and ``high_inclusive`` close or
    open the ends); a schedule must be a :class:`Schedule` whose value at ``(0, 0)`` is in
    ``[low, high]`` (``high`` itself only with ``high_inclusive``): a schedule may reach ``low``, e.g. a
    decay to 0. Training checks every value it uses the same way (:func:`check_step_value`).
    """
    if isinstance(value, Schedule):
        check_step_value(field, value, 0, 0, low, high, high_inclusive=high_inclusive)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{field}: expected a number or a schedule from sparkgrad.nn.schedules, got {value!r}"
        )
    return check_range(field, value, low, high, low_inclusive=low_inclusive, high_inclusive=high_inclusive)


def check_step_value(
    field: str,
    schedule: Schedule,
    iteration: int,
    epoch: int,
    low: float,
    high: float,
    *,
    high_inclusive: bool = True,
) -> float:
    """``schedule.value_at(iteration, epoch)``, or a ValueError naming ``field`` when it is not a finite
    number in ``[low, high]`` (``[low, high)`` without ``high_inclusive``)."""
    value = float(schedule.value_at(iteration, epoch))
    in_range = low <= value <= high if high_inclusive else low <= value < high
    if not (math.isfinite(value) and in_range):
        hi = "]" if high_inclusive else ")"
        raise ValueError(
            f"{field}: {type(schedule).__name__} gives {value!r} at iteration {iteration}, epoch {epoch}; "
            f"expected a value in [{low:g}, {high:g}{hi}"
        )
    return value


__all__ = [
    "CycleSchedule",
    "ExponentialSchedule",
    "FixedSchedule",
    "InverseSchedule",
    "MapSchedule",
    "PolySchedule",
    "RampSchedule",
    "Schedule",
    "ScheduleType",
    "SigmoidSchedule",
    "StepSchedule",
    "check_scheduled",
    "check_step_value",
    "value_of",
]
