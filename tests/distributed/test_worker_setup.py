"""SharedWorker's set-up against a real controller on 127.0.0.1: a failure after the join (the encoding
buffers not fitting on a GPU, say) closes the worker's connection instead of leaking its socket."""

from __future__ import annotations

import numpy as np
import pytest
from wire_helpers import controller, worker_job

from sparkgrad import compress
from sparkgrad.compress import FixedThresholdAlgorithm
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.spark import shared_worker


def test_a_failure_after_the_join_closes_the_connection(free_port: int, monkeypatch) -> None:
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation="tanh"), OutputLayer(3)], input_type=InputType.feed_forward(4), seed=1
    )
    net = MultiLayerNetwork(conf).init()
    closed = []
    close = shared_worker.WorkerConnection.close

    def recording_close(conn) -> None:
        closed.append(conn)
        close(conn)

    def no_memory(*args, **kwargs):
        raise MemoryError("out of memory allocating the residual")

    monkeypatch.setattr(shared_worker.WorkerConnection, "close", recording_close)
    monkeypatch.setattr(shared_worker, "EncodingHandler", no_memory)
    job = 0x5E7
    with controller(net.params().copy(), job, free_port, decode=compress.decode):
        spark_job = worker_job(net, job, free_port, threshold_algorithm=FixedThresholdAlgorithm(1e-3))
        with pytest.raises(MemoryError, match="allocating the residual"):
            shared_worker.SharedWorker(spark_job, "cpu")
    assert len(closed) == 1 and isinstance(closed[0], shared_worker.WorkerConnection)
    assert np.isfinite(net.params()).all()
