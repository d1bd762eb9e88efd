"""ParameterAveragingTrainingMaster: synchronous data-parallel training by averaging parameters.

Per epoch: the data is split into random balanced parts (rounds) sized so that every worker trains
about ``averaging_frequency`` minibatches of ``batch_size_per_worker`` per round, and EVERY example is
used once (DL4J dropped the surplus). After each round the workers' parameters (and updater states) are
averaged and every worker continues from the mean; only the trained parameters travel and are averaged
(:meth:`~sparkgrad.nn._flat_network.FlatNetwork.trained_ranges`): a frozen layer's stay as broadcast.
A fit of several epochs prepares its data once (counted, persisted or exported).

``averaging_jobs="one"`` (default): the data is repartitioned once per fit into one partition per
worker and ALL rounds of the fit run in ONE barrier Spark job, the workers of
:mod:`sparkgrad.spark.shared_worker` averaging over the gradient-sharing transport: each worker splits
its partition into the rounds of an epoch with the seed the per-round jobs use, trains a round locally,
sends its parameters to the controller on the driver and continues from the mean it gets back
(:mod:`sparkgrad.transport.controller`, "Parameter averaging"). The driver runs the same job, controller
and epoch barrier as SharedTrainingMaster (:class:`~sparkgrad.spark.controller_fit.ControllerFit`).

``averaging_jobs="per_round"`` (DL4J's): for each round, repartition the round's part to ``num_workers``
partitions, broadcast parameters and updater state, train each partition, ``treeAggregate`` the sums at
``aggregation_depth`` and divide on the driver: a Spark job per round. With the data already in one
partition per worker and ``repartition="never"``, both modes train on the same minibatches in the same
order and give the same parameters up to float rounding of the sums.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sparkgrad import get_num_threads
from sparkgrad._config import Config, check_int, coerce_enum
from sparkgrad.errors import TrainingError
from sparkgrad.spark.common import (
    DEFAULT_DIRECT_MEMORY_BUDGET_MB,
    NetworkSnapshot,
    TrainingData,
    TrainingMasterBase,
    by_value,
    ceil_div,
    fit_minibatch,
    mean_or_none,
    process_tag,
    run_spark,
    worker_batches,
)
from sparkgrad.spark.config import (
    AveragingJobs,
    RDDTrainingApproach,
    Repartition,
    Repartitioner,
    RepartitionStrategy,
    TrainingHook,
    VoidConfiguration,
    check_storage_level,
)
from sparkgrad.spark.connect import connect_partitions, is_connect
from sparkgrad.spark.controller_fit import ControllerFit, dynamic_allocation, task_slots
from sparkgrad.spark.devices import check_worker_device, device_index, resolve_worker_device, to_host
from sparkgrad.spark.partitioning import (
    balanced_random_split,
    repartition,
    split_partition_counts,
)
from sparkgrad.spark.progress import FitProgress, estimate_minibatches
from sparkgrad.spark.shared_worker import AVERAGING_WORKER_FIT, AVERAGING_WORKER_INIT, AveragingRounds
from sparkgrad.spark.stats import SparkTrainingStats, Timer, event, now_ms, run_epoch_callback
from sparkgrad.spark.threads import check_task_threads, task_threads
from sparkgrad.transport import Controller, ZmqTransportConfiguration

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark import SparkContext

    from sparkgrad.nn._flat_network import FlatNetwork, N

# Stats keys (DL4J names).
EXPORT = "ParameterAveragingMasterExportTimesMs"
COUNT = "ParameterAveragingMasterCountRddSizeTimesMs"
BROADCAST = "ParameterAveragingMasterBroadcastCreateTimesMs"
FIT = "ParameterAveragingMasterFitTimesMs"
EPOCH = "ParameterAveragingMasterEpochTimesMs"
SPLIT = "ParameterAveragingMasterSplitTimesMs"
MAP_PARTITIONS = "ParameterAveragingMasterMapPartitionsTimesMs"
AGGREGATE = "ParameterAveragingMasterAggregateTimesMs"
PROCESS_PARAMS = "ParameterAveragingMasterProcessParamsUpdaterTimesMs"
REPARTITION = "ParameterAveragingMasterRepartitionTimesMs"
WORKER_TOTAL = "WorkerFlatMapTotalTimeMs"
WORKER_INIT = AVERAGING_WORKER_INIT
WORKER_GET_DATA = "WorkerFlatMapDataSetGetTimesMs"
WORKER_FIT = AVERAGING_WORKER_FIT


@dataclass
class _Sum:
    """Running sums of worker results (params, updater state, scores) for treeAggregate."""

    params: np.ndarray | None = None  # the trained entries only (TrainedRanges.gather)
    updater: np.ndarray | None = None
    score: float = 0.0
    count: int = 0
    max_batches: int = 0
    stats: SparkTrainingStats | None = None
    batches: int = 0  # minibatches trained by all workers (the progress line)
    retried_tasks: int = 0  # results of task re-runs (Spark retries after a failure or a lost executor)
    retrained_minibatches: int = 0  # minibatches those re-runs trained (a failed attempt trained some)


def _add(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _combine(x: _Sum, y: _Sum) -> _Sum:
    stats = x.stats
    if y.stats is not None:
        stats = y.stats if stats is None else stats.merge(y.stats)
    return _Sum(
        _add(x.params, y.params),
        _add(x.updater, y.updater),
        x.score + y.score,
        x.count + y.count,
        max(x.max_batches, y.max_batches),
        stats,
        x.batches + y.batches,
        x.retried_tasks + y.retried_tasks,
        x.retrained_minibatches + y.retrained_minibatches,
    )


@dataclass
class _SplitJob:
    """Broadcast value of one averaging round."""

    snapshot: NetworkSnapshot
    kind: str
    loader: Any
    batch_size: int
    prefetch: int
    save_updater: bool
    hooks: tuple
    collect_stats: bool
    worker_device: str
    task_threads: int | None


def _train_partition(job_bc: Any) -> Any:
    def run(index: int, units: Iterable[Any]) -> Iterator[_Sum]:
        from pyspark import TaskContext

        task = TaskContext.get()
        rerun = task is not None and task.attemptNumber() > 0  # PySpark has no stage attempt number
        try:
            for result in _train_worker(job_bc, units):
                if rerun:  # counted, not hidden: the failed attempt trained some of these already
                    result.retried_tasks, result.retrained_minibatches = 1, result.batches
                yield result
        except TrainingError as exc:
            # name the worker: the driver quotes this last "TrainingError: ..." line to the user
            raise TrainingError(f"worker {index} ({process_tag()}): {exc}") from exc

    return run


def _train_worker(job_bc: Any, units: Iterable[Any]) -> Iterator[_Sum]:
    """Train one partition's worker from the broadcast job; yields its result (nothing when empty)."""
    start = now_ms()
    stats = SparkTrainingStats() if job_bc.value.collect_stats else None
    with Timer(stats, "ParameterAveragingWorkerBroadcastGetValueTimeMs"):
        job: _SplitJob = job_bc.value
    with task_threads(job.task_threads):
        batches = worker_batches(units, job.kind, job.loader, job.batch_size, job.prefetch)
        net = None
        score, n_batches = 0.0, 0
        while True:
            t = now_ms()
            ds = next(batches, None)
            if ds is None:
                break
            if stats is not None:
                stats.add(WORKER_GET_DATA, event(t))
            if net is None:
                device = resolve_worker_device(job.worker_device)
                with Timer(stats, WORKER_INIT, gpu=device_index(device)):
                    net = job.snapshot.build(device=device)
            with Timer(stats, WORKER_FIT, examples=ds.num_examples()):
                score = fit_minibatch(net, ds, job.hooks)
            n_batches += 1
        if net is None:  # empty partition: excluded from the average
            return
        if stats is not None:
            stats.add(WORKER_TOTAL, event(start, threads=get_num_threads()))
        updater = to_host(net.updater_state()) if job.save_updater else None
        # frozen parameters are the broadcast's on every worker: only the trained ones are sent
        params = net.trained_ranges().gather(to_host(net.params()))
        yield _Sum(params, updater, float(score), 1, n_batches, stats, n_batches)


