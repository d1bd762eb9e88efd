"""Repartitioning and balanced random splits of RDDs: the :class:`Repartitioner` interface and its
built-in implementations, the ``Repartition`` / ``RepartitionStrategy`` options of parameter averaging."""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad._config import Config, check_int

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


def _count_bytes_examples(elements: Iterable[Any]) -> tuple[int, int, int]:
    count = nbytes = examples = 0
    for x in elements:
        count += 1
        nbytes += getattr(x, "nbytes", 0)  # DataSet / MultiDataSet arrays; paths and file bytes count 0
        num_examples = getattr(x, "num_examples", None)
        examples += num_examples() if callable(num_examples) else 0
    return count, nbytes, examples


def partition_sizes(rdd: RDD) -> list[tuple[int, int, int]]:
    """``(elements, bytes, examples)`` of every partition, in one Spark job.

    ``bytes`` is the in-memory size of the (Multi)DataSets' arrays (features, labels, masks) and
    ``examples`` their examples; other elements (paths, file contents) count as 0 of both.
    """
    return rdd.mapPartitions(lambda it: [_count_bytes_examples(it)]).collect()


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
    return _shuffle_sorted(keyed, n, t)


def _shuffle_sorted(keyed: RDD, n: int, total: int) -> RDD:
    """The elements of ``(position, element)`` pairs in ``n`` partitions of consecutive positions
    (``position * n // total``), each in position order: sorted by Spark's JVM shuffle, which spills to
    disk, so no Python worker holds a partition (PySpark's ``repartitionAndSortWithinPartitions`` sorts in
    the reading Python worker, up to ``spark.python.worker.memory``).

    A JVM key ``position * n + partition`` both sorts by position and gives the partition: PySpark's
    partitioner takes a Long key modulo ``n`` (after ``toInt``, hence the bound below).
    """
    from pyspark.core.rdd import RDD as CoreRDD
    from pyspark.serializers import pack_long

    if total * n >= 2**31:  # a key past Int.MaxValue would be truncated by PythonPartitioner
        return keyed.repartitionAndSortWithinPartitions(n, lambda i: i * n // total).values()
    ctx = keyed.ctx
    serializer = ctx._unbatched_serializer

    def encode(it: Iterable[tuple[int, Any]]) -> Iterator[bytes]:
        for position, x in it:
            yield pack_long(position * n + position * n // total)
            yield serializer.dumps(x)

    framed = keyed.mapPartitions(encode)
    framed._bypass_serializer = True  # type: ignore[attr-defined]
    jvm: Any = ctx._jvm
    pairs = jvm.PairwiseRDD(framed._jrdd.rdd()).asJavaPairRDD()
    partitioner = jvm.PythonPartitioner(n, id(_shuffle_sorted))
    values = jvm.PythonRDD.valueOfPair(pairs.repartitionAndSortWithinPartitions(partitioner))
    return CoreRDD(values, ctx, serializer)


class Repartitioner(Config, abc.ABC):
    """How a training master spreads the training data over Spark partitions before a fit: DL4J's
    ``org.deeplearning4j.spark.api.Repartitioner``, whose ``repartition(input, minObjectsPerPartition,
    numExecutors)`` is :meth:`repartition` here.

    SharedTrainingMaster takes one as ``repartitioner`` and ParameterAveragingTrainingMaster as
    ``repartition_strategy``. Subclass it and implement :meth:`repartition`; write the subclass as a
    dataclass (its fields are its settings) so that a master holding it still round-trips through
    JSON/YAML, as the built-in :class:`DefaultRepartitioner`, :class:`EqualRepartitioner` and
    :class:`NoOpRepartitioner` do. A repartitioner runs on the driver; the RDD it returns is what the
    workers train on, one task per partition.
    """

    @abc.abstractmethod
    def repartition(
        self,
        rdd: RDD,
        min_per_partition: int,
        num_workers: int,
        *,
        total: int | None = None,
        counts: list[int] | None = None,
        seed: int | None = None,
    ) -> RDD:
        """The training data, repartitioned.

        Args:
            rdd: the data: one element per DataSet, file path or exported batch of the fit.
            min_per_partition: the elements of one worker minibatch (``batch_size_per_worker`` over
                the examples per element, at least 1): DL4J's ``minObjectsPerPartition``.
            num_workers: the workers the master trains with at once (SharedTrainingMaster: the task
                slots it may use; ParameterAveragingTrainingMaster: ``num_workers``): DL4J's
                ``numExecutors``.
            total: the element count of ``rdd`` (None: count it).
            counts: the element count of each partition of ``rdd`` if known (saves a Spark job).
            seed: shuffle the elements with this seed if the repartitioner can (None: keep the order);
                SharedTrainingMaster passes one per fit with ``rng_seed``.

        Returns:
            The RDD to train on.
        """


class _EqualPartitions(Repartitioner):
    """A repartitioner into equal partitions (sizes differing by at most one): the built-ins that only
    differ in how many partitions they make."""

    @abc.abstractmethod
    def _partitions(self, total: int, min_per_partition: int, num_workers: int) -> int:
        """How many partitions ``total`` elements get."""

    def repartition(
        self,
        rdd: RDD,
        min_per_partition: int,
        num_workers: int,
        *,
        total: int | None = None,
        counts: list[int] | None = None,
        seed: int | None = None,
    ) -> RDD:
        """Equal partitions; ``rdd`` itself when already so and not shuffled. Arguments as for
        :meth:`Repartitioner.repartition`."""
        counts = partition_counts(rdd) if counts is None else counts
        total = sum(counts) if total is None else total
        n = self._partitions(total, max(1, min_per_partition), max(1, num_workers))
        return balanced_repartition(rdd, n, total, counts, seed)


@dataclasses.dataclass
class DefaultRepartitioner(_EqualPartitions):
    """DL4J's ``DefaultRepartitioner``: the data evenly over ``min(max_partitions, ceil(total /
    min_per_partition))`` partitions (with SharedTrainingMaster's defaults one minibatch per partition);
    ``num_workers`` is not used.

    Args:
        max_partitions: upper bound on the number of partitions.
    """

    max_partitions: int = 5000

    def __post_init__(self) -> None:
        self.max_partitions = check_int("max_partitions", self.max_partitions, minimum=1)

    def _partitions(self, total: int, min_per_partition: int, num_workers: int) -> int:
        return min(self.max_partitions, max(1, -(-total // min_per_partition)))


@dataclasses.dataclass
class EqualRepartitioner(_EqualPartitions):
    """DL4J's ``EqualRepartitioner``: one partition per worker, sizes differing by at most one;
    ``min_per_partition`` is not used. ParameterAveragingTrainingMaster's ``"balanced"`` strategy."""

    def _partitions(self, total: int, min_per_partition: int, num_workers: int) -> int:
        return num_workers


@dataclasses.dataclass
class NoOpRepartitioner(Repartitioner):
    """DL4J's ``NoOpRepartitioner``: the data keeps its partitions."""

    def repartition(
        self,
        rdd: RDD,
        min_per_partition: int,
        num_workers: int,
        *,
        total: int | None = None,
        counts: list[int] | None = None,
        seed: int | None = None,
    ) -> RDD:
        """``rdd`` itself."""
        return rdd


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
    strategy: RepartitionStrategy | Repartitioner,
    num_partitions: int,
    total: int,
    counts: list[int] | None = None,
    min_per_partition: int = 1,
) -> RDD:
    """Apply ParameterAveragingTrainingMaster's ``repartition`` / ``repartition_strategy`` options.

    Args:
        rdd: the data.
        mode: when to repartition.
        strategy: how to repartition: Spark's hash repartition, :class:`EqualRepartitioner` (BALANCED)
            or a :class:`Repartitioner`.
        num_partitions: the number of workers.
        total: element count of ``rdd``.
        counts: per-partition counts if already known.
        min_per_partition: the elements of one worker minibatch (passed on to a Repartitioner).

    Returns:
        The (possibly) repartitioned RDD.
    """
    if mode == Repartition.NEVER:
        return rdd
    if mode == Repartition.NUM_PARTITIONS_WORKERS_DIFFERS and rdd.getNumPartitions() == num_partitions:
        return rdd
    if strategy == RepartitionStrategy.SPARK_DEFAULT:
        return rdd.repartition(num_partitions)
    if strategy == RepartitionStrategy.BALANCED:
        strategy = EqualRepartitioner()
    assert isinstance(strategy, Repartitioner)  # the master validated it
    return strategy.repartition(rdd, min_per_partition, num_partitions, total=total, counts=counts)


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
            # split_assignment's blocks drawn as the elements stream by: nothing is held
            rng = np.random.default_rng([seed & 0xFFFFFFFF, index])
            block = rng.permutation(num_splits)
            for i, x in enumerate(it):
                if i and i % num_splits == 0:
                    block = rng.permutation(num_splits)
                if block[i % num_splits] == split:
                    yield x

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
    "DefaultRepartitioner",
    "EqualRepartitioner",
    "NoOpRepartitioner",
    "Repartition",
    "RepartitionStrategy",
    "Repartitioner",
    "balanced_random_split",
    "balanced_repartition",
    "partition_counts",
    "partition_sizes",
    "repartition",
    "shuffle_in_place",
    "split_assignment",
    "split_partition_counts",
]
