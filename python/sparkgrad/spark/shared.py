"""SharedTrainingMaster: asynchronous gradient sharing with Strom threshold-encoded updates.

Driver: a :class:`~sparkgrad.transport.Controller` thread keeps the authoritative parameters by
applying every update it relays (PLAIN star topology); one controller serves every epoch of a fit.
Executors: each Python worker process keeps one :class:`SharedWorker` per fit (module-level registry
keyed by job id) holding the network replica, the EncodingHandler's residual, the updater state and the
ZeroMQ connection across the epochs and tasks of that fit. A worker trains its minibatches one by one:
apply whatever peer updates have arrived, ``compute_update``, encode, send, apply its own decoded
message. Within an epoch workers never wait for each other.

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
next fit.

Security and failure handling: every fit draws a fresh random 256-bit secret (or uses
``VoidConfiguration.secret``) that authenticates every frame (:mod:`sparkgrad.transport.frame`); it
reaches the executors only inside the job broadcast. The driver watches the controller while the Spark
job runs: if the controller thread fails, the job group is cancelled and the fit raises TrainingError
with the controller's own error. A worker the controller dropped as a slow peer re-joins and replaces
its parameters with the controller's (its residual, the update mass it never sent, is kept). A task that
fails any other way discards its process's worker, so a Spark retry starts a fresh worker (new worker
id) that pulls the current parameters, iteration and epoch from the controller, and the latest updater
state a worker reported: the first partition's worker sends its updater state at an epoch end at most
every ``ZmqTransportConfiguration.updater_state_interval_ms`` (60 s; also at its first epoch end), so
that state is at most that interval plus one epoch old (before the first report: the state the fit
started from). Workers report
the minibatches they trained per (partition, epoch); a partition's epoch reported twice was re-run by a
Spark task retry, and ``last_traffic["retrained_minibatches"]`` counts those minibatches;
``workers_lost`` and ``updates_from_lost_workers`` count workers that joined but returned no result and
the updates of theirs the controller applied (they stay in the model).
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import math
import os
import random
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad._config import Config, check_int, coerce_enum
from sparkgrad.compress import (
    DEFAULT_UPDATE_COMBINATION,
    EncodingHandler,
    NoOpResidualPostProcessor,
    ResidualPostProcessor,
    ThresholdAlgorithm,
    apply_message,
    default_threshold_algorithm,
    update_scale,
)
from sparkgrad.errors import TrainingError, TransportError
from sparkgrad.spark.common import (
    DEFAULT_DIRECT_MEMORY_BUDGET_MB,
    NetworkSnapshot,
    TrainingMasterBase,
    mean_or_none,
    process_tag,
    run_spark,
    worker_batches,
)
from sparkgrad.spark.config import (
    DefaultRepartitioner,
    MeshBuildMode,
    RDDTrainingApproach,
    VoidConfiguration,
    check_storage_level,
)
from sparkgrad.spark.devices import (
    check_worker_device,
    device_index,
    resolve_worker_device,
    to_host,
)
from sparkgrad.spark.progress import FitProgress, estimate_minibatches
from sparkgrad.spark.stats import SparkTrainingStats, Timer, event, now_ms, run_epoch_callback
from sparkgrad.transport import (
    Controller,
    Header,
    RejoinRequired,
    WorkerConnection,
    ZmqTransportConfiguration,
)
from sparkgrad.transport.frame import update_payload

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkgrad.nn._flat_network import FlatNetwork, N

log = logging.getLogger(__name__)

# Stats keys.
MASTER_EXPORT = "SharedMasterExportTimesMs"
MASTER_REPARTITION = "SharedMasterRepartitionTimesMs"
MASTER_FIT = "SharedMasterFitTimesMs"
MASTER_PROCESS = "SharedMasterProcessResultsTimesMs"
WORKER_INIT = "SharedWorkerGetInitialModelTimeMs"
WORKER_GET_DATA = "WorkerFlatMapDataSetGetTimesMs"
WORKER_PEERS = "SharedWorkerApplyPeerUpdatesTimesMs"
WORKER_COMPUTE = "SharedWorkerComputeUpdateTimesMs"
WORKER_ENCODE = "SharedWorkerEncodeSendApplyTimesMs"
WORKER_SYNC = "SharedWorkerSyncTimesMs"
WORKER_TOTAL = "WorkerFlatMapTotalTimeMs"

SECRET_BYTES = 32  # 256-bit per-fit secret
_MAX_REJOINS_PER_SYNC = 5
_WATCH_INTERVAL_S = 0.2  # how often the driver checks the controller while the Spark job runs
_CANCEL_WAIT_S = 60.0
PROGRESS_REPORT_INTERVAL_S = 2.0  # how often a worker sends its training loss for the progress line


@dataclass
class SharedJob:
    """Everything a worker needs for one fit (shipped in a broadcast)."""

    job_id: int
    secret: bytes = field(repr=False)
    host: str
    port: int
    transport: ZmqTransportConfiguration
    snapshot: NetworkSnapshot
    threshold_algorithm: ThresholdAlgorithm
    residual_post_processor: ResidualPostProcessor | None
    kind: str
    loader: Any
    batch_size: int
    prefetch: int
    workers_per_node: int
    encoding_debug_mode: bool
    debug_longer_iterations: int
    collect_stats: bool
    barrier: bool  # all epochs in one barrier job, EPOCH_END at every epoch end
    shuffle_seed: int
    mesh: bool = False  # MESH: updates come down a relay tree (sparkgrad.transport.mesh)
    progress_interval_s: float = 0.0  # > 0: workers report their training loss this often
    staleness_window: int = 0  # > 0: a paced SYNC every this many minibatches (WorkerConnection.pace)
    worker_device: str = "auto"  # the master's option, resolved on the executor (sparkgrad.spark.devices)
    update_scale: float = 1.0  # each update's factor before encoding (sparkgrad.compress.update_scale)


@dataclass
class WorkerResult:
    """A task's report: the worker's latest state (the driver keeps one per worker)."""

    worker_id: int
    task_seq: int
    score: float
    updater_state: np.ndarray | None
    threshold_algorithm: ThresholdAlgorithm
    minibatches: int
    counters: dict[str, float]
    stats: SparkTrainingStats | None = None


def encoded_count(message: np.ndarray, decoded: np.ndarray, is_bitmap: bool) -> int:
    """How many elements a message encodes.

    Args:
        message: the int32 message.
        decoded: the message decoded into zeros (every encoded element is nonzero there).
        is_bitmap: whether the message is a bitmap (its word 0 is the vector length, not a count).

    Returns:
        The sparse message's entry count (word 0), or the bitmap's nonzero decoded elements.
    """
    return int(np.count_nonzero(decoded)) if is_bitmap else int(message[0])


def _lock_directory() -> int:
    """An open descriptor of this user's private directory of slot locks, ``<tmp>/sparkgrad-<uid>``.

    Created with mode 0700; refused unless it is a directory (not a link) owned by this user that no one
    else may enter: another local user who knows the job id (the Spark UI shows it) could otherwise plant
    links or hold the locks.
    """
    path = os.path.join(tempfile.gettempdir(), f"sparkgrad-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TrainingError(
            f"slot lock directory {path}: {exc} (it must be a directory, not a link)"
        ) from exc
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        os.close(fd)
        raise TrainingError(
            f"slot lock directory {path} is owned by uid {info.st_uid} with mode {info.st_mode & 0o777:o}; "
            f"it must be this user's (uid {os.getuid()}) with mode 700: remove it"
        )
    return fd


class _SlotLock:
    """At most ``workers_per_node`` training tasks of one job at a time on one host (file locks).

    The lock files live in :func:`_lock_directory`, are opened with ``O_NOFOLLOW`` and are removed by
    the task that held them, while it still holds the lock; a task that locked a file another task has
    just removed (its inode is no longer the name's) tries again, so two tasks never share a slot.
    """

    def __init__(self, job_id: int, slots: int, timeout_s: float) -> None:
        self._fd: int | None = None
        self._dir = _lock_directory()
        try:
            self._acquire(job_id, slots, timeout_s)
        except BaseException:
            os.close(self._dir)
            raise

    def _acquire(self, job_id: int, slots: int, timeout_s: float) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        deadline = time.monotonic() + timeout_s
        while True:
            for i in range(slots):
                name = f"job-{job_id:016x}-slot{i}.lock"
                try:
                    fd = os.open(name, flags, 0o600, dir_fd=self._dir)
                except OSError as exc:  # a link (O_NOFOLLOW) or something else that is not our file
                    raise TrainingError(f"worker slot lock {name}: {exc}") from exc
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    current = os.stat(name, dir_fd=self._dir, follow_symlinks=False)
                    if current.st_ino != os.fstat(fd).st_ino:
                        raise FileNotFoundError(name)  # removed and re-created by other tasks meanwhile
                except OSError:
                    os.close(fd)
                    continue
                self._fd, self._name = fd, name
                return
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"no free worker slot (workers_per_node={slots}) within {timeout_s:.0f} s"
                )
            time.sleep(0.02)

    def release(self) -> None:
        """Remove the lock file (still holding it) and release it (idempotent)."""
        if self._fd is None:
            return
        try:
            os.unlink(self._name, dir_fd=self._dir)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        os.close(self._dir)
        self._fd = None


def _relay_host(host: str, port: int) -> str:
    """MESH: this executor's address as the other executors reach it: the local address of the route
    to the controller (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
        except OSError as exc:
            raise TransportError(
                f"no route to the controller {host}:{port} for the MESH relay socket: {exc}"
            ) from exc


class SharedWorker:
    """One executor process's training replica for one job; reused across that job's tasks.

    The replica, its updates and the encoding residual live on ``device`` (resolved by the task that
    creates the worker, kept for the whole fit); only messages, parameters from the controller and
    reported state cross between host and GPU.
    """

    def __init__(self, job: SharedJob, device: str) -> None:
        self.job = job
        self.device = device
        self.worker_id = random.SystemRandom().randrange(1, 2**32)
        self.tag = f"{process_tag()}#{self.worker_id:08x}"
        self.tasks = 0
        self.minibatches = 0
        self.last_score = float("nan")
        start = now_ms()
        self.rejoins = 0
        self.conn = WorkerConnection(
            job.host,
            job.port,
            job.job_id,
            self.worker_id,
            job.secret,
            job.snapshot.params.size,
            job.transport,
            updater_state_bytes=getattr(job.snapshot.updater_state, "nbytes", 0),
            relay_host=_relay_host(job.host, job.port) if job.mesh else None,
            on_params=self._take_params,
            # the driver's bound, from the same (not yet used) algorithm state: a forged UPDATE is dropped
            threshold_reference=_reference_threshold(job.threshold_algorithm),
        )
        try:
            params, iteration, epoch = self.conn.hello({"host": socket.gethostname(), "pid": os.getpid()})
            self.joined_epoch = epoch  # epochs before it are finished: a retried task starts here
            snap = job.snapshot
            # a late or restarted worker continues from the latest updater state a worker reported
            latest = self.conn.updater_state
            if latest is not None:
                # the state's own iteration keeps Adam-like bias corrections consistent with it: a state
                # from iteration 45 used at iteration 190 takes steps ~2x too large, and the thresholds
                # chasing those steps can run away
                iteration = self.conn.updater_state_iteration
            self.net = NetworkSnapshot(
                snap.network_type,
                snap.conf_json,
                params,
                snap.updater_state if latest is None else latest,
                iteration if latest is not None else max(iteration, snap.iteration),
                max(epoch, snap.epoch),
            ).build(device=device)
        except BaseException:
            self.conn.close()
            raise
        self.handler = EncodingHandler(
            self.net.num_params(),
            job.threshold_algorithm,
            job.residual_post_processor,
            dtype=self.net.params().dtype,
            update_scale=job.update_scale,
        )
        with self.net.device.scope():  # the decode target of messages, on the replica's device
            self._scratch = self.net.device.xp.zeros(self.net.num_params(), self.net.params().dtype)
        self.stats: SparkTrainingStats | None = None
        self._init_event = event(start, gpu=device_index(device)) if job.collect_stats else None
        self._state_reported: float | None = None  # monotonic time of the last updater-state report
        self._loss_sum, self._loss_count = 0.0, 0  # training loss since the last progress report
        self._steps_epoch, self._epoch_steps = -1, 0  # minibatches this worker trained in that epoch
        self._loss_reported = time.monotonic()

    def _take_params(self, params: np.ndarray, iteration: int, epoch: int) -> None:
        """MESH resynchronisation: the controller's parameters replace this replica's."""
        self.net.set_params(params)
        self.net.iteration_count = max(int(self.net.iteration_count), iteration)

    def _apply_message(self, message: np.ndarray) -> None:
        apply_message(message, self.net, self._scratch)

    def _on_peer(self, header: Header, message: np.ndarray) -> None:
        self._apply_message(message)

    def _rejoin(self, reason: RejoinRequired) -> None:
        """The controller dropped this worker: HELLO again and take the controller's parameters."""
        log.warning("sparkgrad worker %s: %s; re-joining", self.tag, reason)
        params, iteration, epoch = self.conn.hello(
            {"host": socket.gethostname(), "pid": os.getpid(), "rejoin": True}
        )
        if params is None:
            raise TrainingError(f"worker {self.tag}: the controller sent no parameters on re-join")
        self.net.set_params(params)
        self.net.iteration_count = max(int(self.net.iteration_count), iteration)
        self.net.epoch_count = max(int(self.net.epoch_count), epoch)
        self.rejoins += 1

    def _rejoining(self, exchange: Callable[[], Any]) -> Any:
        """Run a blocking exchange with the controller, re-joining (a bounded number of times) when it
        dropped this worker."""
        for _ in range(_MAX_REJOINS_PER_SYNC):
            try:
                return exchange()
            except RejoinRequired as exc:
                self._rejoin(exc)
        raise TrainingError(
            f"worker {self.tag}: dropped by the controller {_MAX_REJOINS_PER_SYNC} times in a row as a slow "
            "peer (raise ZmqTransportConfiguration.high_water_mark)"
        )

    def step(self, ds: Any) -> None:
        """Train one minibatch: peers' updates, own update, encode, send, apply own message."""
        stats = self.stats
        with Timer(stats, WORKER_PEERS):
            try:
                self.conn.drain(self._on_peer)
            except RejoinRequired as exc:
                self._rejoin(exc)
        with Timer(stats, WORKER_COMPUTE, examples=ds.num_examples()):
            try:
                update, self.last_score = self.net.compute_update(ds)
            except TrainingError as exc:
                raise TrainingError(f"worker {self.tag}: {exc}") from exc
        self._loss_sum += self.last_score
        self._loss_count += 1
        if int(self.net.epoch_count) != self._steps_epoch:
            self._steps_epoch, self._epoch_steps = int(self.net.epoch_count), 0
        self._epoch_steps += 1
        t = now_ms()
        iteration, epoch = int(self.net.iteration_count), int(self.net.epoch_count)
        message = self.handler.encode(update, iteration, epoch)
        sent = 0
        if message is not None:
            sent = self.conn.send_update(message, iteration, epoch)
            self._apply_message(message)
        self.minibatches += 1
        if self.job.staleness_window:
            with Timer(stats, WORKER_PEERS):
                self._rejoining(lambda: self.conn.pace(self._on_peer, self.job.staleness_window))
        interval = self.job.progress_interval_s
        if interval > 0 and time.monotonic() - self._loss_reported >= interval:
            # a report without "partition" counts nothing: it only carries the loss to the progress line
            report = self._progress_report()
            self._rejoining(lambda: self.conn.sync(self._on_peer, report, epoch))
        if stats is None and not self.job.encoding_debug_mode:
            return self._pause()
        encoded = 0
        if message is not None:  # the scratch buffer still holds the message decoded
            with self.net.device.scope():  # a count over a GPU array runs on that GPU
                encoded = encoded_count(message, self._scratch, bool(self.handler.last_was_dense))
        density = encoded / self.net.num_params()
        threshold = float(self.handler.last_threshold or 0.0)
        if stats is not None:
            stats.add(WORKER_ENCODE, event(t))
            stats.add_score(self.tag, iteration, self.last_score)
            stats.add_series(
                self.tag,
                {
                    "iteration": iteration,
                    "threshold": threshold,
                    "density": density,
                    "bytes_sent": float(sent),
                    "time_ms": now_ms(),
                },
            )
        if self.job.encoding_debug_mode:
            with self.net.device.scope():
                r = np.abs(self.handler.residual)
                mean_r, max_r = float(r.mean()), float(r.max())
            log.warning(
                "sparkgrad worker %s iteration %d: threshold %.3g, density %.3g (%d of %d), "
                "residual mean|r| %.3g max|r| %.3g, %d bytes",
                self.tag,
                iteration,
                threshold,
                density,
                encoded,
                r.size,
                mean_r,
                max_r,
                sent,
            )
        self._pause()

    def _progress_report(self) -> dict[str, Any]:
        """For the driver's progress line: this epoch's minibatches so far and the mean training loss
        since the last report (no "partition": the controller counts nothing from it)."""
        loss = self._loss_sum / self._loss_count if self._loss_count else self.last_score
        self._loss_sum, self._loss_count = 0.0, 0
        self._loss_reported = time.monotonic()
        steps = self._epoch_steps if self._steps_epoch == int(self.net.epoch_count) else 0
        report: dict[str, Any] = {"epoch_minibatches": steps}
        if math.isfinite(loss):
            report["loss"] = float(loss)
        return report

    def _pause(self) -> None:
        if self.job.debug_longer_iterations:
            time.sleep(self.job.debug_longer_iterations / 1000.0)

    def run_task(self, units: Iterable[Any], partition: int, first_epoch: int, epochs: int) -> WorkerResult:
        """Train on one partition for epochs ``first_epoch .. first_epoch + epochs - 1`` (network epoch
        numbers) and report this worker's state.

        Each epoch visits the partition's elements in a new seeded order. In a barrier job the worker
        reports every epoch end and waits for the driver's decision (it may stop early); epochs the
        controller already finished (a retried task) are skipped.
        """
        start = now_ms()
        job = self.job
        self.stats = SparkTrainingStats() if job.collect_stats else None
        if self.stats is not None and self._init_event is not None:
            self.stats.add(WORKER_INIT, self._init_event)
            self._init_event = None
        lock: _SlotLock | None = None
        try:
            if job.workers_per_node > 0 and not job.barrier:
                lock = _SlotLock(job.job_id, job.workers_per_node, job.transport.sync_timeout_ms / 1000)
            elements = list(units)  # kept for every epoch: DataSets, exported bytes or paths
            begin = max(first_epoch, self.joined_epoch) if job.barrier else first_epoch
            for epoch in range(begin, first_epoch + epochs):
                order = np.random.default_rng([job.shuffle_seed, epoch, partition]).permutation(len(elements))
                self.net.epoch_count = epoch
                trained = self.minibatches
                batches = worker_batches(
                    (elements[i] for i in order), job.kind, job.loader, job.batch_size, job.prefetch
                )
                while True:
                    t = now_ms()
                    ds = next(batches, None)
                    if ds is None:
                        break
                    if self.stats is not None:
                        self.stats.add(WORKER_GET_DATA, event(t))
                    for batch in self.net._training_batches([ds]):  # truncated BPTT: one step a segment
                        self.step(batch)
                with Timer(self.stats, WORKER_SYNC):
                    stop = self._end_of_epoch(epoch, partition, self.minibatches - trained)
                self.net.epoch_count = epoch + 1
                if stop:
                    break
        finally:
            if lock is not None:
                lock.release()
        self.tasks += 1
        c = self.conn.counters
        counters = {
            "update_bytes_sent": c.update_bytes,
            "bytes_sent": c.bytes_sent,
            "bytes_received": c.bytes_received,
            "messages_sent": c.messages_sent,
            "messages_received": c.messages_received,
            "frames_rejected": c.frames_rejected,
            "rejoins": self.rejoins,
            "paced_waits": c.paced_waits,
            "paced_wait_ms": c.paced_wait_ms,
        }
        if self.stats is not None:
            self.stats.add(WORKER_TOTAL, event(start))
        return WorkerResult(
            self.worker_id,
            self.tasks,
            self.last_score,
            to_host(self.net.updater_state()),
            self.handler.threshold_algorithm.clone(),
            self.minibatches,
            counters,
            self.stats,
        )

    def _end_of_epoch(self, epoch: int, partition: int, minibatches: int) -> bool:
        """Report the epoch's training to the controller: EPOCH_END and its decision in a barrier job
        (True: stop), else SYNC (the job boundary is the epoch boundary)."""
        self._report_updater_state(partition)
        report: dict[str, Any] = {"partition": partition, "minibatches": minibatches}
        if self.job.progress_interval_s > 0:
            report.update(self._progress_report())
        if self.job.barrier:
            return bool(self._rejoining(lambda: self.conn.end_epoch(epoch, self._on_peer, report)))
        self._rejoining(lambda: self.conn.sync(self._on_peer, report, epoch))
        return False

    def _report_updater_state(self, partition: int) -> None:
        """The first partition's worker sends its updater state to the controller at its first epoch end
        and then once ``updater_state_interval_ms`` has passed since its last report: what a late or
        restarted worker starts from (a zero Adam state at a late iteration would take steps ~3x too
        large), at most that interval plus one epoch old."""
        interval_s = self.job.transport.updater_state_interval_ms / 1000
        last = self._state_reported
        if partition != 0 or (last is not None and time.monotonic() - last < interval_s):
            return
        state = to_host(self.net.updater_state())
        if state.size:
            self.conn.send_updater_state(state, int(self.net.iteration_count))
        self._state_reported = time.monotonic()

    def close(self) -> None:
        self.conn.close()


_WORKERS: dict[int, SharedWorker] = {}


def _worker_for(job: SharedJob) -> SharedWorker:
    """This process's worker for ``job``; workers of finished jobs are closed first."""
    worker = _WORKERS.get(job.job_id)
    if worker is None:
        for old in list(_WORKERS):
            _WORKERS.pop(old).close()
        worker = SharedWorker(job, resolve_worker_device(job.worker_device))
        _WORKERS[job.job_id] = worker
    return worker


@atexit.register
def _close_workers() -> None:
    for job_id in list(_WORKERS):
        _WORKERS.pop(job_id).close()


def _shared_partition(job_bc: Any, first_epoch: int, epochs: int) -> Any:
    def run(units: Iterable[Any]) -> Iterator[dict[int, WorkerResult]]:
        from pyspark import TaskContext

        worker = _worker_for(job_bc.value)
        try:
            result = worker.run_task(units, TaskContext.get().partitionId(), first_epoch, epochs)
        except BaseException:
            # its replica may be out of step: a retried task starts a fresh worker that pulls parameters
            _WORKERS.pop(job_bc.value.job_id, None)
            worker.close()
            raise
        if result.minibatches:
            yield {result.worker_id: result}

    return run


class _ProgressController(Controller):
    """The fit's controller, feeding the progress line: every update it applies (its threshold and
    density) and the training loss in the workers' reports. Progress is read on the controller's own
    thread, from frames the base class has already authenticated and accepted."""

    def __init__(self, *args: Any, progress: FitProgress, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = progress

    def _apply_and_relay(self, identity: bytes, header: Header, payload: memoryview, frame: bytes) -> None:
        applied = self.updates_applied
        super()._apply_and_relay(identity, header, payload, frame)
        if self.updates_applied == applied:  # rejected
            return
        message = update_payload(payload)
        # word 3 is the bitmap flag: a bitmap's word 0 is the vector length, its entries are the nonzeros
        encoded = int(np.count_nonzero(self._scratch)) if message[3] == 1 else int(message[0])
        threshold = float(message[2:3].view("<f4")[0])
        self.progress.update(encoded / max(self._params.size, 1), threshold, header.sender, header.epoch)

    def _count_trained(self, identity: bytes, sender: int, epoch: int, payload: memoryview) -> dict | None:
        report = super()._count_trained(identity, sender, epoch, payload)
        if report is not None:
            loss, trained = report.get("loss"), report.get("epoch_minibatches")
            if isinstance(loss, (int, float)) and not isinstance(loss, bool):
                self.progress.loss(float(loss), sender)
            if isinstance(trained, int) and not isinstance(trained, bool) and trained >= 0:
                self.progress.trained(sender, epoch, trained)
        return report


def _reference_threshold(algorithm: ThresholdAlgorithm) -> float:
    """The threshold the workers of a fit start from: bounds the thresholds the controller accepts.

    The largest of the algorithm's ``last_threshold`` (adaptive state), ``initial_threshold`` and
    ``threshold`` (fixed) that is set.
    """
    found = [
        float(v)
        for v in (getattr(algorithm, n, None) for n in ("last_threshold", "initial_threshold", "threshold"))
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    ]
    if not found:
        raise ValueError(
            f"threshold_algorithm: {type(algorithm).__name__} has no positive last_threshold, "
            "initial_threshold or threshold attribute (the controller bounds update thresholds by it)"
        )
    return max(found)


def _run_watched(
    sc: SparkContext,
    controller: Controller,
    action: Callable[[], Any],
    on_epoch: Callable[[int], bool] | None = None,
    progress: FitProgress | None = None,
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
        if epoch is None:
            thread.join(0 if on_epoch else _WATCH_INTERVAL_S)
        else:
            stop = True
            try:
                stop = bool(on_epoch(epoch)) if callback_error is None else True
            except BaseException as exc:  # the workers still have to be released
                callback_error = exc
            controller.release_epoch(epoch, stop)
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


def _task_slots(sc: SparkContext) -> int:
    """How many tasks the cluster runs at once: Spark's own count over the registered executors (what a
    barrier stage is checked against), else default parallelism over ``spark.task.cpus``."""
    from py4j.protocol import Py4JError

    try:
        jsc = sc._jsc.sc()  # type: ignore[attr-defined]
        slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Py4JError:  # an internal API: versions without it fall back to the configuration
        slots = 0
    if slots > 0:
        return slots
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    return max(1, int(sc.defaultParallelism) // max(1, cpus))


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


@dataclass
class SharedTrainingMaster(TrainingMasterBase, Config):
    """Gradient sharing with threshold-encoded updates (DL4J ``SharedTrainingMaster``), PLAIN topology.

    Args:
        void_configuration: controller port and address resolution.
        batch_size_per_worker: minibatch size each worker trains (exported batch size in Export mode).
        rdd_data_set_num_examples: examples per DataSet of the RDD (Direct mode / fit_paths sizing).
        workers_per_node: concurrent training tasks per host (-1: one per Spark task slot).
        threshold_algorithm: default :func:`~sparkgrad.compress.default_threshold_algorithm`:
            ``TargetSparsityThresholdAlgorithm(2e-2, 1e-3)`` (DL4J's default was
            ``AdaptiveThresholdAlgorithm()``; the README's digits benchmark compares them).
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
        storage_level: storage level of the training RDD.
        repartitioner: None (default): one balanced partition per Spark task slot, every epoch of a fit
            in one barrier job; ``DefaultRepartitioner()`` is DL4J's one minibatch per partition (one
            Spark job per epoch once there are more partitions than slots).
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
        update_combination: how the updates of the N workers training at once combine: ``"sqrt"``
            (default: each worker sends its update divided by sqrt(N), the square-root scaling rule of an
            N-times larger batch, so the learning rate and updater that work on one machine work here),
            ``"mean"`` (divided by N: DDP's averaged step) or ``"sum"`` (DL4J's and Strom's: every update at
            full size, N workers taking about N times the step). The README's convergence study compares
            them; see :data:`~sparkgrad.compress.UPDATE_COMBINATIONS`.
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
    storage_level: str = "MEMORY_ONLY_SER"
    repartitioner: DefaultRepartitioner | None = None
    worker_prefetch_num_batches: int = 2
    encoding_debug_mode: bool = False
    collect_training_stats: bool = False
    debug_longer_iterations: int = 0
    rng_seed: int | None = None
    transport: ZmqTransportConfiguration | None = None
    progress: bool = True
    worker_device: str = "auto"
    update_combination: str = DEFAULT_UPDATE_COMBINATION

    def __post_init__(self) -> None:
        if not isinstance(self.void_configuration, VoidConfiguration):
            raise ValueError(
                f"void_configuration: expected a VoidConfiguration, got {self.void_configuration!r}"
            )
        self.batch_size_per_worker = check_int("batch_size_per_worker", self.batch_size_per_worker, minimum=1)
        update_scale(self.update_combination, 1)  # checks the name
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
        if self.repartitioner is not None and not isinstance(self.repartitioner, DefaultRepartitioner):
            raise ValueError(f"repartitioner: expected a DefaultRepartitioner, got {self.repartitioner!r}")
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
        self._runtime_init()
        self._threshold_state: ThresholdAlgorithm | None = None
        self.last_traffic: dict[str, float] = {}

    @property
    def current_threshold_algorithm(self) -> ThresholdAlgorithm:
        """The threshold algorithm (with state) the next fit starts from: the last fit's reduced state."""
        return self._threshold_state or self.threshold_algorithm or default_threshold_algorithm()

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
        """
        stats = SparkTrainingStats() if self.collect_training_stats else None
        fit_start = now_ms()
        data = self.prepare(sc, rdd, kind, loader, stats, MASTER_EXPORT)
        slots = _task_slots(sc)
        with Timer(stats, MASTER_REPARTITION):
            seed = None
            if self.rng_seed is not None:  # a reproducible order, new for every fit
                seed = (self.rng_seed + 1) * 1_000_003 + int(network.epoch_count)
            min_per = max(1, self.batch_size_per_worker // data.examples_per_unit)
            repartitioner = self.repartitioner or DefaultRepartitioner(max_partitions=slots)
            units = repartitioner.repartition(data.rdd, min_per, data.num_units, data.counts, seed)
        results = self._run_job(
            sc, network, units, data, stats, epochs, epoch_callback, slots, epoch_progress
        )
        with Timer(stats, MASTER_PROCESS):
            score = self._process_results(network, results, stats)
        if stats is not None:
            examples = data.num_units * data.examples_per_unit
            stats.add(MASTER_FIT, event(fit_start, examples=examples))
        self.last_stats = stats
        return score

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
    ) -> dict[int, WorkerResult]:
        transport = self.transport or ZmqTransportConfiguration()
        void = self.void_configuration
        host = void.resolve_controller_address(sc.getConf().get("spark.driver.host"))
        try:
            bind = socket.gethostbyname(host)
        except OSError as exc:
            raise TransportError(f"controller address {host!r} does not resolve: {exc}") from exc
        job_id = random.SystemRandom().getrandbits(63) + 1
        secret = void.secret if isinstance(void.secret, bytes) else secrets.token_bytes(SECRET_BYTES)
        algorithm = self.current_threshold_algorithm
        partitions = units.getNumPartitions()
        barrier = partitions <= slots
        first_epoch = int(network.epoch_count)
        examples = data.num_units * data.examples_per_unit
        progress = FitProgress(
            epochs,
            first_epoch,
            estimate_minibatches(examples, partitions, self.batch_size_per_worker),
            self.batch_size_per_worker,
            enabled=self.progress,
            traffic=lambda: float(controller.counters.bytes_sent + controller.counters.bytes_received),
            on_epoch=epoch_progress,
        )
        controller = _ProgressController(
            network.params(),
            job_id,
            secret,
            bind,
            void.unicast_port,
            transport,
            iteration=int(network.iteration_count),
            epoch=first_epoch,
            threshold_reference=_reference_threshold(algorithm),
            updater_state=network.updater_state(),
            mesh=self.mesh_build_mode == MeshBuildMode.MESH,
            progress=progress,
        )
        finished = first_epoch

        def on_epoch(epoch: int) -> bool:
            """The driver's side of an epoch end: the network takes the controller's parameters."""
            nonlocal finished
            finished = epoch + 1
            progress.end_epoch(epoch)
            network.set_params(controller.params())
            network.epoch_count = finished
            network.iteration_count = max(int(network.iteration_count), controller.iteration + 1)
            stop = run_epoch_callback(epoch_callback, epoch, network, stats)
            return stop or finished >= first_epoch + epochs

        results: dict[int, WorkerResult] = {}
        try:
            if barrier:
                controller.expect_workers(partitions)
            job = SharedJob(
                job_id,
                secret,
                host,
                controller.port,
                transport,
                NetworkSnapshot.of(network),
                algorithm,
                self.residual_post_processor or NoOpResidualPostProcessor(),
                data.kind,
                data.loader,
                self.batch_size_per_worker,
                self.worker_prefetch_num_batches,
                self.workers_per_node,
                self.encoding_debug_mode,
                self.debug_longer_iterations,
                self.collect_training_stats,
                barrier,
                self.rng_seed if self.rng_seed is not None else random.SystemRandom().getrandbits(32),
                self.mesh_build_mode == MeshBuildMode.MESH,
                PROGRESS_REPORT_INTERVAL_S if self.progress else 0.0,
                self.staleness_bound // 2,
                self.worker_device,
                update_scale(self.update_combination, min(partitions, slots)),
            )
            bc = sc.broadcast(job)
            try:
                if barrier:  # every epoch in one job
                    train = _shared_partition(bc, first_epoch, epochs)
                    # the shuffle after the barrier stage makes it a map stage, which Spark re-runs as a
                    # whole when a task or an executor fails (a failed barrier result stage ends the job)
                    for part in _run_watched(
                        sc,
                        controller,
                        lambda: units.barrier().mapPartitions(train).repartition(1).collect(),
                        on_epoch,
                        progress,
                    ):
                        results = _latest(results, part)
                else:  # more partitions than slots: one job per epoch
                    for epoch in range(first_epoch, first_epoch + epochs):
                        train = _shared_partition(bc, epoch, 1)
                        for part in _run_watched(
                            sc, controller, lambda t=train: units.mapPartitions(t).collect(), None, progress
                        ):
                            results = _latest(results, part)
                        if on_epoch(epoch):
                            break
            finally:
                bc.destroy()  # the secret leaves the driver's block manager too, not only the executors
        finally:
            controller.close()
            progress.close()
        network.set_params(controller.params())
        network.epoch_count = max(finished, int(network.epoch_count))
        network.iteration_count = max(int(network.iteration_count), controller.iteration + 1)
        c = controller.counters
        self.last_traffic = {
            "controller_bytes_received": c.bytes_received,
            "controller_bytes_sent": c.bytes_sent,
            "controller_messages_received": c.messages_received,
            "controller_messages_sent": c.messages_sent,
            "controller_update_bytes_relayed": c.update_bytes,
            "controller_frames_rejected": c.frames_rejected,
            **{f"controller_frames_rejected_{k}": v for k, v in sorted(c.rejected_reasons.items())},
            "controller_peers_dropped": c.peers_dropped,
            "updates_applied": controller.updates_applied,
            "workers": len(controller.workers_seen),
            # workers that joined but returned no result (killed or failed tasks): their applied updates
            # stay in the model and in updates_applied
            "workers_lost": len(controller.workers_seen - results.keys()),
            "updates_from_lost_workers": sum(
                n for w, n in controller.updates_by_worker.items() if w not in results
            ),
            "retrained_minibatches": controller.retrained_minibatches,
            "updater_state_reports": controller.updater_state_reports,
            "epochs": finished - first_epoch,
            "spark_jobs": 1 if barrier else finished - first_epoch,
        }
        if stats is not None:
            for name, value in self.last_traffic.items():
                stats.count(name, value)
        return results

    def _process_results(
        self, network: FlatNetwork, results: dict[int, WorkerResult], stats: SparkTrainingStats | None
    ) -> float:
        if not results:
            raise TrainingError("training: no worker trained a minibatch (empty data?)")
        workers = list(results.values())
        total = None
        for r in workers:
            total = r.updater_state if total is None else total + r.updater_state
        updater = mean_or_none(total, len(workers))
        if updater is not None and updater.size:
            network.set_updater_state(updater.astype(network.updater_state().dtype, copy=False))
        reducer = workers[0].threshold_algorithm.new_reducer()
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
        return float(np.mean([r.score for r in workers]))


__all__ = ["SharedJob", "SharedTrainingMaster", "SharedWorker", "WorkerResult", "encoded_count"]
