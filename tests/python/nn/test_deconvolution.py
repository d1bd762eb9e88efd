"""Deconvolution2D (DL4J's transposed convolution): forward and backward against the pure-NumPy definition
(tests/python/reference/nn.py: deconv2d_forward / deconv2d_backward), DL4J's output sizes, 1 and 2
threads, the configuration, graphs and a small autoencoder that learns (the float64 gradient checks
through networks are in test_gradient_check.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad.data import DataSet, ListDataSetIterator, MultiDataSet
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    Convolution1DLayer,
    ConvolutionLayer,
    Deconvolution2D,
    InputType,
    LossLayer,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
    SubsamplingLayer,
    updaters,
)


def _net(layers, input_type, dtype="float64", **kwargs) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(layers, input_type=input_type, seed=3, dtype=dtype, **kwargs)
    return MultiLayerNetwork(conf).init()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 3),
    o=st.integers(1, 3),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    mode=st.sampled_from(["truncate", "strict", "same"]),
    has_bias=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_forward_and_backward_match_the_definition(
    n, c, o, h, w, kernel, stride, pad, dilation, mode, has_bias, dtype, seed
) -> None:
    geometry = [ref.deconv_geometry(*a, mode) for a in zip((h, w), kernel, stride, pad, dilation)]
    (p, pad_top), (q, pad_left) = geometry
    if p < 1 or q < 1:
        return
    layer = Deconvolution2D(
        o, kernel, stride, pad, dilation, mode, activation="identity", has_bias=has_bias
    )  # fmt: skip
    net = _net([layer, OutputLayer(2)], InputType.convolutional(h, w, c), np.dtype(dtype).name)
    rng = np.random.default_rng(seed)
    rt = net._runtimes[0]
    rt.params["W"][...] = rng.normal(size=rt.params["W"].shape)
    if has_bias:
        rt.params["b"][...] = rng.normal(size=o)
    x = rng.normal(size=(n, c, h, w)).astype(dtype)
    y = rt.forward(x, False, 0)
    assert y.shape == (n, o, p, q)
    b = rt.params["b"] if has_bias else None
    stride_pad_dil = (stride, (pad_top, pad_left), dilation)
    want = ref.deconv2d_forward(x, rt.params["W"], b, (p, q), *stride_pad_dil)
    # each output sums at most c * kh * kw products (and the bias)
    eps = float(np.finfo(dtype).eps)
    scale = (1 + np.abs(x).max()) * (1 + np.abs(rt.params["W"]).max())
    bound = 4 * eps * (c * kernel[0] * kernel[1] + 1) * scale
    np.testing.assert_allclose(y, want, rtol=0, atol=bound)
    dy = rng.normal(size=y.shape).astype(dtype)
    dx = rt.backward(dy.copy(), True)
    want_dx, want_dw = ref.deconv2d_backward(x, rt.params["W"], dy, *stride_pad_dil)
    dy_scale = 1 + np.abs(dy).max()
    np.testing.assert_allclose(
        dx, want_dx, rtol=0, atol=4 * eps * o * kernel[0] * kernel[1] * scale * dy_scale
    )
    # a weight gradient sums one product per input pixel and example
    dw_bound = 4 * eps * n * h * w * (1 + np.abs(x).max()) * dy_scale
    np.testing.assert_allclose(rt.grads["W"], want_dw, rtol=0, atol=dw_bound)
    if has_bias:
        np.testing.assert_allclose(rt.grads["b"], dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=0,
                                   atol=4 * eps * n * p * q * dy_scale)  # fmt: skip


@pytest.mark.parametrize("mode", ["truncate", "same"])
def test_winograd_shapes_match_the_definition(mode: str) -> None:
    """16 channels each way, 3x3 kernels, stride 1: the kernels' auto choice is Winograd for the forward
    (an input gradient) and the weight gradient; float64, so the transforms' rounding stays far below the
    bound."""
    rng = np.random.default_rng(11)
    net = _net([Deconvolution2D(16, 3, convolution_mode=mode, activation="identity"), OutputLayer(2)],
               InputType.convolutional(7, 6, 16))  # fmt: skip
    rt = net._runtimes[0]
    x = rng.normal(size=(3, 16, 7, 6))
    y = rt.forward(x, False, 0)
    pad = (1, 1) if mode == "same" else (0, 0)
    want = ref.deconv2d_forward(x, rt.params["W"], rt.params["b"], y.shape[2:], (1, 1), pad, (1, 1))
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-12 * np.abs(want).max())
    dy = rng.normal(size=y.shape)
    dx = rt.backward(dy.copy(), True)
    want_dx, want_dw = ref.deconv2d_backward(x, rt.params["W"], dy, (1, 1), pad, (1, 1))
    np.testing.assert_allclose(dx, want_dx, rtol=0, atol=1e-12 * np.abs(want_dx).max())
    np.testing.assert_allclose(rt.grads["W"], want_dw, rtol=0, atol=1e-12 * np.abs(want_dw).max())


def test_output_sizes_are_dl4j_s() -> None:
    """DL4J: same -> stride * in; truncate and strict -> stride (in - 1) + k_eff - 2 padding."""
    cases = [
        (Deconvolution2D(4, (2, 2), (2, 2)), (5, 7), (10, 14)),
        (Deconvolution2D(4, (3, 3), (2, 2), (1, 1)), (5, 7), (9, 13)),
        (Deconvolution2D(4, (3, 2), (1, 3), convolution_mode="strict"), (5, 7), (7, 20)),
        (Deconvolution2D(4, (3, 3), (2, 3), convolution_mode="same"), (5, 7), (10, 21)),
        (Deconvolution2D(4, (3, 3), (1, 1), dilation=(2, 3)), (5, 7), (9, 13)),
        (
            Deconvolution2D(4, (3, 3), (2, 2), (2, 0), dilation=(2, 1), convolution_mode="same"),
            (5, 7),
            (10, 14),
        ),
    ]
    for layer, (h, w), out in cases:
        conf = MultiLayerConfiguration([layer, OutputLayer(2)], input_type=InputType.convolutional(h, w, 3))
        assert conf.layer_input_types[1] == InputType.convolutional(*out, 4)
        assert conf.layers[0].n_in == 3
    net = _net([Deconvolution2D(5, (3, 2), (2, 2)), OutputLayer(2)], InputType.convolutional(4, 4, 3))
    assert net._runtimes[0].params["W"].shape == (3, 5, 3, 2)  # DL4J's [nIn, nOut, kH, kW]
    assert net._runtimes[0].params["b"].shape == (5,)


def test_configuration_round_trips_and_is_checked() -> None:
    conf = MultiLayerConfiguration(
        [
            Deconvolution2D(4, (3, 2), (2, 1), (1, 0), (1, 2), "same", activation="relu", l2=1e-4),
            Deconvolution2D(2, 2, 2, has_bias=False, convolution_mode="strict", updater=updaters.Adam(1e-3)),
            OutputLayer(2),
        ],
        input_type=InputType.convolutional(4, 5, 2),
    )
    assert conf.layers[0].dilation == (1, 2) and conf.layers[1].kernel_size == (2, 2)
    assert MultiLayerConfiguration.from_json(conf.to_json()) == conf
    assert MultiLayerConfiguration.from_yaml(conf.to_yaml()) == conf
    with pytest.raises(ValueError, match="dilation"):
        Deconvolution2D(2, dilation=(0, 1))
    with pytest.raises(ValueError, match="kernel_size"):
        Deconvolution2D(2, kernel_size=(0, 1))
    with pytest.raises(ValueError, match="convolution_mode"):
        Deconvolution2D(2, convolution_mode="causal")
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(Deconvolution2D\)\.padding: \(2, 0\) trims the whole"
    ):
        MultiLayerConfiguration(
            [Deconvolution2D(2, (2, 2), (1, 1), (2, 0)), OutputLayer(2)],
            input_type=InputType.convolutional(2, 3, 1),
        )
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(Deconvolution2D\)\.input: needs convolutional input"
    ):
        MultiLayerConfiguration([Deconvolution2D(2), OutputLayer(2)], input_type=InputType.feed_forward(3))
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(Deconvolution2D\)\.n_in: is 3 but the input has size 2"
    ):
        MultiLayerConfiguration(
            [Deconvolution2D(2, n_in=3), OutputLayer(2)], input_type=InputType.convolutional(3, 3, 2)
        )


def test_strict_mode_refuses_windows_that_do_not_tile_a_convolution_s_input() -> None:
    """ConvolutionMode.STRICT (new with this layer) on the windowed layers: exact tilings pass, the others
    are errors naming the layer; a deconvolution in strict mode never drops anything."""
    ok = MultiLayerConfiguration(
        [ConvolutionLayer(2, (3, 3), (2, 2), convolution_mode="strict"), OutputLayer(2)],
        input_type=InputType.convolutional(7, 9, 1),
    )
    assert ok.layer_input_types[1] == InputType.convolutional(3, 4, 2)
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(SubsamplingLayer\)\.convolution_mode: strict: input 8"
    ):
        MultiLayerConfiguration(
            [SubsamplingLayer("max", (3, 3), (2, 2), convolution_mode="strict"), OutputLayer(2)],
            input_type=InputType.convolutional(8, 9, 1),
        )
    conv1d = [Convolution1DLayer(2, kernel_size=3, stride=2, convolution_mode="strict"), RnnOutputLayer(2)]
    assert MultiLayerConfiguration(
        conv1d, input_type=InputType.recurrent(3, 9)
    ).output_type == InputType.recurrent(2, 4)
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(Convolution1DLayer\)\.convolution_mode: strict: input 10"
    ):
        MultiLayerConfiguration(conv1d, input_type=InputType.recurrent(3, 10))
    strict = MultiLayerConfiguration(
        [Deconvolution2D(2, (3, 3), (2, 2), convolution_mode="strict"), OutputLayer(2)],
        input_type=InputType.convolutional(4, 5, 1),
    )
    assert strict.layer_input_types[1] == InputType.convolutional(9, 11, 2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_results_for_1_and_2_threads(dtype: str) -> None:
    """The output and the gradient are the same bits for 1 and 2 threads: the forward is
    conv2d_backward_input and dL/dx conv2d_forward's pass (each image computed by one thread in a fixed
    order), dL/dW sums a fixed number of partials in a fixed order, whatever the thread count."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 8, 6, 6)).astype(dtype)
    ds = DataSet(x, np.eye(3, dtype=dtype)[rng.integers(0, 3, 16)])
    layers = [
        Deconvolution2D(16, (3, 3), (2, 2), activation="relu"),
        ConvolutionLayer(8, (3, 3), (2, 2), activation="tanh"),
        Deconvolution2D(4, (2, 2), (2, 2), (1, 1), dilation=(2, 2), activation="identity"),
        OutputLayer(3),
    ]
    before = sparkgrad.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            net = _net(layers, InputType.convolutional(6, 6, 8), dtype)
            grad = net.compute_gradient_and_score(ds)[0].copy()
            results.append((net.output(x), grad))
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_input_gradient_is_the_same_bits_for_1_and_2_threads() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 8, 6, 6)).astype(np.float32)
    before = sparkgrad.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            layers = [Deconvolution2D(16, (3, 3), (2, 2)), OutputLayer(3)]
            rt = _net(layers, InputType.convolutional(6, 6, 8), "float32")._runtimes[0]
            y = rt.forward(x, True, 0)
            dy = np.linspace(-1, 1, y.size, dtype=np.float32).reshape(y.shape)
            out.append(rt.backward(dy, True).copy())
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(out[0], out[1])


