"""Attacks on the gradient-sharing wire, each played end to end over 127.0.0.1 (issue 21).

Every test names the attack, plays it against a live controller (and workers), and asserts what the
target did: the frame was dropped under a named counter, the victim's values are exact, the controller
thread is alive. Each one fails on the code before issue 21.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable

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
    curve_server,
    raw_dealer,
    relay_hello,
    sparse_decode,
    sparse_message,
    wait_until,
    worker_job,
)

from sparkgrad import compress
from sparkgrad.errors import TransportError
from sparkgrad.transport import (
    HEADER_SIZE,
    THRESHOLD_GROWTH_LIMIT,
    FrameKey,
    MessageType,
    RejoinRequired,
    WorkerConnection,
    ZmqTransportConfiguration,
    decode_frame,
    encode_frame,
)
from sparkgrad.transport.frame import Flag, json_payload
from sparkgrad.transport.signing import ControllerSigner

pytestmark = pytest.mark.distributed

KEY = FrameKey(SECRET)


def _recv(sock: zmq.Socket, timeout_ms: int = 10000) -> bytes:
    assert sock.poll(timeout_ms, zmq.POLLIN), "no frame within the bound"
    return sock.recv()


# -- item 3: two worker ids on one connection, then a disconnect ------------------------------------
def test_a_second_worker_id_on_a_connection_is_refused_and_a_disconnect_cannot_kill_the_controller(
    free_port: int,
) -> None:
    """One faulty executor says HELLO as worker 11 and as worker 12 on the same connection (fan-out 1:
    12 would hang under 11), then disconnects. The second HELLO is refused; when the controller finds
    the connection gone it forgets 11 and keeps running, applying an honest worker's updates."""
    job, size = 0x3A, 4
    config = ZmqTransportConfiguration(connect_timeout_ms=3000, sync_timeout_ms=5000, poll_interval_ms=10)
    config.mesh_fan_out = 1
    with controller(np.zeros(size, np.float32), job, free_port, config=config, mesh=True) as ctl:
        ctx = zmq.Context()
        rogue = raw_dealer(ctx, free_port)
        honest = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            99,
            SECRET,
            size,
            config,
            relay_host="127.0.0.1",
            on_params=lambda params, iteration, epoch: None,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            hello = json_payload(relay_hello("127.0.0.1:9"))
            rogue.send(encode_frame(KEY, MessageType.HELLO, job, 11, 0, hello))
            kinds = [decode_frame(_recv(rogue), KEY)[0].message_type for _ in range(2)]
            assert kinds == [MessageType.MESH_PARENT, MessageType.PARAMS]
            rogue.send(encode_frame(KEY, MessageType.HELLO, job, 12, 0, hello))
            header, payload = decode_frame(_recv(rogue), KEY)
            assert header.message_type == MessageType.ERROR
            assert b"HELLO from worker 12 on the connection of worker 11" in bytes(payload)
            assert ctl.counters.rejected_reasons == {"identity_in_use": 1}
            rogue.close()
            honest.hello({})
            sent = 0
            # the controller relays each update to the root's child 11 until it finds the connection gone
            while ctl.counters.peers_dropped == 0 and sent < 200:
                honest.send_update(sparse_message([sent % size], [1], size, 0.25), sent + 1, 0)
                honest.sync(lambda h, m: None)
                sent += 1
            assert ctl.counters.peers_dropped == 1 and ctl.error is None
            honest.send_update(sparse_message([0], [1], size, 0.25), sent + 1, 0)
            honest.sync(lambda h, m: None)
            ctl.check()
            assert ctl.updates_applied == sent + 1
            assert ctl.mesh_tree() == {99: 0}
        finally:
            rogue.close()
            honest.close()
            ctx.term()


# -- item 5: hostile numbers in authenticated control payloads ---------------------------------------
@pytest.mark.parametrize(
    "report, match",
    [
        ({"loss": 10**400}, "integer 1000"),
        ({"loss": float("inf")}, "Infinity is not a number"),
        ({"loss": float("nan")}, "NaN is not a number"),
        ({"epoch_minibatches": -(2**63)}, "is not in"),
        ({"partition": 10**19, "minibatches": 1}, "is not in"),
    ],
)
def test_a_huge_or_non_finite_number_in_a_progress_report_is_refused_and_the_controller_lives(
    free_port: int, report: dict, match: str
) -> None:
    """An authenticated SYNC whose report holds a 400-digit integer killed the controller of a fit
    (float() overflow in the progress hook); every number is now checked while the payload is parsed."""
    from sparkgrad.spark.controller_fit import ProgressController
    from sparkgrad.spark.progress import FitProgress

    progress = FitProgress(1, 0, 10, 10, enabled=False)
    ctl = ProgressController(
        np.zeros(2, np.float32),
        0x5,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=1.0,
        progress=progress,
    )
    conn = WorkerConnection(
        "127.0.0.1",
        free_port,
        0x5,
        1,
        SECRET,
        2,
        FAST,
        controller_key=ctl.controller_key,
        curve_key=ctl.curve_key,
        threshold_reference=REFERENCE,
    )
    other = WorkerConnection(
        "127.0.0.1",
        free_port,
        0x5,
        2,
        SECRET,
        2,
        FAST,
        controller_key=ctl.controller_key,
        curve_key=ctl.curve_key,
        threshold_reference=REFERENCE,
    )
    try:
        conn.hello({})
        other.hello({})
        with pytest.raises(TransportError, match=match):
            conn.sync(lambda h, m: None, report=report)
        other.sync(lambda h, m: None, report={"loss": 0.5, "epoch_minibatches": 3})  # still serving
        ctl.check()
        assert ctl.counters.rejected_reasons == {"control": 1}
        assert progress.median_loss == 0.5
    finally:
        conn.close()
        other.close()
        ctl.close()


