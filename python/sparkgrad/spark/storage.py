"""Training data on any file system Spark reads: export minibatches once, then fit and evaluate from them.

DL4J's "prepare once" step: :func:`export_minibatches` turns an RDD of DataSets / MultiDataSets, or a
DataFrame, into a directory of minibatches of a chosen size, written by Spark's own Hadoop output on the
executors, so every scheme the cluster's Spark reads works (``hdfs://``, ``s3a://``, ``abfs://``,
``gs://``, ``file:``, ``viewfs://``...) with the cluster's own configuration and credentials.
``SparkMultiLayer.fit(directory)``, ``evaluate(directory)`` and the ComputationGraph equivalents read
such a directory, or one of files written by ``DataSet.save``, through :func:`read_saved`; ``fit_paths``
with the default loader reads the files its paths name through Spark's ``binaryFile`` source. Executors'
Python processes have no JVM, so they never open such URIs themselves.

Layout of an export directory::

    DIRECTORY/
      _SUCCESS                  Spark's output committer: every task's output is in place
      _sparkgrad_export.json    the manifest (below), written once the job has committed
      part-00000                a Hadoop SequenceFile per partition of the data: (Text name,
      part-00001                BytesWritable record) pairs; a record is one minibatch in the format
      ...                       of sparkgrad.data.serialization (DataSet.to_bytes)

A record's name is ``part-NNNNN#i``: the i-th minibatch (from 0) of part file NNNNN. Spark's commit
makes the part files appear together or not at all; a job that fails leaves no directory behind.

The manifest is UTF-8 JSON: ``{"format": "sparkgrad-minibatches", "version": 1, "batch_size": B,
"minibatches": n, "examples": m, "files": {"part-00000": length in bytes, ...}}``. :func:`read_saved`
checks it on the driver before any training: a part file missing, of another length (truncated or
replaced) or not listed raises :class:`~sparkgrad.errors.CorruptDataError` naming the file. Each record
carries its own CRC-32, checked when it is loaded. A directory of SequenceFiles without a manifest
(written by another Spark job) is read when it holds Spark's ``_SUCCESS`` marker.

Names starting with ``_`` or ``.`` are hidden: Hadoop's input formats skip them, which is why the
manifest, the marker and the temporary files of atomic writes are named so.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from sparkgrad._config import check_int
from sparkgrad._io import hadoop_error, hadoop_filesystem, hadoop_replace, read_bytes, write_bytes
from sparkgrad.data import SerializedDataSetLoader, SerializedMultiDataSetLoader, rebatch
from sparkgrad.errors import CorruptDataError
from sparkgrad.spark.columns import dataframe_datasets, is_dataframe
from sparkgrad.spark.common import hadoop_delete, run_spark, spark_context

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.sql import DataFrame

MANIFEST = "_sparkgrad_export.json"
FORMAT = "sparkgrad-minibatches"
FORMAT_VERSION = 1
SUCCESS_MARKER = "_SUCCESS"
_SEQUENCE_FILE_MAGIC = b"SEQ"
_HEADER_BYTES = 512  # enough for a SequenceFile's version and key / value class names
_RECORD_CLASSES = ("org.apache.hadoop.io.Text", "org.apache.hadoop.io.BytesWritable")
# Hadoop glob syntax: these characters are special in the paths Spark's readers take (a backslash escapes)
_GLOB_CHARACTERS = frozenset("\\*?[]{}")


def export_minibatches(
    data: RDD | DataFrame,
    directory: str,
    *,
    batch_size: int,
    network: Any = None,
    features_col: str = "features",
    label_col: str = "label",
    overwrite: bool = False,
) -> int:
    """Write ``data`` to ``directory`` as minibatches of ``batch_size`` examples (DL4J's export step).

    Each partition is re-batched in order into minibatches of exactly ``batch_size`` examples (the last
    one of a partition may be smaller) and written by Spark's Hadoop output on the executors, one
    SequenceFile per partition (the layout is in the module docstring). The directory then trains with
    ``fit(directory)`` (``fit_multi_data_set`` for MultiDataSets) and evaluates with
    ``evaluate(directory)``, on any cluster that can read it, as often as needed. With
    ``batch_size`` equal to the training master's ``batch_size_per_worker`` the workers use the
    minibatches as they are.

    Args:
        data: an RDD of DataSets or of MultiDataSets, or a DataFrame (converted as
            ``SparkMultiLayer.fit(df)`` converts it, which needs ``network``).
        directory: where to write: a URI (``hdfs://nn/data/train``, ``s3a://bucket/train``,
            ``file:///data/train``) or a path, resolved as Spark resolves it (against the cluster's
            default file system). It must not contain glob characters (``*?[]{}\\``) or commas, which
            Spark's readers would interpret when reading it back.
        batch_size: examples per minibatch, a positive int.
        network: with a DataFrame, the network (MultiLayerNetwork or ComputationGraph with one input
            and one output) or its configuration, which fixes the features' shape and the labels.
        features_col: with a DataFrame, its features column (a Vector or an array of numbers).
        label_col: with a DataFrame, its label column (class indices, or one value per output).
        overwrite: replace an existing non-empty ``directory``. Its content is replaced only once the
            new export is complete (written beside it, then renamed into place), so a failed export
            leaves it as it was.

    Returns:
        The number of minibatches written.

    Raises:
        TypeError / ValueError: bad arguments (named), or a ``directory`` that is a file.
        FileExistsError: ``directory`` exists and is not empty, and ``overwrite`` is False.
        TrainingError: the Spark job failed (the executor's error first); nothing is left at
            ``directory`` (or its previous content is).
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite: expected a bool, got {type(overwrite).__name__}")
    rdd = _examples_rdd(data, network, features_col, label_col, batch_size)
    sc = rdd.context
    target = _output_directory(sc, directory)
    fs, jtarget = hadoop_filesystem(sc, target)
    replacing = _check_target(fs, jtarget, directory, overwrite)
    written = target
    if replacing:  # beside the old content, which stays until the new export is complete
        written = f"{jtarget.getParent().toString()}/.{jtarget.getName()}.sparkgrad-{uuid.uuid4().hex}.tmp"
    minibatches, examples = sc.accumulator(0), sc.accumulator(0)

    def export_partition(index: int, it: Iterable[Any]) -> Iterator[tuple[str, bytearray]]:
        for i, batch in enumerate(rebatch(it, batch_size)):
            minibatches.add(1)
            examples.add(batch.num_examples())
            yield f"part-{index:05d}#{i}", bytearray(batch.to_bytes())

    try:
        run_spark("export", lambda: _save(rdd.mapPartitionsWithIndex(export_partition), written))
        count = int(minibatches.value)
        _write_manifest(sc, written, batch_size, count, int(examples.value))
        if replacing:
            _, jwritten = hadoop_filesystem(sc, written)
            hadoop_replace(sc, fs, jwritten, jtarget, target)
    except BaseException:
        hadoop_delete(sc, written)  # all or nothing: a new directory, or the temporary one beside the old
        raise
    return count


def read_saved(spark: Any, path: str) -> RDD:
    """The saved minibatches under ``path`` as an RDD of ``(name, bytes)`` pairs, read by Spark.

    ``path`` is either an export of :func:`export_minibatches` (SequenceFiles) or files each written
    by ``DataSet.save`` / ``MultiDataSet.save``: a directory of them, a glob or one file. The kind is
    told on the driver through the Hadoop FileSystem, from the first bytes of the first data file
    (a SequenceFile starts with ``SEQ``), and an export is checked against its manifest (module
    docstring), all before any Spark job. Turn the pairs into objects with
    ``SerializedDataSetLoader()`` (``loader(pair)`` or ``loader.load_bytes(data, source=name)``).

    Args:
        spark: SparkSession or SparkContext.
        path: a directory, file or glob pattern in Hadoop's syntax, as ``sc.binaryFiles`` takes it
            (a URI, or a path on the cluster's default file system; commas outside ``{}`` separate
            several). A backslash escapes a glob character in a name.

    Returns:
        RDD of ``(name, bytes)``: for files, the file's URI; for an export's records,
        ``PATH/part-NNNNN#i``. Error messages of the loaders name the same.

    Raises:
        FileNotFoundError: nothing matches ``path`` (names the pattern).
        ValueError: no data files (an empty directory, one holding only hidden files or only
            directories), an export that never completed (no ``_SUCCESS`` marker and no manifest),
            an export with no minibatches, a SequenceFile of other record types, or exports mixed
            with saved files.
        CorruptDataError: an export's part file is missing, truncated or replaced, or its manifest
            is damaged (names the file).
    """
    sc = spark_context(spark)
    if not isinstance(path, str):
        raise TypeError(f"path: expected a str, got {type(path).__name__}")
    if path.strip() == "":
        raise ValueError("path: is empty")
    patterns = _split_paths(path)
    kinds = {_saved_kind(sc, pattern, path) for pattern in patterns}
    if len(kinds) > 1:
        raise ValueError(f"{path}: mixes an export of export_minibatches with files written by save")
    if kinds == {"files"}:
        return sc.binaryFiles(path)
    prefix = path.rstrip("/")
    return sc.sequenceFile(path).map(lambda kv: (f"{prefix}/{kv[0]}", kv[1]))


def reads_through_spark(loader: Any) -> bool:
    """Whether ``loader`` is one of the default loaders, whose files Spark reads for the executors."""
    return type(loader) in (SerializedDataSetLoader, SerializedMultiDataSetLoader)


def read_files(sc: SparkContext, paths: RDD, what: str) -> tuple[str, RDD]:
    """The files an RDD of path strings names, read by Spark's ``binaryFile`` source on the executors
    (each path taken literally: glob characters and commas in names are no pattern).

    Args:
        sc: the SparkContext.
        paths: RDD of path strings (URIs, or paths on the cluster's default file system); collected on
            the driver.
        what: the argument's name for messages.

    Returns:
        ``(the first path as a URI, qualified as Spark resolves it; RDD of (file URI, bytes))``.

    Raises:
        ValueError: no paths, or a name Hadoop's readers skip (starting with ``_`` or ``.``).
        TypeError: an element that is not a str.
        FileNotFoundError: a path that does not exist (names it), before any training.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import SparkSession

    names = run_spark(f"reading {what}", paths.collect)
    if not names:
        raise ValueError(f"{what}: the RDD is empty, there is nothing to read")
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(
                f"{what}: expected an RDD of path strings, element {i} is a {type(name).__name__}"
            )
        base = name.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(("_", ".")):
            raise ValueError(
                f"{what}: {name}: Spark's file readers skip names starting with '_' or '.'; rename the "
                "file, or pass a loader of your own (it gets the path)"
            )
    session = SparkSession.builder.getOrCreate()  # the one of ``sc``
    try:
        frame = session.read.format("binaryFile").load([_escape_glob(name) for name in names])
    except AnalysisException as exc:
        if exc.getCondition() == "PATH_NOT_FOUND":
            raise FileNotFoundError(f"{what}: {str(exc).splitlines()[0]}") from None
        raise
    fs, first = hadoop_filesystem(sc, names[0])
    return str(fs.makeQualified(first).toString()), frame.select("path", "content").rdd.map(tuple)


# -- export helpers --------------------------------------------------------------------------------------
# causes of a Java exception quoted at most: the task's own error is within a few
_MAX_CAUSES = 16


def _save(rdd: RDD, directory: str) -> None:
    """Write ``(name, bytearray)`` pairs to ``directory`` as SequenceFiles of (Text, BytesWritable),
    failing as a job of Python tasks fails.

    The classes are named, not inferred: inferring them (``saveAsSequenceFile``) runs a job reading the
    first record and fails on empty data. Spark's Hadoop writer reports a failed job as
    ``SparkException: Job aborted.`` and keeps the task's error (the executor's Python exception) only
    among its causes, where :func:`run_spark` does not look; the causes' messages are handed to it as
    the PythonException a Python job raises.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PythonException

    try:
        rdd.saveAsHadoopFile(
            directory,
            "org.apache.hadoop.mapred.SequenceFileOutputFormat",
            keyClass=_RECORD_CLASSES[0],
            valueClass=_RECORD_CLASSES[1],
        )
    except Py4JJavaError as exc:
        causes: list[str] = []
        throwable = exc.java_exception
        while throwable is not None and len(causes) < _MAX_CAUSES:
            causes.append(str(throwable.toString()))
            throwable = throwable.getCause()
        raise PythonException(message="\n".join(causes)) from None


def _examples_rdd(data: Any, network: Any, features_col: str, label_col: str, batch_size: int) -> RDD:
    """The RDD of DataSets / MultiDataSets to export."""
    from pyspark import RDD

    if is_dataframe(data):
        if network is None:
            raise ValueError(
                "network: a DataFrame is converted for a network: pass network=the network or its "
                "configuration"
            )
        conf = getattr(network, "conf", network)
        from sparkgrad.nn import ComputationGraphConfiguration, MultiLayerConfiguration

        if not isinstance(conf, (MultiLayerConfiguration, ComputationGraphConfiguration)):
            raise TypeError(
                "network: expected a MultiLayerNetwork, a ComputationGraph or the configuration of "
                f"one, got {type(network).__name__}"
            )
        return dataframe_datasets(data, features_col, label_col, conf, batch_size)
    if not isinstance(data, RDD):
        raise TypeError(
            f"data: expected an RDD of DataSets / MultiDataSets or a DataFrame, got {type(data).__name__}"
        )
    if network is not None:
        raise ValueError("network: only a DataFrame needs one (an RDD holds DataSets already)")
    return data


def _output_directory(sc: SparkContext, directory: Any) -> str:
    """``directory`` qualified against its file system (what Spark's writers resolve it to)."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory: expected a str, got {type(directory).__name__}")
    directory = os.fspath(directory)
    if not isinstance(directory, str) or directory.strip() == "":
        raise ValueError(f"directory: expected a non-empty path, got {directory!r}")
    special = sorted(set(directory) & (_GLOB_CHARACTERS | {","}))
    if special:
        raise ValueError(
            f"directory: {directory!r} contains {', '.join(map(repr, special))}: Spark's readers take "
            "paths as glob patterns and comma-separated lists, so the export could not be read back "
            "under this name; choose another"
        )
    fs, jpath = hadoop_filesystem(sc, directory)
    qualified = fs.makeQualified(jpath)
    if qualified.isRoot():
        raise ValueError(f"directory: {directory} is the root of its file system; name a directory in it")
    return str(qualified.toString())


def _check_target(fs: Any, jtarget: Any, directory: str, overwrite: bool) -> bool:
    """Whether ``directory`` exists (and may be replaced); refuses what must not be replaced."""
    if not fs.exists(jtarget):
        return False
    if not fs.getFileStatus(jtarget).isDirectory():
        raise ValueError(f"directory: {directory} is a file; export_minibatches writes a directory")
    if fs.listStatusIterator(jtarget).hasNext() and not overwrite:
        raise FileExistsError(
            f"directory: {directory} exists and is not empty; pass overwrite=True to replace it (its "
            "content is replaced only once the new export is complete)"
        )
    return True


def _write_manifest(
    sc: SparkContext, directory: str, batch_size: int, minibatches: int, examples: int
) -> None:
    """The manifest of a committed export: its part files and their lengths (module docstring)."""
    fs, jdirectory = hadoop_filesystem(sc, directory)
    files = {
        str(status.getPath().getName()): int(status.getLen())
        for status in fs.listStatus(jdirectory)
        if status.isFile() and not _hidden(str(status.getPath().getName()))
    }
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "batch_size": batch_size,
        "minibatches": minibatches,
        "examples": examples,
        "files": dict(sorted(files.items())),
    }
    write_bytes(f"{directory}/{MANIFEST}", json.dumps(manifest, indent=1).encode("utf-8"))


# -- read helpers ----------------------------------------------------------------------------------------
def _hidden(name: str) -> bool:
    """Hadoop's FileInputFormat skips these names (its hiddenFileFilter)."""
    return name.startswith(("_", "."))


def _escape_glob(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped, so that a reader takes it literally."""
    return "".join("\\" + ch if ch in _GLOB_CHARACTERS else ch for ch in path)


def _split_paths(path: str) -> list[str]:
    """The paths of a comma-separated list as Hadoop's FileInputFormat splits it (not inside ``{}``)."""
    parts, start, curly, in_glob = [], 0, 0, False
    for i, ch in enumerate(path):
        if ch == "{":
            curly += 1
            in_glob = True
        elif ch == "}":
            curly -= 1
            in_glob = in_glob and curly != 0
        elif ch == "," and not in_glob:
            parts.append(path[start:i])
            start = i + 1
    parts.append(path[start:])
    if any(part.strip() == "" for part in parts):
        raise ValueError(f"path: {path!r} holds an empty path between commas")
    return parts


def _saved_kind(sc: SparkContext, pattern: str, path: str) -> str:
    """``"export"`` or ``"files"``: what ``pattern`` (one path of ``path``) holds, checked as
    :func:`read_saved` says."""
    from py4j.protocol import Py4JJavaError

    where = pattern if pattern == path else f"{pattern} (of {path})"
    try:
        fs, jpattern = hadoop_filesystem(sc, pattern)
        matches = fs.globStatus(jpattern)
        if matches is None or len(matches) == 0:
            raise FileNotFoundError(f"{where}: no such file or directory")
        first = _first_data_file(fs, matches, where)
        head = _head(fs, first)
        if not head.startswith(_SEQUENCE_FILE_MAGIC):
            return "files"
        _check_record_classes(head, str(first.toString()))
        for status in matches:
            if status.isDirectory():
                _check_export(sc, fs, status.getPath())
        return "export"
    except Py4JJavaError as exc:
        raise hadoop_error(where, exc) from None


def _first_data_file(fs: Any, matches: Any, where: str) -> Any:
    """The first file, in listing order, that Spark's readers would read; ValueError when none."""
    found_directory = found_temporary = False
    for status in matches:
        if not status.isDirectory():
            if not _hidden(str(status.getPath().getName())):
                return status.getPath()
            continue
        listing = fs.listStatusIterator(status.getPath())
        while listing.hasNext():
            child = listing.next()
            name = str(child.getPath().getName())
            if name == "_temporary":
                found_temporary = True
            elif child.isDirectory():
                found_directory = found_directory or not _hidden(name)
            elif not _hidden(name):
                return child.getPath()
    if found_temporary:
        raise ValueError(
            f"{where}: holds no data files, only Spark's _temporary directory: an export whose job "
            "failed or is still running"
        )
    if found_directory:
        raise ValueError(
            f"{where}: holds directories but no files; name one directory, or a glob such as DIR/* to "
            "read several"
        )
    raise ValueError(f"{where}: holds no data files (it is empty, or every name starts with '_' or '.')")


def _head(fs: Any, jpath: Any) -> bytes:
    stream = fs.open(jpath)
    try:
        return bytes(stream.readNBytes(_HEADER_BYTES))
    finally:
        stream.close()


def _check_record_classes(head: bytes, name: str) -> None:
    """A SequenceFile header names its key and value classes (Hadoop's Text.writeString, a VInt length
    and UTF-8): an export's are Text and BytesWritable."""
    classes = []
    offset = 4  # "SEQ" and the version byte
    try:
        for _ in range(2):
            length, offset = _read_vint(head, offset)
            classes.append(head[offset : offset + length].decode("utf-8"))
            offset += length
    except (IndexError, UnicodeDecodeError):
        raise CorruptDataError(f"{name}: a damaged SequenceFile header") from None
    if tuple(classes) != _RECORD_CLASSES:
        raise ValueError(
            f"{name}: a SequenceFile of ({', '.join(classes)}) pairs, not an export of "
            "export_minibatches (Text names and BytesWritable records)"
        )


def _read_vint(data: bytes, offset: int) -> tuple[int, int]:
    """Hadoop's WritableUtils.readVInt at ``offset``: ``(value, offset after it)``."""
    if offset >= len(data):
        raise IndexError(offset)
    first = int.from_bytes(data[offset : offset + 1], "big", signed=True)
    if first >= -112:
        return first, offset + 1
    negative = first < -120
    size = (-119 - first) if negative else (-111 - first)
    if offset + size > len(data):
        raise IndexError(offset)
    value = int.from_bytes(data[offset + 1 : offset + size], "big")
    return (~value if negative else value), offset + size


def _check_export(sc: SparkContext, fs: Any, jdirectory: Any) -> None:
    """An export directory is complete and holds the part files its manifest lists, each of the
    length written."""
    jvm: Any = sc._jvm
    directory = str(jdirectory.toString())
    manifest_path = f"{directory}/{MANIFEST}"
    if not fs.exists(jvm.org.apache.hadoop.fs.Path(jdirectory, MANIFEST)):
        if not fs.exists(jvm.org.apache.hadoop.fs.Path(jdirectory, SUCCESS_MARKER)):
            raise ValueError(
                f"{directory}: an incomplete export: no {SUCCESS_MARKER} marker and no {MANIFEST} (the job "
                "that wrote it failed or is still running); export the data again"
            )
        return  # SequenceFiles another Spark job committed: their records are checked when loaded
    manifest = _manifest(read_bytes(manifest_path), manifest_path)
    if manifest["minibatches"] == 0:
        raise ValueError(f"{directory}: the export holds no minibatches (the exported data was empty)")
    found = {
        str(status.getPath().getName()): int(status.getLen())
        for status in fs.listStatus(jdirectory)
        if status.isFile() and not _hidden(str(status.getPath().getName()))
    }
    for name, length in manifest["files"].items():
        if name not in found:
            raise CorruptDataError(f"{directory}/{name}: missing; the export wrote it ({length} bytes)")
        if found[name] != length:
            raise CorruptDataError(
                f"{directory}/{name}: {found[name]} bytes, the export wrote {length}: the file was "
                "truncated or replaced"
            )
    for name in sorted(found.keys() - manifest["files"].keys()):
        raise CorruptDataError(
            f"{directory}/{name}: not written by the export ({MANIFEST} lists {len(manifest['files'])} "
            "part files); remove it or export again"
        )


def _manifest(data: bytes, name: str) -> dict[str, Any]:
    """The parsed manifest; CorruptDataError naming it when it is not one this release reads."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptDataError(f"{name}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptDataError(f"{name}: not a manifest of export_minibatches")
    if manifest.get("version") != FORMAT_VERSION:
        raise CorruptDataError(
            f"{name}: manifest version {manifest.get('version')!r}, this sparkgrad reads version "
            f"{FORMAT_VERSION}"
        )
    files = manifest.get("files")
    count = manifest.get("minibatches")
    if (
        not isinstance(files, dict)
        or not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in files.items())
        or not isinstance(count, int)
        or count < 0
    ):
        raise CorruptDataError(f"{name}: a damaged manifest (files or minibatches)")
    return manifest


__all__ = ["export_minibatches", "read_saved"]
