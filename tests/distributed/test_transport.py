"""Wire format and the PLAIN ZeroMQ controller/worker exchange."""

from __future__ import annotations

import hashlib
import hmac
import multiprocessing as mp
import socket
import threading
import time

import numpy as np
import pytest

from wire_helpers import (
    FAST,
    REFERENCE,
    SECRET,
    controller,
    raw_dealer,
    sparse_decode,
    sparse_message,
    wait_until,
)

from sparkgrad.errors import TransportError
from sparkgrad.transport import (
    HEADER_SIZE,
    Controller,
    Flag,
    FrameKey,
    FrameRejected,
    MessageType,
    WorkerConnection,
    decode_frame,
    encode_frame,
)

pytestmark = pytest.mark.distributed


KEY = FrameKey(SECRET)


def test_frame_round_trip_and_layout() -> None:
    payload = np.arange(6, dtype=np.int32)
    frame = encode_frame(
        KEY, MessageType.UPDATE, 2**63 + 5, 7, 2**32 - 1, memoryview(payload), iteration=-2, epoch=4
    )
    assert HEADER_SIZE == 80 and len(frame) == 80 + 24
    assert frame[:4] == b"SGRD" and frame[4] == 2 and frame[5] == MessageType.UPDATE
    assert int.from_bytes(frame[6:8], "little") == Flag.AUTHENTICATED
    assert int.from_bytes(frame[8:16], "little") == 2**63 + 5
    header, body = decode_frame(frame, KEY)
    assert (header.message_type, header.job_id, header.sender, header.sequence) == (
        MessageType.UPDATE,
        2**63 + 5,
        7,
        2**32 - 1,
    )
    assert (header.iteration, header.epoch, header.payload_length, header.flags) == (
        -2,
        4,
        24,
        Flag.AUTHENTICATED,
    )
    np.testing.assert_array_equal(np.frombuffer(body, dtype="<i4"), payload)


def test_tag_is_hmac_sha256_of_header_with_zero_tag_and_payload() -> None:
    frame = encode_frame(KEY, MessageType.HELLO, 3, 9, 4, b'{"a":1}')
    unsigned = bytes(frame[:44]) + bytes(32) + bytes(frame[76:])
    assert bytes(frame[44:76]) == hmac.new(SECRET, unsigned, hashlib.sha256).digest()


def test_sequence_must_fit_32_bits() -> None:
    with pytest.raises(ValueError, match="sequence"):
        encode_frame(KEY, MessageType.SYNC, 1, 1, 2**32)


@pytest.mark.parametrize("offset", [0, 4, 5, 6, 8, 16, 20, 24, 28, 32, 40, 44, 75, 76, 80, 83])
def test_any_tampered_byte_is_rejected(offset: int) -> None:
    frame = encode_frame(KEY, MessageType.UPDATE, 1, 1, 0, memoryview(np.arange(1, 2, dtype=np.int32)))
    frame[offset] ^= 0x01
    with pytest.raises(FrameRejected):
        decode_frame(frame, KEY, peer="tester")


def test_wrong_key_and_missing_flag_are_unauthenticated() -> None:
    frame = encode_frame(FrameKey(bytes(32)), MessageType.SYNC, 1, 1, 0)
    with pytest.raises(FrameRejected, match="authentication") as info:
        decode_frame(frame, KEY)
    assert info.value.reason == "unauthenticated"
    frame = encode_frame(KEY, MessageType.SYNC, 1, 1, 0)
    frame[6:8] = b"\x00\x00"  # flag cleared (the tag no longer matches either)
    with pytest.raises(FrameRejected, match="authentication"):
        decode_frame(frame, KEY)


@pytest.mark.parametrize("secret", [b"short", bytes(31), "00" * 32, None])
def test_frame_key_needs_32_bytes(secret) -> None:
    with pytest.raises(ValueError, match="secret"):
        FrameKey(secret)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda f: f[:40], "shorter"),
        (lambda f: b"XXXX" + f[4:], "magic"),
        (lambda f: f[:4] + b"\x01" + f[5:], "version 1"),
        (lambda f: f + b"\x00", "authentication"),
        (lambda f: f[:-1], "authentication"),
    ],
)
def test_corrupt_frames_are_rejected(mutate, match) -> None:
    frame = bytes(encode_frame(KEY, MessageType.UPDATE, 1, 1, 0, memoryview(np.zeros(3, np.int32))))
    with pytest.raises(FrameRejected, match=match):
        decode_frame(mutate(frame), KEY, peer="tester")


