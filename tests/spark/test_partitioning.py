"""Balanced repartitioning with and without the seeded shuffle."""

from __future__ import annotations

from sparkgrad.spark import DefaultRepartitioner
from sparkgrad.spark.partitioning import balanced_repartition, partition_counts


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
    parts = DefaultRepartitioner(max_partitions=2).repartition(rdd, 1, 10).glom().collect()
    assert [sorted(p) for p in parts] == [list(range(5)), list(range(5, 10))]
    balanced = spark.sparkContext.parallelize(range(10), 2)
    assert DefaultRepartitioner(max_partitions=2).repartition(balanced, 1, 10, [5, 5]) is balanced
