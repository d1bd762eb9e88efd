"""SharedTrainingMaster: asynchronous gradient sharing with Strom threshold-encoded updates.

This module is the driver's side: a :class:`~sparkgrad.transport.Controller` thread keeps the
authoritative parameters by applying every update it relays (PLAIN star topology); one controller serves
every epoch of a fit. The executors' side, the :class:`~sparkgrad.spark.shared_worker.SharedWorker` each
training task runs (one per Python worker process and fit, kept across that fit's epochs and tasks), is
:mod:`sparkgrad.spark.shared_worker`. Within an epoch workers never wait for each other. The Spark job, the
epoch barrier and the watch over the controller are :class:`~sparkgrad.spark.controller_fit.ControllerFit`'s,
which ParameterAveragingTrainingMaster shares.

Epochs: by default the data is spread over one partition per Spark task slot and ALL epochs of a fit
run in ONE Spark job, a barrier stage (Spark starts all its tasks together or fails at once, so no
worker waits for a slot that never frees). Each task keeps its partition's elements in memory, trains
over them once per epoch in a new order (seeded by ``rng_seed``, else by a per-fit random seed), and at
every epoch end reports EPOCH_END to the controller and waits; once every worker has reported, the
driver runs the user's ``epoch_callback`` on the controller's parameters and the controller lets the
workers go on or stop. Residuals, updater state and threshold state thus live through the whole fit,
as in single-process training. With a repartitioner that yields more partitions than there are task
slots (DL4J's one minibatch per partition), each epoch is one Spark job instead, workers SYNC at the end
of each task, and the job boundary is the epoch boundary; the controller and the workers still live for
the whole fit.

The final model is the controller's copy; updater state, score and threshold-algorithm state are
averaged over the workers (one result per worker process: its latest) and the threshold state seeds the
next fit. In a barrier job each task's updater state reaches the controller over the transport at the
task's end (``SharedJob.final_state_report``) rather than in its Spark task result, which is slow for
states of hundreds of MB.

Security and failure handling: every fit draws a fresh random 256-bit secret (or uses
``VoidConfiguration.secret``) that authenticates every frame (:mod:`sparkgrad.transport.frame`); it
reaches the executors only inside the job broadcast, with the public half of the controller's per-fit
Ed25519 key that signs everything only the controller may send (:mod:`sparkgrad.transport.signing`). The
driver watches the controller while the Spark
job runs: if the controller thread fails, the job group is cancelled and the fit raises TrainingError
with the controller's own error. A worker the controller dropped as a slow peer re-joins; a failed task's
Spark retry starts a fresh worker from the controller's current parameters and the latest updater state a
worker reported (at most ``ZmqTransportConfiguration.updater_state_interval_ms`` plus one epoch old;
before the first report: the state the fit started from), see :mod:`sparkgrad.spark.shared_worker`.
Workers report the minibatches they trained per (partition, epoch); a partition's epoch reported twice
was re-run by a Spark task retry, and ``last_traffic["retrained_minibatches"]`` counts those minibatches;
``workers_lost`` and ``updates_from_lost_workers`` count workers that joined but returned no result and
the updates of theirs the controller applied (they stay in the model).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad._config import Config, check_int, check_range, coerce_enum
from sparkgrad.compress.sharing import (
    DEFAULT_OWN_UPDATE,
    DEFAULT_UPDATE_COMBINATION,
    check_own_update,
    default_threshold_algorithm,
    update_scale,
)
from sparkgrad.compress.thresholds import (
    MAX_THRESHOLD,
    MIN_THRESHOLD,
    AdaptiveThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualPostProcessor,
    ThresholdAlgorithm,
)
from sparkgrad.errors import TrainingError
from sparkgrad.spark.common import (
    DEFAULT_DIRECT_MEMORY_BUDGET_MB,
    TrainingMasterBase,
    mean_or_none,
)
from sparkgrad.spark.config import (
    MeshBuildMode,
    RDDTrainingApproach,
    VoidConfiguration,
    check_storage_level,
)
from sparkgrad.spark.connect import connect_partitions, is_connect
from sparkgrad.spark.controller_fit import (
    STATE_REPORT_WAIT_S,
    ControllerFit,
    ProgressController,
    task_slots,
)
from sparkgrad.spark.devices import check_worker_device
from sparkgrad.spark.partitioning import DefaultRepartitioner, Repartitioner
from sparkgrad.spark.shared_worker import (
    SharedJob,
    SharedWorker,
    WorkerResult,
    encoded_count,
    reference_threshold,
)
from sparkgrad.spark.stats import SparkTrainingStats, Timer, event, now_ms
from sparkgrad.spark.threads import check_task_threads
from sparkgrad.transport import Controller, ZmqTransportConfiguration
from sparkgrad.transport.limits import finite_mean

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkgrad.nn._flat_network import FlatNetwork, N

log = logging.getLogger(__name__)

# Stats keys.
MASTER_EXPORT = "SharedMasterExportTimesMs"
MASTER_REPARTITION = "SharedMasterRepartitionTimesMs"
MASTER_FIT = "SharedMasterFitTimesMs"
MASTER_PROCESS = "SharedMasterProcessResultsTimesMs"

PROGRESS_REPORT_INTERVAL_S = 2.0  # how often a worker sends its training loss for the progress line


@dataclass
class SharedTrainingMaster(ControllerFit, TrainingMasterBase, Config):
    """Gradient sharing with threshold-encoded updates (DL4J ``SharedTrainingMaster``), PLAIN topology.

    Args:
        void_configuration: controller port and address resolution.
        batch_size_per_worker: minibatch size each worker trains (exported batch size in Export mode).
        rdd_data_set_num_examples: examples per DataSet of the RDD (Direct mode / fit_paths sizing).
        workers_per_node: at most this many workers train at once on one executor host (-1: one per
            Spark task slot). The fit trains ``min(task slots, executor hosts x workers_per_node)``
            workers (local mode: ``min(local[N]'s N, workers_per_node)``): the
            default repartitioning makes that many partitions, all trained in one barrier job, where a
            task that Spark placed beyond ``workers_per_node`` on its host fails with a TrainingError
            saying so; with more partitions (one Spark job per epoch) a task waits for a free worker
            slot of its host. DL4J's ``workersPerNode`` was the training threads of an executor.
        threshold_algorithm: default :func:`~sparkgrad.compress.sharing.default_threshold_algorithm`:
            ``TargetSparsityThresholdAlgorithm(2e-2, 3e-3, start_at_target=True)`` (DL4J's default was
            ``AdaptiveThresholdAlgorithm()``; the Spark digits benchmark of the performance guide compares
            them).
        updates_threshold: DL4J's ``updatesThreshold(t)``: ``AdaptiveThresholdAlgorithm(t)``, the
            adaptive algorithm starting at threshold ``t`` (in [MIN_THRESHOLD, MAX_THRESHOLD]); None
            (default): ``threshold_algorithm`` decides. Giving both is a ValueError.
        residual_post_processor: default ``NoOpResidualPostProcessor()`` (the residual keeps every bit of
            update mass; DL4J's default was ``ResidualClippingPostProcessor(5.0, 5)``).
        mesh_build_mode: ``"plain"`` (star: the controller sends every update to every worker) or ``"mesh"``
            (a relay tree of ``transport.mesh_fan_out``, see :mod:`sparkgrad.transport.mesh`).
        staleness_bound: 0 or >= 2 (default 4): every minibatch a worker trains starts from parameters
            that include every update the controller applied more than this many of the worker's
            minibatches earlier; a worker ahead of that waits (``last_traffic["worker_paced_waits"]``).
            0 is DL4J's unbounded asynchrony, under which updates arriving tens of minibatches late
            (a busy driver, small fast minibatches) can cost accuracy for several epochs.
        rdd_training_approach: ``"auto"`` (default: train from the persisted RDD while its DataSets'
            arrays total at most ``direct_memory_budget_mb``, export above), ``"export"`` (DL4J's
            default: write batches of ``batch_size_per_worker`` once and train from the files) or
            ``"direct"``.
        direct_memory_budget_mb: the AUTO threshold in MiB (default 512; 0 exports every DataSet RDD).
        export_directory: where exports go (any Hadoop URI); default ``hadoop.tmp.dir/sparkgrad``.
        storage_level: Spark storage level of an RDD of DataSets (or a DataFrame's conversion) between
            its counting and training jobs: ``"DISK_ONLY"`` (default: Spark's local disk, served from
            the page cache, never the JVM heap; a fit of 1.1 GB with ``"MEMORY_AND_DISK"`` ran a 2 GB
            heap out of memory) or DL4J's ``"MEMORY_ONLY_SER"`` (partitions that do not fit are
            recomputed).
        storage_level_streams: storage level of data read from files (``fit(dir)``, ``fit_paths``,
            exported data): ``"NONE"`` (default: every job reads the files again, nothing is held).
        repartitioner: a :class:`~sparkgrad.spark.Repartitioner`, called with a minibatch's worth of
            elements as ``min_per_partition`` and the task slots as ``num_workers``. None (default): one
            balanced partition per Spark task slot, every epoch of a fit in one barrier job;
            ``DefaultRepartitioner()`` is DL4J's one minibatch per partition (one Spark job per epoch
            once there are more partitions than slots).
        worker_prefetch_num_batches: minibatches loaded ahead by a background thread on each worker.
        encoding_debug_mode: log threshold, density and residual statistics for every worker step.
        collect_training_stats: record timings, bytes, messages, density and threshold per iteration.
        debug_longer_iterations: milliseconds of extra sleep after every worker step (testing aid).
        rng_seed: seed of the data order: the repartitioning shuffle of every fit and each worker's
            per-epoch order of its partition (None: a random seed per fit, and no repartitioning
            shuffle).
        transport: :class:`~sparkgrad.transport.ZmqTransportConfiguration` (timeouts); None = defaults.
        progress: show a live progress line on the driver during fits (:mod:`sparkgrad.spark.progress`):
            epoch, minibatches, loss, examples/s, bytes on the wire, update density and threshold.
        worker_device: where the workers train: ``"auto"`` (default: the GPU Spark assigned to the task,
            else ``SPARKGRAD_DEVICE`` on the executor, else the CPU), ``"cpu"``, ``"cuda"`` or
            ``"cuda:N"`` (:mod:`sparkgrad.spark.devices`). The controller stays on the driver's CPU; a
            GPU worker encodes on its GPU and only the messages cross to the host, so GPU and CPU
            workers can share one fit. The ``SharedWorkerGetInitialModelTimeMs`` stats events record
            each worker's device as ``gpu`` (-1: CPU).
        update_combination: how the updates of the N workers training at once combine: ``"auto"``
            (default: ``"sum"`` when every updater of the network is of the Adam family or RmsProp, whose
            steps are about their learning rate whatever the gradient's size, else ``"sqrt"``), ``"sqrt"``
            (each worker sends its update divided by sqrt(N), the square-root scaling rule of an N-times
            larger batch), ``"mean"`` (divided by N: DDP's averaged step) or ``"sum"`` (DL4J's and Strom's:
            every update at full size, N workers taking about N times the step). Either way the learning
            rate and updater that work on one machine work here; the convergence study of the performance
            guide compares them; see :data:`~sparkgrad.compress.sharing.UPDATE_COMBINATIONS`.
        momentum_masking: after a worker sends its update, zero its Nesterov velocity wherever the
            message sent the parameter (Deep Gradient Compression's momentum factor masking, Lin et al.
            2018; default False, DL4J's behaviour). On the digits study it reached the target about an
            epoch sooner with an MLP and a CNN at 2-8 workers, and ended the LSTM lower (0.918 against
            0.935 at 2 workers), so it is an option, not the default. Other updaters are unaffected.
        own_update: what a worker applies to its own replica of its own update: ``"full"`` (default:
            all of it at once, keeping its unsent residual applied when it takes the controller's
            parameters, so its own steps are never held back by its encoder) or ``"encoded"`` (DL4J's:
            only what its message carries, as every other replica does). With Nesterov momentum on the
            digits study (2 workers on Spark, 10 seeds) ``"full"`` reached 96% in 2 median epochs and
            ``"encoded"`` in 6 (DDP: 3.5); see :data:`~sparkgrad.compress.sharing.OWN_UPDATES`.
        task_threads: the OpenMP/OpenBLAS threads of every Spark task of a model with this master
            (training, evaluation, scoring, inference); None (default): the task's CPUs,
            ``spark.task.cpus``. Set for the task and restored after it
            (:mod:`sparkgrad.spark.threads`). The ``WorkerFlatMapTotalTimeMs`` stats events record it as
            ``threads``.
    """

    void_configuration: VoidConfiguration = field(default_factory=VoidConfiguration)
    batch_size_per_worker: int = 32
    rdd_data_set_num_examples: int = 1
    workers_per_node: int = -1
    threshold_algorithm: ThresholdAlgorithm | None = None
    residual_post_processor: ResidualPostProcessor | None = None
    mesh_build_mode: MeshBuildMode = MeshBuildMode.PLAIN
    staleness_bound: int = 4
    rdd_training_approach: RDDTrainingApproach = RDDTrainingApproach.AUTO
    direct_memory_budget_mb: int = DEFAULT_DIRECT_MEMORY_BUDGET_MB
    export_directory: str | None = None
    storage_level: str = "DISK_ONLY"
    storage_level_streams: str = "NONE"
    repartitioner: Repartitioner | None = None
    worker_prefetch_num_batches: int = 2
    encoding_debug_mode: bool = False
    collect_training_stats: bool = False
    debug_longer_iterations: int = 0
    rng_seed: int | None = None
    transport: ZmqTransportConfiguration | None = None
    progress: bool = True
    worker_device: str = "auto"
    update_combination: str = DEFAULT_UPDATE_COMBINATION
    momentum_masking: bool = False
    own_update: str = DEFAULT_OWN_UPDATE
    updates_threshold: float | None = None
    task_threads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.void_configuration, VoidConfiguration):
            raise ValueError(
                f"void_configuration: expected a VoidConfiguration, got {self.void_configuration!r}"
            )
        self.batch_size_per_worker = check_int("batch_size_per_worker", self.batch_size_per_worker, minimum=1)
        update_scale(self.update_combination, 1)  # checks the name
        if not isinstance(self.momentum_masking, bool):
            raise ValueError(f"momentum_masking: expected a bool, got {self.momentum_masking!r}")
        self.own_update = check_own_update(self.own_update)
        self.rdd_data_set_num_examples = check_int(
            "rdd_data_set_num_examples", self.rdd_data_set_num_examples, 1
        )
        self.workers_per_node = check_int("workers_per_node", self.workers_per_node, minimum=-1)
        if self.workers_per_node == 0:
            raise ValueError("workers_per_node: must be -1 (one per task slot) or >= 1, got 0")
        if self.threshold_algorithm is not None and not isinstance(
            self.threshold_algorithm, ThresholdAlgorithm
        ):
            raise ValueError(
                f"threshold_algorithm: expected a ThresholdAlgorithm, got {self.threshold_algorithm!r}"
            )
        if self.updates_threshold is not None:
            if self.threshold_algorithm is not None:
                raise ValueError(
                    "updates_threshold and threshold_algorithm: give one of them (updates_threshold=t is "
                    "threshold_algorithm=AdaptiveThresholdAlgorithm(t))"
                )
            self.updates_threshold = check_range(
                "updates_threshold", self.updates_threshold, MIN_THRESHOLD, MAX_THRESHOLD
            )
        if self.residual_post_processor is not None and not isinstance(
            self.residual_post_processor, ResidualPostProcessor
        ):
            raise ValueError(
                f"residual_post_processor: expected a ResidualPostProcessor, got "
                f"{self.residual_post_processor!r}"
            )
        self.mesh_build_mode = coerce_enum(MeshBuildMode, self.mesh_build_mode, "mesh_build_mode")
        self.staleness_bound = check_int("staleness_bound", self.staleness_bound, minimum=0)
        if self.staleness_bound == 1:
            raise ValueError("staleness_bound: must be 0 (unbounded) or >= 2, got 1")
        self.rdd_training_approach = coerce_enum(
            RDDTrainingApproach, self.rdd_training_approach, "rdd_training_approach"
        )
        self.direct_memory_budget_mb = check_int(
            "direct_memory_budget_mb", self.direct_memory_budget_mb, minimum=0
        )
        self.storage_level = check_storage_level("storage_level", self.storage_level)
        self.storage_level_streams = check_storage_level("storage_level_streams", self.storage_level_streams)
        if self.repartitioner is not None and not isinstance(self.repartitioner, Repartitioner):
            raise ValueError(f"repartitioner: expected a Repartitioner, got {self.repartitioner!r}")
        self.worker_prefetch_num_batches = check_int(
            "worker_prefetch_num_batches", self.worker_prefetch_num_batches, minimum=0
        )
        self.debug_longer_iterations = check_int(
            "debug_longer_iterations", self.debug_longer_iterations, minimum=0
        )
        for name in ("encoding_debug_mode", "collect_training_stats", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        if self.rng_seed is not None:
            self.rng_seed = check_int("rng_seed", self.rng_seed, minimum=0)
        if self.transport is not None and not isinstance(self.transport, ZmqTransportConfiguration):
            raise ValueError(f"transport: expected a ZmqTransportConfiguration, got {self.transport!r}")
        self.worker_device = check_worker_device("worker_device", self.worker_device)
        self.task_threads = check_task_threads("task_threads", self.task_threads)
        self._runtime_init()
        self._threshold_state: ThresholdAlgorithm | None = None
        self.last_traffic: dict[str, float] = {}

    @property
    def current_threshold_algorithm(self) -> ThresholdAlgorithm:
        """The threshold algorithm (with state) the next fit starts from: the last fit's reduced state,
        else ``threshold_algorithm``, else ``AdaptiveThresholdAlgorithm(updates_threshold)``, else the
        default."""
        if self._threshold_state is not None:
            return self._threshold_state
        if self.threshold_algorithm is not None:
            return self.threshold_algorithm
        if self.updates_threshold is not None:
            return AdaptiveThresholdAlgorithm(self.updates_threshold)
        return default_threshold_algorithm()

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
        """Train ``network`` in place for ``epochs`` passes over ``rdd``; returns the average worker score.

        Args:
            sc: the SparkContext.
            network: the driver's network (parameters, updater state and counters are replaced).
            rdd: RDD of DataSets (kind "dataset") or paths (kind "path").
            kind: "dataset" or "path".
            loader: path -> DataSet (kind "path"), or the serialized loader of the data's kind
                (kinds "dataset", for an export, and "bytes").
            epochs: number of passes.
            epoch_callback: ``epoch_callback(epoch, network)`` after each epoch, on the driver, with
                ``network`` holding the controller's parameters and ``epoch`` the index of the epoch
                that just finished (``network.epoch_count - 1``); a true result stops training, a
                mapping of metrics is recorded (see :func:`~sparkgrad.spark.stats.run_epoch_callback`).
            epoch_progress: called on the driver at every epoch end, before ``epoch_callback``, as
                ``epoch_progress(epoch, figures)`` with the epoch's progress figures (loss, examples/s,
                bytes on the wire, update density, threshold: see
                :meth:`~sparkgrad.spark.progress.FitProgress.end_epoch`); experiment tracking uses it.
            epoch_state: > 0: at the end of every this many epochs (and of the last) the network (and
                ``epoch_callback``) holds the updater state and this master the threshold state of the
                training so far, as the worker of partition 0 reports them (what a checkpoint holds);
                0: the updater state is the workers' mean at the fit's end only.
        """
        stats = SparkTrainingStats() if self.collect_training_stats else None
        self.last_stats = stats  # the running fit's, for its checkpoints
        self._fit_threshold: ThresholdAlgorithm | None = None
        fit_start = now_ms()
        _, order_epoch = self._begin_order(network)
        data = self.prepare(sc, rdd, kind, loader, stats, MASTER_EXPORT)
        slots = task_slots(sc, self.workers_per_node)
        with Timer(stats, MASTER_REPARTITION):
            seed = None
            if self.rng_seed is not None:  # a reproducible order, new for every fit (not for a resumed one)
                seed = (self.rng_seed + 1) * 1_000_003 + order_epoch
            min_per = max(1, self.batch_size_per_worker // data.examples_per_unit)
            units: Any
            if is_connect(sc):  # one partition per task slot, in the order Spark's round robin gives
                units = connect_partitions(data, slots, min_per)
            else:
                repartitioner = self.repartitioner or DefaultRepartitioner(max_partitions=slots)
                units = repartitioner.repartition(
                    data.rdd, min_per, slots, total=data.num_units, counts=data.counts, seed=seed
                )
        results, _ = self._run_job(
            sc, network, units, data, stats, epochs, epoch_callback, slots, epoch_progress, epoch_state
        )
        with Timer(stats, MASTER_PROCESS):
            score = self._process_results(network, results, stats)
        if stats is not None:
            examples = data.num_units * data.examples_per_unit
            stats.add(MASTER_FIT, event(fit_start, examples=examples))
        self.last_stats = stats
        return score

    def _controller_options(self) -> dict[str, Any]:
        return {
            "threshold_reference": reference_threshold(self.current_threshold_algorithm),
            "threshold_growth": self.current_threshold_algorithm.max_step_growth(),
            "mesh": self.mesh_build_mode == MeshBuildMode.MESH,
        }

    def _job_options(self, network: Any, partitions: int, slots: int) -> dict[str, Any]:
        return {
            "progress_interval_s": PROGRESS_REPORT_INTERVAL_S if self.progress else 0.0,
            "threshold_algorithm": self.current_threshold_algorithm,
            "residual_post_processor": self.residual_post_processor or NoOpResidualPostProcessor(),
            "workers_per_node": self.workers_per_node,
            "encoding_debug_mode": self.encoding_debug_mode,
            "debug_longer_iterations": self.debug_longer_iterations,
            "mesh": self.mesh_build_mode == MeshBuildMode.MESH,
            "staleness_window": self.staleness_bound // 2,
            "update_scale": update_scale(self.update_combination, min(partitions, slots), network.updaters),
            "momentum_masking": self.momentum_masking,
            "own_update": self.own_update,
        }

    def _epoch_state(self, network: Any, controller: Controller) -> None:
        """At an epoch end the job's ``epoch_state`` names: the threshold state partition 0's worker
        reported with this epoch's end, and the count of updater-state reports so far, after which comes
        the state it sends once the barrier let it go (:meth:`_checkpoint_updater_state`). At the fit's
        end the workers' mean updater state goes into the network (:meth:`_process_results`)."""
        report = controller.threshold_report if isinstance(controller, ProgressController) else None
        if report is None:
            self._state_reports = None
            return  # not such an epoch
        assert isinstance(controller, ProgressController)
        controller.threshold_report = None
        self._state_reports = (controller, controller.updater_state_reports)
        try:
            self._fit_threshold = ThresholdAlgorithm.from_dict(report)
        except (TypeError, ValueError) as exc:  # an insider's report: the checkpoint keeps the last good one
            log.warning("the threshold state partition 0's worker reported is refused: %s", exc)

    def _checkpoint_updater_state(self, network: Any) -> Callable[[], np.ndarray]:
        """At an ``epoch_state`` epoch end: the state partition 0's worker sends after the barrier,
        waited for by the checkpoint's background writer (the network's own, the fit's start or the
        last report's, if it does not come, with a warning); else the network's own."""
        if self._state_reports is None:
            return super()._checkpoint_updater_state(network)
        controller, reports = self._state_reports
        fallback = network.updater_state().copy()
        epoch = int(network.epoch_count)

        def wait() -> np.ndarray:
            state = controller.updater_state_after(reports, STATE_REPORT_WAIT_S)
            if state is None or state.size != fallback.size:
                log.warning(
                    "the updater state of epoch %d did not arrive: its checkpoint holds an older one", epoch
                )
                return fallback
            return state.astype(fallback.dtype, copy=False)

        return wait

    def _checkpoint_state(self, network: Any) -> dict[str, Any]:
        """Besides the data order: the threshold algorithm's state at the epoch end (without
        ``epoch_state``, the one the fit started from)."""
        algorithm = self._fit_threshold or self.current_threshold_algorithm
        return {**super()._checkpoint_state(network), "threshold_algorithm": algorithm.to_finite_dict()}

    def _restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """The next fit starts from the checkpoint's threshold too."""
        super()._restore_checkpoint_state(state)
        self._threshold_state = ThresholdAlgorithm.from_dict(state["threshold_algorithm"])

    def _process_results(
        self, network: FlatNetwork, results: dict[int, WorkerResult], stats: SparkTrainingStats | None
    ) -> float:
        if not results:
            raise TrainingError("training: no worker trained a minibatch (empty data?)")
        workers = list(results.values())
        states = [r.updater_state for r in workers if r.updater_state is not None]  # None: did not come
        total = None
        for state in states:
            total = state if total is None else total + state
        updater = mean_or_none(total, len(states))
        if updater is not None and updater.size:
            network.set_updater_state(updater.astype(network.updater_state().dtype, copy=False))
        first = workers[0].threshold_algorithm
        assert first is not None  # a gradient-sharing worker always reports its algorithm (None: averaging)
        reducer = first.new_reducer()
        for r in workers:
            reducer.add(r.threshold_algorithm)
        self._threshold_state = reducer.final_result()
        totals: dict[str, float] = {}
        for r in workers:
            for name, value in r.counters.items():
                totals[f"worker_{name}"] = totals.get(f"worker_{name}", 0.0) + value
            totals["worker_minibatches"] = totals.get("worker_minibatches", 0.0) + r.minibatches
        self.last_traffic.update(totals)
        if stats is not None:
            for name, value in totals.items():
                stats.count(name, value)
            for r in workers:
                if r.stats is not None:
                    stats.merge(r.stats)
        return finite_mean([r.score for r in workers])


__all__ = ["SharedJob", "SharedTrainingMaster", "SharedWorker", "WorkerResult", "encoded_count"]
