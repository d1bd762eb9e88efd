"""Loaders turning saved files (paths or the bytes Spark read) back into DataSets / MultiDataSets."""

from __future__ import annotations

import os
from typing import ClassVar, Generic, TypeVar, Union

from sparkgrad.data.dataset import DataSet, MultiDataSet, _Examples
from sparkgrad.data.serialization import PathOrFile

E = TypeVar("E", bound=_Examples)
Bytes = Union[bytes, bytearray, memoryview]


class _SerializedLoader(Generic[E]):
    """Callable ``source -> object`` for files written by ``save``; stateless and picklable."""

    _cls: ClassVar[type[_Examples]]

    def __call__(self, source: PathOrFile | Bytes | tuple[str, Bytes]) -> E:
        """Load one object.

        Args:
            source: a path (as :meth:`DataSet.load` takes: a local path or ``file:`` URI anywhere,
                another URI only on the driver), a binary file object, the file's bytes, or a
                ``(path, bytes)`` pair as produced by Spark's ``binaryFiles``.

        Returns:
            The loaded object.

        Raises:
            CorruptDataError: the data is truncated, damaged (checksum or structure), foreign, of the
                wrong kind or followed by other data (names the file and the field).
        """
        if isinstance(source, tuple) and len(source) == 2:
            path, data = source
            return self.load_bytes(data, source=os.fsdecode(path))
        if isinstance(source, (bytes, bytearray, memoryview)):
            return self.load_bytes(source)
        return self._cls.load(source)  # type: ignore[return-value]

    def load_bytes(self, data: Bytes, source: str = "<bytes>") -> E:
        """Load one object from the bytes of a saved file.

        Args:
            data: the file's content.
            source: the file's name for error messages.

        Returns:
            The loaded object.
        """
        return self._cls.from_bytes(data, source=source)  # type: ignore[return-value]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SerializedDataSetLoader(_SerializedLoader[DataSet]):
    """Loads a :class:`DataSet` saved with :meth:`DataSet.save` (DL4J's ``SerializedDataSetLoader``).

    ``loader(path)``, ``loader(data_bytes)``, ``loader((path, data_bytes))`` (so that
    ``sc.binaryFiles(directory).map(SerializedDataSetLoader())`` works), or
    ``loader.load_bytes(data_bytes, source=path)``.
    """

    _cls = DataSet


class SerializedMultiDataSetLoader(_SerializedLoader[MultiDataSet]):
    """Loads a :class:`MultiDataSet` saved with :meth:`MultiDataSet.save`; used like
    :class:`SerializedDataSetLoader`."""

    _cls = MultiDataSet
