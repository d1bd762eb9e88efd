"""Crowds against the controller (issue 37): thousands of MESH workers vanishing at once, thousands of
idle strangers holding connections. Fake peers are bare ZeroMQ sockets speaking the wire protocol."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import zmq
from wire_helpers import (
    CONTROLLER_KEY,
    CURVE_KEY,
    FAST,
    REFERENCE,
    SECRET,
    controller,
    curve_client,
    relay_hello,
    sparse_message,
    wait_until,
)

from sparkgrad.transport import (
    FrameKey,
    MessageType,
    WorkerConnection,
    ZmqTransportConfiguration,
    decode_frame,
    encode_frame,
)

pytestmark = pytest.mark.distributed

KEY = FrameKey(SECRET)
CROWD = 2000


def _dealer(ctx: zmq.Context, port: int, reconnect_ms: int = 100) -> zmq.Socket:
    sock = curve_client(ctx.socket(zmq.DEALER))
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, reconnect_ms)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _hello(sock: zmq.Socket, job: int, worker: int, relay: str) -> None:
    body = json.dumps(relay_hello(relay)).encode()
    sock.send(bytes(encode_frame(KEY, MessageType.HELLO, job, worker, 0, body)))


def _until(sock: zmq.Socket, kind: MessageType, timeout_ms: int = 20000) -> None:
    """Read frames until one of ``kind`` arrives (a bound, not a timing assertion)."""
    while sock.poll(timeout_ms, zmq.POLLIN):
        if decode_frame(sock.recv(), KEY)[0].message_type == kind:
            return
    raise AssertionError(f"no {kind.name} within the bound")


@pytest.mark.parametrize("who", ["honest workers lost without BYE", "an insider's held connections"])
def test_two_thousand_mesh_workers_vanishing_at_once_do_not_kill_the_controller(
    free_port: int, who: str
) -> None:
    """A MESH controller re-parented the children of a vanished worker by sending them frames; a send to
    another vanished worker dropped that one, recursively: 250 to 800 workers lost at once made the next
    HELLO raise RecursionError in the controller thread (_send, _forget, _mesh_leave, _assign_children,
    _send, ...), and the fit was lost. Leaves are now queued and handled in a loop."""
    job = 0x3701
    config = ZmqTransportConfiguration(
        connect_timeout_ms=FAST.connect_timeout_ms,
        sync_timeout_ms=FAST.sync_timeout_ms,
        poll_interval_ms=FAST.poll_interval_ms,
        max_connections=4 * CROWD,
    )
    with controller(np.zeros(8, np.float32), job, free_port, config=config, mesh=True) as ctl:
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 4 * CROWD)
        survivors = [_dealer(ctx, free_port) for _ in range(3)]
        crowd: list[zmq.Socket] = []
        try:
            for worker, sock in enumerate(survivors, start=1):  # the root's first children
                _hello(sock, job, worker, f"127.0.0.1:{20000 + worker}")
                _until(sock, MessageType.PARAMS)
            for worker in range(len(survivors) + 1, len(survivors) + 1 + CROWD):
                sock = _dealer(ctx, free_port)
                crowd.append(sock)
                # honest workers each report their own relay socket; the insider one address for all
                relay = f"127.0.0.1:{20000 + worker % 40000}" if who.startswith("honest") else "127.0.0.1:9"
                _hello(sock, job, worker, relay)
                _until(sock, MessageType.PARAMS)  # one after the other: the same tree on every run
            assert wait_until(lambda: len(ctl.workers_seen) == CROWD + len(survivors), timeout_s=120)
            for sock in crowd:  # they vanish at once, without BYE
                sock.close()
            assert wait_until(lambda: ctl._connections.live == len(survivors), timeout_s=60)
            # a survivor finishes: its children, vanished workers, move up, which sends to vanished ones
            survivors[0].send(bytes(encode_frame(KEY, MessageType.BYE, job, 1, 1, b"")))
            late = _dealer(ctx, free_port)
            survivors.append(late)
            _hello(late, job, 99_999, "127.0.0.1:19999")  # its parent is a vanished worker: the cascade
            _until(late, MessageType.PARAMS)
            assert ctl.error is None
            assert ctl.counters.dropped_reasons.get("gone", 0) >= 20  # a chain of leaves, handled in a loop
            # the rest are still served: an update is applied and relayed, a SYNC acknowledged
            message = sparse_message([0], [1], 8, 0.5)
            frame = encode_frame(KEY, MessageType.UPDATE, job, 2, 1, message.tobytes(), iteration=1)
            survivors[1].send(bytes(frame))
            assert wait_until(lambda: ctl.updates_applied == 1)
            survivors[1].send(bytes(encode_frame(KEY, MessageType.SYNC, job, 2, 2, b"{}")))
            _until(survivors[1], MessageType.SYNC_ACK)
            assert ctl.params()[0] == -0.5 and ctl.error is None
        finally:
            for sock in survivors + crowd:
                sock.close()
            ctx.term()


def test_two_thousand_idle_strangers_do_not_lock_an_honest_worker_out(free_port: int) -> None:
    """A stranger without the key held max_connections (1024) idle connections and every honest HELLO
    then went unanswered. Connections that do not authenticate are now bounded: one address holds at most
    max_unauthenticated_per_address of them, past max_connections the oldest is closed to make room, and
    none outlives connect_timeout_ms. 1,000 idle ZeroMQ peers and 1,000 bare TCP connections (no
    greeting at all), all from 127.0.0.1 like the honest worker: it joins within its timeout."""
    job = 0x3702
    config = ZmqTransportConfiguration(connect_timeout_ms=5000, sync_timeout_ms=5000, poll_interval_ms=10)
    assert config.max_connections == 1024 and config.max_unauthenticated_per_address == 32
    with controller(np.zeros(4, np.float32), job, free_port, config=config) as ctl:
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 2 * CROWD)
        idle: list[zmq.Socket] = []
        bare: list[socket.socket] = []
        worker = None
        try:
            for _ in range(CROWD // 2):
                # idle: a stranger that reconnects as fast as it is closed floods instead (security guide)
                idle.append(_dealer(ctx, free_port, reconnect_ms=600_000))
                bare.append(socket.create_connection(("127.0.0.1", free_port)))
            assert wait_until(lambda: ctl._connections.accepted >= CROWD, timeout_s=60)
            assert ctl._connections.unauthenticated <= config.max_unauthenticated_per_address
            worker = WorkerConnection(
                "127.0.0.1",
                free_port,
                job,
                1,
                SECRET,
                4,
                config,
                controller_key=CONTROLLER_KEY,
                curve_key=CURVE_KEY,
                threshold_reference=REFERENCE,
            )
            params, _, _ = worker.hello({})  # raises TransportError if no answer within 5 s
            assert params is not None and ctl.workers_seen == {1}
            # the strangers' connections are closed, counted; the honest one stays
            assert wait_until(lambda: ctl._connections.unauthenticated == 0, timeout_s=30)
            assert wait_until(lambda: ctl._connections.live == 1, timeout_s=30)
            dropped = ctl.counters.dropped_reasons
            assert dropped.get("address_limit", 0) >= CROWD - 2 * config.max_unauthenticated_per_address
            assert (
                sum(dropped.get(r, 0) for r in ("address_limit", "auth_timeout", "connection_limit")) >= CROWD
            )
            bare[-1].settimeout(10)
            while bare[-1].recv(64):  # the ZMTP greeting, then the end: the controller closed it
                pass
            assert ctl.error is None
        finally:
            if worker is not None:
                worker.close()
            for sock in idle:
                sock.close()
            for raw in bare:
                raw.close()
            ctx.term()
