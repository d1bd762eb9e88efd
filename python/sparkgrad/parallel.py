"""ParallelWrapper: several training workers on one machine, as threads (DL4J ``ParallelWrapper``).

Each worker is a ``network.clone()`` trained by its own thread; the native kernels release the GIL, so
the workers' forward and backward passes run concurrently. Workers run on the wrapped network's device,
or one per entry of ``devices`` (``["cuda:0", "cuda:1"]``: one worker per GPU; CPU and GPU workers may
be mixed): each replica keeps its parameters, updates and residual on its device, and only messages and
parameters cross between devices. The workers (with their residuals and
threshold state) live as long as the wrapper: every ``fit`` starts them from the wrapped network's
parameters, updater state and counters, so fitting epoch by epoch keeps the residuals, as one fit of
several epochs does. Minibatches are dealt round-robin (minibatch
``k`` goes to worker ``k % workers``) through a bounded queue per worker that the calling thread fills
``prefetch_buffer`` deep. Two ways of combining the workers:

- ``"shared_gradients"`` (default): the in-process form of :class:`~sparkgrad.spark.SharedTrainingMaster`'s
  worker loop. A worker applies the messages its peers sent since its last step, computes its update,
  applies it to itself (``own_update="full"``, the default; ``"encoded"`` applies only what its message
  carries, as DL4J does), adds it to its own :class:`~sparkgrad.compress.handler.EncodingHandler` residual and
  encodes it (on its device: a GPU worker copies only the finished message to the host), then applies
  the decoded message to the wrapped network (the controller's role: the authoritative copy) and queues
  the message for every peer. Every replica thus applies every message exactly once, and its own
  update in full. At each epoch end the replicas take the wrapped network's parameters, each keeping
  its own unsent residual applied; at the end of ``fit`` the wrapped network gets the workers' mean
  updater state, as in SharedTrainingMaster.
- ``"averaging"``: every ``averaging_frequency`` minibatches per worker (a round of ``workers *
  averaging_frequency`` minibatches, and at the end of every epoch) the parameters, and with
  ``average_updaters`` the updater states, of the workers that trained in that round are averaged (in
  worker order, so the result does not depend on thread timing) into the wrapped network and copied
  back to every worker.

The wrapped network may be anything exposing the flat-buffer API: ``params``, ``set_params``,
``compute_update``, ``apply_update``, ``updater_state``, ``set_updater_state``, ``clone``,
``iteration_count`` and ``epoch_count`` (MultiLayerNetwork, ComputationGraph), plus ``device`` and ``to``
when ``devices`` is given. The CPU workers share the caller's ``get_num_threads()`` threads equally, after
one core for each GPU worker (which launches its kernels from its own thread); at least 1 each. Its
listeners' ``on_epoch_end`` runs on the calling thread after every epoch; ``iteration_done`` is not
called, since the iterations of several workers interleave.
"""

from __future__ import annotations

import enum
import queue
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkgrad._config import check_int, coerce_enum
from sparkgrad._native import _core
from sparkgrad.compress.codec import FLAG_SPARSE
from sparkgrad.compress.handler import EncodingHandler
from sparkgrad.compress.packing import pack_message
from sparkgrad.compress.sharing import (
    DEFAULT_OWN_UPDATE,
    DEFAULT_UPDATE_COMBINATION,
    apply_message,
    check_own_update,
    default_threshold_algorithm,
    share_update,
    take_params,
    update_scale,
)
from sparkgrad.compress.thresholds import NoOpResidualPostProcessor, ResidualPostProcessor, ThresholdAlgorithm
from sparkgrad.device import CPU, Device, resolve_device

_FLAT_API = (
    "params",
    "set_params",
    "compute_update",
    "apply_update",
    "updater_state",
    "set_updater_state",
    "clone",
    "iteration_count",
    "epoch_count",
)
_POLL_S = 0.05  # how often blocked threads look at the failure flag (nothing ever waits forever)
_SYNC = object()  # queue marker: end of an averaging round
_END = object()  # queue marker: end of the epoch


# str + Enum, not StrEnum: StrEnum would change what str() and format() of a member print
class TrainingMode(str, enum.Enum):  # noqa: UP042
    """How the workers of a :class:`ParallelWrapper` combine their training."""

    SHARED_GRADIENTS = "shared_gradients"
    AVERAGING = "averaging"


