"""Updater configurations (DL4J's IUpdater family).

Each updater is a :class:`~sparkgrad._config.Config`; the fused native kernel ``updater_apply`` turns a
flat gradient slice into the update that is subtracted from the parameters, advancing a flat state.

Validation (ValueError naming the field): learning rates and epsilons are finite and in
(0, MAX_SCALE] (1e6); decay-like coefficients (beta1, beta2, momentum, rms_decay, rho) are in [0, 1),
where the moving averages they drive stay bounded.

``learning_rate`` (every updater that has one) and Nesterovs' ``momentum`` also accept a schedule from
:mod:`sparkgrad.nn.schedules` (DL4J's ``learningRateSchedule`` / ``momentumSchedule``): each step uses
its value at the network's iteration and epoch counts before the step, and training raises a
ValueError naming the field if a scheduled value leaves the range above ([0, MAX_SCALE] for a
learning rate, which a schedule may bring down to 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sparkgrad._config import MAX_SCALE, Config, check_positive, check_range
from sparkgrad._native import _core
from sparkgrad.nn.schedules import Schedule, check_scheduled, check_step_value


class Updater(Config):
    """Base of every updater config: ``kind`` names the kernel, ``learning_rate`` scales weight decay."""

    kind: ClassVar[str] = ""
    # Whether the first ``n`` elements of the state are a velocity that gradient sharing zeroes where a
    # worker's message sent the parameter (DGC's momentum factor masking, FlatNetwork.mask_momentum).
    masks_momentum: ClassVar[bool] = False
    # Whether a zero gradient entry gets a zero update and no state changes (stateless, elementwise):
    # then an embedding table's rows that no lookup touched need no step (FlatNetwork's row-sparse step).
    row_sparse: ClassVar[bool] = False
    learning_rate: float | Schedule

    def learning_rate_at(self, iteration: int = 0, epoch: int = 0) -> float:
        """The learning rate of the step at 0-based ``iteration`` and ``epoch``: the number itself, or
        the schedule's value (ValueError naming ``learning_rate`` when outside [0, MAX_SCALE])."""
        return _scheduled("learning_rate", self.learning_rate, iteration, epoch, MAX_SCALE)

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        """Hyper-parameters passed to ``_core.updater_apply`` (keyword names of the kernel), with
        schedules evaluated at ``iteration`` and ``epoch``."""
        return {}

    def state_size(self, n: int) -> int:
        """Length of the flat state this updater keeps for ``n`` parameters."""
        return int(_core.updater_state_size(self.kind, n))

    def apply(
        self,
        gradient: Any,
        state: Any,
        iteration: int,
        kernels: Any,
        epoch: int = 0,
        hyper: dict[str, float] | None = None,
    ) -> None:
        """Turn ``gradient`` into the update in place, advancing ``state`` (0-based ``iteration``).

        Args:
            gradient: flat gradient slice (overwritten with the update).
            state: this updater's flat state slice.
            iteration: 0-based iteration (the network's count before this step).
            kernels: the kernel namespace of the arrays' device (``Device.kernels``).
            epoch: 0-based epoch (the network's count of completed epochs), read by EPOCH schedules.
            hyper: this step's :meth:`kernel_kwargs` when the caller has evaluated them already.
        """
        values = self.kernel_kwargs(iteration, epoch) if hyper is None else hyper
        kernels.updater_apply(self.kind, gradient, state, iteration, **values)


def _scheduled(
    field: str, value: float | Schedule, iteration: int, epoch: int, high: float, high_inclusive: bool = True
) -> float:
    if isinstance(value, Schedule):
        return check_step_value(field, value, iteration, epoch, 0.0, high, high_inclusive=high_inclusive)
    return value


def _check_lr(updater: Any) -> None:
    updater.learning_rate = check_scheduled("learning_rate", updater.learning_rate, 0.0, MAX_SCALE)


def _check_epsilon(updater: Any) -> None:
    updater.epsilon = check_positive("epsilon", updater.epsilon, MAX_SCALE)


def _check_decay(field: str, value: Any) -> float:
    return check_range(field, value, 0.0, 1.0, high_inclusive=False)


def _check_betas(updater: Any) -> None:
    updater.beta1 = _check_decay("beta1", updater.beta1)
    updater.beta2 = _check_decay("beta2", updater.beta2)
    _check_epsilon(updater)


@dataclasses.dataclass
class Sgd(Updater):
    """Plain stochastic gradient descent: ``update = learning_rate * gradient``."""

    kind: ClassVar[str] = "sgd"
    row_sparse: ClassVar[bool] = True
    learning_rate: float | Schedule = 1e-3

    def __post_init__(self) -> None:
        _check_lr(self)

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        return {"learning_rate": self.learning_rate_at(iteration, epoch)}


