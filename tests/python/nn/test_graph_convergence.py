"""Convergence on scikit-learn's bundled digits: a seeded residual CNN ComputationGraph reaches >= 97%."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import sparkgrad
from sparkgrad.data import ListDataSetIterator
from sparkgrad.datasets import load_digits
from sparkgrad.nn import (
    BatchNormalization,
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    ElementWiseVertex,
    InputType,
    OutputLayer,
    SubsamplingLayer,
    updaters,
)

pytest.importorskip("sklearn")


@pytest.fixture
def single_thread() -> Iterator[None]:
    """Small tensors: one thread avoids oversubscribing a loaded CI machine (results do not depend on it)."""
    previous = sparkgrad.get_num_threads()
    sparkgrad.set_num_threads(1)
    yield
    sparkgrad.set_num_threads(previous)


def residual_cnn_conf(seed: int = 0) -> ComputationGraphConfiguration:
    """conv -> (conv, bn, relu-free sum with the skip) -> pool -> dense -> softmax, for 8x8 digits."""
    same = {"kernel_size": (3, 3), "convolution_mode": "same"}
    return (
        ComputationGraphConfiguration.builder(updater=updaters.Adam(2e-3), weight_init="relu", seed=seed)
        .add_inputs("image")
        .set_input_types(InputType.convolutional(8, 8, 1))
        .add_layer("stem", ConvolutionLayer(16, activation="relu", **same), "image")
        .add_layer("conv", ConvolutionLayer(16, activation="identity", **same), "stem")
        .add_layer("bn", BatchNormalization(), "conv")
        .add_vertex("residual", ElementWiseVertex("add"), "bn", "stem")
        .add_layer("pool", SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)), "residual")
        .add_layer("fc", DenseLayer(64, activation="relu"), "pool")
        .add_layer("out", OutputLayer(10), "fc")
        .set_outputs("out")
        .build()
    )


@pytest.mark.slow
def test_residual_cnn_reaches_97_percent_on_digits(single_thread: None) -> None:
    train, test = load_digits(seed=0, shape="image")
    graph = ComputationGraph(residual_cnn_conf()).init()
    epochs = 12
    for epoch in range(epochs):
        graph.fit(ListDataSetIterator(train, batch_size=32, shuffle=True, seed=epoch))
    assert graph.epoch_count == epochs
    accuracy = graph.evaluate(test).accuracy()
    print(f"test accuracy {accuracy:.4f}")
    assert accuracy >= 0.97
