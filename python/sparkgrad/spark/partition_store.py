"""A task's partition on the executor's local disk, so that a worker's memory does not grow with its data.

A worker visits its partition once per epoch, each time in a new seeded order, inside one Spark task
(the input iterator can be read only once). Keeping the elements in a Python list made a worker hold
its whole partition: 1.6 GiB of features took Spark down. :class:`PartitionStore` writes each element
as it arrives to an unnamed temporary file in Spark's local directory (``SPARK_LOCAL_DIRS``, where
Spark spills its own shuffle data; the file disappears when the worker process exits, even killed) and
reads one element at a time back by index: the worker holds an offset per element, its prefetch queue
and the element being read. The operating system's page cache keeps a partition that fits in memory
as fast as a list; one that does not is read from disk. With ``encrypt`` (the fit's
``spark.io.encryption.enabled``, Spark's switch for its own spills) every element is stored sealed with
AES-256-GCM under a key made for the store, which never leaves the worker's memory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from typing import Any

import numpy as np

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.errors import CorruptDataError

# element classes of the "dataset" kind, by the tag stored beside each element
_CLASSES = (DataSet, MultiDataSet)


def local_directory() -> str | None:
    """Spark's first local directory on this executor (``SPARK_LOCAL_DIRS``), or None outside Spark."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d and os.path.isdir(d)]
    return dirs[0] if dirs else None


class PartitionStore:
    """The elements of one partition of a training RDD, spilled to a local file and read back by index.

    ``kind`` is what the elements are (see :func:`sparkgrad.spark.common.load_unit`): ``"dataset"``
    (DataSets or MultiDataSets, stored in their saved form), ``"bytes"`` (``(name, saved bytes)`` pairs
    as Spark's ``binaryFiles`` and ``sequenceFile`` give them) or ``"path"`` (path strings, kept in
    memory: they are small and loaded by the worker's loader on each visit). ``store[i]`` gives element
    ``i`` in the form it arrived in.
    """

    def __init__(
        self, units: Iterable[Any], kind: str, directory: str | None = None, encrypt: bool = False
    ) -> None:
        self.kind = kind
        self._paths: list[Any] | None = None
        self._cipher: Any = None
        self._invalid_tag: type[Exception] = Exception  # the cipher's refusal of altered bytes
        if kind == "path":
            self._paths = list(units)
            self._offsets = np.zeros(len(self._paths) + 1, np.int64)
            return
        if encrypt:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._cipher = AESGCM(AESGCM.generate_key(bit_length=256))
            self._invalid_tag = InvalidTag
        self._file = tempfile.TemporaryFile(prefix="sparkgrad-partition-", dir=directory or local_directory())
        self._names: list[str] = []
        tags = bytearray()
        offsets = [0]
        try:
            for unit in units:
                if kind == "dataset":
                    tags.append(_tag(unit, len(offsets) - 1))
                    data = unit.to_bytes()
                else:
                    name, data = unit
                    self._names.append(name)
                if self._cipher is not None:
                    data = self._cipher.encrypt(_nonce(len(offsets) - 1), bytes(data), None)
                offsets.append(offsets[-1] + self._file.write(data))
            self._file.flush()
        except BaseException:
            self._file.close()
            raise
        self._tags = bytes(tags)
        self._offsets = np.asarray(offsets, np.int64)

    def __len__(self) -> int:
        return len(self._paths) if self._paths is not None else len(self._offsets) - 1

    @property
    def nbytes(self) -> int:
        """Bytes of the spilled elements (0 for paths)."""
        return int(self._offsets[-1])

    def __getitem__(self, index: int | np.integer) -> Any:
        index = range(len(self))[index]  # an int in range (IndexError otherwise), also for numpy ints
        if self._paths is not None:
            return self._paths[index]
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        data = os.pread(self._file.fileno(), end - start, start)
        if len(data) != end - start:
            raise OSError(f"{self._file.name}: the spilled partition ended at element {index}")
        if self._cipher is not None:
            try:
                data = self._cipher.decrypt(_nonce(index), data, None)
            except self._invalid_tag:
                raise CorruptDataError(f"spilled partition element {index}: altered on local disk") from None
        if self.kind == "bytes":
            return self._names[index], data
        return _CLASSES[self._tags[index]].from_bytes(data, source=f"spilled partition element {index}")

    def close(self) -> None:
        """Delete the local file (idempotent)."""
        if self._paths is None:
            self._file.close()

    def __enter__(self) -> PartitionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _nonce(index: int) -> bytes:
    """The GCM nonce of element ``index``: unique per element under the store's own key."""
    return index.to_bytes(12, "big")


def _tag(unit: Any, index: int) -> int:
    for tag, cls in enumerate(_CLASSES):
        if isinstance(unit, cls):
            return tag
    raise TypeError(f"data: element {index} of the partition is a {type(unit).__name__}, not a DataSet")


__all__ = ["PartitionStore", "local_directory"]