@pytest.mark.parametrize(
    "payload, match",
    [(b"abcdef", "int32"), (None, "payload bytes"), (b"", "message type")],
)
def test_authentic_but_inconsistent_frames_are_rejected(payload, match) -> None:
    """A signer with the key can still produce nonsense; the parser rejects it after the tag check."""
    kind = MessageType.UPDATE
    if match == "message type":
        frame = encode_frame(KEY, kind, 1, 1, 0, payload)
        frame[5] = 0x63
    elif payload is None:
        frame = encode_frame(KEY, kind, 1, 1, 0, b"abcd")
        frame[40:44] = (8).to_bytes(4, "little")
    else:
        frame = encode_frame(KEY, kind, 1, 1, 0, payload)
    frame[44:76] = bytes(32)
    KEY.seal(frame)
    with pytest.raises(FrameRejected, match=match):
        decode_frame(frame, KEY)


def _worker_thread(port, job, wid, messages, received, params_out, barrier):
    conn = WorkerConnection("127.0.0.1", port, job, wid, SECRET, 10, FAST)
    try:
        params, _, _ = conn.hello({"worker": wid})
        barrier.wait(10)  # both registered before anything is sent: every update is relayed
        got = []

        def on_update(header, msg):
            got.append(header.sender)
            sparse_decode(msg, scratch := np.zeros_like(params))
            params[:] -= scratch

        for it, msg in enumerate(messages):
            conn.send_update(msg, it, 0)
            scratch = np.zeros_like(params)
            sparse_decode(msg, scratch)
            params -= scratch
            conn.drain(on_update)
        conn.sync(on_update)  # own updates applied and relayed by the controller
        barrier.wait(10)
        conn.sync(on_update)  # relays of the peer's updates precede this acknowledgement
        received[wid] = got
        params_out[wid] = params
    finally:
        conn.close()


