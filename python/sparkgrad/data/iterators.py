"""Minibatch iterators: re-batching with seeded per-epoch shuffling, and background prefetching."""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Generic, Iterable, Iterator, Sequence, TypeVar, cast

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.data.dataset import _Examples, check_seed

E = TypeVar("E", bound=_Examples)
T = TypeVar("T")


class ListDataSetIterator(Generic[E]):
    """Minibatches of exactly ``batch_size`` examples (the last may be smaller) over in-memory data.

    The object is re-iterable: every ``iter()`` (every ``for`` loop) is a new epoch over all
    examples. With ``shuffle=True`` each epoch has its own order, a function of ``(seed, epoch)``
    only, so two iterators built with the same seed yield the same batches epoch by epoch.

    Args:
        data: a DataSet or MultiDataSet, or a non-empty list of them (all of one class; merged once).
        batch_size: examples per batch, at least 1.
        shuffle: reshuffle the examples at the start of every epoch.
        seed: non-negative integer making the shuffles reproducible; None draws fresh entropy.

    Raises:
        TypeError: ``data`` is not a (Multi)DataSet or a list of them.
        ValueError: bad ``batch_size`` or ``seed``, or an empty list.
    """

    def __init__(
        self, data: E | Sequence[E], batch_size: int, shuffle: bool = False, seed: int | None = None
    ) -> None:
        if isinstance(data, _Examples):
            self._data: E = data
        elif isinstance(data, (list, tuple)):
            if not data:
                raise ValueError("data: expected at least one DataSet, got an empty list")
            if not isinstance(data[0], _Examples):
                raise TypeError(f"data[0]: expected a DataSet or MultiDataSet, got {type(data[0]).__name__}")
            self._data = _concat(data)
        else:
            raise TypeError(
                f"data: expected a DataSet, MultiDataSet or a list of them, got {type(data).__name__}"
            )
        self._batch_size = check_int("batch_size", batch_size, minimum=1)
        self._shuffle = bool(shuffle)
        seed = check_seed(seed)
        self._seed = cast(int, np.random.SeedSequence().entropy) if seed is None else seed
        self._epoch = 0

    @property
    def batch_size(self) -> int:
        """Examples per batch."""
        return self._batch_size

    @property
    def epoch(self) -> int:
        """Number of epochs started so far (the next ``iter()`` starts epoch ``epoch``, 0-based)."""
        return self._epoch

    def num_examples(self) -> int:
        """Total number of examples per epoch."""
        return self._data.num_examples()

    def __len__(self) -> int:
        """Number of batches per epoch."""
        return -(-self._data.num_examples() // self._batch_size)

    def reset(self) -> None:
        """Rewind to epoch 0: the following epochs repeat the batches (and orders) from the start."""
        self._epoch = 0

    def __iter__(self) -> Iterator[E]:
        epoch = self._epoch
        self._epoch += 1
        return self._batches(epoch)

    def _batches(self, epoch: int) -> Iterator[E]:
        n, b = self._data.num_examples(), self._batch_size
        if not self._shuffle:
            for start in range(0, n, b):
                yield self._data[start : start + b]
            return
        order = np.random.default_rng([self._seed, epoch]).permutation(n)
        for start in range(0, n, b):
            yield self._data[order[start : start + b]]

    def __repr__(self) -> str:
        return (
            f"ListDataSetIterator(num_examples={self.num_examples()}, batch_size={self._batch_size}, "
            f"shuffle={self._shuffle}, seed={self._seed}, epoch={self._epoch})"
        )


def rebatch(datasets: Iterable[E], batch_size: int) -> Iterator[E]:
    """Stream objects of any sizes as batches of exactly ``batch_size`` examples, in order.

    Only the last batch may be smaller. The input is consumed lazily and at most one batch of
    examples is held back, so this suits a Spark partition being exported to fixed-size batch files
    (DL4J's ``BatchAndExportDataSetsFunction``, without its reordering of oversized inputs).

    Args:
        datasets: iterable of DataSets or of MultiDataSets (one class throughout).
        batch_size: examples per output batch, at least 1.

    Returns:
        An iterator of batches; an input of exactly ``batch_size`` examples with nothing pending is
        passed through as it is (the same object).

    Raises:
        TypeError: an element is not of the first element's class (names its index).
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    return _rebatch(datasets, batch_size)


def _rebatch(datasets: Iterable[E], batch_size: int) -> Iterator[E]:
    pending: list[E] = []
    pending_count = 0
    cls: type | None = None
    for i, ds in enumerate(datasets):
        if not isinstance(ds, _Examples):
            raise TypeError(f"datasets[{i}]: expected a DataSet or a MultiDataSet, got {type(ds).__name__}")
        cls = cls or type(ds)
        if type(ds) is not cls:
            raise TypeError(f"datasets[{i}]: expected a {cls.__name__}, got {type(ds).__name__}")
        n, start = ds.num_examples(), 0
        while start < n:
            take = min(batch_size - pending_count, n - start)
            pending.append(ds if take == n else ds[start : start + take])  # whole: no slice to build
            pending_count += take
            start += take
            if pending_count == batch_size:
                yield _concat(pending)
                pending, pending_count = [], 0
    if pending:
        yield _concat(pending)


def _concat(parts: Sequence[E]) -> E:
    """``merge`` without the copy when there is nothing to merge."""
    return parts[0] if len(parts) == 1 else type(parts[0]).merge(parts)


_ITEM, _END, _ERROR = range(3)


def _produce(source: Iterator[Any], items: queue.Queue, stop: threading.Event, owned: bool) -> None:
    """Producer thread body; holds no reference to the AsyncDataSetIterator so it can be collected."""
    try:
        while not stop.is_set():
            try:
                item = next(source)
            except StopIteration:
                items.put((_END, None))
                return
            items.put((_ITEM, item))
    except BaseException as exc:  # handed to the consumer, re-raised there
        items.put((_ERROR, exc))
    finally:
        close = getattr(source, "close", None)
        if owned and callable(close):  # run the finally blocks of a generator we created
            close()


def _shutdown(thread: threading.Thread, items: queue.Queue, stop: threading.Event) -> None:
    """Stop the producer: signal, unblock a pending put by draining, join."""
    stop.set()
    while thread.is_alive():
        try:
            while True:
                items.get_nowait()
        except queue.Empty:
            pass
        thread.join(0.01)


class _Epoch:
    """One pass over the source in a background thread; shut down when closed or collected."""

    def __init__(self, source: Iterable[Any], prefetch: int) -> None:
        iterator = iter(source)  # raised here, in the consumer, if the source cannot be iterated
        self._items: queue.Queue = queue.Queue(maxsize=prefetch)
        stop = threading.Event()
        thread = threading.Thread(
            target=_produce,
            args=(iterator, self._items, stop, iterator is not source),
            name="sparkgrad-prefetch",
            daemon=True,
        )
        self.close = weakref.finalize(self, _shutdown, thread, self._items, stop)
        self.close.atexit = False  # a daemon thread blocked in the source must not hang interpreter exit
        self.done = False
        thread.start()

    def next(self) -> Any:
        if self.done:
            raise StopIteration
        kind, value = self._items.get()
        if kind == _ITEM:
            return value
        self.done = True
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration


class AsyncDataSetIterator(Generic[T]):
    """Prefetches items of any iterable in a background thread (DL4J's ``AsyncDataSetIterator``).

    Items arrive in the source's order. An exception raised by the source is re-raised by
    ``next()`` after the items produced before it. Each ``iter()`` (each ``for`` loop) starts a new
    epoch over ``iter(iterator)`` (a new epoch for re-iterable sources such as
    :class:`ListDataSetIterator`), stopping an unfinished one; ``next()`` on a fresh object starts
    the first epoch. The thread is joined at the end of an epoch, by :meth:`close` / the ``with``
    statement, or when the object is garbage-collected, so stopping early leaks no thread.

    Args:
        iterator: any iterable, e.g. a ListDataSetIterator or a generator of DataSets.
        prefetch: maximum number of items produced ahead of the consumer, at least 1.

    Raises:
        TypeError: ``iterator`` is not iterable.
        ValueError: bad ``prefetch``.
    """

    def __init__(self, iterator: Iterable[T], prefetch: int = 2) -> None:
        if not hasattr(iterator, "__iter__"):
            raise TypeError(f"iterator: expected an iterable, got {type(iterator).__name__}")
        self._source = iterator
        self._prefetch = check_int("prefetch", prefetch, minimum=1)
        self._epoch: _Epoch | None = None

    def __iter__(self) -> AsyncDataSetIterator[T]:
        self.close()
        self._epoch = _Epoch(self._source, self._prefetch)
        return self

    def __next__(self) -> T:
        if self._epoch is None:
            self._epoch = _Epoch(self._source, self._prefetch)
        return self._epoch.next()

    def reset(self) -> None:
        """Stop the current epoch; the next ``next()`` starts a new one."""
        self.close()
        self._epoch = None

    def close(self) -> None:
        """Stop the producer thread and join it; the current epoch ends (``next()`` raises StopIteration)."""
        if self._epoch is not None:
            self._epoch.done = True
            self._epoch.close()

    def __enter__(self) -> AsyncDataSetIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AsyncDataSetIterator({self._source!r}, prefetch={self._prefetch})"
