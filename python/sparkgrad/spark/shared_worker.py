"""The executors' side of the fits that train around a controller on the driver: the worker that runs
inside each training task, for SharedTrainingMaster and, as :class:`AveragingWorker`, for
ParameterAveragingTrainingMaster's rounds in one job (the same connection, replica, epoch loop and epoch
barrier; only the body of an epoch differs).

Each Python worker process keeps one :class:`SharedWorker` per fit (module-level registry keyed by job
id) holding the network replica, the EncodingHandler's residual, the updater state and the ZeroMQ
connection across the epochs and tasks of that fit. A worker trains its minibatches one by one: apply
whatever peer updates have arrived, ``compute_update``, encode, send, apply its own decoded message.
Within an epoch workers never wait for each other; at an epoch end a worker reports EPOCH_END (barrier
job) or SYNC (one job per epoch) to the controller.

A worker the controller dropped as a slow peer re-joins and replaces its parameters with the
controller's (its residual, the update mass it never sent, is kept). A task that fails any other way
discards its process's worker, so a Spark retry starts a fresh worker (new worker id) that pulls the
current parameters, iteration and epoch from the controller, and the latest updater state a worker
reported with that state's own iteration: the first partition's worker sends its updater state at the
first epoch end after every ``ZmqTransportConfiguration.updater_state_interval_ms`` (60 s) of its
training; before the first report, the fit's start state (at the controller's iteration).

The driver's side (the masters, the controller and the Spark job) is :mod:`sparkgrad.spark.shared`.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import math
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkgrad import get_num_threads
from sparkgrad.compress.codec import message_indices
from sparkgrad.compress.handler import EncodingHandler
from sparkgrad.compress.sharing import DEFAULT_OWN_UPDATE, apply_message, share_update, take_params
from sparkgrad.compress.thresholds import ResidualPostProcessor, ThresholdAlgorithm
from sparkgrad.errors import TrainingError, TransportError
from sparkgrad.nn.trained_ranges import TrainedRanges
from sparkgrad.spark.common import NetworkSnapshot, fit_minibatch, process_tag, worker_batches
from sparkgrad.spark.devices import device_index, resolve_worker_device, to_host
from sparkgrad.spark.partition_store import PartitionStore
from sparkgrad.spark.partitioning import split_assignment
from sparkgrad.spark.stats import SparkTrainingStats, Timer, event, now_ms, peak_rss_mib, reset_peak_rss
from sparkgrad.spark.threads import task_threads
from sparkgrad.transport import (
    FrameRejected,
    Header,
    RejoinRequired,
    WorkerConnection,
    ZmqTransportConfiguration,
)

log = logging.getLogger(__name__)

# Stats keys.
WORKER_INIT = "SharedWorkerGetInitialModelTimeMs"
WORKER_GET_DATA = "WorkerFlatMapDataSetGetTimesMs"
WORKER_PEERS = "SharedWorkerApplyPeerUpdatesTimesMs"
WORKER_COMPUTE = "SharedWorkerComputeUpdateTimesMs"
WORKER_ENCODE = "SharedWorkerEncodeSendApplyTimesMs"
WORKER_SYNC = "SharedWorkerSyncTimesMs"
WORKER_STORE = "WorkerStorePartitionTimeMs"  # the partition written to local disk
WORKER_TOTAL = "WorkerFlatMapTotalTimeMs"
AVERAGING_WORKER_INIT = "ParameterAveragingWorkerInitTimeMs"
AVERAGING_WORKER_FIT = "ParameterAveragingWorkerFitTimesMs"
AVERAGING_WORKER_AVERAGE = "ParameterAveragingWorkerAverageTimesMs"  # a round's wait for the mean

_MAX_REJOINS_PER_SYNC = 5


@dataclass
class AveragingRounds:
    """ParameterAveragingTrainingMaster's rounds in one job: what a worker needs to split its partition
    into the rounds of every epoch exactly as the job-per-round fit splits the data
    (:func:`~sparkgrad.spark.partitioning.balanced_random_split` with the same seeds)."""

    rounds_per_epoch: int  # the number of balanced random splits of an epoch
    split_seeds: dict[int, int]  # network epoch -> the seed of its split
    save_updater: bool  # average the updater state too (else every round starts from the fit's)
    hooks: tuple  # TrainingHooks, run around every minibatch
    trained: TrainedRanges  # the parameters an AVERAGE/AVERAGED vector holds: a frozen layer's never


@dataclass
class SharedJob:
    """Everything a worker needs for one fit (shipped in a broadcast): gradient sharing, or parameter
    averaging in rounds when ``averaging`` is set (the sharing fields are then unused)."""

    job_id: int
    secret: bytes = field(repr=False)
    controller_key: bytes  # the controller's Ed25519 public key: verifies what only it may send
    host: str
    port: int
    transport: ZmqTransportConfiguration
    snapshot: NetworkSnapshot
    kind: str
    loader: Any
    batch_size: int
    prefetch: int
    collect_stats: bool
    barrier: bool  # all epochs in one barrier job, EPOCH_END at every epoch end
    shuffle_seed: int
    worker_device: str = "auto"  # the master's option, resolved on the executor (sparkgrad.spark.devices)
    task_threads: int | None = None  # native threads of a task (None: its CPUs; sparkgrad.spark.threads)
    progress_interval_s: float = 0.0  # > 0: workers report their training loss this often
    encrypt_store: bool = False  # spark.io.encryption.enabled: the partition stored on local disk encrypted
    # > 0: partition 0's worker reports its updater and threshold state at the end of every this many
    # epochs of the fit (counted from snapshot.epoch) and of its last (fit_end - 1): what checkpoints hold
    epoch_state: int = 0
    fit_end: int = 0
    # a task sends its updater state at its end to the controller (a FINAL report) instead of returning it
    # in its WorkerResult: a classic barrier job, whose controller on the driver outlives the tasks
    final_state_report: bool = False
    # gradient sharing
    threshold_algorithm: ThresholdAlgorithm | None = None
    residual_post_processor: ResidualPostProcessor | None = None
    workers_per_node: int = -1
    encoding_debug_mode: bool = False
    debug_longer_iterations: int = 0
    mesh: bool = False  # MESH: updates come down a relay tree (sparkgrad.transport.mesh)
    staleness_window: int = 0  # > 0: a paced SYNC every this many minibatches (WorkerConnection.pace)
    update_scale: float = 1.0  # each update's factor before encoding (compress.sharing.update_scale)
    momentum_masking: bool = False  # zero the velocity where a message sent (FlatNetwork.mask_momentum)
    own_update: str = DEFAULT_OWN_UPDATE  # what a worker applies of its own update (sharing.OWN_UPDATES)
    curve_key: bytes | None = None  # the controller's CURVE public key (transport.encrypt), else None
    # parameter averaging
    averaging: AveragingRounds | None = None


@dataclass
class WorkerResult:
    """A task's report: the worker's latest state (the driver keeps one per worker). Its updater state is
    None when the task sent it to the controller instead (``SharedJob.final_state_report``), or for
    parameter averaging without ``save_updater``."""

    worker_id: int
    task_seq: int
    score: float
    updater_state: np.ndarray | None
    threshold_algorithm: ThresholdAlgorithm | None  # None: parameter averaging
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

    init_key = WORKER_INIT  # the stats key of the replica's set-up

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
            controller_key=job.controller_key,
            curve_key=job.curve_key,
            **self._connection_options(),
        )
        try:
            params, iteration, epoch = self.conn.hello({"host": socket.gethostname(), "pid": os.getpid()})
            assert params is not None  # hello() omits them only for a worker that says has_initial_params
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
            self._init_training()  # the encoding buffers: a GPU out of memory must not leak the connection
        except BaseException:
            self.conn.close()
            raise
        self.stats: SparkTrainingStats | None = None
        self._init_event = event(start, gpu=device_index(device)) if job.collect_stats else None
        # monotonic time of the last updater-state report; the fit's start state serves a joining worker
        # until the first
        self._state_reported = time.monotonic()
        self._loss_sum, self._loss_count = 0.0, 0  # training loss since the last progress report
        self._steps_epoch, self._epoch_steps = -1, 0  # minibatches this worker trained in that epoch
        self._loss_reported = time.monotonic()

    def _connection_options(self) -> dict[str, Any]:
        """The WorkerConnection options of this kind of worker."""
        job = self.job
        # a gradient-sharing job always carries the master's algorithm (None only for AveragingWorker's)
        assert job.threshold_algorithm is not None
        return {
            "relay_host": _relay_host(job.host, job.port) if job.mesh else None,
            "on_params": self._take_params,
            # the driver's bound, from the same (not yet used) algorithm state: a forged UPDATE is dropped
            "threshold_reference": reference_threshold(job.threshold_algorithm),
        }

    def _init_training(self) -> None:
        """What this kind of worker trains with besides the replica: the encoding residual."""
        self.handler = EncodingHandler(
            self.net.num_params(),
            self.job.threshold_algorithm,
            self.job.residual_post_processor,
            dtype=self.net.params().dtype,
            update_scale=self.job.update_scale,
        )
        with self.net.device.scope():  # the decode target of messages, on the replica's device
            self._scratch = self.net.device.xp.zeros(self.net.num_params(), self.net.params().dtype)

    def _take_params(self, params: np.ndarray, iteration: int, epoch: int) -> None:
        """MESH resynchronisation: the controller's parameters replace this replica's."""
        self._set_params(params)
        self.net.iteration_count = max(int(self.net.iteration_count), iteration)

    def _set_params(self, params: np.ndarray) -> None:
        """The controller's parameters, with this worker's unsent residual kept applied (take_params)."""
        take_params(self.net, params, self.handler, self.job.own_update)

    def _apply_message(self, message: np.ndarray) -> None:
        apply_message(message, self.net, self._scratch)

    def _on_peer(self, header: Header, message: np.ndarray) -> None:
        """Apply a peer's update; one that leaves a parameter non-finite is refused (the connection counts
        it and this worker re-joins for the controller's parameters, which never took it)."""
        self._apply_message(message)
        if not self.net.params_finite(message_indices(message)):  # a sparse one changed only its indices
            raise FrameRejected(
                "non_finite",
                f"update from worker {header.sender} (threshold {float(message[2:3].view('<f4')[0]):.6g}) "
                "made parameters non-finite",
            )

    def _rejoin(self, reason: RejoinRequired) -> None:
        """The controller dropped this worker: HELLO again and take the controller's parameters."""
        log.warning("sparkgrad worker %s: %s; re-joining", self.tag, reason)
        params, iteration, epoch = self.conn.hello(
            {"host": socket.gethostname(), "pid": os.getpid(), "rejoin": True}
        )
        if params is None:
            raise TrainingError(f"worker {self.tag}: the controller sent no parameters on re-join")
        self._set_params(params)
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
        """Train one minibatch: peers' updates, own update (encoded and applied, share_update), send."""
        stats = self.stats
        with Timer(stats, WORKER_PEERS):
            try:
                self.conn.drain(self._on_peer)
            except RejoinRequired as exc:
                self._rejoin(exc)
        with Timer(stats, WORKER_COMPUTE, examples=ds.num_examples()):
            try:
                update, self.last_score = self.net.compute_update(ds, copy=False)
            except TrainingError as exc:
                raise TrainingError(f"worker {self.tag}: {exc}") from exc
        self._loss_sum += self.last_score
        self._loss_count += 1
        if int(self.net.epoch_count) != self._steps_epoch:
            self._steps_epoch, self._epoch_steps = int(self.net.epoch_count), 0
        self._epoch_steps += 1
        t = now_ms()
        iteration, epoch = int(self.net.iteration_count), int(self.net.epoch_count)
        message = share_update(
            self.handler,
            self.net,
            update,
            iteration,
            epoch,
            self.job.own_update,
            self._scratch,
            decode_sparse=self.job.momentum_masking,  # the scratch serves a bitmap's count, decoded anyway
        )
        recording = stats is not None or self.job.encoding_debug_mode
        sent = encoded = 0
        if message is not None:
            sent = self.conn.send_update(message, iteration, epoch)
            if self.job.momentum_masking:
                self.net.mask_momentum(self._scratch)  # the scratch holds the message decoded
            if recording:  # now: pacing and progress syncs below may decode peers' messages into the scratch
                with self.net.device.scope():  # a count over a GPU array runs on that GPU
                    encoded = encoded_count(message, self._scratch, bool(self.handler.last_was_dense))
        self.minibatches += 1
        if self.job.staleness_window:
            with Timer(stats, WORKER_PEERS):
                self._rejoining(lambda: self.conn.pace(self._on_peer, self.job.staleness_window))
        interval = self.job.progress_interval_s
        if interval > 0 and time.monotonic() - self._loss_reported >= interval:
            # a report without "partition" counts nothing: it only carries the loss to the progress line
            report = self._progress_report()
            self._rejoining(lambda: self.conn.sync(self._on_peer, report, epoch))
        if not recording:
            return self._pause()
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
        reset_peak_rss()
        job = self.job
        self.stats = SparkTrainingStats() if job.collect_stats else None
        if self.stats is not None and self._init_event is not None:
            self.stats.add(self.init_key, self._init_event)
            self._init_event = None
        lock: _SlotLock | None = None
        try:
            if job.workers_per_node > 0 and not job.barrier:
                lock = _SlotLock(job.job_id, job.workers_per_node, job.transport.sync_timeout_ms / 1000)
            with Timer(self.stats, WORKER_STORE):
                # on local disk, read again every epoch
                elements = PartitionStore(units, job.kind, encrypt=job.encrypt_store)
            with elements:
                begin = max(first_epoch, self.joined_epoch) if job.barrier else first_epoch
                for epoch in range(begin, first_epoch + epochs):
                    self.net.epoch_count = epoch
                    trained = self.minibatches
                    self._train_epoch(elements, epoch, partition)
                    with Timer(self.stats, WORKER_SYNC):
                        stop = self._end_of_epoch(epoch, partition, self.minibatches - trained)
                    self.net.epoch_count = epoch + 1
                    if stop:
                        break
        finally:
            if lock is not None:
                lock.release()
        self.tasks += 1
        state: np.ndarray | None = to_host(self.net.updater_state())
        if job.final_state_report and state is not None and state.size:
            # the transport moves it faster than Spark's task results: a model's state can be hundreds of MB
            self.conn.send_updater_state(state, int(self.net.iteration_count), final=True)
            state = None
        c = self.conn.counters
        counters = {
            "update_bytes_sent": c.update_bytes,
            "update_frames_sent": c.update_frames,  # own updates and (MESH) those relayed to children
            "bytes_sent": c.bytes_sent,
            "bytes_received": c.bytes_received,
            "messages_sent": c.messages_sent,
            "messages_received": c.messages_received,
            "frames_rejected": c.frames_rejected,
            "children_dropped": c.peers_dropped,  # MESH: children this worker's relay dropped
            "rejoins": self.rejoins,
            "paced_waits": c.paced_waits,
            "paced_wait_ms": c.paced_wait_ms,
        }
        if self.stats is not None:
            self.stats.add(WORKER_TOTAL, event(start, threads=get_num_threads(), peak_rss_mib=peak_rss_mib()))
        return WorkerResult(
            self.worker_id,
            self.tasks,
            self.last_score,
            state,
            self._threshold_state(),
            self.minibatches,
            counters,
            self.stats,
        )

    def _train_epoch(self, elements: PartitionStore, epoch: int, partition: int) -> None:
        """One epoch over the partition's elements, in a new seeded order: share every minibatch's update."""
        order = np.random.default_rng([self.job.shuffle_seed, epoch, partition]).permutation(len(elements))
        self._train_minibatches((elements[i] for i in order), self._share_minibatch)

    def _share_minibatch(self, ds: Any) -> None:
        for batch in self.net._training_batches([ds]):  # truncated BPTT: one step a segment
            self.step(batch)

    def _train_minibatches(self, units: Iterable[Any], train: Callable[[Any], None]) -> None:
        """Load, re-batch and train ``units`` one minibatch at a time with ``train(minibatch)``."""
        job = self.job
        batches = worker_batches(units, job.kind, job.loader, job.batch_size, job.prefetch)
        while True:
            t = now_ms()
            ds = next(batches, None)
            if ds is None:
                break
            if self.stats is not None:
                self.stats.add(WORKER_GET_DATA, event(t))
            train(ds)

    def _threshold_state(self) -> ThresholdAlgorithm | None:
        """The threshold algorithm's state this worker reports (the driver reduces them)."""
        return self.handler.threshold_algorithm.clone()

    def _end_of_epoch(self, epoch: int, partition: int, minibatches: int) -> bool:
        """Report the epoch's training to the controller: EPOCH_END and its decision in a barrier job
        (True: stop), else SYNC (the job boundary is the epoch boundary). At an epoch end the job's
        ``epoch_state`` names, partition 0's worker adds its threshold state to the report and sends its
        updater state once the barrier let it go: the transfer, as large as the parameters or twice, then
        overlaps the next epoch's training instead of holding every worker at the barrier. So does the
        periodic report for late or restarted workers in a barrier job (none after the fit's last epoch);
        without a barrier it precedes the SYNC, which the next epoch's tasks join after."""
        fresh = partition == 0 and self._epoch_state_due(epoch)
        state = None
        if fresh:
            state = np.array(to_host(self.net.updater_state()), copy=True)  # the epoch end's, kept
        elif not self.job.barrier:
            self._report_updater_state(partition)
        report: dict[str, Any] = {"partition": partition, "minibatches": minibatches}
        if self.job.progress_interval_s > 0:
            report.update(self._progress_report())
        threshold = self._threshold_state()
        if fresh and threshold is not None:
            report["threshold_state"] = threshold.to_finite_dict()
        stop = False
        if self.job.barrier:
            stop = bool(self._rejoining(lambda: self.conn.end_epoch(epoch, self._on_peer, report)))
        else:
            self._rejoining(lambda: self.conn.sync(self._on_peer, report, epoch))
        if state is not None and state.size:
            self.conn.send_updater_state(state, int(self.net.iteration_count))
            self._state_reported = time.monotonic()
        elif self.job.barrier and not fresh and not stop:
            self._report_updater_state(partition)  # no training since the epoch end: the same state
        return stop

    def _epoch_state_due(self, epoch: int) -> bool:
        """Whether the end of ``epoch`` is one the job's ``epoch_state`` asks partition 0 to report."""
        every = self.job.epoch_state
        return every > 0 and (
            (epoch + 1 - self.job.snapshot.epoch) % every == 0 or epoch + 1 >= self.job.fit_end
        )

    def _report_updater_state(self, partition: int) -> None:
        """The first partition's worker sends its updater state to the controller at an epoch end once
        ``updater_state_interval_ms`` has passed since its last report (or since it started): what a late
        or restarted worker starts from, at most that interval plus one epoch old. Not at the first epoch
        end: the report of a large model's state costs seconds (136 MB of Adam state at 17M parameters,
        authenticated, sent and checked), which a fit shorter than the interval need not pay."""
        interval_s = self.job.transport.updater_state_interval_ms / 1000
        if partition != 0 or time.monotonic() - self._state_reported < interval_s:
            return
        state = to_host(self.net.updater_state())
        if state.size:
            self.conn.send_updater_state(state, int(self.net.iteration_count))
        self._state_reported = time.monotonic()

    def close(self) -> None:
        self.conn.close()


