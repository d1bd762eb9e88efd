"""Inference folds a batch norm (and a relu/identity activation) into the convolution before it.

The folded output is compared with the layer-by-layer path of the same network (``fold_batch_norm``
off) within a bound derived from the unit roundoff and each output's reduction: both paths compute
s (conv(x, W) + b - mean) + beta, s = gamma / sqrt(var + eps), one rounding the convolution of W and then
scaling, the other convolving W s; the difference is at most the sum of the two convolutions' rounding
bounds (reference.nn: im2col's gamma_{CRS+1} or Winograd's, whichever is larger) plus a few roundings of
the scaled values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from reference import nn as ref

from prerequisites import require_gpu
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    ActivationLayer,
    BatchNormalization,
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    ElementWiseVertex,
    InputType,
    LossLayer,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)

UNIT_ROUNDOFF = {np.float32: 2.0**-24, np.float64: 2.0**-53}
H = W = 7
EPS = 1e-3


def _conv(k: int, activation: str = "identity") -> ConvolutionLayer:
    return ConvolutionLayer(k, kernel_size=(3, 3), convolution_mode="same", activation=activation)


def _mln(c: int, k: int, dtype: Any, tail: list, conv_activation: str = "identity") -> MultiLayerNetwork:
    layers = [_conv(k, conv_activation), BatchNormalization(eps=EPS), *tail]
    conf = MultiLayerConfiguration(
        layers, input_type=InputType.convolutional(H, W, c), dtype=np.dtype(dtype).name, seed=3
    )
    return MultiLayerNetwork(conf).init()


def _graph(c: int, k: int, dtype: Any, two_readers: bool = False) -> ComputationGraph:
    b = ComputationGraphConfiguration.builder(dtype=np.dtype(dtype).name, seed=4)
    b.add_inputs("in").set_input_types(InputType.convolutional(H, W, c))
    b.add_layer("conv", _conv(k), "in")
    b.add_layer("bn", BatchNormalization(eps=EPS), "conv")
    b.add_layer("relu", ActivationLayer("relu"), "bn")
    last = "relu"
    if two_readers:  # the convolution's output is also summed with the relu's: nothing may fold
        b.add_vertex("sum", ElementWiseVertex("add"), "relu", "conv")
        last = "sum"
    b.add_layer("out", LossLayer(activation="identity", loss="mse"), last)
    return ComputationGraph(b.set_outputs("out").build()).init()


def _perturb(net: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random weights and non-trivial batch-norm parameters and statistics (layout: conv W, b, then the
    batch norm's gamma, beta, mean, var); returns them as float64 arrays."""
    flat = net.params()
    k, c = net._runtimes[0].params["W"].shape[:2]
    sizes = {"W": k * c * 9, "b": k, "gamma": k, "beta": k, "mean": k, "var": k}
    values = {
        "W": rng.normal(0, 0.5, sizes["W"]),
        "b": rng.normal(0, 0.5, k),
        "gamma": rng.uniform(0.2, 3.0, k) * rng.choice([-1.0, 1.0], k),
        "beta": rng.normal(0, 1.0, k),
        "mean": rng.normal(0, 1.0, k),
        "var": rng.uniform(0.01, 4.0, k),
    }
    stored, offset = {}, 0
    for name, size in sizes.items():
        flat[offset : offset + size] = values[name]
        stored[name] = flat[offset : offset + size].astype(np.float64)  # as rounded to the network dtype
        offset += size
    stored["W"] = stored["W"].reshape(k, c, 3, 3)
    return stored


def _conv_bound(x: np.ndarray, w: np.ndarray, b: np.ndarray, u: float) -> np.ndarray:
    """Rounding bound of the library's convolution (either algorithm) of x with w plus b."""
    pad, out_hw = (1, 1), (H, W)
    direct = ref.conv2d_forward(np.abs(x), np.abs(w), np.abs(b), out_hw, (1, 1), pad)
    m = w[0].size + 1
    return np.maximum(m * u / (1 - m * u) * direct, ref.winograd_forward_bound(x, w, b, out_hw, pad, u))


