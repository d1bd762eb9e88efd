"""Training data on a non-file Hadoop scheme: DataSet.save/load on the driver, export_minibatches, fit and
evaluate from the exported directory, fit_paths with URIs, and every error path.

The scheme is ``viewfs://``: Hadoop's ViewFileSystem, with a mount table (set on the session's Hadoop
configuration, which Spark ships to its tasks) linking ``viewfs://NAME/data`` to the test's tmp_path. So
every read and write goes through the real Hadoop client of another scheme than ``file:``, on the driver
and in the executors, whose Python processes have no JVM of their own.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers import mlp_conf, subset
from test_graph import graph_conf

import sparkgrad._io as sio
from sparkgrad.data import DataSet, MultiDataSet, SerializedDataSetLoader
from sparkgrad.data import serialization as fmt
from sparkgrad.errors import CorruptDataError, TrainingError
from sparkgrad.nn import ComputationGraph
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
    VoidConfiguration,
    ZmqTransportConfiguration,
    export_minibatches,
    read_saved,
)
from sparkgrad.spark.storage import MANIFEST

BATCH = 16


@pytest.fixture
def remote(spark, tmp_path) -> tuple[str, Path]:
    """``(viewfs://NAME/data, the local directory it is mounted on)``; NAME is new per test, so Hadoop's
    FileSystem cache never serves another test's mount table."""
    name = f"sg{uuid.uuid4().hex[:12]}"
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    key = f"fs.viewfs.mounttable.{name}.link./data"
    conf.set(key, tmp_path.as_uri())
    yield f"viewfs://{name}/data", tmp_path
    conf.unset(key)


def _pa(**kw) -> ParameterAveragingTrainingMaster:
    """Two workers and no repartitioning: the same two partitions of the same minibatches train to the
    same parameters, bit for bit, whatever RDD they come from."""
    options = {
        "num_workers": 2,
        "batch_size_per_worker": BATCH,
        "averaging_frequency": 2,
        "rdd_data_set_num_examples": BATCH,
        "repartition": "never",
        "rng_seed": 5,
        "progress": False,
        "collect_training_stats": True,
    }
    return ParameterAveragingTrainingMaster(**{**options, **kw})


def _shared() -> SharedTrainingMaster:
    return SharedTrainingMaster(
        VoidConfiguration(controller_address="127.0.0.1"),
        batch_size_per_worker=BATCH,
        rdd_data_set_num_examples=BATCH,
        transport=ZmqTransportConfiguration(connect_timeout_ms=3000, sync_timeout_ms=30000),
        progress=False,
        collect_training_stats=True,
    )


def _trained_examples(model) -> int:
    """Examples the workers trained on, from the fit's stats (either master)."""
    stats = model.training_stats
    key = next(
        k
        for k in ("SharedWorkerComputeUpdateTimesMs", "ParameterAveragingWorkerFitTimesMs")
        if k in stats.keys()
    )
    return int(sum(e.extra["examples"] for e in stats.events(key)))


def _hidden_leftovers(directory: Path) -> list[str]:
    """Temporary files or directories of atomic writes left anywhere below ``directory``."""
    return sorted(str(p) for p in directory.rglob("*") if ".sparkgrad-" in p.name)


def _loaded(pairs: list) -> list:
    loader = SerializedDataSetLoader()
    return [(name, loader.load_bytes(data, source=name)) for name, data in pairs]


# -- DataSet.save / load through Hadoop ---------------------------------------------------------------------
def test_dataset_and_multidataset_round_trip_through_viewfs(spark, remote) -> None:
    uri, local = remote
    ds = DataSet(np.arange(15, dtype=np.float32).reshape(5, 3), np.eye(2, dtype=np.float32)[[0, 1, 1, 0, 1]])
    ds.save(f"{uri}/a.bin")
    assert (local / "a.bin").read_bytes() == ds.to_bytes()  # the format's bytes, written by Hadoop
    assert DataSet.load(f"{uri}/a.bin") == ds == SerializedDataSetLoader()(f"{uri}/a.bin")
    mds = MultiDataSet(
        [ds.features, ds.features[:, :1]], [ds.labels], features_masks=[None, np.ones((5, 1), np.float32)]
    )
    mds.save(f"{uri}/m.bin")
    assert MultiDataSet.load(f"{uri}/m.bin") == mds
    bigger = DataSet(np.ones((7, 3), np.float32), np.zeros((7, 2), np.float32))
    bigger.save(f"{uri}/a.bin")  # replaces the file
    assert DataSet.load(f"{uri}/a.bin") == bigger
    assert sorted(p.name for p in local.iterdir()) == [".a.bin.crc", ".m.bin.crc", "a.bin", "m.bin"]


def test_a_failed_save_through_hadoop_keeps_the_previous_file(spark, remote, monkeypatch) -> None:
    uri, local = remote
    old = DataSet(np.zeros((3, 3), np.float32), np.ones((3, 2), np.float32))
    old.save(f"{uri}/a.bin")
    new = DataSet(np.ones((9, 3), np.float32), np.ones((9, 2), np.float32))

    def half_then_fail(stream, kind, groups) -> None:
        data = fmt.record_bytes(kind, groups)
        stream.write(data[: len(data) // 2])
        raise OSError("connection reset (simulated)")

    with monkeypatch.context() as m:  # the record breaks off half-way
        m.setattr(fmt, "write_record", half_then_fail)
        with pytest.raises(OSError, match="simulated"):
            new.save(f"{uri}/a.bin")
    with monkeypatch.context() as m:  # the whole file was written, then renaming it into place failed
        m.setattr(
            sio, "hadoop_replace", lambda *a: (_ for _ in ()).throw(OSError("rename failed (simulated)"))
        )
        with pytest.raises(OSError, match="simulated"):
            new.save(f"{uri}/a.bin")
    assert DataSet.load(f"{uri}/a.bin") == old
    assert _hidden_leftovers(local) == []
    (local / "dir.bin").mkdir()
    with pytest.raises(IsADirectoryError, match=f"{uri}/dir.bin: is a directory"):
        new.save(f"{uri}/dir.bin")


def test_load_errors_name_the_uri(spark, remote) -> None:
    uri, _ = remote
    with pytest.raises(FileNotFoundError, match=f"{uri}/missing.bin"):
        DataSet.load(f"{uri}/missing.bin")
    data = DataSet(np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)).to_bytes()
    sio.write_bytes(f"{uri}/short.bin", data[:-9])  # through Hadoop: its checksum file agrees
    with pytest.raises(CorruptDataError, match=f"{uri}/short.bin: truncated"):
        DataSet.load(f"{uri}/short.bin")
    sio.write_bytes(f"{uri}/notes.txt", b"not a data set at all")
    with pytest.raises(CorruptDataError, match=f"{uri}/notes.txt: not a sparkgrad data file"):
        SerializedDataSetLoader()(f"{uri}/notes.txt")


# -- export_minibatches -----------------------------------------------------------------------------------
def test_export_rebatches_each_partition_and_writes_a_manifest(spark, digits, remote) -> None:
    uri, local = remote
    train = subset(digits[0], 300)
    rdd = spark.sparkContext.parallelize(train.split(10), 2)  # 150 examples a partition: 9 x 16 + 6
    assert export_minibatches(rdd, f"{uri}/train", batch_size=BATCH) == 20
    assert sorted(p.name for p in (local / "train").iterdir() if not p.name.startswith(".")) == [
        "_SUCCESS",
        MANIFEST,
        "part-00000",
        "part-00001",
    ]
    manifest = json.loads((local / "train" / MANIFEST).read_text())
    assert {k: manifest[k] for k in ("format", "version", "batch_size", "minibatches", "examples")} == {
        "format": "sparkgrad-minibatches",
        "version": 1,
        "batch_size": BATCH,
        "minibatches": 20,
        "examples": 300,
    }
    assert manifest["files"] == {
        p: (local / "train" / p).stat().st_size for p in ("part-00000", "part-00001")
    }
    records = _loaded(read_saved(spark, f"{uri}/train").collect())
    assert [name for name, _ in records] == [
        f"{uri}/train/part-{p:05d}#{i}" for p in range(2) for i in range(10)
    ]
    assert [ds.num_examples() for _, ds in records] == ([BATCH] * 9 + [6]) * 2
    np.testing.assert_array_equal(np.concatenate([ds.features for _, ds in records]), train.features)
    np.testing.assert_array_equal(np.concatenate([ds.labels for _, ds in records]), train.labels)


def test_export_of_a_dataframe_converts_like_fit(spark, digits, remote) -> None:
    from pyspark.ml.linalg import Vectors

    uri, _ = remote
    train = subset(digits[0], 40)
    df = spark.createDataFrame(
        [(Vectors.dense(x), float(y.argmax())) for x, y in zip(train.features, train.labels)],
        ["pixels", "digit"],
    ).coalesce(1)
    with pytest.raises(ValueError, match="network: a DataFrame is converted for a network"):
        export_minibatches(df, f"{uri}/df", batch_size=BATCH)
    count = export_minibatches(
        df,
        f"{uri}/df",
        batch_size=BATCH,
        network=mlp_conf(hidden=8),
        features_col="pixels",
        label_col="digit",
    )
    assert count == 3
    records = _loaded(read_saved(spark, f"{uri}/df").collect())
    assert [ds.num_examples() for _, ds in records] == [16, 16, 8]
    np.testing.assert_array_equal(np.concatenate([ds.features for _, ds in records]), train.features)
    np.testing.assert_array_equal(np.concatenate([ds.labels for _, ds in records]), train.labels)


def test_export_never_replaces_data_silently_and_overwrite_is_all_or_nothing(spark, digits, remote) -> None:
    uri, local = remote
    sc = spark.sparkContext
    data = subset(digits[0], 64).split(16)
    assert export_minibatches(sc.parallelize(data, 2), f"{uri}/x", batch_size=BATCH) == 4
    before = {p.name: p.read_bytes() for p in (local / "x").iterdir()}
    with pytest.raises(
        FileExistsError, match=f"directory: {uri}/x exists and is not empty; pass overwrite=True"
    ):
        export_minibatches(sc.parallelize(data, 2), f"{uri}/x", batch_size=BATCH)
    # the job fails in its second partition: the previous export is untouched, nothing is left beside it
    broken = sc.parallelize([*data, "not a DataSet"], 2)
    with pytest.raises(TrainingError, match="expected a DataSet or a MultiDataSet, got str"):
        export_minibatches(broken, f"{uri}/x", batch_size=BATCH, overwrite=True)
    assert {p.name: p.read_bytes() for p in (local / "x").iterdir()} == before
    assert _hidden_leftovers(local) == []
    with pytest.raises(TrainingError, match="got str"):  # a new directory: nothing is left at all
        export_minibatches(broken, f"{uri}/new", batch_size=BATCH)
    assert not (local / "new").exists()
    # overwrite=True replaces the content once the new export is complete
    assert export_minibatches(sc.parallelize(data, 1), f"{uri}/x", batch_size=32, overwrite=True) == 2
    assert [ds.num_examples() for _, ds in _loaded(read_saved(sc, f"{uri}/x").collect())] == [32, 32]
    assert json.loads((local / "x" / MANIFEST).read_text())["files"].keys() == {"part-00000"}
    assert _hidden_leftovers(local) == []
    (local / "empty").mkdir()  # an empty directory is no data: it is used
    assert export_minibatches(sc.parallelize(data, 1), f"{uri}/empty", batch_size=BATCH) == 4
    sio.write_bytes(f"{uri}/file", b"x")
    with pytest.raises(ValueError, match=f"directory: {uri}/file is a file"):
        export_minibatches(sc.parallelize(data, 1), f"{uri}/file", batch_size=BATCH, overwrite=True)
    with pytest.raises(ValueError, match=r"directory: .*contains '\*', ','"):
        export_minibatches(sc.parallelize(data, 1), f"{uri}/a,b*", batch_size=BATCH)
    with pytest.raises(ValueError, match="batch_size: must be >= 1"):
        export_minibatches(sc.parallelize(data, 1), f"{uri}/y", batch_size=0)
    with pytest.raises(TypeError, match="data: expected an RDD of DataSets / MultiDataSets or a DataFrame"):
        export_minibatches(data, f"{uri}/y", batch_size=BATCH)


# -- fit(dir), evaluate(dir), fit_paths ----------------------------------------------------------------------
def test_fit_from_an_export_trains_like_the_same_minibatches_in_an_rdd(spark, digits, remote) -> None:
    uri, _ = remote
    sc = spark.sparkContext
    train, test = subset(digits[0], 320), subset(digits[1], 200)
    minibatches = train.split(BATCH)  # 20, ten per partition
    assert export_minibatches(sc.parallelize(minibatches, 2), f"{uri}/train", batch_size=BATCH) == 20
    assert export_minibatches(sc.parallelize(test.split(50), 2), f"{uri}/test", batch_size=64) == 4
    with SparkMultiLayer(spark, mlp_conf(hidden=16), _pa()) as from_files:
        from_files.fit(f"{uri}/train", epochs=2)
        assert _trained_examples(from_files) == 2 * 320
        evaluation = from_files.evaluate(f"{uri}/test")
    with SparkMultiLayer(spark, mlp_conf(hidden=16), _pa()) as from_rdd:
        from_rdd.fit(sc.parallelize(minibatches, 2), epochs=2)
    assert from_files.network.iteration_count == from_rdd.network.iteration_count > 0
    np.testing.assert_array_equal(from_files.network.params(), from_rdd.network.params())
    local = from_files.network.evaluate(test)
    np.testing.assert_array_equal(evaluation.confusion_matrix(), local.confusion_matrix())
    assert evaluation.accuracy() == local.accuracy()


def test_shared_training_fits_and_evaluates_an_export(spark, digits, remote) -> None:
    uri, _ = remote
    sc = spark.sparkContext
    train, test = subset(digits[0], 320), subset(digits[1], 120)
    export_minibatches(sc.parallelize(train.split(40), 2), f"{uri}/train", batch_size=BATCH)
    export_minibatches(sc.parallelize(test.split(40), 1), f"{uri}/test", batch_size=50)
    with SparkMultiLayer(spark, mlp_conf(hidden=16), _shared()) as model:
        before = model.network.params().copy()
        model.fit(f"{uri}/train")
        assert _trained_examples(model) == 320
        assert not np.array_equal(model.network.params(), before)
        evaluation = model.evaluate(f"{uri}/test")
    local = model.network.evaluate(test)
    np.testing.assert_array_equal(evaluation.confusion_matrix(), local.confusion_matrix())
    assert evaluation.accuracy() == local.accuracy()


def test_fit_paths_and_evaluate_read_uris_through_spark(spark, digits, remote) -> None:
    uri, local = remote
    sc = spark.sparkContext
    train, test = subset(digits[0], 160), subset(digits[1], 100)
    # names Spark's readers would take as a pattern or a list if they were not escaped
    names = [f"{uri}/batch {i},[{i}].bin" for i in range(10)]
    for name, ds in zip(names, train.split(BATCH)):
        ds.save(name)  # on the driver, through Hadoop
    with SparkMultiLayer(spark, mlp_conf(hidden=16), _pa()) as model:
        model.fit_paths(sc.parallelize(names, 2), epochs=2)
        assert _trained_examples(model) == 2 * 160
        test_names = [f"{uri}/test{i}.bin" for i in range(2)]
        for name, ds in zip(test_names, test.split(50)):
            ds.save(name)
        evaluation = model.evaluate(sc.parallelize(test_names, 2), loader=SerializedDataSetLoader())
    np.testing.assert_array_equal(
        evaluation.confusion_matrix(), model.network.evaluate(test).confusion_matrix()
    )
    assert model.network.epoch_count == 2
    with SparkMultiLayer(spark, mlp_conf(hidden=16), _pa()) as model:
        with pytest.raises(FileNotFoundError, match=f"paths: .*PATH_NOT_FOUND.*{uri}/gone.bin"):
            model.fit_paths(sc.parallelize([names[0], f"{uri}/gone.bin"], 2))
        (local / "_hidden.bin").write_bytes((local / "test0.bin").read_bytes())
        with pytest.raises(ValueError, match=f"paths: {uri}/_hidden.bin: Spark's file readers skip names"):
            model.fit_paths(sc.parallelize([names[0], f"{uri}/_hidden.bin"], 1))
        assert model.network.iteration_count == 0  # nothing trained


def test_graph_fits_and_evaluates_exported_multidatasets(spark, digits, remote) -> None:
    uri, _ = remote
    sc = spark.sparkContext

    def as_graph_data(ds: DataSet) -> MultiDataSet:
        x = ds.features
        return MultiDataSet([x[:, :32], x[:, 32:]], [ds.labels, x.mean(axis=1, keepdims=True)])

    train, test = subset(digits[0], 192), subset(digits[1], 90)
    minibatches = [as_graph_data(ds) for ds in train.split(BATCH)]
    assert export_minibatches(sc.parallelize(minibatches, 2), f"{uri}/train", batch_size=BATCH) == 12
    export_minibatches(sc.parallelize([as_graph_data(test)], 1), f"{uri}/test", batch_size=64)
    with SparkComputationGraph(spark, graph_conf(), _pa()) as from_files:
        from_files.fit_multi_data_set(f"{uri}/train")
        evaluation = from_files.evaluate_multi_data_set(f"{uri}/test")
    with SparkComputationGraph(spark, graph_conf(), _pa()) as from_rdd:
        from_rdd.fit(sc.parallelize(minibatches, 2))
    np.testing.assert_array_equal(from_files.network.params(), from_rdd.network.params())
    local = from_files.network.evaluate(as_graph_data(test))
    np.testing.assert_array_equal(evaluation.confusion_matrix(), local.confusion_matrix())
    # fit_paths of MultiDataSets saved on the driver: its default loader reads them through Spark too
    names = [f"{uri}/g{i}.bin" for i in range(len(minibatches))]
    for name, mds in zip(names, minibatches):
        mds.save(name)
    with SparkComputationGraph(spark, graph_conf(), _pa()) as model:
        model.fit_paths_multi_data_set(sc.parallelize(names, 2))
        assert _trained_examples(model) == 192
        assert isinstance(model.network, ComputationGraph)


# -- what read_saved refuses, on the driver ---------------------------------------------------------------
def test_read_saved_refuses_missing_empty_and_incomplete_data(spark, digits, remote) -> None:
    uri, local = remote
    sc = spark.sparkContext
    with pytest.raises(FileNotFoundError, match=f"{uri}/nothing: no such file or directory"):
        read_saved(spark, f"{uri}/nothing")
    with pytest.raises(FileNotFoundError, match=rf"{uri}/nothing \(of {uri}/nothing,{uri}/other\): no such"):
        read_saved(spark, f"{uri}/nothing,{uri}/other")
    (local / "empty").mkdir()
    (local / "empty" / ".hidden").write_bytes(b"x")
    with pytest.raises(ValueError, match=f"{uri}/empty: holds no data files"):
        read_saved(spark, f"{uri}/empty")
    (local / "failed" / "_temporary" / "0").mkdir(parents=True)
    with pytest.raises(ValueError, match=f"{uri}/failed: holds no data files, only Spark's _temporary"):
        read_saved(spark, f"{uri}/failed")
    (local / "parent" / "child").mkdir(parents=True)
    with pytest.raises(ValueError, match=f"{uri}/parent: holds directories but no files"):
        read_saved(spark, f"{uri}/parent")
    assert export_minibatches(sc.parallelize([], 2), f"{uri}/none", batch_size=BATCH) == 0
    with pytest.raises(ValueError, match=f"{uri}/none: the export holds no minibatches"):
        read_saved(spark, f"{uri}/none")
    export_minibatches(sc.parallelize(subset(digits[0], 32).split(16), 1), f"{uri}/half", batch_size=BATCH)
    for name in (MANIFEST, "_SUCCESS", f".{MANIFEST}.crc", "._SUCCESS.crc"):
        (local / "half" / name).unlink()  # as an export whose job never committed
    with pytest.raises(ValueError, match=f"{uri}/half: an incomplete export: no _SUCCESS marker"):
        read_saved(spark, f"{uri}/half")
    sc.parallelize([("a", "b")], 1).saveAsSequenceFile(f"{uri}/texts")
    with pytest.raises(
        ValueError, match=r"texts/part-00000: a SequenceFile of \(org.apache.hadoop.io.Text, org"
    ):
        read_saved(spark, f"{uri}/texts")
    DataSet(np.ones((2, 64), np.float32), np.ones((2, 10), np.float32)).save(f"{uri}/files/a.bin")
    export_minibatches(sc.parallelize(subset(digits[0], 32).split(16), 1), f"{uri}/ok", batch_size=BATCH)
    with pytest.raises(ValueError, match="mixes an export of export_minibatches with files written by save"):
        read_saved(spark, f"{uri}/files,{uri}/ok")
    model = SparkMultiLayer(spark, mlp_conf(hidden=8), _pa())
    with pytest.raises(ValueError, match=f"{uri}/empty: holds no data files"):
        model.fit(f"{uri}/empty")
    with pytest.raises(FileNotFoundError, match=f"{uri}/nothing"):
        model.evaluate(f"{uri}/nothing")
    assert model.network.iteration_count == 0


def test_damaged_exports_and_files_are_named(spark, digits, remote) -> None:
    uri, local = remote
    sc = spark.sparkContext
    data = subset(digits[0], 128).split(16)
    export_minibatches(sc.parallelize(data, 2), f"{uri}/x", batch_size=BATCH)
    part = local / "x" / "part-00001"
    good = part.read_bytes()
    # truncated through Hadoop (its checksum file agrees): the manifest's length gives it away
    sio.write_bytes(f"{uri}/x/part-00001", good[:-100])
    with pytest.raises(
        CorruptDataError, match=f"{uri}/x/part-00001: {len(good) - 100} bytes, the export wrote {len(good)}"
    ):
        read_saved(spark, f"{uri}/x")
    sio.write_bytes(f"{uri}/x/part-00001", good)
    sio.write_bytes(f"{uri}/x/part-00002", good)
    with pytest.raises(CorruptDataError, match=f"{uri}/x/part-00002: not written by the export"):
        SparkMultiLayer(spark, mlp_conf(hidden=8), _pa()).fit(f"{uri}/x")
    (local / "x" / "part-00002").unlink()
    (local / "x" / ".part-00002.crc").unlink()
    manifest = (local / "x" / MANIFEST).read_bytes()
    sio.write_bytes(f"{uri}/x/{MANIFEST}", manifest[:20])
    with pytest.raises(CorruptDataError, match=f"{uri}/x/{MANIFEST}: not valid JSON"):
        read_saved(spark, f"{uri}/x")
    sio.write_bytes(f"{uri}/x/{MANIFEST}", manifest)
    # a record damaged where no file-system checksum sees it (the .crc is gone): its own CRC-32 does,
    # on an executor, and the driver's error names the record
    (local / "x" / ".part-00001.crc").unlink()
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0x40
    part.write_bytes(bytes(damaged))
    model = SparkMultiLayer(spark, mlp_conf(hidden=8), _pa())
    with pytest.raises(TrainingError, match=rf"CorruptDataError: {uri}/x/part-00001#\d: checksum mismatch"):
        model.fit(f"{uri}/x")
    with pytest.raises(TrainingError, match=rf"CorruptDataError: {uri}/x/part-00001#\d: checksum mismatch"):
        model.evaluate(f"{uri}/x")
    # a directory of saved files: a truncated or foreign one fails the job, naming the file
    data[0].save(f"{uri}/files/a.bin")
    sio.write_bytes(f"{uri}/files/b.bin", data[1].to_bytes()[:-7])
    with pytest.raises(TrainingError, match=f"CorruptDataError: {uri}/files/b.bin: truncated"):
        model.fit(f"{uri}/files")
    sio.write_bytes(f"{uri}/files/b.bin", b"PK\x03\x04 a zip, not a data set")
    with pytest.raises(
        TrainingError, match=f"CorruptDataError: {uri}/files/b.bin: not a sparkgrad data file"
    ):
        model.evaluate(f"{uri}/files")