class _Failure:
    """The first exception raised by any thread of a fit; setting it stops every other thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def set(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        self.event.set()


class _Worker:
    """One thread's replica: the cloned network, its inbox of peer messages and its encoding state."""

    def __init__(
        self, index: int, net: Any, handler: EncodingHandler | None, prefetch: int, params: np.ndarray
    ) -> None:
        self.index = index
        self.net = net
        self.handler = handler
        self.batches: queue.Queue = queue.Queue(maxsize=prefetch)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        # decoded messages, on the replica's device
        self.scratch = _zeros(_device(net), params) if handler is not None else None
        self.round_batches = 0
        self.last_score = float("nan")


class ParallelWrapper:
    """Train one network with several worker threads on this machine.

    Args:
        network: an initialised network exposing the flat-buffer API (module docstring); it is trained
            in place, on its own device.
        workers: number of worker threads (>= 1); default ``len(devices)``, or 2 without ``devices``.
        prefetch_buffer: minibatches queued ahead per worker (>= 1).
        averaging_frequency: ``"averaging"`` mode: minibatches each worker trains between averagings
            (>= 1); unused by ``"shared_gradients"``.
        training_mode: ``"shared_gradients"`` or ``"averaging"`` (a :class:`TrainingMode` or its value).
        average_updaters: ``"averaging"`` mode: average the updater states too (DL4J's default).
        threshold_algorithm: ``"shared_gradients"`` mode: default
            :func:`~sparkgrad.compress.sharing.default_threshold_algorithm` (SharedTrainingMaster's
            default); each worker encodes with its own clone.
        residual_post_processor: ``"shared_gradients"`` mode: default ``NoOpResidualPostProcessor()``.
        update_combination: ``"shared_gradients"`` mode: how the workers' updates combine, as
            SharedTrainingMaster's: ``"auto"`` (default: ``"sum"`` when the network's ``updaters`` are
            all of the Adam family or RmsProp, else ``"sqrt"``), ``"sqrt"`` (each update divided by
            ``sqrt(workers)``), ``"mean"`` or ``"sum"`` (DL4J's); see
            :data:`~sparkgrad.compress.sharing.UPDATE_COMBINATIONS`.
        momentum_masking: ``"shared_gradients"`` mode: as SharedTrainingMaster's, zero a worker's Nesterov
            velocity where its message sent the parameter (Deep Gradient Compression's momentum factor
            masking; default False, DL4J's behaviour).
        own_update: ``"shared_gradients"`` mode: as SharedTrainingMaster's, what a worker applies to its
            own replica of its own update: ``"full"`` (default: all of it, at once) or ``"encoded"``
            (DL4J's: what its message carries); see :data:`~sparkgrad.compress.sharing.OWN_UPDATES`.
        devices: one device per worker (``"cpu"``, ``"cuda:N"`` or a :class:`~sparkgrad.device.Device`;
            a device may repeat); default: every worker on the wrapped network's device. For one worker
            per GPU: ``[f"cuda:{gpu.index}" for gpu in sparkgrad.cuda.devices()]``.

    Raises:
        TypeError: ``network`` lacks part of the flat-buffer API.
        ValueError: an argument out of range, naming it (``devices[i]`` for a malformed device).
        RuntimeError: a GPU in ``devices`` cannot be used (no CUDA build, no CuPy, no such GPU).
    """

    def __init__(
        self,
        network: Any,
        workers: int | None = None,
        prefetch_buffer: int = 2,
        averaging_frequency: int = 1,
        training_mode: TrainingMode | str = TrainingMode.SHARED_GRADIENTS,
        average_updaters: bool = True,
        threshold_algorithm: ThresholdAlgorithm | None = None,
        residual_post_processor: ResidualPostProcessor | None = None,
        devices: Sequence[Any] | None = None,
        update_combination: str = DEFAULT_UPDATE_COMBINATION,
        momentum_masking: bool = False,
        own_update: str = DEFAULT_OWN_UPDATE,
    ) -> None:
        required = _FLAT_API + (("device", "to") if devices is not None else ())
        missing = [name for name in required if not hasattr(network, name)]
        if missing:
            raise TypeError(
                f"network: {type(network).__name__} lacks the flat-buffer API ({', '.join(missing)})"
            )
        self.network = network
        self.devices = _resolve_devices(devices)
        if workers is None:
            workers = len(self.devices) if self.devices is not None else 2
        self.workers = check_int("workers", workers, minimum=1)
        if self.devices is not None and self.workers != len(self.devices):
            raise ValueError(
                f"workers: {self.workers} workers for {len(self.devices)} devices; give one device per "
                "worker (or leave workers out)"
            )
        self.prefetch_buffer = check_int("prefetch_buffer", prefetch_buffer, minimum=1)
        self.averaging_frequency = check_int("averaging_frequency", averaging_frequency, minimum=1)
        self.training_mode = coerce_enum(TrainingMode, training_mode, "training_mode")
        if not isinstance(average_updaters, bool):
            raise ValueError(f"average_updaters: expected a bool, got {average_updaters!r}")
        self.average_updaters = average_updaters
        if threshold_algorithm is not None and not isinstance(threshold_algorithm, ThresholdAlgorithm):
            raise ValueError(
                f"threshold_algorithm: expected a ThresholdAlgorithm, got {threshold_algorithm!r}"
            )
        if residual_post_processor is not None and not isinstance(
            residual_post_processor, ResidualPostProcessor
        ):
            raise ValueError(
                f"residual_post_processor: expected a ResidualPostProcessor, got {residual_post_processor!r}"
            )
        self.update_scale = update_scale(update_combination, self.workers, getattr(network, "updaters", ()))
        self.update_combination = update_combination
        if not isinstance(momentum_masking, bool):
            raise ValueError(f"momentum_masking: expected a bool, got {momentum_masking!r}")
        self.momentum_masking = momentum_masking
        self.own_update = check_own_update(own_update)
        self.threshold_algorithm = threshold_algorithm or default_threshold_algorithm()
        self.residual_post_processor = residual_post_processor or NoOpResidualPostProcessor()
        self.last_score: float | None = None
        self.bytes_sent = 0  # shared_gradients: wire bytes of the messages the workers sent, over every fit
        self._workers: list[_Worker] = []
        self._master_scratch: Any = None  # shared_gradients: messages decoded for the wrapped network
        self._master_lock = threading.Lock()

    # -- training -----------------------------------------------------------------------------
    def fit(self, data: Any, epochs: int = 1) -> ParallelWrapper:
        """Train the wrapped network for ``epochs`` passes over ``data`` with the worker threads.

        Args:
            data: a DataSet (one minibatch per epoch) or a re-iterable collection of DataSets, as
                ``MultiLayerNetwork.fit`` accepts.
            epochs: number of passes; the wrapped network's ``epoch_count`` grows by one per pass.

        Returns:
            self

        Raises:
            ValueError: bad ``epochs`` or a one-shot iterator with several epochs.
            Exception: the first exception any worker thread (or ``data``) raised, as raised; every
                worker thread has stopped by then.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs: expected a positive integer, got {epochs!r}")
        single = hasattr(data, "features")
        if not single and epochs > 1 and iter(data) is data:
            raise ValueError("data: a one-shot iterator cannot be trained for several epochs; pass a list")
        master = self.network
        shared = self.training_mode is TrainingMode.SHARED_GRADIENTS
        params, state = master.params(), master.updater_state()
        if not self._workers:
            self._workers = [self._new_worker(i, shared, params) for i in range(self.workers)]
            if shared:
                self._master_scratch = _zeros(_device(master), params)
        for w in self._workers:  # the wrapped network may have changed since the last fit
            self._take_params(w, params)
            w.net.set_updater_state(state)
            w.net.iteration_count, w.net.epoch_count = int(master.iteration_count), int(master.epoch_count)
        # OpenMP thread counts are per thread (a new thread starts from the default): each worker gets its
        # share of the caller's; the OpenBLAS count is process-wide, restored afterwards.
        threads = _core.max_threads()
        try:
            for _ in range(epochs):
                self._epoch([data] if single else data, self._threads_per_worker(threads))
                for listener in getattr(master, "listeners", []):
                    listener.on_epoch_end(master)
        finally:
            _core.set_num_threads(threads)
        if shared:
            self._finish_shared()
        return self

    def _new_worker(self, index: int, shared: bool, params: np.ndarray) -> _Worker:
        """Worker ``index``: a clone of the wrapped network (whose parameters are ``params``) on its
        device, with its own encoder."""
        net = self.network.clone()
        if self.devices is not None:
            net.to(self.devices[index])
        handler = (
            EncodingHandler(
                params.size,
                self.threshold_algorithm,
                self.residual_post_processor,
                params.dtype,
                self.update_scale,
            )
            if shared
            else None
        )
        return _Worker(index, net, handler, self.prefetch_buffer, params)

    def _threads_per_worker(self, threads: int) -> int:
        """The OpenMP/OpenBLAS threads of each worker thread: the CPU workers share ``threads`` after one
        core per GPU worker (its kernel launches); every worker thread sets the same count, since the
        OpenBLAS one is process-wide."""
        devices = self.devices or [_device(self.network)] * self.workers
        on_cpu = sum(1 for d in devices if d is CPU)
        if on_cpu == 0:
            return 1
        return max(1, (threads - (self.workers - on_cpu)) // on_cpu)

    def _epoch(self, batches: Any, threads: int) -> None:
        """One pass: the calling thread deals the minibatches, one thread per worker trains them."""
        failure = _Failure()

        def average() -> None:
            try:
                self._average()
            except BaseException as exc:  # recorded before the barrier breaks for the waiting peers
                failure.set(exc)
                raise

        barrier = threading.Barrier(self.workers, action=average)
        runners = [
            threading.Thread(
                target=self._run_worker,
                args=(w, failure, barrier, threads),
                name=f"sparkgrad-parallel-{w.index}",
                daemon=True,
            )
            for w in self._workers
        ]
        for t in runners:
            t.start()
        try:
            self._deal(batches, failure)
        except BaseException as exc:  # the data iterator failed (or the caller interrupted): stop all
            failure.set(exc)
        finally:
            if failure.event.is_set():
                barrier.abort()
            for t in runners:
                t.join()
        if failure.error is not None:
            for w in self._workers:  # nothing of the failed pass may leak into the next fit
                _drain(w.batches)
                _drain(w.inbox)  # already applied to the wrapped network, whose parameters come next
                w.round_batches = 0
            raise failure.error
        self._end_epoch()

    def _deal(self, batches: Any, failure: _Failure) -> None:
        n = self.workers
        round_size = n * self.averaging_frequency
        averaging = self.training_mode is TrainingMode.AVERAGING
        count = 0
        for batch in batches:
            if not self._put(self._workers[count % n], batch, failure):
                return
            count += 1
            if averaging and count % round_size == 0:
                self._put_all(_SYNC, failure)
        if averaging and count % round_size:
            self._put_all(_SYNC, failure)
        self._put_all(_END, failure)

    def _put_all(self, item: object, failure: _Failure) -> None:
        for w in self._workers:
            self._put(w, item, failure)

    @staticmethod
    def _put(worker: _Worker, item: object, failure: _Failure) -> bool:
        """Queue ``item`` for ``worker`` unless the fit failed meanwhile; whether it was queued."""
        while not failure.event.is_set():
            try:
                worker.batches.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run_worker(
        self, worker: _Worker, failure: _Failure, barrier: threading.Barrier, threads: int
    ) -> None:
        try:
            _core.set_num_threads(threads)
            while not failure.event.is_set():
                try:
                    item = worker.batches.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if item is _END:
                    return
                if item is _SYNC:
                    barrier.wait()
                elif worker.handler is not None:
                    self._shared_step(worker, worker.handler, item)
                else:
                    update, worker.last_score = worker.net.compute_update(item)
                    worker.net.apply_update(update)
                    worker.round_batches += 1
        except threading.BrokenBarrierError:
            return  # whoever broke the barrier recorded the failure first
        except BaseException as exc:
            failure.set(exc)
            barrier.abort()  # peers waiting for this worker at the barrier stop too

    def _shared_step(self, worker: _Worker, handler: EncodingHandler, batch: Any) -> None:
        """SharedTrainingMaster's worker step with in-process delivery (spark/shared_worker.py
        SharedWorker.step)."""
        net = worker.net
        while True:  # the peers' messages first, each exactly once
            try:
                message = worker.inbox.get_nowait()
            except queue.Empty:
                break
            self._apply_message(worker, message)
        update, worker.last_score = net.compute_update(batch, copy=False)
        iteration, epoch = int(net.iteration_count), int(net.epoch_count)
        message = share_update(
            handler,
            net,
            update,
            iteration,
            epoch,
            self.own_update,
            worker.scratch,
            decode_sparse=self.momentum_masking,  # a bitmap is decoded anyway, for the master below
        )
        if message is None:
            return
        for peer in self._workers:
            if peer is not worker:
                peer.inbox.put(message)
        if self.momentum_masking:
            net.mask_momentum(worker.scratch)  # the scratch holds the message decoded
        master = self.network
        with self._master_lock:
            packed = pack_message(message)  # what the message would take in an UPDATE frame
            self.bytes_sent += message.nbytes if packed is None else len(packed)
            if _device(master) is _device(net) and message[3] != FLAG_SPARSE:
                master.apply_update(worker.scratch)  # the worker's decoded bitmap serves as it is
            else:
                apply_message(message, master, self._master_scratch)

    @staticmethod
    def _apply_message(worker: _Worker, message: np.ndarray) -> None:
        apply_message(message, worker.net, worker.scratch)

    def _take_params(self, worker: _Worker, params: np.ndarray) -> None:
        if worker.handler is None:
            worker.net.set_params(params)
        else:
            take_params(worker.net, params, worker.handler, self.own_update)

    def _average(self) -> None:
        """Barrier action (one thread, the others waiting): average the workers that trained this round."""
        trained = [w for w in self._workers if w.round_batches > 0]
        if not trained:
            return
        master = self.network
        params = _mean([w.net.params() for w in trained])
        master.set_params(params)
        state = master.updater_state()
        if self.average_updaters and state.size:
            state = _mean([w.net.updater_state() for w in trained])
            master.set_updater_state(state)
        master.iteration_count = max(int(w.net.iteration_count) for w in self._workers)
        for w in self._workers:
            w.net.set_params(params)
            if self.average_updaters:
                w.net.set_updater_state(state)
            w.round_batches = 0

    def _end_epoch(self) -> None:
        master = self.network
        params = master.params() if self.training_mode is TrainingMode.SHARED_GRADIENTS else None
        for w in self._workers:
            if w.handler is not None:  # every message is in the master: drop the queued copies
                _drain(w.inbox)
                take_params(w.net, params, w.handler, self.own_update)
            w.net.epoch_count = int(w.net.epoch_count) + 1
        master.epoch_count = int(master.epoch_count) + 1
        master.iteration_count = max(int(w.net.iteration_count) for w in self._workers)
        scores = [w.last_score for w in self._workers if not np.isnan(w.last_score)]
        self.last_score = float(np.mean(scores)) if scores else self.last_score

    def _finish_shared(self) -> None:
        """As SharedTrainingMaster: the wrapped network takes the workers' mean updater state."""
        master = self.network
        if master.updater_state().size:
            master.set_updater_state(_mean([w.net.updater_state() for w in self._workers]))


