"""Repartitioning, balanced random splits and minibatch re-batching of RDDs."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pyspark import RDD


class Repartition(enum.Enum):
    """When the data is repartitioned before training."""

    ALWAYS = "always"
    NEVER = "never"
    NUM_PARTITIONS_WORKERS_DIFFERS = "num_partitions_workers_differs"


class RepartitionStrategy(enum.Enum):
    """How: Spark's hash repartition, or contiguous equal-sized partitions."""

    SPARK_DEFAULT = "spark_default"
    BALANCED = "balanced"


def partition_counts(rdd: RDD) -> list[int]:
    """Number of elements in every partition (one Spark job)."""
    return rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()


def _count_and_bytes(elements: Iterable[Any]) -> tuple[int, int]:
    count = nbytes = 0
    for x in elements:
        count += 1
        nbytes += getattr(x, "nbytes", 0)  # DataSet / MultiDataSet arrays; paths and file bytes count 0
    return count, nbytes


def partition_sizes(rdd: RDD) -> list[tuple[int, int]]:
    """``(elements, bytes)`` of every partition, in one Spark job.

    ``bytes`` is the in-memory size of the (Multi)DataSets' arrays (features, labels, masks); other elements
    (paths, file contents) count as 0 bytes.
    """
    return rdd.mapPartitions(lambda it: [_count_and_bytes(it)]).collect()


def balanced_repartition(
    rdd: RDD, num_partitions: int, total: int, counts: list[int] | None = None, seed: int | None = None
) -> RDD:
    """Equal partitions: sizes differ by at most one.

    Without ``seed`` the partitions are contiguous and this is a no-op when they already are balanced;
    with ``seed`` the elements are also put in a random order (a permutation drawn from ``seed``), in
    the same single shuffle.

    Args:
        rdd: the data.
        num_partitions: target partition count.
        total: element count of ``rdd``.
        counts: per-partition counts if already known (saves a Spark job).
        seed: seed of the random order (None: keep the order).

    Returns:
        The repartitioned RDD.
    """
    counts = partition_counts(rdd) if counts is None else counts
    if seed is None and len(counts) == num_partitions:
        low, high = total // num_partitions, -(-total // num_partitions)
        if all(low <= c <= high for c in counts):
            return rdd
    n, t = num_partitions, max(total, 1)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    # position of the element with global index i: i itself, or its place in a random permutation
    order = None if seed is None else np.random.default_rng(seed).permutation(t).astype(np.int64)

    def index(p: int, it: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        if order is None:
            return ((offsets[p] + j, x) for j, x in enumerate(it))
        return ((int(order[offsets[p] + j]), x) for j, x in enumerate(it))

    keyed = rdd.mapPartitionsWithIndex(index)
    if seed is None:
        return keyed.partitionBy(n, lambda i: i * n // t).values()
    return keyed.repartitionAndSortWithinPartitions(n, lambda i: i * n // t).values()


def shuffle_in_place(rdd: RDD) -> RDD:
    """``rdd``'s partitions, contents and order unchanged, behind a shuffle: a barrier stage over the
    result does not contain ``rdd``'s own chain (Spark refuses a barrier stage whose chain holds an RDD
    with another number of partitions, such as a union or a coalesce: SPARK-24820)."""
    n = rdd.getNumPartitions()
    keyed = rdd.mapPartitionsWithIndex(lambda i, it: ((i, x) for x in it))
    return keyed.partitionBy(n, lambda i: i).values()  # one map partition feeds each: order kept


def repartition(
    rdd: RDD,
    mode: Repartition,
    strategy: RepartitionStrategy,
    num_partitions: int,
    total: int,
    counts: list[int] | None = None,
) -> RDD:
    """Apply a master's ``repartition`` / ``repartition_strategy`` options.

    Args:
        rdd: the data.
        mode: when to repartition.
        strategy: how to repartition.
        num_partitions: the number of workers.
        total: element count of ``rdd``.
        counts: per-partition counts if already known.

    Returns:
        The (possibly) repartitioned RDD.
    """
    if mode == Repartition.NEVER:
        return rdd
    if mode == Repartition.NUM_PARTITIONS_WORKERS_DIFFERS and rdd.getNumPartitions() == num_partitions:
        return rdd
    if strategy == RepartitionStrategy.SPARK_DEFAULT:
        return rdd.repartition(num_partitions)
    return balanced_repartition(rdd, num_partitions, total, counts)


def split_assignment(partition: int, seed: int, num_splits: int, count: int) -> np.ndarray:
    """The split of each of a partition's ``count`` elements in :func:`balanced_random_split`.

    A fresh permutation of the split ids for every block of ``num_splits`` elements: balanced splits.
    """
    rng = np.random.default_rng([seed & 0xFFFFFFFF, partition])
    blocks = -(-count // num_splits)
    return np.concatenate([rng.permutation(num_splits) for _ in range(max(blocks, 1))])[:count]


def balanced_random_split(rdd: RDD, num_splits: int, seed: int) -> list[RDD]:
    """Split ``rdd`` into ``num_splits`` random parts whose sizes differ by at most one per partition.

    Every element lands in exactly one split; the same seed gives the same splits. Persist ``rdd``
    first: each split re-reads it.

    Args:
        rdd: the data.
        num_splits: how many parts.
        seed: the split seed.

    Returns:
        The list of split RDDs.
    """
    if num_splits <= 1:
        return [rdd]

    def part(split: int) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
        def select(index: int, it: Iterable[Any]) -> Iterator[Any]:
            items = list(it)
            assign = split_assignment(index, seed, num_splits, len(items))
            return (x for x, a in zip(items, assign) if a == split)

        return select

    return [rdd.mapPartitionsWithIndex(part(i), preservesPartitioning=True) for i in range(num_splits)]


def split_partition_counts(counts: list[int], seed: int, num_splits: int) -> list[list[int]]:
    """Per-partition element counts of every split made by :func:`balanced_random_split` (no Spark job)."""
    if num_splits <= 1:
        return [list(counts)]
    per = [
        np.bincount(split_assignment(p, seed, num_splits, c), minlength=num_splits)
        for p, c in enumerate(counts)
    ]
    return [[int(x[i]) for x in per] for i in range(num_splits)]


__all__ = [
    "Repartition",
    "RepartitionStrategy",
    "balanced_random_split",
    "balanced_repartition",
    "partition_counts",
    "partition_sizes",
    "repartition",
    "shuffle_in_place",
    "split_assignment",
    "split_partition_counts",
]
