"""DL4J's minimal gradient-sharing example in its Python spelling: the master it builds, and a fit.

The Java original (DL4J's Spark guide)::

    TrainingMaster tm = new SharedTrainingMaster.Builder(voidConfiguration, batchSizePerWorker)
        .updatesThreshold(1e-3)
        .rngSeed(12345)
        .collectTrainingStats(false)
        .batchSizePerWorker(batchSizePerWorker)
        .workersPerNode(4)
        .build();
    SparkDl4jMultiLayer sparkNet = new SparkDl4jMultiLayer(sc, conf, tm);
    sparkNet.fit(trainData);
"""

from __future__ import annotations

import math

import pytest
from helpers import accuracy, mlp_conf

import sparkgrad
from sparkgrad.compress import AdaptiveThresholdAlgorithm
from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration

BATCH_SIZE_PER_WORKER = 16


def _minimal_example(spark, train_data, seed: int) -> tuple[SharedTrainingMaster, SparkMultiLayer]:
    void_configuration = VoidConfiguration(controller_address="127.0.0.1")
    tm = SharedTrainingMaster(
        void_configuration,
        BATCH_SIZE_PER_WORKER,
        updates_threshold=1e-3,
        rng_seed=12345,
        collect_training_stats=False,
        workers_per_node=4,
    )
    spark_net = SparkMultiLayer(spark, mlp_conf(hidden=64, seed=seed), tm)  # 64-64-10, Adam
    spark_net.fit(train_data)
    return tm, spark_net


@pytest.fixture(scope="module")
def train_data(spark, digits):
    rdd = spark.sparkContext.parallelize(digits[0].split(BATCH_SIZE_PER_WORKER), 2)
    yield rdd
    rdd.unpersist()


def test_minimal_example_trains_with_an_adaptive_threshold_from_1e_3(spark, digits, train_data) -> None:
    driver_threads = sparkgrad.get_num_threads()
    tm, spark_net = _minimal_example(spark, train_data, seed=1)
    with spark_net:
        # one epoch: 0.89-0.91 over network seeds 1-8 (an untrained network scores about 0.1)
        assert accuracy(spark_net.network, digits[1]) > 0.8
        traffic = tm.last_traffic
        # local[2] with workers_per_node=4: min(2 task slots, 1 host x 4) workers, in one barrier job
        assert (traffic["workers"], traffic["spark_jobs"]) == (2, 1)
        # the workers' adaptive algorithm started at 1e-3; every message was denser than its 1e-2 target,
        # so after each worker's first minibatch the threshold rose by 1 / decay_rate a minibatch
        state = tm.current_threshold_algorithm
        assert type(state) is AdaptiveThresholdAlgorithm and state.initial_threshold == 1e-3
        per_worker = traffic["worker_minibatches"] / traffic["workers"]
        assert per_worker == math.ceil(digits[0].num_examples() / BATCH_SIZE_PER_WORKER) / 2
        assert state.last_threshold == pytest.approx(1e-3 / state.decay_rate ** (per_worker - 1), rel=1e-9)
    assert sparkgrad.get_num_threads() == driver_threads  # the workers' threads are theirs


def test_minimal_example_master_is_dl4j_s() -> None:
    tm = SharedTrainingMaster(
        VoidConfiguration(),
        BATCH_SIZE_PER_WORKER,
        updates_threshold=1e-3,
        rng_seed=12345,
        collect_training_stats=False,
        workers_per_node=4,
    )
    # DL4J's updatesThreshold(t): an AdaptiveThresholdAlgorithm starting at t, the rest at its defaults
    assert tm.current_threshold_algorithm == AdaptiveThresholdAlgorithm(initial_threshold=1e-3)
    assert tm.threshold_algorithm is None and tm.updates_threshold == 1e-3
    for text in (tm.to_json(), tm.to_yaml()):
        again = (
            SharedTrainingMaster.from_json(text)
            if text.startswith("{")
            else SharedTrainingMaster.from_yaml(text)
        )
        assert again == tm and again.current_threshold_algorithm == AdaptiveThresholdAlgorithm(1e-3)


def test_updates_threshold_and_threshold_algorithm_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="updates_threshold and threshold_algorithm"):
        SharedTrainingMaster(updates_threshold=1e-3, threshold_algorithm=AdaptiveThresholdAlgorithm(1e-3))


@pytest.mark.parametrize("value", [0.0, -1e-3, 1e7, float("nan"), "1e-3", True])
def test_bad_updates_threshold_is_refused(value) -> None:
    with pytest.raises(ValueError, match="updates_threshold"):
        SharedTrainingMaster(updates_threshold=value)
