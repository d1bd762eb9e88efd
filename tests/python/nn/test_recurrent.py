"""Recurrent layers and time-series masks through MultiLayerNetwork: float64 gradient checks of every
recurrent layer with and without masks and variable lengths, and tests that fail if any forward,
backward, loss, output, scoring or evaluation path ignores a mask. The 1-D layers over sequences
(Convolution1DLayer, Subsampling1DLayer: the 2-D kernels through the (batch, size, 1, time) view) against
the pure-NumPy 1-D references, with DL4J's mask reduction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import nn as ref

import sparkgrad
from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.nn import (
    GRU,
    LSTM,
    BatchNormalization,
    Bidirectional,
    ComputationGraph,
    ComputationGraphConfiguration,
    Convolution1DLayer,
    ConvolutionLayer,
    DenseLayer,
    GlobalPoolingLayer,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnLossLayer,
    RnnOutputLayer,
    SimpleRnn,
    Subsampling1DLayer,
    SubsamplingLayer,
    Upsampling1D,
    ZeroPadding1DLayer,
)
from sparkgrad.nn.layers import conv_output_size
from sparkgrad.nn.updaters import Adam

EPS = 1e-6
MAX_REL_ERROR = 1e-5
N, SIZE, T = 3, 3, 5


def _net(layers, dtype="float64", seed=7, **kw) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(layers, input_type=InputType.recurrent(SIZE), seed=seed, dtype=dtype, **kw)
    return MultiLayerNetwork(conf).init()


def _lengths_mask(lengths, t=T) -> np.ndarray:
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


def _gradient_check(net: MultiLayerNetwork, ds: DataSet) -> None:
    """Analytic vs central-difference gradient of the score for every parameter.

    The score sums ``terms`` float64 values, so a difference of two scores carries round-off of about
    terms * eps * |score|, divided by 2 EPS: entries below that are compared in absolute terms."""
    grad, score = net.compute_gradient_and_score(ds)
    terms = np.asarray(ds.labels).size
    atol = terms * np.finfo(np.float64).eps * max(1.0, abs(score)) / EPS
    params = net.params()
    for i in range(params.size):
        orig = params[i]
        params[i] = orig + EPS
        plus = net.compute_gradient_and_score(ds)[1]
        params[i] = orig - EPS
        minus = net.compute_gradient_and_score(ds)[1]
        params[i] = orig
        numeric = (plus - minus) / (2 * EPS)
        assert abs(numeric - grad[i]) <= MAX_REL_ERROR * (abs(numeric) + abs(grad[i])) + atol, (
            i,
            numeric,
            grad[i],
        )


def _seq_labels(rng, classes=2) -> np.ndarray:
    return np.eye(classes)[rng.integers(0, classes, (N, T))].transpose(0, 2, 1)


LAYERS = {
    "lstm": lambda: [LSTM(4), RnnOutputLayer(2)],
    "lstm_hardtanh_gates": lambda: [
        LSTM(3, gate_activation="hardtanh", activation="softplus"),
        RnnOutputLayer(2),
    ],
    "simple_rnn": lambda: [SimpleRnn(4, activation="tanh"), RnnOutputLayer(2)],
    "gru": lambda: [GRU(4), RnnOutputLayer(2)],
    "gru_hardtanh_gates": lambda: [
        GRU(3, gate_activation="hardtanh", activation="softplus"),
        RnnOutputLayer(2),
    ],
    "gru_stacked": lambda: [DenseLayer(3, activation="tanh"), GRU(3), LSTM(2), RnnOutputLayer(2)],
    "bidirectional_gru_concat": lambda: [Bidirectional(GRU(3)), RnnOutputLayer(2)],
    "bidirectional_gru_mul": lambda: [Bidirectional(GRU(2), mode="mul"), RnnOutputLayer(2)],
    "stacked_with_dense": lambda: [
        DenseLayer(3, activation="tanh"),
        LSTM(3),
        SimpleRnn(3),
        RnnOutputLayer(2),
    ],
    "bidirectional_concat": lambda: [Bidirectional(LSTM(3)), RnnOutputLayer(2)],
    "bidirectional_add": lambda: [
        Bidirectional(SimpleRnn(3, activation="tanh"), mode="add"),
        RnnOutputLayer(2),
    ],
    "bidirectional_mul": lambda: [Bidirectional(LSTM(2), mode="mul"), RnnOutputLayer(2)],
    "bidirectional_average": lambda: [Bidirectional(LSTM(2), mode="average"), RnnOutputLayer(2)],
    "rnn_loss_layer": lambda: [
        LSTM(2),
        DenseLayer(2, activation="identity"),
        RnnLossLayer(activation="softmax"),
    ],
}


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_recurrent_gradient(name: str, masked: bool) -> None:
    rng = np.random.default_rng(len(name))
    mask = _lengths_mask([5, 2, 4]) if masked else None  # variable lengths, end padding
    ds = DataSet(rng.normal(size=(N, SIZE, T)), _seq_labels(rng), features_mask=mask)
    _gradient_check(_net(LAYERS[name]()), ds)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("inner", ["lstm", "gru", "simple_rnn"])
def test_last_time_step_gradient(inner: str, masked: bool) -> None:
    rng = np.random.default_rng(5)
    layer = {"lstm": LSTM(3), "gru": GRU(3), "simple_rnn": SimpleRnn(3, activation="tanh")}[inner]
    mask = _lengths_mask([1, 5, 3]) if masked else None
    ds = DataSet(rng.normal(size=(N, SIZE, T)), np.eye(2)[[0, 1, 1]], features_mask=mask)
    _gradient_check(_net([LastTimeStep(layer), DenseLayer(3, activation="tanh"), OutputLayer(2)]), ds)


def test_lstm_parameter_layout_and_forget_gate_bias() -> None:
    net = _net([LSTM(4, forget_gate_bias_init=1.5), RnnOutputLayer(2)])
    # W (3, 16), RW (4, 16), b (16) then the output layer's W (4, 2), b (2)
    assert net.num_params() == 3 * 16 + 4 * 16 + 16 + 4 * 2 + 2
    b = net.params()[3 * 16 + 4 * 16 : 3 * 16 + 4 * 16 + 16]
    np.testing.assert_array_equal(b, [0.0] * 4 + [1.5] * 4 + [0.0] * 8)  # gate order [a, f, o, i]


def test_gru_parameter_layout_and_gate_order() -> None:
    """W (3, 12), RW (4, 12), b (12) with the gate blocks [r, u, c]: the network's output is the NumPy
    step-by-step GRU (reset before the candidate's recurrent product) run on those views."""
    from reference import nn as ref

    net = _net([GRU(4), RnnOutputLayer(2, activation="identity", loss="mse")])
    assert net.num_params() == 3 * 12 + 4 * 12 + 12 + 4 * 2 + 2
    p = net.params()
    w, rw = p[:36].reshape(3, 12), p[36:84].reshape(4, 12)
    b, w_out, b_out = p[84:96], p[96:104].reshape(4, 2), p[104:106]
    b[:] = np.linspace(-1, 1, 12)  # a view: distinct biases per gate block show the order
    x = np.random.default_rng(2).normal(size=(2, SIZE, T))
    hs = ref.gru_forward(x.transpose(0, 2, 1), w, rw, b)
    np.testing.assert_allclose(net.output(x), (hs @ w_out + b_out).transpose(0, 2, 1), rtol=1e-12, atol=1e-12)


# ---- masks change every answer ---------------------------------------------------------------------


@pytest.fixture
def padded():
    """Sequences of lengths 5, 2, 4 and a copy whose padding is replaced by large noise."""
    rng = np.random.default_rng(11)
    mask = _lengths_mask([5, 2, 4])
    x = rng.normal(size=(N, SIZE, T))
    noisy = np.where(mask[:, None, :] > 0, x, 50 * rng.normal(size=x.shape))
    return x, noisy, mask, _seq_labels(rng)


NETWORKS = {
    "lstm": lambda: [DenseLayer(3, activation="tanh"), LSTM(4), RnnOutputLayer(2)],
    "bidirectional": lambda: [Bidirectional(LSTM(3)), DenseLayer(3, activation="tanh"), RnnOutputLayer(2)],
    "gru": lambda: [DenseLayer(3, activation="tanh"), GRU(4), RnnOutputLayer(2)],
    "bidirectional_gru": lambda: [Bidirectional(GRU(3)), DenseLayer(3, activation="tanh"), RnnOutputLayer(2)],
}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_padding_is_invisible_with_a_mask(padded, name: str) -> None:
    """With the mask, garbage in padded steps changes no output, score, gradient or evaluation."""
    x, noisy, mask, labels = padded
    net = _net(NETWORKS[name]())
    clean, dirty = DataSet(x, labels, features_mask=mask), DataSet(noisy, labels, features_mask=mask)
    out = net.output(clean)
    np.testing.assert_allclose(net.output(dirty), out, rtol=1e-12, atol=1e-12)
    assert np.all(out[mask[:, None, :].repeat(2, axis=1) == 0] == 0)  # masked steps output zero
    np.testing.assert_allclose(net.score_examples(dirty), net.score_examples(clean), rtol=1e-12)
    g_clean, s_clean = net.compute_gradient_and_score(clean)
    g_dirty, s_dirty = net.compute_gradient_and_score(dirty)
    np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-10, atol=1e-12)
    assert s_dirty == pytest.approx(s_clean, rel=1e-12)
    assert net.evaluate(dirty).accuracy() == net.evaluate(clean).accuracy()
    # ... and without the mask the garbage does change them
    assert not np.allclose(net.output(noisy), net.output(x))
    assert not np.allclose(net.compute_gradient_and_score(DataSet(noisy, labels))[0], g_clean)


