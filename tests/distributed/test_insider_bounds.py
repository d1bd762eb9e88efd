"""What a compromised executor (it holds the fit's secret) can do, bounded (issue 37): safe defaults of a
worker's threshold check, loss reports that cannot make a fit's figures non-finite."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from wire_helpers import CONTROLLER_KEY, FAST, REFERENCE, SECRET, controller, sparse_decode

from sparkgrad.transport import WorkerConnection

pytestmark = pytest.mark.distributed

HUGE = 1.7e308  # finite; two of them overflow a plain sum


def _worker(port: int, job: int, wid: int, n: int, key: bytes = CONTROLLER_KEY, **kw) -> WorkerConnection:
    kw.setdefault("threshold_reference", REFERENCE)
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
    from sparkgrad.spark.progress import FitProgress
    from sparkgrad.spark.shared import _ProgressController

    progress = FitProgress(1, 0, 10, 10, enabled=False)
    ctl = _ProgressController(
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
    conns = [_worker(free_port, 0x3705, wid, 2, key=ctl.controller_key) for wid in (1, 2, 3, 4, 5)]
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
