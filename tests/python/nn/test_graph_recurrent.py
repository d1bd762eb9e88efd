"""Recurrent layers, per-step vertices and time-series masks in ComputationGraph: a float64 gradient check
of a graph with two sequence inputs of different lengths and masks feeding a recurrent and a feed-forward
output, a chain graph that equals the MultiLayerNetwork bit for bit, and tests that fail if a mask is
ignored."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.nn import (
    GRU,
    LSTM,
    Bidirectional,
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    DuplicateToTimeSeriesVertex,
    ElementWiseVertex,
    InputType,
    LastTimeStep,
    LastTimeStepVertex,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
    SimpleRnn,
    StackVertex,
    SubsetVertex,
)
from sparkgrad.nn.updaters import Adam

EPS = 1e-6
MAX_REL_ERROR = 1e-5
N, TA, TB = 3, 6, 4


def _mask(lengths, t) -> np.ndarray:
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


def _two_sequence_graph(dtype: str = "float64") -> ComputationGraph:
    """Input a (3 x 6 steps) and b (2 x 4 steps); a per-step output on a and a vector output on both."""
    conf = (
        ComputationGraphConfiguration.builder(seed=3, dtype=dtype, updater=Adam(1e-2))
        .add_inputs("a", "b")
        .set_input_types(InputType.recurrent(3), InputType.recurrent(2))
        .add_layer("la", LSTM(4), "a")
        .add_vertex("sub", SubsetVertex(0, 1), "a")
        .add_vertex("m", MergeVertex(), "la", "sub")
        .add_layer("da", DenseLayer(3, activation="tanh"), "m")  # per step
        .add_layer("db", DenseLayer(3, activation="sigmoid"), "la")
        .add_vertex("ew", ElementWiseVertex("product"), "da", "db")
        .add_layer("seq", RnnOutputLayer(2), "ew")
        .add_layer("last_a", LastTimeStep(SimpleRnn(2, activation="tanh")), "la")
        .add_layer("bi", Bidirectional(SimpleRnn(2, activation="tanh"), mode="add"), "b")
        .add_layer("last_b", LastTimeStep(GRU(3)), "bi")
        .add_layer("vec", OutputLayer(2), "last_a", "last_b")
        .set_outputs("seq", "vec")
        .build()
    )
    return ComputationGraph(conf).init()


def _two_sequence_data(rng: np.random.Generator, masked: bool, labels_mask: bool = False) -> MultiDataSet:
    a, b = rng.normal(size=(N, 3, TA)), rng.normal(size=(N, 2, TB))
    seq_labels = np.eye(2)[rng.integers(0, 2, (N, TA))].transpose(0, 2, 1)
    vec_labels = np.eye(2)[rng.integers(0, 2, N)]
    fmasks = [_mask([6, 2, 4], TA), _mask([1, 4, 3], TB)] if masked else None
    lmasks = [_mask([5, 2, 3], TA), None] if labels_mask else None
    return MultiDataSet([a, b], [seq_labels, vec_labels], features_masks=fmasks, labels_masks=lmasks)


def _gradient_check(net: ComputationGraph, data: MultiDataSet) -> None:
    """Analytic vs central-difference gradient of the score for every parameter (round-off bound as in
    test_recurrent: terms * eps * |score| / 2 EPS absolute, the rest relative)."""
    grad, score = net.compute_gradient_and_score(data)
    terms = sum(np.asarray(y).size for y in data.labels)
    atol = terms * np.finfo(np.float64).eps * max(1.0, abs(score)) / EPS
    params = net.params()
    for i in range(params.size):
        orig = params[i]
        params[i] = orig + EPS
        plus = net.compute_gradient_and_score(data)[1]
        params[i] = orig - EPS
        minus = net.compute_gradient_and_score(data)[1]
        params[i] = orig
        numeric = (plus - minus) / (2 * EPS)
        assert abs(numeric - grad[i]) <= MAX_REL_ERROR * (abs(numeric) + abs(grad[i])) + atol, (
            i,
            numeric,
            grad[i],
        )


@pytest.mark.parametrize(("masked", "labels_mask"), [(False, False), (True, False), (True, True)])
def test_two_sequence_graph_gradient(masked: bool, labels_mask: bool) -> None:
    net = _two_sequence_graph()
    data = _two_sequence_data(np.random.default_rng(5), masked, labels_mask)
    assert np.any(net.compute_gradient_and_score(data)[0] != 0)
    _gradient_check(net, data)


def test_graph_masks_hide_the_padding() -> None:
    """Garbage in padded steps of either input changes no output, score or gradient with the masks; the
    recurrent output is zero at masked steps; without the masks the garbage changes them."""
    rng = np.random.default_rng(8)
    net = _two_sequence_graph()
    clean = _two_sequence_data(rng, masked=True)
    noisy = [
        np.where(m[:, None, :] > 0, x, 50 * rng.normal(size=x.shape))
        for x, m in zip(clean.features, clean.features_masks)
    ]
    dirty = MultiDataSet(noisy, clean.labels, features_masks=clean.features_masks)
    out_clean, out_dirty = net.output(clean), net.output(dirty)
    for c, d in zip(out_clean, out_dirty):
        np.testing.assert_allclose(d, c, rtol=1e-12, atol=1e-12)
    assert out_clean[0].shape == (N, 2, TA)
    assert np.all(out_clean[0][np.broadcast_to(clean.features_masks[0][:, None, :] == 0, (N, 2, TA))] == 0)
    np.testing.assert_allclose(net.score_examples(dirty), net.score_examples(clean), rtol=1e-12)
    g_clean, s_clean = net.compute_gradient_and_score(clean)
    g_dirty, s_dirty = net.compute_gradient_and_score(dirty)
    np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-10, atol=1e-12)
    assert s_dirty == pytest.approx(s_clean, rel=1e-12)
    # the per-step output's loss counts only the present steps (6 + 2 + 4), summed per sequence
    for index in (0, 1):
        ev = net.evaluate(clean, output_index=index)
        assert ev.confusion_matrix().sum() == (12 if index == 0 else N)
        assert net.evaluate(dirty, output_index=index).accuracy() == ev.accuracy()
    unmasked = net.output(*noisy)
    assert not np.allclose(unmasked[1], out_clean[1])
    assert not np.allclose(net.compute_gradient_and_score(MultiDataSet(noisy, clean.labels))[0], g_clean)


def test_graph_labels_mask_overrides_the_features_mask() -> None:
    rng = np.random.default_rng(9)
    net = _two_sequence_graph()
    data = _two_sequence_data(rng, masked=True, labels_mask=True)
    # per-example score of the per-step output: the sum of its labels-masked steps' losses
    seq_only = MultiDataSet(data.features, data.labels, features_masks=data.features_masks,
                            labels_masks=[data.labels_masks[0], np.zeros(N)])  # fmt: skip
    out = net.output(data)[0]
    lmask = data.labels_masks[0]
    present = np.where(lmask[:, None, :] > 0, out, 1.0)  # masked steps output 0: keep log finite
    per_step = -np.sum(data.labels[0] * np.log(present), axis=1) * lmask
    np.testing.assert_allclose(net.score_examples(seq_only), per_step.sum(axis=1), rtol=1e-10)
    assert net.evaluate(data, output_index=0).confusion_matrix().sum() == int(lmask.sum())


def _chain_layers():
    return [LSTM(5), DenseLayer(4, activation="relu"), Bidirectional(SimpleRnn(3)), RnnOutputLayer(2)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chain_graph_equals_multilayer_network_bit_for_bit(dtype: str) -> None:
    """Same layers, seed and data: identical parameters, outputs, scores and parameters after training."""
    layers = _chain_layers()
    mln = MultiLayerNetwork(
        MultiLayerConfiguration(
            layers, input_type=InputType.recurrent(3), seed=4, dtype=dtype, updater=Adam(1e-2), l2=1e-3
        )
    ).init()
    builder = (
        ComputationGraphConfiguration.builder(seed=4, dtype=dtype, updater=Adam(1e-2), l2=1e-3)
        .add_inputs("in")
        .set_input_types(InputType.recurrent(3))
    )
    previous = "in"
    for i, layer in enumerate(_chain_layers()):
        builder.add_layer(f"l{i}", layer, previous)
        previous = f"l{i}"
    graph = ComputationGraph(builder.set_outputs(previous).build()).init()
    np.testing.assert_array_equal(graph.params(), mln.params())
    rng = np.random.default_rng(2)
    batches = []
    for _ in range(4):
        mask = _mask(rng.integers(1, 8, 5), 7)
        x = rng.normal(size=(5, 3, 7)).astype(dtype)
        y = np.eye(2)[rng.integers(0, 2, (5, 7))].transpose(0, 2, 1).astype(dtype)
        batches.append(DataSet(x, y, features_mask=mask.astype(dtype)))
    np.testing.assert_array_equal(graph.output(batches[0])[0], mln.output(batches[0]))
    assert graph.score(batches[0]) == mln.score(batches[0])
    mln.fit(batches, epochs=2)
    graph.fit(batches, epochs=2)
    np.testing.assert_array_equal(graph.params(), mln.params())
    np.testing.assert_array_equal(graph.updater_state(), mln.updater_state())
    np.testing.assert_array_equal(graph.score_examples(batches[1]), mln.score_examples(batches[1]))


def test_recurrent_graph_configuration_errors_name_the_vertex() -> None:
    def build(*steps, types=None):
        types = types or (InputType.recurrent(3), InputType.recurrent(3, 5))
        b = ComputationGraphConfiguration.builder().add_inputs("a", "b").set_input_types(*types)
        for step in steps:
            step(b)
        return b.build()

    out = [lambda b: b.add_layer("o", RnnOutputLayer(2), "v").set_outputs("o")]
    with pytest.raises(ValueError, match=r"vertex 'v' \(StackVertex\): does not take recurrent input"):
        build(lambda b: b.add_vertex("v", StackVertex(), "a", "b"), *out)
    with pytest.raises(ValueError, match=r"vertex 'v' \(MergeVertex\): inputs must be all recurrent"):
        build(lambda b: b.add_vertex("v", MergeVertex(), "a", "b"), *out,
              types=(InputType.recurrent(3), InputType.feed_forward(3)))  # fmt: skip
    with pytest.raises(ValueError, match=r"vertex 'v' \(MergeVertex\): inputs have different time steps"):
        build(lambda b: b.add_vertex("v", MergeVertex(), "a", "b"), *out,
              types=(InputType.recurrent(3, 4), InputType.recurrent(3, 5)))  # fmt: skip
    with pytest.raises(ValueError, match=r"vertex 'o' \(RnnOutputLayer\)\.input: needs recurrent input"):
        build(lambda b: b.add_layer("v", LastTimeStep(LSTM(2)), "a", "b"), *out)
    conf = build(lambda b: b.add_vertex("v", MergeVertex(), "a", "b"), *out)
    assert conf.output_types["v"] == InputType.recurrent(6, 5)
    assert ComputationGraphConfiguration.from_json(conf.to_json()) == conf
    net = ComputationGraph(conf).init()
    x = np.zeros((2, 3, 5))
    with pytest.raises(
        ValueError, match=r"features_masks\[1\] \(input 'b'\): expected shape \(batch, time\)"
    ):
        net.output(x, x, features_masks=[None, np.ones((2, 4))])
    with pytest.raises(ValueError, match=r"features\[1\] \(input 'b'\): the input type has 5 time steps"):
        net.output(x, np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"labels\[0\] \(output 'o'\): expected a per-time-step array"):
        net.score(MultiDataSet([x, x], [np.zeros((2, 2))]))


def _time_series_vertex_graph(mask_input: str | None = "seq") -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(seed=6, dtype="float64")
        .add_inputs("seq", "ctx")
        .set_input_types(InputType.recurrent(3), InputType.feed_forward(2))
        .add_vertex("dup", DuplicateToTimeSeriesVertex("seq"), "ctx")
        .add_layer("lstm", LSTM(4), "seq", "dup")  # implicit per-step MergeVertex
        .add_layer("steps", RnnOutputLayer(2), "lstm")
        .add_vertex("last", LastTimeStepVertex(mask_input), "lstm")
        .add_layer("vec", OutputLayer(2), "last")
        .set_outputs("steps", "vec")
        .build()
    )
    return ComputationGraph(conf).init()


def _time_series_data(rng: np.random.Generator, masked: bool) -> MultiDataSet:
    fmasks = [_mask([6, 2, 4], TA), None] if masked else None
    labels = [np.eye(2)[rng.integers(0, 2, (N, TA))].transpose(0, 2, 1), np.eye(2)[rng.integers(0, 2, N)]]
    return MultiDataSet([rng.normal(size=(N, 3, TA)), rng.normal(size=(N, 2))], labels, features_masks=fmasks)


@pytest.mark.parametrize("masked", [False, True])
def test_time_series_vertices_gradient(masked: bool) -> None:
    net = _time_series_vertex_graph()
    assert net.conf.output_types["dup"] == InputType.recurrent(2)
    _gradient_check(net, _time_series_data(np.random.default_rng(12), masked))


@pytest.mark.parametrize("mask_input", ["seq", None])
def test_time_series_vertices_match_the_layers(mask_input: str | None) -> None:
    """DuplicateToTimeSeriesVertex equals feeding the context at every step; LastTimeStepVertex equals
    the last present step of the per-step output (the LastTimeStep layer's rule)."""
    rng = np.random.default_rng(13)
    net = _time_series_vertex_graph(mask_input)
    data = _time_series_data(rng, masked=True)
    steps, vec = net.output(data)
    seq, ctx = data.features
    mask = data.features_masks[0]
    repeated = np.concatenate([seq, np.repeat(ctx[:, :, None], TA, axis=2)], axis=1)
    conf = MultiLayerConfiguration(
        [LSTM(4), RnnOutputLayer(2)], input_type=InputType.recurrent(5), dtype="float64"
    )
    mln = MultiLayerNetwork(conf).init(net.params()[: 5 * 16 + 4 * 16 + 16 + 4 * 2 + 2])
    np.testing.assert_allclose(steps, mln.output(repeated, features_mask=mask), rtol=1e-12)
    last = np.array([5, 1, 3])
    lstm_out = net._by_name["lstm"].runtime.hs  # (N, T, 4): the LSTM's activations of this forward
    w, b = net.params()[-10:-2].reshape(4, 2), net.params()[-2:]
    logits = lstm_out[np.arange(N), last] @ w + b
    want = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(vec, want, rtol=1e-12)


def test_graph_rnn_time_step_matches_the_whole_sequence() -> None:
    conf = (
        ComputationGraphConfiguration.builder(seed=8, dtype="float64")
        .add_inputs("a", "b")
        .set_input_types(InputType.recurrent(3), InputType.recurrent(2))
        .add_layer("la", LSTM(4), "a")
        .add_layer("lb", SimpleRnn(3, activation="tanh"), "b")
        .add_layer("out", RnnOutputLayer(2), "la", "lb")
        .add_layer("last", LastTimeStep(LSTM(2)), "la")
        .add_layer("vec", OutputLayer(2), "last")
        .set_outputs("out", "vec")
        .build()
    )
    net = ComputationGraph(conf).init()
    rng = np.random.default_rng(14)
    a, b = rng.normal(size=(N, 3, TA)), rng.normal(size=(N, 2, TA))
    whole = net.output(a, b)
    steps = [net.rnn_time_step(a[:, :, t], b[:, :, t]) for t in range(TA)]
    np.testing.assert_allclose(np.stack([s[0] for s in steps], axis=2), whole[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(steps[-1][1], whole[1], rtol=1e-12)  # the last step's vector output
    net.rnn_clear_previous_state()
    first = net.rnn_time_step(a[:, :, :2], b[:, :, :2])
    rest = net.rnn_time_step(a[:, :, 2:], b[:, :, 2:])
    np.testing.assert_allclose(np.concatenate([first[0], rest[0]], axis=2), whole[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="rnn_clear_previous_state"):
        net.rnn_time_step(a[:1, :, 0], b[:1, :, 0])