def test_controller_applies_and_relays_every_update(free_port: int) -> None:
    n = 10
    job = 0xABCDEF
    msgs = {
        1: [sparse_message([0, 3], [1, -1], n, 0.5), sparse_message([9], [1], n, 0.25)],
        2: [sparse_message([3, 4], [1, 1], n, 0.5)],
    }
    barrier = threading.Barrier(2)
    with Controller(
        np.zeros(n, np.float32),
        job,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=REFERENCE,
    ) as ctl:
        received: dict = {}
        params_out: dict = {}
        threads = [
            threading.Thread(
                target=_worker_thread, args=(free_port, job, w, m, received, params_out, barrier)
            )
            for w, m in msgs.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        final = ctl.params()
        assert ctl.updates_applied == 3 and ctl.workers_seen == {1, 2}
        assert ctl.counters.update_bytes > 0
    expected = np.zeros(n, np.float32)
    for m in [m for ms in msgs.values() for m in ms]:
        sparse_decode(m, s := np.zeros(n, np.float32))
        expected -= s
    np.testing.assert_allclose(final, expected)
    assert received == {1: [2], 2: [1, 1]}
    # every replica applied the same stream of updates as the controller
    np.testing.assert_allclose(params_out[1], expected)
    np.testing.assert_allclose(params_out[2], expected)


def test_fresh_worker_keeps_its_initial_params(free_port: int) -> None:
    with Controller(
        np.ones(3, np.float32),
        8,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=REFERENCE,
    ):
        conn = WorkerConnection("127.0.0.1", free_port, 8, 1, SECRET, 3, FAST)
        try:
            params, _, _ = conn.hello({"has_initial_params": True})
            assert params is None
            full, _, _ = conn.hello({})
            np.testing.assert_array_equal(full, [1, 1, 1])
        finally:
            conn.close()


def test_late_joiner_pulls_current_params(free_port: int) -> None:
    job = 42
    with Controller(
        np.ones(4, np.float64),
        job,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=REFERENCE,
        iteration=7,
    ) as ctl:
        a = WorkerConnection("127.0.0.1", free_port, job, 1, SECRET, 4, FAST)
        try:
            a.hello({})
            a.send_update(sparse_message([1], [1], 4, 2.0), 11, 0)
            a.sync(lambda h, m: None)
        finally:
            a.close()
        b = WorkerConnection("127.0.0.1", free_port, job, 2, SECRET, 4, FAST)
        try:
            params, iteration, _ = b.hello({})
        finally:
            b.close()
        np.testing.assert_array_equal(params, [1, -1, 1, 1])
        assert params.dtype == np.float64 and iteration == 11 and ctl.iteration == 11


def test_port_in_use_fails_fast() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(TransportError, match=f"127.0.0.1:{port}"):
            Controller(
                np.zeros(2, np.float32),
                1,
                SECRET,
                "127.0.0.1",
                port,
                FAST,
                decode=sparse_decode,
                threshold_reference=REFERENCE,
            )
        assert time.monotonic() - start < 5


def test_unreachable_controller_fails_within_timeout(free_port: int) -> None:
    conn = WorkerConnection("127.0.0.1", free_port, 1, 3, SECRET, 3, FAST)
    start = time.monotonic()
    try:
        with pytest.raises(TransportError, match="no answer to HELLO"):
            conn.hello({})
    finally:
        conn.close()
    assert time.monotonic() - start < 5


def test_wrong_job_gets_no_reply(free_port: int) -> None:
    with controller(np.zeros(2, np.float32), 1, free_port) as ctl:
        conn = WorkerConnection("127.0.0.1", free_port, 2, 3, SECRET, 2, FAST)
        try:
            with pytest.raises(TransportError, match="no answer to HELLO"):
                conn.hello({})
        finally:
            conn.close()  # its BYE is for the wrong job too
        assert wait_until(lambda: ctl.counters.frames_rejected >= 2)
        assert ctl.counters.rejected_reasons == {"wrong_job": 2}
        assert ctl.updates_applied == 0 and ctl.counters.messages_sent == 0


def test_stranger_bytes_do_not_disturb_controller(free_port: int) -> None:
    with Controller(
        np.zeros(3, np.float32),
        9,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=REFERENCE,
    ) as ctl:
        with socket.create_connection(("127.0.0.1", free_port)) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
        conn = WorkerConnection("127.0.0.1", free_port, 9, 1, SECRET, 3, FAST)
        try:
            conn.hello({})
            conn.send_update(sparse_message([2], [-1], 3, 1.0), 1, 0)
            conn.sync(lambda h, m: None)
        finally:
            conn.close()
        np.testing.assert_array_equal(ctl.params(), [0, 0, 1])
        ctl.check()


def _process_worker(port: int, job: int, wid: int, queue) -> None:
    conn = WorkerConnection("127.0.0.1", port, job, wid, SECRET, 4, FAST)
    try:
        params, _, _ = conn.hello({"pid": wid})
        conn.send_update(sparse_message([wid], [1], 4, 1.0), 1, 0)
        applied = []
        conn.sync(lambda h, m: applied.append(h.sender))
        queue.put((wid, params.tolist()))
    finally:
        conn.close()


def test_workers_in_separate_processes(free_port: int) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with Controller(
        np.zeros(4, np.float32),
        77,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=REFERENCE,
    ) as ctl:
        procs = [ctx.Process(target=_process_worker, args=(free_port, 77, w, queue)) for w in (1, 2, 3)]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        np.testing.assert_array_equal(ctl.params(), [0, -1, -1, -1])
    assert set(results) == {1, 2, 3}


def test_close_leaves_no_threads(free_port: int) -> None:
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        ctl = Controller(
            np.zeros(2, np.float32),
            5,
            SECRET,
            "127.0.0.1",
            free_port,
            FAST,
            decode=sparse_decode,
            threshold_reference=REFERENCE,
        )
        conn = WorkerConnection("127.0.0.1", free_port, 5, 1, SECRET, 2, FAST)
        conn.hello({})
        conn.close()
        ctl.close()
        ctl.close()
    assert {t.ident for t in threading.enumerate()} == before