@dataclass
class ParameterAveragingTrainingMaster(ControllerFit, TrainingMasterBase, Config):
    """Synchronous parameter averaging (DL4J ``ParameterAveragingTrainingMaster``).

    Args:
        rdd_data_set_num_examples: examples in each DataSet of the RDD (Direct mode / fit_paths sizing).
        num_workers: workers per averaging round (default: Spark's default parallelism; with
            ``averaging_jobs="one"`` at most the cluster's task slots).
        batch_size_per_worker: minibatch size on the workers.
        averaging_frequency: minibatches each worker trains between two averagings.
        aggregation_depth: depth of Spark's treeAggregate.
        save_updater: average and keep the updater state (else every round starts from the driver's).
        worker_prefetch_num_batches: minibatches a worker loads ahead in a background thread (0: none).
        repartition: when to repartition each split (``Repartition``).
        repartition_strategy: how: ``"balanced"`` (:class:`~sparkgrad.spark.EqualRepartitioner`),
            ``"spark_default"`` (Spark's hash repartition) or a :class:`~sparkgrad.spark.Repartitioner`,
            called with a minibatch's worth of elements as ``min_per_partition`` and the workers as
            ``num_workers``.
        storage_level: Spark storage level of an RDD of DataSets (or a DataFrame's conversion) between
            its jobs: ``"DISK_ONLY"`` (default: Spark's local disk, served from the page cache, never
            the JVM heap) or DL4J's ``"MEMORY_ONLY_SER"`` (partitions that do not fit are recomputed).
        storage_level_streams: storage level of data read from files (``fit(dir)``, ``fit_paths``,
            exported data): ``"NONE"`` (default: every job reads the files again, nothing is held) or
            DL4J's ``"MEMORY_ONLY"``.
        rdd_training_approach: ``"auto"`` (default: train directly from the persisted RDD while its
            DataSets' arrays total at most ``direct_memory_budget_mb``, export above), ``"export"``
            (batch and save the RDD once as files, train from them) or ``"direct"`` (always train from
            the RDD). See :class:`~sparkgrad.spark.RDDTrainingApproach`; ``fit_paths`` never exports.
        direct_memory_budget_mb: the AUTO threshold in MiB (default 512; 0 exports every DataSet RDD).
        export_directory: where exports go (any Hadoop URI); default ``hadoop.tmp.dir/sparkgrad``.
        rng_seed: seed of the random splits (None: random).
        collect_training_stats: record phase timings (see ``SparkMultiLayer.training_stats``).
        training_hooks: :class:`TrainingHook` objects run around every worker update; they travel with
            cloudpickle, so hooks defined locally or in ``__main__`` work.
        progress: show a live progress line on the driver during fits (:mod:`sparkgrad.spark.progress`):
            epoch, minibatches, the workers' mean loss and examples/s, updated after every averaging round.
        worker_device: where the workers train: ``"auto"`` (default: the GPU Spark assigned to the task,
            else ``SPARKGRAD_DEVICE`` on the executor, else the CPU), ``"cpu"``, ``"cuda"`` or
            ``"cuda:N"`` (:mod:`sparkgrad.spark.devices`); the driver's network stays on the CPU. The
            ``ParameterAveragingWorkerInitTimeMs`` stats events record it as ``gpu`` (-1: CPU).
        averaging_jobs: ``"one"`` (default): every round of a fit in one barrier Spark job, averaging
            over the transport (needs ``num_workers`` task slots at once; no Spark job per round, which
            makes short rounds many times faster: the README's benchmarks); ``"per_round"``: DL4J's
            Spark job per round. See :class:`~sparkgrad.spark.AveragingJobs`.
        void_configuration: ``averaging_jobs="one"``: the controller's address and port (default: the
            driver's address, a free port), as for SharedTrainingMaster.
        transport: ``averaging_jobs="one"``: transport timeouts
            (:class:`~sparkgrad.transport.ZmqTransportConfiguration`; None = defaults; a round waits at
            most ``epoch_timeout_ms`` for the slowest worker).
        task_threads: the OpenMP/OpenBLAS threads of every Spark task of a model with this master
            (training, evaluation, scoring, inference); None (default): the task's CPUs,
            ``spark.task.cpus``. Set for the task and restored after it
            (:mod:`sparkgrad.spark.threads`). The ``WorkerFlatMapTotalTimeMs`` stats events record it as
            ``threads``.

    A non-finite score, gradient or update on a worker fails the fit with a TrainingError naming the
    worker (partition index and host:pid), the iteration and the first non-finite input.

    With ``averaging_jobs="one"`` a task that fails or loses its executor fails the fit (TrainingError):
    the rounds of the one job cannot be resumed, and the stage Spark re-runs is refused. With
    ``"per_round"``, a task that fails or loses its executor is re-run by Spark from the round's broadcast
    parameters; only the re-run's result is averaged. ``last_retries`` counts them for the last fit:
    ``retried_tasks`` (re-run results averaged) and ``retrained_minibatches`` (the minibatches those
    re-runs trained, some of which the failed attempt had trained before), and each round with re-runs
    logs a warning.
    """

    rdd_data_set_num_examples: int = 1
    num_workers: int | None = None
    batch_size_per_worker: int = 16
    averaging_frequency: int = 5
    aggregation_depth: int = 2
    save_updater: bool = True
    worker_prefetch_num_batches: int = 0
    repartition: Repartition = Repartition.ALWAYS
    repartition_strategy: RepartitionStrategy | Repartitioner = RepartitionStrategy.BALANCED
    storage_level: str = "DISK_ONLY"
    storage_level_streams: str = "NONE"
    rdd_training_approach: RDDTrainingApproach = RDDTrainingApproach.AUTO
    direct_memory_budget_mb: int = DEFAULT_DIRECT_MEMORY_BUDGET_MB
    export_directory: str | None = None
    rng_seed: int | None = None
    collect_training_stats: bool = False
    training_hooks: tuple = field(default_factory=tuple)
    progress: bool = True
    worker_device: str = "auto"
    averaging_jobs: AveragingJobs = AveragingJobs.ONE
    void_configuration: VoidConfiguration = field(default_factory=VoidConfiguration)
    transport: ZmqTransportConfiguration | None = None
    task_threads: int | None = None

    def __post_init__(self) -> None:
        self.worker_device = check_worker_device("worker_device", self.worker_device)
        self.task_threads = check_task_threads("task_threads", self.task_threads)
        self.averaging_jobs = coerce_enum(AveragingJobs, self.averaging_jobs, "averaging_jobs")
        if not isinstance(self.void_configuration, VoidConfiguration):
            raise ValueError(
                f"void_configuration: expected a VoidConfiguration, got {self.void_configuration!r}"
            )
        if self.transport is not None and not isinstance(self.transport, ZmqTransportConfiguration):
            raise ValueError(f"transport: expected a ZmqTransportConfiguration, got {self.transport!r}")
        self.rdd_data_set_num_examples = check_int(
            "rdd_data_set_num_examples", self.rdd_data_set_num_examples, 1
        )
        if self.num_workers is not None:
            self.num_workers = check_int("num_workers", self.num_workers, minimum=1)
        self.batch_size_per_worker = check_int("batch_size_per_worker", self.batch_size_per_worker, minimum=1)
        self.averaging_frequency = check_int("averaging_frequency", self.averaging_frequency, minimum=1)
        self.aggregation_depth = check_int("aggregation_depth", self.aggregation_depth, minimum=1)
        self.worker_prefetch_num_batches = check_int(
            "worker_prefetch_num_batches", self.worker_prefetch_num_batches, minimum=0
        )
        self.repartition = coerce_enum(Repartition, self.repartition, "repartition")
        if not isinstance(self.repartition_strategy, Repartitioner):
            self.repartition_strategy = coerce_enum(
                RepartitionStrategy, self.repartition_strategy, "repartition_strategy"
            )
        self.storage_level = check_storage_level("storage_level", self.storage_level)
        self.storage_level_streams = check_storage_level("storage_level_streams", self.storage_level_streams)
        self.rdd_training_approach = coerce_enum(
            RDDTrainingApproach, self.rdd_training_approach, "rdd_training_approach"
        )
        self.direct_memory_budget_mb = check_int(
            "direct_memory_budget_mb", self.direct_memory_budget_mb, minimum=0
        )
        if self.rng_seed is not None:
            self.rng_seed = check_int("rng_seed", self.rng_seed, minimum=0)
        if self.export_directory is not None and not (
            isinstance(self.export_directory, str) and self.export_directory.strip()
        ):
            raise ValueError(
                f"export_directory: expected a directory URI or None, got {self.export_directory!r}"
            )
        for name in ("save_updater", "collect_training_stats", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        self.training_hooks = tuple(self.training_hooks)
        for hook in self.training_hooks:
            self._check_hook(hook)
        self._runtime_init()
        self._rng = random.Random(self.rng_seed)
        self._job_first_epoch: int | None = None  # while a one-job fit runs: the epoch count it started at
        self.last_traffic: dict[str, float] = {}  # averaging_jobs="one": the transport's counters
        # per fit: Spark task re-runs whose results were averaged (after a failed task or lost executor)
        self.last_retries: dict[str, int] = {"retried_tasks": 0, "retrained_minibatches": 0}

    @staticmethod
    def _check_hook(hook: Any) -> None:
        if not (callable(getattr(hook, "pre_update", None)) and callable(getattr(hook, "post_update", None))):
            raise ValueError(
                f"training_hooks: {hook!r} has no pre_update/post_update methods (see TrainingHook)"
            )

    def add_hook(self, hook: TrainingHook) -> None:
        """Add a training hook (run on the workers around every update)."""
        self._check_hook(hook)
        self.training_hooks = (*self.training_hooks, hook)

    def remove_hook(self, hook: TrainingHook) -> None:
        """Remove a previously added hook (ValueError if absent)."""
        if hook not in self.training_hooks:
            raise ValueError(f"hook: {hook!r} is not registered")
        hooks = list(self.training_hooks)
        hooks.remove(hook)
        self.training_hooks = tuple(hooks)

    # -- training -----------------------------------------------------------------------------
    def execute_training(
        self,
        sc: SparkContext,
        network: N,
        rdd: Any,
        kind: str,
        loader: Any = None,
        epochs: int = 1,
        epoch_callback: Callable[[int, N], Any] | None = None,
        epoch_progress: Callable[[int, dict[str, float]], None] | None = None,
        epoch_state: int = 0,
    ) -> float:
        """Train ``network`` in place for ``epochs`` passes over ``rdd``; returns the average final
        score of the last epoch.

        The data is prepared once for the whole fit; ``network.epoch_count`` grows by one per epoch.

        Args:
            sc: the SparkContext.
            network: the driver's network (parameters and updater state are replaced).
            rdd: RDD of DataSets (kind "dataset") or of paths (kind "path").
            kind: "dataset" or "path".
            loader: path -> DataSet (kind "path"), or the serialized loader of the data's kind
                (kinds "dataset", for an export, and "bytes").
            epochs: passes over the data (validated by the caller).
            epoch_callback: called on the driver after every epoch as ``epoch_callback(epoch, network)``
                with the epoch's index in ``network.epoch_count`` and ``network`` holding the averaged
                parameters and updater state; a truthy return stops training after that epoch, a
                mapping of metrics is recorded (see :func:`~sparkgrad.spark.stats.run_epoch_callback`).
            epoch_progress: called on the driver at every epoch end, before ``epoch_callback``, as
                ``epoch_progress(epoch, figures)`` with the epoch's progress figures (loss, examples/s,
                see :meth:`~sparkgrad.spark.progress.FitProgress.end_epoch`); experiment tracking uses it.
            epoch_state: accepted for the masters' common signature: the network holds the averaged
                updater state at every epoch end anyway (with ``save_updater``).
        """
        stats = SparkTrainingStats() if self.collect_training_stats else None
        self.last_stats = stats  # the running fit's, for its checkpoints
        fit_start = now_ms()
        self._begin_order(network)
        score, trained, examples = float("nan"), 0, 0
        self.last_retries = {"retried_tasks": 0, "retrained_minibatches": 0}
        try:
            data = self.prepare(sc, rdd, kind, loader, stats, EXPORT, COUNT)
            examples = data.num_units * data.examples_per_unit
            one_job = self.averaging_jobs == AveragingJobs.ONE
            if not one_job and is_connect(sc):
                log.info(
                    "Spark Connect: averaging_jobs='per_round' needs a SparkContext; the rounds run in one "
                    "job, averaged over the transport (averaging_jobs='one')"
                )
                one_job = True
            if one_job and dynamic_allocation(sc):
                log.info(
                    "dynamic allocation is on and Spark runs no barrier stage with it (SPARK-24942): "
                    "averaging_jobs='one' falls back to DL4J's Spark job per round"
                )
                one_job = False
            fit = self._fit_one_job if one_job else self._fit_job_per_round
            score, trained = fit(sc, network, data, stats, epochs, epoch_callback, epoch_progress)
        finally:
            if stats is not None and trained:
                stats.add(FIT, event(fit_start, examples=trained * examples, epochs=trained))
            self.last_stats = stats
        return score

    def _min_per_partition(self, data: TrainingData) -> int:
        """The elements of one worker minibatch (a Repartitioner's ``min_per_partition``)."""
        return max(1, self.batch_size_per_worker // data.examples_per_unit)

    def _rounds_per_epoch(self, data: TrainingData, workers: int) -> int:
        """The number of balanced random splits (averaging rounds) of an epoch."""
        per_split = max(
            1,
            ceil_div(workers * self.batch_size_per_worker * self.averaging_frequency, data.examples_per_unit),
        )
        return ceil_div(data.num_units, per_split)

    def _fit_job_per_round(
        self,
        sc: SparkContext,
        network: N,
        data: TrainingData,
        stats: SparkTrainingStats | None,
        epochs: int,
        epoch_callback: Callable[[int, N], Any] | None,
        epoch_progress: Callable[[int, dict[str, float]], None] | None,
    ) -> tuple[float, int]:
        """DL4J's fit: a Spark job per averaging round. Returns (the last epoch's score, epochs trained)."""
        score, trained = float("nan"), 0
        examples = data.num_units * data.examples_per_unit
        workers = self.num_workers or sc.defaultParallelism
        rounds = ceil_div(examples, workers * self.batch_size_per_worker * self.averaging_frequency)
        progress = FitProgress(
            epochs,
            int(network.epoch_count),
            estimate_minibatches(examples, rounds * workers, self.batch_size_per_worker),
            self.batch_size_per_worker,
            enabled=self.progress,
            on_epoch=epoch_progress,
        )
        try:
            for _ in range(epochs):
                epoch_start = now_ms()
                score = self._train_epoch(sc, network, data, stats, progress)
                progress.end_epoch(int(network.epoch_count))
                network.epoch_count += 1
                trained += 1
                if stats is not None:
                    stats.add(EPOCH, event(epoch_start, examples=examples, epoch=network.epoch_count - 1))
                if run_epoch_callback(epoch_callback, network.epoch_count - 1, network, stats):
                    break
        finally:
            progress.close()
        return score, trained

    def _fit_one_job(
        self,
        sc: SparkContext,
        network: N,
        data: TrainingData,
        stats: SparkTrainingStats | None,
        epochs: int,
        epoch_callback: Callable[[int, N], Any] | None,
        epoch_progress: Callable[[int, dict[str, float]], None] | None,
    ) -> tuple[float, int]:
        """Every round of the fit in one barrier job, averaging over the transport (module docstring).
        Returns (the last epoch's score, epochs trained)."""
        slots = task_slots(sc)
        workers = self.num_workers or (slots if is_connect(sc) else min(sc.defaultParallelism, slots))
        with Timer(stats, REPARTITION):
            units: Any
            if is_connect(sc):
                units = connect_partitions(data, workers, self._min_per_partition(data))
            else:
                units = repartition(
                    data.rdd,
                    self.repartition,
                    self.repartition_strategy,
                    workers,
                    data.num_units,
                    data.counts,
                    self._min_per_partition(data),
                )
        partitions = units.getNumPartitions()
        if partitions > slots:
            raise ValueError(
                f"num_workers: averaging_jobs='one' trains {partitions} partitions in one barrier job, "
                f"which needs as many task slots, and the cluster has {slots}: lower num_workers (or let "
                "the data be repartitioned), or use averaging_jobs='per_round'"
            )
        # the split seeds the per-round fit would draw, one per epoch; only the epochs trained are used up
        probe = random.Random()
        probe.setstate(self._rng.getstate())
        first_epoch = self._job_first_epoch = int(network.epoch_count)
        self._rounds = AveragingRounds(
            self._rounds_per_epoch(data, workers),
            {first_epoch + e: probe.getrandbits(31) for e in range(epochs)},
            self.save_updater,
            tuple(by_value(hook) for hook in self.training_hooks),  # local/__main__ hooks too
            network.trained_ranges(),
        )
        results, round_scores = self._run_job(
            sc, network, units, data, stats, epochs, epoch_callback, slots, epoch_progress
        )
        trained = int(self.last_traffic["epochs"])
        self._job_first_epoch = None
        for _ in range(trained):
            self._rng.getrandbits(31)
        if stats is not None:
            for result in results.values():
                if result.stats is not None:
                    stats.merge(result.stats)
            for _, iteration, score in round_scores:  # as the per-round jobs record them
                stats.add_score("average of the workers", iteration, score)
        last = [s for epoch, _, s in round_scores if epoch == first_epoch + trained - 1]
        return (float(np.mean(last)) if last else float("nan")), trained

    _rerun_failed_stage: ClassVar[bool] = False  # the rounds cannot be resumed: the task's error ends the fit

    def _controller_options(self) -> dict[str, Any]:
        return {
            "averaging": True,
            "average_updater_state": self.save_updater,
            "averaged_ranges": self._rounds.trained,
        }

    def _job_options(self, network: Any, partitions: int, slots: int) -> dict[str, Any]:
        return {"averaging": self._rounds}

    def _epoch_state(self, network: Any, controller: Controller) -> None:
        """The averaged updater state (with ``save_updater``; else the network keeps its own)."""
        state = controller.updater_state()
        if self.save_updater and state is not None and state.size:
            network.set_updater_state(state)

    def _checkpoint_state(self, network: Any) -> dict[str, Any]:
        """Besides the data order: the position of the generator that draws each epoch's split seed
        (in a one-job fit, advanced by the epochs the job trained so far, as the job-per-round fit
        would have)."""
        rng = random.Random()
        rng.setstate(self._rng.getstate())
        if self._job_first_epoch is not None:
            for _ in range(int(network.epoch_count) - self._job_first_epoch):
                rng.getrandbits(31)
        version, positions, gauss = rng.getstate()
        return {**super()._checkpoint_state(network), "split_seeds": [version, list(positions), gauss]}

    def _restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """The next fit draws the split seeds the uninterrupted fit would have drawn too."""
        super()._restore_checkpoint_state(state)
        version, positions, gauss = state["split_seeds"]
        if not isinstance(positions, list) or not all(
            isinstance(p, int) and 0 <= p < 2**32 for p in positions
        ):
            raise ValueError("split_seeds: not a random.Random state")
        self._rng.setstate((version, tuple(positions), gauss))

    def _train_epoch(
        self,
        sc: SparkContext,
        network: FlatNetwork,
        data: TrainingData,
        stats: SparkTrainingStats | None,
        progress: FitProgress,
    ) -> float:
        workers = self.num_workers or sc.defaultParallelism
        num_splits = self._rounds_per_epoch(data, workers)
        seed = self._rng.getrandbits(31)
        with Timer(stats, SPLIT):
            splits = balanced_random_split(data.rdd, num_splits, seed)
            split_counts = split_partition_counts(data.counts, seed, num_splits)
        scores = []
        for split, part_counts in zip(splits, split_counts):
            size = sum(part_counts)
            if size == 0:
                continue
            with Timer(stats, REPARTITION):
                part = repartition(
                    split,
                    self.repartition,
                    self.repartition_strategy,
                    workers,
                    size,
                    part_counts,
                    self._min_per_partition(data),
                )
            scores.append(self._average_round(sc, network, part, data, stats, progress))
        return float(np.mean([s for s in scores if s is not None])) if scores else float("nan")

    def _average_round(
        self,
        sc: SparkContext,
        network: FlatNetwork,
        part: Any,
        data: TrainingData,
        stats: SparkTrainingStats | None,
        progress: FitProgress,
    ) -> float | None:
        with Timer(stats, BROADCAST):
            job = _SplitJob(
                NetworkSnapshot.of(network),
                data.kind,
                data.loader,
                self.batch_size_per_worker,
                self.worker_prefetch_num_batches,
                self.save_updater,
                tuple(by_value(hook) for hook in self.training_hooks),  # local/__main__ hooks too
                self.collect_training_stats,
                self.worker_device,
                self.task_threads,
            )
            bc = sc.broadcast(job)
        try:
            with Timer(stats, MAP_PARTITIONS, partitions=part.getNumPartitions()):
                results = part.mapPartitionsWithIndex(_train_partition(bc))
            with Timer(stats, AGGREGATE):
                total = run_spark(
                    "training",
                    lambda: results.treeAggregate(_Sum(), _combine, _combine, depth=self.aggregation_depth),
                )
        finally:
            bc.unpersist()
        if total.count == 0:
            return None
        if total.retried_tasks:
            self.last_retries["retried_tasks"] += total.retried_tasks
            self.last_retries["retrained_minibatches"] += total.retrained_minibatches
            log.warning(
                "averaging round at iteration %d: %d re-run task(s) (a task failed or its executor was "
                "lost) trained %d minibatches again",
                network.iteration_count,
                total.retried_tasks,
                total.retrained_minibatches,
            )
        with Timer(stats, PROCESS_PARAMS):
            mean = (total.params / total.count).astype(network.params().dtype, copy=False)
            network.set_params(network.trained_ranges().put_back(mean, network.params()))
            updater = mean_or_none(total.updater, total.count)
            if updater is not None:
                network.set_updater_state(updater.astype(network.updater_state().dtype, copy=False))
            network.iteration_count += total.max_batches
        if stats is not None:
            if total.stats is not None:
                stats.merge(total.stats)
            # the workers' mean last-minibatch score at the round's (averaged) iteration
            stats.add_score("average of the workers", network.iteration_count, total.score / total.count)
        progress.minibatches(total.batches)
        progress.loss(total.score / total.count)
        progress.refresh()
        return total.score / total.count


__all__ = ["ParameterAveragingTrainingMaster"]
