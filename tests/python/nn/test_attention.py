"""LayerNormalization, SelfAttentionLayer, LearnedSelfAttentionLayer and PositionEmbeddingLayer in
networks: the outputs against the NumPy references on the parameter views, float64 gradient checks with
and without masks, masks that change the answer and padding they hide, configuration round trips and
errors, the same training for 1 and 2 threads, and a small transformer encoder (ComputationGraph) that
learns an order-dependent sequence task over several seeds."""

from __future__ import annotations

import numpy as np
import pytest
from reference import nn as ref

import sparkgrad
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    ElementWiseVertex,
    EmbeddingSequenceLayer,
    GlobalPoolingLayer,
    InputType,
    LayerNormalization,
    LearnedSelfAttentionLayer,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    PositionEmbeddingLayer,
    RnnOutputLayer,
    SelfAttentionLayer,
)
from sparkgrad.nn.updaters import Adam

EPS = 1e-6
MAX_REL_ERROR = 1e-5
N, SIZE, T = 3, 3, 5


def _net(layers, input_type=None, seed=7, **kw) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        layers, input_type=input_type or InputType.recurrent(SIZE), seed=seed, dtype="float64", **kw
    )
    return MultiLayerNetwork(conf).init()


def _lengths_mask(lengths, t=T) -> np.ndarray:
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


def _gradient_check(net, ds) -> None:
    """Analytic vs central-difference gradient of the score for every parameter; differences below the
    round-off of two scores of ``terms`` float64 values (over 2 EPS) are compared in absolute terms."""
    grad, score = net.compute_gradient_and_score(ds)
    terms = np.asarray(ds.labels).size
    atol = terms * np.finfo(np.float64).eps * max(1.0, abs(score)) / EPS
    params = net.params()
    assert np.any(grad != 0)
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


def _seq_labels(rng) -> np.ndarray:
    return np.eye(2)[rng.integers(0, 2, (N, T))].transpose(0, 2, 1)


# per-step output (labels (N, 2, T)) or one output per sequence (labels (N, 2))
SEQUENCE_LAYERS = {
    "layer_norm": lambda: [DenseLayer(4, activation="tanh"), LayerNormalization(), RnnOutputLayer(2)],
    "layer_norm_no_bias": lambda: [LayerNormalization(has_bias=False, eps=1e-3), RnnOutputLayer(2)],
    "self_attention": lambda: [SelfAttentionLayer(4, n_heads=2), RnnOutputLayer(2)],
    "self_attention_head_size": lambda: [SelfAttentionLayer(3, n_heads=3, head_size=2), RnnOutputLayer(2)],
    "self_attention_unprojected": lambda: [
        DenseLayer(3, activation="tanh"),
        SelfAttentionLayer(3, project_input=False),
        RnnOutputLayer(2),
    ],
    "position_attention_norm": lambda: [
        PositionEmbeddingLayer(T + 2),
        SelfAttentionLayer(4, n_heads=2),
        LayerNormalization(),
        RnnOutputLayer(2),
    ],
}
VECTOR_LAYERS = {
    "learned_self_attention": lambda: [
        LearnedSelfAttentionLayer(4, n_queries=2, n_heads=2),
        GlobalPoolingLayer("avg"),
        OutputLayer(2),
    ],
    "learned_self_attention_unprojected": lambda: [
        LearnedSelfAttentionLayer(3, n_queries=3, project_input=False),
        GlobalPoolingLayer("max"),
        OutputLayer(2),
    ],
    "self_attention_pooled": lambda: [
        SelfAttentionLayer(4, n_heads=2, head_size=3),
        GlobalPoolingLayer("avg"),
        OutputLayer(2),
    ],
}


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", sorted(SEQUENCE_LAYERS))
def test_sequence_gradient(name: str, masked: bool) -> None:
    rng = np.random.default_rng(3)
    mask = _lengths_mask([5, 2, 4]) if masked else None
    ds = DataSet(rng.normal(size=(N, SIZE, T)), _seq_labels(rng), features_mask=mask)
    _gradient_check(_net(SEQUENCE_LAYERS[name]()), ds)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", sorted(VECTOR_LAYERS))
def test_vector_gradient(name: str, masked: bool) -> None:
    rng = np.random.default_rng(4)
    mask = _lengths_mask([5, 2, 4]) if masked else None
    ds = DataSet(rng.normal(size=(N, SIZE, T)), np.eye(2)[[0, 1, 1]], features_mask=mask)
    _gradient_check(_net(VECTOR_LAYERS[name]()), ds)


