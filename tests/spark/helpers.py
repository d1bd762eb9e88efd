"""Small networks and data helpers shared by the Spark tests."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

import numpy as np

from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import TrainingHook


def mlp_conf(
    hidden: int = 128, seed: int = 1, n_out: int = 10, loss: str = "mcxent", activation: str = "softmax"
) -> MultiLayerConfiguration:
    return MultiLayerConfiguration(
        [DenseLayer(hidden, activation="relu"), OutputLayer(n_out, activation=activation, loss=loss)],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-2),
        seed=seed,
    )


def local_network(train: DataSet, epochs: int = 2) -> MultiLayerNetwork:
    """A network trained locally (fast) for the inference/evaluation tests."""
    net = MultiLayerNetwork(mlp_conf()).init()
    for _ in range(epochs):
        net.fit(train.split(32))
    return net


def subset(ds: DataSet, n: int) -> DataSet:
    return DataSet(ds.features[:n], ds.labels[:n])


def accuracy(net: MultiLayerNetwork, test: DataSet) -> float:
    return float(np.mean(net.output(test.features).argmax(1) == test.labels.argmax(1)))


def port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RecordingHook(TrainingHook):
    """Writes one file per update (hooks run on the executors): pre-<unique id>-<examples>."""

    directory: str = ""

    def pre_update(self, dataset, network) -> None:
        name = f"pre-{uuid.uuid4().hex}-{dataset.num_examples()}"
        open(os.path.join(self.directory, name), "w").close()

    def post_update(self, dataset, network) -> None:
        if network.iteration_count < 1:
            raise AssertionError("post_update before any iteration")


class NpzLoader:
    """A custom fit_paths loader: .npz files with arrays x and y."""

    def __call__(self, path: str) -> DataSet:
        with np.load(path) as z:
            return DataSet(z["x"], z["y"])


def foreign_address() -> str:
    """A documentation (TEST-NET) address that is not one of this machine's: never bindable here."""
    from sparkgrad.spark.config import _local_addresses

    local = set(_local_addresses())
    return next(a for a in ("192.0.2.1", "198.51.100.1", "203.0.113.1") if a not in local)