def _fold_bound(x: np.ndarray, p: dict[str, np.ndarray], u: float) -> np.ndarray:
    """|folded - unfused| bound per output of conv -> batch norm (the relu after them only shrinks it)."""
    scale = p["gamma"] / np.sqrt(p["var"] + EPS)
    shift = p["beta"] - p["mean"] * scale
    folded_b = p["b"] * scale + shift
    per_k = (slice(None), None, None)
    direct = ref.conv2d_forward(np.abs(x), np.abs(p["W"]), np.abs(p["b"]), (H, W), (1, 1), (1, 1))
    unfused = np.abs(scale)[per_k] * _conv_bound(x, p["W"], p["b"], u)
    folded = _conv_bound(x, p["W"] * scale[:, None, None, None], folded_b, u)
    rounded = 4 * u * (np.abs(scale)[per_k] * direct + np.abs(shift)[per_k] + np.abs(folded_b)[per_k])
    return unfused + folded + rounded


def _folded_and_unfused(net: Any, x: np.ndarray, graph: bool) -> tuple[np.ndarray, np.ndarray]:
    def run() -> np.ndarray:
        return net.output(x)[0] if graph else net.output(x)

    net.fold_batch_norm = True
    folded = run()
    net.fold_batch_norm = False
    unfused = run()
    net.fold_batch_norm = True
    return folded, unfused


def _assert_near_reference(
    out: np.ndarray, x: np.ndarray, params: dict[str, np.ndarray], bound: np.ndarray, relu: bool
) -> None:
    """``out`` within 2 x bound of the float64 batch-normalised convolution (and relu)."""
    z = ref.conv2d_forward(x, params["W"], params["b"], (H, W), (1, 1), (1, 1))
    expected = ref.batchnorm_forward_inference(
        z, params["gamma"], params["beta"], params["mean"], params["var"], EPS
    )
    if relu:
        expected = np.maximum(expected, 0)
    assert np.all(np.abs(out - expected.reshape(x.shape[0], -1)) <= 2 * bound)


