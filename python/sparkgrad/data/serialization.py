"""Binary file format of :class:`~sparkgrad.data.DataSet` and :class:`~sparkgrad.data.MultiDataSet`.

The format is versioned and documented here, where it is written and read. Every integer is unsigned
and little-endian. A record is a 28-byte header followed by array records.

Header (28 bytes)::

    offset  size  field
    0       8     magic: 89 53 47 44 0D 0A 1A 0A  (b"\\x89SGD\\r\\n\\x1a\\n"; the high byte and the
                  CR LF / ^Z / LF tail detect text-mode transfers, as PNG's magic does)
    8       2     format version, uint16; this release writes and reads version 1 only
    10      1     kind, uint8: 1 = DataSet, 2 = MultiDataSet
    11      1     reserved, must be 0
    12      4     F:  number of features slots, uint32       (DataSet: 1; MultiDataSet: >= 1)
    16      4     L:  number of labels slots, uint32         (DataSet: 1; MultiDataSet: >= 0)
    20      4     FM: number of features-mask slots, uint32  (DataSet: 1; MultiDataSet: 0 or F)
    24      4     LM: number of labels-mask slots, uint32    (DataSet: 1; MultiDataSet: 0 or L)

Then F + L + FM + LM array slots, in this order: features, labels, features masks, labels masks.
A DataSet's slots are features, labels, features_mask, labels_mask. Each slot is::

    offset  size             field
    0       1                presence, uint8: 0 = absent (None; the slot ends here), 1 = present
    1       1                dtype code, uint8 (table below)
    2       1                rank R, uint8, 1 <= R <= 32
    3       1                reserved, must be 0
    4       8 * R            shape, R x uint64
    4 + 8R  prod(shape) * k  the elements in C (row-major) order, little-endian, k bytes each

dtype codes: 1 float32, 2 float64, 3 float16, 4 int8, 5 int16, 6 int32, 7 int64, 8 uint8, 9 uint16,
10 uint32, 11 uint64, 12 bool (one byte, 0 or 1).

Every array's first dimension is the number of examples and agrees across all present arrays; a
DataSet's features slot is always present, and its labels mask only with labels. A file or
``bytes`` object holds exactly one record (any trailing byte is an error); a binary file object is
read from its current position up to the end of one record, so several records can follow each
other in one stream.

Differences from DL4J's ``DataSet.save`` (Java ``DataOutputStream``, big-endian, see
dl4j-reference.md 6.2/6.3): little-endian raw buffers with no per-array type strings, explicit
presence bytes instead of DL4J's ``[-1]`` placeholder for a missing MultiDataSet mask, and no
Java-serialised example metadata.
"""

from __future__ import annotations

import io
import os
import struct
import sys
from typing import BinaryIO, Sequence, Union
from urllib.parse import unquote, urlparse

import numpy as np

from sparkgrad.errors import CorruptDataError

MAGIC = b"\x89SGD\r\n\x1a\n"
VERSION = 1
KIND_DATASET = 1
KIND_MULTIDATASET = 2
KIND_NAMES = {KIND_DATASET: "DataSet", KIND_MULTIDATASET: "MultiDataSet"}
MAX_RANK = 32

_HEADER = struct.Struct("<8sHBB4I")
_SLOT = struct.Struct("<BBBB")
_DTYPE_CODES = {
    np.dtype(name): code
    for code, name in enumerate(
        ("float32", "float64", "float16", "int8", "int16", "int32", "int64")
        + ("uint8", "uint16", "uint32", "uint64", "bool"),
        start=1,
    )
}
_CODE_DTYPES = {code: dtype.newbyteorder("<") for dtype, code in _DTYPE_CODES.items()}
_CHUNK = 1 << 24  # read size when the stream's remaining length is unknown

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]
Groups = tuple  # four tuples (features, labels, features masks, labels masks) of Optional[np.ndarray]


def supported_dtype(dtype: np.dtype) -> bool:
    """True when arrays of ``dtype`` can be stored in the format."""
    return np.dtype(dtype).newbyteorder("=") in _DTYPE_CODES


def supported_dtype_names() -> str:
    """Comma-separated names of the storable dtypes, for error messages."""
    return ", ".join(str(d) for d in _DTYPE_CODES)


# -- writing --------------------------------------------------------------------------------------


