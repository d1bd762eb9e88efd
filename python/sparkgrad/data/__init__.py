"""Training data: DataSet / MultiDataSet containers, their binary file format, iterators, loaders.

- :class:`DataSet`, :class:`MultiDataSet`: arrays whose first dimension indexes examples, with
  ``split``, ``merge``, ``shuffle``, indexing, ``save`` / ``load`` / ``to_bytes`` / ``from_bytes``.
  The file format is versioned and documented byte by byte in :mod:`sparkgrad.data.serialization`.
- :class:`ListDataSetIterator`: fixed-size minibatches with seeded per-epoch shuffling.
- :func:`rebatch`: a stream of objects of any sizes as exact-size batches (for exporting).
- :class:`AsyncDataSetIterator`: background prefetching of any iterable.
- :class:`SerializedDataSetLoader`, :class:`SerializedMultiDataSetLoader`: path or bytes -> object,
  for data exported to files and read back through Spark.
- :func:`read_nd4j_dataset`: DataSet files written by DL4J / ND4J ``DataSet.save`` (migration);
  :func:`read_nd4j_array`: one array written by ``Nd4j.write``.
"""

from __future__ import annotations

from sparkgrad.data.dataset import DataSet, MultiDataSet
from sparkgrad.data.iterators import AsyncDataSetIterator, ListDataSetIterator, rebatch
from sparkgrad.data.loaders import SerializedDataSetLoader, SerializedMultiDataSetLoader
from sparkgrad.data.nd4j import read_nd4j_array, read_nd4j_dataset

__all__ = [
    "AsyncDataSetIterator",
    "DataSet",
    "ListDataSetIterator",
    "MultiDataSet",
    "SerializedDataSetLoader",
    "SerializedMultiDataSetLoader",
    "read_nd4j_array",
    "read_nd4j_dataset",
    "rebatch",
]
