"""Late and restarted workers: the latest updater state from the controller; re-run tasks are counted."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from wire_helpers import CONTROLLER_KEY, CURVE_KEY, FAST, REFERENCE, SECRET, controller, wait_until

from sparkgrad.errors import TransportError
from sparkgrad.transport import MessageType, WorkerConnection

pytestmark = pytest.mark.distributed

N = 10
STATE = 2 * N  # an Adam-like state: two values per parameter


def _worker(port: int, wid: int) -> WorkerConnection:
    return WorkerConnection(
        "127.0.0.1",
        port,
        7,
        wid,
        SECRET,
        N,
        FAST,
        updater_state_bytes=4 * STATE,
        controller_key=CONTROLLER_KEY,
        curve_key=CURVE_KEY,
        threshold_reference=REFERENCE,
    )


def test_a_joining_worker_starts_from_the_latest_reported_updater_state(free_port: int) -> None:
    start = np.zeros(STATE, np.float32)
    with controller(np.ones(N, np.float32), 7, free_port, updater_state=start) as ctl:
        first, second, late = _worker(free_port, 1), _worker(free_port, 2), _worker(free_port, 3)
        try:
            first.hello({})
            assert first.updater_state is None  # nothing reported yet: the fit's start state holds
            reported = np.arange(STATE, dtype=np.float32) / 7
            first.send_updater_state(reported, iteration=4)
            first.sync(lambda h, m: None)  # ZeroMQ order: the report is stored before the ACK
            second.hello({})
            np.testing.assert_array_equal(second.updater_state, reported)
            assert second.updater_state_iteration == 4  # the state's own iteration, not the controller's
            newer = reported * -3
            second.send_updater_state(newer, iteration=9)
            second.sync(lambda h, m: None)
            params, _, _ = late.hello({})
            np.testing.assert_array_equal(late.updater_state, newer)
            assert late.updater_state_iteration == 9
            np.testing.assert_array_equal(params, np.ones(N, np.float32))
            np.testing.assert_array_equal(ctl.updater_state(), newer)
            assert ctl.updater_state_reports == 2
        finally:
            for conn in (first, second, late):
                conn.close()


def test_final_updater_states_are_kept_per_worker_apart_from_the_joining_state(free_port: int) -> None:
    """A FINAL report (a task's state at its end, for the driver's mean) is kept per worker with a count of
    that worker's FINAL reports; it is not what a joining worker starts from."""
    start = np.zeros(STATE, np.float32)
    with controller(np.ones(N, np.float32), 7, free_port, updater_state=start) as ctl:
        first, second, late = _worker(free_port, 1), _worker(free_port, 2), _worker(free_port, 3)
        try:
            first.hello({})
            second.hello({})
            a, b = np.arange(STATE, dtype=np.float32), np.full(STATE, -2.5, np.float32)
            first.send_updater_state(a, iteration=4, final=True)
            first.send_updater_state(a * 3, iteration=6, final=True)  # its next task's
            second.send_updater_state(b, iteration=5, final=True)
            for conn in (first, second):
                conn.sync(lambda h, m: None)  # ZeroMQ order: the reports are stored before the ACK
            finals = ctl.final_updater_states()
            assert sorted(finals) == [1, 2]
            assert finals[1][0] == 2 and finals[2][0] == 1
            np.testing.assert_array_equal(finals[1][1], a * 3)
            np.testing.assert_array_equal(finals[2][1], b)
            late.hello({})
            assert late.updater_state is None  # joining workers: still the fit's start state
            assert ctl.updater_state_reports == 0
            np.testing.assert_array_equal(ctl.updater_state(), start)
        finally:
            for conn in (first, second, late):
                conn.close()


@pytest.mark.parametrize("final", [False, True], ids=["report", "final"])
@pytest.mark.parametrize("size, dtype", [(STATE - 1, np.float32), (STATE, np.float64), (0, np.float32)])
def test_an_updater_state_that_does_not_fit_the_job_is_rejected(free_port: int, size, dtype, final) -> None:
    start = np.full(STATE, 5.0, np.float32)
    with controller(np.ones(N, np.float32), 7, free_port, updater_state=start) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            free_port,
            7,
            1,
            SECRET,
            N,
            FAST,
            updater_state_bytes=8 * STATE,
            controller_key=CONTROLLER_KEY,
            curve_key=CURVE_KEY,
            threshold_reference=REFERENCE,
        )
        try:
            conn.hello({})
            conn.send_updater_state(np.ones(size, dtype), iteration=1, final=final)
            with pytest.raises(TransportError, match="updater state from worker 1 does not fit this job"):
                conn.sync(lambda h, m: None)
        finally:
            conn.close()
        np.testing.assert_array_equal(ctl.updater_state(), start)
        assert ctl.updater_state_reports == 0
        assert ctl.final_updater_states() == {}
        assert ctl.counters.rejected_reasons == {"malformed": 1}


def test_minibatches_a_rerun_task_trains_again_are_counted(free_port: int) -> None:
    with controller(np.ones(N, np.float32), 7, free_port) as ctl:
        original, rerun = _worker(free_port, 1), _worker(free_port, 2)
        try:
            original.hello({})
            original.sync(lambda h, m: None, {"partition": 0, "minibatches": 5}, epoch=3)
            original.sync(lambda h, m: None, {"partition": 1, "minibatches": 4}, epoch=3)
            assert ctl.retrained_minibatches == 0
            rerun.hello({})  # a retried task trains partition 0 of epoch 3 again
            rerun.sync(lambda h, m: None, {"partition": 0, "minibatches": 5}, epoch=3)
            rerun.sync(lambda h, m: None, {"partition": 0, "minibatches": 6}, epoch=4)
            assert ctl.retrained_minibatches == 5
        finally:
            original.close()
            rerun.close()


