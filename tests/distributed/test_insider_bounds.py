"""What a compromised executor (it holds the fit's secret) can do, bounded (issue 37): safe defaults of a
worker's threshold check, loss reports that cannot make a fit's figures non-finite, update indices
ascending and unique, a threshold bound that follows the fit, per-worker magnitude accounting."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Iterator

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
    curve_server,
    raw_dealer,
    relay_hello,
    sparse_decode,
    sparse_message,
    wait_until,
)

from sparkgrad.compress import (
    DEFAULT_DECAY_RATE,
    AdaptiveThresholdAlgorithm,
    FixedThresholdAlgorithm,
    TargetSparsityThresholdAlgorithm,
)
from sparkgrad.errors import TransportError
from sparkgrad.spark import SharedTrainingMaster
from sparkgrad.transport import FrameKey, MessageType, RejoinRequired, WorkerConnection, encode_frame
from sparkgrad.transport.frame import SIGNATURE_SIZE, Flag, json_payload, relayed_frame
from sparkgrad.transport.limits import InfluenceLedger

pytestmark = pytest.mark.distributed

HUGE = 1.7e308  # finite; two of them overflow a plain sum
WARMUP = InfluenceLedger.WARMUP
KEY = FrameKey(SECRET)


def _worker(port: int, job: int, wid: int, n: int, key: bytes = CONTROLLER_KEY, **kw) -> WorkerConnection:
    kw.setdefault("threshold_reference", REFERENCE)
    kw.setdefault("curve_key", CURVE_KEY)
    return WorkerConnection("127.0.0.1", port, job, wid, SECRET, n, FAST, controller_key=key, **kw)


def test_a_worker_connection_has_no_unchecked_default_for_received_updates(free_port: int) -> None:
    """WorkerConnection(threshold_reference=None), the constructor's default, turned the bound on received
    UPDATEs off (a MESH parent could hand a child any threshold). It is now required; None is taken only by
    a worker that averages parameters, which refuses every UPDATE."""
    with pytest.raises(TypeError, match="threshold_reference"):
        WorkerConnection("127.0.0.1", free_port, 1, 1, SECRET, 4, FAST, controller_key=CONTROLLER_KEY)
    for bad in (None, 0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="threshold_reference"):
            _worker(free_port, 1, 1, 4, threshold_reference=bad)
    _worker(free_port, 1, 1, 4, threshold_reference=None, average_values=4).close()


def test_two_insiders_reporting_huge_losses_leave_the_epoch_figures_finite(free_port: int) -> None:
    """Loss reports accept any finite float; the progress line's mean of two reports of 1.7e308 was inf
    and so was the epoch's loss figure. The line now shows the median of the workers' latest reports:
    with three honest workers of five it is one of theirs."""
    from sparkgrad.spark.controller_fit import ProgressController
    from sparkgrad.spark.progress import FitProgress

    progress = FitProgress(1, 0, 10, 10, enabled=False)
    ctl = ProgressController(
        np.zeros(2, np.float32),
        0x3705,
        SECRET,
        "127.0.0.1",
        free_port,
        FAST,
        decode=sparse_decode,
        threshold_reference=REFERENCE,
        progress=progress,
    )
    conns = [
        _worker(free_port, 0x3705, wid, 2, key=ctl.controller_key, curve_key=ctl.curve_key)
        for wid in (1, 2, 3, 4, 5)
    ]
    try:
        for conn, loss in zip(conns, (HUGE, HUGE, 0.5, 0.6, 0.7)):
            conn.hello({})
            conn.sync(lambda h, m: None, report={"loss": loss, "epoch_minibatches": 1})
        ctl.check()
        assert progress.median_loss == 0.7  # the largest honest report: within the honest range
        figures = progress.end_epoch(0)
        assert figures["loss"] == 0.7
    finally:
        for conn in conns:
            conn.close()
        ctl.close()


def test_two_insiders_averaging_huge_scores_leave_the_round_score_finite(free_port: int) -> None:
    """The averaging controller's round score was np.mean of the partitions' scores: inf for two reports
    of 1.7e308. It is now a mean that cannot overflow (each score divided before an exact sum)."""
    with controller(np.zeros(3, np.float32), 0x3706, free_port, averaging=True) as ctl:
        ctl.expect_workers(2)
        conns = [_worker(free_port, 0x3706, wid, 3, average_values=3) for wid in (1, 2)]
        try:
            for conn in conns:
                conn.hello({})
            threads = [
                threading.Thread(
                    target=conn.average,
                    args=(0, 0, {"partition": p, "minibatches": 1, "score": HUGE}, np.ones(3, np.float32)),
                )
                for p, conn in enumerate(conns)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            ctl.check()
            assert ctl.round_scores == [(0, 1, HUGE)]
        finally:
            for conn in conns:
                conn.close()


def _send_all(conn: WorkerConnection, messages: list[np.ndarray]) -> None:
    for k, message in enumerate(messages, start=1):
        conn.send_update(message, k, 0)
    conn.sync(lambda h, m: None)


def test_an_update_repeating_or_reordering_indices_is_refused_and_counted(free_port: int) -> None:
    """A sparse message naming one index k times moved its parameter k thresholds in one update (the
    decoder adds every entry). Indices must now be strictly ascending, as every encoder writes them."""
    with controller(np.zeros(8, np.float32), 0x3707, free_port) as ctl:
        conn = _worker(free_port, 0x3707, 1, 8)
        try:
            conn.hello({})
            with pytest.raises(TransportError, match="indices must be strictly ascending"):
                _send_all(conn, [sparse_message([0] * 6, [-1] * 6, 8, 1.0)])
            with pytest.raises(TransportError, match="names index 1 after 2"):
                _send_all(conn, [sparse_message([2, 1], [1, 1], 8, 1.0)])
            _send_all(conn, [sparse_message([1, 2], [1, 1], 8, 1.0)])
        finally:
            conn.close()
        np.testing.assert_array_equal(ctl.params(), [0, -1, -1, 0, 0, 0, 0, 0])
        assert ctl.counters.rejected_reasons == {"unordered": 2} and ctl.updates_applied == 1


def test_the_threshold_bound_follows_the_fits_current_threshold(free_port: int) -> None:
    """The bound was 2**20 x the fit's reference threshold, so an insider could step 2**20 times what the
    workers send. It is now the larger of threshold_factor (16) x the fit's current threshold, the
    median of the other workers' latest accepted thresholds, and the reference (where a restarted worker
    starts): with honest workers at 4x the reference, 64x passes and 65x does not. (The outlier
    accounting, which would quarantine such an insider, is widened out of the way here.)"""
    config = dataclasses.replace(FAST, outlier_factor=10**6)
    with controller(np.zeros(8, np.float32), 0x3708, free_port, config=config) as ctl:
        honest = [_worker(free_port, 0x3708, wid, 8) for wid in (1, 2, 3)]
        insider = _worker(free_port, 0x3708, 9, 8)
        try:
            for conn in [*honest, insider]:
                conn.hello({})
            for conn in honest:  # adaptive thresholds grown to 4x the reference, past the warm-up
                _send_all(conn, [sparse_message([1, 2], [1, 1], 8, 4.0 * REFERENCE)] * WARMUP)
            with pytest.raises(TransportError, match=r"threshold 65.0: must be finite, > 0 and <= 64 "):
                _send_all(insider, [sparse_message([0], [-1], 8, 65.0)])
            _send_all(insider, [sparse_message([0], [-1], 8, 64.0)])
        finally:
            for conn in [*honest, insider]:
                conn.close()
        assert ctl.params()[0] == 64.0 and ctl.counters.rejected_reasons == {"threshold": 1}


def test_an_insider_outweighing_the_median_worker_is_flagged_then_quarantined(free_port: int) -> None:
    """Nothing compared one worker's influence with the others': an insider could send updates touching
    every parameter while the workers touch a few. Each worker's recent update L1 and L-inf are now held
    against the median other worker's: past outlier_factor / 2 (4) it is flagged, past outlier_factor
    (8) its update is refused and the worker quarantined (dropped, counted, told to re-join)."""
    n = 64
    with controller(np.zeros(n, np.float32), 0x3709, free_port) as ctl:
        honest = [_worker(free_port, 0x3709, wid, n) for wid in (1, 2, 3)]
        heavy = _worker(free_port, 0x3709, 8, n)
        insider = _worker(free_port, 0x3709, 9, n)
        try:
            for conn in [*honest, heavy, insider]:
                conn.hello({})
            for k, conn in enumerate(honest):  # 4 entries of 0.25: L1 1.0 per update
                _send_all(conn, [sparse_message([4 * k + j for j in range(4)], [1] * 4, n, 0.25)] * WARMUP)
            _send_all(heavy, [sparse_message(list(range(24)), [-1] * 24, n, 0.25)])  # 6x: flagged
            assert ctl.counters.outliers_flagged == 1 and ctl.updates_applied == 3 * WARMUP + 1
            before = ctl.params()
            insider.send_update(sparse_message(list(range(n)), [-1] * n, n, 0.25), 2, 0)  # 16x
            with pytest.raises(RejoinRequired):
                insider.sync(lambda h, m: None)
            np.testing.assert_array_equal(ctl.params(), before)
            reasons = ctl.counters.rejected_reasons  # and its SYNC sent before it heard: not_joined
            assert reasons["outlier"] == 1 and set(reasons) <= {"outlier", "not_joined"}
            assert ctl.counters.dropped_reasons == {"quarantined": 1} and 9 not in ctl._peers
            insider.hello({})  # it re-joins; the honest workers go on
            _send_all(honest[0], [sparse_message([0, 1, 2, 3], [1] * 4, n, 0.25)])
            assert ctl.updates_applied == 3 * WARMUP + 2 and ctl.error is None
        finally:
            for conn in [*honest, heavy, insider]:
                conn.close()


def test_honest_workers_of_uneven_density_are_never_flagged(free_port: int) -> None:
    """No false quarantine: four workers whose updates differ threefold in density and twofold in
    threshold, 40 updates each, interleaved."""
    n = 256
    rng = np.random.default_rng(37)
    with controller(np.zeros(n, np.float32), 0x370A, free_port) as ctl:
        conns = [_worker(free_port, 0x370A, wid, n) for wid in (1, 2, 3, 4)]
        try:
            for conn in conns:
                conn.hello({})
            for step in range(40):
                for k, conn in enumerate(conns):
                    count = int(rng.integers(10, 31))
                    indices = sorted(rng.choice(n, count, replace=False).tolist())
                    threshold = 0.125 * (1 + (k + step) % 2)
                    conn.send_update(sparse_message(indices, [1] * count, n, threshold), step + 1, 0)
            for conn in conns:
                conn.sync(lambda h, m: None)
        finally:
            for conn in conns:
                conn.close()
        assert ctl.updates_applied == 160 and ctl.counters.frames_rejected == 0
        assert ctl.counters.outliers_flagged == 0 and ctl.counters.peers_dropped == 0


def test_workers_that_left_do_not_hold_the_threshold_bound_down(free_port: int) -> None:
    """The fit's current threshold is the median of the registered workers' latest: the thresholds of
    workers that left (finished Spark tasks, whose successors start again from the reference) counted
    too and refused an honest worker's adaptive threshold (a Spark fit failed on it)."""
    with controller(np.zeros(8, np.float32), 0x370B, free_port) as ctl:
        gone = [_worker(free_port, 0x370B, wid, 8) for wid in (1, 2)]
        for conn in gone:
            conn.hello({})
            _send_all(conn, [sparse_message([1], [1], 8, REFERENCE / 16)] * WARMUP)
            conn.close()  # BYE
        assert wait_until(lambda: not ctl._peers)
        conn = _worker(free_port, 0x370B, 3, 8)
        try:
            conn.hello({})
            _send_all(conn, [sparse_message([0], [-1], 8, 8 * REFERENCE)])  # 16 x the reference at most
        finally:
            conn.close()
        assert ctl.params()[0] == 8 * REFERENCE and ctl.counters.frames_rejected == 0