def test_masked_score_counts_present_steps_only(padded) -> None:
    x, _, mask, labels = padded
    net = _net(NETWORKS["lstm"]())
    per_step = net.score_examples(DataSet(x, labels, features_mask=mask))
    # the same sequences cut to their lengths, one by one: the masked score is the sum over present steps
    for i, length in enumerate([5, 2, 4]):
        alone = DataSet(x[i : i + 1, :, :length], labels[i : i + 1, :, :length])
        assert per_step[i] == pytest.approx(net.score_examples(alone)[0], rel=1e-10)
    score = net.score(DataSet(x, labels, features_mask=mask))
    assert score == pytest.approx(per_step.sum() / N, rel=1e-12)  # DL4J: sum over steps / batch size


def test_labels_mask_takes_precedence_and_evaluation_skips_masked_steps(padded) -> None:
    x, _, mask, labels = padded
    net = _net(NETWORKS["lstm"]())
    only_first = np.zeros_like(mask)
    only_first[:, 0] = 1
    ev = net.evaluate(DataSet(x, labels, features_mask=mask, labels_mask=only_first))
    pred = net.output(DataSet(x, features_mask=mask))[:, :, 0].argmax(axis=1)
    assert ev.accuracy() == pytest.approx(np.mean(pred == labels[:, :, 0].argmax(axis=1)))
    full = net.evaluate(DataSet(x, labels, features_mask=mask))
    present = mask.reshape(-1) > 0
    pred_all = net.output(DataSet(x, features_mask=mask)).transpose(0, 2, 1).reshape(-1, 2).argmax(axis=1)
    truth_all = labels.transpose(0, 2, 1).reshape(-1, 2).argmax(axis=1)
    assert full.accuracy() == pytest.approx(np.mean(pred_all[present] == truth_all[present]))


