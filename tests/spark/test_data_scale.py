"""A worker's memory does not grow with its partition: it trains from the partition spilled to local disk,
re-read every epoch, and the files of exported data are streamed, never held by the JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import mlp_conf, spark_submit, submit_output

from sparkgrad.data import DataSet
from sparkgrad.errors import CorruptDataError
from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkMultiLayer
from sparkgrad.spark.partition_store import PartitionStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS is read from /proc")

ROWS_PER_DATASET = 256
FEATURES, CLASSES = 64, 10


def _generated(sc, rows: int):
    """An RDD of 256-example DataSets made on the executors (the driver never holds them), 2 partitions."""

    def make(index: int) -> DataSet:
        rng = np.random.default_rng(index)
        x = rng.normal(size=(ROWS_PER_DATASET, FEATURES)).astype(np.float32)
        return DataSet(x, np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, ROWS_PER_DATASET)])

    return sc.parallelize(range(rows // ROWS_PER_DATASET), 2).map(make)


def _peak_worker_rss_mib(spark, master, rows: int) -> float:
    with SparkMultiLayer(spark, mlp_conf(hidden=32), master) as model:
        model.fit(_generated(spark.sparkContext, rows), epochs=2)
        tasks = model.training_stats.events("WorkerFlatMapTotalTimeMs")
    assert len(tasks) == 2
    return max(e.extra["peak_rss_mib"] for e in tasks)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["shared", "averaging"])
def test_a_workers_peak_memory_does_not_grow_with_its_partition(spark, kind) -> None:
    def master():
        options = dict(
            batch_size_per_worker=ROWS_PER_DATASET,
            rdd_data_set_num_examples=ROWS_PER_DATASET,
            rdd_training_approach="direct",
            collect_training_stats=True,
            progress=False,
            rng_seed=1,
        )
        if kind == "shared":
            return SharedTrainingMaster(**options)
        return ParameterAveragingTrainingMaster(**options)

    small, large = 8_192, 262_144
    peaks = [_peak_worker_rss_mib(spark, master(), rows) for rows in (small, large, small, large)]
    # a worker's share of the large partition's arrays: what a worker holding its partition in a list grew by
    partition_mib = (large - small) / 2 * (FEATURES + CLASSES) * 4 / 2**20  # 36 MiB
    growth = max(peaks[1], peaks[3]) - min(peaks[0], peaks[2])
    # measured: a growth of about 4 MiB here (the prefetch queue, read and shuffle buffers); 39 MiB with
    # the elements held in a list (and a seeded shuffle sorted in the Python worker)
    assert growth < 0.25 * partition_mib, (peaks, partition_mib)


def test_the_store_gives_back_every_element_in_any_order(tmp_path) -> None:
    rng = np.random.default_rng(0)
    datasets = [
        DataSet(rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2))) for n in (1, 4, 2)
    ]
    with PartitionStore(iter(datasets), "dataset", str(tmp_path)) as store:
        assert len(store) == 3 and store.nbytes == sum(len(d.to_bytes()) for d in datasets)
        assert list(tmp_path.iterdir()) == []  # an unnamed file: nothing to clean up after a crash
        for i in (2, 0, 1, 2):
            np.testing.assert_array_equal(store[i].features, datasets[i].features)
            np.testing.assert_array_equal(store[i].labels, datasets[i].labels)
    pairs = [("a", b"xy"), ("b", b""), ("c", b"12345")]
    with PartitionStore(iter(pairs), "bytes", str(tmp_path)) as store:
        assert [store[i] for i in (2, 1, 0)] == pairs[::-1]
    assert PartitionStore(iter(["p", "q"]), "path")[1] == "q"


def test_an_encrypted_store_holds_no_plaintext_and_refuses_altered_bytes(tmp_path, monkeypatch) -> None:
    pytest.importorskip("cryptography")
    import tempfile

    files = []
    real = tempfile.TemporaryFile

    def kept(*args, **kwargs):  # the store's unnamed file, kept open here to read it back
        f = real(*args, **kwargs)
        files.append(f)
        return f

    monkeypatch.setattr(tempfile, "TemporaryFile", kept)
    marker = b"sparkgrad-plaintext-marker" * 40
    pairs = [("a", marker), ("b", b"x" * 100)]
    for encrypt in (False, True):
        with PartitionStore(iter(pairs), "bytes", str(tmp_path), encrypt=encrypt) as store:
            assert [store[i] for i in (1, 0)] == pairs[::-1] and store[-1] == pairs[-1]
            raw = os.pread(files[-1].fileno(), store.nbytes, 0)
            assert (marker in raw) != encrypt  # sealed: 16 bytes of tag per element
            assert store.nbytes == sum(len(b) for _, b in pairs) + (32 if encrypt else 0)
            if encrypt:
                os.pwrite(files[-1].fileno(), bytes([raw[5] ^ 1]), 5)  # one bit flipped on disk
                with pytest.raises(CorruptDataError, match="element 0: altered on local disk"):
                    store[0]
                assert store[1] == pairs[1]


def test_the_store_names_an_element_that_is_not_a_dataset(tmp_path) -> None:
    with pytest.raises(TypeError, match="element 1 of the partition is a str, not a DataSet"):
        PartitionStore(iter([DataSet(np.zeros((1, 2), np.float32), None), "x"]), "dataset", str(tmp_path))


@pytest.mark.slow
def test_a_fit_on_data_larger_than_the_jvm_heap_completes_with_default_options(tmp_path) -> None:
    submit, env = spark_submit()
    rows = 2_560_000  # 758 MB of arrays: 1.4 x the heap (512m, about the least Spark starts with)
    result = subprocess.run(
        [
            *submit,
            "--driver-memory",
            "512m",
            "--conf",
            f"spark.local.dir={tmp_path}",
            str(Path(__file__).resolve().parent / "jobs" / "fit_past_heap.py"),
            str(rows),
            (tmp_path / "export").as_uri(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, submit_output(result)
    assert "OutOfMemoryError" not in result.stderr
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["data_bytes"] > 1.3 * got["heap_max"]
    assert got["exported"] == 1.0  # above direct_memory_budget_mb: exported, then streamed from the files
    # every minibatch of 256 trained once: 10,000 of them over the workers, one iteration each
    assert got["minibatches"] == rows // 256 and got["iterations"] > 0
    assert np.isfinite(got["score"]) and got["score"] < np.log(10)  # better than chance
    assert not any((tmp_path / "export").iterdir())  # delete_temp_files removed the export
