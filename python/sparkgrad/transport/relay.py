"""A MESH node's relay duties toward its children (:mod:`sparkgrad.transport.mesh` describes the tree).

Every MESH worker binds a ROUTER socket (its relay socket), reports it in HELLO, and forwards each new
update it gets from its parent to its children, re-signed for each child with itself as the relay.

Link rules of the relay socket (wire version 3, issue 21): it takes only MESH_JOIN and BYE addressed
to this relay (else ``unexpected`` or ``misdirected``), each new for its sender (``replay``), and it
registers only the children the controller assigned it in its latest MESH_CHILDREN. A MESH_JOIN from
any other id (a captured MESH_JOIN replayed from another relay's link, or one whose assignment is still
on its way) is held, at most ``mesh_fan_out`` of them, the oldest dropped as ``unassigned``; a later
MESH_CHILDREN naming it registers it. Before the tag, the header's size, type and payload length are
checked (a relay socket takes control payloads only), so a malformed or oversized frame costs no HMAC.

Slow children: the relay queues at most ``max_queued_bytes`` of relayed updates per child (in whole
frames of the largest update). A child whose queue is full is dropped (no more relays; counted
``queue_full`` in ``TrafficCounters.dropped_reasons``) and told to re-join with an ERROR carrying
``"rejoin": true``, retried until it can be queued.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import zmq

from sparkgrad.errors import TransportError
from sparkgrad.transport.frame import (
    CONTROL_PAYLOAD_LIMIT,
    CONTROLLER_ID,
    HEADER_SIZE,
    FrameKey,
    FrameRejected,
    MessageType,
    Replay,
    decode_frame,
    encode_frame,
    json_payload,
    max_update_bytes,
    parse_json_payload,
    relayed_frame,
)
from sparkgrad.transport.limits import (
    Curve,
    TrafficCounters,
    ZmqTransportConfiguration,
    bounded_socket,
    is_count,
)

# a MESH relay socket in HELLO: host name, IPv4 or bracketed IPv6, and a port
_RELAY_ADDRESS = re.compile(r"(?:[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?:[1-9][0-9]{0,4})")
_CURVE_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")  # Z85 of 32 bytes


def curve_key_ok(value: object) -> bool:
    """A CURVE public key as a HELLO or MESH_PARENT carries it: 40 characters of Z85."""
    return isinstance(value, str) and bool(_CURVE_KEY.fullmatch(value))


def relay_address_ok(value: object) -> bool:
    """A MESH relay socket address from HELLO: "host:port" with a port in [1, 65535]."""
    return (
        isinstance(value, str)
        and bool(_RELAY_ADDRESS.fullmatch(value))
        and int(value.rsplit(":", 1)[1]) < 65536
    )


class MeshRelay:
    """The relay half of a MESH node, mixed into :class:`~sparkgrad.transport.worker.WorkerConnection`
    (which owns the key, the sequence numbers, the counters and the context it uses)."""

    _key: FrameKey
    _config: ZmqTransportConfiguration
    _ctx: zmq.Context
    _seq: int
    _num_params: int
    job_id: int
    worker_id: int
    endpoint: str
    counters: TrafficCounters
    _rejected: Callable[[FrameRejected], None]  # counts a dropped frame

    def _open_relay(self, relay_host: str | None, encrypt: bool) -> None:
        """The relay state; with ``relay_host`` (MESH), bind the relay socket on an ephemeral port, with
        ``encrypt`` a CURVE server with a key pair of its own (:attr:`relay_key`, told the controller)."""
        self._router: zmq.Socket | None = None
        self._children: dict[int, bytes] = {}
        self._assigned: set[int] = set()  # the children the controller assigned (MESH_CHILDREN)
        self._pending_joins: dict[int, bytes] = {}  # MESH_JOINs of children not (yet) assigned
        self._child_replay = Replay()
        self._child_rejoin: dict[int, bytes] = {}
        self.relay_endpoint: str | None = None
        self.relay_key: bytes | None = None
        if relay_host is None:
            return
        curve = Curve.new_server() if encrypt else None
        # children send only control frames; a child that does not read may hold at most
        # max_queued_bytes of relayed updates here before it is dropped (queue_full)
        router = bounded_socket(
            self._ctx,
            zmq.ROUTER,
            self._config,
            HEADER_SIZE + CONTROL_PAYLOAD_LIMIT,
            HEADER_SIZE + max(max_update_bytes(self._num_params), CONTROL_PAYLOAD_LIMIT),
            curve,
        )
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            port = router.bind_to_random_port(f"tcp://{relay_host}")
        except zmq.ZMQError as exc:
            router.close()
            raise TransportError(
                f"worker {self.worker_id}: cannot bind a MESH relay socket on {relay_host}: {exc}"
            ) from exc
        self._router = router
        self.relay_endpoint = f"{relay_host}:{port}"
        self.relay_key = None if curve is None else curve.public

    @property
    def children(self) -> list[int]:
        """MESH: the ids of the workers this one relays to."""
        return list(self._children)

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
                self.counters.drop("queue_full")
                continue
            except zmq.ZMQError:  # gone
                del self._children[child]
                self.counters.drop("gone")
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
            and all(is_count(c) and c != CONTROLLER_ID for c in children)
        ):
            raise TransportError(f"worker {self.worker_id}: bad MESH_CHILDREN from the controller: {body!r}")
        self._assigned = set(children)
        for child in list(self._children):
            if child not in self._assigned:
                del self._children[child]
        for child in list(self._pending_joins):
            if child in self._assigned:
                self._children[child] = self._pending_joins.pop(child)


__all__ = ["MeshRelay", "relay_address_ok"]
