"""PLAIN-topology gradient sharing over ZeroMQ (pyzmq).

The controller (a thread on the Spark driver) owns one ROUTER socket. Workers connect with a DEALER
socket, say HELLO and receive the current parameters; every UPDATE they send is applied to the
controller's authoritative parameter copy and relayed to every other registered worker. A SYNC
request is answered after everything the worker sent before it has been applied (ZeroMQ keeps
per-connection order), which is how a task makes sure its updates reached the controller before it
returns. Every socket has LINGER 0 and every wait is bounded, so no failure mode hangs.

Every frame is authenticated with the fit's secret (see :mod:`sparkgrad.transport.frame`). The
controller treats every received byte as hostile: a frame that fails authentication, names another
job, replays a sequence number, is malformed or carries an implausible update is dropped and counted
(``TrafficCounters.frames_rejected``, by reason in ``rejected_reasons``); its log lines are rate
limited. Unauthenticated frames never get a reply. Only an error of the controller's own (for example
of the decode function) stops its thread; it then tells its workers with an authenticated ERROR and
:meth:`Controller.check` / :attr:`Controller.error` report it to the driver.

Bounded resources: ``MAXMSGSIZE`` on every socket (the largest frame the peer may legitimately send,
derived from the parameter count) and bounded high-water marks.

Slow-peer policy: the controller never blocks on one worker. When a frame for a worker cannot be
queued (its high-water mark is reached because it does not read), the controller drops that worker:
no more relays go to it and its later UPDATE, SYNC and PARAMS_REQUEST frames are not applied but
answered with an ERROR carrying ``"rejoin": true`` (retried until it can be queued). The worker
(:class:`WorkerConnection`) raises :class:`RejoinRequired`; its owner must HELLO again and replace its
parameters with the controller's current ones (``SharedWorker`` does), so a dropped worker never
diverges silently: whatever it applied while dropped is overwritten, its own updates sent while dropped
are lost like skipped steps.

Update sanity: an UPDATE whose threshold (word 2 of every :mod:`sparkgrad.compress` message, sparse and
bitmap alike) is not finite, not positive, or larger than ``THRESHOLD_GROWTH_LIMIT`` times the larger of
the job's reference threshold and the sender's last accepted threshold is rejected, counted and never
applied; the worker gets an ERROR (its fit fails with the reason). The adaptive threshold algorithms
grow a worker's threshold by at most ``1 / decay_rate <= 2`` between two messages it sends, so a
correct worker never reaches the bound.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from sparkgrad._config import Config, check_int
from sparkgrad.errors import CorruptDataError, TransportError
from sparkgrad.transport.frame import (
    CONTROL_PAYLOAD_LIMIT,
    CONTROLLER_ID,
    HEADER_SIZE,
    Flag,
    FrameKey,
    FrameRejected,
    Header,
    MessageType,
    decode_frame,
    encode_frame,
    json_payload,
    max_update_bytes,
    params_payload,
    parse_json_payload,
    relayed_frame,
    update_payload,
)

log = logging.getLogger(__name__)

THRESHOLD_GROWTH_LIMIT = 16.0
_SEQUENCE_LIMIT = 2**32


@dataclass
class ZmqTransportConfiguration(Config):
    """Timeouts and buffer limits of the ZeroMQ transport.

    Args:
        connect_timeout_ms: how long a worker waits for the controller's answer to HELLO.
        sync_timeout_ms: how long a worker waits for the controller to acknowledge its updates (and
            at most blocks on a send the controller does not take).
        poll_interval_ms: the controller's poll period (bounds how fast it notices a stop request).
        high_water_mark: ZeroMQ send/receive queue limit in messages per peer (>= 1). A worker whose
            queue fills up is dropped by the controller and must re-join (see the module docstring);
            memory per peer is bounded by this many frames of the job's largest frame.
        epoch_timeout_ms: how long a worker waits at an epoch boundary for the other workers and the
            driver's epoch callback.
        updater_state_interval_ms: how often (at most) a worker reports its updater state to the
            controller at an epoch end, for late or restarted workers to start from.
    """

    connect_timeout_ms: int = 15000
    sync_timeout_ms: int = 120000
    poll_interval_ms: int = 50
    high_water_mark: int = 1000
    epoch_timeout_ms: int = 600000
    updater_state_interval_ms: int = 60000

    def __post_init__(self) -> None:
        check_int("connect_timeout_ms", self.connect_timeout_ms, minimum=1)
        check_int("sync_timeout_ms", self.sync_timeout_ms, minimum=1)
        check_int("poll_interval_ms", self.poll_interval_ms, minimum=1)
        check_int("high_water_mark", self.high_water_mark, minimum=1)
        check_int("epoch_timeout_ms", self.epoch_timeout_ms, minimum=1)
        check_int("updater_state_interval_ms", self.updater_state_interval_ms, minimum=0)


def _socket(ctx: zmq.Context, kind: int, config: ZmqTransportConfiguration, max_frame: int) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, config.high_water_mark)
    sock.setsockopt(zmq.RCVHWM, config.high_water_mark)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame)  # a peer sending more is disconnected, nothing buffered
    return sock


def endpoint(host: str, port: int) -> str:
    """The ZeroMQ TCP endpoint of a host and port."""
    return f"tcp://{host}:{port}"


def _float_flag(array: np.ndarray) -> Flag:
    return Flag.FLOAT64 if array.dtype == np.float64 else Flag.NONE


@dataclass
class TrafficCounters:
    """Bytes and frames through one endpoint."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    update_bytes: int = 0  # UPDATE frames only: sent by a worker, relayed by the controller
    frames_rejected: int = 0  # received frames dropped by a check (authentication, size, sanity, ...)
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    peers_dropped: int = 0  # controller: workers dropped because their queue was full

    def reject(self, reason: str) -> None:
        """Count one rejected frame."""
        self.frames_rejected += 1
        self.rejected_reasons[reason] = self.rejected_reasons.get(reason, 0) + 1