def test_while_the_others_warm_up_the_bound_is_wider(free_port: int) -> None:
    """A worker's first updates, while an adaptive algorithm finds its level (4x a step with
    decay_rate 0.5), may be far from another's: a Spark fit whose fast worker was 32x ahead of a slow
    one failed on the bound. Until another worker has WARMUP updates, the factor is
    warmup_threshold_factor (1024); then threshold_factor (16)."""
    with controller(np.zeros(8, np.float32), 0x370C, free_port) as ctl:
        slow, fast = _worker(free_port, 0x370C, 1, 8), _worker(free_port, 0x370C, 2, 8)
        try:
            slow.hello({})
            fast.hello({})
            _send_all(slow, [sparse_message([1], [1], 8, REFERENCE / 64)] * (WARMUP - 1))
            _send_all(fast, [sparse_message([0], [-1], 8, 4.0 ** (k - 3) * REFERENCE) for k in range(6)])
            with pytest.raises(TransportError, match="a factor 1024 x the fit's current threshold 0.015625"):
                _send_all(fast, [sparse_message([0], [-1], 8, 32 * REFERENCE)])
            _send_all(slow, [sparse_message([1], [1], 8, REFERENCE / 64)])  # warm: max(16/64, 1) bounds
            with pytest.raises(TransportError, match="a factor 16 x the fit's current threshold 0.015625"):
                _send_all(fast, [sparse_message([0], [-1], 8, 2 * REFERENCE)])
        finally:
            slow.close()
            fast.close()
        assert ctl.updates_applied == WARMUP + 6 and ctl.counters.rejected_reasons == {"threshold": 2}