def test_layer_norm_gradient_on_dense_input() -> None:
    rng = np.random.default_rng(5)
    layers = [
        DenseLayer(5, activation="tanh"),
        LayerNormalization(),
        DenseLayer(3, activation="tanh"),
        OutputLayer(2),
    ]
    ds = DataSet(rng.normal(size=(4, 6)), np.eye(2)[[0, 1, 1, 0]])
    _gradient_check(_net(layers, InputType.feed_forward(6)), ds)


# ---- the layers compute their references on the parameter views ---------------------------------


def _identity_out(layer, n_out: int):
    """A network of ``layer`` and an identity RnnOutputLayer with identity weights, so that its output is
    the layer's output; returns it and the layer's parameter views by name."""
    net = _net([layer, RnnOutputLayer(n_out, activation="identity", loss="mse")])
    flat = net.params()  # a view of the flat buffer

    def views(unit: int) -> dict:
        return {spec.name: flat[start:stop].reshape(spec.shape) for spec, start, stop in net._layouts[unit]}

    out = views(1)
    out["W"][...] = np.eye(*out["W"].shape)
    out["b"][...] = 0
    return net, views(0)


def test_outputs_match_the_references() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(N, SIZE, T))
    mask = _lengths_mask([5, 2, 4])
    xt = x.transpose(0, 2, 1)

    net, p = _identity_out(LayerNormalization(eps=1e-3), SIZE)
    p["gain"][...], p["b"][...] = rng.normal(size=SIZE), rng.normal(size=SIZE)
    want = ref.layer_norm_forward(xt.reshape(-1, SIZE), p["gain"], p["b"], 1e-3)[0].reshape(N, T, SIZE)
    np.testing.assert_allclose(net.output(x), want.transpose(0, 2, 1), rtol=1e-12, atol=1e-12)

    net, p = _identity_out(SelfAttentionLayer(4, n_heads=2, head_size=3), 4)
    assert p["Wq"].shape == (2, 3, SIZE) and p["Wo"].shape == (6, 4)
    want = ref.self_attention_layer(xt, p["Wq"], p["Wk"], p["Wv"], p["Wo"], mask)
    got = net.output(DataSet(x, features_mask=mask))
    np.testing.assert_allclose(got, want.transpose(0, 2, 1), rtol=1e-12, atol=1e-12)

    net, p = _identity_out(SelfAttentionLayer(SIZE, project_input=False), SIZE)
    want = ref.self_attention_layer(xt, None, None, None, None, mask)
    np.testing.assert_allclose(
        net.output(DataSet(x, features_mask=mask)), want.transpose(0, 2, 1), atol=1e-12
    )

    net, p = _identity_out(LearnedSelfAttentionLayer(4, n_queries=2, n_heads=2), 4)
    assert p["Q"].shape == (SIZE, 2)
    want = ref.learned_self_attention_layer(xt, p["Q"], p["Wq"], p["Wk"], p["Wv"], p["Wo"], mask)
    got = net.output(DataSet(x, features_mask=mask))
    assert got.shape == (N, 4, 2)
    np.testing.assert_allclose(got, want.transpose(0, 2, 1), rtol=1e-12, atol=1e-12)

    net, p = _identity_out(PositionEmbeddingLayer(7), SIZE)
    assert p["W"].shape == (SIZE, 7)
    got = net.output(DataSet(x, features_mask=mask))
    np.testing.assert_allclose(got, (x + p["W"][None, :, :T]) * mask[:, None, :], rtol=1e-12, atol=1e-12)
    assert net.output(x[:, :, :3]).shape == (N, SIZE, 3)  # shorter sequences use the first columns


# ---- masks change the answer, and hide the padding --------------------------------------------------

MASKED_NETWORKS = {
    "self_attention": lambda: [SelfAttentionLayer(4, n_heads=2), LayerNormalization(), RnnOutputLayer(2)],
    "learned": lambda: [
        PositionEmbeddingLayer(T),
        LearnedSelfAttentionLayer(4, n_queries=2, n_heads=2),
        GlobalPoolingLayer("avg"),
        RnnOutputLayer(2),
    ],
}