@dataclasses.dataclass
class Nesterovs(Updater):
    """Nesterov momentum (DL4J formulation). Its state is the velocity, which gradient sharing masks
    where a message sent the parameter when asked to (``momentum_masking`` of the masters).

    ``momentum`` may be a schedule too (DL4J's ``momentumSchedule``), with values in [0, 1)."""

    kind: ClassVar[str] = "nesterovs"
    masks_momentum: ClassVar[bool] = True
    learning_rate: float | Schedule = 0.1
    momentum: float | Schedule = 0.9

    def __post_init__(self) -> None:
        _check_lr(self)
        self.momentum = check_scheduled(
            "momentum", self.momentum, 0.0, 1.0, low_inclusive=True, high_inclusive=False
        )

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        return {
            "learning_rate": self.learning_rate_at(iteration, epoch),
            "momentum": _scheduled("momentum", self.momentum, iteration, epoch, 1.0, high_inclusive=False),
        }


@dataclasses.dataclass
class _AdamFamily(Updater):
    learning_rate: float | Schedule = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        _check_lr(self)
        _check_betas(self)

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        return {
            "learning_rate": self.learning_rate_at(iteration, epoch),
            "beta1": self.beta1,
            "beta2": self.beta2,
            "epsilon": self.epsilon,
        }


@dataclasses.dataclass
class Adam(_AdamFamily):
    """Adam with DL4J's bias-corrected step size."""

    kind: ClassVar[str] = "adam"


@dataclasses.dataclass
class AdaMax(_AdamFamily):
    """AdaMax (infinity-norm Adam)."""

    kind: ClassVar[str] = "adamax"


@dataclasses.dataclass
class Nadam(_AdamFamily):
    """Nesterov-accelerated Adam."""

    kind: ClassVar[str] = "nadam"


@dataclasses.dataclass
class AmsGrad(_AdamFamily):
    """AMSGrad: Adam with a running maximum of the second moment."""

    kind: ClassVar[str] = "amsgrad"


@dataclasses.dataclass
class RmsProp(Updater):
    """RMSProp: ``s = d s + (1 - d) g^2; u = lr g / sqrt(s + eps)``."""

    kind: ClassVar[str] = "rmsprop"
    learning_rate: float | Schedule = 0.1
    rms_decay: float = 0.95
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        _check_lr(self)
        self.rms_decay = _check_decay("rms_decay", self.rms_decay)
        _check_epsilon(self)

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        return {
            "learning_rate": self.learning_rate_at(iteration, epoch),
            "rms_decay": self.rms_decay,
            "epsilon": self.epsilon,
        }


@dataclasses.dataclass
class AdaGrad(Updater):
    """AdaGrad: ``h += g^2; u = lr g / (sqrt(h) + eps)``."""

    kind: ClassVar[str] = "adagrad"
    learning_rate: float | Schedule = 0.1
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        _check_lr(self)
        _check_epsilon(self)

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        return {"learning_rate": self.learning_rate_at(iteration, epoch), "epsilon": self.epsilon}


@dataclasses.dataclass
class AdaDelta(Updater):
    """AdaDelta (no learning rate; weight decay then uses a rate of 1)."""

    kind: ClassVar[str] = "adadelta"
    rho: float = 0.95
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        self.rho = _check_decay("rho", self.rho)
        _check_epsilon(self)

    @property
    def learning_rate(self) -> float:  # type: ignore[override]
        return 1.0

    def kernel_kwargs(self, iteration: int = 0, epoch: int = 0) -> dict[str, float]:
        return {"rho": self.rho, "epsilon": self.epsilon}


@dataclasses.dataclass
class NoOp(Updater):
    """Leaves parameters unchanged (update is zero); weight decay is off too."""

    kind: ClassVar[str] = "noop"
    row_sparse: ClassVar[bool] = True

    @property
    def learning_rate(self) -> float:  # type: ignore[override]
        return 0.0


def check_updater(field: str, value: Any) -> Updater:
    """Validate that ``value`` is an updater config (raises ValueError naming ``field``)."""
    if not isinstance(value, Updater):
        raise ValueError(f"{field}: expected an updater from sparkgrad.nn.updaters, got {value!r}")
    return value


__all__ = [
    "AdaDelta",
    "AdaGrad",
    "AdaMax",
    "Adam",
    "AmsGrad",
    "Nadam",
    "Nesterovs",
    "NoOp",
    "RmsProp",
    "Sgd",
    "Updater",
    "check_updater",
]
