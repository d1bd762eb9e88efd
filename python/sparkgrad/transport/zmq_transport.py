"""PLAIN- and MESH-topology gradient sharing over ZeroMQ (pyzmq).

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

MESH (``Controller(mesh=True)``, workers with a ``relay_host``): updates go down a relay tree instead of
from the controller to every worker; the tree, the relay rules and the failure policy are described in
:mod:`sparkgrad.transport.mesh`. Everything upward is as in PLAIN.

Link rules (wire version 3, issue 21). Every frame names its one recipient (:mod:`.frame`), so a frame
captured on one link is ``misdirected`` on any other. On top of the tag, job, recipient and replay
checks, a receiver takes from each link only what that link may carry, else drops it and counts it
(reasons in brackets):

- the controller: frames sent to it (recipient 0) by a registered worker, never relayed, never with
  sender 0; at most one worker id per connection (``identity_in_use``);
- a worker, on its controller connection: control frames (PARAMS, UPDATER_STATE, SYNC_ACK, BYE, ERROR,
  EPOCH_GO, MESH_PARENT, MESH_CHILDREN) only from sender 0, and UPDATEs only relayed by the controller
  (``link``), never its own in PLAIN (``own_update``); PLAIN: each frame must carry the next link
  number (``stale``; a ``gap`` makes it re-join, see :mod:`.frame`);
- a worker, on its MESH parent's connection: only UPDATEs relayed by that parent and the parent's own
  re-join ERROR (``link``): an EPOCH_GO or PARAMS from a parent is refused;
- a MESH relay, on its relay socket: MESH_JOIN and BYE addressed to it, and it registers only the
  children the controller assigned it in its latest MESH_CHILDREN (a MESH_JOIN from another id is
  held, at most ``mesh_fan_out`` of them, the oldest dropped as ``unassigned``);
- every received UPDATE, relayed or not, must pass the threshold bound of the fit's reference
  (``threshold``) where the worker knows it (``threshold_reference``).

Before the tag, each receiver checks the header's size, magic, version, type and the payload length
against the largest payload it takes of that type (``oversized``): a malformed or oversized frame costs
no HMAC.

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
bitmap alike) is not finite, not positive, or larger than the smaller of ```THRESHOLD_GROWTH_LIMIT``
times the job's reference threshold (the threshold the fit starts from) and ``MAX_SCALE`` (1e6, the
largest threshold any encoder writes) is rejected (reason ``threshold``), counted and never applied; the
worker gets an ERROR (its fit fails with the reason). The bound is fixed for the fit, so no series of
accepted updates raises it (it used to be 16x the sender's last accepted threshold, which 36 updates
each 15x the last drove to infinity). An adaptive algorithm would have to double its threshold twenty
times over the fit's start to reach it. An update that would leave any parameter non-finite (float overflow of
finite values) is rejected too (reason ``non_finite``), naming its sender; the parameters stay as they
were.
"""

from __future__ import annotations

