"""Layer parameters: weight-init schemes (DL4J definitions), layouts in the flat buffer, shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparkgrad.nn import (
    BatchNormalization,
    ConvolutionLayer,
    DenseLayer,
    GlobalPoolingLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SubsamplingLayer,
)

FAN_IN, FAN_OUT = 400, 300

# scheme -> (distribution, expected std) with DL4J's definitions
EXPECTED = {
    "xavier": ("normal", math.sqrt(2.0 / (FAN_IN + FAN_OUT))),
    "xavier_uniform": ("uniform", math.sqrt(6.0 / (FAN_IN + FAN_OUT))),
    "relu": ("normal", math.sqrt(2.0 / FAN_IN)),
    "relu_uniform": ("uniform", math.sqrt(6.0 / FAN_IN)),
    "lecun_normal": ("normal", math.sqrt(1.0 / FAN_IN)),
    "normal": ("normal", 1.0 / math.sqrt(FAN_IN)),
    "uniform": ("uniform", 1.0 / math.sqrt(FAN_IN)),
}


def _dense_net(weight_init: str, seed: int = 0) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(FAN_OUT, n_in=FAN_IN, weight_init=weight_init), OutputLayer(2, weight_init="zero")],
        seed=seed,
    )
    return MultiLayerNetwork(conf).init()


@pytest.mark.parametrize("scheme", sorted(EXPECTED))
def test_weight_init_distribution(scheme: str) -> None:
    net = _dense_net(scheme)
    w = net._runtimes[0].params["W"].astype(np.float64)
    b = net._runtimes[0].params["b"]
    kind, scale = EXPECTED[scheme]
    # the mean of n draws with std sigma has standard error sigma / sqrt(n): scale / sqrt(n) for N(0,
    # scale^2), scale / sqrt(3 n) for U(-scale, scale). Over seeds 0-199 of every scheme, mean / SE had a
    # spread of 0.99 (normal) and 0.94 (uniform) and at most 3.09 in magnitude (seed 0: -0.39, -0.58), so
    # 4 standard errors (|z| > 4 with probability 6e-5) flags a bias of about 1% of scale
    sigma = scale if kind == "normal" else scale / math.sqrt(3.0)
    assert abs(w.mean()) < 4 * sigma / math.sqrt(w.size)
    if kind == "normal":
        assert w.std() == pytest.approx(scale, rel=0.02)
    else:  # U(-a, a): all inside the bounds, std a / sqrt(3)
        assert np.abs(w).max() <= scale
        assert np.abs(w).max() > 0.99 * scale
        assert w.std() == pytest.approx(scale / math.sqrt(3.0), rel=0.02)
    np.testing.assert_array_equal(b, 0.0)


@pytest.mark.parametrize(("scheme", "value"), [("zero", 0.0), ("ones", 1.0)])
def test_constant_weight_init(scheme: str, value: float) -> None:
    w = _dense_net(scheme)._runtimes[0].params["W"]
    np.testing.assert_array_equal(w, value)


def test_initialisation_is_seeded() -> None:
    np.testing.assert_array_equal(_dense_net("xavier", 3).params(), _dense_net("xavier", 3).params())
    assert not np.array_equal(_dense_net("xavier", 3).params(), _dense_net("xavier", 4).params())
    unseeded = MultiLayerConfiguration([OutputLayer(2, n_in=50)])
    a, b = MultiLayerNetwork(unseeded).init(), MultiLayerNetwork(unseeded).init()
    assert not np.array_equal(a.params(), b.params())


def test_convolution_fan_in_and_out() -> None:
    conf = MultiLayerConfiguration(
        [ConvolutionLayer(64, kernel_size=(5, 3), stride=(2, 1), weight_init="xavier"), OutputLayer(2)],
        input_type=InputType.convolutional(20, 20, 16),
        seed=0,
    )
    w = MultiLayerNetwork(conf).init()._runtimes[0].params["W"]
    assert w.shape == (64, 16, 5, 3)
    fan_in, fan_out = 16 * 5 * 3, 64 * 5 * 3 / 2
    assert w.std() == pytest.approx(math.sqrt(2.0 / (fan_in + fan_out)), rel=0.03)


def test_flat_layout_follows_layer_and_parameter_order() -> None:
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(3, kernel_size=(2, 2)),
            BatchNormalization(),
            SubsamplingLayer(),
            GlobalPoolingLayer(),
            DenseLayer(4, has_bias=False),
            OutputLayer(2),
        ],
        input_type=InputType.convolutional(5, 5, 2),
        seed=1,
    )
    net = MultiLayerNetwork(conf).init()
    flat = net.params()
    offsets = []
    for rt in net._runtimes:
        views = rt.dense.params if hasattr(rt, "dense") else rt.params
        for name, view in views.items():
            offset = (
                view.__array_interface__["data"][0] - flat.__array_interface__["data"][0]
            ) // flat.itemsize
            offsets.append((name, offset, view.size))
    names = [n for n, _, _ in offsets]
    assert names == ["W", "b", "gamma", "beta", "mean", "var", "W", "W", "b"]
    position = 0
    for _, offset, size in offsets:  # contiguous, in order, no gaps
        assert offset == position
        position += size
    assert position == flat.size
    bn = net._runtimes[1].params
    np.testing.assert_array_equal(bn["gamma"], 1.0)
    np.testing.assert_array_equal(bn["var"], 1.0)
    np.testing.assert_array_equal(bn["beta"], 0.0)
    np.testing.assert_array_equal(bn["mean"], 0.0)


@pytest.mark.parametrize(
    ("mode", "size", "kernel", "stride", "padding", "expected"),
    [
        ("truncate", 28, 5, 1, 0, 24),
        ("truncate", 7, 3, 2, 0, 3),
        ("truncate", 7, 3, 2, 1, 4),
        ("same", 7, 3, 2, 0, 4),
        ("same", 28, 5, 1, 0, 28),
        ("same", 8, 2, 3, 0, 3),
    ],
)
def test_convolution_output_size(mode, size, kernel, stride, padding, expected) -> None:
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(2, kernel_size=kernel, stride=stride, padding=padding, convolution_mode=mode),
            OutputLayer(2),
        ],
        input_type=InputType.convolutional(size, size, 1),
    )
    assert conf.layer_input_types[1].height == expected
    net = MultiLayerNetwork(conf).init()
    x = np.random.default_rng(0).random((2, 1, size, size)).astype(np.float32)
    assert net.output(x).shape == (2, 2)
