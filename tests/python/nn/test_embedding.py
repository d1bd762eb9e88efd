"""EmbeddingLayer and EmbeddingSequenceLayer: float64 gradient checks, DL4J semantics (lookup, masks,
bias), configuration round trips and errors, and the row-sparse training step (same parameters as the
dense step, only the touched rows written)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import nn as ref

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.nn import (
    LSTM,
    ComputationGraph,
    DenseLayer,
    EmbeddingLayer,
    EmbeddingSequenceLayer,
    GlobalPoolingLayer,
    GraphBuilder,
    InputType,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
)
from sparkgrad.nn.updaters import Adam, NoOp, Sgd

VOCAB, DIM, T = 7, 3, 5


def _net(layers, input_type=None, **kw) -> MultiLayerNetwork:
    kw.setdefault("seed", 3)
    return MultiLayerNetwork(MultiLayerConfiguration(layers, input_type=input_type, **kw)).init()


def _assert_gradient(net: MultiLayerNetwork, ds: DataSet) -> None:
    """Every parameter's analytic gradient against central differences of the float64 score."""
    grad, _ = net.compute_gradient_and_score(ds)
    numeric = ref.numerical_gradient(lambda _: net.compute_gradient_and_score(ds)[1], net.params(), h=1e-6)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    assert np.count_nonzero(grad) > 0


def _sequences(rng, n=4, lengths=(5, 3, 1, 4)):
    x = rng.integers(0, VOCAB, (n, 1, T))
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.float64)
    x[:, 0, :] *= mask.astype(np.int64)  # padding index 0, as DL4J users pad
    return x, mask


@pytest.mark.parametrize("has_bias", [False, True])
def test_embedding_layer_gradient_check(has_bias):
    rng = np.random.default_rng(1)
    net = _net(
        [EmbeddingLayer(VOCAB, DIM, activation="tanh", has_bias=has_bias), OutputLayer(3)], dtype="float64"
    )
    x = np.array([[0], [4], [4], [6], [2], [4]])  # repeats: their gradients add up in one row
    _assert_gradient(net, DataSet(x, np.eye(3)[rng.integers(0, 3, 6)]))


@pytest.mark.parametrize("has_bias", [False, True])
def test_embedding_sequence_layer_gradient_check_with_mask(has_bias):
    rng = np.random.default_rng(2)
    layers = [
        EmbeddingSequenceLayer(VOCAB, DIM, activation="sigmoid", has_bias=has_bias),
        LSTM(4),
        RnnOutputLayer(2),
    ]
    net = _net(layers, InputType.recurrent(1), dtype="float64")
    x, mask = _sequences(rng)
    labels = np.eye(2)[rng.integers(0, 2, (4, T))].transpose(0, 2, 1)
    _assert_gradient(net, DataSet(x, labels, features_mask=mask))


def test_embedding_layer_is_a_dense_layer_on_one_hot_input():
    x = np.array([[3], [0], [3], [6]])
    emb = _net(
        [EmbeddingLayer(VOCAB, DIM, has_bias=True, activation="relu"), OutputLayer(2)], dtype="float64"
    )
    dense = _net([DenseLayer(DIM, n_in=VOCAB, activation="relu"), OutputLayer(2)], dtype="float64")
    dense.set_params(emb.params())  # the same layout: W (n_in, n_out), b, then the output layer
    np.testing.assert_allclose(emb.output(x), dense.output(np.eye(VOCAB)[x[:, 0]]), rtol=1e-12)
    labels = np.eye(2)[[0, 1, 1, 0]]
    g_emb, _ = emb.compute_gradient_and_score(DataSet(x, labels))
    g_dense, _ = dense.compute_gradient_and_score(DataSet(np.eye(VOCAB)[x[:, 0]], labels))
    np.testing.assert_allclose(g_emb, g_dense, rtol=1e-12, atol=1e-15)


def test_sequence_output_is_ncw_lookup_and_masked_steps_are_zero():
    rng = np.random.default_rng(4)
    net = _net(
        [EmbeddingSequenceLayer(VOCAB, DIM, activation="identity"), RnnOutputLayer(2)], InputType.recurrent(1)
    )
    x, mask = _sequences(rng)
    w = net.params()[: VOCAB * DIM].reshape(VOCAB, DIM)
    net._forward(
        net._features(x), train=False, activate_output=True, mask=net._features_mask(mask, net._features(x))
    )
    # the layer's output as the next layer saw it: (N, T, DIM), DL4J's (N, DIM, T) transposed
    seen = net._runtimes[0].y.reshape(4, T, DIM)
    np.testing.assert_array_equal(seen, w[x[:, 0, :]])
    out = net.output(x, features_mask=mask)
    assert out.shape == (4, 2, T)