CHANNELS = [(3, 5), (16, 16)]  # im2col, and Winograd (both channel counts >= 16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("c", "k"), CHANNELS)
@pytest.mark.parametrize("network", ["mln", "mln_no_activation", "graph"])
def test_folded_inference_matches_the_layer_by_layer_path(dtype: Any, c: int, k: int, network: str) -> None:
    rng = np.random.default_rng(c * 1000 + k)
    graph = network == "graph"
    if graph:
        net: Any = _graph(c, k, dtype)
    else:
        relu = [] if network == "mln_no_activation" else [ActivationLayer("relu")]
        net = _mln(c, k, dtype, [*relu, LossLayer(activation="identity", loss="mse")])
    params = _perturb(net, rng)
    folds, absorbed = net._inference_plan(train=False)
    assert len(folds) == 1
    assert len(absorbed) == (1 if network == "mln_no_activation" else 2)
    x = rng.normal(0, 1, (4, c, H, W)).astype(dtype)
    folded, unfused = _folded_and_unfused(net, x, graph)
    bound = _fold_bound(x, params, UNIT_ROUNDOFF[dtype]).reshape(x.shape[0], -1)
    assert np.all(np.abs(folded.astype(np.float64) - unfused) <= bound)
    # the fold really ran: with these statistics the two roundings differ somewhere
    assert np.any(folded != unfused)
    # and both are the batch-normalised convolution (float64 reference; bound doubled for the reference's
    # own difference from either path)
    _assert_near_reference(folded, x, params, bound, relu=network != "mln_no_activation")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_training_mode_output_does_not_fold(dtype: Any) -> None:
    net = _mln(3, 4, dtype, [ActivationLayer("relu"), LossLayer(activation="identity", loss="mse")])
    _perturb(net, np.random.default_rng(1))
    x = np.random.default_rng(2).normal(0, 1, (5, 3, H, W)).astype(dtype)
    assert net._inference_plan(train=True) == ({}, set())
    folded = net.output(x, train=True)
    net.fold_batch_norm = False
    assert np.array_equal(folded, net.output(x, train=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_convolution_with_a_second_reader_is_not_folded(dtype: Any) -> None:
    net = _graph(4, 6, dtype, two_readers=True)
    _perturb(net, np.random.default_rng(5))
    assert net._inference_plan(train=False) == ({}, set())
    x = np.random.default_rng(6).normal(0, 1, (3, 4, H, W)).astype(dtype)
    folded, unfused = _folded_and_unfused(net, x, graph=True)
    assert np.array_equal(folded, unfused)


def test_a_convolution_with_its_own_activation_is_not_folded() -> None:
    # relu before the batch norm: the batch norm's scale cannot move into the weights
    net = _mln(3, 4, np.float32, [LossLayer(activation="identity", loss="mse")], conv_activation="relu")
    assert net._inference_plan(train=False) == ({}, set())


def test_a_non_relu_activation_stays_a_separate_layer() -> None:
    net = _mln(3, 4, np.float32, [ActivationLayer("tanh"), LossLayer(activation="identity", loss="mse")])
    folds, absorbed = net._inference_plan(train=False)
    assert list(folds) == [0] and absorbed == {1}
    x = np.random.default_rng(7).normal(0, 1, (2, 3, H, W)).astype(np.float32)
    folded, unfused = _folded_and_unfused(net, x, graph=False)
    np.testing.assert_allclose(folded, unfused, rtol=1e-5, atol=1e-5)


def test_the_fold_follows_training() -> None:
    """Folded weights come from the current parameters: after fit steps (which move the weights and
    the running statistics) inference still matches the layer-by-layer path."""
    layers = [ActivationLayer("relu"), OutputLayer(3, activation="softmax")]
    net = _mln(3, 4, np.float64, layers)
    rng = np.random.default_rng(8)
    x = rng.normal(0, 1, (6, 3, H, W))
    y = np.eye(3)[rng.integers(0, 3, 6)]
    before, _ = _folded_and_unfused(net, x, graph=False)
    net.fit(DataSet(x, y), epochs=3)
    folded, unfused = _folded_and_unfused(net, x, graph=False)
    assert not np.allclose(folded, before)
    np.testing.assert_allclose(folded, unfused, rtol=1e-12, atol=1e-12)


def test_clone_keeps_the_fold_setting() -> None:
    net = _mln(3, 4, np.float32, [ActivationLayer("relu"), LossLayer(activation="identity", loss="mse")])
    net.fold_batch_norm = False
    assert net.clone().fold_batch_norm is False
    assert _mln(3, 4, np.float32, [LossLayer(activation="identity", loss="mse")]).clone().fold_batch_norm


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("c", "k"), CHANNELS)
@pytest.mark.parametrize("network", ["mln", "graph"])
def test_folded_inference_on_the_gpu(dtype: Any, c: int, k: int, network: str) -> None:
    """The fold on cuda:0 (its convolution is im2col + cuBLAS, whose rounding bound the Winograd one
    dominates): within the same bound of the layer-by-layer GPU path and of the float64 reference."""
    cp = require_gpu()
    rng = np.random.default_rng(c * 1000 + k + 7)
    graph = network == "graph"
    net: Any = (
        _graph(c, k, dtype) if graph else _mln(c, k, dtype, [ActivationLayer("relu"), LossLayer(loss="mse")])
    )
    params = _perturb(net, rng)
    net = net.to("cuda:0")
    x = rng.normal(0, 1, (4, c, H, W)).astype(dtype)
    folded, unfused = (cp.asnumpy(a) for a in _folded_and_unfused(net, cp.asarray(x), graph))
    bound = _fold_bound(x, params, UNIT_ROUNDOFF[dtype]).reshape(x.shape[0], -1)
    assert np.all(np.abs(folded.astype(np.float64) - unfused) <= bound)
    assert np.any(folded != unfused)
    _assert_near_reference(folded, x, params, bound, relu=True)