# -- item 6: the threshold bound must not ratchet; parameters stay finite ---------------------------
def test_thresholds_growing_15x_per_update_are_stopped_at_the_fits_reference_bound(free_port: int) -> None:
    """36 authenticated updates, each with 15x the threshold of the one before, drove a parameter to
    infinity with nothing rejected (the bound was 16x the sender's last accepted threshold). The bound
    never follows the sender: alone in the fit it is min(2**20 x the fit's reference, 1e6) (with other
    workers, test_insider_bounds.py). 15 .. 15**5 pass, 15**6 and beyond do not."""
    assert THRESHOLD_GROWTH_LIMIT == 2**20
    with controller(np.zeros(2, np.float32), 0x6, free_port) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            free_port,
            0x6,
            1,
            SECRET,
            2,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            conn.hello({})
            for k in range(1, 37):
                conn.send_update(sparse_message([0], [-1], 2, min(15.0**k, 3e38)), k, 0)  # float32 range
            with pytest.raises(
                TransportError, match=r"threshold 11390625.0: must be finite, > 0 and <= 1e\+06 "
            ):
                conn.sync(lambda h, m: None)
        finally:
            conn.close()
        assert wait_until(lambda: ctl.counters.frames_rejected == 31)
        np.testing.assert_array_equal(ctl.params(), [sum(15.0**k for k in range(1, 6)), 0.0])
        assert ctl.updates_applied == 5 and ctl.counters.rejected_reasons == {"threshold": 31}


def test_an_update_that_would_overflow_a_parameter_is_refused_naming_its_sender(free_port: int) -> None:
    """Defence in depth behind the threshold bound: an update whose decoded values overflow (here a
    decoder that scales them by 1e37, standing in for any path to a huge step) is checked before it is
    taken, counted under non_finite, and the parameters stay exactly as they were."""

    def scaling_decode(message: np.ndarray, target: np.ndarray) -> None:
        sparse_decode(message, target)
        with np.errstate(over="ignore"):
            target *= np.float32(1e37)

    start = np.zeros(16, np.float32)
    start[0] = 3e38
    with controller(start, 0x7, free_port, decode=scaling_decode) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            free_port,
            0x7,
            42,
            SECRET,
            16,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            conn.hello({})
            conn.send_update(sparse_message([0], [-1], 16, 1.0), 1, 0)  # 3e38 + 1e37: finite, applied
            conn.send_update(sparse_message([1], [-1], 16, 16.0), 2, 0)  # 1.6e38 at element 1: finite
            conn.send_update(sparse_message([0], [-1], 16, 4.0), 3, 0)  # 3.1e38 + 4e37 = inf
            with pytest.raises(
                TransportError, match="update from worker 42 .* would make parameters non-finite"
            ):
                conn.sync(lambda h, m: None)
        finally:
            conn.close()
        expected = start.copy()
        for threshold, index in ((1.0, 0), (16.0, 1)):
            expected[index] += np.float32(threshold) * np.float32(1e37)
        np.testing.assert_array_equal(ctl.params(), expected)
        assert np.isfinite(ctl.params()).all()
        assert ctl.updates_applied == 2 and ctl.counters.rejected_reasons == {"non_finite": 1}


