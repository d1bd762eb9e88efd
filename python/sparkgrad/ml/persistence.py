"""Saving and loading the sparkgrad pyspark.ml models on any Hadoop path, the way Spark ML models are.

A saved model is a directory (local, ``file:``, ``hdfs:``, ``s3a:``, ... anything Spark writes)::

    <path>/metadata/   one text file: Spark ML's params metadata (DefaultParamsWriter): the class, uid,
                       Spark version, every param (the network configuration and training master as
                       JSON), under "sparkgradFormat" the version of this layout (2) and under
                       "sparkgradNetwork" the network type ("MultiLayerNetwork" or "ComputationGraph")
    <path>/data/       a Parquet dataset of exactly one row: format (string, "sparkgrad-network") and
                       network (binary, the zip that the network's save writes, see
                       sparkgrad.nn.serialization)

Version 1 (before ComputationGraph models) had no "sparkgradNetwork": its network is a
MultiLayerNetwork. This release writes version 2 and reads both.

Both are written and read through Spark's own data sources (text and Parquet), so every file system
Spark reaches works. Loading checks everything it reads: the class, layout version and network type in
the metadata, that the params parse, the data's schema and row count, the network file (whose reader
checks its zip, CRCs, sizes and arrays, and that it holds the recorded network type), and that the
network's configuration is the one in the metadata; any failure raises
:class:`~sparkgrad.errors.CorruptDataError` naming the path.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from sparkgrad.errors import CorruptDataError

if TYPE_CHECKING:
    from sparkgrad.nn._flat_network import FlatNetwork

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
DATA_FORMAT = "sparkgrad-network"
_VERSION_KEY = "sparkgradFormat"
_NETWORK_KEY = "sparkgradNetwork"
# the network type of a version 1 directory, which did not record it
_VERSION_1_NETWORK = "MultiLayerNetwork"


def _hadoop_exists(spark: Any, path: str) -> bool:
    from sparkgrad.spark.connect import is_connect

    if is_connect(spark):  # no JVM on a Connect client: ask Spark's file source
        from pyspark.errors import AnalysisException

        try:
            files = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(path)
            files.select("path").limit(1).collect()
        except AnalysisException as exc:
            if "PATH_NOT_FOUND" in str(exc):
                return False
            raise
        return True
    jvm = spark.sparkContext._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    return bool(jpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(jpath))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ModelWriter(MLWriter):
    """Writes a sparkgrad model: params metadata, then the network as one Parquet row."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        spark = self.sparkSession
        if not self.shouldOverwrite and _hadoop_exists(spark, path):
            raise FileExistsError(f"{path}: exists already; use model.write().overwrite().save(path)")
        network = self.instance.network
        extra = {_VERSION_KEY: FORMAT_VERSION, _NETWORK_KEY: type(network).__name__}
        DefaultParamsWriter.saveMetadata(self.instance, path, spark, extraMetadata=extra)
        buffer = io.BytesIO()
        network.save(buffer)
        row = (DATA_FORMAT, bytearray(buffer.getvalue()))
        frame = spark.createDataFrame([row], schema="format string, network binary")
        frame.coalesce(1).write.parquet(os.path.join(path, "data"))


class ModelReader(MLReader):
    """Reads a model written by :class:`ModelWriter` into an instance of ``cls``, checking every part."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        """Load the model saved at ``path``.

        Raises:
            FileNotFoundError: nothing is saved at ``path``.
            CorruptDataError: a damaged or foreign directory (names the path and the part).
        """
        from pyspark.errors import AnalysisException

        spark = self.sparkSession
        if not _hadoop_exists(spark, path):
            raise FileNotFoundError(f"{path}: no saved model there")
        try:
            metadata = DefaultParamsReader.loadMetadata(path, spark)
        except (AnalysisException, ValueError, TypeError, KeyError) as exc:
            raise CorruptDataError(f"{path}/metadata: not Spark ML metadata: {_first_line(exc)}") from None
        instance = self._instance(path, metadata)
        instance._attach(self._network(path, spark, instance, self._network_class(path, metadata)))
        return instance

    def _instance(self, path: str, metadata: Any) -> Any:
        where = f"{path}/metadata"
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if not isinstance(metadata, dict) or metadata.get("class") != expected:
            found = metadata.get("class") if isinstance(metadata, dict) else type(metadata).__name__
            raise CorruptDataError(f"{where}: class {found!r}, expected {expected}")
        version = metadata.get(_VERSION_KEY)
        if type(version) is not int or version not in READABLE_VERSIONS:
            raise CorruptDataError(
                f"{where}: {_VERSION_KEY} {version!r}, this release reads "
                f"{' and '.join(map(str, READABLE_VERSIONS))}"
            )
        instance = self.cls()
        try:
            instance._resetUid(str(metadata["uid"]))
            DefaultParamsReader.getAndSetParams(instance, metadata)
        except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as exc:
            raise CorruptDataError(f"{where}: params do not load: {_first_line(exc)}") from None
        if not instance.isDefined(instance.networkConf):
            raise CorruptDataError(f"{where}: no networkConf param")
        return instance

    @staticmethod
    def _network_class(path: str, metadata: dict) -> type[FlatNetwork]:
        """The network class the metadata records (version 1: MultiLayerNetwork)."""
        from sparkgrad.spark.common import network_classes

        name = metadata.get(_NETWORK_KEY) if metadata[_VERSION_KEY] > 1 else _VERSION_1_NETWORK
        try:
            return network_classes(str(name))[0]
        except (ValueError, TypeError):
            raise CorruptDataError(
                f"{path}/metadata: {_NETWORK_KEY} {name!r}, expected MultiLayerNetwork or ComputationGraph"
            ) from None

    def _network(self, path: str, spark: Any, instance: Any, network_cls: type[FlatNetwork]) -> Any:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        where = os.path.join(path, "data")
        try:
            frame = spark.read.parquet(where)
            if frame.columns != ["format", "network"]:
                raise CorruptDataError(
                    f"{where}: expected one row of (format, network), found the columns {frame.columns}"
                )
            rows = frame.limit(2).collect()  # a second row is enough to refuse: nothing more is read
        except (PySparkException, Py4JJavaError) as exc:
            raise CorruptDataError(f"{where}: cannot be read as Parquet: {_first_line(exc)}") from None
        if len(rows) != 1:
            raise CorruptDataError(
                f"{where}: expected one row of (format, network), found {'more than one' if rows else 'none'}"
            )
        fmt, blob = rows[0]
        if fmt != DATA_FORMAT or not isinstance(blob, (bytes, bytearray)):
            raise CorruptDataError(
                f"{where}: format {fmt!r} with {type(blob).__name__} data, expected {DATA_FORMAT}"
            )
        source = io.BytesIO(bytes(blob))
        source.name = where  # the network reader names the file in its errors
        network = network_cls.load(source)
        if network.conf != instance.network_configuration():
            raise CorruptDataError(
                f"{where}: the network's configuration differs from networkConf in the metadata"
            )
        return network


__all__ = ["DATA_FORMAT", "FORMAT_VERSION", "READABLE_VERSIONS", "ModelReader", "ModelWriter"]
