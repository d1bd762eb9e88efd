"""Balanced repartitioning with and without the seeded shuffle; the Repartitioner interface, its
built-in implementations and a custom one in both masters."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import mlp_conf, subset

from sparkgrad.spark import (
    DefaultRepartitioner,
    EqualRepartitioner,
    NoOpRepartitioner,
    ParameterAveragingTrainingMaster,
    Repartition,
    Repartitioner,
    SharedTrainingMaster,
    SparkMultiLayer,
)
from sparkgrad.spark.partitioning import balanced_repartition, partition_counts, repartition


@dataclass
class LeadingPartitionRepartitioner(Repartitioner):
    """A custom repartitioner: the first ``lead`` elements in one partition, the rest in another, and
    what it was called with."""

    lead: int = 1

    def repartition(self, rdd, min_per_partition, num_workers, *, total=None, counts=None, seed=None):
        self.called_with = (min_per_partition, num_workers, total)
        keyed = rdd.zipWithIndex().map(lambda pair: (0 if pair[1] < self.lead else 1, pair[0]))
        return keyed.partitionBy(2, lambda key: key).values()


def test_seeded_balanced_repartition_is_a_reproducible_balanced_permutation(spark) -> None:
    rdd = spark.sparkContext.parallelize(range(23), 3)
    counts = partition_counts(rdd)
    parts = balanced_repartition(rdd, 2, 23, counts, seed=5).glom().collect()
    assert sorted(len(p) for p in parts) == [11, 12]
    flat = [x for p in parts for x in p]
    assert sorted(flat) == list(range(23)) and flat != list(range(23))
    assert balanced_repartition(rdd, 2, 23, counts, seed=5).glom().collect() == parts
    assert balanced_repartition(rdd, 2, 23, None, seed=6).glom().collect() != parts


def test_unseeded_repartition_is_contiguous_and_skips_balanced_input(spark) -> None:
    rdd = spark.sparkContext.parallelize(range(10), 3)
    parts = DefaultRepartitioner(max_partitions=2).repartition(rdd, 1, 7).glom().collect()
    assert [sorted(p) for p in parts] == [list(range(5)), list(range(5, 10))]
    balanced = spark.sparkContext.parallelize(range(10), 2)
    repartitioner = DefaultRepartitioner(max_partitions=2)
    assert repartitioner.repartition(balanced, 1, 7, total=10, counts=[5, 5]) is balanced


def test_built_in_repartitioners(spark) -> None:
    rdd = spark.sparkContext.parallelize(range(10), 3)
    for cls in (DefaultRepartitioner, EqualRepartitioner, NoOpRepartitioner):
        assert issubclass(cls, Repartitioner)
    # DL4J's: DefaultRepartitioner ceil(total / min) partitions (num_workers unused), EqualRepartitioner
    # num_workers partitions (min unused), NoOpRepartitioner none
    assert [len(p) for p in DefaultRepartitioner().repartition(rdd, 3, 2).glom().collect()] == [3, 2, 3, 2]
    assert [len(p) for p in EqualRepartitioner().repartition(rdd, 3, 4).glom().collect()] == [3, 2, 3, 2]
    assert NoOpRepartitioner().repartition(rdd, 3, 4) is rdd
    with pytest.raises(TypeError, match="abstract"):
        Repartitioner()  # type: ignore[abstract]


def test_parameter_averaging_takes_a_repartitioner_as_its_strategy(spark) -> None:
    rdd = spark.sparkContext.parallelize(range(10), 3)
    custom = LeadingPartitionRepartitioner(lead=7)
    master = ParameterAveragingTrainingMaster(repartition_strategy=custom, batch_size_per_worker=4)
    assert ParameterAveragingTrainingMaster.from_json(master.to_json()) == master
    parts = repartition(rdd, Repartition.ALWAYS, master.repartition_strategy, 2, 10, min_per_partition=4)
    assert [len(p) for p in parts.glom().collect()] == [7, 3]
    assert custom.called_with == (4, 2, 10)
    assert repartition(rdd, Repartition.NEVER, custom, 2, 10) is rdd  # the mode still decides when


def test_shared_training_master_trains_the_partitions_of_a_custom_repartitioner(spark, digits) -> None:
    rdd = spark.sparkContext.parallelize(subset(digits[0], 160).split(8), 2)  # 20 DataSets
    custom = LeadingPartitionRepartitioner(lead=15)
    master = SharedTrainingMaster(
        batch_size_per_worker=8,
        rdd_data_set_num_examples=8,
        repartitioner=custom,
        collect_training_stats=True,
    )
    with SparkMultiLayer(spark, mlp_conf(hidden=8), master) as model:
        model.fit(rdd)
        computed = model.training_stats.events("SharedWorkerComputeUpdateTimesMs")
    assert custom.called_with == (1, 2, 20)  # a minibatch is one DataSet; local[2]'s two task slots
    # two workers, one per partition, trained the partitions' 15 and 5 minibatches
    per_worker: dict[tuple[str, int], int] = {}
    for e in computed:
        per_worker[(e.machine, e.process)] = per_worker.get((e.machine, e.process), 0) + 1
    assert sorted(per_worker.values()) == [5, 15]
    assert master.last_traffic["workers"] == 2