def test_a_graph_computes_what_the_multilayer_network_does() -> None:
    rng = np.random.default_rng(9)
    layers = [
        ConvolutionLayer(3, (2, 2), (2, 2), activation="relu"),
        Deconvolution2D(2, (2, 2), (2, 2), activation="tanh"),
    ]
    conf = (
        ComputationGraphConfiguration.builder(seed=7, dtype="float64")
        .add_inputs("in")
        .set_input_types(InputType.convolutional(6, 6, 2))
        .add_layer("conv", layers[0], "in")
        .add_layer("deconv", layers[1], "conv")
        .add_layer("out", OutputLayer(3), "deconv")
        .set_outputs("out")
        .build()
    )
    graph = ComputationGraph(conf).init()
    net = _net([*layers, OutputLayer(3)], InputType.convolutional(6, 6, 2))
    net.set_params(graph.params())
    x = rng.normal(size=(4, 2, 6, 6))
    labels = np.eye(3)[rng.integers(0, 3, 4)]
    np.testing.assert_allclose(graph.output(x)[0], net.output(x), rtol=1e-12)
    g_grad = graph.compute_gradient_and_score(MultiDataSet([x], [labels]))[0]
    n_grad = net.compute_gradient_and_score(DataSet(x, labels))[0]
    np.testing.assert_allclose(g_grad, n_grad, rtol=1e-12, atol=1e-15)