def test_last_time_step_uses_last_present_step(padded) -> None:
    x, noisy, mask, _ = padded
    net = _net([LastTimeStep(LSTM(4)), OutputLayer(2)])
    out = net.output(x, features_mask=mask)
    for i, length in enumerate([5, 2, 4]):
        np.testing.assert_allclose(out[i], net.output(x[i : i + 1, :, :length])[0], rtol=1e-12)
    np.testing.assert_allclose(net.output(noisy, features_mask=mask), out, rtol=1e-12)
    assert not np.allclose(net.output(x), out)


def test_rnn_time_step_matches_the_whole_sequence() -> None:
    rng = np.random.default_rng(4)
    net = _net([LSTM(4), GRU(3), SimpleRnn(3), RnnOutputLayer(2)])
    x = rng.normal(size=(2, SIZE, T))
    whole = net.output(x)
    steps = [net.rnn_time_step(x[:, :, s]) for s in range(T)]
    np.testing.assert_allclose(np.stack(steps, axis=2), whole, rtol=1e-12, atol=1e-12)
    net.rnn_clear_previous_state()
    np.testing.assert_allclose(net.rnn_time_step(x[:, :, :2]), whole[:, :, :2], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(net.rnn_time_step(x[:, :, 2:]), whole[:, :, 2:], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="rnn_clear_previous_state"):
        net.rnn_time_step(x[:1, :, :1])


def sign_sequences(rng: np.random.Generator, n: int, t: int = 12) -> DataSet:
    """Variable-length (4..t) noisy sequences around +-0.5, end-padded and masked; label: the sign."""
    mask = _lengths_mask(rng.integers(4, t + 1, n), t)
    sign = rng.integers(0, 2, n)
    x = ((sign * 2 - 1)[:, None, None] * 0.5 + 0.5 * rng.normal(size=(n, 1, t))) * mask[:, None, :]
    return DataSet(
        x.astype(np.float32), np.eye(2, dtype=np.float32)[sign], features_mask=mask.astype(np.float32)
    )


def test_training_on_variable_lengths_learns_the_sign() -> None:
    rng = np.random.default_rng(0)
    conf = MultiLayerConfiguration(
        [LastTimeStep(LSTM(8)), OutputLayer(2)], input_type=InputType.recurrent(1), seed=1, updater=Adam(0.02)
    )
    net = MultiLayerNetwork(conf).init()
    net.fit([sign_sequences(rng, 32) for _ in range(30)], epochs=2)
    assert net.evaluate(sign_sequences(rng, 500)).accuracy() >= 0.95


def test_configuration_errors_name_the_layer() -> None:
    with pytest.raises(ValueError, match=r"layers\[0\] \(LSTM\)\.input: needs recurrent input"):
        MultiLayerConfiguration([LSTM(3), OutputLayer(2)], input_type=InputType.feed_forward(4))
    with pytest.raises(ValueError, match="gate_activation"):
        LSTM(3, gate_activation="softmax")
    with pytest.raises(ValueError, match="layer: expected an LSTM, GRU or SimpleRnn"):
        Bidirectional(DenseLayer(3))
    net = _net([LSTM(3), RnnOutputLayer(2)])
    with pytest.raises(ValueError, match=r"features_mask: expected shape \(batch, time\)"):
        net.output(np.zeros((2, SIZE, 4)), features_mask=np.ones((2, 3)))
    dense = MultiLayerNetwork(
        MultiLayerConfiguration([OutputLayer(2)], input_type=InputType.feed_forward(3))
    ).init()
    with pytest.raises(ValueError, match="features_mask: only recurrent input"):
        dense.output(np.zeros((2, 3)), features_mask=np.ones((2, 3)))


def test_recurrent_configuration_round_trips() -> None:
    conf = MultiLayerConfiguration(
        [
            Bidirectional(LSTM(3, gate_activation="hardtanh"), mode="add"),
            Bidirectional(GRU(3, activation="elu", gate_activation="hardtanh")),
            GRU(2, dropout=0.9, l2=1e-4),
            LastTimeStep(SimpleRnn(2)),
            OutputLayer(2),
        ],
        input_type=InputType.recurrent(SIZE),
    )
    assert MultiLayerConfiguration.from_json(conf.to_json()) == conf
    assert MultiLayerConfiguration.from_yaml(conf.to_yaml()) == conf


def _tbptt_net(**kw) -> MultiLayerNetwork:
    from sparkgrad.nn.updaters import Sgd

    return _net([LSTM(3), SimpleRnn(2), RnnOutputLayer(2)], updater=Sgd(0.5), **kw)


def test_truncated_bptt_longer_than_the_sequence_is_standard_training() -> None:
    rng = np.random.default_rng(21)
    ds = DataSet(rng.normal(size=(N, SIZE, T)), _seq_labels(rng), features_mask=_lengths_mask([5, 2, 4]))
    standard = _tbptt_net().fit(ds, epochs=2)
    truncated = _tbptt_net(backprop_type="truncated_bptt", tbptt_forward_length=T, tbptt_backward_length=T)
    np.testing.assert_allclose(
        truncated.fit(ds, epochs=2).params(), standard.params(), rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize("backward", [3, 2])
def test_truncated_bptt_updates_per_segment_and_carries_the_state(backward: int) -> None:
    rng = np.random.default_rng(22)
    steps = 6
    x, labels = (
        rng.normal(size=(N, SIZE, steps)),
        np.eye(2)[rng.integers(0, 2, (N, steps))].transpose(0, 2, 1),
    )
    ds = DataSet(x, labels)
    kw = {"backprop_type": "truncated_bptt", "tbptt_forward_length": 3, "tbptt_backward_length": backward}
    net = _tbptt_net(**kw)
    start = net.params().copy()
    net.fit(ds)
    assert net.iteration_count == 2  # one update per segment
    # by hand: segment 1 from a zero state; segment 2 from the state segment 1 ended in (old parameters)
    ref = _tbptt_net(**kw)
    first, second = ref.tbptt_segments(ds)
    ref.apply_update(ref.compute_update(first)[0])
    after_first = ref.params().copy()
    ref.set_params(start)
    ref.rnn_clear_previous_state()
    ref.rnn_time_step(x[:, :, :3])
    ref.set_params(after_first)
    ref.apply_update(ref.compute_update(second)[0])
    np.testing.assert_allclose(net.params(), ref.params(), rtol=1e-12, atol=1e-14)
    # the whole sequence at once is not what truncated BPTT trains on, and compute_update refuses it
    with pytest.raises(ValueError, match="tbptt_forward_length"):
        net.compute_update(ds)


def test_truncated_bptt_configuration_is_checked() -> None:
    with pytest.raises(ValueError, match="tbptt_backward_length"):
        _tbptt_net(backprop_type="truncated_bptt", tbptt_forward_length=3, tbptt_backward_length=4)
    with pytest.raises(
        ValueError, match="backprop_type: truncated_bptt needs recurrent input and per-time-step"
    ):
        _net([LastTimeStep(LSTM(3)), OutputLayer(2)], backprop_type="truncated_bptt")
    conf = _tbptt_net(backprop_type="truncated_bptt", tbptt_forward_length=7, tbptt_backward_length=5).conf
    assert MultiLayerConfiguration.from_json(conf.to_json()) == conf


def test_recurrent_network_saves_and_loads(tmp_path, padded) -> None:
    x, _, mask, _ = padded
    net = _net([Bidirectional(LSTM(3), mode="average"), LastTimeStep(SimpleRnn(2)), OutputLayer(2)])
    path = tmp_path / "rnn.zip"
    net.save(path)
    loaded = MultiLayerNetwork.load(path)
    bool_mask = mask.astype(bool)  # any numeric or boolean mask array works
    expected = net.output(x, features_mask=mask)
    np.testing.assert_array_equal(loaded.output(x, features_mask=bool_mask), expected)


# ---- global pooling over time and batch normalization respect the mask --------------------------------


@pytest.mark.parametrize("pooling", ["max", "avg", "sum"])
@pytest.mark.parametrize("masked", [False, True])
def test_global_pooling_over_time_gradient(pooling: str, masked: bool) -> None:
    rng = np.random.default_rng(21)
    net = _net([LSTM(4), GlobalPoolingLayer(pooling), OutputLayer(2)])
    mask = _lengths_mask([5, 2, 4]) if masked else None
    ds = DataSet(rng.normal(size=(N, SIZE, T)), np.eye(2)[rng.integers(0, 2, N)], features_mask=mask)
    _gradient_check(net, ds)


@pytest.mark.parametrize("pooling", ["max", "avg", "sum"])
def test_global_pooling_over_time_pools_present_steps_only(padded, pooling: str) -> None:
    """Pooling over time equals the pooling of each sequence's present steps, whatever the padding."""
    x, noisy, mask, _ = padded
    net = _net([DenseLayer(3, activation="identity"), GlobalPoolingLayer(pooling), OutputLayer(2)])
    w, b = net.params()[:9].reshape(3, 3), net.params()[9:12]
    pooled = []
    for i, length in enumerate([5, 2, 4]):
        steps = x[i, :, :length].T @ w + b  # (length, 3)
        pooled.append(
            {"max": steps.max(axis=0), "avg": steps.mean(axis=0), "sum": steps.sum(axis=0)}[pooling]
        )
    layer = net.conf.layers[2]
    want = np.asarray(pooled) @ net.params()[12:18].reshape(3, 2) + net.params()[18:20]
    want = np.exp(want - want.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    assert layer.n_in == 3
    np.testing.assert_allclose(net.output(noisy, features_mask=mask), want, rtol=1e-12)
    assert not np.allclose(net.output(noisy), want)  # the padding would count without the mask


def test_batch_norm_statistics_skip_masked_steps(padded) -> None:
    """Training-mode batch norm on sequences normalizes with the mean and variance of the present steps:
    padding garbage changes neither the outputs at present steps, nor the gradient, nor the running
    statistics; without the mask it changes all of them."""
    x, noisy, mask, labels = padded
    net = _net([BatchNormalization(), LSTM(4), RnnOutputLayer(2)])
    present = x.transpose(0, 2, 1)[mask > 0]  # (present steps, SIZE)
    out = net.output(DataSet(noisy, labels, features_mask=mask), train=True)
    np.testing.assert_allclose(
        net.output(DataSet(x, labels, features_mask=mask), train=True), out, rtol=1e-12
    )
    g_clean = net.compute_gradient_and_score(DataSet(x, labels, features_mask=mask))[0]
    g_dirty = net.compute_gradient_and_score(DataSet(noisy, labels, features_mask=mask))[0]
    np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-10, atol=1e-12)
    assert not np.allclose(net.compute_gradient_and_score(DataSet(noisy, labels))[0], g_clean)
    update, _ = net.compute_update(DataSet(noisy, labels, features_mask=mask))
    decay = net.conf.layers[0].decay
    running_mean = net.params()[2 * SIZE : 3 * SIZE] - update[2 * SIZE : 3 * SIZE]
    np.testing.assert_allclose(running_mean, (1 - decay) * present.mean(axis=0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_batch_norm_on_sequences_gradient(masked: bool) -> None:
    rng = np.random.default_rng(22)
    net = _net([LSTM(4), BatchNormalization(), DenseLayer(3, activation="tanh"), RnnOutputLayer(2)])
    mask = _lengths_mask([5, 2, 4]) if masked else None
    _gradient_check(net, DataSet(rng.normal(size=(N, SIZE, T)), _seq_labels(rng), features_mask=mask))


# ---- sequences of images: convolutions at every step (RnnToCnn), recurrent layers after them (CnnToRnn) --


def _image_net(layers, dtype="float64") -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        layers, input_type=InputType.recurrent_images(4, 4, 2), seed=3, dtype=dtype
    )
    return MultiLayerNetwork(conf).init()


@pytest.mark.parametrize("masked", [False, True])
def test_convolutions_over_image_sequences_gradient(masked: bool) -> None:
    rng = np.random.default_rng(23)
    net = _image_net(
        [
            ConvolutionLayer(2, kernel_size=(2, 2), activation="tanh"),
            BatchNormalization(),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(1, 1)),
            LSTM(3),
            RnnOutputLayer(2),
        ]
    )
    assert [t.describe() for t in net.conf.layer_input_types] == [
        "recurrent(2x4x4)", "recurrent(2x3x3)", "recurrent(2x3x3)", "recurrent(2x2x2)", "recurrent(3)",
    ]  # fmt: skip
    mask = _lengths_mask([5, 2, 4]) if masked else None
    _gradient_check(net, DataSet(rng.normal(size=(N, 32, T)), _seq_labels(rng), features_mask=mask))


def test_image_sequence_steps_are_the_images_of_a_convolutional_network() -> None:
    """Step t of (batch, C*H*W, time) features is the image x[:, :, t] in (C, H, W) order, and the layer
    after the convolution sees its activations flattened in (C, H, W) order, as DL4J's preprocessors."""
    rng = np.random.default_rng(24)
    layers = [ConvolutionLayer(3, kernel_size=(2, 2), activation="relu"), DenseLayer(4, activation="tanh")]
    seq = _image_net([*layers, RnnOutputLayer(2, activation="identity", loss="mse")])
    conf = MultiLayerConfiguration(
        [*layers, OutputLayer(2, activation="identity", loss="mse")],
        input_type=InputType.convolutional(4, 4, 2), dtype="float64",
    )  # fmt: skip
    frames = MultiLayerNetwork(conf).init(seq.params())
    x = rng.normal(size=(N, 32, T))
    out = seq.output(x)
    for t in range(T):
        np.testing.assert_allclose(out[:, :, t], frames.output(x[:, :, t].reshape(N, 2, 4, 4)), rtol=1e-12)
    assert InputType.from_json(InputType.recurrent_images(4, 4, 2, 6).to_json()).step_type() == (
        InputType.convolutional(4, 4, 2)
    )


# ---- 1-D layers over sequences ------------------------------------------------------------------------


def _net1d(layers, size=3, dtype="float64", seed=7, **kw) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(layers, input_type=InputType.recurrent(size), seed=seed, dtype=dtype, **kw)
    return MultiLayerNetwork(conf).init()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3),
    c=st.integers(1, 4),
    k_out=st.integers(1, 4),
    t=st.integers(1, 9),
    kernel=st.integers(1, 4),
    stride=st.integers(1, 3),
    pad=st.integers(0, 2),
    same=st.booleans(),
    masked=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_convolution1d_matches_reference(n, c, k_out, t, kernel, stride, pad, same, masked, dtype, seed):
    mode = "same" if same else "truncate"
    out_len, pad_start = conv_output_size(
        t, kernel, stride, pad, Convolution1DLayer(1, convolution_mode=mode).convolution_mode
    )
    if out_len < 1:
        return
    rng = np.random.default_rng(seed)
    layer = Convolution1DLayer(
        k_out, kernel_size=kernel, stride=stride, padding=pad, convolution_mode=mode, activation="identity"
    )
    net = _net1d([layer, RnnOutputLayer(2)], size=c, dtype=np.dtype(dtype).name)
    x = rng.normal(size=(n, c, t)).astype(dtype)
    mask = rng.integers(0, 2, (n, t)).astype(dtype) if masked else None
    rt = net._runtimes[0]
    y = np.asarray(rt.forward(np.ascontiguousarray(x.transpose(0, 2, 1)), False, 0, mask=mask))  # (N, P, K)
    w = net.params()[: k_out * c * kernel].reshape(k_out, c, kernel).astype(np.float64)
    b = net.params()[k_out * c * kernel : k_out * c * kernel + k_out].astype(np.float64)
    want = ref.conv1d_forward(x.astype(np.float64), w, b, stride, pad_start, out_len)
    if mask is not None:
        m = ref.mask_reduction_1d(mask, kernel, stride, pad_start, out_len, same and stride == 1)
        want = want * m[:, None, :]
        np.testing.assert_array_equal(np.asarray(rt.output_mask(mask)), m)
    eps = float(np.finfo(dtype).eps)
    bound = 8 * eps * c * kernel * (1 + np.abs(x).max() * np.abs(w).max())
    np.testing.assert_allclose(y.transpose(0, 2, 1), want, rtol=bound, atol=bound)
    # backward: dL/dx and dL/dW of sum(y * dy) as the adjoint of the same 1-D convolution
    dy = rng.normal(size=y.shape).astype(dtype)
    dx = np.asarray(rt.backward(dy.copy(), True)).transpose(0, 2, 1)
    dy64 = dy.transpose(0, 2, 1).astype(np.float64)
    if mask is not None:
        dy64 = dy64 * m[:, None, :]
    want_dx = np.zeros((n, c, t))
    want_dw = np.zeros_like(w)
    for p in range(out_len):
        start = p * stride - pad_start
        for j in range(kernel):
            if 0 <= start + j < t:
                want_dx[:, :, start + j] += dy64[:, :, p] @ w[:, :, j]
                want_dw[:, :, j] += dy64[:, :, p].T @ x[:, :, start + j].astype(np.float64)
    g = net._grad[: k_out * c * kernel].reshape(k_out, c, kernel)
    bound = (
        8
        * eps
        * max(n * out_len, k_out * kernel)
        * (1 + np.abs(dy64).max() * (np.abs(x).max() + np.abs(w).max()))
    )
    np.testing.assert_allclose(dx, want_dx, rtol=0, atol=bound)
    np.testing.assert_allclose(g, want_dw, rtol=0, atol=bound)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3),
    c=st.integers(1, 3),
    t=st.integers(1, 9),
    kernel=st.integers(1, 4),
    stride=st.integers(1, 3),
    pad=st.integers(0, 1),
    kind=st.sampled_from(["max", "avg"]),
    masked=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_subsampling1d_matches_reference(n, c, t, kernel, stride, pad, kind, masked, dtype, seed):
    layer = Subsampling1DLayer(kind, kernel_size=kernel, stride=stride, padding=pad)
    out_len, _ = conv_output_size(t, kernel, stride, pad, layer.convolution_mode)
    if out_len < 1 or pad >= kernel:  # every window must hold an input step
        return
    rng = np.random.default_rng(seed)
    net = _net1d([layer, RnnOutputLayer(2)], size=c, dtype=np.dtype(dtype).name)
    x = rng.normal(size=(n, c, t)).astype(dtype)
    mask = rng.integers(0, 2, (n, t)).astype(dtype) if masked else None
    rt = net._runtimes[0]
    y = np.asarray(rt.forward(np.ascontiguousarray(x.transpose(0, 2, 1)), False, 0, mask=mask))
    want = ref.pool1d_forward(kind, x, kernel, stride, pad, out_len)
    if mask is not None:
        want = want * ref.mask_reduction_1d(mask, kernel, stride, pad, out_len)[:, None, :]
    bound = 4 * float(np.finfo(dtype).eps) * kernel * (1 + np.abs(x).max())
    np.testing.assert_allclose(y.transpose(0, 2, 1), want, rtol=bound, atol=bound)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3),
    c=st.integers(1, 3),
    t=st.integers(1, 6),
    size=st.integers(1, 3),
    left=st.integers(0, 2),
    right=st.integers(0, 2),
    masked=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_upsampling1d_and_zero_padding1d_match_reference(n, c, t, size, left, right, masked, seed):
    """Upsampling1D then ZeroPadding1DLayer against np.repeat and np.pad, their masks and the adjoint."""
    rng = np.random.default_rng(seed)
    net = _net1d([Upsampling1D(size), ZeroPadding1DLayer((left, right)), RnnOutputLayer(2)], size=c)
    x = rng.normal(size=(n, c, t))
    mask = rng.integers(0, 2, (n, t)).astype(np.float64) if masked else None
    up, pad = net._runtimes[0], net._runtimes[1]
    y = pad.forward(up.forward(np.ascontiguousarray(x.transpose(0, 2, 1)), False, 0, mask=mask), False, 0,
                    mask=up.output_mask(mask))  # fmt: skip
    want = np.pad(np.repeat(x, size, axis=2), ((0, 0), (0, 0), (left, right)))
    np.testing.assert_array_equal(y.transpose(0, 2, 1), want)
    if mask is not None:
        want_mask = np.pad(np.repeat(mask, size, axis=1), ((0, 0), (left, right)))
        np.testing.assert_array_equal(pad.output_mask(None), want_mask)
    dy = rng.normal(size=y.shape)
    dx = up.backward(pad.backward(dy.copy(), True), True)
    want_dx = dy[:, left : left + size * t].reshape(n, t, size, c).sum(axis=2)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-15, atol=1e-15)


