"""Resource limits and sanity bounds of the ZeroMQ transport, shared by the controller, the workers and
the MESH relays.

Bounded resources: ``MAXMSGSIZE`` on every socket (the largest frame the peer may legitimately send,
derived from the parameter count), bounded high-water marks, and queues bounded in bytes
(``max_queued_bytes``) per connection and direction (:func:`bounded_socket`).

Update sanity (:func:`check_update_threshold`): an UPDATE whose threshold (word 2 of every
:mod:`sparkgrad.compress` message, sparse and bitmap alike) is not finite, not positive, or larger than
the smaller of ``THRESHOLD_GROWTH_LIMIT`` times the job's reference threshold (the threshold the fit
starts from) and ``MAX_SCALE`` (1e6, the largest threshold any encoder writes) is rejected (reason
``threshold``), counted and never applied. The bound is fixed for the fit, so no series of accepted
updates raises it (it used to be 16x the sender's last accepted threshold, which 36 updates each 15x
the last drove to infinity). An adaptive algorithm would have to double its threshold twenty times over
the fit's start to reach it. The controller bounds it further by the fit's current threshold (the
median of the other workers' latest, each grown for the updates the sender is ahead of it by the
threshold algorithm's step growth, ``threshold_factor``), refuses sparse indices that are not
strictly ascending (:func:`check_update_entries`) and weighs each worker's updates against the median
worker's (:class:`InfluenceLedger`).

Every dropped frame is counted by reason (:class:`TrafficCounters`); log lines about them are rate
limited (:class:`RateLimitedLog`).
"""

from __future__ import annotations

import logging
import math
import socket
import time
import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from sparkgrad._config import MAX_SCALE, Config, check_int
from sparkgrad.transport.frame import FrameRejected

