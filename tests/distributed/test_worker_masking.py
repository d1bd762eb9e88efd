"""SharedTrainingMaster's worker step (spark/shared_worker.py) with momentum factor masking on and off,
against a real controller on 127.0.0.1 (ParallelWrapper's in-process step: tests/python)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from wire_helpers import controller, worker_job

from sparkgrad import compress
from sparkgrad.compress import FixedThresholdAlgorithm
from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Nesterovs
from sparkgrad.spark import shared_worker


def _net_and_batch() -> tuple[MultiLayerNetwork, DataSet]:
    """A small Nesterov-momentum network and one minibatch of a 3-class problem."""
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(4),
        updater=Nesterovs(0.1, 0.9),
        seed=1,
    )
    net = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    batch = DataSet(x, np.eye(3, dtype=np.float32)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)])
    return net, batch


@contextlib.contextmanager
def _lone_worker(net: MultiLayerNetwork, port: int, **options) -> Iterator[shared_worker.SharedWorker]:
    """A SharedTrainingMaster worker of ``net`` (threshold fixed at 2e-3, the job's ``options``) joined to
    a real controller with no other worker."""
    job = 0x5A1
    with controller(net.params().copy(), job, port, decode=compress.decode):
        spark_job = worker_job(net, job, port, threshold_algorithm=FixedThresholdAlgorithm(2e-3), **options)
        worker = shared_worker.SharedWorker(spark_job, "cpu")
        try:
            yield worker
        finally:
            worker.close()


@pytest.mark.parametrize("masking", [True, False], ids=["masked", "dl4j"])
def test_the_worker_zeroes_its_velocity_where_its_message_sent(free_port: int, masking: bool) -> None:
    net, batch = _net_and_batch()
    with _lone_worker(net, free_port, momentum_masking=masking) as worker:
        for _ in range(4):
            worker.step(batch)
        sent = worker._scratch != 0  # the last message, decoded
        assert 0 < sent.sum() < sent.size
        velocity = worker.net.updater_state()
        if masking:
            assert np.all(velocity[sent] == 0) and np.count_nonzero(velocity[~sent]) > 0
        else:
            assert np.count_nonzero(velocity[sent]) > 0


@pytest.mark.parametrize("own_update", ["full", "encoded"])
def test_the_worker_applies_its_own_update_as_own_update_says(free_port: int, own_update: str) -> None:
    """Alone (no peer messages), a worker applying its whole update trains exactly as local training does,
    and keeps its unsent residual applied when it takes the controller's parameters; with "encoded" it
    moves only by what its messages carry."""
    net, batch = _net_and_batch()
    local = net.clone()
    with _lone_worker(net, free_port, own_update=own_update) as worker:
        sent = np.zeros_like(net.params())
        for _ in range(4):
            worker.step(batch)
            sent += worker._scratch  # the step's message, decoded
            local.apply_update(local.compute_update(batch)[0])
        residual = worker.handler.residual.copy()
        assert np.abs(residual).max() > 1e-3  # something unsent, far above float32 rounding
        if own_update == "full":
            np.testing.assert_array_equal(worker.net.params(), local.params())
        else:
            np.testing.assert_allclose(worker.net.params(), net.params() - sent, rtol=0, atol=1e-6)
        # a re-join or MESH resynchronisation hands the worker the controller's parameters
        taken = net.params() - sent
        worker._set_params(taken)
        expected = taken - residual if own_update == "full" else taken
        np.testing.assert_array_equal(worker.net.params(), expected)