class RateLimitedLog:
    """Warnings at most ``burst`` at once and ``per_second`` a second on average; counts the rest.

    Args:
        logger: where the lines go.
        what: prefix of every line.
        burst: lines allowed in a burst.
        per_second: sustained lines per second.
        clock: monotonic clock in seconds.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        burst: int = 5,
        per_second: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._what = logger, what
        self._burst, self._rate, self._clock = float(burst), per_second, clock
        self._tokens, self._last = float(burst), clock()
        self.suppressed = 0

    def warning(self, text: str) -> None:
        """Log ``text`` if the budget allows, else count it as suppressed."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1:
            self.suppressed += 1
            return
        self._tokens -= 1
        self.flush()
        self._log.warning("%s: %s", self._what, text)

    def flush(self) -> None:
        """Log how many lines were suppressed since the last line (if any)."""
        if self.suppressed:
            self._log.warning("%s: %d similar messages suppressed", self._what, self.suppressed)
            self.suppressed = 0


class RejoinRequired(TransportError):
    """The controller dropped this worker (it fell behind): HELLO again and take its parameters."""


class _Replay:
    """Per-sender strictly increasing sequence numbers."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}

    def check(self, header: Header, peer: str) -> None:
        """Raise FrameRejected("replay") unless the sequence number is new for its sender."""
        last = self._last.get(header.sender, -1)
        if header.sequence <= last:
            raise FrameRejected(
                "replay", f"frame from {peer}: sequence {header.sequence} replayed (last was {last})"
            )

    def commit(self, header: Header) -> None:
        """Record an accepted frame's sequence number."""
        self._last[header.sender] = header.sequence


