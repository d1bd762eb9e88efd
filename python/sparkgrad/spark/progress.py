"""Live progress of a distributed fit on the driver.

One line per fit: a tqdm bar when stderr is a terminal (and tqdm is installed), else a log line on the
``sparkgrad.spark.progress`` logger every :data:`LOG_INTERVAL_S` seconds and at every epoch end. It shows
the epoch, minibatches done of the epoch's total, the training loss, examples per second and, for
gradient sharing, the bytes on the wire, the update density (fraction of the parameters an update
encodes) and the threshold.

The training masters feed it while the Spark job runs: SharedTrainingMaster's controller for every update
it applies and the workers' periodic loss reports, ParameterAveragingTrainingMaster after every
averaging round. Feeding is thread-safe; only the driver's watching thread renders.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
import threading
import time
from typing import Any, Callable

_log = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0  # between plain log lines (a terminal bar redraws as tqdm sees fit)
RENDER_INTERVAL_S = 0.2  # between tqdm redraws
_DENSITY_SMOOTHING = 0.05  # exponential average over updates: steady, still follows a trend in seconds


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


class FitProgress:
    """The progress line of one fit.

    Args:
        epochs: epochs this fit runs (at most).
        first_epoch: the network's epoch count when the fit starts (shown as epoch 1).
        minibatches_per_epoch: expected minibatches per epoch over all workers, an estimate from the
            data's declared size; every finished epoch replaces it with the count that epoch trained.
        batch_size: examples per minibatch (for examples/s).
        enabled: False shows nothing (the fit still feeds the counters).
        traffic: zero-argument callable returning the bytes on the wire so far (the transport), or None.
        updates: with ``traffic``, whether the line also shows the density and threshold of the
            gradient-sharing updates (False: parameter averaging over the transport).
        stream: where a terminal bar goes (default stderr).
        on_epoch: called at every :meth:`end_epoch` as ``on_epoch(epoch, figures)`` with the figures
            :meth:`end_epoch` returns (experiment tracking, :mod:`sparkgrad.spark.tracking`).
    """

    def __init__(
        self,
        epochs: int,
        first_epoch: int,
        minibatches_per_epoch: int,
        batch_size: int,
        enabled: bool = True,
        traffic: Callable[[], float] | None = None,
        stream: Any = None,
        on_epoch: Callable[[int, dict[str, float]], None] | None = None,
        updates: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._show_updates = updates
        self.epochs = epochs
        self.first_epoch = first_epoch
        self.epoch = first_epoch
        self.total = max(1, int(minibatches_per_epoch))
        self.batch_size = batch_size
        self._counted = 0  # minibatches of the current epoch reported as a number (averaging rounds)
        self._updates: dict[Any, int] = {}  # per worker: updates applied in the current epoch
        self._trained: dict[Any, int] = {}  # per worker: minibatches it reported for the current epoch
        self._done_before = 0  # minibatches of the finished epochs of this fit
        self.density = math.nan
        self.threshold = math.nan
        self._losses: dict[Any, float] = {}  # latest loss per worker
        self._traffic = traffic
        self._start = time.monotonic()
        self._epoch_start = self._start
        self._on_epoch = on_epoch
        self._last_log = self._start
        self._last_render = 0.0
        self.enabled = bool(enabled)
        self._bar: Any = (
            self._make_bar(stream if stream is not None else sys.stderr) if self.enabled else None
        )

    def _make_bar(self, stream: Any) -> Any:
        isatty = getattr(stream, "isatty", None)
        if not (callable(isatty) and isatty()):
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:  # plain log lines then
            return None
        return tqdm(total=self.total, file=stream, unit="batch", dynamic_ncols=True, leave=True)

    # -- feeding (any thread) -------------------------------------------------------------------
    def minibatches(self, count: int) -> None:
        """``count`` more minibatches trained in the current epoch."""
        with self._lock:
            self._counted += count

    def update(self, density: float, threshold: float, source: Any, epoch: int) -> None:
        """A gradient-sharing update of worker ``source`` in ``epoch`` was applied: its density and
        threshold. It stands for one minibatch until the worker reports its own count (a minibatch whose
        update encoded nothing sends no message)."""
        with self._lock:
            if epoch != self.epoch:
                return
            self._updates[source] = self._updates.get(source, 0) + 1
            a = _DENSITY_SMOOTHING
            self.density = density if math.isnan(self.density) else (1 - a) * self.density + a * density
            self.threshold = threshold

    def trained(self, source: Any, epoch: int, minibatches: int) -> None:
        """Worker ``source`` reports having trained ``minibatches`` of ``epoch`` so far."""
        with self._lock:
            if epoch == self.epoch:
                self._trained[source] = max(self._trained.get(source, 0), int(minibatches))

    @property
    def done(self) -> int:
        """Minibatches trained in the current epoch."""
        with self._lock:
            return self._done()

    def _done(self) -> int:
        workers = self._updates.keys() | self._trained.keys()
        return self._counted + sum(max(self._updates.get(w, 0), self._trained.get(w, 0)) for w in workers)

    def loss(self, value: float, source: Any = None) -> None:
        """The latest training loss reported by ``source`` (a worker); the line shows their median."""
        if isinstance(value, (int, float)) and math.isfinite(value):
            with self._lock:
                self._losses[source] = float(value)

    # -- rendering (the driver's watching thread) -----------------------------------------------
    @property
    def median_loss(self) -> float:
        """Median of the workers' latest losses (nan before any report): reports are any finite float a
        worker sends, and the median stays within the honest workers' range while they are the majority,
        where the mean of two reports of 1.7e308 was inf."""
        with self._lock:
            values = list(self._losses.values())
        return statistics.median(values) if values else math.nan

    def describe(self) -> str:
        """The progress as one line of text."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        with self._lock:
            done, density, threshold = self._done(), self.density, self.threshold
            done_in_fit = self._done_before + done
            epoch = self.epoch - self.first_epoch + 1
        parts = [
            f"epoch {epoch}/{self.epochs}",
            f"{done}/{max(self.total, done)} minibatches",
            f"loss {self.median_loss:.4g}",
            f"{done_in_fit * self.batch_size / elapsed:,.0f} examples/s",
        ]
        if self._traffic is not None:
            parts.append(f"{_bytes(self._traffic())} on the wire")
            if self._show_updates:
                parts.append(f"density {density:.2e}")
                parts.append(f"threshold {threshold:.2e}")
        return " | ".join(parts)

    def refresh(self) -> None:
        """Redraw the bar, or log a line when :data:`LOG_INTERVAL_S` has passed since the last one."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._bar is not None:
            if now - self._last_render >= RENDER_INTERVAL_S:
                self._last_render = now
                self._draw()
        elif now - self._last_log >= LOG_INTERVAL_S:
            self._last_log = now
            _log.info("%s", self.describe())

    def _draw(self) -> None:
        done = self.done
        bar = self._bar
        bar.total = max(self.total, done)
        bar.n = done
        bar.set_description_str(f"epoch {self.epoch - self.first_epoch + 1}/{self.epochs}", refresh=False)
        line = self.describe().split(" | ", 2)[2]  # loss onwards (epoch and counts are the bar itself)
        bar.set_postfix_str(line, refresh=False)
        bar.refresh()

    def end_epoch(self, epoch: int) -> dict[str, float]:
        """The epoch ``epoch`` (network numbering) finished: a final line for it, counters reset.

        Returns:
            The epoch's figures (also passed to ``on_epoch``): ``loss`` (the mean of the workers' latest
            losses), ``examples_per_second`` (the epoch's minibatches times the batch size over its wall
            time), with the transport ``bytes_on_wire`` (since the fit started) and, with gradient
            sharing, ``update_density`` and ``threshold`` (as on the progress line). A figure not known
            yet (no loss reported, no update applied) is left out.
        """
        figures = self._figures()
        if self.enabled:
            if self._bar is not None:
                self._draw()
            else:
                _log.info("%s (epoch done)", self.describe())
                self._last_log = time.monotonic()
        with self._lock:
            done = self._done()
            self.epoch = epoch + 1
            self.total = max(1, done)  # what an epoch really takes, for the next ones
            self._done_before += done
            self._counted = 0
            self._updates.clear()
            self._trained.clear()
        if self.epoch >= self.first_epoch + self.epochs:
            self.enabled = False  # the fit's last epoch: nothing more to show
        elif self._bar is not None:
            self._bar.reset(total=self.total)
            self._draw()
        if self._on_epoch is not None:
            self._on_epoch(epoch, figures)
        return figures

    def _figures(self) -> dict[str, float]:
        """The current epoch's figures (see :meth:`end_epoch`); restarts the epoch's clock."""
        now = time.monotonic()
        elapsed, self._epoch_start = max(now - self._epoch_start, 1e-9), now
        with self._lock:
            done, density, threshold = self._done(), self.density, self.threshold
        figures = {"loss": self.median_loss, "examples_per_second": done * self.batch_size / elapsed}
        if self._traffic is not None:
            figures["bytes_on_wire"] = self._traffic()
            if self._show_updates:
                figures.update(update_density=density, threshold=threshold)
        return {k: float(v) for k, v in figures.items() if math.isfinite(v)}

    def close(self) -> None:
        """Finish the line (the bar stays on screen)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def estimate_minibatches(examples: int, partitions: int, batch_size: int) -> int:
    """Minibatches of one epoch when ``examples`` are spread evenly over ``partitions``, each re-batched
    to ``batch_size`` (the last batch of a partition may be smaller)."""
    partitions = max(1, min(partitions, examples)) if examples else 1
    base, extra = divmod(examples, partitions)
    big = -(-(base + 1) // batch_size)
    small = -(-base // batch_size)
    return extra * big + (partitions - extra) * small


__all__ = ["LOG_INTERVAL_S", "FitProgress", "estimate_minibatches"]