@pytest.mark.parametrize(
    "report", [{"partition": -1, "minibatches": 1}, {"partition": 0, "minibatches": "5"}, {"partition": True}]
)
def test_a_malformed_training_report_is_rejected_with_an_error(free_port: int, report) -> None:
    with controller(np.ones(N, np.float32), 7, free_port) as ctl:
        conn = _worker(free_port, 1)
        try:
            conn.hello({})
            with pytest.raises(TransportError, match="bad training report"):
                conn.sync(lambda h, m: None, report)
        finally:
            conn.close()
        assert ctl.retrained_minibatches == 0 and ctl.counters.rejected_reasons == {"malformed": 1}


def _end_epoch_in_thread(
    conn: WorkerConnection, epoch: int, out: dict, report: dict | None = None
) -> threading.Thread:
    def run() -> None:
        try:
            out[conn.worker_id] = conn.end_epoch(epoch, lambda h, m: None, report)
        except TransportError as exc:
            out[conn.worker_id] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _barrier_of_two(port: int) -> Iterator[tuple[Any, list[WorkerConnection]]]:
    """A controller whose epoch barrier expects two workers (partitions), and three registered workers
    (ids 1, 2, 3), closed afterwards."""
    with controller(np.ones(N, np.float32), 7, port) as ctl:
        ctl.expect_workers(2)
        conns = [_worker(port, wid) for wid in (1, 2, 3)]
        try:
            for conn in conns:
                conn.hello({})
            yield ctl, conns
        finally:
            for conn in conns:
                conn.close()


def test_the_epoch_barrier_waits_for_every_worker_and_forgets_one_that_left(free_port: int) -> None:
    with _barrier_of_two(free_port) as (ctl, (a, b, c)):
        out: dict = {}
        waiting = _end_epoch_in_thread(a, 0, out)
        assert ctl.next_finished_epoch(0.3) is None  # one of two workers: not finished
        b.close()  # a worker that never reported leaves: still one of two
        assert ctl.next_finished_epoch(0.3) is None
        late = _end_epoch_in_thread(c, 0, out)
        assert ctl.next_finished_epoch(20) == 0
        ctl.release_epoch(0, stop=True)
        waiting.join(20)
        late.join(20)
        assert out == {1: True, 3: True}
        # a worker reporting an epoch already decided gets the decision at once
        assert c.end_epoch(0, lambda h, m: None) is True


def test_pending_epoch_reports_of_a_worker_that_left_do_not_count(free_port: int) -> None:
    with _barrier_of_two(free_port) as (ctl, (a, b, c)):
        received = ctl.counters.messages_received
        a._send(MessageType.EPOCH_END, epoch=5)  # reports epoch 5, then its task is killed
        a.close()
        # the controller reads its peers fairly, not in the order they sent: b's report must come after
        # a's EPOCH_END and BYE, as it does when a task dies long before the others finish
        assert wait_until(lambda: ctl.counters.messages_received >= received + 2)
        out: dict = {}
        received = ctl.counters.messages_received
        second = _end_epoch_in_thread(b, 5, out)
        # b's report reached the controller (no time window), and a's no longer counts with it
        assert wait_until(lambda: ctl.counters.messages_received > received)
        assert ctl.next_finished_epoch(0.5) is None
        third = _end_epoch_in_thread(c, 5, out)
        assert ctl.next_finished_epoch(20) == 5
        ctl.release_epoch(5, stop=False)
        second.join(20)
        third.join(20)
        assert out == {2: False, 3: False}


def test_a_partition_reported_again_by_a_rerun_task_counts_once(free_port: int) -> None:
    """A task killed after its EPOCH_END (no BYE) and its re-run, a new worker on the same partition, must
    not make two of two: the epoch waits for the other partition, which nobody has trained yet."""
    with _barrier_of_two(free_port) as (ctl, (killed, rerun, other)):
        out: dict = {}
        received = ctl.counters.messages_received
        first = _end_epoch_in_thread(killed, 0, out, {"partition": 0, "minibatches": 4})
        assert wait_until(lambda: ctl.counters.messages_received > received)  # the report arrived
        assert ctl.next_finished_epoch(0.3) is None
        again = _end_epoch_in_thread(rerun, 0, out, {"partition": 0, "minibatches": 4})
        # the re-run's report was counted as retraining (no time window), and partition 0 twice is
        # still one of two
        assert wait_until(lambda: ctl.retrained_minibatches == 4)
        assert ctl.next_finished_epoch(0.5) is None
        last = _end_epoch_in_thread(other, 0, out, {"partition": 1, "minibatches": 3})
        assert ctl.next_finished_epoch(20) == 0
        ctl.release_epoch(0, stop=False)
        for thread in (first, again, last):
            thread.join(20)
        assert out == {1: False, 2: False, 3: False}  # every worker that reported is released


def test_a_partition_beyond_the_expected_ones_is_rejected(free_port: int) -> None:
    with _barrier_of_two(free_port) as (ctl, (conn, _, _)):
        with pytest.raises(TransportError, match="bad training report"):
            conn.end_epoch(0, lambda h, m: None, {"partition": 2, "minibatches": 1})
        assert ctl.next_finished_epoch(0.3) is None
        assert ctl.counters.rejected_reasons == {"malformed": 1}
