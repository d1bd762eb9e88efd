"""Observers of distributed fits, for experiment tracking (:mod:`sparkgrad.mlflow` is one).

Every fit of a :class:`~sparkgrad.spark.SparkNetwork` (``SparkMultiLayer``, ``SparkComputationGraph``, the
``sparkgrad.ml`` estimators, either training master, every data source) tells its listeners when it
starts, the metrics of every epoch as the epoch ends, and how it ended. Listeners are registered for
every fit of the process (:func:`add_fit_listener`) or for one model
(:meth:`SparkNetwork.add_fit_listener <sparkgrad.spark.SparkNetwork.add_fit_listener>`).

A listener that raises does not stop training: the error is logged (logger ``sparkgrad.spark.tracking``,
WARNING, with its traceback) and the fit goes on, as a tracking server that is down must not cost a
training run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkgrad.spark.stats import SparkTrainingStats

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_listeners: list[FitListener] = []


class FitListener:
    """Base class of fit observers; override the hooks you need (the defaults do nothing).

    The hooks run on the driver, in the thread that called ``fit`` (``epoch_ended`` in the thread that
    ends the epoch, the fit's own thread for both masters).
    """

    def fit_started(self, model: Any, epochs: int) -> None:
        """A fit of ``model`` (a :class:`~sparkgrad.spark.SparkNetwork`) for at most ``epochs`` epochs
        starts; ``model.network`` holds the parameters it starts from."""

    def epoch_ended(self, model: Any, epoch: int, metrics: Mapping[str, float]) -> None:
        """Epoch ``epoch`` (the network's own numbering, ``network.epoch_count - 1``) ended.

        ``metrics`` holds the epoch's progress figures (``loss``, ``examples_per_second`` and, with
        gradient sharing, ``bytes_on_wire``, ``update_density``, ``threshold``: see
        :meth:`~sparkgrad.spark.progress.FitProgress.end_epoch`), the ``evaluation_score`` and
        ``accuracy`` of the model's ``evaluation_data`` when set, and the metrics the fit's
        ``epoch_callback`` returned; all finite floats.
        """

    def fit_ended(self, model: Any, stats: SparkTrainingStats | None, error: BaseException | None) -> None:
        """The fit ended: ``stats`` are its training stats (None when they were not collected or the
        fit failed), ``error`` the exception it raised (None when it returned normally)."""


def add_fit_listener(listener: FitListener) -> None:
    """Observe every fit in this process (added once; adding it again does nothing).

    Args:
        listener: the observer.
    """
    if not isinstance(listener, FitListener):
        raise TypeError(f"listener: expected a FitListener, got {type(listener).__name__}")
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def remove_fit_listener(listener: FitListener) -> None:
    """Stop ``listener`` observing every fit (no error when it was not added)."""
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def fit_listeners() -> list[FitListener]:
    """The listeners observing every fit, in the order they were added."""
    with _lock:
        return list(_listeners)


class FitObservers:
    """The listeners of one fit, each hook called for all of them with their errors contained.

    Args:
        listeners: the process's and the model's listeners.
    """

    def __init__(self, listeners: Iterable[FitListener]) -> None:
        self.listeners = list(dict.fromkeys(listeners))  # one call per listener, order kept

    def __bool__(self) -> bool:
        return bool(self.listeners)

    def started(self, model: Any, epochs: int) -> None:
        """Call every listener's :meth:`FitListener.fit_started`."""
        self._each("fit_started", model, epochs)

    def epoch(self, model: Any, epoch: int, metrics: Mapping[str, float]) -> None:
        """Call every listener's :meth:`FitListener.epoch_ended`."""
        self._each("epoch_ended", model, epoch, dict(metrics))

    def ended(self, model: Any, stats: SparkTrainingStats | None, error: BaseException | None) -> None:
        """Call every listener's :meth:`FitListener.fit_ended`."""
        self._each("fit_ended", model, stats, error)

    def _each(self, hook: str, *args: Any) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, hook)(*args)
            except Exception:  # noqa: BLE001 - tracking must not end a training run; logged in full
                _log.warning("%s.%s failed; training goes on", type(listener).__name__, hook, exc_info=True)


__all__ = ["FitListener", "FitObservers", "add_fit_listener", "fit_listeners", "remove_fit_listener"]
