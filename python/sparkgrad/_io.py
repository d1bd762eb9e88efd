"""Files on any file system Spark can reach: local paths, and URIs through the driver's Hadoop FileSystem.

A plain path (``model.zip``, ``/data/model.zip``, an ``os.PathLike``) is a local file, read and
written with Python's own I/O, with or without Spark. A URI (``hdfs://nn/models/m.zip``,
``s3a://bucket/m.zip``, ``file:///tmp/m.zip``, ``viewfs://...``) goes through the JVM's
``org.apache.hadoop.fs.FileSystem`` of the active SparkContext, so every scheme and credential the
Spark session is configured for works, exactly as for Spark's own reads. The bytes cross py4j in chunks
of :data:`CHUNK_BYTES` in both directions. Without an active SparkContext a ``file:`` URI is still
served locally; any other scheme needs a running Spark session, so it cannot be opened in a Spark task
(an executor's Python has no JVM): data on such file systems reaches the executors through Spark's own
readers (:mod:`sparkgrad.spark.storage`).

Every write replaces its file atomically: the bytes go to a hidden temporary sibling
(``.NAME.sparkgrad-<random>.tmp``), which is then renamed over the target, so a write that fails
leaves the previous file (or no file) under the name, never a partial one. Locally the temporary file
is flushed to disk (``fsync``) and takes the previous file's permission bits before ``os.replace``. A
Hadoop FileSystem has no portable rename that replaces an existing file, so there the previous file is
first renamed to a hidden backup sibling, the new one renamed into place, and the backup deleted; if
the second rename fails the backup is renamed back. The previous data therefore always exists under
the target's name or, had the process died between the two renames, under the backup's.

Model files, DataSet / MultiDataSet files, the training-stats HTML report and saved evaluations use
these functions.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import uuid
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
        "SparkSession on the driver; start one first (or use a local path). In a Spark task (an "
        "executor has no JVM gateway) read such data through Spark instead: SparkMultiLayer.fit(directory), "
        "fit_paths(rdd_of_paths) with the default loader, evaluate(directory), or "
        "sparkgrad.spark.export_minibatches to write it"
    )


def hadoop_error(path: str, exc: Exception) -> Exception:
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


def hadoop_filesystem(sc: Any, path: str) -> tuple[Any, Any]:
    """``(FileSystem, Path)`` of ``path`` in the JVM of ``sc``, with the session's Hadoop configuration.

    A well-formed URI is decoded as one (``file:///a%20b`` is the file ``a b``, as ``Path.as_uri()`` and
    Spark write it); a string that is not one (Hadoop's own ``file:/a b``) is taken as Hadoop's Path
    string.
    """
    from py4j.protocol import Py4JJavaError

    jvm = sc._jvm
    try:
        jpath = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(path))
    except Py4JJavaError:  # java.net.URISyntaxException: raw spaces and the like
        jpath = jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(sc._jsc.hadoopConfiguration()), jpath


def _hadoop_read(sc: Any, path: str) -> bytes:
    from py4j.protocol import Py4JJavaError

    try:
        fs, jpath = hadoop_filesystem(sc, path)
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
        raise hadoop_error(path, exc) from None


def _temporary_sibling(name: str, suffix: str) -> str:
    """A hidden, unique file name beside ``name`` (Hadoop's input formats skip names starting with '.')."""
    return f".{name}.sparkgrad-{uuid.uuid4().hex}.{suffix}"


def _hadoop_write(sc: Any, path: str, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to a temporary sibling, then rename it over ``path`` (see the module docstring)."""
    from py4j.protocol import Py4JJavaError

    view = memoryview(data).cast("B")
    try:
        fs, jpath = hadoop_filesystem(sc, path)
        if fs.exists(jpath) and fs.getFileStatus(jpath).isDirectory():
            raise IsADirectoryError(f"{path}: is a directory, expected a file")
        parent = jpath.getParent()
        new_path = sc._jvm.org.apache.hadoop.fs.Path(parent, _temporary_sibling(jpath.getName(), "tmp"))
        try:
            stream = fs.create(new_path, False)
            try:
                for start in range(0, len(view), CHUNK_BYTES):
                    stream.write(bytes(view[start : start + CHUNK_BYTES]))
            finally:
                stream.close()
            hadoop_replace(sc, fs, new_path, jpath, path)
        except BaseException:
            _hadoop_discard(fs, new_path)  # no temporary file left behind; the target is as it was
            raise
    except Py4JJavaError as exc:
        raise hadoop_error(path, exc) from None


def hadoop_replace(sc: Any, fs: Any, new_path: Any, target: Any, path: str) -> None:
    """Rename ``new_path`` (a JVM Path) to ``target``, replacing an existing file or directory without
    deleting it first: it is moved to a hidden backup sibling, deleted only once ``new_path`` took its
    name, and moved back when that fails. ``path`` names the target in errors."""
    if not fs.exists(target):
        if not fs.rename(new_path, target):
            raise OSError(f"{path}: the file system refused to rename the written file to this name")
        return
    backup = sc._jvm.org.apache.hadoop.fs.Path(
        target.getParent(), _temporary_sibling(target.getName(), "old")
    )
    if not fs.rename(target, backup):
        raise OSError(f"{path}: the file system refused to move the previous file aside; it is unchanged")
    placed = False
    try:
        placed = bool(fs.rename(new_path, target))
    finally:
        if not placed and not fs.rename(backup, target):
            raise OSError(
                f"{path}: the file system refused to rename the written file to this name, and the "
                f"previous file back from {backup.toString()}, where it is kept"
            )
    if not placed:
        raise OSError(
            f"{path}: the file system refused to rename the written file to this name; the previous "
            "file is unchanged"
        )
    fs.delete(backup, True)


def _hadoop_discard(fs: Any, jpath: Any) -> None:
    """Delete a temporary file, best effort: a failure here must not hide the error being raised."""
    from py4j.protocol import Py4JError

    try:
        fs.delete(jpath, False)
    except Py4JError as exc:
        _log.warning("could not delete the temporary file %s: %s", jpath.toString(), exc)


@contextmanager
def _local_replacement(path: str) -> Iterator[BinaryIO]:
    """A file written to a temporary sibling of ``path``, which atomically replaces ``path`` when the
    block exits without error (see the module docstring)."""
    target = os.path.realpath(path)  # a symbolic link keeps pointing at the replaced file
    directory, name = os.path.split(target)
    if os.path.isdir(target):
        raise IsADirectoryError(f"{path}: is a directory, expected a file")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{path}: the directory {directory} does not exist")
    temporary = os.path.join(directory, _temporary_sibling(name, "tmp"))
    try:
        with open(temporary, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):
            shutil.copymode(target, temporary)
        os.replace(temporary, target)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


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
    """Create or replace the file at ``path`` (a local path or a Hadoop URI) with ``data``, atomically:
    a failed write leaves the previous file (see the module docstring).

    Raises:
        EnvironmentNotReadyError: a non-``file:`` URI without an active SparkSession.
        IsADirectoryError: ``path`` is a directory.
        OSError: the file system refused, naming the path.
    """
    kind, where = _route(path)
    if kind == "local":
        with _local_replacement(where) as f:
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
    """A writable binary file for ``path``; the file is replaced, atomically, when the block exits
    without error (an exception leaves the previous file). A local file is written to a temporary
    sibling as the block goes; a Hadoop file's bytes are gathered in memory and written at the end.

    Raises:
        The errors of :func:`write_bytes`.
    """
    kind, where = _route(path)
    if kind == "local":
        with _local_replacement(where) as f:
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
    "hadoop_error",
    "hadoop_filesystem",
    "hadoop_replace",
    "is_uri",
    "open_input",
    "open_output",
    "read_bytes",
    "read_text",
    "write_bytes",
    "write_text",
]
