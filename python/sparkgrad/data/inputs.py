"""Training input in the forms users have at hand, turned into the minibatches a network trains on.

:func:`training_batches` accepts a DataSet, feature and label arrays (``fit(x, y)`` or
``fit((x, y))``), or an iterable of DataSets or ``(x, y)`` batches, and returns a re-iterable of
DataSets, one pass per epoch. Local training (``MultiLayerNetwork.fit``) uses it, so the local API
takes the same data a NumPy / scikit-learn user would pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.data.dataset import DataSet, MultiDataSet, _Examples
from sparkgrad.data.iterators import ListDataSetIterator, rebatch
from sparkgrad.device import is_gpu_array

# Minibatch size of array input when the caller gives none (the size Keras users expect).
DEFAULT_ARRAY_BATCH_SIZE = 32


def _is_array(value: Any) -> bool:
    # numpy arrays, anything exposing the host array protocol (pandas) and GPU arrays count as arrays
    return isinstance(value, np.ndarray) or hasattr(value, "__array__") or is_gpu_array(value)


def _pair_to_dataset(pair: Any, where: str) -> _Examples:
    """A DataSet/MultiDataSet as is, or an ``(x, y)`` pair of arrays as a DataSet."""
    if isinstance(pair, _Examples):
        return pair
    if isinstance(pair, tuple) and len(pair) == 2 and _is_array(pair[0]) and _is_array(pair[1]):
        return DataSet(pair[0], pair[1])
    raise TypeError(
        f"{where}: expected a DataSet or an (x, y) tuple of arrays, got {type(pair).__name__}"
        + (f" of length {len(pair)}" if isinstance(pair, tuple) else "")
    )


class _Batches:
    """Re-iterable view of a batch source: every ``iter()`` is one epoch (one pass over ``source``)."""

    def __init__(self, source: Iterable[Any], batch_size: int | None, name: str) -> None:
        self._source = source
        self._batch_size = batch_size
        self._name = name

    def _converted(self) -> Iterator[_Examples]:
        for i, item in enumerate(self._source):
            yield _pair_to_dataset(item, f"{self._name}[{i}]")

    def __iter__(self) -> Iterator[_Examples]:
        batches = self._converted()
        return batches if self._batch_size is None else rebatch(batches, self._batch_size)


def training_batches(
    data: Any, labels: Any = None, batch_size: int | None = None, epochs: int = 1, name: str = "data"
) -> Iterable[_Examples]:
    """The minibatches of ``epochs`` passes over ``data``: every ``iter()`` of the result is one pass.

    Args:
        data: one of
            - a DataSet or MultiDataSet: one minibatch per pass, or ``batch_size`` examples each;
            - a feature array, with the label array in ``labels``: minibatches of ``batch_size``
              examples (default :data:`DEFAULT_ARRAY_BATCH_SIZE`), in order;
            - an ``(x, y)`` tuple of arrays: the same as ``data=x, labels=y``;
            - an iterable of DataSets or of ``(x, y)`` tuples: its batches as they are, or re-batched
              to ``batch_size`` examples when given. A one-shot iterator (a generator) can serve one
              pass only.
        labels: the label array when ``data`` is a feature array; None otherwise.
        batch_size: examples per minibatch (positive int), None for the defaults above.
        epochs: number of passes the caller will make (a one-shot iterator allows only 1).
        name: the argument name used in error messages.

    Returns:
        A re-iterable of DataSets (or MultiDataSets).

    Raises:
        TypeError: ``data``, ``labels`` or an element of ``data`` has an unsupported type.
        ValueError: bad ``batch_size``, arrays whose example counts differ, or a one-shot iterator
            with ``epochs > 1``.
    """
    if batch_size is not None:
        batch_size = check_int("batch_size", batch_size, minimum=1)
    if labels is not None:
        if not _is_array(data) or not _is_array(labels):
            raise TypeError(
                f"labels: given with {name} of type {type(data).__name__}; pass feature and label arrays "
                f"as fit(x, y), or a DataSet / iterable of batches alone (epochs by keyword: epochs=...)"
            )
        data = (data, labels)
    if isinstance(data, tuple) and len(data) == 2 and _is_array(data[0]) and _is_array(data[1]):
        return ListDataSetIterator(
            _pair_to_dataset(data, name), DEFAULT_ARRAY_BATCH_SIZE if batch_size is None else batch_size
        )
    if _is_array(data):
        raise TypeError(f"{name}: features given without labels; training needs fit(x, y) or fit((x, y))")
    if isinstance(data, (DataSet, MultiDataSet)):
        return [data] if batch_size is None else ListDataSetIterator(data, batch_size)
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes)):
        raise TypeError(
            f"{name}: expected a DataSet, (x, y) arrays or an iterable of batches, got {type(data).__name__}"
        )
    if epochs > 1 and iter(data) is data:
        raise ValueError(f"{name}: a one-shot iterator cannot be trained for several epochs; pass a list")
    return _Batches(data, batch_size, name)


__all__ = ["DEFAULT_ARRAY_BATCH_SIZE", "training_batches"]