def test_a_packed_update_that_does_not_unpack_is_refused_naming_its_sender(free_port: int) -> None:
    """A packed UPDATE carries a valid tag and bytes that do not unpack (a gap past the vector): refused
    as malformed naming its sender, counted, the parameters untouched; a PACKED flag on a control frame
    and a FINAL flag on an UPDATE are refused by the header alone. The same update packed and as raw int32
    words change the parameters alike."""
    n, job = 64, 0x11
    message = sparse_message([3, 9, 40], [1, -1, 1], n, 0.5)
    packed = compress.pack_message(message)
    assert packed is not None and len(packed) < message.nbytes
    with controller(np.zeros(n, np.float32), job, free_port) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            42,
            SECRET,
            n,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            conn.hello({})
            assert conn.send_update(message, 1, 0) == HEADER_SIZE + len(packed)
            conn._send(MessageType.UPDATE, message.data.cast("B"), iteration=2)  # raw, as a bitmap travels
            conn.sync(lambda h, m: None)
            expected = np.zeros(n, np.float32)
            expected[[3, 9, 40]] = np.float32(2 * 0.5) * np.array([-1, 1, -1], np.float32)  # params -= update
            np.testing.assert_array_equal(ctl.params(), expected)
            conn._send(MessageType.HELLO, b"{}", flags=Flag.PACKED)
            conn._send(MessageType.UPDATE, message.data.cast("B"), iteration=3, flags=Flag.FINAL)
            bad = bytearray(packed)
            bad[-1] = 0x7F  # the last gap now runs past element 63
            conn._send(MessageType.UPDATE, bytes(bad), iteration=3, flags=Flag.PACKED)
            with pytest.raises(
                TransportError, match="UPDATE from worker 42: .*addresses element 1[0-9]+ of a vector of 64"
            ):
                conn.sync(lambda h, m: None)
        finally:
            conn.close()
        np.testing.assert_array_equal(ctl.params(), expected)
        assert ctl.updates_applied == 2 and ctl.counters.rejected_reasons == {"malformed": 3}


# -- item 7: the JSON nesting pre-scan is linear; configuration text is size-limited -----------------
_SCAN = """
import sys
from sparkgrad._config import MAX_CONFIG_BYTES, _load_json
text = '"' + '\\\\"' * ((MAX_CONFIG_BYTES - 1) // 2)  # one unterminated string of escaped quotes
try:
    _load_json(text, "hostile")
except ValueError as exc:
    print(exc)
try:
    _load_json(text + "x" * 4, "hostile")
except ValueError as exc:
    print(exc)
"""


def test_the_nesting_scan_of_hostile_json_is_linear_and_oversized_text_is_refused() -> None:
    """A string of escaped quotes that never closes made the pre-scan quadratic (16 KB: 0.8 s, so the
    4 MiB accepted here would take about 15 hours). It is refused in a fraction of a second; the 120 s
    bound only keeps a regression from hanging the suite."""
    out = subprocess.run(
        [sys.executable, "-c", _SCAN], capture_output=True, text=True, timeout=120, check=True
    )
    first, second = out.stdout.splitlines()
    assert first.startswith("hostile: not valid JSON (Unterminated string")
    assert second == f"hostile: {4 * 2**20 + 3} bytes of configuration text exceed the limit of {4 * 2**20}"


# -- item 1: an on-path proxy without the key --------------------------------------------------------
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Hook = Callable[[bytes], list[bytes]]


class Proxy:
    """A forwarding proxy between one worker and the controller, without the key: it can drop, copy,
    reorder and inject captured frames. ``up``/``down`` map each frame (worker -> controller,
    controller -> worker) to what is forwarded; every frame is also recorded."""

    def __init__(self, controller_port: int, up: Hook | None = None, down: Hook | None = None) -> None:
        self.port = _port()
        self.up_frames: list[bytes] = []
        self.down_frames: list[bytes] = []
        self.inject: list[bytes] = []  # frames to deliver to the worker (from the test thread)
        self._up, self._down = up or (lambda f: [f]), down or (lambda f: [f])
        self._ctx = zmq.Context()
        self._front = curve_server(self._ctx.socket(zmq.ROUTER))
        self._front.setsockopt(zmq.LINGER, 0)
        self._front.bind(f"tcp://127.0.0.1:{self.port}")
        self._back = raw_dealer(self._ctx, controller_port)
        self._identity: bytes | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def deliver(self, frame: bytes) -> None:
        with self._lock:
            self.inject.append(frame)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        poller.register(self._back, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(5))
            if self._front in ready:
                self._identity, frame = self._front.recv_multipart()
                self.up_frames.append(frame)
                for out in self._up(frame):
                    self._back.send(out)
            if self._back in ready:
                frame = self._back.recv()
                self.down_frames.append(frame)
                for out in self._down(frame):
                    self._front.send_multipart([self._identity, out])
            with self._lock:
                pending, self.inject = self.inject, []
            for frame in pending:
                self._front.send_multipart([self._identity, frame])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._front.close()
        self._back.close()
        self._ctx.term()


def _kind(frame: bytes) -> MessageType:
    return decode_frame(frame, KEY)[0].message_type


