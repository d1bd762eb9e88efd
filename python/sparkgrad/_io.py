"""Files on any file system Spark can reach: local paths, and URIs through the driver's Hadoop FileSystem.

A plain path (``model.zip``, ``/data/model.zip``, an ``os.PathLike``) is a local file, read and
written with Python's own I/O, with or without Spark. A URI (``hdfs://nn/models/m.zip``,
``s3a://bucket/m.zip``, ``file:///tmp/m.zip``, ``viewfs://...``) goes through the JVM's
``org.apache.hadoop.fs.FileSystem`` of the active SparkContext, so every scheme and credential the
Spark session is configured for works, exactly as for Spark's own reads. The bytes cross py4j in chunks
of :data:`CHUNK_BYTES` in both directions. Without an active SparkContext a ``file:`` URI is still
served locally; any other scheme needs a running Spark session.

Model files, the training-stats HTML report and saved evaluations use these functions.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, Union
from urllib.parse import unquote, urlparse

from sparkgrad.errors import CorruptDataError, EnvironmentNotReadyError

_log = logging.getLogger(__name__)
PathLike = Union[str, "os.PathLike[str]"]

# bytes per py4j call: large enough that the per-call overhead vanishes, small enough for the gateway
CHUNK_BYTES = 4 << 20
# a scheme of two or more characters: "C:\\model.zip" stays a local Windows path
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")


def is_uri(path: Any) -> bool:
    """Whether ``path`` is a URI with a scheme (``hdfs://``, ``s3a://``, ``file:``...), not a plain path."""
    return isinstance(path, str) and _URI.match(path) is not None


def _spark_context() -> Any:
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    return SparkContext._active_spark_context


def _local_file_uri(uri: str) -> str:
    """The local path of a ``file:`` URI (``file:///a/b``, ``file:/a/b``, ``file://localhost/a/b``)."""
    parts = urlparse(uri)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"path: {uri!r} names the host {parts.netloc!r}; a file: URI must be local")
    return unquote(parts.path)


def _route(path: PathLike) -> tuple[str, Any]:
    """("local", local path) or ("hadoop", SparkContext) for ``path``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    if not is_uri(path):
        return "local", os.fspath(path)
    sc = _spark_context()
    if sc is not None:
        return "hadoop", sc
    if str(path).lower().startswith("file:"):
        return "local", _local_file_uri(str(path))
    raise EnvironmentNotReadyError(
        f"{path}: this URI is opened through Spark's Hadoop FileSystem, which needs an active "
        "SparkSession on the driver; start one first (or use a local path)"
    )


def _hadoop_error(path: str, exc: Exception) -> Exception:
    """A Python exception for a Java one, keeping only the Java class and message (not the JVM trace)."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return exc
    _log.debug("Hadoop FileSystem failure on %s", path, exc_info=exc)
    name = java.getClass().getName()
    message = f"{path}: {name}: {java.getMessage()}"
    if name.endswith("FileNotFoundException"):
        return FileNotFoundError(message)
    if name.endswith("ChecksumException"):
        return CorruptDataError(message)
    return OSError(message)


def _filesystem(sc: Any, path: str) -> tuple[Any, Any]:
    jpath = sc._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(sc._jsc.hadoopConfiguration()), jpath


def _hadoop_read(sc: Any, path: str) -> bytes:
    from py4j.protocol import Py4JJavaError

    try:
        fs, jpath = _filesystem(sc, path)
        if fs.getFileStatus(jpath).isDirectory():
            raise IsADirectoryError(f"{path}: is a directory, expected a file")
        stream = fs.open(jpath)
        try:
            data = bytearray()
            while True:
                # InputStream.readNBytes (Java 11+): a byte[] return value crosses py4j as Python bytes,
                # shorter than asked only at the end of the file
                chunk = stream.readNBytes(CHUNK_BYTES)
                data += chunk
                if len(chunk) < CHUNK_BYTES:
                    return bytes(data)
        finally:
            stream.close()
    except Py4JJavaError as exc:
        raise _hadoop_error(path, exc) from None


def _hadoop_write(sc: Any, path: str, data: bytes | bytearray | memoryview) -> None:
    from py4j.protocol import Py4JJavaError

    view = memoryview(data).cast("B")
    try:
        fs, jpath = _filesystem(sc, path)
        stream = fs.create(jpath, True)
        try:
            for start in range(0, len(view), CHUNK_BYTES):
                stream.write(bytes(view[start : start + CHUNK_BYTES]))
        except BaseException:
            stream.close()
            fs.delete(jpath, False)  # no half-written file left behind to be read as a whole one
            raise
        stream.close()
    except Py4JJavaError as exc:
        raise _hadoop_error(path, exc) from None


def read_bytes(path: PathLike) -> bytes:
    """The whole content of the file at ``path`` (a local path or a Hadoop URI).

    Raises:
        FileNotFoundError: no such file.
        CorruptDataError: the file system's checksum of the file does not match (Hadoop ``.crc``).
        EnvironmentNotReadyError: a non-``file:`` URI without an active SparkSession.
        OSError: any other file-system failure, naming the path.
    """
    kind, where = _route(path)
    if kind == "local":
        with open(where, "rb") as f:
            return f.read()
    return _hadoop_read(where, str(path))


def write_bytes(path: PathLike, data: bytes | bytearray | memoryview) -> None:
    """Create or overwrite the file at ``path`` (a local path or a Hadoop URI) with ``data``.

    Raises:
        EnvironmentNotReadyError: a non-``file:`` URI without an active SparkSession.
        OSError: the file system refused, naming the path.
    """
    kind, where = _route(path)
    if kind == "local":
        with open(where, "wb") as f:
            f.write(data)
        return
    _hadoop_write(where, str(path), data)


def open_input(path: PathLike) -> BinaryIO:
    """A readable, seekable binary file for ``path`` (the caller closes it): the local file, or a Hadoop
    file's bytes in memory.

    Raises:
        The errors of :func:`read_bytes`.
    """
    kind, where = _route(path)
    if kind == "local":
        return open(where, "rb")
    return io.BytesIO(_hadoop_read(where, str(path)))


@contextmanager
def open_output(path: PathLike) -> Iterator[BinaryIO]:
    """A writable binary file for ``path``; a Hadoop file is written when the block exits without error."""
    kind, where = _route(path)
    if kind == "local":
        with open(where, "wb") as f:
            yield f
        return
    buffer = io.BytesIO()
    yield buffer
    _hadoop_write(where, str(path), buffer.getbuffer())


def read_text(path: PathLike) -> str:
    """The UTF-8 text of the file at ``path`` (see :func:`read_bytes`)."""
    return read_bytes(path).decode("utf-8")


def write_text(path: PathLike, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` (see :func:`write_bytes`)."""
    write_bytes(path, text.encode("utf-8"))


__all__ = [
    "CHUNK_BYTES",
    "is_uri",
    "open_input",
    "open_output",
    "read_bytes",
    "read_text",
    "write_bytes",
    "write_text",
]
