"""Float64 gradient checks of ComputationGraph: every vertex type, skip connections, two inputs and
two outputs, masks; compute_gradient_and_score against central differences of the score."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from reference import nn as ref

import sparkgrad
from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.nn import (
    BatchNormalization,
    CnnToFeedForwardPreProcessor,
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    DropoutLayer,
    ElementWiseVertex,
    FeedForwardToCnnPreProcessor,
    GlobalPoolingLayer,
    InputType,
    L2NormalizeVertex,
    L2Vertex,
    LossLayer,
    MergeVertex,
    OutputLayer,
    PreprocessorVertex,
    ReshapeVertex,
    ScaleVertex,
    ShiftVertex,
    StackVertex,
    SubsamplingLayer,
    SubsetVertex,
    UnstackVertex,
)

# Central differences with step 1e-6 in float64: truncation error ~1e-12 relative to the curvature,
# round-off ~1e-16 / 1e-6 = 1e-10 of the score; 1e-5 relative leaves a wide margin over both.
MAX_REL_ERROR = 1e-5
MIN_MAGNITUDE = 1e-8  # entries whose analytic and numeric values are both below this are round-off


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    """Tiny tensors: one thread avoids oversubscribing a loaded CI machine (results do not depend on it)."""
    previous = sparkgrad.get_num_threads()
    sparkgrad.set_num_threads(1)
    yield
    sparkgrad.set_num_threads(previous)


def _check(builder, data) -> ComputationGraph:
    graph = ComputationGraph(builder.build()).init()
    grad, _ = graph.compute_gradient_and_score(data)
    numeric = ref.numerical_gradient(lambda _: graph.compute_gradient_and_score(data)[1], graph.params())
    magnitude = np.abs(numeric) + np.abs(grad)
    relevant = magnitude > MIN_MAGNITUDE
    worst = float((np.abs(numeric - grad)[relevant] / magnitude[relevant]).max())
    print(f"max relative error {worst:.3e} over {relevant.sum()} of {grad.size} parameters")
    assert relevant.sum() > grad.size // 2  # the check is not vacuous
    assert worst < MAX_REL_ERROR
    return graph


def _builder(*input_types: InputType):
    names = [f"in{i}" for i in range(len(input_types))]
    return (
        ComputationGraphConfiguration.builder(seed=7, dtype="float64")
        .add_inputs(*names)
        .set_input_types(*input_types)
    )


def _one_hot(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return np.eye(k)[rng.integers(0, k, n)]


def _dense_ds(rng: np.random.Generator, n: int = 5, n_in: int = 4, k: int = 3) -> DataSet:
    return DataSet(rng.normal(size=(n, n_in)), _one_hot(rng, n, k))


@pytest.mark.parametrize("op", ["add", "subtract", "product", "average", "max"])
def test_gradient_elementwise_vertex(op: str) -> None:
    rng = np.random.default_rng(1)
    # three inputs, one of them the same vertex twice (subtract takes exactly two)
    inputs = ("a", "b") if op == "subtract" else ("a", "b", "a")
    b = (
        _builder(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(5, activation="tanh"), "in0")
        .add_layer("b", DenseLayer(5, activation="sigmoid"), "in0")
        .add_vertex("op", ElementWiseVertex(op), *inputs)
        .add_layer("out", OutputLayer(3), "op")
        .set_outputs("out")
    )
    _check(b, _dense_ds(rng))


def test_gradient_merge_subset_dense() -> None:
    rng = np.random.default_rng(2)
    b = (
        _builder(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(3, activation="tanh"), "in0")
        .add_vertex("merge", MergeVertex(), "a", "in0")
        .add_vertex("subset", SubsetVertex(1, 5), "merge")
        .add_layer("out", OutputLayer(3), "subset")
        .set_outputs("out")
    )
    _check(b, _dense_ds(rng))


def test_gradient_merge_subset_channels() -> None:
    rng = np.random.default_rng(3)
    b = (
        _builder(InputType.convolutional(5, 5, 2))
        .add_layer(
            "c1", ConvolutionLayer(2, kernel_size=(2, 2), convolution_mode="same", activation="tanh"), "in0"
        )
        .add_layer(
            "c2", ConvolutionLayer(3, kernel_size=(3, 3), convolution_mode="same", activation="elu"), "in0"
        )
        .add_vertex("merge", MergeVertex(), "c1", "c2")
        .add_vertex("subset", SubsetVertex(1, 3), "merge")
        .add_layer("out", OutputLayer(3), "subset")
        .set_outputs("out")
    )
    _check(b, DataSet(rng.normal(size=(3, 2, 5, 5)), _one_hot(rng, 3, 3)))


def test_gradient_stack_unstack() -> None:
    rng = np.random.default_rng(4)
    b = (
        _builder(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(3, activation="tanh"), "in0")
        .add_layer("b", DenseLayer(3, activation="sigmoid"), "in0")
        .add_vertex("stack", StackVertex(), "a", "b")
        .add_layer("shared", DenseLayer(4, activation="tanh"), "stack")
        .add_vertex("u0", UnstackVertex(0, 2), "shared")
        .add_vertex("u1", UnstackVertex(1, 2), "shared")
        .add_layer("out", OutputLayer(3), "u0", "u1")
        .set_outputs("out")
    )
    _check(b, _dense_ds(rng))


@pytest.mark.parametrize("vertex", [ScaleVertex(-1.7), ShiftVertex(0.6), L2NormalizeVertex()], ids=str)
def test_gradient_single_input_vertices(vertex) -> None:
    rng = np.random.default_rng(5)
    b = (
        _builder(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(5, activation="tanh"), "in0")
        .add_vertex("v", vertex, "a")
        .add_layer("out", OutputLayer(3), "v")
        .set_outputs("out")
    )
    _check(b, _dense_ds(rng))


def test_gradient_l2_normalize_convolutional() -> None:
    rng = np.random.default_rng(6)
    b = (
        _builder(InputType.convolutional(4, 4, 1))
        .add_layer("c", ConvolutionLayer(2, kernel_size=(2, 2), activation="tanh"), "in0")
        .add_vertex("norm", L2NormalizeVertex(), "c")
        .add_layer("out", OutputLayer(3), "norm")
        .set_outputs("out")
    )
    _check(b, DataSet(rng.normal(size=(3, 1, 4, 4)), _one_hot(rng, 3, 3)))


def test_gradient_l2_vertex() -> None:
    rng = np.random.default_rng(7)
    b = (
        _builder(InputType.feed_forward(4), InputType.feed_forward(4))
        .add_layer("a", DenseLayer(3, activation="tanh"), "in0")
        .add_layer("b", DenseLayer(3, activation="tanh"), "in1")
        .add_vertex("dist", L2Vertex(), "a", "b")
        .add_layer("out", OutputLayer(1, activation="sigmoid", loss="xent"), "dist")
        .set_outputs("out")
    )
    ds = MultiDataSet([rng.normal(size=(6, 4)), rng.normal(size=(6, 4))], [rng.integers(0, 2, (6, 1)) * 1.0])
    _check(b, ds)


def test_gradient_reshape_and_preprocessor_vertices() -> None:
    rng = np.random.default_rng(8)
    b = (
        _builder(InputType.feed_forward(12))
        .add_vertex("img", ReshapeVertex((3, 2, 2)), "in0")
        .add_layer(
            "c", ConvolutionLayer(2, kernel_size=(2, 2), convolution_mode="same", activation="tanh"), "img"
        )
        .add_vertex("flat", PreprocessorVertex(CnnToFeedForwardPreProcessor()), "c")
        .add_vertex("back", PreprocessorVertex(FeedForwardToCnnPreProcessor(2, 2, 2)), "flat")
        .add_layer("pool", GlobalPoolingLayer("avg"), "back")
        .add_vertex("vec", ReshapeVertex((8,)), "c")
        .add_layer("out", OutputLayer(3), "pool", "vec")
        .set_outputs("out")
    )
    _check(b, DataSet(rng.normal(size=(4, 12)), _one_hot(rng, 4, 3)))


def test_gradient_residual_cnn_with_batch_norm_and_dropout() -> None:
    rng = np.random.default_rng(9)
    same = {"kernel_size": (3, 3), "convolution_mode": "same"}
    b = (
        _builder(InputType.convolutional_flat(5, 5, 1))
        .add_layer("stem", ConvolutionLayer(3, activation="relu", **same), "in0")
        .add_layer("conv", ConvolutionLayer(3, activation="identity", **same), "stem")
        .add_layer("bn", BatchNormalization(), "conv")
        .add_vertex("res", ElementWiseVertex("add"), "bn", "stem")
        .add_layer("pool", SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)), "res")
        .add_layer("drop", DropoutLayer(0.8), "pool")
        .add_layer("fc", DenseLayer(4, activation="tanh"), "drop")
        .add_layer("out", OutputLayer(3), "fc")
        .set_outputs("out")
    )
    _check(b, DataSet(rng.normal(size=(4, 25)), _one_hot(rng, 4, 3)))


def test_gradient_two_inputs_two_outputs_with_masks() -> None:
    rng = np.random.default_rng(10)
    b = (
        _builder(InputType.feed_forward(4), InputType.feed_forward(3))
        .add_layer("a", DenseLayer(5, activation="tanh"), "in0")
        .add_layer("b", DenseLayer(5, activation="softplus"), "in1")
        .add_vertex("sum", ElementWiseVertex("add"), "a", "b")
        .add_layer("both", DenseLayer(4, activation="sigmoid"), "sum", "in0")
        .add_layer("cls", OutputLayer(3), "both")
        .add_layer("reg", DenseLayer(2, activation="tanh"), "sum")
        .add_layer("loss", LossLayer("mse"), "reg")
        .set_outputs("cls", "loss")
    )
    n = 6
    ds = MultiDataSet(
        [rng.normal(size=(n, 4)), rng.normal(size=(n, 3))],
        [_one_hot(rng, n, 3), rng.normal(size=(n, 2))],
        features_masks=[np.array([1, 1, 0, 1, 1, 1.0]), np.array([1, 0, 1, 1, 1, 1.0])],
        labels_masks=[None, rng.integers(0, 2, (n, 2)).astype(np.float64)],
    )
    _check(b, ds)