def test_a_worker_drops_its_own_update_reflected_by_a_proxy(free_port: int) -> None:
    """The proxy sends a worker its own UPDATE back: before version 3 the worker applied it a second
    time. It is now addressed to the controller, so the worker drops it as misdirected."""
    job = 0x101
    with controller(np.zeros(4, np.float32), job, free_port):
        proxy = Proxy(free_port)
        conn = WorkerConnection(
            "127.0.0.1",
            proxy.port,
            job,
            1,
            SECRET,
            4,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        applied: list[int] = []
        try:
            conn.hello({})
            conn.send_update(sparse_message([0], [1], 4, 0.5), 1, 0)
            conn.sync(lambda h, m: applied.append(h.sender))
            own = next(f for f in proxy.up_frames if _kind(f) == MessageType.UPDATE)
            proxy.deliver(own)
            assert wait_until(
                lambda: (
                    (conn.drain(lambda h, m: applied.append(h.sender)), conn.counters.frames_rejected)[1] == 1
                )
            )
            assert applied == [] and conn.counters.rejected_reasons == {"misdirected": 1}
        finally:
            conn.close()
            proxy.close()


def test_a_sync_ack_meant_for_another_worker_does_not_end_a_sync(free_port: int) -> None:
    """The proxy of worker 1 withholds its SYNC and hands it worker 2's SYNC_ACK: before version 3 the
    SYNC of worker 1 returned at once though the controller never saw its update. Now it is dropped
    (misdirected) and worker 1's SYNC fails within its bound, naming the rejection."""
    job = 0x102
    config = ZmqTransportConfiguration(connect_timeout_ms=3000, sync_timeout_ms=1500, poll_interval_ms=10)
    with controller(np.zeros(4, np.float32), job, free_port, config=config) as ctl:
        withhold = {"on": False}
        proxy1 = Proxy(free_port, up=lambda f: [] if withhold["on"] else [f])
        proxy2 = Proxy(free_port)
        one = WorkerConnection(
            "127.0.0.1",
            proxy1.port,
            job,
            1,
            SECRET,
            4,
            config,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        two = WorkerConnection(
            "127.0.0.1",
            proxy2.port,
            job,
            2,
            SECRET,
            4,
            config,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            one.hello({})
            two.hello({})
            withhold["on"] = True
            one.send_update(sparse_message([0], [1], 4, 0.5), 1, 0)
            two.sync(lambda h, m: None)
            ack = next(f for f in proxy2.down_frames if _kind(f) == MessageType.SYNC_ACK)
            proxy1.deliver(ack)
            with pytest.raises(TransportError, match="no answer to SYNC .* addressed to 2, not worker 1"):
                one.sync(lambda h, m: None)
            assert one.counters.rejected_reasons == {"misdirected": 1}
            assert ctl.updates_applied == 0
        finally:
            one.close()
            two.close()
            proxy1.close()
            proxy2.close()


def test_a_late_joiner_refuses_the_fits_first_params_from_a_proxy(free_port: int) -> None:
    """The proxy answers a late joiner's HELLO with the PARAMS captured when the fit started: before
    version 3 it started from those stale parameters. Now it drops them and takes the current ones."""
    job = 0x103
    with controller(np.zeros(4, np.float32), job, free_port) as ctl:
        first = Proxy(free_port)
        early = WorkerConnection(
            "127.0.0.1",
            first.port,
            job,
            1,
            SECRET,
            4,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            early.hello({})
            stale = next(f for f in first.down_frames if _kind(f) == MessageType.PARAMS)
            early.send_update(sparse_message([1], [1], 4, 0.5), 1, 0)
            early.sync(lambda h, m: None)
        finally:
            early.close()
            first.close()
        replayed = {"done": False}

        def stale_first(frame: bytes) -> list[bytes]:
            if replayed["done"]:
                return [frame]
            replayed["done"] = True
            return [stale, frame]

        proxy = Proxy(free_port, down=stale_first)
        late = WorkerConnection(
            "127.0.0.1",
            proxy.port,
            job,
            2,
            SECRET,
            4,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            params, _, _ = late.hello({})
            np.testing.assert_array_equal(params, [0, -0.5, 0, 0])
            np.testing.assert_array_equal(params, ctl.params())
            assert late.counters.rejected_reasons == {"misdirected": 1}
        finally:
            late.close()
            proxy.close()


def test_a_relayed_update_withheld_by_a_proxy_makes_the_worker_rejoin(free_port: int) -> None:
    """PLAIN numbers every frame the controller sends a worker. A proxy that withholds one relayed
    update used to leave the worker silently diverged; the next frame now shows the gap, the worker
    re-joins and its parameters equal the controller's."""
    job = 0x104
    with controller(np.zeros(4, np.float32), job, free_port) as ctl:
        dropped = {"count": 0}

        def drop_first_update(frame: bytes) -> list[bytes]:
            if _kind(frame) == MessageType.UPDATE and not dropped["count"]:
                dropped["count"] += 1
                return []
            return [frame]

        proxy = Proxy(free_port, down=drop_first_update)
        victim = WorkerConnection(
            "127.0.0.1",
            proxy.port,
            job,
            2,
            SECRET,
            4,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        sender = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            1,
            SECRET,
            4,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        applied: list[int] = []
        try:
            victim.hello({})
            sender.hello({})
            for i in range(2):
                sender.send_update(sparse_message([i], [1], 4, 0.5), i + 1, 0)
            sender.sync(lambda h, m: None)
            with pytest.raises(RejoinRequired, match=r"frames 2\.\.2 from controller .* never arrived"):
                assert wait_until(lambda: victim.drain(lambda h, m: applied.append(h.sender)) < 0)
            assert applied == [] and victim.counters.rejected_reasons == {"gap": 1}
            params, _, _ = victim.hello({"rejoin": True})
            np.testing.assert_array_equal(params, [-0.5, -0.5, 0, 0])
            np.testing.assert_array_equal(params, ctl.params())
        finally:
            victim.close()
            sender.close()
            proxy.close()


# -- items 2 and 4: a MESH_JOIN replayed to another relay; a relay forging on its child's link -----------
MESH = ZmqTransportConfiguration(
    connect_timeout_ms=5000, sync_timeout_ms=5000, poll_interval_ms=10, mesh_fan_out=1, mesh_catchup_ms=5000
)


def test_a_mesh_join_replayed_to_another_relay_does_not_make_it_a_tap(free_port: int) -> None:
    """A MESH_JOIN captured on its way to relay 1 and replayed to relay 2 made relay 2 adopt the sender
    and relay it every update. It is now addressed to relay 1 (misdirected at relay 2), and relay 2
    registers only the children the controller assigned it."""
    job = 0x201
    with controller(np.zeros(4, np.float32), job, free_port, config=MESH, mesh=True) as ctl:
        relays = [
            WorkerConnection(
                "127.0.0.1",
                free_port,
                job,
                wid,
                SECRET,
                4,
                MESH,
                relay_host="127.0.0.1",
                on_params=lambda p, i, e: None,
                controller_key=CONTROLLER_KEY,
                curve_key=CURVE_KEY,
                threshold_reference=REFERENCE,
            )
            for wid in (1, 2)
        ]
        ctx = zmq.Context()
        tap = raw_dealer(ctx, int(relays[1].relay_endpoint.rsplit(":", 1)[1]), relays[1].relay_key)
        try:
            for relay in relays:
                relay.hello({})
            assert ctl.mesh_tree() == {1: 0, 2: 1}  # fan-out 1: 2 hangs under 1
            assert wait_until(lambda: (relays[0].drain(lambda h, m: None), relays[0].children)[1] == [2])
            captured = encode_frame(KEY, MessageType.MESH_JOIN, job, 2, 1, b"{}", recipient=1)  # 2 -> 1
            tap.send(bytes(captured))
            assert wait_until(
                lambda: (relays[1].drain(lambda h, m: None), relays[1].counters.frames_rejected)[1] == 1
            )
            assert relays[1].counters.rejected_reasons == {"misdirected": 1} and relays[1].children == []
            # with the key (a compromised executor) and the right recipient: held, never registered
            tap.send(bytes(encode_frame(KEY, MessageType.MESH_JOIN, job, 77, 0, b"{}", recipient=2)))
            assert wait_until(lambda: (relays[1].drain(lambda h, m: None), 77 in relays[1]._pending_joins)[1])
            assert relays[1].children == []
        finally:
            tap.close()
            for relay in relays:
                relay.close()
            ctx.term()


def test_a_child_refuses_epoch_go_and_over_bound_updates_from_its_mesh_parent(free_port: int) -> None:
    """A compromised executor registers as a relay (it has the key) and the controller makes it the
    parent of an honest worker. It forges a sender-0 EPOCH_GO {"stop": true} and an UPDATE with a
    threshold the controller would refuse, both on the child's parent link: before issue 21 the child
    took both. Now both are dropped (link, threshold) and counted; its parameters are untouched."""
    job = 0x202
    with controller(np.zeros(4, np.float32), job, free_port, config=MESH, mesh=True) as ctl:
        ctx = zmq.Context()
        rogue_relay = curve_server(ctx.socket(zmq.ROUTER))
        rogue_relay.setsockopt(zmq.LINGER, 0)
        relay_port = rogue_relay.bind_to_random_port("tcp://127.0.0.1")
        rogue = raw_dealer(ctx, free_port)
        seen: list[int] = []
        child = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            5,
            SECRET,
            4,
            MESH,
            relay_host="127.0.0.1",
            on_params=lambda p, i, e: None,
            threshold_reference=1.0,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
        )
        try:
            rogue.send(
                encode_frame(
                    KEY, MessageType.HELLO, job, 66, 0, json_payload(relay_hello(f"127.0.0.1:{relay_port}"))
                )
            )
            assert [_kind(_recv(rogue)) for _ in range(2)] == [MessageType.MESH_PARENT, MessageType.PARAMS]
            child.hello({})
            assert ctl.mesh_tree() == {66: 0, 5: 66}
            identity, join = rogue_relay.recv_multipart()
            assert _kind(join) == MessageType.MESH_JOIN
            go = encode_frame(
                KEY, MessageType.EPOCH_GO, job, 0, 10**6, json_payload({"stop": True}), recipient=5
            )
            huge = encode_frame(
                KEY,
                MessageType.UPDATE,
                job,
                66,
                1,
                memoryview(sparse_message([0], [1], 4, 2e6)),
                flags=Flag.RELAYED,
                relay=66,
                broadcast=1,
                recipient=5,
            )
            for frame in (go, huge):
                rogue_relay.send_multipart([identity, bytes(frame)])
            assert wait_until(
                lambda: (
                    (child.drain(lambda h, m: seen.append(h.sender)), child.counters.frames_rejected)[1] == 2
                )
            )
            assert seen == [] and child.counters.rejected_reasons == {"link": 1, "threshold": 1}
        finally:
            child.close()
            rogue.close()
            rogue_relay.close()
            ctx.term()


# -- item 8: hostile sizes cost no HMAC ---------------------------------------------------------------
def test_oversized_and_malformed_headers_are_rejected_before_the_hmac(free_port: int, monkeypatch) -> None:
    """Unauthenticated frames paid the full HMAC before the length and type checks. A control frame
    longer than the control limit, an unknown type and a length that disagrees with the frame are now
    refused by the header alone: no tag is computed for them."""
    verified = []
    verify = FrameKey.verify
    monkeypatch.setattr(FrameKey, "verify", lambda self, frame: verified.append(1) or verify(self, frame))
    job, n = 0x301, 4096
    with controller(np.zeros(n, np.float32), job, free_port) as ctl:
        ctx = zmq.Context()
        sock = raw_dealer(ctx, free_port)
        try:
            big_hello = bytearray(encode_frame(KEY, MessageType.HELLO, job, 1, 0, b" " * 5000))
            unknown = bytearray(encode_frame(KEY, MessageType.HELLO, job, 1, 0, b"{}"))
            unknown[5] = 99
            lying = bytearray(encode_frame(KEY, MessageType.UPDATE, job, 1, 0, bytes(64)))
            lying[40:44] = (60).to_bytes(4, "little")
            before = len(verified)
            for frame in (big_hello, unknown, lying):
                sock.send(bytes(frame))
            assert wait_until(lambda: ctl.counters.frames_rejected == 3)
            assert len(verified) == before
            assert ctl.counters.rejected_reasons == {"oversized": 1, "malformed": 2}
        finally:
            sock.close()
            ctx.term()


def test_queued_bytes_per_connection_are_bounded_in_bytes_not_frames(free_port: int) -> None:
    """Each connection could queue receive-HWM x the largest frame (about 40 GB at 10M parameters); the
    receive high-water mark is now max_queued_bytes over the largest frame, in whole frames."""
    n = 1 << 20  # largest frame: header + 4 * (n + 4) bytes, about 4 MiB
    config = ZmqTransportConfiguration(max_queued_bytes=64 << 20)
    with controller(np.zeros(n, np.float32), 0x302, free_port, config=config) as ctl:
        assert ctl._sock.getsockopt(zmq.RCVHWM) == (64 << 20) // (84 + 4 * (n + 4)) == 15
    tiny = ZmqTransportConfiguration(max_queued_bytes=1)
    with controller(np.zeros(n, np.float32), 0x303, free_port, config=tiny) as ctl:
        assert ctl._sock.getsockopt(zmq.RCVHWM) == 1
    with pytest.raises(ValueError, match="max_queued_bytes"):
        ZmqTransportConfiguration(max_queued_bytes=0)


def test_the_default_queue_holds_sixteen_of_a_large_models_frames(free_port: int) -> None:
    """ZeroMQ counts frames: 256 MiB over a 17M-parameter model's largest frame held 1-2 of them, and the
    small updates that fill the queue then dropped every worker two updates behind (a fit of a 1M-row
    embedding table re-joined 23 times). The default bound is now the larger of 256 MiB and
    16 of the socket's largest frames; an explicit max_queued_bytes is kept exactly (test above)."""
    assert ZmqTransportConfiguration().max_queued_bytes is None
    n = 1 << 22  # largest received frame: header + 4 * (n + 4) bytes, 16 MiB: 256 MiB holds 15
    frame = 84 + 4 * (n + 4)
    assert (256 << 20) // frame == 15
    with controller(np.zeros(n, np.float32), 0x307, free_port) as ctl:
        assert ctl._sock.getsockopt(zmq.RCVHWM) == 16
    small = 1 << 10  # 256 MiB holds more than high_water_mark (1000) of these: the frame count binds
    with controller(np.zeros(small, np.float32), 0x308, free_port) as ctl:
        assert ctl._sock.getsockopt(zmq.RCVHWM) == ZmqTransportConfiguration().high_water_mark == 1000
    n = 1 << 20  # 4 MiB frames: 256 MiB holds 63 of them, more than the 16 the floor asks
    with controller(np.zeros(n, np.float32), 0x309, free_port) as ctl:
        assert ctl._sock.getsockopt(zmq.RCVHWM) == (256 << 20) // (84 + 4 * (n + 4)) == 63


def test_connections_beyond_the_cap_are_refused_at_their_handshake_and_counted(free_port: int) -> None:
    """The number of connections to the controller was unbounded, each allowed to queue
    max_queued_bytes. With max_connections 2, a third connection is refused at its handshake (its HELLO
    never reaches the controller) and counted; once one of the two leaves, a new connection is served."""
    job = 0x304
    config = ZmqTransportConfiguration(
        connect_timeout_ms=3000, sync_timeout_ms=5000, poll_interval_ms=10, max_connections=2
    )
    with controller(np.zeros(4, np.float32), job, free_port, config=config) as ctl:
        ctx = zmq.Context()
        socks = [raw_dealer(ctx, free_port) for _ in range(2)]
        try:
            for wid, sock in enumerate(socks, start=1):
                sock.send(bytes(encode_frame(KEY, MessageType.HELLO, job, wid, 0, b"{}")))
                assert _kind(_recv(sock)) == MessageType.PARAMS
            extra = raw_dealer(ctx, free_port)
            socks.append(extra)
            extra.send(bytes(encode_frame(KEY, MessageType.HELLO, job, 3, 0, b"{}")))
            assert wait_until(lambda: ctl.counters.dropped_reasons.get("connection_limit", 0) >= 1)
            assert ctl.workers_seen == {1, 2} and ctl.counters.messages_received == 2
            socks[0].close()
            assert wait_until(lambda: ctl._connections.live == 1)
            late = raw_dealer(ctx, free_port)
            socks.append(late)
            late.send(bytes(encode_frame(KEY, MessageType.HELLO, job, 4, 0, b"{}")))
            assert _kind(_recv(late)) == MessageType.PARAMS
            assert 3 not in ctl.workers_seen and ctl.error is None
        finally:
            for sock in socks:
                sock.close()
            ctx.term()


def test_send_queues_are_bounded_in_bytes_not_frames(free_port: int) -> None:
    """The controller queued up to high_water_mark (1000) frames for a worker that does not read,
    PARAMS of 40 MB each at 10M parameters; its send high-water mark is now max_queued_bytes over the
    largest frame it sends (the parameters), as for receiving."""
    n = 1 << 20
    config = ZmqTransportConfiguration(max_queued_bytes=64 << 20)
    with controller(np.zeros(n, np.float64), 0x305, free_port, config=config) as ctl:
        assert ctl._sock.getsockopt(zmq.SNDHWM) == (64 << 20) // (84 + 8 * n + 64) == 7  # signed PARAMS


def test_a_mesh_child_that_never_reads_is_dropped_after_max_queued_bytes(free_port: int) -> None:
    """A compromised executor registers as the MESH child of an honest relay and never reads: the relay
    kept up to 1000 relayed updates for it (64 MB of 64 KB updates here). Its queue per child now holds
    max_queued_bytes (1 MiB: 16 of them); once full the child is dropped and counted (queue_full)."""
    job, n = 0x306, 1 << 14
    config = ZmqTransportConfiguration(
        connect_timeout_ms=5000,
        sync_timeout_ms=5000,
        poll_interval_ms=10,
        mesh_fan_out=1,
        max_queued_bytes=1 << 20,
    )
    with controller(np.zeros(n, np.float32), job, free_port, config=config, mesh=True) as ctl:
        relay = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            1,
            SECRET,
            n,
            config,
            relay_host="127.0.0.1",
            on_params=lambda p, i, e: None,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        ctx = zmq.Context()
        rogue = raw_dealer(ctx, free_port)
        child = ctx.socket(zmq.DEALER)  # reads nothing: a 4 KiB kernel buffer and one frame of queue
        child.setsockopt(zmq.LINGER, 0)
        child.setsockopt(zmq.RCVBUF, 4096)
        child.setsockopt(zmq.RCVHWM, 1)
        try:
            relay.hello({})
            hello = json_payload(relay_hello("127.0.0.1:9"))
            rogue.send(bytes(encode_frame(KEY, MessageType.HELLO, job, 66, 0, hello)))
            assert [_kind(_recv(rogue)) for _ in range(2)] == [MessageType.MESH_PARENT, MessageType.PARAMS]
            assert ctl.mesh_tree() == {1: 0, 66: 1}
            assert relay.relay_key is not None
            curve_client(child, relay.relay_key)
            child.connect(relay.relay_endpoint and f"tcp://{relay.relay_endpoint}")
            child.send(bytes(encode_frame(KEY, MessageType.MESH_JOIN, job, 66, 1, b"{}", recipient=1)))
            assert wait_until(lambda: (relay.drain(lambda h, m: None), relay.children)[1] == [66])
            big = sparse_message(list(range(n)), [1] * n, n, 0.25)  # n entries: a 64 KiB update
            sent = 0
            while relay.children and sent < 600:  # 600 x 64 KiB fit the old 1000-frame queue
                relay.send_update(big, sent + 1, 0)
                relay.sync(lambda h, m: None)
                sent += 1
            assert relay.children == [] and relay.counters.dropped_reasons == {"queue_full": 1}
            assert sent < 600
        finally:
            relay.close()
            rogue.close()
            child.close()
            ctx.term()


# -- item 2: what only the controller may say is signed ----------------------------------------------
def _forged_like(genuine: bytes, payload: bytes, signer: ControllerSigner | None) -> bytes:
    """A frame with every header field of ``genuine`` (sender 0, sequence, link number, recipient) and
    another payload, authenticated with the fit's secret (a compromised executor holds it)."""
    header, _ = decode_frame(genuine, KEY)
    return bytes(
        encode_frame(
            KEY,
            header.message_type,
            header.job_id,
            header.sender,
            header.sequence,
            payload,
            iteration=header.iteration,
            epoch=header.epoch,
            flags=header.flags & Flag.FLOAT64,
            broadcast=header.broadcast,
            recipient=header.recipient,
            signer=signer,
        )
    )


@pytest.mark.parametrize("signer", [None, ControllerSigner()], ids=["unsigned", "own_key"])
def test_a_compromised_executor_on_path_cannot_forge_epoch_go_or_params(
    free_port: int, signer: ControllerSigner | None
) -> None:
    """An executor holding the fit's secret sits between a worker and the controller. Ahead of the
    controller's PARAMS it delivers forged ones (all 666), ahead of its EPOCH_GO {"stop": false} a forged
    {"stop": true}, each with the genuine frame's header and a valid HMAC: version 3 took both. Without
    the controller's Ed25519 signature (unsigned, or signed with the executor's own key) both are
    dropped as bad_signature; the worker takes the genuine frames."""
    job = 0x401

    def forge_first(frame: bytes) -> list[bytes]:
        kind = _kind(frame)
        if kind == MessageType.PARAMS:
            return [_forged_like(frame, np.full(4, 666, np.float32).tobytes(), signer), frame]
        if kind == MessageType.EPOCH_GO:
            return [_forged_like(frame, json_payload({"stop": True}), signer), frame]
        return [frame]

    with controller(np.arange(4, dtype=np.float32), job, free_port) as ctl:
        ctl.expect_workers(1)
        proxy = Proxy(free_port, down=forge_first)
        conn = WorkerConnection(
            "127.0.0.1",
            proxy.port,
            job,
            1,
            SECRET,
            4,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )

        def driver() -> None:
            epoch = ctl.next_finished_epoch(20)
            if epoch is not None:
                ctl.release_epoch(epoch, stop=False)

        releaser = threading.Thread(target=driver, daemon=True)
        releaser.start()
        try:
            params, _, _ = conn.hello({})
            np.testing.assert_array_equal(params, np.arange(4))
            assert conn.end_epoch(0, lambda h, m: None) is False
            assert conn.counters.rejected_reasons == {"bad_signature": 2}
        finally:
            releaser.join()
            conn.close()
            proxy.close()


# -- item 3: parameters finite after every update a worker applies ------------------------------------
def test_a_worker_refuses_an_update_that_makes_its_parameters_non_finite_and_rejoins(
    free_port: int, monkeypatch
) -> None:
    """Defence in depth behind the threshold bound, on the worker as on the controller: a relayed update
    whose decoded values overflow (here the worker's decode scaled by 1e37, standing in for any path to
    a huge step) used to leave the replica non-finite. The worker counts it (non_finite, naming the
    sender) and re-joins, taking the controller's parameters, which stay finite."""
    from sparkgrad import compress
    from sparkgrad.compress import FixedThresholdAlgorithm
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
    from sparkgrad.spark import shared_worker

    def overflowing_apply(message: np.ndarray, network, scratch) -> None:
        scratch.fill(0)
        compress.decode(message, scratch)
        with np.errstate(over="ignore"):
            scratch *= np.float32(1e37)
        network.apply_update(scratch)

    monkeypatch.setattr(shared_worker, "apply_message", overflowing_apply)
    conf = MultiLayerConfiguration(
        [DenseLayer(4, activation="relu"), OutputLayer(2, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(3),
    )
    net = MultiLayerNetwork(conf).init()
    start = net.params().copy()
    start[0] = 3e38
    net.set_params(start)
    n, job = start.size, 0x501
    with controller(start, job, free_port, decode=compress.decode) as ctl:
        spark_job = worker_job(net, job, free_port, threshold_algorithm=FixedThresholdAlgorithm(1.0))
        worker = shared_worker.SharedWorker(spark_job, "cpu")
        sender = WorkerConnection(
            "127.0.0.1",
            free_port,
            job,
            7,
            SECRET,
            n,
            FAST,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            sender.hello({})
            sender.send_update(sparse_message([0], [-1], n, 16.0), 1, 0)  # +16: finite at the controller
            sender.sync(lambda h, m: None)
            worker._rejoining(lambda: worker.conn.sync(worker._on_peer))
            assert worker.conn.counters.rejected_reasons == {"non_finite": 1} and worker.rejoins == 1
            assert worker.net.params_finite()
            np.testing.assert_array_equal(worker.net.params(), ctl.params())
            assert ctl.updates_applied == 1 and ctl.error is None
        finally:
            sender.close()
            worker.close()
