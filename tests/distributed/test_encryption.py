"""CURVE encryption of every link (issue 37, item 6): what a passive tap on the wire sees with
``ZmqTransportConfiguration(encrypt=True)`` and without it, on a controller link and on a MESH relay
link."""

from __future__ import annotations

import dataclasses
import socket
import threading

import numpy as np
import pytest
import zmq
from wire_helpers import FAST, REFERENCE, SECRET, controller, raw_dealer, sparse_message, wait_until

from sparkgrad.transport import (
    FrameKey,
    MessageType,
    WorkerConnection,
    ZmqTransportConfiguration,
    encode_frame,
)
from sparkgrad.transport.frame import MAGIC

pytestmark = pytest.mark.distributed

PATTERN = np.full(64, 1234.5678, np.float32)  # the parameters: their bytes are easy to spot on the wire


class _Tap:
    """A TCP relay between a worker and the controller (or its MESH parent) that keeps a copy of every
    byte both ways."""

    def __init__(self, target_port: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._target = target_port
        self.seen = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        inside, _ = self._listener.accept()
        outside = socket.create_connection(("127.0.0.1", self._target))
        for a, b in ((inside, outside), (outside, inside)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_tap_on_the_wire_reads_the_parameters_only_without_encryption(
    free_port: int, encrypt: bool
) -> None:
    """Frames are authenticated, not encrypted: anyone on the path read the parameters and every update.
    With encrypt=True the controller is a CURVE server and workers connect with its public key: the same
    tap sees none of the parameters' bytes, and the worker still gets them exactly."""
    config = dataclasses.replace(FAST, encrypt=encrypt)
    with controller(PATTERN, 0x3711, free_port, config=config) as ctl:
        assert (ctl.curve_key is not None) == encrypt
        tap = _Tap(free_port)
        conn = WorkerConnection(
            "127.0.0.1",
            tap.port,
            0x3711,
            1,
            SECRET,
            PATTERN.size,
            config,
            controller_key=ctl.controller_key,
            curve_key=ctl.curve_key,
            threshold_reference=REFERENCE,
        )
        try:
            params, _, _ = conn.hello({})
            np.testing.assert_array_equal(params, PATTERN)
            conn.send_update(sparse_message([3], [1], PATTERN.size, 0.5), 1, 0)
            conn.sync(lambda h, m: None)
        finally:
            conn.close()
            tap.close()
        assert ctl.updates_applied == 1
        assert (PATTERN.tobytes()[:64] in tap.seen) != encrypt


def test_a_peer_without_the_curve_handshake_is_not_heard(free_port: int) -> None:
    """An encrypting controller takes no frame from a peer speaking in the clear (the handshake fails
    before any frame), even one with the fit's key."""
    config = ZmqTransportConfiguration(
        connect_timeout_ms=800, sync_timeout_ms=3000, poll_interval_ms=10, encrypt=True
    )
    with controller(PATTERN, 0x3712, free_port, config=config) as ctl:
        ctx = zmq.Context()
        sock = raw_dealer(ctx, free_port, server_key=None)
        try:
            sock.send(bytes(encode_frame(FrameKey(SECRET), MessageType.HELLO, 0x3712, 1, 0, b"{}")))
            assert not sock.poll(1000)
            assert wait_until(lambda: ctl._connections.accepted >= 1)
            assert ctl.counters.messages_received == 0 and ctl.workers_seen == set()
        finally:
            sock.close()
            ctx.term()
    with pytest.raises(ValueError, match="encrypt"):
        ZmqTransportConfiguration(encrypt=1)


def test_the_largest_frame_crosses_an_encrypted_link(free_port: int) -> None:
    """The hang of the first attempt (an encrypted Spark fit waiting in end_epoch forever): ZeroMQ checks
    MAXMSGSIZE against the frame on the wire, which CURVE makes 33 bytes longer, so the largest
    legitimate frame (here the worker's UPDATER_STATE, the job's largest) made the controller's libzmq
    drop the connection and everything queued behind it (the EPOCH_END) without a word. The size limit
    now allows the cipher's overhead: the report is stored and the connection lives on."""
    state = np.arange(1 << 17, dtype=np.float64)  # 1 MiB: larger than every other frame of the job
    config = dataclasses.replace(FAST, encrypt=True)
    with controller(PATTERN, 0x3713, free_port, config=config, updater_state=np.zeros_like(state)) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            free_port,
            0x3713,
            1,
            SECRET,
            PATTERN.size,
            config,
            updater_state_bytes=state.nbytes,
            controller_key=ctl.controller_key,
            curve_key=ctl.curve_key,
            threshold_reference=REFERENCE,
        )
        try:
            conn.hello({})
            conn.send_updater_state(state, iteration=1)
            conn.sync(lambda h, m: None)  # ZeroMQ order: the report is stored before the ACK
        finally:
            conn.close()
        assert ctl.updater_state_reports == 1
        np.testing.assert_array_equal(ctl.updater_state(), state)


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_tap_on_a_mesh_relay_link_reads_frames_only_without_encryption(
    free_port: int, encrypt: bool
) -> None:
    """MESH relay links are encrypted too: each relay is a CURVE server with a key pair of its own, which
    it tells the controller in its (authenticated) HELLO and the controller tells its children in their
    (signed) MESH_PARENT. A tap between a relay and its child sees every frame header in the clear and
    none encrypted, and the child still gets the relayed update."""
    config = dataclasses.replace(FAST, encrypt=encrypt, mesh_fan_out=1)
    with controller(np.zeros(64, np.float32), 0x3714, free_port, config=config, mesh=True) as ctl:
        conns, tap = [], None
        try:
            for wid in (1, 2, 3):  # fan-out 1: the root's child 1, its child 2, its child 3
                conn = WorkerConnection(
                    "127.0.0.1",
                    free_port,
                    0x3714,
                    wid,
                    SECRET,
                    64,
                    config,
                    relay_host="127.0.0.1",
                    on_params=lambda params, iteration, epoch: None,
                    controller_key=ctl.controller_key,
                    curve_key=ctl.curve_key,
                    threshold_reference=REFERENCE,
                )
                conns.append(conn)
                if wid == 1:  # its children reach it through the tap
                    assert (conn.relay_key is not None) == encrypt
                    assert conn.relay_endpoint is not None
                    tap = _Tap(int(conn.relay_endpoint.rsplit(":", 1)[1]))
                    conn.relay_endpoint = f"127.0.0.1:{tap.port}"
                conn.hello({})
            got: list[int] = []

            def pump() -> bool:
                conns[0].drain(lambda h, m: None)
                conns[1].drain(lambda h, m: got.append(h.sender))
                conns[2].drain(lambda h, m: None)
                return conns[0].children == [2]

            assert wait_until(pump)  # worker 1 registered its child before the update flows
            conns[2].send_update(sparse_message(list(range(0, 64, 2)), [1] * 32, 64, 0.5), 1, 0)
            assert wait_until(lambda: pump() and 3 in got)  # worker 2 applied 3's update, relayed by 1
            assert conns[1].parent_id == 1
        finally:
            for conn in conns:
                conn.close()
            if tap is not None:
                tap.close()
        assert tap is not None and (MAGIC in tap.seen) != encrypt