class AveragingWorker(SharedWorker):
    """ParameterAveragingTrainingMaster's worker when all rounds of a fit run in one barrier job.

    Each epoch splits the partition into the job's rounds with the seed the job-per-round fit uses
    (:func:`~sparkgrad.spark.partitioning.split_assignment`); the worker trains each round's minibatches
    locally and then joins the round's average over the transport (:meth:`WorkerConnection.average`:
    its trained parameters, and updater state with ``save_updater``, or nothing when the round gave it no
    data), continuing from the mean at the round's iteration; frozen parameters never change, so they are
    neither sent nor averaged. Every worker joins every round, so partitions of
    unequal size never leave one waiting.
    """

    init_key = AVERAGING_WORKER_INIT

    def _connection_options(self) -> dict[str, Any]:
        # averaging takes no UPDATE: the worker refuses every one (no threshold to bound)
        return {
            "average_values": self.job.averaging.trained.size + self._state_size(),  # type: ignore[union-attr]
            "threshold_reference": None,
        }

    def _state_size(self) -> int:
        """Updater-state values in an AVERAGE vector (0 unless the fit averages a nonempty state)."""
        state = self.job.snapshot.updater_state
        return state.size if self.job.averaging.save_updater and state is not None else 0  # type: ignore[union-attr]

    def _init_training(self) -> None:
        self.rounds = 0

    def _set_params(self, params: np.ndarray) -> None:
        self.net.set_params(params)

    def _threshold_state(self) -> None:
        return None

    def _epoch_state_due(self, epoch: int) -> bool:
        """Whether the end of ``epoch`` is one the job's ``epoch_state`` asks partition 0 to report."""
        every = self.job.epoch_state
        return every > 0 and (
            (epoch + 1 - self.job.snapshot.epoch) % every == 0 or epoch + 1 >= self.job.fit_end
        )

    def _report_updater_state(self, partition: int) -> None:
        """Nothing: the controller holds the averaged updater state already."""

    def _train_epoch(self, elements: PartitionStore, epoch: int, partition: int) -> None:
        plan: AveragingRounds = self.job.averaging  # type: ignore[assignment]
        assignment = split_assignment(
            partition, plan.split_seeds[epoch], plan.rounds_per_epoch, len(elements)
        )
        for round_index in range(plan.rounds_per_epoch):
            trained = self.minibatches
            chosen = np.flatnonzero(assignment == round_index)
            try:
                self._train_minibatches((elements[i] for i in chosen), self._fit_minibatch)
            except TrainingError as exc:
                # named as the per-round jobs name it: the driver quotes this line to the user
                raise TrainingError(f"worker {partition} ({process_tag()}): {exc}") from exc
            self._average(epoch, round_index, partition, self.minibatches - trained)

    def _fit_minibatch(self, ds: Any) -> None:
        with Timer(self.stats, AVERAGING_WORKER_FIT, examples=ds.num_examples()):
            self.last_score = fit_minibatch(self.net, ds, self.job.averaging.hooks)  # type: ignore[union-attr]
        self.minibatches += 1

    def _average(self, epoch: int, round_index: int, partition: int, minibatches: int) -> None:
        """Join the round's average and continue from the mean, at the round's iteration."""
        values = None
        trained: TrainedRanges = self.job.averaging.trained  # type: ignore[union-attr]
        if minibatches:
            values = trained.gather(to_host(self.net.params()))
            if self._state_size():
                values = np.concatenate([values, to_host(self.net.updater_state())])
        report: dict[str, object] = {
            "partition": partition,
            "minibatches": minibatches,
            "score": self.last_score if minibatches else None,
        }
        with Timer(self.stats, AVERAGING_WORKER_AVERAGE):
            body, mean = self.conn.average(epoch, round_index, report, values)
        size = trained.size
        if mean is not None:
            self.net.set_params(trained.put_back(mean[:size], self.net.params()))
            if self._state_size():
                self.net.set_updater_state(mean[size:])
        initial = self.job.snapshot.updater_state
        if not self.job.averaging.save_updater and initial is not None and initial.size:  # type: ignore[union-attr]
            self.net.set_updater_state(initial)  # DL4J: every round starts from the fit's updater state
        self.net.iteration_count = int(body["iteration"])  # type: ignore[call-overload]
        self.rounds += 1