LAYERS_1D = {
    "upsample_pad": lambda: [
        Convolution1DLayer(3, kernel_size=2, stride=2, activation="tanh"),
        Upsampling1D(3),
        ZeroPadding1DLayer((1, 2)),
        RnnOutputLayer(2),
    ],
    "conv_truncate": lambda: [
        Convolution1DLayer(3, kernel_size=3, activation="tanh"),
        RnnOutputLayer(2),
    ],
    "conv_same_stride2_pool_max": lambda: [
        Convolution1DLayer(4, kernel_size=2, stride=2, convolution_mode="same", activation="tanh"),
        Subsampling1DLayer("max", kernel_size=2, stride=1),
        RnnOutputLayer(2),
    ],
    "conv_padding_pool_avg_global": lambda: [
        Convolution1DLayer(3, kernel_size=3, padding=1, stride=2, activation="softplus"),
        Subsampling1DLayer("avg", kernel_size=2, stride=1, padding=1),
        GlobalPoolingLayer("avg"),
        OutputLayer(2),
    ],
    "conv_pool_conv_global_max": lambda: [  # the 1-D window layers hand on (N, C, T) views
        Convolution1DLayer(4, kernel_size=3, activation="relu"),
        Subsampling1DLayer("max", kernel_size=2, stride=2),
        Convolution1DLayer(3, kernel_size=2, activation="tanh"),
        GlobalPoolingLayer("max"),
        OutputLayer(2),
    ],
    "dense_then_conv_same": lambda: [
        DenseLayer(3, activation="tanh"),
        Convolution1DLayer(2, kernel_size=3, convolution_mode="same", activation="identity", dropout=None),
        RnnOutputLayer(2),
    ],
}