def _pieces(kind: int, groups: Groups) -> list:
    """The record as a list of bytes / memoryview pieces; array data is not copied (unless it must
    be made C-contiguous little-endian)."""
    pieces: list = [_HEADER.pack(MAGIC, VERSION, kind, 0, *(len(g) for g in groups))]
    for group in groups:
        for array in group:
            if array is None:
                pieces.append(b"\x00")
                continue
            code = _DTYPE_CODES[array.dtype.newbyteorder("=")]
            data = np.ascontiguousarray(array, dtype=_CODE_DTYPES[code])
            pieces.append(_SLOT.pack(1, code, data.ndim, 0) + struct.pack(f"<{data.ndim}Q", *data.shape))
            if data.size:
                pieces.append(memoryview(data).cast("B"))
    return pieces


def write_record(stream: BinaryIO, kind: int, groups: Groups) -> None:
    """Write one record to a binary stream.

    Args:
        stream: a writable binary file object.
        kind: KIND_DATASET or KIND_MULTIDATASET.
        groups: (features, labels, features masks, labels masks), each a sequence of arrays or None.
    """
    if isinstance(stream, io.TextIOBase):
        raise TypeError("the file object must be opened in binary mode ('wb'), got a text stream")
    for piece in _pieces(kind, groups):
        stream.write(piece)


def save_record(target: PathOrFile, kind: int, groups: Groups) -> None:
    """Write one record to a path (created or truncated) or to a binary file object."""
    if _is_path(target):
        with open(_local_path(target), "wb") as f:
            write_record(f, kind, groups)
    elif hasattr(target, "write"):
        write_record(target, kind, groups)  # type: ignore[arg-type]
    else:
        raise TypeError(
            f"expected a path (str or os.PathLike) or a binary file object, got {type(target).__name__}"
        )


def record_bytes(kind: int, groups: Groups) -> bytes:
    """The record as one ``bytes`` object."""
    return b"".join(_pieces(kind, groups))  # one copy of each array


# -- reading --------------------------------------------------------------------------------------


def load_record(source: PathOrFile, kind: int) -> Groups:
    """Read one record of the given kind from a path or a binary file object.

    Raises:
        CorruptDataError: truncated, foreign, wrong-version or wrong-kind data; names the file.
    """
    if _is_path(source):
        path = _local_path(source)
        with open(path, "rb") as f:
            return _Reader(f, source_name(source), _remaining(f)).read(kind, whole=True)
    if hasattr(source, "read"):
        if isinstance(source, io.TextIOBase):
            raise TypeError("the file object must be opened in binary mode ('rb'), got a text stream")
        reader = _Reader(source, source_name(source), _remaining(source))  # type: ignore[arg-type]
        return reader.read(kind, whole=False)
    raise TypeError(
        f"expected a path (str or os.PathLike) or a binary file object, got {type(source).__name__}"
    )


def parse_bytes(data: bytes | bytearray | memoryview, kind: int, source: str = "<bytes>") -> Groups:
    """Read one record of the given kind from a bytes-like object holding exactly that record."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, bytearray or memoryview, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    return _Reader(_ViewStream(view), source, view.nbytes).read(kind, whole=True)  # type: ignore[arg-type]


class _ViewStream:
    """The read side of a binary stream over a buffer; unlike io.BytesIO it never copies the buffer."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def readinto(self, target: memoryview) -> int:
        n = min(target.nbytes, self._view.nbytes - self._pos)
        target[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, n: int) -> bytes:
        data = self._view[self._pos : self._pos + n].tobytes()
        self._pos += len(data)
        return data


