"""ParameterAveragingTrainingMaster's rounds over the transport: AVERAGE/AVERAGED between real
WorkerConnections and a Controller(averaging=True) on 127.0.0.1 (the Spark side is
tests/spark/test_averaging_jobs.py)."""

from __future__ import annotations

import threading

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
    sparse_message,
    wait_until,
)

from sparkgrad.errors import TransportError
from sparkgrad.nn.trained_ranges import TrainedRanges
from sparkgrad.transport import FrameKey, MessageType, WorkerConnection, encode_frame
from sparkgrad.transport.frame import averaging_payload, float_flag, json_payload

pytestmark = pytest.mark.distributed

JOB = 77


def _connect(port: int, wid: int, values: int, params: int = 3) -> WorkerConnection:
    conn = WorkerConnection(
        "127.0.0.1",
        port,
        JOB,
        wid,
        SECRET,
        params,
        FAST,
        updater_state_bytes=8,
        average_values=values,
        controller_key=CONTROLLER_KEY,
        curve_key=CURVE_KEY,
        threshold_reference=REFERENCE,
    )
    conn.hello({})
    return conn


def _contribute(conn: WorkerConnection, report: dict, values: np.ndarray | None) -> None:
    """An AVERAGE for epoch 0, round 0, without waiting for the round's mean."""
    flags = float_flag(values) if values is not None else 0
    conn._send(MessageType.AVERAGE, averaging_payload(report, values), flags=flags)


def _in_threads(*calls):
    """Run the calls at once (a round waits for every partition); their results or exceptions."""
    out: list = [None] * len(calls)

    def run(i, call):
        try:
            out[i] = call()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_round_mean_of_parameters_and_updater_state(free_port: int) -> None:
    """The mean covers the partitions that had data (DL4J excludes empty ones), in float64 partition
    order; the iteration advances by the round's largest minibatch count; a round where no partition had
    data changes nothing."""
    state = np.zeros(2, np.float32)
    with controller(
        np.zeros(3, np.float32),
        JOB,
        free_port,
        iteration=10,
        updater_state=state,
        averaging=True,
        average_updater_state=True,
    ) as ctl:
        ctl.expect_workers(3)
        conns = [_connect(free_port, wid, 5) for wid in (1, 2, 3)]
        try:
            a = np.array([1, 2, 3, 10, 20], np.float32)
            b = np.array([3, 4, 5, 30, 40], np.float32)
            got = _in_threads(
                lambda: conns[0].average(0, 0, {"partition": 0, "minibatches": 2, "score": 1.0}, a),
                lambda: conns[1].average(0, 0, {"partition": 1, "minibatches": 3, "score": 3.0}, b),
                lambda: conns[2].average(0, 0, {"partition": 2, "minibatches": 0, "score": None}, None),
            )
            for body, mean in got:
                assert body == {"iteration": 13, "workers": 2, "score": 2.0}
                np.testing.assert_array_equal(mean, [2, 3, 4, 20, 30])
            np.testing.assert_array_equal(ctl.params(), [2, 3, 4])
            np.testing.assert_array_equal(ctl.updater_state(), [20, 30])
            empty = _in_threads(
                *(
                    lambda c=c, p=p: c.average(0, 1, {"partition": p, "minibatches": 0}, None)
                    for p, c in enumerate(conns)
                )
            )
            assert all(
                body == {"iteration": 13, "workers": 0, "score": None} and mean is None
                for body, mean in empty
            )
            assert (
                ctl.rounds_averaged == 2 and ctl.round_scores == [(0, 13, 2.0)] and ctl.next_iteration == 13
            )
            np.testing.assert_array_equal(ctl.params(), [2, 3, 4])
        finally:
            for c in conns:
                c.close()


def test_averaged_ranges_leave_the_frozen_parameters_as_they_were(free_port: int) -> None:
    """With ``averaged_ranges`` the vectors hold the trained parameters only (entries 0, 3 and 4 of 5,
    then the updater state): their mean goes to exactly those entries, the frozen ones keep their value
    bit for bit, and a vector of all 5 parameters is refused as malformed."""
    params = np.array([0, 7.25, -3.5, 0, 0], np.float32)
    ranges = TrainedRanges.of([(0, 1), (3, 5)], 5)
    with controller(
        params,
        JOB,
        free_port,
        updater_state=np.zeros(2, np.float32),
        averaging=True,
        average_updater_state=True,
        averaged_ranges=ranges,
    ) as ctl:
        ctl.expect_workers(2)
        conns = [_connect(free_port, wid, 3 + 2, params=5) for wid in (1, 2)]
        try:
            a = np.array([1, 2, 3, 10, 20], np.float32)
            b = np.array([3, 4, 5, 30, 40], np.float32)
            got = _in_threads(
                lambda: conns[0].average(0, 0, {"partition": 0, "minibatches": 1, "score": 1.0}, a),
                lambda: conns[1].average(0, 0, {"partition": 1, "minibatches": 1, "score": 3.0}, b),
            )
            for _, mean in got:
                np.testing.assert_array_equal(mean, [2, 3, 4, 20, 30])
            np.testing.assert_array_equal(ctl.params(), [2, 7.25, -3.5, 3, 4])
            np.testing.assert_array_equal(ctl.updater_state(), [20, 30])
            report = {"partition": 0, "minibatches": 1, "score": 0.5}
            with pytest.raises(TransportError, match="expected 5 float32"):
                conns[0].average(0, 1, report, np.zeros(5 + 2, np.float32))
        finally:
            for c in conns:
                c.close()