def test_masked_steps_send_no_gradient_to_their_rows():
    rng = np.random.default_rng(5)
    net = _net(
        [EmbeddingSequenceLayer(VOCAB, DIM), RnnOutputLayer(2)], InputType.recurrent(1), dtype="float64"
    )
    x = np.full((2, 1, T), 1)
    x[0, 0, 3:] = 5  # row 5 appears only at masked steps
    mask = np.ones((2, T))
    mask[0, 3:] = 0
    labels = np.eye(2)[rng.integers(0, 2, (2, T))].transpose(0, 2, 1)
    grad, _ = net.compute_gradient_and_score(DataSet(x, labels, features_mask=mask))
    table = grad[: VOCAB * DIM].reshape(VOCAB, DIM)
    assert np.count_nonzero(table[1]) == DIM
    assert not table[[0, 2, 3, 4, 5, 6]].any()


def test_integer_features_stay_exact_beyond_float32():
    # index 2**24 + 1 is not a float32: an int64 input reaches the kernel unchanged
    vocab = 2**24 + 2
    conf = MultiLayerConfiguration(
        [EmbeddingLayer(vocab, 1, activation="identity"), OutputLayer(1, activation="identity", loss="mse")],
        seed=1,
    )
    net = MultiLayerNetwork(conf).init()
    table = net.params()[:vocab]
    table[-2:] = [5.0, 7.0]
    net.params()[vocab] = 1.0  # the output layer's weight
    np.testing.assert_array_equal(net.output(np.array([[vocab - 1], [vocab - 2]]))[:, 0], [7.0, 5.0])


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (
            np.array([[1], [7]]),
            r"layers\[0\] \(EmbeddingLayer\)\.input: index 7 at position 1 is outside \[0, 7\)",
        ),
        (np.array([[-2]]), r"index -2 at position 0 is outside \[0, 7\)"),
        (
            np.array([[1.0], [2.5]]),
            r"layers\[0\] \(EmbeddingLayer\)\.input: index 2\.5 at position 1 is not an integer",
        ),
        (np.array([[np.nan]]), r"index nan at position 0 is not an integer"),
    ],
)
def test_bad_index_names_layer_index_and_position(features, message):
    net = _net([EmbeddingLayer(VOCAB, DIM), OutputLayer(2)])
    with pytest.raises(ValueError, match=message):
        net.output(features)
    with pytest.raises(ValueError, match=message):
        net.fit(features, np.eye(2)[np.zeros(len(features), dtype=int)])


def test_bad_index_in_a_graph_names_the_vertex():
    conf = (
        GraphBuilder(seed=1)
        .add_inputs("words")
        .set_input_types(InputType.feed_forward(1))
        .add_layer("emb", EmbeddingLayer(VOCAB, DIM), "words")
        .add_layer("out", OutputLayer(2), "emb")
        .set_outputs("out")
        .build()
    )
    graph = ComputationGraph(conf).init()
    assert graph.output(np.array([[2], [3]]))[0].shape == (2, 2)
    with pytest.raises(ValueError, match=r"vertex 'emb' \(EmbeddingLayer\)\.input: index 9 at position 0"):
        graph.output(np.array([[9]]))


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_configuration_round_trip(fmt):
    layers = [
        EmbeddingSequenceLayer(
            1000, 16, has_bias=True, weight_init="uniform", activation="tanh", l2=1e-4, lazy_updates=True
        ),
        GlobalPoolingLayer("avg"),
        OutputLayer(3),
    ]
    conf = MultiLayerConfiguration(layers, input_type=InputType.recurrent(1), updater=Sgd(0.5))
    back = getattr(MultiLayerConfiguration, f"from_{fmt}")(getattr(conf, f"to_{fmt}")())
    assert back == conf
    assert isinstance(back.layers[0], EmbeddingSequenceLayer) and back.layers[0].has_bias
    assert back.layers[0].lazy_updates
    conf = MultiLayerConfiguration([EmbeddingLayer(50, 4), OutputLayer(2)])
    assert MultiLayerConfiguration.from_json(conf.to_json()) == conf
    assert conf.layer_input_types[0] == InputType.feed_forward(1)  # no input type needed


