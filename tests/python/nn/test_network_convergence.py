"""Convergence on scikit-learn's bundled digits: a seeded MLP and a seeded CNN reach >= 97% test accuracy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import sparkgrad
from sparkgrad.data import ListDataSetIterator
from sparkgrad.datasets import load_digits
from sparkgrad.nn import (
    ConvolutionLayer,
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SubsamplingLayer,
    updaters,
)

pytest.importorskip("sklearn")


@pytest.fixture
def single_thread() -> Iterator[None]:
    """Tiny matrices: one thread avoids oversubscribing a loaded CI machine (results do not depend on it)."""
    previous = sparkgrad.get_num_threads()
    sparkgrad.set_num_threads(1)
    yield
    sparkgrad.set_num_threads(previous)


def _train(conf: MultiLayerConfiguration, shape: str, epochs: int) -> float:
    train, test = load_digits(seed=0, shape=shape)
    net = MultiLayerNetwork(conf).init()
    for epoch in range(epochs):
        net.fit(ListDataSetIterator(train, batch_size=32, shuffle=True, seed=epoch))
    assert net.epoch_count == epochs
    accuracy = net.evaluate(test).accuracy()
    print(f"test accuracy {accuracy:.4f}")
    return accuracy


@pytest.mark.slow
def test_mlp_reaches_97_percent_on_digits(single_thread: None) -> None:
    conf = MultiLayerConfiguration(
        [DenseLayer(256, activation="relu"), DenseLayer(128, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=updaters.Adam(1e-3),
        weight_init="relu",
        seed=0,
    )
    assert _train(conf, "flat", epochs=14) >= 0.97


@pytest.mark.slow
def test_cnn_reaches_97_percent_on_digits(single_thread: None) -> None:
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(16, kernel_size=(3, 3), convolution_mode="same", activation="relu"),
            ConvolutionLayer(32, kernel_size=(3, 3), convolution_mode="same", activation="relu"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            DenseLayer(128, activation="relu", dropout=0.75),
            OutputLayer(10),
        ],
        input_type=InputType.convolutional(8, 8, 1),
        updater=updaters.Adam(1e-3),
        weight_init="relu",
        seed=0,
    )
    assert _train(conf, "image", epochs=16) >= 0.97
