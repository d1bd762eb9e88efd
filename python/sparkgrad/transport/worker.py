"""A worker's end of gradient sharing: its DEALER connection to the controller and, in MESH, to its
parent in the relay tree (the relay socket toward its children is :mod:`.relay`).

A worker says HELLO and takes the controller's parameters; it sends its own UPDATEs, SYNCs and epoch
reports to the controller and applies the updates the controller (PLAIN) or its MESH parent relays.
Every socket has LINGER 0 and every wait is bounded, so no failure mode hangs.

Link rules (wire versions 3 and 4, issue 21). On top of the tag, job, recipient (``misdirected``) and
replay checks of :mod:`.frame`, a worker takes from each link only what that link may carry, else drops
it and counts it (reasons in brackets):

- on its controller connection: control frames (PARAMS, UPDATER_STATE, SYNC_ACK, BYE, ERROR, EPOCH_GO,
  MESH_PARENT, MESH_CHILDREN, and AVERAGED when it averages) only from sender 0, and UPDATEs only
  relayed by the controller (``link``), never its own in PLAIN (``own_update``); every control frame must
  carry the controller's Ed25519 signature (``bad_signature``, :mod:`.signing`); PLAIN: each frame must
  carry the next link number (``stale``; a ``gap`` makes it re-join, see :mod:`.frame`);
- on its MESH parent's connection: only UPDATEs relayed by that parent and the parent's own re-join
  ERROR (``link``): an EPOCH_GO or PARAMS from a parent is refused;
- every received UPDATE must name strictly ascending indices (``unordered``; the worker re-joins, as
  for ``non_finite``), and must pass the threshold bound of the fit's reference
  (``threshold``, :func:`~sparkgrad.transport.limits.check_update_threshold`); a worker that averages
  parameters takes no UPDATE (``link``);
- an UPDATE after which the owner finds a parameter non-finite (its ``on_update`` raises
  ``FrameRejected("non_finite")``, as ``SharedWorker`` does) is counted (``non_finite``) and the worker
  re-joins (:class:`RejoinRequired`), taking the controller's parameters, which never included it.

Before the tag, the header's size, type and payload length are checked against the largest payload the
worker takes of that type (``oversized``), so a malformed or oversized frame costs no HMAC.

A controller that dropped this worker (its queue was full) answers with an ERROR carrying
``"rejoin": true``: :class:`RejoinRequired` is raised and the owner must HELLO again and take the
controller's parameters (``SharedWorker`` does). So is a controller connection that closed under the
worker (ZeroMQ closes one on a protocol error, e.g. a frame over the other side's size limit, and
reconnects by itself): frames sent or relayed on it may be lost, and the worker would otherwise learn it
only when a wait for an answer timed out (an epoch end's after ``epoch_timeout_ms``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from sparkgrad._config import check_int
from sparkgrad.errors import CorruptDataError, TransportError
from sparkgrad.transport.frame import (
    CONTROL_PAYLOAD_LIMIT,
    CONTROLLER_ID,
    HEADER_SIZE,
    NO_RELAY,
    SIGNATURE_SIZE,
    Flag,
    FrameKey,
    FrameRejected,
    Header,
    MessageType,
    Replay,
    averaging_payload,
    decode_frame,
    encode_frame,
    encode_update_payload,
    float_flag,
    json_payload,
    max_averaging_bytes,
    max_update_bytes,
    params_payload,
    parse_averaging_payload,
    parse_json_payload,
    update_header,
    update_payload,
)
from sparkgrad.transport.limits import (
    SEQUENCE_LIMIT,
    Curve,
    TrafficCounters,
    ZmqTransportConfiguration,
    bounded_socket,
    check_update_entries,
    check_update_threshold,
    endpoint,
    is_count,
    owned_context,
)
from sparkgrad.transport.relay import MeshRelay, curve_key_ok, relay_address_ok
from sparkgrad.transport.signing import ControllerVerifier


class RejoinRequired(TransportError):
    """The controller dropped this worker (it fell behind): HELLO again and take its parameters."""


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


class WorkerConnection(MeshRelay):
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
        threshold_reference: the fit's reference threshold (required, keyword only): a received UPDATE
            whose threshold the controller's bound would refuse is dropped (reason ``threshold``) instead
            of applied (a MESH parent could forge one). None only with ``average_values`` (parameter
            averaging takes no UPDATE at all: every one is refused, reason ``link``).
        average_values: parameter averaging (:meth:`average`): the floats an AVERAGED vector holds (the
            parameters, then the updater state when it is averaged); 0 (gradient sharing): AVERAGED
            frames are refused (``link``).
        controller_key: the fit's controller's Ed25519 public key (``Controller.controller_key``): every
            frame from the controller (sender 0) must carry its signature (:mod:`.signing`).
        curve_key: the controller's CURVE public key (``Controller.curve_key``): required when
            ``config.encrypt`` (the default), which encrypts this worker's every link; None only without.
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
        average_values: int = 0,
        *,
        controller_key: bytes,
        threshold_reference: float | None,
        curve_key: bytes | None = None,
    ) -> None:
        if not 0 < worker_id < 2**32:
            raise ValueError(f"worker_id must be in [1, 2**32), got {worker_id}")
        if threshold_reference is None:
            if not average_values:
                raise ValueError(
                    "threshold_reference: None (no bound on received updates) only with average_values"
                )
        elif not (isinstance(threshold_reference, (int, float)) and 0 < threshold_reference < math.inf):
            raise ValueError(f"threshold_reference: must be a finite number > 0, got {threshold_reference!r}")
        if relay_host is not None and on_params is None:
            raise ValueError("on_params: required with relay_host (MESH replaces the parameters on a resync)")
        self._num_params = check_int("num_params", num_params, minimum=1)
        self._key = FrameKey(secret)
        self._verifier = ControllerVerifier(controller_key)
        self._config = config or ZmqTransportConfiguration()
        self.endpoint = endpoint(host, port)
        self.job_id, self.worker_id = job_id, worker_id
        self.counters = TrafficCounters()
        self._last_rejection = ""
        self._threshold_reference = threshold_reference
        self._link_next: int | None = None  # PLAIN: the number the controller's next frame must carry
        self._replay = Replay()
        self._seq = 0
        self._ctx, self._release = owned_context(self)  # released by close(), or when collected without it
        self._average_values = check_int("average_values", average_values, minimum=0)
        self._max_state_payload = max(8 * num_params, updater_state_bytes)  # PARAMS, UPDATER_STATE
        # the controller's frames end with its signature
        self._max_frame = (
            HEADER_SIZE
            + max(
                self._max_state_payload,
                max_update_bytes(num_params),
                CONTROL_PAYLOAD_LIMIT,
                max_averaging_bytes(average_values) if average_values else 0,
            )
            + SIGNATURE_SIZE
        )
        max_sent_frame = HEADER_SIZE + max(
            max_update_bytes(num_params), CONTROL_PAYLOAD_LIMIT, updater_state_bytes
        )
        encrypt = (config or ZmqTransportConfiguration()).encrypt
        if encrypt != (curve_key is not None):
            raise ValueError(
                "curve_key: the controller's CURVE public key is required with encrypt=True (the default) "
                f"and refused without it, got {'None' if curve_key is None else 'a key'} with "
                f"encrypt={encrypt}"
            )
        self._encrypt = encrypt
        curve = None if curve_key is None else Curve.client_of(curve_key)
        self._sock = bounded_socket(
            self._ctx, zmq.DEALER, self._config, self._max_frame, max_sent_frame, curve
        )
        self._sock.setsockopt(zmq.SNDTIMEO, self._config.sync_timeout_ms)
        # ZeroMQ's events of the controller connection: a DISCONNECTED one means frames may be lost
        self._link_events = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._sock.connect(self.endpoint)
        self._closed = False
        # MESH state (module docstring of sparkgrad.transport.mesh)
        self._on_params = on_params
        self._parent: zmq.Socket | None = None
        self.parent_id: int | None = None  # None: the controller (or PLAIN)
        self._parent_replay = Replay()  # control frames of the parent itself (not relayed updates)
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
        try:
            self._open_relay(relay_host, self._encrypt)
        except TransportError:
            self._release()
            raise

    @property
    def mesh(self) -> bool:
        """Whether this worker is a node of a MESH relay tree."""
        return self._router is not None

    def _send(
        self,
        kind: MessageType,
        payload: bytes | memoryview = b"",
        sock: zmq.Socket | None = None,
        **kw: object,
    ) -> int:
        if self._seq >= SEQUENCE_LIMIT:
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
        poller.register(self._link_events, zmq.POLLIN)
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
            if self._link_events in ready and self._sock not in ready:  # what arrived before, first
                self._check_link_events()
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
                    self._check_link(header, payload, frame, from_parent, peer)
                except FrameRejected as exc:
                    self._rejected(exc)
                    continue
                return header, payload, frame, from_parent

    def _check_link_events(self) -> None:
        """Raises :class:`RejoinRequired` when the controller connection has closed since the last look:
        whatever was in flight on it may be lost (ZeroMQ reconnects by itself; the HELLO of the
        re-join takes the controller's parameters)."""
        closed = False
        while self._link_events.poll(0):
            closed |= recv_monitor_message(self._link_events)["event"] == zmq.EVENT_DISCONNECTED
        if closed:
            raise RejoinRequired(
                f"worker {self.worker_id}: the connection to controller {self.endpoint} closed (a frame "
                "refused by ZeroMQ on either side, or the network); frames on it may be lost: re-joining"
            )

    def _max_payload(self, kind: MessageType) -> int:
        if kind == MessageType.UPDATE:
            return max_update_bytes(self._num_params)
        if kind in (MessageType.PARAMS, MessageType.UPDATER_STATE):
            return self._max_state_payload
        if kind == MessageType.AVERAGED:
            return max_averaging_bytes(self._average_values) if self._average_values else 0
        return CONTROL_PAYLOAD_LIMIT

    def _check_link(
        self, header: Header, payload: memoryview, frame: bytes, from_parent: bool, peer: str
    ) -> None:
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
            if self._threshold_reference is None:  # parameter averaging: no UPDATE is ever relayed
                raise FrameRejected("link", f"UPDATE from {peer} to a worker that averages parameters")
            check_update_threshold(
                update_header(payload), self._threshold_reference, f"worker {header.sender} via {peer}"
            )
            if self.mesh and not (header.flags & Flag.SIGNED and self._verifier.verify_origin(frame)):
                raise FrameRejected(  # a relay forged or altered it (or renumbered): a gap follows
                    "bad_signature",
                    f"UPDATE from worker {header.sender} via {peer} without the controller's signature",
                )
        elif from_parent:
            if kind != MessageType.ERROR or header.sender != self.parent_id:
                raise FrameRejected(
                    "link",
                    f"{kind.name} from worker {header.sender} on the link of {peer}: "
                    "only the controller may send it",
                )
        elif header.sender != CONTROLLER_ID or (
            kind not in _FROM_CONTROLLER and not (kind == MessageType.AVERAGED and self._average_values)
        ):
            raise FrameRejected("link", f"{kind.name} from worker {header.sender} on the link of {peer}")
        elif not (header.flags & Flag.SIGNED and self._verifier.verify(frame)):
            raise FrameRejected(
                "bad_signature", f"{kind.name} from {peer} does not carry the controller's signature"
            )
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

    def _deliver(
        self, on_update: Callable[[Header, np.ndarray], None], header: Header, payload: memoryview
    ) -> None:
        """Hand a received update to the owner. An owner that finds its parameters broken by it (non-finite
        after applying it) raises FrameRejected: counted, and this worker re-joins for the controller's
        parameters, which never included it (the controller refuses such an update before relaying)."""
        peer = f"worker {header.sender}"
        try:
            message = update_payload(header, payload, peer)
            check_update_entries(message, peer)  # the controller relays none such: a MESH relay forged it
            on_update(header, message)
        except FrameRejected as exc:
            self._rejected(exc)
            raise RejoinRequired(
                f"worker {self.worker_id}: {exc}; re-join for the controller's parameters"
            ) from exc

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

    def _set_parent(self, payload: memoryview, resync: bool) -> None:
        """Connect to the parent the controller named (MESH_PARENT) and register with it."""
        try:
            body = parse_json_payload(payload, peer=f"controller {self.endpoint}")
            target, parent_id, key = body.get("parent"), body.get("id"), body.get("key")
            if target is not None and not (
                isinstance(target, str)
                and target.startswith("tcp://")
                and relay_address_ok(target[6:])
                and is_count(parent_id)
                and (curve_key_ok(key) if self._encrypt else key is None)
            ):
                raise FrameRejected("control", f"MESH_PARENT names no valid parent: {body!r}")
        except FrameRejected as exc:
            raise TransportError(
                f"worker {self.worker_id}: bad MESH_PARENT from the controller: {exc}"
            ) from exc
        if self._parent is not None:
            self._parent.close()
        self._parent, self.parent_id, self._parent_replay = None, None, Replay()
        if target is not None:
            self._parent = bounded_socket(
                self._ctx,
                zmq.DEALER,
                self._config,
                self._max_frame,
                HEADER_SIZE + CONTROL_PAYLOAD_LIMIT,
                None if key is None else Curve.client_of(str(key).encode()),
            )
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
                self._deliver(on_update, *result)

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
                self._deliver(on_update, header, payload)

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
            if self.relay_key is not None:
                info["relay_key"] = self.relay_key.decode()
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

    def send_updater_state(self, state: np.ndarray, iteration: int, final: bool = False) -> int:
        """Report this worker's flat updater state: what a joining worker will start from, or with
        ``final`` its state at its task's end, which the controller keeps per worker for the driver."""
        state = np.ascontiguousarray(state, dtype=state.dtype.newbyteorder("<"))
        return self._send(
            MessageType.UPDATER_STATE,
            state.data.cast("B"),
            iteration=iteration,
            flags=float_flag(state) | (Flag.FINAL if final else Flag.NONE),
        )

    def send_update(self, message: np.ndarray, iteration: int, epoch: int) -> int:
        """Send one encoded int32 update, packed when that is smaller; returns the frame size in bytes."""
        payload, flags = encode_update_payload(message)
        size = self._send(MessageType.UPDATE, payload, iteration=iteration, epoch=epoch, flags=flags)
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
                self._deliver(on_update, header, payload)
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

    def average(
        self, epoch: int, round_index: int, report: dict[str, object], values: np.ndarray | None
    ) -> tuple[dict[str, object], np.ndarray | None]:
        """Contribute to an averaging round and wait for its mean (parameter averaging).

        Args:
            epoch: the epoch.
            round_index: the round within the epoch.
            report: ``{"partition", "minibatches", "score"}`` (module docstring of :mod:`.frame`).
            values: this worker's parameters after the round (then its updater state when the fit
                averages it); None when its partition had no data in the round.

        Returns:
            (the controller's ``{"iteration", "workers", "score"}``, a copy of the mean vector, or None
            when no worker had data in the round). Raises TransportError when no mean arrives within
            ``epoch_timeout_ms`` or the controller refused the contribution.
        """
        flags = Flag.NONE if values is None else float_flag(values)
        self._send(
            MessageType.AVERAGE,
            averaging_payload(report, values),
            epoch=epoch,
            iteration=round_index,
            flags=flags,
        )
        what = f"AVERAGE of epoch {epoch} round {round_index}"
        while True:
            header, payload = self._wait_for(
                (MessageType.AVERAGED,), self._config.epoch_timeout_ms, None, what
            )
            if (header.epoch, header.iteration) != (epoch, round_index):
                continue  # not this round's (cannot happen in order; never taken for it)
            try:
                body, mean = parse_averaging_payload(header, payload, f"controller {self.endpoint}")
            except FrameRejected as exc:
                raise TransportError(f"worker {self.worker_id}: bad AVERAGED: {exc}") from exc
            if not is_count(body.get("iteration")) or (
                mean is not None and mean.size != self._average_values
            ):
                raise TransportError(
                    f"worker {self.worker_id}: AVERAGED of {0 if mean is None else mean.size} values with "
                    f"{body!r}, expected {self._average_values} values and an iteration"
                )
            return body, None if mean is None else mean.copy()

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
        self._sock.disable_monitor()
        self._link_events.close()
        self._sock.close()
        self._release()


__all__ = ["RejoinRequired", "WorkerConnection"]
