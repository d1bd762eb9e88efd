"""SharedTrainingMaster's worker step (spark/shared_worker.py) with momentum factor masking on and off,
against a real controller on 127.0.0.1 (ParallelWrapper's in-process step: tests/python)."""

from __future__ import annotations

import numpy as np
import pytest
from wire_helpers import controller, worker_job

from sparkgrad import compress
from sparkgrad.compress import FixedThresholdAlgorithm
from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Nesterovs
from sparkgrad.spark import shared_worker


@pytest.mark.parametrize("masking", [True, False], ids=["masked", "dl4j"])
def test_the_worker_zeroes_its_velocity_where_its_message_sent(free_port: int, masking: bool) -> None:
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
    job = 0x5A1
    with controller(net.params().copy(), job, free_port, decode=compress.decode):
        spark_job = worker_job(
            net, job, free_port, threshold_algorithm=FixedThresholdAlgorithm(2e-3), momentum_masking=masking
        )
        worker = shared_worker.SharedWorker(spark_job, "cpu")
        try:
            for _ in range(4):
                worker.step(batch)
            sent = worker._scratch != 0  # the last message, decoded
            assert 0 < sent.sum() < sent.size
            velocity = worker.net.updater_state()
            if masking:
                assert np.all(velocity[sent] == 0) and np.count_nonzero(velocity[~sent]) > 0
            else:
                assert np.count_nonzero(velocity[sent]) > 0
        finally:
            worker.close()