_WORKERS: dict[int, SharedWorker] = {}


def _worker_for(job: SharedJob) -> SharedWorker:
    """This process's worker for ``job``; workers of finished jobs are closed first."""
    worker = _WORKERS.get(job.job_id)
    if worker is None:
        for old in list(_WORKERS):
            _WORKERS.pop(old).close()
        kind = SharedWorker if job.averaging is None else AveragingWorker
        worker = kind(job, resolve_worker_device(job.worker_device))
        _WORKERS[job.job_id] = worker
    return worker


@atexit.register
def _close_workers() -> None:
    for job_id in list(_WORKERS):
        _WORKERS.pop(job_id).close()


def shared_partition(job_bc: Any, first_epoch: int, epochs: int) -> Any:
    def run(units: Iterable[Any]) -> Iterator[dict[int, WorkerResult]]:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise TrainingError("shared_partition: must run inside a Spark task (TaskContext.get() is None)")
        job: SharedJob = job_bc.value
        if job.barrier and job.workers_per_node > 0:
            check_barrier_placement(job.workers_per_node)
        with task_threads(job.task_threads):
            worker = _worker_for(job)
            try:
                result = worker.run_task(units, context.partitionId(), first_epoch, epochs)
            except BaseException:
                # its replica may be out of step: a retried task starts a fresh worker that pulls parameters
                _WORKERS.pop(job.job_id, None)
                worker.close()
                raise
        if result.minibatches:
            yield {result.worker_id: result}

    return run


