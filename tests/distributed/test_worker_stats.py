"""The per-iteration records of SharedTrainingMaster's worker step (spark/shared_worker.py), against a real
controller on 127.0.0.1."""

from __future__ import annotations

import numpy as np
from wire_helpers import controller, worker_job

from sparkgrad import compress
from sparkgrad.compress import FixedThresholdAlgorithm
from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Sgd
from sparkgrad.spark import shared_worker
from sparkgrad.spark.stats import SparkTrainingStats


def _batch(seed: int) -> DataSet:
    x = np.random.default_rng(seed).normal(size=(16, 4)).astype(np.float32)
    return DataSet(x, np.eye(3, dtype=np.float32)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)])


def _encoded(message: np.ndarray, n: int) -> int:
    decoded = np.zeros(n, np.float32)
    compress.decode(message, decoded)
    return shared_worker.encoded_count(message, decoded, is_bitmap=message[3] == 1)


def test_the_density_is_the_workers_own_message_not_a_peers_applied_while_pacing(free_port: int) -> None:
    # Worker b's drain is switched off, so every peer update it applies arrives while it paces, after its
    # own message was decoded into the same buffer: the record must still describe its own message.
    conf = MultiLayerConfiguration(
        [DenseLayer(32, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(4),
        updater=Sgd(0.5),
        seed=1,
    )
    net = MultiLayerNetwork(conf).init()
    n, job = net.num_params(), 0x5A2
    with controller(net.params().copy(), job, free_port, decode=compress.decode):
        options = {"threshold_algorithm": FixedThresholdAlgorithm(2e-2), "staleness_window": 1}
        a = shared_worker.SharedWorker(worker_job(net, job, free_port, **options), "cpu")
        b = shared_worker.SharedWorker(worker_job(net, job, free_port, **options), "cpu")
        b.stats = SparkTrainingStats()  # what run_task gives a worker of a fit that collects statistics
        try:
            # each of a's paced steps after the first waits until the controller applied its previous
            # update, so those reach b before the acknowledgement b waits for in its second step
            for seed in range(3):
                a.step(_batch(seed))
            b.conn.drain = lambda on_update: None
            own, peers = [], []
            send, apply_peer = b.conn.send_update, b._on_peer
            b.conn.send_update = lambda msg, *rest: own.append(_encoded(msg, n)) or send(msg, *rest)
            b._on_peer = lambda header, msg: peers.append(_encoded(msg, n)) or apply_peer(header, msg)
            last_peer_of_step = []
            for seed in range(10, 13):
                applied = len(peers)
                b.step(_batch(seed))
                last_peer_of_step.append(peers[-1] if len(peers) > applied else None)
            assert len(peers) >= 2 and len(own) == 3
            # the test tells the two apart: a peer's update applied after b's own has another count
            assert any(p is not None and p != c for p, c in zip(last_peer_of_step, own))
            densities = [r["density"] for r in b.stats.series()[b.tag]]
            assert densities == [c / n for c in own]
        finally:
            a.close()
            b.close()
