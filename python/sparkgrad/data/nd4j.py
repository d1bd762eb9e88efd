"""Reading DataSet files written by Deeplearning4j / ND4J ``DataSet.save`` (migration from DL4J).

:func:`read_nd4j_dataset` reads the binary layout below into a :class:`~sparkgrad.data.DataSet`. It is
the layout of ``org.nd4j.linalg.dataset.DataSet.save`` with ``Nd4j.write`` for each array
(dl4j-reference.md 6.1 and 6.2), written by a Java ``DataOutputStream``: every number is big-endian
and every string is ``writeUTF``, a uint16 byte count followed by that many bytes (the names below
are ASCII).

DataSet file::

    offset  size  field
    0       1     flags: 0x01 features present, 0x02 labels present, 0x04 labels are the features
                  object (stored once, read back as a copy of the features), 0x08 features mask
                  present, 0x10 labels mask present, 0x20 example metadata present
    1       ...   the present arrays, each one Nd4j.write record, in this order: features, labels,
                  features mask, labels mask
    ...     ...   with flag 0x20 only: a Java ObjectOutputStream (magic AC ED 00 05) holding the
                  example metadata (a java.util.List); Java serialisation is not portable, so the
                  metadata is checked for the stream magic and skipped

Nd4j.write record: two data buffers, the shape information then the elements. A data buffer is::

    field        encoding
    mode         writeUTF: MIXED_DATA_TYPES or LONG_SHAPE (ND4J 1.0 and later), or the legacy
                 DIRECT, HEAP, JAVACPP (ND4J 0.9 and earlier)
    length       element count: int64 for MIXED_DATA_TYPES / LONG_SHAPE, int32 for the legacy modes
    type         writeUTF: FLOAT, DOUBLE, HALF, LONG, INT, SHORT, BYTE, UBYTE or BOOL
    elements     length elements of that type: float32, float64, float16 (IEEE binary16), int64,
                 int32, int16, int8, uint8, bool (one byte, 0 or 1)

The shape-information buffer has type LONG (INT in legacy files) and length ``2 * rank + 4``::

    [rank, shape[0], ..., shape[rank-1], stride[0], ..., stride[rank-1], extras, ews, order]

``extras`` (data type flags since ND4J 1.0, the buffer offset before) and ``ews`` (element-wise
stride) are not needed to read the elements; ``order`` is 99 (``'c'``, row-major) or 102 (``'f'``,
column-major) and says how the elements buffer is laid out. ``Nd4j.write`` copies views first, so the
elements are always the contiguous array in that order: in a non-empty array the strides of every
dimension longer than 1 must be those of a contiguous array of the order.

Everything is checked before it is used: flags, mode, type and order names, lengths against the
bytes left (before anything is allocated), ``prod(shape)`` against the elements length, strides,
bool bytes, the examples dimension of labels and masks against the features, and the end of the file
(bytes after the last array are an error unless they are the metadata stream). Any failure raises
:class:`~sparkgrad.errors.CorruptDataError` naming the file and the field.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Literal, Union

import numpy as np

from sparkgrad._io import read_bytes
from sparkgrad.data.dataset import DataSet
from sparkgrad.data.serialization import MAX_RANK
from sparkgrad.errors import CorruptDataError

Bytes = Union[bytes, bytearray, memoryview]

FEATURES_PRESENT = 0x01
LABELS_PRESENT = 0x02
LABELS_SAME_AS_FEATURES = 0x04
FEATURES_MASK_PRESENT = 0x08
LABELS_MASK_PRESENT = 0x10
METADATA_PRESENT = 0x20
_KNOWN_FLAGS = 0x3F
JAVA_SERIALIZATION_MAGIC = b"\xac\xed\x00\x05"

# allocation mode -> byte size of the length field that follows it
MODES = {"DIRECT": 4, "HEAP": 4, "JAVACPP": 4, "LONG_SHAPE": 8, "MIXED_DATA_TYPES": 8}
# ND4J data type -> big-endian numpy dtype of its elements
TYPES: dict[str, np.dtype[Any]] = {
    "FLOAT": np.dtype(">f4"),
    "DOUBLE": np.dtype(">f8"),
    "HALF": np.dtype(">f2"),
    "LONG": np.dtype(">i8"),
    "INT": np.dtype(">i4"),
    "SHORT": np.dtype(">i2"),
    "BYTE": np.dtype("i1"),
    "UBYTE": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
ORDERS: dict[int, Literal["C", "F"]] = {99: "C", 102: "F"}
_ARRAYS = (
    ("features", FEATURES_PRESENT),
    ("labels", LABELS_PRESENT),
    ("features_mask", FEATURES_MASK_PRESENT),
    ("labels_mask", LABELS_MASK_PRESENT),
)


def read_nd4j_dataset(source: Any, name: str | None = None) -> DataSet:
    """Read a DataSet file written by DL4J / ND4J ``DataSet.save`` (layout in the module docstring).

    Usable as a loader: ``sc.binaryFiles(directory).map(read_nd4j_dataset)`` gives an RDD of
    DataSets to train on, from any file system Spark reads.

    Args:
        source: a path (a local path, or on the driver any URI of the Spark session's Hadoop
            FileSystem: ``hdfs://``, ``s3a://``, ``file:``...), a binary file object, the file's
            bytes, or a ``(path, bytes)`` pair as Spark's ``binaryFiles`` produces.
        name: the file's name in error messages (default: the path, or ``<bytes>``).

    Returns:
        The DataSet, with the arrays' ND4J element types kept (FLOAT -> float32, DOUBLE -> float64,
        ...) in native byte order and row-major layout. Labels stored as "same as features" come back
        as a copy of the features; example metadata is skipped.

    Raises:
        FileNotFoundError: the path does not exist.
        CorruptDataError: the data is truncated, damaged or not a DataSet file (names the file and
            the field).
    """
    data, name = _source_bytes(source, name)
    return _Reader(memoryview(data).cast("B"), name, "ND4J DataSet file").dataset()


def read_nd4j_array(source: Any, name: str | None = None) -> np.ndarray:
    """Read one array written by ND4J's ``Nd4j.write(array, DataOutputStream)`` (the record layout in
    the module docstring): the ``.bin`` files of DL4J's tests and tools, a ModelSerializer zip's
    ``coefficients.bin``.

    Args:
        source: as :func:`read_nd4j_dataset`.
        name: the file's name in error messages (default: the path, or ``<bytes>``).

    Returns:
        The array with its ND4J element type, in native byte order and row-major layout.

    Raises:
        FileNotFoundError: the path does not exist.
        CorruptDataError: the data is truncated, damaged, not one array or has bytes after it (names
            the file and the field).
    """
    data, name = _source_bytes(source, name)
    reader = _Reader(memoryview(data).cast("B"), name, "ND4J array file")
    return reader.array_file()


def _source_bytes(source: Any, name: str | None) -> tuple[Bytes, str]:
    """(the bytes, the name for messages) of a path, binary file, bytes or (path, bytes) pair."""
    data: Bytes
    if isinstance(source, tuple) and len(source) == 2:
        source, name = source[1], os.fsdecode(source[0]) if name is None else name
    if isinstance(source, (str, os.PathLike)):
        data = read_bytes(source)
        name = os.fspath(source) if name is None else name
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = source
    elif callable(getattr(source, "read", None)):
        data = source.read()
        name = name or str(getattr(source, "name", f"<{type(source).__name__}>"))
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"source: the file object returned {type(data).__name__}, open it in binary mode")
    else:
        raise TypeError(
            "source: expected a path, a binary file, bytes or a (path, bytes) pair, "
            f"got {type(source).__name__}"
        )
    return data, name or "<bytes>"


class _Reader:
    """A cursor over the file's bytes; every read is bounded by what is left."""

    def __init__(self, data: memoryview, name: str, kind: str) -> None:
        self._data = data
        self._name = name
        self._kind = kind
        self._pos = 0

    def error(self, field: str, message: str) -> CorruptDataError:
        return CorruptDataError(f"{self._name}: {field}: {message} ({self._kind}, offset {self._pos})")

    def _take(self, n: int, field: str) -> memoryview:
        left = len(self._data) - self._pos
        if n > left:
            raise self.error(field, f"truncated: needs {n} bytes, {left} left")
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def _int(self, fmt: str, field: str) -> int:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt), field))[0]

    def _utf(self, field: str) -> str:
        raw = self._take(self._int(">H", field), field)
        try:
            return bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            raise self.error(field, f"not an ND4J name: {bytes(raw[:32])!r}") from None

    def dataset(self) -> DataSet:
        flags = self._int(">B", "flags")
        if flags & ~_KNOWN_FLAGS:
            raise self.error("flags", f"unknown bits in 0x{flags:02x}")
        if not flags & FEATURES_PRESENT:
            raise self.error("flags", f"0x{flags:02x} has no features")
        if flags & LABELS_PRESENT and flags & LABELS_SAME_AS_FEATURES:
            raise self.error("flags", f"0x{flags:02x} stores labels and also says labels are the features")
        arrays: dict[str, np.ndarray | None] = {}
        for field, bit in _ARRAYS:
            arrays[field] = self._array(field) if flags & bit else None
        if flags & LABELS_SAME_AS_FEATURES:
            arrays["labels"] = arrays["features"].copy()  # type: ignore[union-attr]
        if arrays["labels_mask"] is not None and arrays["labels"] is None:
            raise self.error("labels_mask", "present without labels")
        n = arrays["features"].shape[0]  # type: ignore[union-attr]
        for field, array in arrays.items():
            if array is not None and array.shape[0] != n:
                raise self.error(field, f"has {array.shape[0]} examples (first dimension), the features {n}")
        if flags & METADATA_PRESENT:
            if bytes(self._take(4, "metadata")) != JAVA_SERIALIZATION_MAGIC:
                raise self.error("metadata", "not a Java object stream")
            self._pos = len(self._data)  # Java-serialised metadata: not portable, skipped
        elif self._pos != len(self._data):
            raise self.error("end", f"{len(self._data) - self._pos} bytes after the last array")
        return DataSet(**arrays)

    def array_file(self) -> np.ndarray:
        array = self._array("array", min_rank=0)
        if self._pos != len(self._data):
            raise self.error("end", f"{len(self._data) - self._pos} bytes after the array")
        return array

    def _buffer_header(self, field: str) -> tuple[int, str]:
        mode = self._utf(f"{field} mode")
        if mode not in MODES:
            raise self.error(
                f"{field} mode", f"unknown allocation mode {mode!r} (expected one of {', '.join(MODES)})"
            )
        length = self._int(">i" if MODES[mode] == 4 else ">q", f"{field} length")
        if length < 0:
            raise self.error(f"{field} length", f"negative: {length}")
        dtype = self._utf(f"{field} type")
        if dtype not in TYPES:
            raise self.error(
                f"{field} type", f"unsupported data type {dtype!r} (supported: {', '.join(TYPES)})"
            )
        return length, dtype

    def _elements(self, field: str, length: int, dtype: str) -> np.ndarray:
        np_dtype = TYPES[dtype]
        raw = self._take(length * np_dtype.itemsize, field)  # bounded by the bytes left: no allocation yet
        if dtype == "BOOL":
            values = np.frombuffer(raw, dtype=np.uint8)
            if values.size and values.max() > 1:
                raise self.error(field, "BOOL elements other than 0 and 1")
            return values.astype(np.bool_)
        return np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="))

    def _array(self, field: str, min_rank: int = 1) -> np.ndarray:
        info_field = f"{field} shape info"
        length, info_type = self._buffer_header(info_field)
        if info_type not in ("LONG", "INT"):
            raise self.error(info_field, f"type {info_type}, expected LONG or INT")
        if length < 4 or length % 2 or length > 2 * MAX_RANK + 4:
            raise self.error(info_field, f"length {length} is not 2 * rank + 4 for a rank of 0 to {MAX_RANK}")
        info = [int(v) for v in self._elements(info_field, length, info_type)]
        rank = info[0]
        if rank != (length - 4) // 2:
            raise self.error(info_field, f"rank {rank} does not match the length {length}")
        if rank < min_rank:
            raise self.error(info_field, "rank 0: a DataSet array needs an examples dimension")
        shape, strides, order_code = info[1 : 1 + rank], info[1 + rank : 1 + 2 * rank], info[-1]
        if any(d < 0 for d in shape):
            raise self.error(info_field, f"negative dimension in shape {shape}")
        order = ORDERS.get(order_code)
        if order is None:
            raise self.error(info_field, f"order {order_code} is neither 99 ('c') nor 102 ('f')")
        expected = _contiguous_strides(shape, order)
        size = int(np.prod(shape, dtype=object))
        # strides of length-1 dimensions and of empty arrays address nothing, whatever their value
        if size and any(d > 1 and s != e for d, s, e in zip(shape, strides, expected)):
            raise self.error(
                info_field,
                f"strides {strides} are not those of a contiguous {order_code:c}-order array {shape}",
            )
        count, dtype = self._buffer_header(f"{field} data")
        if count != size:
            raise self.error(f"{field} data", f"{count} elements for shape {shape}")
        values = self._elements(f"{field} data", count, dtype)
        try:
            array = values.reshape(shape, order=order)
            return array if array.flags.c_contiguous else array.copy(order="C")  # a 0-d array stays 0-d
        except ValueError as exc:  # dimensions numpy cannot represent (an empty array of huge extent)
            raise self.error(info_field, f"shape {shape}: {exc}") from None


def _contiguous_strides(shape: list[int], order: str) -> list[int]:
    """Element strides of a contiguous array of ``shape`` in C or F order."""
    dims = shape if order == "F" else shape[::-1]
    strides, step = [], 1
    for d in dims:
        strides.append(step)
        step *= d
    return strides if order == "F" else strides[::-1]


__all__ = ["read_nd4j_array", "read_nd4j_dataset"]