THRESHOLD_GROWTH_LIMIT = float(2**20)  # x the fit's reference threshold (module docstring)
SEQUENCE_LIMIT = 2**32  # sequence, link and broadcast numbers are 32-bit and never wrap
# ZmqTransportConfiguration.max_queued_bytes=None: per socket, the larger of these bytes and this many of
# its largest frames
DEFAULT_QUEUED_BYTES = 256 << 20
MIN_QUEUED_FRAMES = 16


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
        max_queued_bytes: the most bytes of frames ZeroMQ queues per connection and direction (>= 1):
            the receive high-water mark is this over the largest frame the socket receives, the send
            high-water mark this over the largest frame it sends (at least 1 frame each), so no peer
            can make a socket buffer high_water_mark x the largest frame (about 40 GB at 10M
            parameters) either way. A full receive queue makes ZeroMQ stop reading that connection; a
            full send queue drops the peer (``queue_full``, see the controller and the relay). None
            (the default): per socket, the larger of ``DEFAULT_QUEUED_BYTES`` (256 MiB) and
            ``MIN_QUEUED_FRAMES`` (16) of its largest frame. ZeroMQ counts whole frames whatever
            their size, and the traffic is small updates: a bound of one or two frames (what 256 MiB
            holds of a 17M-parameter model's largest frames) dropped workers that fell two updates
            behind, and the PARAMS of their re-joins dropped them again.
        max_connections: the most connections the controller keeps at once (>= 1). Past it, the
            oldest connection that has not authenticated (sent a frame with a valid tag) is closed to
            make room; only when all are authenticated is one more refused at its handshake (both
            counted ``connection_limit``). With max_queued_bytes this bounds what all connections
            together may make the controller queue. A connection that does not authenticate within
            ``connect_timeout_ms`` is closed (``auth_timeout``).
        max_unauthenticated_per_address: the most connections one peer address may hold at the
            controller before they authenticate (>= 1); one more closes that address's oldest
            (``address_limit``). Authenticated connections do not count, so many workers on one host
            (or on 127.0.0.1) are never refused for it.
        threshold_factor: the controller refuses an UPDATE whose threshold exceeds the larger of this
            many times the fit's current threshold (the median of the other registered workers' latest
            accepted thresholds) and the fit's reference threshold (what every worker starts from) (>= 1;
            :func:`check_update_threshold`). Only workers with ``InfluenceLedger.WARMUP`` (8) updates
            stand for the current threshold, each latest grown by the threshold algorithm's step growth
            for every update the sender is ahead of that worker (so a worker that ran ahead of a stalled
            one may have climbed as its algorithm does), at most ``warmup_threshold_factor /
            threshold_factor`` times;
        warmup_threshold_factor: the factor while no other worker has that many, over the median of
            all the other registered workers' latest (an adaptive algorithm's first steps may differ
            that much between workers) (>= 1), and the widest a warm bound grows to. A worker alone in
            the fit has only the fixed bound.
        outlier_factor: the controller quarantines a worker whose recent updates are larger (L1 or
            L-inf, :class:`InfluenceLedger`) than this many times the median other worker's; past half
            of it they are flagged (counted, logged) (>= 2).
        encrypt: CURVE-encrypt every link (ZeroMQ's CurveZMQ: X25519 key exchange, XSalsa20-Poly1305
            per message), on by default: the controller draws a key pair per fit and the workers get
            its public key with the job (next to the secret); each MESH relay draws one and the
            controller tells its children (signed MESH_PARENT). Frames stay HMAC-authenticated and the
            controller's signed as without it (CURVE authenticates a link, not who wrote a relayed
            frame). False: in the clear.
    """

    connect_timeout_ms: int = 15000
    sync_timeout_ms: int = 120000
    poll_interval_ms: int = 50
    high_water_mark: int = 1000
    epoch_timeout_ms: int = 600000
    updater_state_interval_ms: int = 60000
    mesh_fan_out: int = 8
    mesh_catchup_ms: int = 5000
    max_queued_bytes: int | None = None
    max_connections: int = 1024
    max_unauthenticated_per_address: int = 32
    threshold_factor: int = 16
    warmup_threshold_factor: int = 1024
    outlier_factor: int = 8
    encrypt: bool = True

    def __post_init__(self) -> None:
        check_int("connect_timeout_ms", self.connect_timeout_ms, minimum=1)
        check_int("sync_timeout_ms", self.sync_timeout_ms, minimum=1)
        check_int("poll_interval_ms", self.poll_interval_ms, minimum=1)
        check_int("high_water_mark", self.high_water_mark, minimum=1)
        check_int("epoch_timeout_ms", self.epoch_timeout_ms, minimum=1)
        check_int("updater_state_interval_ms", self.updater_state_interval_ms, minimum=0)
        check_int("mesh_fan_out", self.mesh_fan_out, minimum=1)
        check_int("mesh_catchup_ms", self.mesh_catchup_ms, minimum=1)
        if self.max_queued_bytes is not None:
            check_int("max_queued_bytes", self.max_queued_bytes, minimum=1)
        check_int("max_connections", self.max_connections, minimum=1)
        check_int("max_unauthenticated_per_address", self.max_unauthenticated_per_address, minimum=1)
        check_int("threshold_factor", self.threshold_factor, minimum=1)
        check_int("warmup_threshold_factor", self.warmup_threshold_factor, minimum=1)
        check_int("outlier_factor", self.outlier_factor, minimum=2)
        if not isinstance(self.encrypt, bool):
            raise ValueError(f"encrypt: expected a bool, got {self.encrypt!r}")


# bytes CurveZMQ adds to every frame on the wire (the MESSAGE command's name, nonce, MAC and flags);
# MAXMSGSIZE counts them: without them a frame of the largest legitimate size dropped its connection
CURVE_OVERHEAD = 33


@dataclass(frozen=True)
class Curve:
    """The CurveZMQ keys of one socket (``ZmqTransportConfiguration.encrypt``): a server's own key pair
    (``server`` None), or a client's own pair and its server's public key. Drawn per socket and fit."""

    public: bytes = field(repr=False)
    secret: bytes = field(repr=False)
    server: bytes | None = field(default=None, repr=False)

    @classmethod
    def new_server(cls) -> Curve:
        """A fresh server key pair (a controller, a MESH relay)."""
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    @classmethod
    def client_of(cls, server: bytes) -> Curve:
        """A fresh client key pair for the server whose public key is ``server`` (Z85, 40 bytes)."""
        public, secret = zmq.curve_keypair()
        return cls(public, secret, server)


def bounded_socket(
    ctx: zmq.Context,
    kind: int,
    config: ZmqTransportConfiguration,
    max_frame: int,
    max_sent_frame: int,
    curve: Curve | None = None,
) -> zmq.Socket:
    """A socket of ``kind`` that receives frames of at most ``max_frame`` bytes and sends frames of at
    most ``max_sent_frame`` bytes, queueing at most ``config.max_queued_bytes`` per connection each way;
    with ``curve``, CURVE-encrypted with those keys (the size limit then allows the cipher's overhead)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # bytes, not frames: what one connection may queue here (ZeroMQ counts whole messages)
    sock.setsockopt(zmq.SNDHWM, _frames(config, max_sent_frame))
    sock.setsockopt(zmq.RCVHWM, _frames(config, max_frame))
    # a peer sending more is disconnected, nothing buffered
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame + (CURVE_OVERHEAD if curve is not None else 0))
    if curve is not None:
        sock.curve_secretkey, sock.curve_publickey = curve.secret, curve.public
        if curve.server is None:
            sock.curve_server = True
        else:
            sock.curve_serverkey = curve.server
    return sock


