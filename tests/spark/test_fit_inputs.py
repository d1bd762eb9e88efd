"""fit(path), fit_paths with a loader, labeled points, clear errors and resource hygiene."""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest
from helpers import NpzLoader, accuracy, foreign_address, mlp_conf, port, subset

from sparkgrad.data import DataSet
from sparkgrad.errors import TrainingError, TransportError
from sparkgrad.nn import MultiLayerNetwork
from sparkgrad.spark import (
    DefaultRepartitioner,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
    ZmqTransportConfiguration,
)

FAST = ZmqTransportConfiguration(connect_timeout_ms=3000, sync_timeout_ms=30000, poll_interval_ms=10)


def _pa(**kw) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, averaging_frequency=10, rng_seed=2, **kw
    )


def _shared(p: int | None = None, **kw) -> SharedTrainingMaster:
    return SharedTrainingMaster(
        VoidConfiguration(unicast_port=p or port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        repartitioner=DefaultRepartitioner(max_partitions=2),
        transport=FAST,
        **kw,
    )


def test_fit_directory_of_saved_datasets(spark, digits, tmp_path) -> None:
    train = subset(digits[0], 400)
    for i, part in enumerate(train.split(50)):
        part.save(str(tmp_path / f"ds{i}.bin"))
    sm = SparkMultiLayer(spark, mlp_conf(hidden=32), _pa(rdd_data_set_num_examples=50))
    before = accuracy(sm.network, digits[1])
    for _ in range(2):
        sm.fit(f"file://{tmp_path}")
    assert accuracy(sm.network, digits[1]) > max(before, 0.5)


def test_fit_paths_with_custom_loader(spark, digits, tmp_path) -> None:
    train = subset(digits[0], 320)
    paths = []
    for i, part in enumerate(train.split(40)):
        path = str(tmp_path / f"ds{i}.npz")
        np.savez(path, x=part.features, y=part.labels)
        paths.append(path)
    sm = SparkMultiLayer(
        spark, mlp_conf(hidden=32), _shared(rdd_data_set_num_examples=40, collect_training_stats=True)
    )
    sm.fit_paths(spark.sparkContext.parallelize(paths, 2), loader=NpzLoader())
    examples = sum(e.extra["examples"] for e in sm.training_stats.events("SharedWorkerComputeUpdateTimesMs"))
    assert examples == 320
    with pytest.raises(TypeError, match="loader"):
        sm.fit_paths(spark.sparkContext.parallelize(paths, 2), loader="not callable")


def test_fit_labeled_points(spark, digits) -> None:
    from pyspark.mllib.regression import LabeledPoint

    train = subset(digits[0], 600)
    points = [LabeledPoint(float(y.argmax()), x.astype(float)) for x, y in zip(train.features, train.labels)]
    rdd = spark.sparkContext.parallelize(points, 2)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=32), _pa(rdd_data_set_num_examples=16))
    sm.fit_labeled_point(rdd)
    assert accuracy(sm.network, digits[1]) > 0.5
    target = [LabeledPoint(float(x.mean()), x.astype(float)) for x in train.features]
    reg = SparkMultiLayer(spark, mlp_conf(hidden=16, n_out=1, loss="mse", activation="identity"), _pa())
    rrdd = spark.sparkContext.parallelize(target, 2)
    data = DataSet(train.features, train.features.mean(1, keepdims=True))
    before = reg.network.score(data)
    reg.fit_continuous_labeled_point(rrdd)
    assert reg.network.score(data) < before
    bad = spark.sparkContext.parallelize([LabeledPoint(12.0, np.zeros(64))], 1)
    with pytest.raises(TrainingError, match="class indices"):
        sm.fit_labeled_point(bad)


@pytest.mark.parametrize("master", ["pa", "shared"])
def test_bad_data_fails_fast_with_clear_errors(spark, digits, master) -> None:
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), _pa() if master == "pa" else _shared())
    sc = spark.sparkContext
    with pytest.raises(
        TypeError, match=r"^data: expected an RDD of sparkgrad\.data\.DataSet, found elements of type int$"
    ):
        sm.fit(sc.parallelize([1, 2, 3], 2))
    narrow = DataSet(np.zeros((4, 32), np.float32), np.eye(10, dtype=np.float32)[:4])
    with pytest.raises(ValueError, match="do not fit the network"):
        sm.fit(sc.parallelize([narrow], 1))
    with pytest.raises(ValueError, match="empty"):
        sm.fit(sc.parallelize([], 2))
    with pytest.raises(TypeError, match="RDD"):
        sm.fit([digits[0]])


def test_port_in_use_and_unreachable_controller_fail_fast(spark, digits) -> None:
    rdd = spark.sparkContext.parallelize(subset(digits[0], 64).split(16), 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        sm = SparkMultiLayer(spark, mlp_conf(hidden=8), _shared(busy))
        # the driver's controller cannot bind: the error names the endpoint, before any task waits
        with pytest.raises(TransportError, match=rf"controller cannot listen on tcp://127\.0\.0\.1:{busy}\b"):
            sm.fit(rdd)
    # a TEST-NET address that is not this machine's: the controller cannot listen there, and the
    # driver says so before any task starts (nothing is sent anywhere).
    foreign = foreign_address()
    sm = SparkMultiLayer(
        spark,
        mlp_conf(hidden=8),
        SharedTrainingMaster(
            VoidConfiguration(unicast_port=port(), controller_address=foreign), transport=FAST
        ),
    )
    with pytest.raises(TransportError, match=foreign):
        sm.fit(rdd)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_five_fits_leak_no_threads_sockets_or_ports(spark, digits) -> None:
    rdd = spark.sparkContext.parallelize(subset(digits[0], 128).split(16), 2)
    p = port()
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), _shared(p))
    sm.fit(rdd)  # warm-up: Spark's own lazily created threads and py4j connections
    threads, fds = threading.active_count(), _fds()
    for _ in range(5):
        sm.fit(rdd)
        with socket.socket() as s:  # nobody listens on the controller port after a fit
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
            s.listen()
        assert not [t for t in threading.enumerate() if t.name.startswith("sparkgrad-")]
    assert threading.active_count() <= threads
    assert _fds() <= fds + 2  # py4j may open a spare gateway connection
    assert sm.network.epoch_count == 6


def test_more_workers_per_node_than_slots_still_completes(spark, digits) -> None:
    rdd = spark.sparkContext.parallelize(subset(digits[0], 96).split(16), 2)
    sm = SparkMultiLayer(spark, MultiLayerNetwork(mlp_conf(hidden=8)).init(), _shared(workers_per_node=8))
    sm.fit(rdd)
    assert sm.training_master.last_traffic["worker_minibatches"] == 6