def _resolve_devices(devices: Any) -> list[Device] | None:
    """``devices`` as a list of Devices (None stays None), each entry checked and named on error."""
    if devices is None:
        return None
    if isinstance(devices, (str, Device)) or not isinstance(devices, Sequence) or not devices:
        raise ValueError(
            "devices: expected a non-empty list of devices ('cpu', 'cuda:N'), one per worker, got "
            f"{devices!r}"
        )
    resolved = []
    for i, spec in enumerate(devices):
        try:
            resolved.append(resolve_device(spec))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"devices[{i}]: {exc}") from exc
        except RuntimeError as exc:
            raise RuntimeError(f"devices[{i}]: {exc}") from exc
    return resolved


def _device(net: Any) -> Device:
    """The device of a network (a network without one is on the CPU)."""
    return getattr(net, "device", CPU)


def _zeros(device: Device, like: np.ndarray) -> Any:
    """A zero vector of ``like``'s length and dtype on ``device``."""
    with device.scope():
        return device.xp.zeros(like.size, like.dtype)


def _drain(q: queue.Queue | queue.SimpleQueue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _mean(vectors: list[np.ndarray]) -> np.ndarray:
    """Element-wise mean, summed in list order (independent of thread timing)."""
    total = vectors[0].copy()
    for v in vectors[1:]:
        total += v
    if len(vectors) > 1:
        total /= len(vectors)
    return total


__all__ = ["ParallelWrapper", "TrainingMode"]