class _HoldingContext(zmq.Context):
    """A ZeroMQ context holding a strong reference to every open socket it made. pyzmq tracks them weakly,
    so when their owner dies in a reference cycle the sockets drop out of destroy()'s view before it runs,
    and its term() then waits for them forever."""

    _held: list[zmq.Socket] = []  # declared here: pyzmq takes unknown instance attributes for socket options

    def __init__(self) -> None:
        super().__init__()
        self._held = []

    def socket(self, *args: Any, **kwargs: Any) -> zmq.Socket:
        sock = super().socket(*args, **kwargs)
        self._held = [s for s in self._held if not s.closed]
        self._held.append(sock)
        return sock


def owned_context(owner: object) -> tuple[zmq.Context, Callable[[], None]]:
    """A ZeroMQ context for ``owner`` and the call that closes its sockets and terminates it (idempotent).

    The call also runs when ``owner`` is garbage-collected without making it, and at exit: a connection
    dropped without ``close()`` (a failure path, a reference cycle) used to leave its context to
    ``Context.__del__``, whose ``term()`` waits forever in a cycle for sockets the same collection has not
    closed yet, hanging the interpreter.
    """
    ctx = _HoldingContext()
    return ctx, weakref.finalize(owner, ctx.destroy, 0)


def _frames(config: ZmqTransportConfiguration, frame_bytes: int) -> int:
    """The high-water mark that holds at most max_queued_bytes of frames of ``frame_bytes`` (by default
    the larger of DEFAULT_QUEUED_BYTES and MIN_QUEUED_FRAMES of them)."""
    budget = config.max_queued_bytes
    if budget is None:
        budget = max(DEFAULT_QUEUED_BYTES, MIN_QUEUED_FRAMES * frame_bytes)
    return max(1, min(config.high_water_mark, budget // frame_bytes))


def endpoint(host: str, port: int) -> str:
    """The ZeroMQ TCP endpoint of a host and port."""
    return f"tcp://{host}:{port}"


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
    peers_dropped: int = 0  # peers dropped or refused (by reason in dropped_reasons)
    dropped_reasons: dict[str, int] = field(default_factory=dict)
    paced_waits: int = 0  # worker: minibatches held back by the staleness bound
    paced_wait_ms: float = 0.0  # worker: time spent held back by the staleness bound
    outliers_flagged: int = 0  # controller: updates past half the outlier factor (InfluenceLedger)

    def reject(self, reason: str) -> None:
        """Count one rejected frame."""
        self.frames_rejected += 1
        self.rejected_reasons[reason] = self.rejected_reasons.get(reason, 0) + 1

    def drop(self, reason: str) -> None:
        """Count one dropped or refused peer: ``queue_full`` (its send queue is full: it does not read),
        ``gone``, ``silent_parent`` (a MESH child reported it), ``connection_limit``, ``address_limit`` or
        ``auth_timeout`` (:class:`ConnectionLimit`)."""
        self.peers_dropped += 1
        self.dropped_reasons[reason] = self.dropped_reasons.get(reason, 0) + 1


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


@dataclass
class _Connection:
    """One accepted connection of a listening socket (by its file descriptor)."""

    since: float  # monotonic time it was accepted
    peer: tuple | None  # (address, port, ...) from getpeername; None if it was gone before we asked

    @property
    def address(self) -> str:
        return "?" if self.peer is None else str(self.peer[0])


def _peer_of(fd: int) -> tuple | None:
    """getpeername of a file descriptor libzmq owns (wrapped, never closed here)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        return sock.getpeername()
    except OSError:
        return None
    finally:
        sock.detach()


class ConnectionLimit:
    """Bounds the connections to ``sock``: how many, how long without authenticating, how many per host.

    Live connections are tracked by file descriptor from the socket's monitor: libzmq reports each
    accepted connection before its handshake and its end exactly once (a refused one included), and the
    event pipe is unbounded so no event is lost. A connection counts as *authenticated* once a frame with
    a valid tag arrived on it (the owner calls :meth:`authenticate` with the frame's ``zmq.SRCFD``).
    Unauthenticated connections are what a stranger without the key can hold, so they are bounded three
    ways (issue 37): one that has not authenticated ``timeout_ms`` after it was accepted is shut down
    (``auth_timeout``); when a host holds more than ``per_address`` of them its oldest is shut down
    (``address_limit``); and when more than ``limit`` connections are live, the oldest unauthenticated
    one is shut down to make room (``connection_limit``), so strangers can never lock authenticated
    workers out. Both are judged as each connection is accepted. Only when every other connection is
    authenticated is a new one refused at its handshake (a ZAP handler: the NULL mechanism consults ZAP
    once the socket has a ZAP domain; counted ``connection_limit`` too). A connection is shut down with
    ``shutdown(2)`` on its descriptor after checking that the descriptor still has the peer it was
    accepted from; libzmq then sees the end of the stream, closes it and reports it. The owner polls
    :attr:`sockets`, calls :meth:`handle` with the ready ones and :meth:`sweep` on every turn of its
    loop.

    Args:
        ctx: the socket's context (one ZAP handler per context).
        sock: the listening socket, before it binds.
        limit: the most live connections.
        counters: where a refused or closed connection is counted.
        log: where a refusal is reported.
        timeout_ms: how long a connection may stay unauthenticated.
        per_address: the most unauthenticated connections one peer address may hold.
        clock: monotonic clock in seconds.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        sock: zmq.Socket,
        limit: int,
        counters: TrafficCounters,
        log: RateLimitedLog,
        timeout_ms: int,
        per_address: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit, self._counters, self._log = limit, counters, log
        self._timeout_s, self._per_address, self._clock = timeout_ms / 1000, per_address, clock
        self._conns: dict[int, _Connection] = {}  # by descriptor
        # the unauthenticated ones not being shut down, in the order they were accepted, and by address
        self._strangers: dict[int, _Connection] = {}
        self._by_address: dict[str, dict[int, _Connection]] = {}
        self._closing: set[int] = set()  # shut down by us, their end not reported yet
        self.accepted = 0  # connections accepted so far
        self._zap = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind("inproc://zeromq.zap.01")
        sock.setsockopt(zmq.ZAP_DOMAIN, b"sparkgrad")
        events = f"inproc://sparkgrad-connections-{id(self):x}"
        sock.monitor(events, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._events = ctx.socket(zmq.PAIR)
        self._events.setsockopt(zmq.LINGER, 0)
        self._events.setsockopt(zmq.RCVHWM, 0)
        self._events.connect(events)
        self._sock = sock

    @property
    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        """The sockets to poll for input."""
        return self._events, self._zap

    @property
    def live(self) -> int:
        """Connections open and not being shut down by us."""
        return len(self._conns) - len(self._closing)

    @property
    def unauthenticated(self) -> int:
        """Live connections on which no authenticated frame arrived yet."""
        return len(self._strangers)

    def authenticate(self, fd: int) -> None:
        """A frame with a valid tag arrived on the connection of descriptor ``fd``."""
        if fd not in self._conns:  # accepted after the events were last read
            self._count_events()
        self._unlist(fd)

    def handle(self) -> None:
        """Read the connection events that arrived, then judge every pending handshake."""
        self._count_events()
        while self._zap.poll(0):
            request = self._zap.recv_multipart()
            self._count_events()  # its connection was accepted before its handshake asked
            version, request_id, address = request[0], request[1], request[3].decode(errors="replace")
            if self.live > self._limit:
                self._counters.drop("connection_limit")
                self._log.warning(
                    f"refused a connection from {address}: {self.live - 1} authenticated connections are "
                    f"open (max_connections {self._limit})"
                )
                self._zap.send_multipart([version, request_id, b"400", b"too many connections", b"", b""])
            else:
                self._zap.send_multipart([version, request_id, b"200", b"OK", b"", b""])

    def sweep(self) -> None:
        """Shut down every connection that did not authenticate within the timeout."""
        deadline = self._clock() - self._timeout_s
        while self._strangers:
            fd, conn = next(iter(self._strangers.items()))
            if conn.since > deadline:
                return  # accepted in order: the rest are younger
            self._close(fd, "auth_timeout")

    def _close(self, fd: int, reason: str) -> None:
        """Shut down an unauthenticated connection (it stays counted until libzmq reports its end)."""
        conn = self._unlist(fd)
        assert conn is not None  # only listed strangers are closed
        self._closing.add(fd)
        self._counters.drop(reason)
        self._log.warning(f"closed an unauthenticated connection from {conn.address} ({reason})")
        if conn.peer is None or _peer_of(fd) != conn.peer:
            return  # gone already (its end is on its way), or the descriptor is another connection's now
        try:
            wrapped = socket.socket(fileno=fd)
        except OSError:  # closed by libzmq since: its end is on its way
            return
        try:
            wrapped.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            wrapped.detach()

    def _count_events(self) -> None:
        while self._events.poll(0):
            message = parse_monitor_message(self._events.recv_multipart())
            fd = message["value"]
            self._forget(fd)  # a descriptor's end comes before its reuse; an accept replaces nothing
            if message["event"] == zmq.EVENT_ACCEPTED:
                self.accepted += 1
                conn = _Connection(self._clock(), _peer_of(fd))
                self._conns[fd] = self._strangers[fd] = conn
                waiting = self._by_address.setdefault(conn.address, {})
                waiting[fd] = conn
                if len(waiting) > self._per_address:  # the oldest goes, not the one just accepted
                    self._close(next(iter(waiting)), "address_limit")
                if self.live > self._limit and len(self._strangers) > 1:
                    self._close(next(iter(self._strangers)), "connection_limit")

    def _forget(self, fd: int) -> None:
        self._unlist(fd)
        self._conns.pop(fd, None)
        self._closing.discard(fd)

    def _unlist(self, fd: int) -> _Connection | None:
        """Take a connection off the unauthenticated lists (it authenticated, or it ends)."""
        conn = self._strangers.pop(fd, None)
        if conn is not None:
            waiting = self._by_address[conn.address]
            del waiting[fd]
            if not waiting:
                del self._by_address[conn.address]
        return conn

    def close(self) -> None:
        """Stop monitoring and close the handler's sockets (before the socket itself)."""
        self._sock.disable_monitor()
        self._events.close()
        self._zap.close()


def check_update_threshold(
    message: np.ndarray, reference: float, sender: str, current: float | None = None, factor: float = math.inf
) -> float:
    """The threshold of an update message if it is sane (module docstring), else
    FrameRejected("threshold"). ``message`` holds at least the 4 header words. With ``current`` (the fit's
    current threshold, as the controller sees it) the threshold must also be at most the larger of
    ``factor`` x ``current`` and ``reference``."""
    threshold = float(message[2:3].view("<f4")[0])
    bound = min(MAX_SCALE, THRESHOLD_GROWTH_LIMIT * reference)
    if current is not None:
        bound = min(bound, max(factor * current, reference))
    if not (math.isfinite(threshold) and 0 < threshold <= bound):
        now = "" if current is None else f", a factor {factor:g} x the fit's current threshold {current:.6g}"
        raise FrameRejected(
            "threshold",
            f"update from {sender} has threshold {threshold!r}: must be finite, > 0 and <= {bound:.6g} "
            f"(from the fit's reference threshold {reference:.6g}{now}; at most 2**20 x the reference and "
            f"{MAX_SCALE:g})",
        )
    return threshold


def check_update_entries(message: np.ndarray, sender: str) -> None:
    """A sparse message's entries must name strictly ascending, so distinct, indices (what every encoder
    writes), else FrameRejected("unordered"): an index repeated k times would move its parameter k
    thresholds in one update. Bitmap messages hold one code per element by construction. Entries beyond
    the message or out of range are left to the decoder (``bad_update``)."""
    if message.size < 5 or message[3] != 0:
        return
    count = min(max(int(message[0]), 0), message.size - 4)
    indices = np.abs(message[4 : 4 + count].astype(np.int64))
    if count > 1 and not bool(np.all(indices[1:] > indices[:-1])):
        first = int(np.argmin(indices[1:] > indices[:-1]))
        raise FrameRejected(
            "unordered",
            f"update from {sender}: entry {first + 1} names index {int(indices[first + 1]) - 1} after "
            f"{int(indices[first]) - 1} (indices must be strictly ascending, each at most once)",
        )


class InfluenceLedger:
    """Per-worker magnitude accounting of the updates the controller applies (issue 37).

    For every worker it keeps an exponential moving average (weight ``1/16``, about its last 16 updates)
    of each update's L1 norm (threshold x encoded entries) and L-inf norm (its threshold). An update is
    judged against the median of the averages of the other registered workers that have sent
    :attr:`WARMUP` updates (at least two of them; a worker's first updates, while an adaptive
    algorithm finds its level, stand for nothing): the ratio of the worker's averages after the update
    to theirs, the larger of the two, with the L-inf median taken at least at the fit's reference
    threshold (a restarted worker starts there while the others' thresholds may have decayed). Past
    ``factor / 2`` the update is flagged; past ``factor`` the worker is quarantined by the owner (the
    update is refused).

    Args:
        factor: the quarantine factor (``ZmqTransportConfiguration.outlier_factor``).
        reference: the fit's reference threshold.
    """

    WEIGHT = 1 / 16
    WARMUP = 8  # updates before a worker's average (and latest threshold) stands for the fit

    def __init__(self, factor: float, reference: float) -> None:
        self.factor, self._reference = factor, reference
        self._averages: dict[int, tuple[float, float]] = {}  # worker -> (L1, L-inf)
        self._counts: dict[int, int] = {}  # worker -> updates recorded

    def ratio(self, worker: int, l1: float, linf: float, registered: Container[int]) -> float:
        """How many times the median other ``registered`` worker's the worker's averages would be after
        this update (0.0 while fewer than two of them sent updates)."""
        others = [
            v
            for w, v in self._averages.items()
            if w != worker and w in registered and self._counts[w] >= self.WARMUP
        ]
        if len(others) < 2:
            return 0.0
        mine = self._next(worker, l1, linf)
        median_l1 = float(np.median([v[0] for v in others]))
        median_linf = max(float(np.median([v[1] for v in others])), self._reference)
        return max(mine[0] / median_l1 if median_l1 > 0 else 0.0, mine[1] / median_linf)

    def record(self, worker: int, l1: float, linf: float) -> None:
        """An update of ``worker`` was applied."""
        self._averages[worker] = self._next(worker, l1, linf)
        self._counts[worker] = self._counts.get(worker, 0) + 1

    def _next(self, worker: int, l1: float, linf: float) -> tuple[float, float]:
        old = self._averages.get(worker)
        if old is None:
            return (l1, linf)
        w = self.WEIGHT
        return (old[0] + w * (l1 - old[0]), old[1] + w * (linf - old[1]))


def finite_mean(values: list[float]) -> float:
    """The mean of finite floats, finite whatever they are: each is divided before the exact sum
    (``math.fsum``), so reports of 1.7e308 cannot overflow it to inf as a plain sum does."""
    return math.fsum(v / len(values) for v in values)


def all_finite(values: np.ndarray) -> bool:
    """Whether every element is finite: min and max propagate nan and show an inf, no temporary array."""
    return bool(values.size == 0 or (math.isfinite(values.min()) and math.isfinite(values.max())))


def is_count(value: object) -> TypeGuard[int]:
    """A JSON value that is a non-negative int (bools are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


__all__ = [
    "DEFAULT_QUEUED_BYTES",
    "MIN_QUEUED_FRAMES",
    "SEQUENCE_LIMIT",
    "THRESHOLD_GROWTH_LIMIT",
    "RateLimitedLog",
    "TrafficCounters",
    "ZmqTransportConfiguration",
    "CURVE_OVERHEAD",
    "Curve",
    "all_finite",
    "ConnectionLimit",
    "InfluenceLedger",
    "bounded_socket",
    "check_update_entries",
    "check_update_threshold",
    "endpoint",
    "finite_mean",
    "is_count",
    "owned_context",
]
