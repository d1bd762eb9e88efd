"""The driver's side of a fit whose workers train in Spark tasks around a controller on the driver,
which SharedTrainingMaster (gradient sharing) and ParameterAveragingTrainingMaster (rounds in one job)
share: :class:`ControllerFit` runs the Spark job or jobs, serves the epoch barrier while watching the
controller, and counts the Spark task slots a fit may use.
"""

from __future__ import annotations

import logging
import random
import secrets
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.errors import TrainingError, TransportError
from sparkgrad.spark.common import NetworkSnapshot, run_spark
from sparkgrad.spark.config import VoidConfiguration
from sparkgrad.spark.connect import connect_slots, is_connect, spark_conf
from sparkgrad.spark.partitioning import shuffle_in_place
from sparkgrad.spark.progress import FitProgress, estimate_minibatches
from sparkgrad.spark.shared_worker import SharedJob, WorkerResult, encoded_count, shared_partition
from sparkgrad.spark.stats import SparkTrainingStats, run_epoch_callback
from sparkgrad.transport import Controller, Header, ZmqTransportConfiguration

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkgrad.nn._flat_network import N

log = logging.getLogger(__name__)

SECRET_BYTES = 32  # 256-bit per-fit secret
_WATCH_INTERVAL_S = 0.2  # how often the driver checks the controller while the Spark job runs
_CANCEL_WAIT_S = 60.0
# how long a checkpoint waits for the updater state partition 0's worker sends after an epoch's barrier
# (the transfer of a state as large as the parameters, or twice, on the slowest link that is still usable)
STATE_REPORT_WAIT_S = 60.0