@contextlib.contextmanager
def _two_warm_and_one_ahead(port: int, job: int, threshold: float) -> Iterator[tuple[list, WorkerConnection]]:
    """Workers 1 and 2 registered with WARMUP updates of ``threshold`` each, and worker 3 registered."""
    warm = [_worker(port, job, wid, 8) for wid in (1, 2)]
    ahead = _worker(port, job, 3, 8)
    try:
        for conn in [*warm, ahead]:
            conn.hello({})
        for conn in warm:
            _send_all(conn, [sparse_message([1], [1], 8, threshold)] * WARMUP)
        yield warm, ahead
    finally:
        for conn in [*warm, ahead]:
            conn.close()


def test_a_worker_running_ahead_of_a_stalled_one_may_climb_as_its_algorithm_does(free_port: int) -> None:
    """A resumed Spark fit failed (under CPU load): one worker ran ~90 steps while the others were
    descheduled, its adaptive threshold climbed 16x from theirs as the algorithm does, and the bound,
    16x their latest, refused it. Another worker's latest now grows by the algorithm's step growth
    (threshold_growth) for every update the sender is ahead of it, so the climb passes, still when the
    stalled workers go on, and a jump over the grown bound does not. (The outlier accounting is widened
    out of the way, as the climb's L1 is 32x theirs.)"""
    growth = 1 / DEFAULT_DECAY_RATE  # AdaptiveThresholdAlgorithm's: it doubles in 20 steps
    start = REFERENCE / 8  # the workers' thresholds, decayed below the reference
    config = dataclasses.replace(FAST, outlier_factor=10**6)
    with controller(
        np.zeros(8, np.float32), 0x370D, free_port, config=config, threshold_growth=growth
    ) as ctl:
        with _two_warm_and_one_ahead(free_port, 0x370D, start) as (stalled, fast):
            climb = [float(np.float32(start * growth**k)) for k in range(1, 101)]  # 32x: past 16x
            _send_all(fast, [sparse_message([0], [-1], 8, t) for t in climb[:90]])
            for conn in stalled:  # they go on, 82 updates behind
                _send_all(conn, [sparse_message([1], [1], 8, start)])
            _send_all(fast, [sparse_message([0], [-1], 8, t) for t in climb[90:]])
            grown = start * growth ** (100 - WARMUP - 1)  # their latest, grown for the fast worker's lead
            with pytest.raises(
                TransportError, match=rf"a factor 16 x the fit's current threshold {grown:.6g}"
            ):
                _send_all(fast, [sparse_message([0], [-1], 8, 16 * grown * 1.001)])
        assert ctl.updates_by_worker[3] == 100 and ctl.counters.rejected_reasons == {"threshold": 1}
        assert ctl.params()[0] == pytest.approx(math.fsum(climb), rel=1e-6)