class _Reader:
    """Parses one record from a stream, tracking the offset for error messages."""

    def __init__(self, stream: BinaryIO, source: str, size: int | None) -> None:
        self._stream = stream
        self._source = source
        self._left = size  # bytes left in the stream when known: guards allocations against bad shapes
        self._offset = 0

    def error(self, message: str) -> CorruptDataError:
        return CorruptDataError(f"{self._source}: {message}")

    def truncated(self, what: str, needed: int, available: int) -> CorruptDataError:
        return self.error(
            f"truncated: {what} needs {needed} bytes at offset {self._offset}, only {available} left"
        )

    def read(self, kind: int, whole: bool) -> Groups:
        magic = self._exact(len(MAGIC), "magic bytes")  # checked first: a short foreign file is foreign
        if magic != MAGIC:
            raise self.error(f"not a sparkgrad data file (magic bytes {magic!r}, expected {MAGIC!r})")
        rest = self._exact(_HEADER.size - len(MAGIC), "header")
        _, version, stored_kind, reserved, *counts = _HEADER.unpack(magic + rest)
        if version != VERSION:
            raise self.error(f"unsupported format version {version} (this sparkgrad reads version {VERSION})")
        if stored_kind not in KIND_NAMES or reserved:
            raise self.error(f"corrupt header (kind code {stored_kind}, reserved byte {reserved})")
        if stored_kind != kind:
            raise self.error(f"holds a {KIND_NAMES[stored_kind]}, not a {KIND_NAMES[kind]}")
        self._check_counts(kind, counts)
        groups = tuple(tuple(self._array() for _ in range(count)) for count in counts)
        if whole and self._stream.read(1):
            raise self.error(f"unexpected data after the end of the record at offset {self._offset}")
        return groups

    def _check_counts(self, kind: int, counts: Sequence[int]) -> None:
        n_features, n_labels, n_fmasks, n_lmasks = counts
        if kind == KIND_DATASET:
            valid = tuple(counts) == (1, 1, 1, 1)
        else:
            valid = n_features >= 1 and n_fmasks in (0, n_features) and n_lmasks in (0, n_labels)
        # every slot takes at least one byte, so the counts cannot exceed the bytes left
        if not valid or (self._left is not None and sum(counts) > self._left - self._offset):
            raise self.error(f"corrupt header (array counts {tuple(counts)})")

    def _array(self) -> np.ndarray | None:
        if self._exact(1, "array presence byte") == b"\x00":
            return None
        code, rank, reserved = self._exact(3, "array header")
        dtype = _CODE_DTYPES.get(code)
        if dtype is None or not 1 <= rank <= MAX_RANK or reserved:
            raise self.error(f"corrupt array header at offset {self._offset - 4} (dtype {code}, rank {rank})")
        shape = struct.unpack(f"<{rank}Q", self._exact(8 * rank, "array shape"))
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=object))
        what = f"{dtype.name} array of shape {shape}"
        if self._left is not None and nbytes > self._left - self._offset:
            raise self.truncated(what, nbytes, self._left - self._offset)
        try:
            if self._left is None:
                array = np.frombuffer(self._chunked(nbytes, what), dtype=dtype).reshape(shape)
            else:
                array = np.empty(shape, dtype=dtype)
                if nbytes:
                    self._into(memoryview(array).cast("B"), what)
        except (ValueError, OverflowError, MemoryError) as exc:  # dimensions numpy cannot represent
            raise self.error(f"corrupt array shape {shape} at offset {self._offset}: {exc}") from None
        return array if sys.byteorder == "little" else array.astype(dtype.newbyteorder("="))

    def _exact(self, n: int, what: str) -> bytes:
        data = bytearray(n)
        self._into(memoryview(data), what)
        return bytes(data)

    def _into(self, target: memoryview, what: str) -> None:
        """Fill ``target`` from the stream (readinto: the bytes land in place, no intermediate copy)."""
        readinto = getattr(self._stream, "readinto", None) or self._readinto_fallback
        done = 0
        while done < target.nbytes:
            got = readinto(target[done:])
            if not got:
                raise self.truncated(what, target.nbytes, done)
            done += got
        self._offset += done

    def _readinto_fallback(self, target: memoryview) -> int:
        """readinto for file-like objects that only implement read()."""
        data = self._stream.read(min(_CHUNK, target.nbytes))
        target[: len(data)] = data
        return len(data)

    def _chunked(self, n: int, what: str) -> bytearray:
        """Read ``n`` bytes from a stream of unknown length without trusting ``n`` for one allocation."""
        data = bytearray()
        while len(data) < n:
            chunk = self._stream.read(min(_CHUNK, n - len(data)))
            if not chunk:
                raise self.truncated(what, n, len(data))
            data += chunk
        self._offset += n
        return data


def source_name(source: PathOrFile) -> str:
    """How error messages name a path or file object: the path, the file's name, or its type."""
    name = source if _is_path(source) else getattr(source, "name", None)
    return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else f"<{type(source).__name__}>"


def _remaining(stream: BinaryIO) -> int | None:
    """Bytes from the current position to the end when the stream can tell, else None."""
    try:
        if not stream.seekable():
            return None
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(here)
    except (OSError, AttributeError, ValueError):
        return None
    return end - here


def _is_path(target: object) -> bool:
    return isinstance(target, (str, os.PathLike))


def _local_path(target: str | os.PathLike) -> str:
    """A local file path; accepts ``file:`` URIs as Spark writes them, rejects other schemes."""
    path = os.fspath(target)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    url = urlparse(path)
    if url.scheme == "file":
        return unquote(url.path)  # Spark's URIs percent-encode spaces and the like
    if len(url.scheme) > 1:  # one letter is a Windows drive
        raise ValueError(
            f"{path}: only local paths and file: URIs can be opened directly; for {url.scheme}: data "
            "read the bytes through Spark (sc.binaryFiles) and use from_bytes / the loader's load_bytes"
        )
    return path
