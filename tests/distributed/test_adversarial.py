"""Attacks on the gradient-sharing wire, each played end to end over 127.0.0.1 (issue 21).

Every test names the attack, plays it against a live controller (and workers), and asserts what the
target did: the frame was dropped under a named counter, the victim's values are exact, the controller
thread is alive. Each one fails on the code before issue 21.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import zmq
from wire_helpers import FAST, SECRET, controller, raw_dealer, sparse_decode, sparse_message, wait_until

from sparkgrad.errors import TransportError
from sparkgrad.transport import (
    THRESHOLD_GROWTH_LIMIT,
    FrameKey,
    MessageType,
    WorkerConnection,
    ZmqTransportConfiguration,
    decode_frame,
    encode_frame,
)
from sparkgrad.transport.frame import json_payload

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
        )
        try:
            hello = json_payload({"relay": "127.0.0.1:9"})
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
    from sparkgrad.spark.progress import FitProgress
    from sparkgrad.spark.shared import _ProgressController

    progress = FitProgress(1, 0, 10, 10, enabled=False)
    ctl = _ProgressController(
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
    conn = WorkerConnection("127.0.0.1", free_port, 0x5, 1, SECRET, 2, FAST)
    other = WorkerConnection("127.0.0.1", free_port, 0x5, 2, SECRET, 2, FAST)
    try:
        conn.hello({})
        other.hello({})
        with pytest.raises(TransportError, match=match):
            conn.sync(lambda h, m: None, report=report)
        other.sync(lambda h, m: None, report={"loss": 0.5, "epoch_minibatches": 3})  # still serving
        ctl.check()
        assert ctl.counters.rejected_reasons == {"control": 1}
        assert progress.mean_loss == 0.5
    finally:
        conn.close()
        other.close()
        ctl.close()


# -- item 6: the threshold bound must not ratchet; parameters stay finite ---------------------------
def test_thresholds_growing_15x_per_update_are_stopped_at_the_fits_reference_bound(free_port: int) -> None:
    """36 authenticated updates, each with 15x the threshold of the one before, drove a parameter to
    infinity with nothing rejected (the bound was 16x the sender's last accepted threshold). The bound
    is now THRESHOLD_GROWTH_LIMIT x the fit's reference: 15 and 225 pass, 3375 and beyond do not."""
    assert THRESHOLD_GROWTH_LIMIT == 1024
    with controller(np.zeros(2, np.float32), 0x6, free_port) as ctl:
        conn = WorkerConnection("127.0.0.1", free_port, 0x6, 1, SECRET, 2, FAST)
        try:
            conn.hello({})
            for k in range(1, 37):
                conn.send_update(sparse_message([0], [-1], 2, min(15.0**k, 3e38)), k, 0)  # float32 range
            with pytest.raises(TransportError, match=r"threshold 3375.0: must be finite, > 0 and <= 1024"):
                conn.sync(lambda h, m: None)
        finally:
            conn.close()
        assert wait_until(lambda: ctl.counters.frames_rejected == 34)
        np.testing.assert_array_equal(ctl.params(), [15.0 + 225.0, 0.0])
        assert ctl.updates_applied == 2 and ctl.counters.rejected_reasons == {"threshold": 34}


def test_an_update_that_would_overflow_a_parameter_is_refused_naming_its_sender(free_port: int) -> None:
    """Finite thresholds under the bound can still sum past float32's range: the update is checked
    before it is taken, counted under non_finite, and the parameters stay exactly as they were."""
    start = np.zeros(16, np.float32)
    start[0] = 3e38
    with controller(start, 0x7, free_port, threshold_reference=1e36) as ctl:
        conn = WorkerConnection("127.0.0.1", free_port, 0x7, 42, SECRET, 16, FAST)
        try:
            conn.hello({})
            conn.send_update(sparse_message([0] * 10, [-1] * 10, 16, 1e37), 1, 0)  # 3e38 + 1e38 = inf
            with pytest.raises(
                TransportError, match="update from worker 42 .* would make parameters non-finite"
            ):
                conn.sync(lambda h, m: None)
        finally:
            conn.close()
        np.testing.assert_array_equal(ctl.params(), start)
        assert ctl.updates_applied == 0 and ctl.counters.rejected_reasons == {"non_finite": 1}


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