class ProgressController(Controller):
    """The fit's controller, feeding the progress line: every update it applies (its threshold and
    density) and the training loss in the workers' reports. Progress is read on the controller's own
    thread, from frames the base class has already authenticated and accepted."""

    def __init__(self, *args: Any, progress: FitProgress, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = progress
        # the threshold algorithm's state partition 0's worker reported at this epoch's end (a JSON
        # object, parsed by the master on the driver and then cleared), at the job's ``epoch_state``
        self.threshold_report: dict[str, Any] | None = None

    def _applied(self, header: Header, message: np.ndarray) -> None:
        bitmap = bool(message[3] == 1)  # word 3: the bitmap flag
        # a sparse message's count is its word 0; _scratch decodes one on its first read (a dense pass)
        encoded = encoded_count(message, self._scratch, bitmap) if bitmap else int(message[0])
        threshold = float(message[2:3].view("<f4")[0])
        self.progress.update(encoded / max(self._params.size, 1), threshold, header.sender, header.epoch)

    def _round_averaged(self, epoch: int, minibatches: int, score: float | None) -> None:
        self.progress.minibatches(minibatches)
        if score is not None:
            self.progress.loss(score)

    def updater_state_after(self, reports: int, timeout_s: float) -> np.ndarray | None:
        """A copy of the updater state of the first report after the ``reports``-th (waiting for it up to
        ``timeout_s``); None when it did not come, or the controller stopped first."""
        deadline = time.monotonic() + timeout_s
        while self.updater_state_reports <= reports:
            if self._stop.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return self.updater_state()

    def _count_trained(self, identity: bytes, sender: int, epoch: int, payload: memoryview) -> dict | None:
        report = super()._count_trained(identity, sender, epoch, payload)
        if report is not None:
            loss, trained = report.get("loss"), report.get("epoch_minibatches")
            if isinstance(loss, (int, float)) and not isinstance(loss, bool):
                self.progress.loss(float(loss), sender)
            if isinstance(trained, int) and not isinstance(trained, bool) and trained >= 0:
                self.progress.trained(sender, epoch, trained)
            state = report.get("threshold_state")
            if report.get("partition") == 0 and isinstance(state, dict):
                self.threshold_report = state
        return report


def _run_watched(
    sc: SparkContext,
    controller: Controller,
    action: Callable[[], Any],
    on_epoch: Callable[[int], bool] | None = None,
    progress: FitProgress | None = None,
    after_release: Callable[[], None] | None = None,
) -> Any:
    """Run the Spark training action while watching the controller (and serving its epoch barrier).

    The action runs in a thread under its own job group; when the controller thread fails the group is
    cancelled and TrainingError carries the controller's own error, instead of the timeouts and
    network-blaming errors the workers would eventually report. With ``on_epoch``, every epoch all
    workers finished is handed to it on this thread and the workers are released with its answer (stop
    when True); an exception from it stops the workers and is re-raised once the job has ended.

    Args:
        sc: the SparkContext.
        controller: the fit's controller.
        action: zero-argument callable running the Spark job.
        on_epoch: ``on_epoch(epoch) -> stop`` for a barrier job, else None.
        progress: the fit's progress line, redrawn while the job runs.
        after_release: called once the workers were released from each epoch's barrier (an exception
            from it is handled as one from ``on_epoch``).

    Returns:
        The action's result.
    """
    group = f"sparkgrad-shared-{controller.job_id:016x}-{random.getrandbits(32):08x}"
    outcome: dict[str, Any] = {}

    def target() -> None:
        sc.setJobGroup(group, "sparkgrad SharedTrainingMaster fit", interruptOnCancel=True)
        try:
            outcome["result"] = run_spark("training", action)
        except BaseException as exc:  # re-raised on the calling thread
            outcome["error"] = exc

    from pyspark import InheritableThread  # keeps the caller's local properties (scheduler pool, ...)

    thread = InheritableThread(target=target, name=group, daemon=True)
    thread.start()
    callback_error: BaseException | None = None
    while thread.is_alive():
        if progress is not None:
            progress.refresh()
        epoch = controller.next_finished_epoch(_WATCH_INTERVAL_S) if on_epoch else None
        if on_epoch is None or epoch is None:
            thread.join(0 if on_epoch else _WATCH_INTERVAL_S)
        else:
            stop = True
            try:
                stop = bool(on_epoch(epoch)) if callback_error is None else True
            except BaseException as exc:  # the workers still have to be released
                callback_error = exc
            controller.release_epoch(epoch, stop)
            if after_release is not None and callback_error is None:
                try:
                    after_release()
                except BaseException as exc:
                    callback_error = exc
        if controller.error is not None:
            sc.cancelJobGroup(group)
            thread.join(_CANCEL_WAIT_S)
            break
    error = controller.error
    if error is not None:
        raise TrainingError(
            f"training failed: the gradient-sharing controller failed: {type(error).__name__}: {error}"
        ) from error
    if callback_error is not None:
        raise callback_error
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def task_slots(sc: SparkContext, workers_per_node: int = -1) -> int:
    """How many workers a fit runs at once: the tasks the cluster runs at once (Spark's own count over
    the registered executors, what a barrier stage is checked against, else default parallelism over
    ``spark.task.cpus``), and with ``workers_per_node`` > 0 at most that many per executor host."""
    from py4j.protocol import Py4JError

    if is_connect(sc):
        return connect_slots(sc, workers_per_node)
    try:
        jsc = sc._jsc.sc()
        slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Py4JError:  # an internal API: versions without it fall back to the configuration
        slots = 0
    if slots <= 0:
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        slots = max(1, int(sc.defaultParallelism) // max(1, cpus))
    if workers_per_node > 0:
        slots = min(slots, _executor_hosts(sc) * workers_per_node)
    return max(1, slots)


def _executor_hosts(sc: SparkContext) -> int:
    """The hosts of the registered executors (Spark's status store), at least 1: local mode (only the
    driver is listed) and executors not yet listed count as one host. Their task slots are not read from
    the store, which can list an executor before its cores (0 slots)."""
    from py4j.protocol import Py4JError

    try:
        executors = sc._jsc.sc().statusStore().executorList(True)
        entries = [executors.apply(i) for i in range(executors.size())]
        hosts = {str(e.hostPort()).rsplit(":", 1)[0] for e in entries if str(e.id()) != "driver"}
    except Py4JError:  # an internal API
        return 1
    return max(1, len(hosts))


def _conf_flag(sc: SparkContext, key: str) -> bool:
    """A boolean Spark setting of ``sc`` or a Connect session (false when unset)."""
    return (spark_conf(sc, key, "false") or "false").strip().lower() == "true"


def dynamic_allocation(sc: SparkContext) -> bool:
    """Whether Spark may add and remove executors during a fit, as Spark decides it
    (``Utils.isDynamicAllocationEnabled``): ``spark.dynamicAllocation.enabled``, in local mode only with
    ``spark.dynamicAllocation.testing``. Spark then refuses barrier stages (SPARK-24942)."""
    local = (spark_conf(sc, "spark.master", "") or "").startswith("local")
    testing = _conf_flag(sc, "spark.dynamicAllocation.testing")
    return _conf_flag(sc, "spark.dynamicAllocation.enabled") and (not local or testing)


def _barrier_ready(rdd: Any) -> bool:
    """Whether Spark runs a barrier stage over ``rdd``: every RDD of its stage (back to the shuffles)
    has ``rdd``'s number of partitions (SPARK-24820 refuses unions, coalesces and the like)."""
    from py4j.protocol import Py4JError

    try:
        top = rdd._jrdd.rdd()
        count = top.getNumPartitions()
        stack = [top]
        while stack:
            node = stack.pop()
            if node.getNumPartitions() != count:
                return False
            dependencies = node.dependencies()
            for i in range(dependencies.size()):
                dependency = dependencies.apply(i)
                if dependency.getClass().getSimpleName() != "ShuffleDependency":
                    stack.append(dependency.rdd())
    except Py4JError:  # an internal API: without it, a shuffle keeps the stage safe
        return False
    return True


def _latest(a: dict[int, WorkerResult], b: dict[int, WorkerResult]) -> dict[int, WorkerResult]:
    """Merge per-worker results keeping each worker's latest report (stats of all tasks merged)."""
    out = dict(a)
    for wid, r in b.items():
        old = out.get(wid)
        if old is None:
            out[wid] = r
            continue
        new, prev = (r, old) if r.task_seq >= old.task_seq else (old, r)
        if prev.stats is not None:
            new.stats = prev.stats if new.stats is None else new.stats.merge(prev.stats)
        out[wid] = new
    return out


class ControllerFit(ABC):
    """The driver's side of a fit whose workers train in Spark tasks around a controller on the driver:
    SharedTrainingMaster's gradient sharing, and ParameterAveragingTrainingMaster's rounds in one job.

    Both masters run the same job (one barrier job for every epoch, :func:`_run_watched` serving the
    epoch barrier), the same controller and the same executor-side worker
    (:mod:`sparkgrad.spark.shared_worker`); a master says what differs through :meth:`_controller_options`,
    :meth:`_job_options` and :meth:`_epoch_state`. The masters are dataclasses with the fields
    ``void_configuration``, ``transport``, ``batch_size_per_worker``, ``worker_prefetch_num_batches``,
    ``collect_training_stats``, ``rng_seed``, ``progress``, ``worker_device`` and ``task_threads``.
    """

    # whether Spark re-runs the barrier stage after a failed task (the workers then re-join the
    # controller), else the first failure ends the fit with that task's error
    _rerun_failed_stage: ClassVar[bool] = True
    _resume_order: tuple[int, int] | None = None  # a resumed fit's data order (checkpoint state)
    _fit_order: tuple[int, int] = (0, 0)  # the running fit's (shuffle seed, epoch its order counts from)
    # at an epoch_state epoch end: (the controller, its updater-state reports before this epoch's)
    _state_reports: tuple[ProgressController, int] | None = None
    void_configuration: VoidConfiguration
    transport: ZmqTransportConfiguration | None
    batch_size_per_worker: int
    worker_prefetch_num_batches: int
    collect_training_stats: bool
    rng_seed: int | None
    progress: bool
    worker_device: str
    task_threads: int | None
    last_traffic: dict[str, float]

    @abstractmethod
    def _controller_options(self) -> dict[str, Any]:
        """The Controller keyword arguments of this master's fit."""

    @abstractmethod
    def _job_options(self, network: Any, partitions: int, slots: int) -> dict[str, Any]:
        """The SharedJob fields of this master's fit of ``network`` besides the common ones."""

    @abstractmethod
    def _epoch_state(self, network: Any, controller: Controller) -> None:
        """At every epoch end and at the fit's end: what the driver's network takes from the controller
        besides its parameters and counters."""

    def _begin_order(self, network: Any) -> tuple[int, int]:
        """The fit's data order: ``(shuffle seed, the epoch count its order counts from)``, a resumed
        fit's (:meth:`_restore_checkpoint_state`), else the seed of ``rng_seed`` or a new random one."""
        order, self._resume_order = self._resume_order, None
        if order is None:
            seed = self.rng_seed if self.rng_seed is not None else random.SystemRandom().getrandbits(32)
            order = (seed, int(network.epoch_count))
        self._fit_order = order
        return order

    def _checkpoint_state(self, network: Any) -> dict[str, Any]:
        """What a checkpoint holds of this master besides its configuration (the masters add theirs):
        the data order."""
        return {"data_order": list(self._fit_order)}

    def _checkpoint_updater_state(self, network: Any) -> Callable[[], np.ndarray]:
        """The updater state a checkpoint of ``network`` holds, for its background writer to call: the
        network's own, copied now (gradient sharing: see SharedTrainingMaster)."""
        state = network.updater_state().copy()
        return lambda: state

    def _restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`_checkpoint_state`: the next fit (the resumed one) keeps its data order."""
        seed, epoch = state["data_order"]
        self._resume_order = (
            check_int("data_order", seed, minimum=0),
            check_int("data_order", epoch, minimum=0),
        )

    def _run_job(
        self,
        sc: SparkContext,
        network: N,
        units: Any,
        data: Any,
        stats: SparkTrainingStats | None,
        epochs: int,
        epoch_callback: Callable[[int, N], Any] | None,
        slots: int,
        epoch_progress: Callable[[int, dict[str, float]], None] | None = None,
        epoch_state: int = 0,
    ) -> tuple[dict[int, WorkerResult], list[tuple[int, int, float]]]:
        """Train ``network`` in place over ``units`` for ``epochs``; returns the workers' results and
        the controller's averaging round scores. ``epoch_state`` > 0: at the end of every this many
        epochs (and of the last) the network holds the current updater state, which one worker reports
        (checkpoints). ``units`` is an RDD, or with a Spark Connect session the DataFrame of
        :func:`sparkgrad.spark.connect.connect_training_data`, trained with the controller inside the
        first task (:func:`sparkgrad.spark.connect.run_connect_job`)."""
        from sparkgrad.spark.connect import run_connect_job

        if is_connect(sc):
            return run_connect_job(self, sc, network, units, data, stats, epochs, slots)
        void = self.void_configuration
        host = void.resolve_controller_address(sc.getConf().get("spark.driver.host"))
        partitions = units.getNumPartitions()
        barrier = partitions <= slots
        if barrier and dynamic_allocation(sc):
            log.info(
                "dynamic allocation is on and Spark runs no barrier stage with it (SPARK-24942): every "
                "epoch is a Spark job of %d tasks that join the controller as they are scheduled",
                partitions,
            )
            barrier = False
        if barrier and not _barrier_ready(units):
            units = shuffle_in_place(units)
        job_id, secret = self._job_identity()
        encrypt_store = _conf_flag(sc, "spark.io.encryption.enabled")
        template = self._job_template(
            network, data, partitions, slots, barrier, epochs, epoch_state, job_id, encrypt_store
        )
        # gradient sharing in a barrier job: the controller here outlives the tasks, so each task's
        # updater state comes over the transport (Spark's task results took seconds for hundreds of MB)
        template = replace(template, final_state_report=barrier and template.averaging is None)
        run = _FitRun(
            self,
            network,
            data,
            partitions,
            epochs,
            epoch_callback,
            stats,
            epoch_progress,
            host,
            job_id,
            secret,
        )
        results: dict[int, WorkerResult] = {}
        try:
            if barrier:
                run.controller.expect_workers(partitions)
            bc = sc.broadcast(run.job(template))
            first_epoch = run.first_epoch
            try:
                if barrier:  # every epoch in one job
                    stage = units.barrier().mapPartitions(shared_partition(bc, first_epoch, epochs))
                    if self._rerun_failed_stage:
                        # the shuffle after the barrier stage makes it a map stage, which Spark re-runs as
                        # a whole when a task or an executor fails (a failed barrier result stage ends the
                        # job, with the failed task's error)
                        stage = stage.repartition(1)
                    watched = _run_watched(
                        sc, run.controller, stage.collect, run.on_epoch, run.progress, run.after_release
                    )
                    for part in watched:
                        results = _latest(results, part)
                else:  # more partitions than slots, or dynamic allocation: one job per epoch
                    for epoch in range(first_epoch, first_epoch + epochs):
                        train = shared_partition(bc, epoch, 1)
                        action = units.mapPartitions(train).collect  # the job starts in _run_watched
                        for part in _run_watched(sc, run.controller, action, None, run.progress):
                            results = _latest(results, part)
                        if run.on_epoch(epoch):
                            break
            finally:
                bc.destroy()  # the secret leaves the driver's block manager too, not only the executors
            run.await_state_report()
            if template.final_state_report:
                results = run.with_final_states(results)
        finally:
            run.close()
        run.finish(barrier)
        self._record_traffic(stats, run.controller.workers_seen, run.controller.updates_by_worker, results)
        return results, list(run.controller.round_scores)

    def _job_identity(self) -> tuple[int, bytes]:
        """A new fit's job id and secret (``VoidConfiguration.secret`` when set)."""
        secret = self.void_configuration.secret
        job_id = random.SystemRandom().getrandbits(63) + 1
        return job_id, secret if isinstance(secret, bytes) else secrets.token_bytes(SECRET_BYTES)

    def _job_template(
        self,
        network: Any,
        data: Any,
        partitions: int,
        slots: int,
        barrier: bool,
        epochs: int,
        epoch_state: int,
        job_id: int,
        encrypt_store: bool,
    ) -> SharedJob:
        """The fit's SharedJob without its controller (secret, address and key: :meth:`_FitRun.job`);
        ``encrypt_store``: Spark's ``spark.io.encryption.enabled``."""
        first_epoch = int(network.epoch_count)
        return SharedJob(
            job_id=job_id,
            secret=b"",
            controller_key=b"",
            host="",
            port=0,
            transport=self.transport or ZmqTransportConfiguration(),
            snapshot=NetworkSnapshot.of(network),
            kind=data.kind,
            loader=data.loader,
            batch_size=self.batch_size_per_worker,
            prefetch=self.worker_prefetch_num_batches,
            collect_stats=self.collect_training_stats,
            barrier=barrier,
            shuffle_seed=self._fit_order[0],
            epoch_state=epoch_state,
            fit_end=first_epoch + epochs,
            worker_device=self.worker_device,
            task_threads=self.task_threads,
            encrypt_store=encrypt_store,
            **self._job_options(network, partitions, slots),
        )

    def _record_traffic(
        self,
        stats: SparkTrainingStats | None,
        workers_seen: set[int],
        updates_by_worker: dict[int, int],
        results: dict[int, WorkerResult],
    ) -> None:
        """Count the workers that joined but returned no result (killed or failed tasks: their applied
        updates stay in the model and in ``updates_applied``) into :attr:`last_traffic`, and record it
        in ``stats``."""
        self.last_traffic["workers_lost"] = len(workers_seen - results.keys())
        self.last_traffic["updates_from_lost_workers"] = sum(
            n for w, n in updates_by_worker.items() if w not in results
        )
        if stats is not None:
            for name, value in self.last_traffic.items():
                stats.count(name, value)


class _FitRun:
    """One fit's controller and the driver's side of its epochs, wherever the controller runs: on the
    driver (:meth:`ControllerFit._run_job`) or in the first training task of a Spark Connect fit
    (:mod:`sparkgrad.spark.connect`).

    Args:
        master: the fit's training master.
        network: the network trained in place (the controller's parameters at every epoch end).
        data: the fit's TrainingData (its size, for the progress line).
        partitions: the fit's training tasks.
        epochs, epoch_callback, stats, epoch_progress: as :meth:`ControllerFit._run_job` takes them.
        host: the address the controller binds and the workers connect to.
        job_id, secret: the fit's job id and secret.
        show_progress: draw the progress line (the master's ``progress``; never inside a task).
    """

    def __init__(
        self,
        master: ControllerFit,
        network: Any,
        data: Any,
        partitions: int,
        epochs: int,
        epoch_callback: Callable[[int, Any], Any] | None,
        stats: SparkTrainingStats | None,
        epoch_progress: Callable[[int, dict[str, float]], None] | None,
        host: str,
        job_id: int,
        secret: bytes,
        show_progress: bool | None = None,
    ) -> None:
        try:
            bind = socket.gethostbyname(host)
        except OSError as exc:
            raise TransportError(f"controller address {host!r} does not resolve: {exc}") from exc
        self.master, self.network, self.host, self.secret = master, network, host, secret
        self.epochs, self.epoch_callback, self.stats = epochs, epoch_callback, stats
        self.first_epoch = self.finished = int(network.epoch_count)
        examples = data.num_units * data.examples_per_unit
        options = master._controller_options()
        self.progress = FitProgress(
            epochs,
            self.first_epoch,
            estimate_minibatches(examples, partitions, master.batch_size_per_worker),
            master.batch_size_per_worker,
            enabled=master.progress if show_progress is None else show_progress,
            traffic=lambda: float(
                self.controller.counters.bytes_sent + self.controller.counters.bytes_received
            ),
            on_epoch=epoch_progress,
            updates=not options.get("averaging", False),
        )
        self.controller = ProgressController(
            network.params(),
            job_id,
            secret,
            bind,
            master.void_configuration.unicast_port,
            master.transport or ZmqTransportConfiguration(),
            iteration=int(network.iteration_count),
            epoch=self.first_epoch,
            updater_state=network.updater_state(),
            progress=self.progress,
            **options,
        )
        master._state_reports = None
        self._epoch_params: np.ndarray | None = None  # the last epoch end's parameters (on_epoch)
        self._epoch_iteration = int(network.iteration_count)
        self._params_pending = False

    def job(self, template: SharedJob) -> SharedJob:
        """``template`` with this controller's secret, address and keys."""
        c = self.controller
        return replace(
            template,
            secret=self.secret,
            controller_key=c.controller_key,
            curve_key=c.curve_key,
            host=self.host,
            port=c.port,
        )

    def on_epoch(self, epoch: int) -> bool:
        """The driver's side of an epoch end while the workers wait at its barrier: the controller's
        parameters are copied into a buffer kept for the fit and, with an epoch callback, the network
        takes them and the callback decides; returns whether to stop. Without a callback the network
        takes them in :meth:`after_release`, once the workers train again: with the network set here
        every worker waited for two copies of the model (0.2-0.4 s at 17M parameters under load)."""
        network, controller = self.network, self.controller
        self.finished = epoch + 1
        self.progress.end_epoch(epoch)
        if self._epoch_params is None:
            self._epoch_params = controller.params()
        else:
            controller.copy_params(self._epoch_params)
        self._epoch_iteration = controller.next_iteration
        self.master._epoch_state(network, controller)
        last = self.finished >= self.first_epoch + self.epochs
        if self.epoch_callback is None:
            self._params_pending = True
            return last
        self._take_epoch_params()
        return run_epoch_callback(self.epoch_callback, epoch, network, self.stats) or last

    def after_release(self) -> None:
        """After the barrier let the workers go: the network takes the epoch's parameters if
        :meth:`on_epoch` left them for now."""
        if self._params_pending:
            self._take_epoch_params()

    def _take_epoch_params(self) -> None:
        network = self.network
        assert self._epoch_params is not None
        network.set_params(self._epoch_params)
        network.epoch_count = self.finished
        network.iteration_count = max(int(network.iteration_count), self._epoch_iteration)
        self._params_pending = False

    def await_state_report(self) -> None:
        """The last epoch's updater-state report may be in flight: let it land (checkpoints)."""
        reports = self.master._state_reports
        if reports is not None:
            self.controller.updater_state_after(reports[1], STATE_REPORT_WAIT_S)

    def with_final_states(self, results: dict[int, WorkerResult]) -> dict[int, WorkerResult]:
        """``results`` with the updater state each worker's latest task sent the controller at its end
        (``SharedJob.final_state_report``), waited for up to STATE_REPORT_WAIT_S; a worker whose report
        did not come keeps None (left out of the mean), with a warning."""
        tasks = {w: r.task_seq for w, r in results.items() if r.updater_state is None}
        deadline = time.monotonic() + STATE_REPORT_WAIT_S
        while True:  # every task sends one report, so the latest task's is a worker's task_seq-th
            finals = self.controller.final_updater_states()
            missing = [w for w, seq in tasks.items() if finals.get(w, (0,))[0] < seq]
            if not missing or self.controller.error is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if missing:
            log.warning(
                "the updater state of %d worker(s) did not reach the controller: the fit's updater state "
                "is the mean over the other %d",
                len(missing),
                len(results) - len(missing),
            )
        return {
            w: r if w not in tasks or w in missing else replace(r, updater_state=finals[w][1])
            for w, r in results.items()
        }

    def close(self) -> None:
        self.controller.close()
        self.progress.close()

    def finish(self, one_job: bool) -> None:
        """After :meth:`close`: the network takes the controller's final state, and the master's
        ``last_traffic`` its counters (``one_job``: every epoch ran in one Spark job)."""
        network, controller, master = self.network, self.controller, self.master
        network.set_params(controller.params())
        master._epoch_state(network, controller)
        network.epoch_count = max(self.finished, int(network.epoch_count))
        network.iteration_count = max(int(network.iteration_count), controller.next_iteration)
        c = controller.counters
        master.last_traffic = {
            "controller_bytes_received": c.bytes_received,
            "controller_bytes_sent": c.bytes_sent,
            "controller_messages_received": c.messages_received,
            "controller_messages_sent": c.messages_sent,
            "controller_update_bytes_relayed": c.update_bytes,
            "controller_update_frames_relayed": c.update_frames,
            "controller_frames_rejected": c.frames_rejected,
            **{f"controller_frames_rejected_{k}": v for k, v in sorted(c.rejected_reasons.items())},
            "controller_peers_dropped": c.peers_dropped,
            **{f"controller_peers_dropped_{k}": v for k, v in sorted(c.dropped_reasons.items())},
            "controller_outliers_flagged": c.outliers_flagged,
            "updates_applied": controller.updates_applied,
            "rounds_averaged": controller.rounds_averaged,
            "workers": len(controller.workers_seen),
            "retrained_minibatches": controller.retrained_minibatches,
            "updater_state_reports": controller.updater_state_reports,
            "epochs": self.finished - self.first_epoch,
            "spark_jobs": 1 if one_job else self.finished - self.first_epoch,
        }


__all__ = ["ControllerFit", "ProgressController", "dynamic_allocation", "task_slots"]