def test_parameters_and_weight_init():
    net = _net([EmbeddingLayer(100, 8, weight_init="xavier"), OutputLayer(2)], seed=9)
    assert net.num_params() == 100 * 8 + 8 * 2 + 2  # no bias by default (DL4J)
    table = net.params()[:800]
    assert abs(table.std() - np.sqrt(2.0 / (100 + 8))) < 0.2 * np.sqrt(2.0 / (100 + 8))  # fan-in n_in
    with_bias = _net([EmbeddingLayer(100, 8, has_bias=True), OutputLayer(2)])
    assert with_bias.num_params() == 100 * 8 + 8 + 8 * 2 + 2


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EmbeddingLayer(0, 3), "n_in"),
        (lambda: EmbeddingLayer(5, 0), "n_out"),
        (lambda: EmbeddingLayer(5, 3, has_bias=1), "has_bias"),
        (lambda: EmbeddingSequenceLayer(5, 3, lazy_updates="yes"), "lazy_updates: expected a bool"),
        (
            lambda: MultiLayerConfiguration([DenseLayer(4, n_in=2), EmbeddingLayer(5, 3), OutputLayer(2)]),
            r"layers\[1\] \(EmbeddingLayer\)\.position: .* must be first",
        ),
        (
            lambda: MultiLayerConfiguration(
                [EmbeddingLayer(5, 3), OutputLayer(2)], input_type=InputType.feed_forward(2)
            ),
            r"layers\[0\] \(EmbeddingLayer\)\.input: needs one index per example",
        ),
        (
            lambda: MultiLayerConfiguration([EmbeddingSequenceLayer(5, 3), RnnOutputLayer(2)]),
            r"needs input_type=InputType\.recurrent\(1\)",
        ),
        (
            lambda: MultiLayerConfiguration(
                [EmbeddingSequenceLayer(5, 3), RnnOutputLayer(2)], input_type=InputType.recurrent(3)
            ),
            r"layers\[0\] \(EmbeddingSequenceLayer\)\.input: needs a sequence of indices",
        ),
    ],
)
def test_configuration_errors_name_the_field(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# -- the row-sparse step --------------------------------------------------------------------------------
def _flat_data(rng, vocab, n_batches=6, batch=8):
    return [
        DataSet(rng.integers(0, vocab, (batch, 1)), np.eye(3)[rng.integers(0, 3, batch)])
        for _ in range(n_batches)
    ]


def _dense_twin(net: MultiLayerNetwork) -> MultiLayerNetwork:
    """The same network with the row-sparse step planned away: every step dense."""
    net._sparse_tables = []
    net._dense_ranges = [slice(0, net.num_params())]
    for block in net._blocks:
        block.tables, block.dense = [], [slice(block.start, block.stop)]
    return net


def _sparse_layers(updater=None, l2=None):
    return [EmbeddingLayer(40, 4, has_bias=True, updater=updater, l2=l2), DenseLayer(5), OutputLayer(3)]


@pytest.mark.parametrize(
    ("updater", "l2", "sparse"),
    [(Sgd(0.3), None, True), (NoOp(), None, True), (Adam(0.01), None, False), (Sgd(0.3), 0.01, False)],
)
def test_row_sparse_step_trains_exactly_as_the_dense_step(updater, l2, sparse):
    data = _flat_data(np.random.default_rng(6), 40)
    net = _net(_sparse_layers(updater, l2), updater=Adam(0.05))  # the other layers: a stateful updater
    assert bool(net._sparse_tables) is sparse
    dense = _dense_twin(_net(_sparse_layers(updater, l2), updater=Adam(0.05)))
    net.fit(data, epochs=2)
    dense.fit(data, epochs=2)
    np.testing.assert_array_equal(net.params(), dense.params())
    np.testing.assert_array_equal(net.updater_state(), dense.updater_state())
    assert net.score() == dense.score()


def test_row_sparse_step_writes_only_the_touched_rows():
    rng = np.random.default_rng(7)
    net = _net(_sparse_layers(), updater=Sgd(0.5))
    net.fit(_flat_data(rng, 40, n_batches=1))  # the first step zeroes the whole table gradient once
    before = net.params().copy()
    x = np.array([[3], [17], [3]])
    net.fit(DataSet(x, np.eye(3)[[0, 1, 2]]))
    changed = np.flatnonzero((net.params() != before)[: 40 * 4].reshape(40, 4).any(axis=1))
    np.testing.assert_array_equal(changed, [3, 17])
    grad = net._grad[: 40 * 4].reshape(40, 4)
    assert not np.delete(grad, [3, 17], axis=0).any()  # the gradient buffer stays zero elsewhere


def test_compute_update_is_the_whole_update_after_row_sparse_steps():
    # compute_update (the Spark workers' step) returns the flat update: zero outside the touched rows
    rng = np.random.default_rng(8)
    net = _net(_sparse_layers(), updater=Sgd(0.5))
    dense = _dense_twin(_net(_sparse_layers(), updater=Sgd(0.5)))
    for ds in _flat_data(rng, 40, n_batches=3):
        update, _ = net.compute_update(ds)
        expected, _ = dense.compute_update(ds)
        np.testing.assert_array_equal(update, expected)
        net.apply_update(update)
        dense.apply_update(expected)


@pytest.mark.parametrize("scale", [1.0, 1 / np.sqrt(3)])
def test_a_shared_step_on_the_networks_own_update_buffer_applies_only_the_touched_rows(scale):
    # gradient sharing reads the update in place (compute_update(copy=False)) and applies it, scaled by
    # the update combination's factor: the same parameters as the dense twin's applying update * scale,
    # and the rows the batch did not look up are never read (NaN put there would reach the parameters
    # through a dense subtraction)
    rng = np.random.default_rng(9)
    net = _net(_sparse_layers(), updater=Sgd(0.5))
    dense = _dense_twin(_net(_sparse_layers(), updater=Sgd(0.5)))
    for ds in _flat_data(rng, 40, n_batches=4):
        update, _ = net.compute_update(ds, copy=False)
        assert update is net._grad
        expected, _ = dense.compute_update(ds)
        untouched = np.setdiff1d(np.arange(40), ds.features[:, 0])
        table = update[: 40 * 4].reshape(40, 4)
        table[untouched] = np.nan  # what the step wrote is all it may subtract
        net.apply_update(update, scale=scale)
        table[untouched] = 0.0
        dense.apply_update(expected * expected.dtype.type(scale))
        np.testing.assert_array_equal(net.params(), dense.params())


def test_apply_update_scale_on_a_dense_update_is_update_times_scale():
    rng = np.random.default_rng(10)
    net, twin = _net(_sparse_layers(), updater=Sgd(0.5)), _net(_sparse_layers(), updater=Sgd(0.5))
    update = rng.normal(size=net.num_params()).astype(net.params().dtype)
    net.apply_update(update, scale=0.3)
    twin.apply_update(update * update.dtype.type(0.3))
    np.testing.assert_array_equal(net.params(), twin.params())
    assert not np.array_equal(net.params(), _net(_sparse_layers(), updater=Sgd(0.5)).params())


def test_graph_index_inputs_stay_integers_and_only_embeddings_read_them():
    def graph(extra_reader: bool):
        builder = (
            GraphBuilder(seed=1)
            .add_inputs("words")
            .set_input_types(InputType.feed_forward(1))
            .add_layer("emb", EmbeddingLayer(2**24 + 2, 1, activation="identity"), "words")
        )
        if extra_reader:
            builder = builder.add_layer("dense", DenseLayer(2), "words")
        return builder.add_layer("out", OutputLayer(1, activation="identity", loss="mse"), "emb").set_outputs(
            "out"
        )

    net = ComputationGraph(graph(False).build()).init()
    net.params()[2**24 : 2**24 + 3] = [5.0, 7.0, 1.0]  # the last two rows, then the output weight
    out = net.output(np.array([[2**24 + 1], [2**24]]))[0]
    np.testing.assert_array_equal(out[:, 0], [7.0, 5.0])
    with pytest.raises(
        ValueError, match=r"vertex 'emb' \(EmbeddingLayer\)\.inputs: input 'words' holds indices"
    ):
        graph(True).build()
    with pytest.raises(
        ValueError, match=r"vertex 'emb2' \(EmbeddingLayer\)\.inputs: an embedding layer reads a graph input"
    ):
        (
            GraphBuilder()
            .add_inputs("words")
            .set_input_types(InputType.feed_forward(1))
            .add_layer("emb", EmbeddingLayer(5, 1), "words")
            .add_layer("emb2", EmbeddingLayer(5, 1), "emb")
            .add_layer("out", OutputLayer(1), "emb2")
            .set_outputs("out")
            .build()
        )


def test_lazy_updates_step_only_the_looked_up_rows_of_a_stateful_updater():
    # Two steps of Adam: rows looked up in both, or only in the second, have the same gradient history
    # under lazy and dense (DL4J) updates, so they match bitwise; rows looked up only in the first are
    # moved again by the dense step (their moments) but frozen by the lazy one.
    def net(lazy: bool) -> MultiLayerNetwork:
        layers = [EmbeddingLayer(40, 4, has_bias=True, lazy_updates=lazy), DenseLayer(5), OutputLayer(3)]
        return _net(layers, updater=Adam(0.05))

    lazy, dense = net(True), net(False)
    assert lazy._sparse_tables and not dense._sparse_tables
    first = DataSet(np.array([[1], [2], [3], [2]]), np.eye(3)[[0, 1, 2, 0]])
    second = DataSet(np.array([[2], [5], [5], [7]]), np.eye(3)[[1, 1, 2, 0]])
    for n in (lazy, dense):
        n.fit(first)
    np.testing.assert_array_equal(lazy.params(), dense.params())  # zero moments: no step elsewhere
    after_first = lazy.params().copy()
    state_after_first = lazy.updater_state().copy()
    for n in (lazy, dense):
        n.fit(second)
    table = slice(0, 160)
    frozen = np.zeros((40, 4), dtype=bool)
    frozen[[1, 3]] = True
    frozen = frozen.reshape(-1)
    lazy_w, dense_w = lazy.params()[table], dense.params()[table]
    np.testing.assert_array_equal(lazy_w[~frozen], dense_w[~frozen])
    np.testing.assert_array_equal(lazy_w[frozen], after_first[table][frozen])
    assert (dense_w[frozen] != after_first[table][frozen]).all()  # DL4J's dense step moved them
    np.testing.assert_array_equal(lazy.params()[160:], dense.params()[160:])
    n = lazy.num_params()  # Adam's state: m then v, one block of num_params each
    for part in (slice(0, n), slice(n, 2 * n)):
        lazy_s, dense_s = lazy.updater_state()[part], dense.updater_state()[part]
        np.testing.assert_array_equal(lazy_s[table][frozen], state_after_first[part][table][frozen])
        np.testing.assert_array_equal(lazy_s[table][~frozen], dense_s[table][~frozen])
        np.testing.assert_array_equal(lazy_s[160:], dense_s[160:])


def test_graph_with_both_embedding_layers_gradient_check_and_fit():
    conf = (
        GraphBuilder(seed=1, updater=Sgd(0.5), dtype="float64")
        .add_inputs("word", "words")
        .set_input_types(InputType.feed_forward(1), InputType.recurrent(1))
        .add_layer("emb", EmbeddingLayer(9, 3, has_bias=True), "word")
        .add_layer("seq", EmbeddingSequenceLayer(9, 3), "words")
        .add_layer("pool", GlobalPoolingLayer("avg"), "seq")
        .add_vertex("merge", MergeVertex(), "emb", "pool")
        .add_layer("out", OutputLayer(2), "merge")
        .set_outputs("out")
        .build()
    )
    graph = ComputationGraph(conf).init()
    assert len(graph._sparse_tables) == 2
    rng = np.random.default_rng(0)
    mask = np.ones((5, 4))
    mask[1, 2:] = 0
    ds = MultiDataSet(
        [rng.integers(0, 9, (5, 1)), rng.integers(0, 9, (5, 1, 4))],
        [np.eye(2)[rng.integers(0, 2, 5)]],
        features_masks=[None, mask],
    )
    grad, _ = graph.compute_gradient_and_score(ds)
    numeric = ref.numerical_gradient(lambda _: graph.compute_gradient_and_score(ds)[1], graph.params())
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    before = graph.score(ds)
    graph.fit(ds, epochs=5)
    assert graph.score(ds) < before


def test_rnn_time_step_takes_index_steps():
    layers = [EmbeddingSequenceLayer(2**24 + 2, 2, activation="identity"), LSTM(3), RnnOutputLayer(2)]
    net = _net(layers, InputType.recurrent(1))
    x = np.array([[[2**24 + 1, 3, 2**24]]])
    whole = net.output(x)
    steps = [net.rnn_time_step(x[:, :, t]) for t in range(3)]  # (batch, 1): one index per example
    np.testing.assert_allclose(np.stack(steps, axis=-1), whole, rtol=1e-6, atol=1e-7)
    net.rnn_clear_previous_state()
    table = net.params()[: (2**24 + 2) * 2].reshape(-1, 2)
    table[2**24 + 1] = 100.0  # only the exact index reaches this row
    assert not np.allclose(net.rnn_time_step(x[:, :, 0]), steps[0])
