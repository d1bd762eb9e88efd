"""The controller of gradient sharing (a thread on the Spark driver), PLAIN and MESH topology.

The controller owns one ROUTER socket. Workers connect with a DEALER socket, say HELLO and receive the
current parameters; every UPDATE they send is applied to the controller's authoritative parameter copy
and relayed to every other registered worker (PLAIN) or to the root's children of the relay tree
(MESH, ``Controller(mesh=True)``; the tree, the relay rules and the failure policy are described in
:mod:`sparkgrad.transport.mesh`). A SYNC request is answered after everything the worker sent before
it has been applied (ZeroMQ keeps per-connection order), which is how a task makes sure its updates
reached the controller before it returns. Every socket has LINGER 0 and every wait is bounded, so no
failure mode hangs.

Every frame is authenticated with the fit's secret (see :mod:`sparkgrad.transport.frame`). The
controller treats every received byte as hostile: a frame that fails authentication, names another
job, replays a sequence number, is malformed or carries an implausible update is dropped and counted
(``TrafficCounters.frames_rejected``, by reason in ``rejected_reasons``); its log lines are rate
limited. Unauthenticated frames never get a reply. Only an error of the controller's own (for example
of the decode function) stops its thread; it then tells its workers with an authenticated ERROR and
:meth:`Controller.check` / :attr:`Controller.error` report it to the driver.

Link rules (wire version 3, issue 21): the controller takes frames sent to it (recipient 0, else
``misdirected``) by a registered worker (``not_joined``), never relayed and never with sender 0
(``malformed``), and at most one worker id per connection (``identity_in_use``). Before the tag, the
header's size, magic, version, type and the payload length are checked against the largest payload it
takes of that type (``oversized``), so a malformed or oversized frame costs no HMAC. Every frame it
sends names its one recipient; PLAIN numbers each worker's link (:mod:`.frame`).

Slow-peer policy: the controller never blocks on one worker. When a frame for a worker cannot be
queued (its high-water mark is reached because it does not read), the controller drops that worker:
no more relays go to it and its later UPDATE, SYNC and PARAMS_REQUEST frames are not applied but
answered with an ERROR carrying ``"rejoin": true`` (retried until it can be queued). The worker
(:class:`~sparkgrad.transport.worker.WorkerConnection`) raises
:class:`~sparkgrad.transport.worker.RejoinRequired`; its owner must HELLO again and replace its
parameters with the controller's current ones (``SharedWorker`` does), so a dropped worker never
diverges silently: whatever it applied while dropped is overwritten, its own updates sent while dropped
are lost like skipped steps.

Resource limits (:mod:`.limits`): each connection queues at most ``max_queued_bytes`` each way (a
send queue that fills drops its worker: ``queue_full`` in ``TrafficCounters.dropped_reasons``, next to
``gone`` and ``silent_parent``), and at most ``max_connections`` connections are live at once. A
connection on which no authenticated frame arrives within ``connect_timeout_ms`` is closed
(``auth_timeout``), one host holds at most ``max_unauthenticated_per_address`` such connections
(``address_limit``), and past ``max_connections`` the oldest of them is closed to make room; only when
every connection is authenticated is one more refused at its handshake (``connection_limit``).
:class:`~sparkgrad.transport.limits.ConnectionLimit` has the details.

How the parameters change is the controller's policy (:mod:`.policies`): gradient sharing (UPDATE:
each update is checked, applied and relayed; its update sanity rules are described there) or parameter
averaging (``Controller(averaging=True)``: ParameterAveragingTrainingMaster's rounds, AVERAGE/AVERAGED).
The socket loop, authentication, peers, the MESH tree and the fault handling above are the same for both.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable

import numpy as np
import zmq

from sparkgrad._config import check_int
from sparkgrad.errors import TransportError
from sparkgrad.nn.trained_ranges import TrainedRanges
from sparkgrad.transport.frame import (
    CONTROL_PAYLOAD_LIMIT,
    CONTROLLER_ID,
    HEADER_SIZE,
    SIGNATURE_SIZE,
    Flag,
    FrameKey,
    FrameRejected,
    Header,
    MessageType,
    Replay,
    decode_frame,
    encode_frame,
    endorsed_frame,
    float_flag,
    json_payload,
    max_update_bytes,
    params_payload,
    parse_json_payload,
    relayed_frame,
)
from sparkgrad.transport.limits import (
    SEQUENCE_LIMIT,
    ConnectionLimit,
    Curve,
    RateLimitedLog,
    TrafficCounters,
    ZmqTransportConfiguration,
    bounded_socket,
    endpoint,
    is_count,
    owned_context,
)
from sparkgrad.transport.mesh import ROOT, MeshOrganizer
from sparkgrad.transport.policies import AveragingPolicy, Policy, SharingPolicy, _Contribution
from sparkgrad.transport.relay import curve_key_ok, relay_address_ok
from sparkgrad.transport.signing import ControllerSigner

log = logging.getLogger(__name__)


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
            error stops the controller. With the default, a sparse update is applied in place in
            O(entries) (:func:`sparkgrad.compress.subtract_message`); a bitmap, or any update with
            another decoder, is decoded and applied in dense passes over the parameters.
        iteration: starting iteration counter.
        epoch: starting epoch counter.
        threshold_reference: the threshold workers start from (the job's threshold algorithm); bounds
            the accepted thresholds (:mod:`.policies`).
        threshold_growth: the most the job's threshold algorithm raises a worker's threshold in one step
            (``ThresholdAlgorithm.max_step_growth``, >= 1): the bound lets a worker's threshold exceed
            another worker's latest by this factor per update it is ahead of that worker (:mod:`.policies`).
        updater_state: the updater state of the fit's start (copied; None or empty when the updater has
            none). Workers report theirs (UPDATER_STATE); the latest report is what a joining worker
            receives with the parameters.
        mesh: relay updates down a MESH tree of ``config.mesh_fan_out`` (:mod:`sparkgrad.transport.mesh`)
            instead of sending each to every worker (PLAIN).
        signer: the Ed25519 key that signs every frame the controller sends as itself (:mod:`.signing`);
            None draws a fresh one (per fit). Workers verify with :attr:`controller_key`.
        curve: with ``config.encrypt``, the CURVE key pair it serves with (:class:`~.limits.Curve`); None
            draws a fresh one (per fit). Workers connect with :attr:`curve_key`.
        averaging: average the workers' parameters in rounds (AVERAGE/AVERAGED, :mod:`.policies`)
            instead of applying updates; ``threshold_reference``, ``threshold_growth`` and ``decode`` are then
            not used.
        average_updater_state: with ``averaging``, the workers' updater states are averaged too (the
            AVERAGE and AVERAGED vectors hold the parameters followed by the updater state).
        averaged_ranges: with ``averaging``, the parameters the AVERAGE and AVERAGED vectors hold
            (:class:`~sparkgrad.nn.trained_ranges.TrainedRanges`: a network's trained ranges, its frozen
            layers' parameters stay as given); None: all of them.
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
        threshold_reference: float | None = None,
        threshold_growth: float = 1.0,
        updater_state: np.ndarray | None = None,
        mesh: bool = False,
        averaging: bool = False,
        average_updater_state: bool = False,
        averaged_ranges: TrainedRanges | None = None,
        signer: ControllerSigner | None = None,
        curve: Curve | None = None,
    ) -> None:
        self._config = config or ZmqTransportConfiguration()
        self._params = np.array(params, copy=True)
        self._updater_state = None if updater_state is None else np.array(updater_state, copy=True)
        # how the parameters change (:mod:`.policies`); each policy checks its own arguments
        self._policy: Policy = (
            AveragingPolicy(
                self, self._params, self._updater_state, average_updater_state, mesh, averaged_ranges
            )
            if averaging
            else SharingPolicy(
                self, self._params, decode, threshold_reference, threshold_growth, self._config
            )
        )
        self._key = FrameKey(secret)
        self._signer = signer or ControllerSigner()
        self.controller_key = self._signer.public_key  # what the workers verify its frames with
        self.updater_state_reports = 0
        self._updater_state_iteration = iteration  # the iteration the stored state belongs to
        # worker -> (FINAL reports from it, the latest's state): each task's state at its end
        self._final_states: dict[int, tuple[int, np.ndarray]] = {}
        # minibatches reported per (partition, epoch): a second report is a re-run Spark task
        self._trained: dict[tuple[int, int], int] = {}
        self.retrained_minibatches = 0
        # gradient sharing: updates applied (in all and by worker); averaging: rounds averaged and
        # (epoch, iteration after the round, the workers' mean score) of every round with data
        self.updates_applied = 0
        self.updates_by_worker: dict[int, int] = {}
        self.rounds_averaged = 0
        self.round_scores: list[tuple[int, int, float]] = []
        # an UPDATE is sized before the tag under either policy: averaging answers one "unexpected"
        self._update_limit = max_update_bytes(self._params.size)
        self.job_id = job_id
        self.host, self.port = host, port
        self.iteration, self.epoch = iteration, epoch
        self.counters = TrafficCounters()
        self.workers_seen: set[int] = set()
        self._peers: dict[int, bytes] = {}
        self._owners: dict[bytes, int] = {}  # connection -> its worker (one worker per connection)
        # MESH: workers to take out of the tree, handled in a loop (a leave sends frames, a failed send
        # makes another worker leave: a chain as long as the crowd that vanished, never a recursion)
        self._leaving: deque[int] = deque()
        self._leaving_busy = False
        # MESH: each worker's relay socket, "host:port", and its CURVE public key (with config.encrypt)
        self._relay_address: dict[int, tuple[str, str | None]] = {}
        self._rejoin_pending: dict[int, bytes] = {}
        self._replay = Replay()
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
        self._ctx, self._release = owned_context(self)  # released by close(), or when collected without it
        # the driver wakes the controller thread through an inproc pair (sockets stay single-threaded)
        wake = f"inproc://sparkgrad-controller-wake-{job_id:x}-{id(self):x}"
        self._wake_in = self._ctx.socket(zmq.PAIR)
        self._wake_in.bind(wake)
        self._wake_out = self._ctx.socket(zmq.PAIR)
        self._wake_out.connect(wake)
        self._wake_lock = threading.Lock()
        state_bytes = 0 if self._updater_state is None else self._updater_state.nbytes
        max_frame = HEADER_SIZE + max(
            self._update_limit, CONTROL_PAYLOAD_LIMIT, state_bytes, self._policy.max_payload
        )
        # its own frames end with its signature
        max_sent_frame = max(max_frame, HEADER_SIZE + self._params.nbytes) + SIGNATURE_SIZE
        curve = (curve or Curve.new_server()) if self._config.encrypt else None
        # with config.encrypt: the public key workers connect with
        self.curve_key: bytes | None = None if curve is None else curve.public
        self._sock = bounded_socket(self._ctx, zmq.ROUTER, self._config, max_frame, max_sent_frame, curve)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._connections = ConnectionLimit(
            self._ctx,
            self._sock,
            self._config.max_connections,
            self.counters,
            self._log,
            timeout_ms=self._config.connect_timeout_ms,
            per_address=self._config.max_unauthenticated_per_address,
        )
        try:
            if port == 0:  # a free port, which the workers learn from the job
                self.port = self._sock.bind_to_random_port(f"tcp://{host}")
            else:
                self._sock.bind(endpoint(host, port))
        except zmq.ZMQError as exc:
            self._connections.close()
            self._release()
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

    def copy_params(self, out: np.ndarray) -> None:
        """The current authoritative parameters copied into ``out`` (of their shape and dtype): no new
        buffer to fault in, while the controller holds its lock."""
        with self._lock:
            np.copyto(out, self._params)

    def mesh_tree(self) -> dict[int, int]:
        """MESH: {worker: parent} of the current relay tree (parent 0 is the controller); {} in PLAIN."""
        with self._lock:
            mesh = self._mesh
            return {} if mesh is None else {n: mesh.parent(n) for n in self.workers_seen if n in mesh}

    def updater_state(self) -> np.ndarray | None:
        """A copy of the latest updater state a worker reported (the fit's start state before any)."""
        with self._lock:
            return None if self._updater_state is None else self._updater_state.copy()

    def final_updater_states(self) -> dict[int, tuple[int, np.ndarray]]:
        """{worker: (how many FINAL updater-state reports it sent, the latest one's state)}: the state
        each worker's task had at its end (:meth:`WorkerConnection.send_updater_state` with ``final``)."""
        with self._lock:
            return dict(self._final_states)

    @property
    def next_iteration(self) -> int:
        """The iteration count the driver's network continues from: after the last averaged round
        (averaging), else one past the iteration of the last applied update."""
        return self._policy.next_iteration(self.iteration)

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
        self._release()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        for sock in self._connections.sockets:
            poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(self._config.poll_interval_ms))
                if self._wake_in in ready:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                    self._apply_releases()
                if any(sock in ready for sock in self._connections.sockets):
                    self._connections.handle()
                if self._sock in ready:
                    self._receive_all()
                self._connections.sweep()
                self._retry_rejoin_notices()
            for worker, identity in list(self._peers.items()):
                self._send(identity, self._control_frame(MessageType.BYE, worker))
        except BaseException as exc:  # surfaced to the driver through error/check()
            log.exception("sparkgrad controller thread failed")
            self._error = exc
            self._notify_failure(exc)
        finally:
            self._log.flush()
            self._connections.close()
            self._sock.close()
            self._wake_in.close()

    def _receive_all(self) -> None:
        while True:
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) != 2:  # a DEALER always sends one part; anything else is a stranger
                self.counters.messages_received += 1
                self._reject("malformed", f"{len(parts) - 1}-part message from {parts[0].bytes.hex()}")
                continue
            self._handle(parts[0].bytes, parts[1].bytes, parts[1].get(zmq.SRCFD))

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
        if self._seq >= SEQUENCE_LIMIT:
            raise TransportError("controller: sequence numbers exhausted (2**32 frames sent)")
        self._seq += 1
        return self._seq - 1

    def _number(self, recipient: int) -> int:
        """The number stamped on the next frame to ``recipient``: MESH, the updates relayed so far (what
        a SYNC_ACK covers); PLAIN, the next number of that worker's link (gaps show lost frames)."""
        if self._mesh is not None:
            return self._broadcast
        number = self._link_numbers.get(recipient, 0) + 1
        if number >= SEQUENCE_LIMIT:
            raise TransportError(f"controller: link numbers of worker {recipient} exhausted (2**32 frames)")
        self._link_numbers[recipient] = number
        return number

    def _signed_frame(
        self,
        kind: MessageType,
        recipient: int,
        payload: bytes | memoryview,
        *,
        iteration: int = 0,
        epoch: int = 0,
        flags: Flag = Flag.NONE,
    ) -> bytearray:
        """A frame the controller sends as itself to ``recipient``: its next sequence number, stamped
        with the recipient's number (:meth:`_number`) and signed."""
        return encode_frame(
            self._key,
            kind,
            self.job_id,
            CONTROLLER_ID,
            self._next_seq(),
            payload,
            iteration=iteration,
            epoch=epoch,
            flags=flags,
            broadcast=self._number(recipient),
            recipient=recipient,
            signer=self._signer,
        )

    def _control_frame(
        self, kind: MessageType, recipient: int, body: dict | None = None, epoch: int = 0
    ) -> bytearray:
        """A control frame for ``recipient``."""
        payload = json_payload(body) if body is not None else b""
        return self._signed_frame(kind, recipient, payload, epoch=epoch)

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
        sender = self._owners.get(identity)
        if sender is not None:
            self._forget(sender)  # MESH: may send (re-parenting), queueing more leaves, never recursing
            self.counters.drop("queue_full" if status == "full" else "gone")
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
        payload = (
            self._params.astype(self._params.dtype.newbyteorder("<"), copy=False).data if current else b""
        )
        # not current: nothing applied yet, the worker's own copy of the initial parameters is current
        return self._signed_frame(
            MessageType.PARAMS,
            recipient,
            payload,
            iteration=self.iteration,
            epoch=self.epoch,
            flags=float_flag(self._params),
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
        if kind == self._policy.kind:
            return self._policy.max_payload
        if kind == MessageType.UPDATE:  # averaging: read, then answered "unexpected"
            return self._update_limit
        if kind == MessageType.UPDATER_STATE:  # float64 too: a dtype mismatch is answered with an ERROR
            return 0 if self._updater_state is None else 8 * self._updater_state.size
        if kind == MessageType.AVERAGE:  # gradient sharing: an AVERAGE carries nothing
            return 0
        return CONTROL_PAYLOAD_LIMIT

    def _handle(self, identity: bytes, frame: bytes, fd: int) -> None:
        self.counters.bytes_received += len(frame)
        self.counters.messages_received += 1
        try:
            header, payload = self._admit(identity, frame)
        except FrameRejected as exc:  # not authenticated (or a replay): no reply at all
            self._reject(exc.reason, str(exc))
            return
        self._connections.authenticate(fd)  # its tag is valid: the connection is no stranger's
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
            relay, relay_key = info.get("relay"), info.get("relay_key")
            if self._mesh is not None and not (
                relay_address_ok(relay)
                and (curve_key_ok(relay_key) if self._config.encrypt else relay_key is None)
            ):
                text = (
                    f"HELLO from worker {sender}: MESH needs its relay socket as 'host:port', got {relay!r}"
                    + (" and its CURVE key (encrypt)" if self._config.encrypt else "")
                )
                self._reject("control", text)
                self._error_reply(identity, sender, text)
                return
            self._policy.check_join(sender)
            owner = self._owners.get(identity)
            if owner is not None and owner != sender:  # one worker per connection: its frames, its fate
                text = f"HELLO from worker {sender} on the connection of worker {owner}"
                self._reject("identity_in_use", text)
                self._error_reply(identity, sender, text)
                return
            self._register(sender, identity)
            self._rejoin_pending.pop(sender, None)
            self.workers_seen.add(sender)
            if self._mesh is not None and not self._mesh_join(identity, sender, (str(relay), relay_key)):
                return
            fresh = info.get("has_initial_params") is True and self.updates_applied == 0
            if self.updater_state_reports and not self._send(identity, self._state_frame(sender)):
                return
            self._send(identity, self._params_frame(sender, current=not fresh))
        elif kind == MessageType.BYE:
            self._forget(sender)
        elif kind == self._policy.kind:
            self._policy.take(identity, header, payload, frame)
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
        if not all(is_count(v) for v in (partition, minibatches)) or (expected and partition >= expected):
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
        assert state is not None  # sent only once a worker's report was stored in it (_store_updater_state)
        return self._signed_frame(
            MessageType.UPDATER_STATE,
            recipient,
            state.astype(state.dtype.newbyteorder("<"), copy=False).data,
            iteration=self._updater_state_iteration,
            epoch=self.epoch,
            flags=float_flag(state),
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
        if header.flags & Flag.FINAL:  # for the driver's mean over workers, not for joining workers
            state = np.array(params_payload(header, payload), dtype=current.dtype)
            with self._lock:
                count = self._final_states.get(header.sender, (0, state))[0]
                self._final_states[header.sender] = (count + 1, state)
            return
        with self._lock:
            current[:] = params_payload(header, payload)
        self._updater_state_iteration = header.iteration
        self.updater_state_reports += 1

    def _register(self, sender: int, identity: bytes) -> None:
        old = self._peers.get(sender)
        if old is not None:  # reconnected: its old connection is no longer its
            self._owners.pop(old, None)
        self._peers[sender] = identity
        self._owners[identity] = sender

    def _forget(self, sender: int) -> None:
        """A worker left or was dropped: no more relays to it, its pending epoch reports no longer
        count (a Spark retry's new workers report those epochs again) and, in MESH, its children move up."""
        identity = self._peers.pop(sender, None)
        if identity is None:
            return
        self._owners.pop(identity, None)
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
        address, key = self._relay_address[parent]
        host, port = address.rsplit(":", 1)
        body = {"parent": endpoint(host, int(port)), "id": parent, "version": self._mesh.version}
        if key is not None:
            body["key"] = key
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

    def _mesh_join(self, identity: bytes, sender: int, relay: tuple[str, str | None]) -> bool:
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
        """Take a worker out of the tree. Leaves are queued and handled one after the other by the
        outermost call: a leave sends frames, a send that fails drops its worker (:meth:`_send`) and
        queues its leave here, so 2,000 workers vanishing at once make a loop, not a recursion."""
        self._leaving.append(sender)
        if self._leaving_busy:
            return
        self._leaving_busy = True
        try:
            while self._leaving:
                node = self._leaving.popleft()
                if self._mesh is not None and node in self._mesh:
                    self._mesh_leave_one(node)
        finally:
            self._leaving_busy = False

    def _mesh_leave_one(self, sender: int) -> None:
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
            and is_count(silent)
            and sender in mesh
            and silent != ROOT
            and mesh.parent(sender) == silent
            and silent in self._peers
        ):
            self._rejoin_pending[silent] = self._peers[silent]
            self._forget(silent)
            self.counters.drop("silent_parent")
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

    # -- what the policies call ------------------------------------------------------------------
    def _applied(self, header: Header, message: np.ndarray) -> None:
        """Called with each update this controller applied (before relaying it; decoded in
        :attr:`_scratch`, which costs a dense pass over the parameters on its first read for a sparse
        update: read it only when the message itself does not tell); for subclasses."""

    def _round_averaged(self, epoch: int, minibatches: int, score: float | None) -> None:
        """Called on the controller thread after every averaged round (a hook for progress reporting)."""

    @property
    def _scratch(self) -> np.ndarray:
        """Gradient sharing: the update :meth:`_applied` is called with, decoded."""
        assert isinstance(self._policy, SharingPolicy)
        return self._policy.scratch

    @property
    def _rounds(self) -> dict[tuple[int, int], dict[int, _Contribution]]:
        """Averaging: the AVERAGE reports of each (epoch, round) not yet averaged, by partition."""
        assert isinstance(self._policy, AveragingPolicy)
        return self._policy.rounds

    def _relay(self, sender: int, frame: bytes) -> None:
        """Pass an applied update on: PLAIN to every other registered worker, MESH to the root's
        children (the sender too: it relays its own update to its subtree)."""
        if self._mesh is None:
            targets = [other for other in self._peers if other != sender]
        else:
            if self._broadcast + 1 >= SEQUENCE_LIMIT:
                raise TransportError("controller: broadcast numbers exhausted (2**32 updates)")
            self._broadcast += 1
            targets = [child for child in self._mesh.children(ROOT) if child in self._peers]
            # signed once, for every relay below: none can forge, replace or renumber it (item 4)
            frame = bytes(endorsed_frame(self._key, frame, self._signer, self._broadcast))
        for target in targets:
            ident = self._peers.get(target)
            if ident is None:  # dropped while relaying to an earlier target
                continue
            # one copy per recipient: it names the recipient and (PLAIN) carries its link number
            relayed = relayed_frame(self._key, frame, recipient=target, broadcast=self._number(target))
            if self._send(ident, relayed):
                self.counters.update_bytes += len(relayed)
                self.counters.update_frames += 1


__all__ = ["Controller"]