@pytest.mark.parametrize("name", sorted(MASKED_NETWORKS))
def test_padding_is_invisible_with_a_mask_and_visible_without(name: str) -> None:
    rng = np.random.default_rng(11)
    mask = _lengths_mask([5, 2, 4])
    x = rng.normal(size=(N, SIZE, T))
    noisy = np.where(mask[:, None, :] > 0, x, 50 * rng.normal(size=x.shape))
    layers = MASKED_NETWORKS[name]()
    if name == "learned":
        layers[-1] = OutputLayer(2)
        labels = np.eye(2)[[0, 1, 1]]
    else:
        labels = _seq_labels(rng)
    net = _net(layers)
    clean, dirty = DataSet(x, labels, features_mask=mask), DataSet(noisy, labels, features_mask=mask)
    out = net.output(clean)
    np.testing.assert_allclose(net.output(dirty), out, rtol=1e-12, atol=1e-12)
    if name == "self_attention":
        assert np.all(out[np.broadcast_to(mask[:, None, :] == 0, out.shape)] == 0)  # masked queries output 0
    g_clean, s_clean = net.compute_gradient_and_score(clean)
    g_dirty, s_dirty = net.compute_gradient_and_score(dirty)
    np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-10, atol=1e-12)
    assert s_dirty == pytest.approx(s_clean, rel=1e-12)
    # without the mask the padding counts: other outputs and gradients
    assert not np.allclose(net.output(noisy), out)
    assert not np.allclose(net.compute_gradient_and_score(DataSet(noisy, labels))[0], g_clean)
    # and the mask changes the answer on the same (unpadded) features
    assert not np.allclose(net.output(x), out)


# ---- configuration ---------------------------------------------------------------------------------


def _encoder_conf(
    seed: int = 1, vocab: int = 6, t: int = 8, width: int = 16
) -> ComputationGraphConfiguration:
    """A small transformer encoder: token embeddings + positions -> self attention -> residual add ->
    layer norm -> feed-forward -> residual add -> layer norm -> average over the present steps -> output."""
    return (
        ComputationGraphConfiguration.builder(seed=seed, updater=Adam(1e-2))
        .add_inputs("tokens")
        .set_input_types(InputType.recurrent(1, t))
        .add_layer("embed", EmbeddingSequenceLayer(vocab, width), "tokens")
        .add_layer("pos", PositionEmbeddingLayer(t), "embed")
        .add_layer("attention", SelfAttentionLayer(width, n_heads=2), "pos")
        .add_vertex("residual", ElementWiseVertex("add"), "pos", "attention")
        .add_layer("norm", LayerNormalization(), "residual")
        .add_layer("ff", DenseLayer(width, activation="relu"), "norm")
        .add_vertex("residual_ff", ElementWiseVertex("add"), "norm", "ff")
        .add_layer("norm_ff", LayerNormalization(), "residual_ff")
        .add_layer("pool", GlobalPoolingLayer("avg"), "norm_ff")
        .add_layer("out", OutputLayer(2), "pool")
        .set_outputs("out")
        .build()
    )


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_configurations_round_trip(fmt: str) -> None:
    layers = [
        PositionEmbeddingLayer(9, l2=1e-3),
        SelfAttentionLayer(6, n_heads=3, head_size=4, weight_init="xavier_uniform"),
        LayerNormalization(eps=1e-3, has_bias=False),
        LearnedSelfAttentionLayer(4, n_queries=2, project_input=True, n_heads=2),
        GlobalPoolingLayer("avg"),
        OutputLayer(2),
    ]
    conf = MultiLayerConfiguration(layers, input_type=InputType.recurrent(5))
    text = conf.to_json() if fmt == "json" else conf.to_yaml()
    back = (
        MultiLayerConfiguration.from_json(text) if fmt == "json" else MultiLayerConfiguration.from_yaml(text)
    )
    assert back == conf
    assert back.layers[1].head_size == 4 and back.layers[3].n_queries == 2 and back.layers[2].eps == 1e-3
    graph = _encoder_conf()
    graph_text = graph.to_json() if fmt == "json" else graph.to_yaml()
    loader = (
        ComputationGraphConfiguration.from_json if fmt == "json" else ComputationGraphConfiguration.from_yaml
    )
    assert loader(graph_text) == graph