def _autoencoder(seed: int) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(8, (3, 3), (2, 2), convolution_mode="same", activation="relu"),
            Deconvolution2D(1, (2, 2), (2, 2), activation="sigmoid"),
            LossLayer("mse", "identity"),
        ],
        input_type=InputType.convolutional(8, 8, 1),
        updater=updaters.Adam(1e-2),
        weight_init="xavier",
        seed=seed,
    )
    return MultiLayerNetwork(conf).init()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_convolutional_autoencoder_learns_digits(seed: int) -> None:
    """Convolution (8x8 -> 4x4, 8 channels) then Deconvolution2D back to 8x8: 5 epochs of Adam on 300
    digits reconstruct held-out digits with a mean squared error at least 5x below the untrained one
    (measured: 7.6x-8.7x over these seeds)."""
    pytest.importorskip("sklearn")
    from sparkgrad.datasets import load_digits

    train, test = load_digits(seed=seed, shape="image")
    images, held_out = train.features[:300], test.features[:200]
    net = _autoencoder(seed)
    flat = held_out.reshape(len(held_out), -1)
    before = net.score(DataSet(held_out, flat))
    for epoch in range(5):
        net.fit(ListDataSetIterator(DataSet(images, images.reshape(300, -1)), batch_size=16, shuffle=True,
                                    seed=epoch))  # fmt: skip
    after = net.score(DataSet(held_out, flat))
    print(f"seed {seed}: reconstruction mse {before:.4f} -> {after:.4f} ({before / after:.1f}x)")
    assert before / after >= 5