@pytest.mark.parametrize(
    ("algorithm", "growth"),
    [
        (None, 1 / DEFAULT_DECAY_RATE**2),  # the default: TargetSparsity starting at its target
        (AdaptiveThresholdAlgorithm(1e-3), 1 / DEFAULT_DECAY_RATE),
        (TargetSparsityThresholdAlgorithm(1e-3, decay_rate=0.75), 1 / 0.75),
        (FixedThresholdAlgorithm(1e-3), 1.0),
    ],
)
def test_a_shared_fit_bounds_its_controller_by_its_algorithms_step_growth(algorithm, growth) -> None:
    master = SharedTrainingMaster(batch_size_per_worker=8, threshold_algorithm=algorithm)
    assert master._controller_options()["threshold_growth"] == pytest.approx(growth, rel=1e-15)


def test_a_workers_lead_widens_the_bound_at_most_to_the_warm_ups(free_port: int) -> None:
    """However far ahead, a warm bound is at most warmup_threshold_factor (1024) x the median latest:
    a worker cannot buy a wider one by sending many updates."""
    config = dataclasses.replace(FAST, outlier_factor=10**6)
    with controller(np.zeros(8, np.float32), 0x370F, free_port, config=config, threshold_growth=2.0) as ctl:
        with _two_warm_and_one_ahead(free_port, 0x370F, 0.25) as (_, ahead):
            _send_all(ahead, [sparse_message([0], [-1], 8, 0.25)] * (WARMUP + 12))  # 2**12 > 64
            with pytest.raises(TransportError, match=r"threshold 257.0: must be finite, > 0 and <= 256 "):
                _send_all(ahead, [sparse_message([0], [-1], 8, 257.0)])
            _send_all(ahead, [sparse_message([0], [-1], 8, 256.0)])
        assert ctl.params()[0] == 256.0 + 0.25 * (WARMUP + 12)
        assert ctl.counters.rejected_reasons == {"threshold": 1}