import logging
import math
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from sparkgrad._config import MAX_SCALE, Config, check_int
from sparkgrad.errors import CorruptDataError, TransportError
from sparkgrad.transport.frame import (
    CONTROL_PAYLOAD_LIMIT,
    CONTROLLER_ID,
    HEADER_SIZE,
    NO_RELAY,
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
from sparkgrad.transport.mesh import ROOT, MeshOrganizer

log = logging.getLogger(__name__)

THRESHOLD_GROWTH_LIMIT = float(2**20)  # x the fit's reference threshold (module docstring)
_SEQUENCE_LIMIT = 2**32
# a MESH relay socket in HELLO: host name, IPv4 or bracketed IPv6, and a port
_RELAY_ADDRESS = re.compile(r"(?:[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?:[1-9][0-9]{0,4})")


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
        mesh_fan_out: MESH: the most children a node of the relay tree has (the controller included),
            so the controller sends each update at most this many times (>= 1).
        mesh_catchup_ms: MESH: how long a worker waits for its parent to deliver the updates a SYNC or
            epoch acknowledgement covers before it takes the controller's parameters instead.
        max_queued_bytes: the most bytes of received frames ZeroMQ queues per connection (>= 1): the
            receive high-water mark is this over the socket's largest frame (at least 1 frame), so a
            peer cannot make a receiver buffer high_water_mark x the largest frame (about 40 GB at
            10M parameters); a full queue makes ZeroMQ stop reading that connection.
    """

    connect_timeout_ms: int = 15000
    sync_timeout_ms: int = 120000
    poll_interval_ms: int = 50
    high_water_mark: int = 1000
    epoch_timeout_ms: int = 600000
    updater_state_interval_ms: int = 60000
    mesh_fan_out: int = 8
    mesh_catchup_ms: int = 5000
    max_queued_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        check_int("connect_timeout_ms", self.connect_timeout_ms, minimum=1)
        check_int("sync_timeout_ms", self.sync_timeout_ms, minimum=1)
        check_int("poll_interval_ms", self.poll_interval_ms, minimum=1)
        check_int("high_water_mark", self.high_water_mark, minimum=1)
        check_int("epoch_timeout_ms", self.epoch_timeout_ms, minimum=1)
        check_int("updater_state_interval_ms", self.updater_state_interval_ms, minimum=0)
        check_int("mesh_fan_out", self.mesh_fan_out, minimum=1)
        check_int("mesh_catchup_ms", self.mesh_catchup_ms, minimum=1)
        check_int("max_queued_bytes", self.max_queued_bytes, minimum=1)


def _socket(ctx: zmq.Context, kind: int, config: ZmqTransportConfiguration, max_frame: int) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, config.high_water_mark)
    # bytes, not frames: what one connection may queue here (ZeroMQ counts whole messages)
    sock.setsockopt(zmq.RCVHWM, max(1, min(config.high_water_mark, config.max_queued_bytes // max_frame)))
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
    update_frames: int = 0  # UPDATE frames sent: own updates (worker) or relays (controller, MESH node)
    duplicates: int = 0  # MESH: relayed updates received again after a re-parenting (dropped)
    frames_rejected: int = 0  # received frames dropped by a check (authentication, size, sanity, ...)
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    peers_dropped: int = 0  # controller: workers dropped because their queue was full
    paced_waits: int = 0  # worker: minibatches held back by the staleness bound
    paced_wait_ms: float = 0.0  # worker: time spent held back by the staleness bound

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


def _relay_address_ok(value: object) -> bool:
    """A MESH relay socket address from HELLO: "host:port" with a port in [1, 65535]."""
    return (
        isinstance(value, str)
        and bool(_RELAY_ADDRESS.fullmatch(value))
        and int(value.rsplit(":", 1)[1]) < 65536
    )


def check_update_threshold(message: np.ndarray, reference: float, sender: str) -> float:
    """The threshold of an update message if it is sane (module docstring), else
    FrameRejected("threshold"). ``message`` holds at least the 4 header words."""
    threshold = float(message[2:3].view("<f4")[0])
    bound = min(MAX_SCALE, THRESHOLD_GROWTH_LIMIT * reference)
    if not (math.isfinite(threshold) and 0 < threshold <= bound):
        raise FrameRejected(
            "threshold",
            f"update from {sender} has threshold {threshold!r}: must be finite, > 0 and <= {bound:.6g} "
            f"(the smaller of 2**20 x the fit's reference threshold {reference:.6g} and {MAX_SCALE:g})",
        )
    return threshold


def _all_finite(values: np.ndarray) -> bool:
    """Whether every element is finite: min and max propagate nan and show an inf, no temporary array."""
    return bool(values.size == 0 or (math.isfinite(values.min()) and math.isfinite(values.max())))


# what a worker takes from the controller on its controller connection (besides relayed UPDATEs)
_FROM_CONTROLLER = frozenset(
    {
        MessageType.PARAMS,
        MessageType.UPDATER_STATE,
        MessageType.SYNC_ACK,
        MessageType.BYE,
        MessageType.ERROR,
        MessageType.EPOCH_GO,
        MessageType.MESH_PARENT,
        MessageType.MESH_CHILDREN,
    }
)


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
        port: TCP port to bind; 0 binds a free port (then in :attr:`port`).
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
        mesh: relay updates down a MESH tree of ``config.mesh_fan_out`` (:mod:`sparkgrad.transport.mesh`)
            instead of sending each to every worker (PLAIN).
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
        mesh: bool = False,
    ) -> None:
        if decode is None:
            from sparkgrad.compress import decode as decode
        if not (isinstance(threshold_reference, (int, float)) and 0 < threshold_reference < math.inf):
            raise ValueError(f"threshold_reference: must be a finite number > 0, got {threshold_reference!r}")
        self._key = FrameKey(secret)
        self._params = np.array(params, copy=True)
        self._updater_state = None if updater_state is None else np.array(updater_state, copy=True)
        self.updater_state_reports = 0
        self._updater_state_iteration = iteration  # the iteration the stored state belongs to
        # minibatches reported per (partition, epoch): a second report is a re-run Spark task
        self._trained: dict[tuple[int, int], int] = {}
        self.retrained_minibatches = 0
        self.updates_by_worker: dict[int, int] = {}
        self._scratch = np.zeros_like(self._params)
        self._decode = decode
        self._config = config or ZmqTransportConfiguration()
        self._update_limit = max_update_bytes(self._params.size)
        self._threshold_reference = float(threshold_reference)
        self._next_params = np.empty_like(self._params)  # an update is checked here before it is taken
        self.job_id = job_id
        self.host, self.port = host, port
        self.iteration, self.epoch = iteration, epoch
        self.counters = TrafficCounters()
        self.updates_applied = 0
        self.workers_seen: set[int] = set()
        self._peers: dict[int, bytes] = {}
        self._relay_address: dict[int, str] = {}  # MESH: each worker's relay socket, "host:port"
        self._rejoin_pending: dict[int, bytes] = {}
        self._replay = _Replay()
        self._log = RateLimitedLog(log, "sparkgrad controller")
        self._seq = 0
        self._lock = threading.Lock()
        self._mesh = MeshOrganizer(self._config.mesh_fan_out) if mesh else None
        self._broadcast = 0  # MESH: updates relayed down the tree so far (stamped on every frame down)
        # PLAIN: the number of the last frame sent to each worker id (kept when it leaves: a worker that
        # re-joins continues its numbers, so a frame sent before it left can never pass for a new one)
        self._link_numbers: dict[int, int] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        # epoch barrier: EPOCH_END reports per epoch (by the partition they trained, each partition's
        # reporting workers by id), the driver's decisions, epochs every partition finished
        self._expected_workers = 0
        self._epoch_reports: dict[int, dict[tuple[str, int], dict[int, bytes]]] = {}
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
            if port == 0:  # a free port, which the workers learn from the job
                self.port = self._sock.bind_to_random_port(f"tcp://{host}")
            else:
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

    def mesh_tree(self) -> dict[int, int]:
        """MESH: {worker: parent} of the current relay tree (parent 0 is the controller); {} in PLAIN."""
        with self._lock:
            mesh = self._mesh
            return {} if mesh is None else {n: mesh.parent(n) for n in self.workers_seen if n in mesh}

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
            for worker, identity in list(self._peers.items()):
                self._send(identity, self._control_frame(MessageType.BYE, worker))
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
        for worker, identity in list(self._peers.items()):
            try:
                self._sock.send_multipart(
                    [identity, self._control_frame(MessageType.ERROR, worker, {"error": text})], zmq.NOBLOCK
                )
            except zmq.ZMQError:
                pass

    def _next_seq(self) -> int:
        if self._seq >= _SEQUENCE_LIMIT:
            raise TransportError("controller: sequence numbers exhausted (2**32 frames sent)")
        self._seq += 1
        return self._seq - 1

    def _number(self, recipient: int) -> int:
        """The number stamped on the next frame to ``recipient``: MESH, the updates relayed so far (what
        a SYNC_ACK covers); PLAIN, the next number of that worker's link (gaps show lost frames)."""
        if self._mesh is not None:
            return self._broadcast
        number = self._link_numbers.get(recipient, 0) + 1
        if number >= _SEQUENCE_LIMIT:
            raise TransportError(f"controller: link numbers of worker {recipient} exhausted (2**32 frames)")
        self._link_numbers[recipient] = number
        return number

    def _control_frame(
        self, kind: MessageType, recipient: int, body: dict | None = None, epoch: int = 0
    ) -> bytearray:
        """A control frame for ``recipient``, stamped with its number (:meth:`_number`)."""
        payload = json_payload(body) if body is not None else b""
        return encode_frame(
            self._key,
            kind,
            self.job_id,
            CONTROLLER_ID,
            self._next_seq(),
            payload,
            epoch=epoch,
            broadcast=self._number(recipient),
            recipient=recipient,
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
        for sender in list(self._peers):
            # _forget may send (MESH re-parenting) and drop others on the way: only those still here
            if self._peers.get(sender) == identity:
                self._forget(sender)
                self.counters.peers_dropped += 1
                self._log.warning(f"dropped worker {sender} ({'queue full' if status == 'full' else 'gone'})")
                if status == "full":
                    self._rejoin_pending[sender] = identity
        return False

    def _error_reply(self, identity: bytes, worker: int, text: str) -> None:
        """ERROR to an authenticated worker (never to an unauthenticated peer)."""
        self._send_raw(identity, self._control_frame(MessageType.ERROR, worker, {"error": text}))

    def _rejoin_notice(self, sender: int, identity: bytes) -> None:
        text = f"worker {sender} is not registered (dropped as a slow peer or reconnected): re-join"
        status = self._send_raw(
            identity, self._control_frame(MessageType.ERROR, sender, {"error": text, "rejoin": True})
        )
        if status == "full":
            self._rejoin_pending[sender] = identity
        else:
            self._rejoin_pending.pop(sender, None)

    def _retry_rejoin_notices(self) -> None:
        for sender, identity in list(self._rejoin_pending.items()):
            self._rejoin_notice(sender, identity)

    def _params_frame(self, recipient: int, current: bool = True) -> bytearray:
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
            broadcast=self._number(recipient),
            recipient=recipient,
        )

    def _admit(self, identity: bytes, frame: bytes) -> tuple[Header, memoryview]:
        """Authenticate and check a frame (raises FrameRejected); nothing is parsed before the tag."""
        header, payload = decode_frame(
            frame, self._key, peer=f"peer {identity.hex()}", max_payload=self._max_payload
        )
        peer = f"worker {header.sender}"
        if header.job_id != self.job_id:
            raise FrameRejected("wrong_job", f"frame from {peer} is for another job")
        if header.recipient != CONTROLLER_ID:
            raise FrameRejected(
                "misdirected",
                f"frame from {peer} is addressed to worker {header.recipient}, not the controller",
            )
        if header.sender == CONTROLLER_ID or header.flags & Flag.RELAYED:
            raise FrameRejected(
                "malformed", f"frame from {peer} claims to be from or relayed by the controller"
            )
        self._replay.check(header, peer)
        return header, payload

    def _max_payload(self, kind: MessageType) -> int:
        """The largest payload a worker may send of each type (checked before the tag)."""
        if kind == MessageType.UPDATE:
            return self._update_limit
        if kind == MessageType.UPDATER_STATE:  # float64 too: a dtype mismatch is answered with an ERROR
            return 0 if self._updater_state is None else 8 * self._updater_state.size
        return CONTROL_PAYLOAD_LIMIT

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
            info = self._control_body(identity, sender, payload)
            if info is None:
                return
            relay = info.get("relay")
            if self._mesh is not None and not _relay_address_ok(relay):
                text = (
                    f"HELLO from worker {sender}: MESH needs its relay socket as 'host:port', got {relay!r}"
                )
                self._reject("control", text)
                self._error_reply(identity, sender, text)
                return
            owner = next((w for w, ident in self._peers.items() if ident == identity and w != sender), None)
            if owner is not None:  # one worker per connection: its frames and fate are that worker's
                text = f"HELLO from worker {sender} on the connection of worker {owner}"
                self._reject("identity_in_use", text)
                self._error_reply(identity, sender, text)
                return
            self._peers[sender] = identity
            self._rejoin_pending.pop(sender, None)
            self.workers_seen.add(sender)
            if self._mesh is not None and not self._mesh_join(identity, sender, str(relay)):
                return
            fresh = info.get("has_initial_params") is True and self.updates_applied == 0
            if self.updater_state_reports and not self._send(identity, self._state_frame(sender)):
                return
            self._send(identity, self._params_frame(sender, current=not fresh))
        elif kind == MessageType.BYE:
            self._forget(sender)
        elif kind == MessageType.UPDATE:
            self._apply_and_relay(identity, header, payload, frame)
        elif kind == MessageType.SYNC:
            if self._count_trained(identity, sender, header.epoch, payload) is not None:
                self._send(identity, self._control_frame(MessageType.SYNC_ACK, sender))
        elif kind == MessageType.PARAMS_REQUEST:
            self._params_request(identity, sender, payload)
        elif kind == MessageType.EPOCH_END:
            report = self._count_trained(identity, sender, header.epoch, payload)
            if report is not None:
                self._epoch_end(identity, sender, header.epoch, report.get("partition"))
        elif kind == MessageType.UPDATER_STATE:
            self._store_updater_state(identity, header, payload)
        else:
            self._reject("unexpected", f"unexpected {kind.name} frame from worker {sender}")
            self._error_reply(identity, sender, f"unexpected {kind.name} frame from worker {sender}")

    def _control_body(self, identity: bytes, sender: int, payload: memoryview) -> dict | None:
        """A registered worker's JSON control payload; a malformed one is rejected, counted and answered
        with an ERROR (None)."""
        try:
            return parse_json_payload(payload, peer=f"worker {sender}")
        except FrameRejected as exc:
            self._refuse(identity, sender, exc)
            return None

    def _refuse(self, identity: bytes, worker: int, exc: FrameRejected) -> None:
        self._reject(exc.reason, str(exc))
        self._error_reply(identity, worker, str(exc))

    def _count_trained(self, identity: bytes, sender: int, epoch: int, payload: memoryview) -> dict | None:
        """Record a worker's {"partition", "minibatches"} report and return it; a malformed one (or, with
        an epoch barrier, a partition beyond the expected ones) is rejected, counted and answered with an
        ERROR (None)."""
        report = self._control_body(identity, sender, payload)
        if report is None:
            return None
        partition, minibatches = report.get("partition"), report.get("minibatches", 0)
        if partition is None:
            return report
        expected = self._expected_workers
        if not all(_count(v) for v in (partition, minibatches)) or (expected and partition >= expected):
            self._refuse(
                identity,
                sender,
                FrameRejected("malformed", f"worker {sender}: bad training report {report!r}"),
            )
            return None
        key = (partition, epoch)
        if key in self._trained:  # this partition's epoch was trained before: a re-run task
            self.retrained_minibatches += minibatches
        self._trained[key] = self._trained.get(key, 0) + minibatches
        return report

    def _state_frame(self, recipient: int) -> bytearray:
        state = self._updater_state
        return encode_frame(
            self._key,
            MessageType.UPDATER_STATE,
            self.job_id,
            CONTROLLER_ID,
            self._next_seq(),
            state.astype(state.dtype.newbyteorder("<"), copy=False),
            iteration=self._updater_state_iteration,
            epoch=self.epoch,
            flags=_float_flag(state),
            broadcast=self._number(recipient),
            recipient=recipient,
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
            self._error_reply(identity, header.sender, text)
            return
        with self._lock:
            current[:] = params_payload(header, payload)
        self._updater_state_iteration = header.iteration
        self.updater_state_reports += 1

    def _forget(self, sender: int) -> None:
        """A worker left or was dropped: no more relays to it, its pending epoch reports no longer
        count (a Spark retry's new workers report those epochs again) and, in MESH, its children move up."""
        if self._peers.pop(sender, None) is None:
            return
        for reports in self._epoch_reports.values():
            for slot, workers in list(reports.items()):
                workers.pop(sender, None)
                if not workers:
                    del reports[slot]
        if self._mesh is not None and sender in self._mesh:
            self._mesh_leave(sender)

    # -- MESH -----------------------------------------------------------------------------------
    def _parent_frame(self, parent: int, recipient: int) -> bytearray:
        assert self._mesh is not None
        if parent == ROOT:
            return self._control_frame(MessageType.MESH_PARENT, recipient, {"parent": None})
        host, port = self._relay_address[parent].rsplit(":", 1)
        body = {"parent": endpoint(host, int(port)), "id": parent, "version": self._mesh.version}
        return self._control_frame(MessageType.MESH_PARENT, recipient, body)

    def _assign_children(self, parent: int) -> None:
        """Tell a relay the complete list of children it may register (MESH_CHILDREN): it takes a
        MESH_JOIN from no one else, so a captured or forged MESH_JOIN cannot make it relay to a tap."""
        mesh = self._mesh
        assert mesh is not None
        identity = self._peers.get(parent)
        if parent == ROOT or identity is None or parent not in mesh:
            return
        body = {"children": mesh.children(parent), "version": mesh.version}
        self._send(identity, self._control_frame(MessageType.MESH_CHILDREN, parent, body))

    def _mesh_join(self, identity: bytes, sender: int, relay: str) -> bool:
        """Place a (re-)joining worker in the tree, assign it to its parent and tell it its parent;
        False if it was dropped."""
        assert self._mesh is not None
        if sender in self._mesh:  # a re-join: its old place (and children) are given up first
            self._mesh_leave(sender)
        with self._lock:
            parent = self._mesh.add(sender)
        self._relay_address[sender] = relay
        self._assign_children(parent)  # before the child hears of it; a dropped parent moves the child
        if sender not in self._mesh:
            return False
        return self._send(identity, self._parent_frame(self._mesh.parent(sender), sender))

    def _mesh_leave(self, sender: int) -> None:
        """Remove a worker from the tree, give its parent and its children's new parents their new lists
        of children, and tell each child its new parent."""
        assert self._mesh is not None
        old_parent = self._mesh.parent(sender)
        with self._lock:
            moved = self._mesh.remove(sender)
        self._relay_address.pop(sender, None)
        for parent in dict.fromkeys([old_parent, *moved.values()]):
            self._assign_children(parent)
        for child, parent in moved.items():
            identity = self._peers.get(child)
            if identity is not None and child in self._mesh and self._mesh.parent(child) == parent:
                self._send(identity, self._parent_frame(parent, child))

    def _params_request(self, identity: bytes, sender: int, payload: memoryview) -> None:
        """Send the current parameters; a MESH worker may name its parent as silent (it delivered
        nothing within mesh_catchup_ms): that parent is dropped like a slow peer and re-joins."""
        body = self._control_body(identity, sender, payload)
        if body is None:
            return
        silent = body.get("silent_parent")
        mesh = self._mesh
        if (
            mesh is not None
            and _count(silent)
            and sender in mesh
            and silent != ROOT
            and mesh.parent(sender) == silent
            and silent in self._peers
        ):
            self._rejoin_pending[silent] = self._peers[silent]
            self._forget(silent)
            self.counters.peers_dropped += 1
            self._log.warning(f"dropped worker {silent} (its MESH child {sender} got nothing from it)")
        self._send(identity, self._params_frame(sender))

    def _epoch_end(self, identity: bytes, sender: int, epoch: int, partition: int | None) -> None:
        """A worker finished ``epoch`` (everything it sent before is applied: ZeroMQ keeps order) on
        ``partition``. The epoch is finished once every expected partition reported: a re-run task's new
        worker reporting a partition again (its killed predecessor may have reported it and never said
        BYE) counts once, so no epoch ends with a partition untrained. A report without a partition
        counts for its worker."""
        if epoch in self._epoch_decisions:  # a late or re-joined worker: the decision stands
            self._send(identity, self._go_frame(epoch, self._epoch_decisions[epoch], sender))
            return
        reports = self._epoch_reports.setdefault(epoch, {})
        slot = ("partition", partition) if partition is not None else ("worker", sender)
        reports.setdefault(slot, {})[sender] = identity
        if len(reports) == self._expected_workers:
            self._finished_epochs.put(epoch)

    def _go_frame(self, epoch: int, stop: bool, recipient: int) -> bytearray:
        return self._control_frame(MessageType.EPOCH_GO, recipient, {"stop": stop}, epoch=epoch)

    def _apply_releases(self) -> None:
        while True:
            try:
                epoch, stop = self._releases.get_nowait()
            except queue.Empty:
                return
            self._epoch_decisions[epoch] = stop
            self.epoch = max(self.epoch, epoch + 1)
            for workers in self._epoch_reports.pop(epoch, {}).values():
                for worker, identity in workers.items():
                    self._send(identity, self._go_frame(epoch, stop, worker))

    def _check_threshold(self, sender: int, message: np.ndarray) -> float:
        """The message's threshold if it is sane (module docstring), else FrameRejected("threshold")."""
        return check_update_threshold(message, self._threshold_reference, f"worker {sender}")

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
                with np.errstate(over="ignore", invalid="ignore"):  # checked on the next line
                    np.subtract(self._params, self._scratch, out=self._next_params)
                if not _all_finite(self._next_params):
                    raise FrameRejected(
                        "non_finite",
                        f"update from worker {sender} (threshold {threshold:.6g}) would make parameters "
                        "non-finite: not applied",
                    )
                self._params, self._next_params = self._next_params, self._params
                self.updates_by_worker[sender] = self.updates_by_worker.get(sender, 0) + 1
                self.iteration = max(self.iteration, header.iteration)
                self.epoch = max(self.epoch, header.epoch)
                self.updates_applied += 1
        except FrameRejected as exc:  # authenticated sender: it is told why (its fit fails)
            self._refuse(identity, sender, exc)
            return
        if self._mesh is None:
            targets = [other for other in self._peers if other != sender]
        else:  # the root's children only (the sender too: it relays its own update to its subtree)
            if self._broadcast + 1 >= _SEQUENCE_LIMIT:
                raise TransportError("controller: broadcast numbers exhausted (2**32 updates)")
            self._broadcast += 1
            targets = [child for child in self._mesh.children(ROOT) if child in self._peers]
        for target in targets:
            ident = self._peers.get(target)
            if ident is None:  # dropped while relaying to an earlier target
                continue
            # one copy per recipient: it names the recipient and (PLAIN) carries its link number
            relayed = relayed_frame(self._key, frame, recipient=target, broadcast=self._number(target))
            if self._send(ident, relayed):
                self.counters.update_bytes += len(relayed)
                self.counters.update_frames += 1


class WorkerConnection:
    """A worker's DEALER connection to the controller (and, in MESH, its place in the relay tree).

    Args:
        host: controller address.
        port: controller port.
        job_id: the fit's job id.
        worker_id: this worker's nonzero 32-bit id.
        secret: the fit's secret (at least 32 bytes).
        num_params: length of the parameter vector (bounds the frames it accepts).
        config: transport timeouts and limits.
        updater_state_bytes: size of the job's updater state (bounds the UPDATER_STATE frame it accepts).
        relay_host: MESH: the address of this host the other executors reach; the worker binds its relay
            socket there on an ephemeral port. None (PLAIN): every update comes from the controller.
        on_params: MESH (required there): ``on_params(params, iteration, epoch)`` replaces the owner's
            parameters when the worker resynchronises with the controller (:mod:`sparkgrad.transport.mesh`).
        threshold_reference: the fit's reference threshold: a received UPDATE whose threshold the
            controller's bound would refuse is dropped (reason ``threshold``) instead of applied (a MESH
            parent could forge one). None: not checked.
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
        relay_host: str | None = None,
        on_params: Callable[[np.ndarray, int, int], None] | None = None,
        threshold_reference: float | None = None,
    ) -> None:
        if not 0 < worker_id < 2**32:
            raise ValueError(f"worker_id must be in [1, 2**32), got {worker_id}")
        if relay_host is not None and on_params is None:
            raise ValueError("on_params: required with relay_host (MESH replaces the parameters on a resync)")
        self._num_params = check_int("num_params", num_params, minimum=1)
        self._key = FrameKey(secret)
        self._config = config or ZmqTransportConfiguration()
        self.endpoint = endpoint(host, port)
        self.job_id, self.worker_id = job_id, worker_id
        self.counters = TrafficCounters()
        self._last_rejection = ""
        self._threshold_reference = threshold_reference
        self._link_next: int | None = None  # PLAIN: the number the controller's next frame must carry
        self._replay = _Replay()
        self._seq = 0
        self._ctx = zmq.Context()
        self._max_frame = HEADER_SIZE + max(
            8 * num_params, max_update_bytes(num_params), CONTROL_PAYLOAD_LIMIT, updater_state_bytes
        )
        self._sock = _socket(self._ctx, zmq.DEALER, self._config, self._max_frame)
        self._sock.setsockopt(zmq.SNDTIMEO, self._config.sync_timeout_ms)
        self._sock.connect(self.endpoint)
        self._closed = False
        # MESH state (module docstring of sparkgrad.transport.mesh)
        self._on_params = on_params
        self._router: zmq.Socket | None = None
        self._parent: zmq.Socket | None = None
        self.parent_id: int | None = None  # None: the controller (or PLAIN)
        self._parent_replay = _Replay()  # control frames of the parent itself (not relayed updates)
        self._children: dict[int, bytes] = {}
        self._assigned: set[int] = set()  # the children the controller assigned (MESH_CHILDREN)
        self._pending_joins: dict[int, bytes] = {}  # MESH_JOINs of children not (yet) assigned
        self._child_replay = _Replay()
        self._child_rejoin: dict[int, bytes] = {}
        self._joined = False
        self._relayed_upto = 0  # highest broadcast number relayed to the children
        self._applied_upto = 0  # the parameters include every update up to this broadcast number
        # frames read while waiting for PARAMS: (header, payload, frame, from parent, replay-checked)
        self._stash: deque[tuple[Header, memoryview, bytes, bool, bool]] = deque()
        self.resyncs = 0
        # staleness bound (:meth:`pace`): SYNCs sent and acknowledged since the last HELLO, the broadcast
        # number the latest acknowledgement covers, and minibatches since the last paced SYNC
        self._syncs_sent = self._syncs_acked = 0
        self._acked_broadcast = 0
        self._paced_steps = 0
        self.relay_endpoint: str | None = None
        if relay_host is not None:
            self._router = _socket(self._ctx, zmq.ROUTER, self._config, HEADER_SIZE + CONTROL_PAYLOAD_LIMIT)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            try:
                port = self._router.bind_to_random_port(f"tcp://{relay_host}")
            except zmq.ZMQError as exc:
                self._sock.close()
                self._router.close()
                self._ctx.term()
                raise TransportError(
                    f"worker {worker_id}: cannot bind a MESH relay socket on {relay_host}: {exc}"
                ) from exc
            self.relay_endpoint = f"{relay_host}:{port}"

    @property
    def mesh(self) -> bool:
        """Whether this worker is a node of a MESH relay tree."""
        return self._router is not None

    @property
    def children(self) -> list[int]:
        """MESH: the ids of the workers this one relays to."""
        return list(self._children)

    def _send(
        self,
        kind: MessageType,
        payload: bytes | memoryview = b"",
        sock: zmq.Socket | None = None,
        **kw: object,
    ) -> int:
        if self._seq >= _SEQUENCE_LIMIT:
            raise TransportError(f"worker {self.worker_id}: sequence numbers exhausted (2**32 frames sent)")
        frame = encode_frame(self._key, kind, self.job_id, self.worker_id, self._seq, payload, **kw)  # type: ignore[arg-type]
        self._seq += 1
        try:
            (sock or self._sock).send(frame)
        except zmq.ZMQError as exc:
            raise TransportError(
                f"worker {self.worker_id}: cannot send to controller {self.endpoint} within "
                f"{self._config.sync_timeout_ms} ms: {exc}"
            ) from exc
        self.counters.bytes_sent += len(frame)
        self.counters.messages_sent += 1
        return len(frame)

    def _next_frame(
        self, timeout_ms: int, controller_only: bool = False
    ) -> tuple[Header, memoryview, bytes, bool] | None:
        """The next authentic frame of this job from the controller or the MESH parent within
        ``timeout_ms`` (None on timeout): (header, payload, frame, from the parent). Frames of children
        on the relay socket are handled on the way; frames that fail the checks are counted, dropped."""
        deadline = time.monotonic() + timeout_ms / 1000
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        if not controller_only:
            for sock in (self._parent, self._router):
                if sock is not None:
                    poller.register(sock, zmq.POLLIN)
        while True:
            self._retry_child_rejoin_notices()
            left = max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(poller.poll(left))
            if not ready:
                return None
            if self._router is not None and self._router in ready:
                self._receive_children()
            for sock in (self._sock, self._parent):
                if sock is None or sock not in ready:
                    continue
                frame = sock.recv(copy=True)
                self.counters.bytes_received += len(frame)
                self.counters.messages_received += 1
                from_parent = sock is self._parent
                peer = f"MESH parent {self.parent_id}" if from_parent else f"controller {self.endpoint}"
                try:
                    header, payload = decode_frame(frame, self._key, peer=peer, max_payload=self._max_payload)
                    if header.job_id != self.job_id:
                        raise FrameRejected("wrong_job", f"frame from {peer} is for another job")
                    if header.recipient != self.worker_id:
                        raise FrameRejected(
                            "misdirected",
                            f"frame from {peer} is addressed to {header.recipient}, "
                            f"not worker {self.worker_id}",
                        )
                    self._check_link(header, payload, from_parent, peer)
                except FrameRejected as exc:
                    self._rejected(exc)
                    continue
                return header, payload, frame, from_parent

    def _max_payload(self, kind: MessageType) -> int:
        if kind == MessageType.UPDATE:
            return max_update_bytes(self._num_params)
        if kind in (MessageType.PARAMS, MessageType.UPDATER_STATE):
            return self._max_frame - HEADER_SIZE
        return CONTROL_PAYLOAD_LIMIT

    def _check_link(self, header: Header, payload: memoryview, from_parent: bool, peer: str) -> None:
        """The link rules (module docstring): what a frame may be on the link it came in on. Raises
        FrameRejected; a PLAIN gap in the controller's link numbers raises RejoinRequired."""
        kind = header.message_type
        if kind == MessageType.UPDATE:
            if not header.flags & Flag.RELAYED or header.sender == CONTROLLER_ID:
                raise FrameRejected("link", f"UPDATE from {peer} that it did not relay")
            if header.relay != (self.parent_id if from_parent else NO_RELAY):
                raise FrameRejected("link", f"UPDATE relayed by worker {header.relay} on the link of {peer}")
            if not self.mesh and header.sender == self.worker_id:
                raise FrameRejected(
                    "own_update", f"worker {self.worker_id}'s own UPDATE came back from {peer}"
                )
            if header.payload_length < 16:
                raise FrameRejected("malformed", f"UPDATE from {peer}: {header.payload_length} bytes")
            if self._threshold_reference is not None:
                check_update_threshold(
                    update_payload(payload), self._threshold_reference, f"worker {header.sender} via {peer}"
                )
        elif from_parent:
            if kind != MessageType.ERROR or header.sender != self.parent_id:
                raise FrameRejected(
                    "link",
                    f"{kind.name} from worker {header.sender} on the link of {peer}: "
                    "only the controller may send it",
                )
        elif header.sender != CONTROLLER_ID or kind not in _FROM_CONTROLLER:
            raise FrameRejected("link", f"{kind.name} from worker {header.sender} on the link of {peer}")
        if from_parent or self.mesh or self._link_next is None:
            return
        expected, self._link_next = self._link_next, self._link_next + 1
        if header.broadcast < expected:
            self._link_next = expected
            raise FrameRejected("stale", f"frame number {header.broadcast} from {peer}, expected {expected}")
        if header.broadcast > expected:
            self._link_next = None
            self._rejected(
                FrameRejected("gap", f"frames {expected}..{header.broadcast - 1} from {peer} never arrived")
            )
            raise RejoinRequired(
                f"frames {expected}..{header.broadcast - 1} from {peer} never arrived: "
                "re-join for its parameters"
            )

    def _rejected(self, exc: FrameRejected) -> None:
        self.counters.reject(exc.reason)
        self._last_rejection = str(exc)

    def _receive(self, timeout_ms: int) -> tuple[Header, memoryview] | None:
        """The next frame for the caller within ``timeout_ms`` (None on timeout). Rejected frames, MESH
        relaying, duplicates and resynchronisation are handled here; an ERROR raises."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if self._stash:
                result = self._dispatch(*self._stash.popleft())
            else:
                got = self._next_frame(max(0, int((deadline - time.monotonic()) * 1000)))
                if got is None:
                    return None
                result = self._dispatch(*got)
            if result is not None:
                return result

    def _dispatch(
        self, header: Header, payload: memoryview, frame: bytes, from_parent: bool, checked: bool = False
    ) -> tuple[Header, memoryview] | None:
        kind = header.message_type
        if kind == MessageType.UPDATE and self.mesh:
            return self._mesh_update(header, payload, frame)
        # the parent's own control frames have their own sequence check: its relayed updates come later
        replay = self._parent_replay if from_parent else self._replay
        peer = f"MESH parent {self.parent_id}" if from_parent else f"controller {self.endpoint}"
        if not checked:
            try:
                replay.check(header, peer)
            except FrameRejected as exc:
                self._rejected(exc)
                return None
            replay.commit(header)
        if kind == MessageType.ERROR:
            self._raise_error(payload, peer)
        if kind == MessageType.SYNC_ACK and not from_parent and self._syncs_acked < self._syncs_sent:
            # counted here, whoever waits: a paced SYNC's acknowledgement may arrive during any wait
            self._syncs_acked += 1
            self._acked_broadcast = max(self._acked_broadcast, header.broadcast)
        if kind == MessageType.MESH_PARENT and self.mesh and not from_parent:
            if not self._closed:
                self._set_parent(payload, resync=True)
            return None
        if kind == MessageType.MESH_CHILDREN and self.mesh:
            self._set_children(payload)
            return None
        return header, payload

    def _raise_error(self, payload: memoryview, peer: str) -> None:
        try:
            body = parse_json_payload(payload)
        except FrameRejected:
            body = {}
        text = str(body.get("error", "unknown error"))
        if body.get("rejoin") is True:
            raise RejoinRequired(f"{peer} dropped worker {self.worker_id}: {text}")
        raise TransportError(f"{peer} rejected worker {self.worker_id}: {text}")

    def _checked_params(self, header: Header, payload: memoryview) -> np.ndarray:
        params = params_payload(header, payload)
        if params.size != self._num_params:
            raise CorruptDataError(
                f"controller {self.endpoint} sent {params.size} parameters, expected {self._num_params}"
            )
        return params.copy()

    # -- MESH -----------------------------------------------------------------------------------
    def _mesh_update(
        self, header: Header, payload: memoryview, frame: bytes
    ) -> tuple[Header, memoryview] | None:
        """Relay a new update to the children and return it if this worker must apply it."""
        number = header.broadcast
        if not self._joined or self._closed:
            return None  # superseded by the parameters of the HELLO in progress
        if number <= self._relayed_upto:
            self.counters.duplicates += 1
            return None
        try:
            if not number:
                raise FrameRejected(
                    "malformed", f"MESH update from worker {header.sender} has no broadcast number"
                )
            self._replay.check(header, f"MESH parent {self.parent_id}")
        except FrameRejected as exc:
            self._rejected(exc)
            return None
        self._replay.commit(header)
        self._relayed_upto = number
        self._relay(frame)
        if number <= self._applied_upto:
            return None
        if number > self._applied_upto + 1:  # missed updates: take the controller's parameters
            self._resync()
            return None
        self._applied_upto = number
        if header.sender == self.worker_id:
            return None  # applied when it was sent
        return header, payload

    def _relay(self, frame: bytes) -> None:
        if not self._children:
            return
        assert self._router is not None
        for child, identity in list(self._children.items()):
            out = relayed_frame(self._key, frame, recipient=child, relay=self.worker_id)
            try:
                self._router.send_multipart([identity, out], zmq.NOBLOCK)
            except zmq.Again:  # the child does not read: dropped, it must re-join (slow-peer policy)
                del self._children[child]
                self._child_rejoin[child] = identity
                continue
            except zmq.ZMQError:  # gone
                del self._children[child]
                continue
            self.counters.bytes_sent += len(out)
            self.counters.messages_sent += 1
            self.counters.update_bytes += len(out)
            self.counters.update_frames += 1

    def _retry_child_rejoin_notices(self) -> None:
        for child, identity in list(self._child_rejoin.items()):
            text = f"MESH child {child} fell behind its relay {self.worker_id}: re-join"
            frame = encode_frame(
                self._key,
                MessageType.ERROR,
                self.job_id,
                self.worker_id,
                self._seq,
                json_payload({"error": text, "rejoin": True}),
                recipient=child,
            )
            assert self._router is not None
            try:
                self._router.send_multipart([identity, frame], zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                pass
            self._seq += 1
            del self._child_rejoin[child]

    def _receive_children(self) -> None:
        """Register (MESH_JOIN) and forget (BYE) children; anything else from them is rejected."""
        assert self._router is not None
        while True:
            try:
                parts = self._router.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            self.counters.messages_received += 1
            if len(parts) != 2:
                self._rejected(
                    FrameRejected("malformed", f"{len(parts) - 1}-part message on the relay socket")
                )
                continue
            identity, frame = parts
            self.counters.bytes_received += len(frame)
            peer = f"MESH child {identity.hex()}"
            try:
                header, _ = decode_frame(
                    frame, self._key, peer=peer, max_payload=lambda kind: CONTROL_PAYLOAD_LIMIT
                )
                if header.job_id != self.job_id:
                    raise FrameRejected("wrong_job", f"frame from {peer} is for another job")
                if header.message_type not in (MessageType.MESH_JOIN, MessageType.BYE):
                    raise FrameRejected("unexpected", f"{header.message_type.name} frame from {peer}")
                if header.recipient != self.worker_id:  # a MESH_JOIN captured on the way to another relay
                    raise FrameRejected(
                        "misdirected", f"frame from {peer} is addressed to worker {header.recipient}"
                    )
                self._child_replay.check(header, peer)
            except FrameRejected as exc:
                self._rejected(exc)
                continue
            self._child_replay.commit(header)
            if header.message_type == MessageType.BYE:
                self._children.pop(header.sender, None)
                self._pending_joins.pop(header.sender, None)
            elif header.sender in self._assigned:
                self._children[header.sender] = identity
                self._child_rejoin.pop(header.sender, None)
            else:  # not assigned (yet: the assignment may still be on its way from the controller)
                self._pending_joins[header.sender] = identity
                if len(self._pending_joins) > self._config.mesh_fan_out:
                    evicted = next(iter(self._pending_joins))
                    del self._pending_joins[evicted]
                    self._rejected(
                        FrameRejected(
                            "unassigned", f"MESH_JOIN of worker {evicted}, not assigned to this relay"
                        )
                    )

    def _set_children(self, payload: memoryview) -> None:
        """MESH_CHILDREN from the controller: the complete list of children this relay may register."""
        body = parse_json_payload(payload, peer=f"controller {self.endpoint}")
        children = body.get("children")
        if not (
            isinstance(children, list)
            and len(children) <= self._config.mesh_fan_out
            and all(_count(c) and c != CONTROLLER_ID for c in children)
        ):
            raise TransportError(f"worker {self.worker_id}: bad MESH_CHILDREN from the controller: {body!r}")
        self._assigned = set(children)
        for child in list(self._children):
            if child not in self._assigned:
                del self._children[child]
        for child in list(self._pending_joins):
            if child in self._assigned:
                self._children[child] = self._pending_joins.pop(child)

    def _set_parent(self, payload: memoryview, resync: bool) -> None:
        """Connect to the parent the controller named (MESH_PARENT) and register with it."""
        try:
            body = parse_json_payload(payload, peer=f"controller {self.endpoint}")
            target, parent_id = body.get("parent"), body.get("id")
            if target is not None and not (
                isinstance(target, str)
                and target.startswith("tcp://")
                and _relay_address_ok(target[6:])
                and _count(parent_id)
            ):
                raise FrameRejected("control", f"MESH_PARENT names no valid parent: {body!r}")
        except FrameRejected as exc:
            raise TransportError(
                f"worker {self.worker_id}: bad MESH_PARENT from the controller: {exc}"
            ) from exc
        if self._parent is not None:
            self._parent.close()
        self._parent, self.parent_id, self._parent_replay = None, None, _Replay()
        if target is not None:
            self._parent = _socket(self._ctx, zmq.DEALER, self._config, self._max_frame)
            self._parent.setsockopt(zmq.SNDTIMEO, self._config.sync_timeout_ms)
            self._parent.connect(target)
            self.parent_id = int(parent_id)  # type: ignore[arg-type]
            self._send(MessageType.MESH_JOIN, json_payload({}), sock=self._parent, recipient=self.parent_id)
        if resync and self._joined:  # updates may have been lost between the old parent and the new
            self._resync()

    def _resync(self, silent_parent: int | None = None) -> None:
        """Replace the parameters with the controller's (PARAMS_REQUEST); frames that arrive meanwhile
        are kept for later, in order."""
        assert self._on_params is not None
        self.resyncs += 1
        self._send(
            MessageType.PARAMS_REQUEST,
            json_payload({} if silent_parent is None else {"silent_parent": silent_parent}),
        )
        timeout_ms = self._config.sync_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            got = self._next_frame(max(0, int((deadline - time.monotonic()) * 1000)), controller_only=True)
            if got is None:
                raise TransportError(
                    f"worker {self.worker_id}: no answer to PARAMS_REQUEST from controller {self.endpoint} "
                    f"within {timeout_ms} ms"
                )
            header, payload = got[0], got[1]
            kind = header.message_type
            if kind == MessageType.UPDATE:
                self._stash.append((*got, False))
                continue
            try:
                self._replay.check(header, f"controller {self.endpoint}")
            except FrameRejected as exc:
                self._rejected(exc)
                continue
            self._replay.commit(header)
            if kind == MessageType.PARAMS:
                params = self._checked_params(header, payload)
                self._on_params(params, header.iteration, header.epoch)
                self._applied_upto = header.broadcast
                return
            if kind == MessageType.MESH_PARENT:
                self._set_parent(payload, resync=False)  # the PARAMS after it cover the change
            elif kind == MessageType.MESH_CHILDREN:
                self._set_children(payload)
            elif kind == MessageType.ERROR:
                self._raise_error(payload, f"controller {self.endpoint}")
            else:
                self._stash.append((*got, True))

    def _catch_up(self, target: int, on_update: Callable[[Header, np.ndarray], None] | None) -> None:
        """MESH: apply relayed updates until the parameters include broadcast number ``target`` (what a
        SYNC_ACK or EPOCH_GO covers); a parent silent for ``mesh_catchup_ms`` is named to the controller
        and its parameters are taken instead."""
        if not self.mesh:  # PLAIN: the controller's link numbers are no update count
            return
        wait_s = self._config.mesh_catchup_ms / 1000
        deadline = time.monotonic() + wait_s
        while self._applied_upto < target:
            if self._stash:
                result = self._dispatch(*self._stash.popleft())
            else:
                got = self._next_frame(max(0, int((deadline - time.monotonic()) * 1000)))
                if got is None:
                    self._resync(silent_parent=self.parent_id)
                    continue
                deadline = time.monotonic() + wait_s  # the wait is for silence, not for the whole catch-up
                result = self._dispatch(*got)
            if result is not None and result[0].message_type == MessageType.UPDATE and on_update is not None:
                on_update(result[0], update_payload(result[1]))

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
        (None when the controller has none yet). A MESH worker also reports its relay socket and is told
        its parent.
        """
        if self.mesh:
            info = {**info, "relay": self.relay_endpoint}
            self._joined = False
            self._stash.clear()
        self._link_next = None  # frames answering what was sent before this HELLO are not counted
        self._send(MessageType.HELLO, json_payload(info))
        # a controller that dropped this worker never acknowledges the SYNCs it sent before
        self._syncs_sent = self._syncs_acked = self._paced_steps = 0
        self.updater_state: np.ndarray | None = None
        self.updater_state_iteration = 0
        wanted = (MessageType.PARAMS, MessageType.UPDATER_STATE)
        while True:
            header, payload = self._wait_for(wanted, self._config.connect_timeout_ms, None, "HELLO")
            if header.message_type == MessageType.PARAMS:
                break
            self.updater_state = params_payload(header, payload).copy()
            self.updater_state_iteration = header.iteration
        self._joined = True
        self._applied_upto = self._relayed_upto = header.broadcast
        if not self.mesh:
            self._link_next = header.broadcast + 1
        if not header.payload_length:
            return None, header.iteration, header.epoch
        return self._checked_params(header, payload), header.iteration, header.epoch

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
        self.counters.update_frames += 1
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
        ``epoch`` since its last report. On return the parameters include every update the controller
        applied before it acknowledged (in MESH too). Raises :class:`RejoinRequired` when the controller
        dropped this worker.
        """
        self._send(MessageType.SYNC, json_payload(report or {}), epoch=epoch)
        self._syncs_sent += 1
        self._await_acks(on_update)

    def pace(self, on_update: Callable[[Header, np.ndarray], None], window: int) -> None:
        """Bound this worker's staleness after each of its minibatches (``window`` >= 1).

        Every ``window`` minibatches the worker sends a SYNC without waiting for it, after waiting for
        the acknowledgement of the previous one. An acknowledgement follows every update the controller
        applied before it, so the parameters a minibatch starts from include every update the controller
        applied more than ``2 * window`` of this worker's minibatches earlier (in MESH too). A worker
        runs ahead of a slow controller (or a slow network) by at most that much; asynchronous training
        with unbounded staleness loses accuracy when updates arrive tens of minibatches late.
        Raises :class:`RejoinRequired` when the controller dropped this worker.
        """
        self._paced_steps += 1
        if self._paced_steps < window:
            return
        if self._syncs_acked < self._syncs_sent:
            start = time.monotonic()
            self._await_acks(on_update)
            self.counters.paced_waits += 1
            self.counters.paced_wait_ms += (time.monotonic() - start) * 1000
        self._paced_steps = 0
        self._send(MessageType.SYNC, json_payload({}))
        self._syncs_sent += 1

    def _await_acks(self, on_update: Callable[[Header, np.ndarray], None]) -> None:
        """Apply arriving updates until every SYNC sent is acknowledged; in MESH, then until the
        parameters include every update the acknowledgements cover."""
        while self._syncs_acked < self._syncs_sent:  # at most two: a paced SYNC and a blocking one
            self._wait_for((MessageType.SYNC_ACK,), self._config.sync_timeout_ms, on_update, "SYNC")
        self._catch_up(self._acked_broadcast, on_update)

    def end_epoch(
        self,
        epoch: int,
        on_update: Callable[[Header, np.ndarray], None],
        report: dict[str, int] | None = None,
    ) -> bool:
        """Report ``epoch`` finished and wait for every worker and the driver; True means stop.

        ``report`` is as for :meth:`sync`. Peer updates arriving meanwhile are applied; on return the
        parameters include every update the controller applied before it let the workers go. Raises
        :class:`RejoinRequired` when the controller dropped this worker.
        """
        self._send(MessageType.EPOCH_END, json_payload(report or {}), epoch=epoch)
        while True:
            header, payload = self._wait_for(
                (MessageType.EPOCH_GO,), self._config.epoch_timeout_ms, on_update, f"EPOCH_END {epoch}"
            )
            if header.epoch == epoch:
                try:
                    stop = parse_json_payload(payload).get("stop") is True
                except FrameRejected as exc:
                    raise TransportError(f"worker {self.worker_id}: bad EPOCH_GO: {exc}") from exc
                self._catch_up(header.broadcast, on_update)
                return stop

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
        """Say BYE unless the controller has left (best effort), close the sockets and context (idempotent).

        A BYE after the controller's own would reach the next fit's controller on the same port as a
        frame it cannot authenticate. A MESH worker also tells its parent; its children are re-parented
        by the controller.
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
        for sock in (self._parent, self._router):
            if sock is None:
                continue
            if sock is self._parent:
                sock.setsockopt(zmq.SNDTIMEO, 0)
                try:
                    self._send(MessageType.BYE, sock=sock, recipient=self.parent_id)
                except TransportError:
                    pass
            sock.close()
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