def test_configuration_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"n_heads: project_input=False needs n_heads 1"):
        SelfAttentionLayer(4, n_heads=2, project_input=False)
    with pytest.raises(ValueError, match=r"head_size: n_out \(5\) is not a multiple of n_heads \(2\)"):
        SelfAttentionLayer(5, n_heads=2)
    with pytest.raises(ValueError, match=r"n_queries: "):
        LearnedSelfAttentionLayer(4, n_queries=0)
    with pytest.raises(ValueError, match=r"eps: "):
        LayerNormalization(eps=0.0)
    with pytest.raises(ValueError, match=r"sequence_length: "):
        PositionEmbeddingLayer(0)
    with pytest.raises(
        ValueError,
        match=r"layers\[0\] \(SelfAttentionLayer\)\.n_out: project_input=False needs n_out == n_in \(3\)",
    ):
        _net([SelfAttentionLayer(4, project_input=False), RnnOutputLayer(2)])
    with pytest.raises(ValueError, match=r"layers\[0\] \(SelfAttentionLayer\)\.input: needs recurrent input"):
        _net([SelfAttentionLayer(4), OutputLayer(2)], InputType.feed_forward(3))
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(LayerNormalization\)\.input: needs dense or recurrent input"
    ):
        _net([LayerNormalization(), OutputLayer(2)], InputType.convolutional(4, 4, 2))
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(PositionEmbeddingLayer\)\.sequence_length: is 4 but the input has 5"
    ):
        _net([PositionEmbeddingLayer(4), RnnOutputLayer(2)], InputType.recurrent(SIZE, T))
    net = _net([PositionEmbeddingLayer(4), RnnOutputLayer(2)])
    with pytest.raises(
        ValueError, match=r"features: 5 time steps, but PositionEmbeddingLayer.sequence_length is 4"
    ):
        net.output(np.zeros((1, SIZE, T)))
    net = _net([SelfAttentionLayer(4, n_heads=2), RnnOutputLayer(2)])
    with pytest.raises(ValueError, match=r"SelfAttentionLayer needs the whole sequence"):
        net.rnn_time_step(np.zeros((1, SIZE)))
    with pytest.raises(ValueError, match=r"truncated_bptt .* changes the number of steps"):
        MultiLayerConfiguration(
            [LearnedSelfAttentionLayer(4, n_queries=2), RnnOutputLayer(2)],
            input_type=InputType.recurrent(SIZE),
            backprop_type="truncated_bptt",
        )


# ---- threads and the encoder ----------------------------------------------------------------------


def _order_task(rng, n: int, t: int = 8, vocab: int = 6):
    """Sequences of tokens 1..vocab-1 of lengths 4..t padded with 0; the label says whether token 1 comes
    before token 2 (both occur once): the same bag of tokens has either label, so only attention with
    positions can tell."""
    x = np.zeros((n, 1, t), np.int64)
    mask = np.zeros((n, t))
    labels = np.zeros(n, np.int64)
    for i in range(n):
        length = int(rng.integers(4, t + 1))
        seq = rng.integers(3, vocab, length)
        a, b = rng.choice(length, 2, replace=False)
        seq[a], seq[b] = 1, 2
        x[i, 0, :length] = seq
        mask[i, :length] = 1
        labels[i] = int(a < b)
    return DataSet(x, np.eye(2)[labels], features_mask=mask)


def test_training_is_the_same_for_one_and_two_threads() -> None:
    rng = np.random.default_rng(8)
    batches = [_order_task(rng, 32) for _ in range(3)]
    before = sparkgrad.get_num_threads()
    params = []
    try:
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            net = ComputationGraph(_encoder_conf(seed=3)).init()
            net.fit(batches)
            params.append(net.params().copy())
    finally:
        sparkgrad.set_num_threads(before)
    np.testing.assert_array_equal(params[0], params[1])


def test_a_small_transformer_encoder_learns_an_order_task() -> None:
    """The encoder graph reaches >= 0.9 test accuracy on the order task for each of 3 seeds within 40
    epochs of 512 examples (measured on seeds 0-9: 5-11 epochs each). Chance is 0.5, and without the
    position embedding the graph could not beat it: attention and average pooling do not see the order."""
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        train = _order_task(rng, 512)
        test = _order_task(rng, 256)
        net = ComputationGraph(_encoder_conf(seed=seed)).init()
        accuracy = 0.0
        for _ in range(40):
            net.fit(train.split(32))
            accuracy = net.evaluate(test).accuracy()
            if accuracy >= 0.9:
                break
        assert accuracy >= 0.9, (seed, accuracy)