def test_averaged_ranges_of_another_parameter_count_are_refused() -> None:
    with pytest.raises(ValueError, match="ranges: cover 4 parameters, the controller has 3"):
        controller(np.zeros(3, np.float32), JOB, 1, averaging=True, averaged_ranges=TrainedRanges.of([], 4))


def test_bad_contributions_are_refused_and_updates_are_not_taken(free_port: int) -> None:
    with controller(np.zeros(3, np.float32), JOB, free_port, averaging=True) as ctl:
        ctl.expect_workers(2)
        conn = _connect(free_port, 1, 3)
        try:
            with pytest.raises(TransportError, match="expected 3 float32"):
                conn.average(0, 0, {"partition": 0, "minibatches": 1, "score": 0.5}, np.zeros(4, np.float32))
            with pytest.raises(TransportError, match="bad averaging report"):
                conn.average(0, 0, {"partition": 2, "minibatches": 1, "score": 0.5}, np.zeros(3, np.float32))
            with pytest.raises(TransportError, match="non-finite"):
                conn.average(
                    0, 0, {"partition": 0, "minibatches": 1, "score": 0.5}, np.full(3, np.nan, np.float32)
                )
            with pytest.raises(TransportError, match="no AVERAGE values"):
                conn.average(0, 0, {"partition": 0, "minibatches": 4}, None)
            with pytest.raises(TransportError, match="unexpected UPDATE"):
                conn.send_update(sparse_message([0], [1], 3, 0.5), 0, 0)
                conn.sync(lambda h, m: None)
            assert ctl.updates_applied == 0 and ctl.rounds_averaged == 0
            reasons = ctl.counters.rejected_reasons
            assert reasons["malformed"] == 3 and reasons["non_finite"] == 1 and reasons["unexpected"] == 1
        finally:
            conn.close()


def test_a_partition_reporting_a_round_twice_is_refused(free_port: int) -> None:
    with controller(np.zeros(3, np.float32), JOB, free_port, averaging=True) as ctl:
        ctl.expect_workers(2)
        first, second = _connect(free_port, 1, 3), _connect(free_port, 2, 3)
        try:
            ones = np.ones(3, np.float32)
            _contribute(first, {"partition": 0, "minibatches": 1, "score": 0.0}, ones)
            # the first report must reach the controller first: on a loaded machine the second worker's
            # frame overtook it once, and the refused duplicate was then the first worker's
            assert wait_until(lambda: 0 in ctl._rounds.get((0, 0), {}))
            with pytest.raises(TransportError, match="reported round"):
                second.average(0, 0, {"partition": 0, "minibatches": 1, "score": 0.0}, ones)
            assert ctl.rounds_averaged == 0
        finally:
            first.close()
            second.close()


def test_a_worker_beyond_the_barrier_stops_the_controller(free_port: int) -> None:
    """A Spark re-run of the barrier stage brings new worker ids: the rounds cannot be resumed, so the
    controller stops with the reason (the driver then fails the fit) instead of averaging with a worker
    that starts from the wrong round."""
    with controller(np.zeros(3, np.float32), JOB, free_port, averaging=True) as ctl:
        ctl.expect_workers(2)
        conn = _connect(free_port, 1, 3)
        try:
            second = _connect(free_port, 2, 3)  # the barrier's two workers
            second.close()
            with pytest.raises(TransportError):
                _connect(free_port, 9, 3)
            assert wait_until(lambda: ctl.error is not None)
            assert "cannot be resumed" in str(ctl.error)
        finally:
            conn.close()


def test_a_forged_averaged_frame_is_refused_by_a_sharing_worker(free_port: int) -> None:
    """AVERAGED is taken only by a worker that averages: a gradient-sharing worker drops it (link)."""
    ctx = zmq.Context()
    router = curve_server(ctx.socket(zmq.ROUTER))
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{free_port}")
    conn = WorkerConnection(
        "127.0.0.1",
        free_port,
        JOB,
        5,
        SECRET,
        3,
        FAST,
        controller_key=CONTROLLER_KEY,
        curve_key=CURVE_KEY,
        threshold_reference=REFERENCE,
    )
    try:
        conn._send(MessageType.HELLO, json_payload({}))
        identity, _ = router.recv_multipart()
        mean = np.ones(3, np.float32)
        frame = encode_frame(
            FrameKey(SECRET),
            MessageType.AVERAGED,
            JOB,
            0,
            0,
            averaging_payload({"iteration": 1}, mean),
            flags=float_flag(mean),
            recipient=5,
        )
        router.send_multipart([identity, frame])
        assert wait_until(lambda: conn.drain(lambda h, m: None) == 0 and conn.counters.frames_rejected == 1)
        assert conn.counters.rejected_reasons == {"oversized": 1}
    finally:
        conn.close()
        router.close()
        ctx.term()
