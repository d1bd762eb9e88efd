"""ParameterAveragingTrainingMaster's two ways of running its rounds on local[2]: every round of a fit
in one barrier job, averaging over the transport (averaging_jobs="one", the default), and DL4J's Spark
job per round ("per_round").

Equality: with the data already in one partition per worker and repartition="never", both modes split
each epoch into the same rounds (the same seeds) and train the same minibatches in the same order from
the same parameters. They differ only in how a round's sum is reduced: per round, treeAggregate adds the
float32 vectors; in one job, the controller adds them in float64 and rounds the mean to float32. With at
most two workers (local[2]) both round the same exact sum once (the sum of two float32 values is exact
in float64, and halving is exact away from the subnormal range), so the derived tolerance is zero: the
final parameters, updater state and counters must be equal bit for bit, for a MultiLayerNetwork and a
ComputationGraph, also when a partition has no data in some rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import mlp_conf, subset
from test_graph import graph_conf

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.errors import TrainingError
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
    TrainingHook,
)

pytestmark = pytest.mark.spark


def _master(jobs: str, **kw) -> ParameterAveragingTrainingMaster:
    kw = {
        "num_workers": 2,
        "batch_size_per_worker": 10,
        "averaging_frequency": 2,
        "rdd_data_set_num_examples": 10,
        "repartition": "never",
        "rng_seed": 5,
        "progress": False,
        **kw,
    }
    return ParameterAveragingTrainingMaster(averaging_jobs=jobs, **kw)


def _two_partitions(spark, items: list, first: int):
    """An RDD of exactly two partitions: ``items[:first]`` and ``items[first:]``."""
    sc = spark.sparkContext
    return sc.parallelize(items[:first], 1).union(sc.parallelize(items[first:], 1))


def _as_graph_data(ds: DataSet) -> MultiDataSet:
    """test_graph's two inputs (the digit's halves) and two outputs (class, mean intensity)."""
    x = ds.features
    return MultiDataSet([x[:, :32], x[:, 32:]], [ds.labels, x.mean(axis=1, keepdims=True)])


def _fit(spark, network_kind: str, jobs: str, items: list, first: int, epochs: int = 2, **kw):
    master = _master(jobs, **kw)
    if network_kind == "multilayer":
        sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    else:
        sm = SparkComputationGraph(spark, graph_conf(), master)
    sm.fit(_two_partitions(spark, items, first), epochs=epochs)
    return sm, sm.score()


@pytest.mark.parametrize("network_kind", ["multilayer", "graph"])
@pytest.mark.parametrize("first", [10, 18], ids=["balanced", "a-partition-runs-dry"])
@pytest.mark.parametrize("save_updater", [True, False])
def test_one_job_equals_a_job_per_round(spark, digits, network_kind, first, save_updater) -> None:
    """200 examples in DataSets of 10 over two partitions: 5 rounds an epoch (2 workers x 2 minibatches
    of 10). With 18 and 2 DataSets, the second partition has no data in three of the five rounds: it
    still joins them (no deadlock), and like the per-round jobs the average leaves it out."""
    items = subset(digits[0], 200).split(10)
    if network_kind == "graph":
        items = [_as_graph_data(ds) for ds in items]
    per_round, score_per_round = _fit(
        spark, network_kind, "per_round", items, first, save_updater=save_updater
    )
    one_job, score_one_job = _fit(spark, network_kind, "one", items, first, save_updater=save_updater)
    a, b = per_round.network, one_job.network
    np.testing.assert_array_equal(b.params(), a.params())
    np.testing.assert_array_equal(b.updater_state(), a.updater_state())
    assert (b.iteration_count, b.epoch_count) == (a.iteration_count, a.epoch_count)
    # the epoch's score: the mean over rounds of the workers' mean last score, the same float64 sums
    assert score_one_job == score_per_round
    traffic = one_job.training_master.last_traffic
    assert traffic["spark_jobs"] == 1 and traffic["rounds_averaged"] == 2 * 5 and traffic["epochs"] == 2


def test_a_second_fit_continues_the_split_seeds_like_the_per_round_jobs(spark, digits) -> None:
    """Each epoch draws one split seed from the master's rng_seed stream; a one-job fit that stops early
    (the epoch callback) uses up only the epochs it trained, so the next fit splits as the per-round
    master's next fit does."""
    items = subset(digits[0], 200).split(10)
    nets = []
    for jobs in ("per_round", "one"):
        sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master(jobs))
        rdd = _two_partitions(spark, items, 10)
        sm.fit(rdd, epochs=3, epoch_callback=lambda epoch, net: epoch == 0)  # stops after one epoch
        sm.fit(rdd, epochs=1)
        nets.append(sm.network)
    np.testing.assert_array_equal(nets[1].params(), nets[0].params())
    assert nets[1].epoch_count == nets[0].epoch_count == 2


def test_one_job_repartitions_once_and_trains_every_round(spark, digits) -> None:
    """The default options (one job, repartition "always"): 4 partitions become one per worker, and
    every example is trained once per epoch in one Spark job for the whole fit."""
    rdd = spark.sparkContext.parallelize(subset(digits[0], 640).split(16), 4)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        rdd_data_set_num_examples=16,
        rng_seed=3,
        progress=False,
        collect_training_stats=True,
    )
    sm = SparkMultiLayer(spark, mlp_conf(hidden=32), master)
    sm.fit(rdd, epochs=3)
    traffic = master.last_traffic
    # 40 DataSets of 16 over 2 workers, 10 per round (2 workers x 5 minibatches): 4 rounds an epoch
    assert traffic["rounds_averaged"] == 3 * 4 and traffic["spark_jobs"] == 1 and traffic["workers"] == 2
    assert sm.network.iteration_count == 3 * 4 * 5  # each round: the largest minibatch count, 5
    stats = sm.training_stats
    fits = stats.events("ParameterAveragingWorkerFitTimesMs")
    assert sum(e.extra["examples"] for e in fits) == 3 * 640  # no example dropped or trained twice
    assert len(stats.events("ParameterAveragingWorkerInitTimeMs")) == 2  # one replica per worker
    assert len(stats.events("ParameterAveragingWorkerAverageTimesMs")) == 2 * 3 * 4
    assert stats.counters["rounds_averaged"] == 12 and stats.events("ParameterAveragingMasterFitTimesMs")


class _FailOnce(TrainingHook):
    """Raises in the second partition's worker once the network has trained a few iterations."""

    def pre_update(self, dataset, network) -> None:
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1 and network.iteration_count >= 4:
            raise RuntimeError("injected worker failure")

    def post_update(self, dataset, network) -> None:
        pass


def test_a_failing_worker_fails_the_fit(spark, digits) -> None:
    """The other worker waits for the round's mean; the fit fails with the failed task's own error (Spark
    does not re-run the barrier stage: its rounds cannot be resumed) instead of hanging, and the network
    keeps its parameters."""
    items = subset(digits[0], 200).split(10)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master("one", training_hooks=(_FailOnce(),)))
    before = sm.network.params().copy()
    with pytest.raises(TrainingError, match="^RuntimeError: injected worker failure"):
        sm.fit(_two_partitions(spark, items, 10), epochs=2)
    np.testing.assert_array_equal(sm.network.params(), before)


def test_more_workers_than_task_slots_is_refused_with_the_alternative(spark, digits) -> None:
    items = subset(digits[0], 60).split(10)
    rdd = spark.sparkContext.parallelize(items, 3)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master("one", num_workers=3, repartition="always"))
    with pytest.raises(ValueError, match="num_workers: .*3 partitions.*averaging_jobs='per_round'"):
        sm.fit(rdd)
