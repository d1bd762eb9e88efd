"""Training listeners: callbacks invoked by ``MultiLayerNetwork.fit``."""

from __future__ import annotations

import logging
from typing import Any

from sparkgrad._config import check_int

_LOG = logging.getLogger("sparkgrad.nn")


class TrainingListener:
    """Base class; override the hooks you need (defaults do nothing)."""

    def iteration_done(self, model: Any, iteration: int, epoch: int) -> None:
        """Called after every parameter update with the new iteration count and the current epoch."""

    def on_epoch_end(self, model: Any) -> None:
        """Called after every pass over the training data."""


class ScoreIterationListener(TrainingListener):
    """Logs the minibatch score every ``print_every_n`` iterations (logger ``sparkgrad.nn``, INFO).

    Args:
        print_every_n: logging period in iterations, at least 1.
    """

    def __init__(self, print_every_n: int = 10) -> None:
        self.print_every_n = check_int("print_every_n", print_every_n, minimum=1)

    def iteration_done(self, model: Any, iteration: int, epoch: int) -> None:
        if iteration % self.print_every_n == 0:
            _LOG.info("Score at iteration %d (epoch %d) is %.6g", iteration, epoch, model.score())


__all__ = ["ScoreIterationListener", "TrainingListener"]