def check_barrier_placement(workers_per_node: int) -> None:
    """In a barrier task: fail unless Spark placed at most ``workers_per_node`` of the job's tasks on this
    task's host.

    The driver sizes a barrier job to at most ``workers_per_node`` tasks per executor host, but Spark
    places them (data locality, executors with unequal task slots); the check runs before the task joins
    the controller.

    Raises:
        TrainingError: more tasks on this host, naming the host and the remedies.
    """
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    infos = context.getTaskInfos()  # ordered by partition, "host:port" of each task's executor
    hosts = [info.address.rsplit(":", 1)[0] for info in infos]
    here = hosts[context.partitionId()]
    placed = hosts.count(here)
    if placed > workers_per_node:
        raise TrainingError(
            f"workers_per_node={workers_per_node}: Spark placed {placed} of this barrier job's {len(hosts)} "
            f"tasks on host {here}; give every executor host the same task slots (spark.locality.wait=0 "
            "keeps data locality from stacking tasks), raise workers_per_node, or use -1 (a worker per "
            "task slot)"
        )


def reference_threshold(algorithm: ThresholdAlgorithm) -> float:
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


__all__ = [
    "AveragingRounds",
    "AveragingWorker",
    "SharedJob",
    "SharedWorker",
    "WorkerResult",
    "check_barrier_placement",
    "encoded_count",
    "reference_threshold",
    "shared_partition",
]