def test_without_a_step_growth_the_bound_does_not_move(free_port: int) -> None:
    """A fixed threshold never rises (threshold_growth 1, the default): a worker 92 updates ahead is
    bounded by the others' latest as it is."""
    with controller(np.zeros(8, np.float32), 0x370E, free_port) as ctl:
        with _two_warm_and_one_ahead(free_port, 0x370E, 0.25) as (_, ahead):
            _send_all(ahead, [sparse_message([0], [-1], 8, 0.25)] * 100)
            with pytest.raises(TransportError, match=r"threshold 4.25: must be finite, > 0 and <= 4 "):
                _send_all(ahead, [sparse_message([0], [-1], 8, 4.25)])
        assert ctl.counters.rejected_reasons == {"threshold": 1}


def _next_update(sock: zmq.Socket) -> bytes:
    """The next UPDATE frame the controller sends a (rogue) relay, skipping its control frames."""
    while True:
        assert sock.poll(10000)
        frame = sock.recv()
        if frame[5] == MessageType.UPDATE:
            return frame


@pytest.mark.parametrize("attack", ["none", "forge", "repeat", "replace"])
def test_a_compromised_mesh_relay_cannot_forge_or_replace_updates_for_its_subtree(
    free_port: int, attack: str
) -> None:
    """A compromised MESH relay holds the HMAC secret, so it made its child apply an update "from" a
    worker that never joined (forge), one repeating an index (repeat), or a real update altered
    (replace). The controller now signs every update it relays over everything no hop rewrites
    (sender, sequence, broadcast number, payload) and a child drops one without a valid signature
    (bad_signature): it applies nothing forged, and the next real update shows the gap, so it takes the
    controller's parameters. An honest relay's updates are applied (none)."""
    job = 0x370D
    mesh = dataclasses.replace(FAST, connect_timeout_ms=5000, sync_timeout_ms=5000, mesh_fan_out=1)
    with controller(np.zeros(4, np.float32), job, free_port, config=mesh, mesh=True) as ctl:
        ctx = zmq.Context()
        rogue_relay = curve_server(ctx.socket(zmq.ROUTER))
        rogue_relay.setsockopt(zmq.LINGER, 0)
        relay_port = rogue_relay.bind_to_random_port("tcp://127.0.0.1")
        rogue = raw_dealer(ctx, free_port)
        applied: list[tuple[int, np.ndarray]] = []
        params: list[np.ndarray] = []
        child = _worker(
            free_port, job, 5, 4, relay_host="127.0.0.1", on_params=lambda p, i, e: params.append(p)
        )
        honest = _worker(free_port, job, 7, 4, relay_host="127.0.0.1", on_params=lambda p, i, e: None)
        try:
            hello = json_payload(relay_hello(f"127.0.0.1:{relay_port}"))
            rogue.send(bytes(encode_frame(KEY, MessageType.HELLO, job, 66, 0, hello)))
            assert rogue.poll(10000) and rogue.poll(10000)
            child.hello({})
            honest.hello({})
            assert ctl.mesh_tree() == {66: 0, 5: 66, 7: 5}
            identity, _ = rogue_relay.recv_multipart()  # the child's MESH_JOIN
            honest.send_update(sparse_message([1], [1], 4, 1.0), 1, 0)
            real = _next_update(rogue)  # broadcast 1, signed by the controller
            if attack == "none":
                sent = relayed_frame(KEY, real, recipient=5, relay=66)
            elif attack == "replace":  # the real frame, its last payload byte changed
                altered = bytearray(real)
                altered[-SIGNATURE_SIZE - 1] ^= 1
                sent = relayed_frame(KEY, altered, recipient=5, relay=66)
            else:  # from a worker that never joined, or repeating an index
                message = sparse_message(
                    [0] * 4 if attack == "repeat" else [2], [1] * 4 if attack == "repeat" else [1], 4, 1.0
                )
                sent = encode_frame(
                    KEY,
                    MessageType.UPDATE,
                    job,
                    66 if attack == "repeat" else 77,
                    1,
                    memoryview(message),
                    flags=Flag.RELAYED,
                    relay=66,
                    broadcast=1,
                    recipient=5,
                )
            rogue_relay.send_multipart([identity, bytes(sent)])
            honest.send_update(sparse_message([3], [1], 4, 1.0), 2, 0)
            rogue_relay.send_multipart(
                [identity, bytes(relayed_frame(KEY, _next_update(rogue), recipient=5, relay=66))]
            )

            def pump() -> bool:  # until it has applied or resynchronised past broadcast 2
                child.drain(lambda h, m: applied.append((h.sender, m.copy())))
                return len(applied) == 2 or child.resyncs > 0

            assert wait_until(pump, 10)
            if attack == "none":
                assert [s for s, _ in applied] == [7, 7] and child.resyncs == 0
                assert "bad_signature" not in child.counters.rejected_reasons
            else:
                assert applied == [] and child.resyncs == 1
                assert child.counters.rejected_reasons.get("bad_signature") == 1
                assert wait_until(lambda: (child.drain(lambda h, m: None), params)[1] != [])
                np.testing.assert_array_equal(params[-1], ctl.params())
        finally:
            child.close()
            honest.close()
            rogue.close()
            rogue_relay.close()
            ctx.term()
