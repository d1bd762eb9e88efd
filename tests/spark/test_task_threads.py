"""Every Spark task that runs native kernels sets its native threads to the task's CPUs (or the master's
``task_threads``) and restores them afterwards; the driver's count is never touched."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ThreadsSeen, mlp_conf, small_network, subset, threads_column

import sparkgrad
from sparkgrad.nn import MultiLayerNetwork
from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkMultiLayer
from sparkgrad.spark.threads import task_cpus, task_threads


def _threads_in_tasks(it, option):
    from pyspark import TaskContext

    before = sparkgrad.get_num_threads()
    with task_threads(option) as count:
        inside = sparkgrad.get_num_threads()
    yield (TaskContext.get().cpus(), task_cpus(option), count, before, inside, sparkgrad.get_num_threads())


@pytest.mark.parametrize("option", [None, 3])
def test_a_task_runs_with_its_cpus_or_the_option_and_restores_its_count(spark, option) -> None:
    rdd = spark.sparkContext.parallelize(range(4), 2)
    for cpus, resolved, count, before, inside, after in rdd.mapPartitions(
        lambda it: _threads_in_tasks(it, option)
    ).collect():
        assert cpus == 1  # local[2]: spark.task.cpus is 1
        assert resolved == count == inside == (cpus if option is None else option)
        assert after == before


@pytest.fixture(scope="module")
def small_rdd(spark, digits):
    rdd = spark.sparkContext.parallelize(subset(digits[0], 320).split(16), 2)
    yield rdd
    rdd.unpersist()


@pytest.mark.parametrize(
    "master",
    [
        SharedTrainingMaster(batch_size_per_worker=16, collect_training_stats=True, task_threads=3),
        ParameterAveragingTrainingMaster(
            batch_size_per_worker=16, collect_training_stats=True, averaging_jobs="per_round", task_threads=3
        ),
    ],
    ids=["shared", "averaging-per-round"],
)
def test_training_tasks_run_with_task_threads(spark, small_rdd, master) -> None:
    driver_threads = sparkgrad.get_num_threads()
    with SparkMultiLayer(spark, mlp_conf(hidden=16), master) as model:
        model.fit(small_rdd)
        tasks = model.training_stats.events("WorkerFlatMapTotalTimeMs")
    assert tasks and {e.extra["threads"] for e in tasks} == {3}
    assert sparkgrad.get_num_threads() == driver_threads


def test_evaluation_copies_share_the_task_threads(spark, digits) -> None:
    master = ParameterAveragingTrainingMaster(task_threads=4)
    rdd = spark.sparkContext.parallelize(subset(digits[1], 128).split(16), 2)
    with SparkMultiLayer(spark, MultiLayerNetwork(mlp_conf(hidden=8)).init(), master) as model:
        (seen,) = model.do_evaluation(rdd, 2, 16, ThreadsSeen())
    assert seen.seen == {2}  # 4 threads over 2 network copies


def test_network_outputs_run_with_task_threads(spark, digits) -> None:
    from sparkgrad.spark.columns import with_network_outputs

    rows = [(x.astype(float).tolist(),) for x in digits[1].features[:20]]
    df = spark.createDataFrame(rows, "features array<double>").repartition(2)
    conf = small_network().conf
    for option, expected in ((3, 3.0), (None, 1.0)):
        out = with_network_outputs(
            df, "features", conf, small_network, threads_column, [("threads", False)], option
        )
        assert np.array_equal(np.array([r.threads for r in out.collect()]), np.full(20, expected))