def _labels_for(net: MultiLayerNetwork, rng, x: np.ndarray, mask) -> np.ndarray:
    out = net.output(x, features_mask=mask)
    if out.ndim == 3:  # per-step labels with the output's number of steps
        return np.eye(2)[rng.integers(0, 2, (x.shape[0], out.shape[2]))].transpose(0, 2, 1)
    return np.eye(2)[rng.integers(0, 2, x.shape[0])]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", sorted(LAYERS_1D))
def test_time_1d_gradient(name: str, masked: bool) -> None:
    rng = np.random.default_rng(len(name))
    t = 9
    net = _net1d(LAYERS_1D[name]())
    x = rng.normal(size=(3, 3, t))
    mask = _lengths_mask([9, 4, 6], t) if masked else None
    ds = DataSet(x, _labels_for(net, rng, x, mask), features_mask=mask)
    _gradient_check(net, ds)


def test_the_reduced_mask_masks_the_output_and_the_loss() -> None:
    """Stride 2: output step p covers input steps 2p, 2p+1; a sequence of 4 present steps out of 10 has
    2 present output steps. Masked output steps are zero and add nothing to the loss."""
    rng = np.random.default_rng(3)
    net = _net1d([Convolution1DLayer(3, kernel_size=2, stride=2, activation="tanh"), RnnOutputLayer(2)])
    x = rng.normal(size=(2, 3, 10))
    mask = _lengths_mask([10, 4], 10)
    out = net.output(x, features_mask=mask)
    assert out.shape == (2, 2, 5)
    np.testing.assert_array_equal(net._runtimes[0].output_mask(None), [[1] * 5, [1, 1, 0, 0, 0]])
    assert np.all(out[1, :, 2:] == 0) and np.all(out[1, :, :2] != 0)
    labels = np.eye(2)[rng.integers(0, 2, (2, 5))].transpose(0, 2, 1)
    masked = net.score_examples(DataSet(x, labels, features_mask=mask))
    alone = net.score_examples(DataSet(x[1:, :, :4], labels[1:, :, :2]))
    assert masked[1] == pytest.approx(alone[0], rel=1e-12)  # the loss of the 2 present output steps
    assert not np.allclose(net.output(x)[1], out[1])  # the mask changes the answer
    # padding and upsampling carry the mask: the padded steps and the repeats of absent steps do not count
    net = _net1d([Upsampling1D(2), ZeroPadding1DLayer((1, 0)), RnnOutputLayer(2)])
    labels = np.eye(2)[rng.integers(0, 2, (2, 21))].transpose(0, 2, 1)
    masked = net.score_examples(DataSet(x, labels, features_mask=mask))
    alone = net.score_examples(DataSet(x[1:, :, :4], labels[1:, :, :9], features_mask=np.ones((1, 4))))
    assert masked[1] == pytest.approx(alone[0], rel=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_channel_major_handoff_between_1d_layers_changes_no_bit(dtype: str, masked: bool) -> None:
    """Adjacent 1-D window layers pass (N, C, T) results on as (N, T, C) views (no layout copies); the
    outputs and gradients are the same bits as with the copies into the (N, T, C) layout and back."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(5, 4, 23)).astype(dtype)
    mask = _lengths_mask(rng.integers(10, 24, 5), 23).astype(dtype) if masked else None
    ds = DataSet(x, np.eye(2, dtype=dtype)[rng.integers(0, 2, 5)], features_mask=mask)
    results = []
    for handoff in (True, False):
        net = _net1d(LAYERS_1D["conv_pool_conv_global_max"](), size=4, dtype=dtype)
        conv, pool, conv2 = net._runtimes[:3]
        assert (conv.hands_channel_major, pool.hands_channel_major, conv2.hands_channel_major) == (True,) * 3
        assert (pool.returns_channel_major_dx, conv2.returns_channel_major_dx) == (True, True)
        if not handoff:
            for rt in (conv, pool, conv2):
                rt.hands_channel_major = rt.returns_channel_major_dx = False
        grad = net.compute_gradient_and_score(ds)[0].copy()
        results.append((net.output(x, features_mask=mask), grad))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_an_unmasked_step_after_a_masked_one_uses_no_stale_mask() -> None:
    """With the channel-major handoff, an unmasked step after a masked one gets the gradient a fresh
    network gets: the masked step's reduced mask is not applied to it."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(5, 4, 23))
    labels = np.eye(2)[rng.integers(0, 2, 5)]
    mask = _lengths_mask(rng.integers(10, 24, 5), 23)
    fresh = _net1d(LAYERS_1D["conv_pool_conv_global_max"](), size=4, dtype="float64")
    used = _net1d(LAYERS_1D["conv_pool_conv_global_max"](), size=4, dtype="float64")
    used.compute_gradient_and_score(DataSet(x, labels, features_mask=mask))
    expected = fresh.compute_gradient_and_score(DataSet(x, labels))[0].copy()
    np.testing.assert_array_equal(used.compute_gradient_and_score(DataSet(x, labels))[0], expected)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_time_1d_results_for_1_and_2_threads(dtype: str) -> None:
    """Outputs and gradients are the same bits for 1 and 2 threads: the convolution's weight gradient
    sums a fixed number of partials, whatever the thread count (the 2-D kernels' property, tested in
    test_kernels_spatial.py)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 8, 40)).astype(dtype)
    mask = _lengths_mask(rng.integers(20, 41, 16), 40).astype(dtype)
    layers = [
        Convolution1DLayer(32, kernel_size=5, activation="relu"),
        Subsampling1DLayer("max"),
        Convolution1DLayer(32, kernel_size=3, stride=2, activation="relu"),
        Upsampling1D(2),
        ZeroPadding1DLayer(2),
        GlobalPoolingLayer("max"),
        OutputLayer(2),
    ]
    ds = DataSet(x, np.eye(2, dtype=dtype)[rng.integers(0, 2, 16)], features_mask=mask)
    before = sparkgrad.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            net = _net1d(layers, size=8, dtype=dtype)
            grad = net.compute_gradient_and_score(ds)[0].copy()
            results.append((net.output(x, features_mask=mask), grad))
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_time_1d_configuration_round_trips_and_checks_its_fields() -> None:
    conf = MultiLayerConfiguration(
        [
            Convolution1DLayer(4, kernel_size=5, stride=2, padding=1, activation="relu", l2=1e-4),
            Subsampling1DLayer("avg", kernel_size=3, stride=1, convolution_mode="same"),
            Upsampling1D(3),
            ZeroPadding1DLayer((0, 2)),
            RnnOutputLayer(2),
        ],
        input_type=InputType.recurrent(3, 20),
    )
    assert conf.layer_input_types[1] == InputType.recurrent(4, 9)
    assert conf.output_type == InputType.recurrent(2, 29)
    assert MultiLayerConfiguration.from_json(conf.to_json()) == conf
    assert MultiLayerConfiguration.from_yaml(conf.to_yaml()) == conf
    with pytest.raises(ValueError, match="kernel_size"):
        Convolution1DLayer(2, kernel_size=0)
    with pytest.raises(ValueError, match="size"):
        Upsampling1D(0)
    with pytest.raises(ValueError, match="padding"):
        ZeroPadding1DLayer((1, -1))
    with pytest.raises(ValueError, match=r"pooling_type: Subsampling1DLayer supports max and avg"):
        Subsampling1DLayer("sum")
    with pytest.raises(ValueError, match=r"layers\[0\] \(Convolution1DLayer\)\.kernel_size: does not fit 2"):
        MultiLayerConfiguration(
            [Convolution1DLayer(2, kernel_size=3), RnnOutputLayer(2)], input_type=InputType.recurrent(3, 2)
        )
    with pytest.raises(ValueError, match=r"layers\[0\] \(Convolution1DLayer\)\.input: needs recurrent input"):
        MultiLayerConfiguration([Convolution1DLayer(2), OutputLayer(2)], input_type=InputType.feed_forward(3))
    with pytest.raises(ValueError, match=r"truncated_bptt cuts .* layers\[1\] \(Upsampling1D\) changes"):
        _net1d(
            [Convolution1DLayer(2, convolution_mode="same"), Upsampling1D(2), RnnOutputLayer(2)],
            backprop_type="truncated_bptt",
        )
    _net1d(
        [Convolution1DLayer(2, convolution_mode="same"), RnnOutputLayer(2)], backprop_type="truncated_bptt"
    )
    net = _net1d([Convolution1DLayer(2, kernel_size=3), RnnOutputLayer(2)])
    with pytest.raises(ValueError, match="does not fit sequences of 2 time steps"):
        net.output(np.zeros((1, 3, 2)))


def test_time_1d_layers_in_a_graph_pass_their_mask_on() -> None:
    """A graph: conv -> pool -> RnnOutputLayer; its loss mask is the reduced features mask, as in the
    MultiLayerNetwork with the same layers and parameters."""
    rng = np.random.default_rng(9)
    layers = [
        Convolution1DLayer(3, kernel_size=2, stride=2, activation="tanh"),
        Subsampling1DLayer("max", 2, 1),
    ]
    conf = (
        ComputationGraphConfiguration.builder(seed=7, dtype="float64")
        .add_inputs("in")
        .set_input_types(InputType.recurrent(3))
        .add_layer("conv", layers[0], "in")
        .add_layer("pool", layers[1], "conv")
        .add_layer("out", RnnOutputLayer(2), "pool")
        .set_outputs("out")
        .build()
    )
    graph = ComputationGraph(conf).init()
    net = _net1d([*layers, RnnOutputLayer(2)])
    net.set_params(graph.params())
    x = rng.normal(size=(2, 3, 10))
    mask = _lengths_mask([10, 5], 10)
    labels = np.eye(2)[rng.integers(0, 2, (2, 4))].transpose(0, 2, 1)
    np.testing.assert_allclose(
        graph.output(x, features_masks=[mask])[0], net.output(x, features_mask=mask), rtol=1e-12
    )
    g_scores = graph.score_examples(MultiDataSet([x], [labels], features_masks=[mask]))
    np.testing.assert_allclose(
        g_scores, net.score_examples(DataSet(x, labels, features_mask=mask)), rtol=1e-12
    )