def _count(value: object) -> bool:
    """A JSON value that is a non-negative int (bools are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Controller:
    """The driver-side relay that keeps the authoritative parameters.

    Args:
        params: initial parameter vector (copied).
        job_id: the fit's 64-bit job id; frames of other jobs are dropped.
        secret: the fit's secret (at least 32 bytes) that authenticates every frame.
        host: address to bind.
        port: TCP port to bind.
        config: transport timeouts and limits.
        decode: ``decode(message, target)`` accumulating a message into ``target`` (defaults to
            :func:`sparkgrad.compress.decode`); ValueError/TypeError mean a malformed message, any other
            error stops the controller.
        iteration: starting iteration counter.
        epoch: starting epoch counter.
        threshold_reference: the threshold workers start from (the job's threshold algorithm); bounds
            the accepted thresholds (module docstring).
        updater_state: the updater state of the fit's start (copied; None or empty when the updater has
            none). Workers report theirs (UPDATER_STATE); the latest report is what a joining worker
            receives with the parameters.
    """

    def __init__(
        self,
        params: np.ndarray,
        job_id: int,
        secret: bytes,
        host: str,
        port: int,
        config: ZmqTransportConfiguration | None = None,
        decode: Callable[[np.ndarray, np.ndarray], None] | None = None,
        iteration: int = 0,
        epoch: int = 0,
        *,
        threshold_reference: float,
        updater_state: np.ndarray | None = None,
    ) -> None:
        if decode is None:
            from sparkgrad.compress import decode as decode
        if not (isinstance(threshold_reference, (int, float)) and 0 < threshold_reference < math.inf):
            raise ValueError(f"threshold_reference: must be a finite number > 0, got {threshold_reference!r}")
        self._key = FrameKey(secret)
        self._params = np.array(params, copy=True)
        self._updater_state = None if updater_state is None else np.array(updater_state, copy=True)
        self.updater_state_reports = 0
        # minibatches reported per (partition, epoch): a second report is a re-run Spark task
        self._trained: dict[tuple[int, int], int] = {}
        self.retrained_minibatches = 0
        self.updates_by_worker: dict[int, int] = {}
        self._scratch = np.zeros_like(self._params)
        self._decode = decode
        self._config = config or ZmqTransportConfiguration()
        self._update_limit = max_update_bytes(self._params.size)
        self._threshold_reference = float(threshold_reference)
        self._last_threshold: dict[int, float] = {}
        self.job_id = job_id
        self.host, self.port = host, port
        self.iteration, self.epoch = iteration, epoch
        self.counters = TrafficCounters()
        self.updates_applied = 0
        self.workers_seen: set[int] = set()
        self._peers: dict[int, bytes] = {}
        self._rejoin_pending: dict[int, bytes] = {}
        self._replay = _Replay()
        self._log = RateLimitedLog(log, "sparkgrad controller")
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        # epoch barrier: EPOCH_END reports per epoch, the driver's decisions, epochs every worker finished
        self._expected_workers = 0
        self._epoch_reports: dict[int, dict[int, bytes]] = {}
        self._epoch_decisions: dict[int, bool] = {}
        self._finished_epochs: queue.Queue[int] = queue.Queue()
        self._releases: queue.Queue[tuple[int, bool]] = queue.Queue()
        self._ctx = zmq.Context()
        # the driver wakes the controller thread through an inproc pair (sockets stay single-threaded)
        wake = f"inproc://sparkgrad-controller-wake-{job_id:x}-{id(self):x}"
        self._wake_in = self._ctx.socket(zmq.PAIR)
        self._wake_in.bind(wake)
        self._wake_out = self._ctx.socket(zmq.PAIR)
        self._wake_out.connect(wake)
        self._wake_lock = threading.Lock()
        state_bytes = 0 if self._updater_state is None else self._updater_state.nbytes
        max_frame = HEADER_SIZE + max(self._update_limit, CONTROL_PAYLOAD_LIMIT, state_bytes)
        self._sock = _socket(self._ctx, zmq.ROUTER, self._config, max_frame)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self._sock.bind(endpoint(host, port))
        except zmq.ZMQError as exc:
            self._sock.close()
            self._wake_in.close()
            self._wake_out.close()
            self._ctx.term()
            raise TransportError(
                f"controller cannot listen on {endpoint(host, port)}: {exc} "
                "(is the port in use, or the address not one of this machine's? set VoidConfiguration."
                "unicast_port / controller_address)"
            ) from exc
        self._thread = threading.Thread(
            target=self._run, name=f"sparkgrad-controller-{job_id:x}", daemon=True
        )
        self._thread.start()

    # -- public ---------------------------------------------------------------------------------
    def params(self) -> np.ndarray:
        """A copy of the current authoritative parameters."""
        with self._lock:
            return self._params.copy()

    def updater_state(self) -> np.ndarray | None:
        """A copy of the latest updater state a worker reported (the fit's start state before any)."""
        with self._lock:
            return None if self._updater_state is None else self._updater_state.copy()

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the controller thread (None while it runs or after a clean stop)."""
        return self._error

    def expect_workers(self, count: int) -> None:
        """Run an epoch barrier over ``count`` workers: an epoch is finished once that many reported it."""
        self._expected_workers = check_int("count", count, minimum=1)

    def next_finished_epoch(self, timeout_s: float) -> int | None:
        """The next epoch every expected worker has finished, or None after ``timeout_s`` seconds.

        Its workers wait until :meth:`release_epoch` is called for it.
        """
        try:
            return self._finished_epochs.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def release_epoch(self, epoch: int, stop: bool) -> None:
        """Let the workers waiting at the end of ``epoch`` go on (``stop`` False) or finish (True)."""
        self._releases.put((int(epoch), bool(stop)))
        with self._wake_lock:
            self._wake_out.send(b"")

    def check(self) -> None:
        """Raise the error that stopped the controller thread, if any."""
        if self._error is not None:
            raise TransportError(
                f"controller on {endpoint(self.host, self.port)} failed: {self._error}"
            ) from self._error

    def close(self) -> None:
        """Tell registered workers the job is over, stop the thread and close the socket (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._wake_out.close()
        self._ctx.term()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(self._config.poll_interval_ms))
                if self._wake_in in ready:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                    self._apply_releases()
                if self._sock in ready:
                    self._receive_all()
                self._retry_rejoin_notices()
            for identity in list(self._peers.values()):
                self._send(identity, self._control_frame(MessageType.BYE))
        except BaseException as exc:  # surfaced to the driver through error/check()
            log.exception("sparkgrad controller thread failed")
            self._error = exc
            self._notify_failure(exc)
        finally:
            self._log.flush()
            self._sock.close()
            self._wake_in.close()

    def _receive_all(self) -> None:
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            if len(parts) != 2:  # a DEALER always sends one part; anything else is a stranger
                self.counters.messages_received += 1
                self._reject("malformed", f"{len(parts) - 1}-part message from {parts[0].hex()}")
                continue
            self._handle(parts[0], parts[1])

    def _notify_failure(self, exc: BaseException) -> None:
        """Best effort: tell every worker why the controller stopped, so no worker waits for a timeout."""
        text = f"controller failed: {type(exc).__name__}: {exc}"
        for identity in list(self._peers.values()):
            try:
                self._sock.send_multipart(
                    [identity, self._control_frame(MessageType.ERROR, {"error": text})], zmq.NOBLOCK
                )
            except zmq.ZMQError:
                pass

    def _next_seq(self) -> int:
        if self._seq >= _SEQUENCE_LIMIT:
            raise TransportError("controller: sequence numbers exhausted (2**32 frames sent)")
        self._seq += 1
        return self._seq - 1

    def _control_frame(self, kind: MessageType, body: dict | None = None, epoch: int = 0) -> bytearray:
        payload = json_payload(body) if body is not None else b""
        return encode_frame(
            self._key, kind, self.job_id, CONTROLLER_ID, self._next_seq(), payload, epoch=epoch
        )

    def _reject(self, reason: str, text: str) -> None:
        self.counters.reject(reason)
        self._log.warning(f"dropped frame ({reason}): {text}")

    def _send_raw(self, identity: bytes, frame: bytes | bytearray) -> str | None:
        """Queue a frame; None on success, else "full" (the peer does not read) or "gone"."""
        try:
            self._sock.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.Again:
            return "full"
        except zmq.ZMQError:
            return "gone"
        self.counters.bytes_sent += len(frame)
        self.counters.messages_sent += 1
        return None

    def _send(self, identity: bytes, frame: bytes | bytearray) -> bool:
        """Send to a registered worker; a worker that cannot take the frame is dropped (slow-peer policy)."""
        status = self._send_raw(identity, frame)
        if status is None:
            return True
        for sender, ident in list(self._peers.items()):
            if ident == identity:
                self._forget(sender)
                self.counters.peers_dropped += 1
                self._log.warning(f"dropped worker {sender} ({'queue full' if status == 'full' else 'gone'})")
                if status == "full":
                    self._rejoin_pending[sender] = identity
        return False

    def _error_reply(self, identity: bytes, text: str) -> None:
        """ERROR to an authenticated worker (never to an unauthenticated peer)."""
        self._send_raw(identity, self._control_frame(MessageType.ERROR, {"error": text}))

    def _rejoin_notice(self, sender: int, identity: bytes) -> None:
        text = f"worker {sender} is not registered (dropped as a slow peer or reconnected): re-join"
        status = self._send_raw(
            identity, self._control_frame(MessageType.ERROR, {"error": text, "rejoin": True})
        )
        if status == "full":
            self._rejoin_pending[sender] = identity
        else:
            self._rejoin_pending.pop(sender, None)

    def _retry_rejoin_notices(self) -> None:
        for sender, identity in list(self._rejoin_pending.items()):
            self._rejoin_notice(sender, identity)

    def _params_frame(self, current: bool = True) -> bytearray:
        payload = self._params.astype(self._params.dtype.newbyteorder("<"), copy=False) if current else b""
        # not current: nothing applied yet, the worker's own copy of the initial parameters is current
        return encode_frame(
            self._key,
            MessageType.PARAMS,
            self.job_id,
            CONTROLLER_ID,
            self._next_seq(),
            payload,
            iteration=self.iteration,
            epoch=self.epoch,
            flags=_float_flag(self._params),
        )

    def _admit(self, identity: bytes, frame: bytes) -> tuple[Header, memoryview]:
        """Authenticate and check a frame (raises FrameRejected); nothing is parsed before the tag."""
        header, payload = decode_frame(frame, self._key, peer=f"peer {identity.hex()}")
        peer = f"worker {header.sender}"
        if header.job_id != self.job_id:
            raise FrameRejected("wrong_job", f"frame from {peer} is for another job")
        if header.sender == CONTROLLER_ID or header.flags & Flag.RELAYED:
            raise FrameRejected(
                "malformed", f"frame from {peer} claims to be from or relayed by the controller"
            )
        self._replay.check(header, peer)
        return header, payload

    def _handle(self, identity: bytes, frame: bytes) -> None:
        self.counters.bytes_received += len(frame)
        self.counters.messages_received += 1
        try:
            header, payload = self._admit(identity, frame)
        except FrameRejected as exc:  # not authenticated (or a replay): no reply at all
            self._reject(exc.reason, str(exc))
            return
        kind, sender = header.message_type, header.sender
        if kind != MessageType.HELLO and self._peers.get(sender) != identity:
            # not registered (dropped, reconnected, or a copy of a worker's frame from another
            # connection): not applied, and its sequence number stays unused for the real worker
            if kind != MessageType.BYE:
                self._reject("not_joined", f"{kind.name} from worker {sender}, which is not registered")
                self._rejoin_notice(sender, identity)
            return
        self._replay.commit(header)
        if kind == MessageType.HELLO:
            try:
                info = parse_json_payload(payload, peer=f"worker {sender}")
            except FrameRejected as exc:
                self._reject(exc.reason, str(exc))
                self._error_reply(identity, str(exc))
                return
            self._peers[sender] = identity
            self._rejoin_pending.pop(sender, None)
            self.workers_seen.add(sender)
            fresh = info.get("has_initial_params") is True and self.updates_applied == 0
            if self.updater_state_reports and not self._send(identity, self._state_frame()):
                return
            self._send(identity, self._params_frame(current=not fresh))
        elif kind == MessageType.BYE:
            self._forget(sender)
        elif kind == MessageType.UPDATE:
            self._apply_and_relay(identity, header, payload, frame)
        elif kind == MessageType.SYNC:
            if self._count_trained(identity, sender, header.epoch, payload):
                self._send(identity, self._control_frame(MessageType.SYNC_ACK))
        elif kind == MessageType.PARAMS_REQUEST:
            self._send(identity, self._params_frame())
        elif kind == MessageType.EPOCH_END:
            if self._count_trained(identity, sender, header.epoch, payload):
                self._epoch_end(identity, sender, header.epoch)
        elif kind == MessageType.UPDATER_STATE:
            self._store_updater_state(identity, header, payload)
        else:
            self._reject("unexpected", f"unexpected {kind.name} frame from worker {sender}")
            self._error_reply(identity, f"unexpected {kind.name} frame from worker {sender}")

    def _count_trained(self, identity: bytes, sender: int, epoch: int, payload: memoryview) -> bool:
        """Record a worker's {"partition", "minibatches"} report; a malformed one is rejected, counted and
        answered with an ERROR (False)."""
        try:
            report = parse_json_payload(payload, peer=f"worker {sender}")
            partition, minibatches = report.get("partition"), report.get("minibatches", 0)
            if partition is None:
                return True
            if not all(_count(v) for v in (partition, minibatches)):
                raise FrameRejected("malformed", f"worker {sender}: bad training report {report!r}")
        except FrameRejected as exc:
            self._reject(exc.reason, str(exc))
            self._error_reply(identity, str(exc))
            return False
        key = (partition, epoch)
        if key in self._trained:  # this partition's epoch was trained before: a re-run task
            self.retrained_minibatches += minibatches
        self._trained[key] = self._trained.get(key, 0) + minibatches
        return True

    def _state_frame(self) -> bytearray:
        state = self._updater_state
        return encode_frame(
            self._key,
            MessageType.UPDATER_STATE,
            self.job_id,
            CONTROLLER_ID,
            self._next_seq(),
            state.astype(state.dtype.newbyteorder("<"), copy=False),
            iteration=self.iteration,
            epoch=self.epoch,
            flags=_float_flag(state),
        )

    def _store_updater_state(self, identity: bytes, header: Header, payload: memoryview) -> None:
        current = self._updater_state
        if (
            current is None
            or header.payload_length != current.nbytes
            or (bool(header.flags & Flag.FLOAT64) != (current.dtype == np.float64))
        ):
            expected = "none" if current is None else f"{current.size} {current.dtype} values"
            text = f"updater state from worker {header.sender} does not fit this job (expected {expected})"
            self._reject("malformed", text)
            self._error_reply(identity, text)
            return
        with self._lock:
            current[:] = params_payload(header, payload)
        self.updater_state_reports += 1

    def _forget(self, sender: int) -> None:
        """A worker left or was dropped: no more relays to it, and its pending epoch reports no longer
        count (a Spark retry's new workers report those epochs again)."""
        del self._peers[sender]
        for reports in self._epoch_reports.values():
            reports.pop(sender, None)

    def _epoch_end(self, identity: bytes, sender: int, epoch: int) -> None:
        """A worker finished ``epoch`` (everything it sent before is applied: ZeroMQ keeps order)."""
        if epoch in self._epoch_decisions:  # a late or re-joined worker: the decision stands
            self._send(identity, self._go_frame(epoch, self._epoch_decisions[epoch]))
            return
        reports = self._epoch_reports.setdefault(epoch, {})
        reports[sender] = identity
        if len(reports) == self._expected_workers:
            self._finished_epochs.put(epoch)

    def _go_frame(self, epoch: int, stop: bool) -> bytearray:
        return self._control_frame(MessageType.EPOCH_GO, {"stop": stop}, epoch=epoch)

    def _apply_releases(self) -> None:
        while True:
            try:
                epoch, stop = self._releases.get_nowait()
            except queue.Empty:
                return
            self._epoch_decisions[epoch] = stop
            self.epoch = max(self.epoch, epoch + 1)
            for identity in self._epoch_reports.pop(epoch, {}).values():
                self._send(identity, self._go_frame(epoch, stop))

    def _check_threshold(self, sender: int, message: np.ndarray) -> float:
        """The message's threshold if it is sane (module docstring), else FrameRejected("threshold")."""
        threshold = float(message[2:3].view("<f4")[0])
        bound = THRESHOLD_GROWTH_LIMIT * max(self._threshold_reference, self._last_threshold.get(sender, 0.0))
        if not (math.isfinite(threshold) and 0 < threshold <= bound):
            raise FrameRejected(
                "threshold",
                f"update from worker {sender} has threshold {threshold!r}: must be finite, > 0 and "
                f"<= {bound:.6g} "
                f"({THRESHOLD_GROWTH_LIMIT:g} x the larger of the job's reference threshold and the "
                "worker's last accepted one)",
            )
        return threshold

    def _apply_and_relay(self, identity: bytes, header: Header, payload: memoryview, frame: bytes) -> None:
        sender = header.sender
        try:
            if header.payload_length > self._update_limit or header.payload_length < 16:
                raise FrameRejected(
                    "malformed",
                    f"update from worker {sender}: {header.payload_length} bytes, expected 16 to "
                    f"{self._update_limit} for {self._params.size} parameters",
                )
            message = update_payload(payload)
            threshold = self._check_threshold(sender, message)
            with self._lock:
                self._scratch.fill(0)
                try:
                    self._decode(message, self._scratch)
                except (ValueError, TypeError) as exc:
                    raise FrameRejected(
                        "bad_update", f"malformed update from worker {sender}: {exc}"
                    ) from None
                self._params -= self._scratch
                self.updates_by_worker[sender] = self.updates_by_worker.get(sender, 0) + 1
                self.iteration = max(self.iteration, header.iteration)
                self.epoch = max(self.epoch, header.epoch)
                self.updates_applied += 1
        except FrameRejected as exc:  # authenticated sender: it is told why (its fit fails)
            self._reject(exc.reason, str(exc))
            self._error_reply(identity, str(exc))
            return
        self._last_threshold[sender] = threshold
        relayed = relayed_frame(self._key, frame)
        for other, ident in list(self._peers.items()):
            if other != sender and self._send(ident, relayed):
                self.counters.update_bytes += len(relayed)


class WorkerConnection:
    """A worker's DEALER connection to the controller.

    Args:
        host: controller address.
        port: controller port.
        job_id: the fit's job id.
        worker_id: this worker's nonzero 32-bit id.
        secret: the fit's secret (at least 32 bytes).
        num_params: length of the parameter vector (bounds the frames it accepts).
        config: transport timeouts and limits.
        updater_state_bytes: size of the job's updater state (bounds the UPDATER_STATE frame it accepts).
    """

    def __init__(
        self,
        host: str,
        port: int,
        job_id: int,
        worker_id: int,
        secret: bytes,
        num_params: int,
        config: ZmqTransportConfiguration | None = None,
        updater_state_bytes: int = 0,
    ) -> None:
        if not 0 < worker_id < 2**32:
            raise ValueError(f"worker_id must be in [1, 2**32), got {worker_id}")
        self._num_params = check_int("num_params", num_params, minimum=1)
        self._key = FrameKey(secret)
        self._config = config or ZmqTransportConfiguration()
        self.endpoint = endpoint(host, port)
        self.job_id, self.worker_id = job_id, worker_id
        self.counters = TrafficCounters()
        self._last_rejection = ""
        self._replay = _Replay()
        self._seq = 0
        self._ctx = zmq.Context()
        max_frame = HEADER_SIZE + max(
            8 * num_params, max_update_bytes(num_params), CONTROL_PAYLOAD_LIMIT, updater_state_bytes
        )
        self._sock = _socket(self._ctx, zmq.DEALER, self._config, max_frame)
        self._sock.setsockopt(zmq.SNDTIMEO, self._config.sync_timeout_ms)
        self._sock.connect(self.endpoint)
        self._closed = False

    def _send(self, kind: MessageType, payload: bytes | memoryview = b"", **kw: object) -> int:
        if self._seq >= _SEQUENCE_LIMIT:
            raise TransportError(f"worker {self.worker_id}: sequence numbers exhausted (2**32 frames sent)")
        frame = encode_frame(self._key, kind, self.job_id, self.worker_id, self._seq, payload, **kw)  # type: ignore[arg-type]
        self._seq += 1
        try:
            self._sock.send(frame)
        except zmq.ZMQError as exc:
            raise TransportError(
                f"worker {self.worker_id}: cannot send to controller {self.endpoint} within "
                f"{self._config.sync_timeout_ms} ms: {exc}"
            ) from exc
        self.counters.bytes_sent += len(frame)
        self.counters.messages_sent += 1
        return len(frame)

    def _admit(self, frame: bytes) -> tuple[Header, memoryview]:
        peer = f"controller {self.endpoint}"
        header, payload = decode_frame(frame, self._key, peer=peer)
        if header.job_id != self.job_id:
            raise FrameRejected("wrong_job", f"frame from {peer} is for another job")
        self._replay.check(header, peer)
        self._replay.commit(header)
        return header, payload

    def _receive(self, timeout_ms: int) -> tuple[Header, memoryview] | None:
        """The next authentic frame within ``timeout_ms`` (None on timeout); others are counted, dropped."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(left, zmq.POLLIN):
                return None
            frame = self._sock.recv(copy=True)
            self.counters.bytes_received += len(frame)
            self.counters.messages_received += 1
            try:
                header, payload = self._admit(frame)
            except FrameRejected as exc:
                self.counters.reject(exc.reason)
                self._last_rejection = str(exc)
                continue
            if header.message_type == MessageType.ERROR:
                try:
                    body = parse_json_payload(payload)
                except FrameRejected:
                    body = {}
                text = str(body.get("error", "unknown error"))
                if body.get("rejoin") is True:
                    raise RejoinRequired(
                        f"controller {self.endpoint} dropped worker {self.worker_id}: {text}"
                    )
                raise TransportError(f"controller {self.endpoint} rejected worker {self.worker_id}: {text}")
            return header, payload

    def _wait_for(
        self,
        wanted: tuple[MessageType, ...],
        timeout_ms: int,
        on_update: Callable[[Header, np.ndarray], None] | None,
        what: str,
    ) -> tuple[Header, memoryview]:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            try:
                got = self._receive(left) if left > 0 else None
            except RejoinRequired:
                if MessageType.PARAMS not in wanted:
                    raise
                continue  # answers to frames sent before this HELLO: the PARAMS after them is current
            if got is None:
                rejected = ""
                if self.counters.frames_rejected:
                    rejected = (
                        f"; {self.counters.frames_rejected} frames from it failed the checks, last: "
                        f"{self._last_rejection}"
                    )
                raise TransportError(
                    f"worker {self.worker_id}: no answer to {what} from controller {self.endpoint} within "
                    f"{timeout_ms} ms (is the controller address reachable from this executor?){rejected}"
                )
            header, payload = got
            if header.message_type in wanted:
                return header, payload
            if header.message_type == MessageType.UPDATE and on_update is not None:
                on_update(header, update_payload(payload))

    def hello(self, info: dict[str, object]) -> tuple[np.ndarray | None, int, int]:
        """Join (or re-join) the job; returns (current parameters copy, iteration, epoch) from the controller.

        With ``info["has_initial_params"]`` true the parameters are None while the controller has not
        applied any update yet (the worker's copy of the initial parameters is then current). Updates
        and re-join requests that arrive before the parameters are superseded by them and skipped. The
        latest updater state a worker reported comes first when there is one: :attr:`updater_state`
        (None when the controller has none yet).
        """
        self._send(MessageType.HELLO, json_payload(info))
        self.updater_state: np.ndarray | None = None
        wanted = (MessageType.PARAMS, MessageType.UPDATER_STATE)
        while True:
            header, payload = self._wait_for(wanted, self._config.connect_timeout_ms, None, "HELLO")
            if header.message_type == MessageType.PARAMS:
                break
            self.updater_state = params_payload(header, payload).copy()
        if not header.payload_length:
            return None, header.iteration, header.epoch
        params = params_payload(header, payload)
        if params.size != self._num_params:
            raise CorruptDataError(
                f"controller {self.endpoint} sent {params.size} parameters, expected {self._num_params}"
            )
        return params.copy(), header.iteration, header.epoch

    def send_updater_state(self, state: np.ndarray, iteration: int) -> int:
        """Report this worker's flat updater state (what a joining worker will start from)."""
        state = np.ascontiguousarray(state, dtype=state.dtype.newbyteorder("<"))
        return self._send(
            MessageType.UPDATER_STATE,
            memoryview(state).cast("B"),
            iteration=iteration,
            flags=_float_flag(state),
        )

    def send_update(self, message: np.ndarray, iteration: int, epoch: int) -> int:
        """Send one encoded int32 update; returns the frame size in bytes."""
        message = np.ascontiguousarray(message, dtype="<i4")
        size = self._send(MessageType.UPDATE, memoryview(message), iteration=iteration, epoch=epoch)
        self.counters.update_bytes += size
        return size

    def drain(self, on_update: Callable[[Header, np.ndarray], None]) -> int:
        """Apply every peer update that has already arrived (non-blocking); returns how many.

        Raises :class:`RejoinRequired` when the controller dropped this worker.
        """
        count = 0
        while True:
            got = self._receive(0)
            if got is None:
                return count
            header, payload = got
            if header.message_type == MessageType.UPDATE:
                on_update(header, update_payload(payload))
                count += 1

    def sync(
        self,
        on_update: Callable[[Header, np.ndarray], None],
        report: dict[str, int] | None = None,
        epoch: int = 0,
    ) -> None:
        """Block until the controller has applied everything sent so far, applying arriving updates.

        ``report`` ({"partition", "minibatches"}) tells the controller what this worker trained of
        ``epoch`` since its last report. Raises :class:`RejoinRequired` when the controller dropped this
        worker.
        """
        self._send(MessageType.SYNC, json_payload(report or {}), epoch=epoch)
        self._wait_for((MessageType.SYNC_ACK,), self._config.sync_timeout_ms, on_update, "SYNC")

    def end_epoch(
        self,
        epoch: int,
        on_update: Callable[[Header, np.ndarray], None],
        report: dict[str, int] | None = None,
    ) -> bool:
        """Report ``epoch`` finished and wait for every worker and the driver; True means stop.

        ``report`` is as for :meth:`sync`. Peer updates arriving meanwhile are applied. Raises
        :class:`RejoinRequired` when the controller dropped this worker.
        """
        self._send(MessageType.EPOCH_END, json_payload(report or {}), epoch=epoch)
        while True:
            header, payload = self._wait_for(
                (MessageType.EPOCH_GO,), self._config.epoch_timeout_ms, on_update, f"EPOCH_END {epoch}"
            )
            if header.epoch == epoch:
                try:
                    return parse_json_payload(payload).get("stop") is True
                except FrameRejected as exc:
                    raise TransportError(f"worker {self.worker_id}: bad EPOCH_GO: {exc}") from exc

    def _controller_left(self) -> bool:
        """Whether the controller already said BYE or reported an error (reads what has arrived)."""
        try:
            while (got := self._receive(0)) is not None:
                if got[0].message_type == MessageType.BYE:
                    return True
        except TransportError:
            return True
        return False

    def close(self) -> None:
        """Say BYE unless the controller has left (best effort), close the socket and context (idempotent).

        A BYE after the controller's own would reach the next fit's controller on the same port as a
        frame it cannot authenticate.
        """
        if self._closed:
            return
        self._closed = True
        self._sock.setsockopt(zmq.SNDTIMEO, 0)
        if not self._controller_left():
            try:
                self._send(MessageType.BYE)
            except TransportError:
                pass
        self._sock.close()
        self._ctx.term()


__all__ = [
    "THRESHOLD_GROWTH_LIMIT",
    "Controller",
    "RateLimitedLog",
    "RejoinRequired",
    "TrafficCounters",
    "WorkerConnection",
    "ZmqTransportConfiguration",
    "endpoint",
]
