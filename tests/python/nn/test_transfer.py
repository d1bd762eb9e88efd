"""FrozenLayer and the TransferLearning builders (issue 39 item 2): frozen parameters stay bit-identical
through training (momentum, l2, weight decay), the backward pass stops at a frozen layer, kept layers
keep their parameters bit for bit, new and resized layers are initialised from their configuration,
frozen marks survive JSON and model files, and a frozen feature extractor transfers to a related task."""

from __future__ import annotations

import io

import numpy as np
import pytest

from sparkgrad.compress import EncodingHandler, FixedThresholdAlgorithm, decode
from sparkgrad.datasets import load_digits
from sparkgrad.nn import (
    BatchNormalization,
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    FineTuneConfiguration,
    FrozenLayer,
    InputType,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    TransferLearning,
    WeightInit,
)
from sparkgrad.nn.updaters import Adam, Nesterovs, NoOp, Sgd

RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 6)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[np.arange(48) % 3]


def _mln(layers, **kw) -> MultiLayerNetwork:
    defaults = dict(
        input_type=InputType.feed_forward(6), updater=Nesterovs(0.1, 0.9), seed=1, activation="tanh"
    )
    return MultiLayerNetwork(MultiLayerConfiguration(layers, **{**defaults, **kw})).init()


def _trained() -> MultiLayerNetwork:
    net = _mln([DenseLayer(8), BatchNormalization(), DenseLayer(7), OutputLayer(3)])
    return net.fit(X, Y, epochs=3, batch_size=16)


def _graph() -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(seed=3, activation="tanh", updater=Adam(1e-2))
        .add_inputs("in")
        .set_input_types(InputType.feed_forward(6))
        .add_layer("a", DenseLayer(5), "in")
        .add_layer("b", DenseLayer(4), "in")
        .add_vertex("m", MergeVertex(), "a", "b")
        .add_layer("c", DenseLayer(6), "m")
        .add_layer("d", DenseLayer(5), "in")
        .add_layer("out", OutputLayer(3), "c", "d")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf).init().fit(X, Y, epochs=2, batch_size=16)


def _ranges(net) -> dict:
    return dict(zip(net._layer_keys, net._layer_ranges))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _frozen_ranges(net) -> list[tuple[int, int]]:
    return [r for (_, layer, _), r in zip(net._units, net._layer_ranges) if isinstance(layer, FrozenLayer)]


# -- FrozenLayer ---------------------------------------------------------------------------------
def test_frozen_layer_round_trips_json_and_yaml_and_refuses_output_layers() -> None:
    conf = MultiLayerConfiguration(
        [FrozenLayer(DenseLayer(8, dropout=0.5)), FrozenLayer(BatchNormalization()), OutputLayer(3)],
        input_type=InputType.feed_forward(6),
    )
    for back in (
        MultiLayerConfiguration.from_json(conf.to_json()),
        MultiLayerConfiguration.from_yaml(conf.to_yaml()),
    ):
        assert back == conf and isinstance(back.layers[0], FrozenLayer)
        assert back.layers[0].layer == DenseLayer(8, n_in=6, dropout=0.5)
    layer = conf.layers[0]
    assert layer.n_out == 8 and layer.dropout == 0.5  # the wrapped layer's fields read through
    assert layer.updater == NoOp() and layer.l2 == 0.0 and layer.weight_decay == 0.0
    for bad in (OutputLayer(3), FrozenLayer(DenseLayer(2)), "dense"):
        with pytest.raises(ValueError, match="layer: expected a layer configuration that is not an output"):
            FrozenLayer(bad)


def test_frozen_parameters_are_bit_identical_after_fit_with_momentum_l2_and_weight_decay() -> None:
    layers = [
        FrozenLayer(DenseLayer(8, dropout=0.5)),
        FrozenLayer(BatchNormalization()),
        DenseLayer(7),
        OutputLayer(3),
    ]
    net = _mln(layers, l2=1e-2, l1=1e-3, weight_decay=1e-2, gradient_normalization="clip_l2_per_layer")
    before = net.params().copy()
    net.fit(X, Y, epochs=4, batch_size=8)
    after = net.params()
    stop = _ranges(net)[1][1]
    np.testing.assert_array_equal(_bits(after[:stop]), _bits(before[:stop]))  # weights, gamma, running stats
    assert np.all(after[stop:] != before[stop:])  # everything trained moved
    # the frozen layers have no updater state: Nesterovs keeps one velocity per trained parameter
    assert net.updater_state().size == net.num_params() - stop
    assert net.updaters == (Nesterovs(0.1, 0.9),)


def test_a_frozen_layer_runs_in_inference_mode_in_training() -> None:
    def net(frozen: bool) -> MultiLayerNetwork:
        wrap = FrozenLayer if frozen else (lambda layer: layer)
        return _mln([wrap(DenseLayer(8, dropout=0.5)), wrap(BatchNormalization()), OutputLayer(3)])

    frozen, plain = net(True), net(False)
    np.testing.assert_array_equal(frozen.output(X, train=True), frozen.output(X, train=False))
    # the same layers unfrozen: dropout and batch statistics change the training output
    assert not np.allclose(plain.output(X, train=True), plain.output(X, train=False))


def test_the_backward_pass_stops_at_the_frozen_layer() -> None:
    frozen = _mln([FrozenLayer(DenseLayer(8)), DenseLayer(7), OutputLayer(3)])
    plain = _mln([DenseLayer(8), DenseLayer(7), OutputLayer(3)])
    np.testing.assert_array_equal(frozen.params(), plain.params())
    g_frozen, s_frozen = frozen.compute_gradient_and_score(_dataset())
    g_plain, s_plain = plain.compute_gradient_and_score(_dataset())
    stop = _ranges(frozen)[0][1]
    assert s_frozen == s_plain and not g_frozen[:stop].any() and g_plain[:stop].any()
    np.testing.assert_array_equal(g_frozen[stop:], g_plain[stop:])


def _dataset():
    from sparkgrad.data import DataSet

    return DataSet(X[:16], Y[:16])


def test_a_trainable_layer_below_a_frozen_one_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"layers\[0\] \(DenseLayer\)\.frozen: .*FrozenLayer layers\[2\]"):
        _mln([DenseLayer(8), BatchNormalization(), FrozenLayer(DenseLayer(7)), OutputLayer(3)])
    _mln([FrozenLayer(DenseLayer(8)), FrozenLayer(DenseLayer(7)), OutputLayer(3)])  # all frozen below: fine
    builder = (
        ComputationGraphConfiguration.builder()
        .add_inputs("in")
        .set_input_types(InputType.feed_forward(6))
        .add_layer("a", DenseLayer(5), "in")
        .add_layer("b", FrozenLayer(DenseLayer(4)), "a")
    )
    with pytest.raises(ValueError, match=r"vertex 'a' \(DenseLayer\)\.frozen: .*every path"):
        builder.add_layer("out", OutputLayer(3), "b").set_outputs("out").build()
    # a second path from 'a' to the output, through no frozen layer, trains it
    builder.add_layer("out2", OutputLayer(3), "a", "b").set_outputs("out", "out2").build()


def test_a_frozen_embedding_sequence_layer_still_reads_index_sequences() -> None:
    from sparkgrad.nn import EmbeddingSequenceLayer, GlobalPoolingLayer
    from sparkgrad.spark.columns import INDEX_SEQUENCES, index_input

    layers = [FrozenLayer(EmbeddingSequenceLayer(20, 4)), GlobalPoolingLayer(), OutputLayer(3)]
    conf = MultiLayerConfiguration(layers, input_type=InputType.recurrent(1))
    assert index_input(conf) == INDEX_SEQUENCES
    with pytest.raises(
        ValueError, match=r"layers\[0\] \(FrozenLayer\)\.input: needs input_type=InputType.recurrent"
    ):
        MultiLayerConfiguration(layers)
    net = MultiLayerNetwork(conf).init()
    tokens = RNG.integers(0, 20, size=(16, 1, 5)).astype(np.float32)
    before = net.params().copy()
    net.fit(tokens, Y[:16], epochs=2, batch_size=8)
    stop = _ranges(net)[0][1]
    np.testing.assert_array_equal(_bits(net.params()[:stop]), _bits(before[:stop]))
    assert np.all(net.params()[stop:] != before[stop:])


def test_frozen_marks_survive_the_model_file_and_training_after_loading() -> None:
    net = _mln([FrozenLayer(DenseLayer(8)), DenseLayer(7), OutputLayer(3)], l2=1e-2)
    net.fit(X, Y, epochs=1, batch_size=16)
    buf = io.BytesIO()
    net.save(buf)
    buf.seek(0)
    back = MultiLayerNetwork.load(buf)
    assert back.conf == net.conf and isinstance(back.conf.layers[0], FrozenLayer)
    np.testing.assert_array_equal(back.params(), net.params())
    before = back.params().copy()
    back.fit(X, Y, epochs=2, batch_size=16)
    stop = _ranges(back)[0][1]
    np.testing.assert_array_equal(_bits(back.params()[:stop]), _bits(before[:stop]))
    assert np.all(back.params()[stop:] != before[stop:])


def test_no_encoded_message_names_a_frozen_index() -> None:
    """A gradient-sharing worker's steps (compute_update -> residual -> threshold encoding): the frozen
    entries of every update are exactly zero, so they never enter the residual or a message."""
    net = _mln(
        [FrozenLayer(DenseLayer(8)), FrozenLayer(BatchNormalization()), DenseLayer(7), OutputLayer(3)],
        l2=1e-2,
    )
    handler = EncodingHandler(net.num_params(), FixedThresholdAlgorithm(1e-4))
    stop = _ranges(net)[1][1]
    named = np.zeros(net.num_params(), dtype=bool)
    for i, batch in enumerate(_dataset().split(4) * 3):
        update, _ = net.compute_update(batch)
        assert not update[:stop].any()
        message = handler.encode(update, i, 0)
        assert message is not None
        decoded = np.zeros(net.num_params(), dtype=np.float32)
        decode(message, decoded)
        named |= decoded != 0
        net.apply_update(update)
    assert not named[:stop].any() and named[stop:].all()
    assert not handler.residual[:stop].any()


# -- TransferLearning.Builder --------------------------------------------------------------------
def test_builder_keeps_trained_layers_bit_for_bit_and_initialises_new_ones_from_their_config() -> None:
    net = _trained()
    fine_tune = FineTuneConfiguration(updater=Adam(5e-3), l2=1e-3, seed=7, activation="relu")
    new = (
        TransferLearning.Builder(net)
        .fine_tune_configuration(fine_tune)
        .set_feature_extractor(1)
        .remove_output_layer()
        .add_layer(DenseLayer(5))
        .add_layer(OutputLayer(2))
        .build()
    )
    layers = new.conf.layers
    assert [type(layer).__name__ for layer in layers] == [
        "FrozenLayer",
        "FrozenLayer",
        "DenseLayer",
        "DenseLayer",
        "OutputLayer",
    ]
    # fine-tuning: network-wide defaults and the kept trainable layer's settings; not the frozen ones,
    # not the output layer's activation
    assert new.conf.updater == Adam(5e-3) and new.conf.seed == 7
    assert (
        layers[2].activation.value == "relu" and layers[2].l2 == 1e-3 and layers[0].layer.activation is None
    )
    assert (
        layers[4].activation.value == "softmax" and layers[3].activation.value == "relu"
    )  # new: where unset
    old, fresh = net.params(), MultiLayerNetwork(new.conf).init().params()
    r_old, r_new = _ranges(net), _ranges(new)
    for i in range(3):
        np.testing.assert_array_equal(_bits(new.params()[slice(*r_new[i])]), _bits(old[slice(*r_old[i])]))
    for i in (3, 4):  # new layers: exactly the configuration's seeded initialisation
        np.testing.assert_array_equal(new.params()[slice(*r_new[i])], fresh[slice(*r_new[i])])
    assert new.iteration_count == 0 and not new.updater_state().any()
    assert net.conf.layers[0].__class__ is DenseLayer  # the original network is left as it was
    # training the new network moves neither the frozen layers nor the original network
    before, kept = new.params().copy(), old.copy()
    new.fit(X, np.eye(2, dtype=np.float32)[np.arange(48) % 2], epochs=2, batch_size=16)
    stop = r_new[1][1]
    np.testing.assert_array_equal(_bits(new.params()[:stop]), _bits(before[:stop]))
    np.testing.assert_array_equal(net.params(), kept)


def test_n_out_replace_reinitialises_the_layer_and_the_input_side_of_the_next() -> None:
    net = _trained()
    new = (
        TransferLearning.Builder(net).n_out_replace(2, 4, weight_init="ones", weight_init_next="zero").build()
    )
    layers, r_old, r_new = new.conf.layers, _ranges(net), _ranges(new)
    assert layers[2].n_out == 4 and layers[3].n_in == 4 and layers[2].weight_init is WeightInit.ONES
    params = new.params()
    w2 = params[r_new[2][0] : r_new[2][0] + 8 * 4]
    assert np.all(w2 == 1.0) and not params[r_new[3][0] : r_new[3][1]].any()  # W zero, bias zero
    for i in (0, 1):  # the layers below keep their parameters
        np.testing.assert_array_equal(params[slice(*r_new[i])], net.params()[slice(*r_old[i])])
    # the output layer's n_out too (the number of classes): only it is re-initialised
    out = TransferLearning.Builder(net).n_out_replace(3, 5).build()
    fresh = MultiLayerNetwork(out.conf).init().params()
    r_out = _ranges(out)
    np.testing.assert_array_equal(out.params()[: r_out[2][1]], net.params()[: r_old[2][1]])
    np.testing.assert_array_equal(out.params()[slice(*r_out[3])], fresh[slice(*r_out[3])])
    # before a batch normalization: it follows the new size and is re-initialised (gamma 1, the rest 0/1)
    bn = TransferLearning.Builder(net).n_out_replace(0, 6).build()
    gamma, beta, mean, var = bn.params()[slice(*_ranges(bn)[1])].reshape(4, 6)
    assert np.all(gamma == 1) and not beta.any() and not mean.any() and np.all(var == 1)
    assert bn.conf.layers[2].n_in == 6


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda b: b.set_feature_extractor(4),
            r"set_feature_extractor: layer index 4 is out of range: the network has layers 0\.\.3",
        ),
        (lambda b: b.set_feature_extractor(-1), r"layer index -1 is out of range"),
        (lambda b: b.set_feature_extractor(3), r"layers\[3\] is the output layer"),
        (lambda b: b.n_out_replace(9, 2), r"n_out_replace: layer index 9 is out of range"),
        (lambda b: b.n_out_replace(1, 2), r"n_out_replace: layers\[1\] \(BatchNormalization\): has no n_out"),
        (lambda b: b.n_out_replace(2, 0), r"n_out: .*0"),
        (lambda b: b.remove_layers_from_output(5), r"remove_layers_from_output"),
        (
            lambda b: b.set_feature_extractor(2).remove_layers_from_output(2).build(),
            r"layer index 2 is out of range after the removals",
        ),
        (
            lambda b: b.set_feature_extractor(2).n_out_replace(2, 3).build(),
            r"layers\[2\] is re-initialised but inside the feature extractor",
        ),
        (
            lambda b: b.remove_output_layer().build(),
            r"layers\[2\] \(DenseLayer\)\.type: the last layer must be",
        ),
    ],
)
def test_builder_errors_name_the_layer(edit, message) -> None:
    with pytest.raises(ValueError, match=message):
        edit(TransferLearning.Builder(_trained()))


def test_builder_refuses_other_arguments() -> None:
    with pytest.raises(TypeError, match="net: expected a MultiLayerNetwork"):
        TransferLearning.Builder(_graph())
    with pytest.raises(TypeError, match="net: expected a ComputationGraph"):
        TransferLearning.GraphBuilder(_trained())
    with pytest.raises(ValueError, match="not initialised"):
        TransferLearning.Builder(MultiLayerNetwork(_trained().conf))
    with pytest.raises(TypeError, match="fine_tune: expected a FineTuneConfiguration"):
        TransferLearning.Builder(_trained()).fine_tune_configuration({"updater": Sgd(0.1)})


def test_fine_tune_configuration_validates_and_round_trips() -> None:
    ft = FineTuneConfiguration(updater=Sgd(0.1), l2=1e-3, dropout=0.8, activation="relu", seed=3)
    assert FineTuneConfiguration.from_json(ft.to_json()) == ft
    for field, value in (
        ("l2", -1.0),
        ("dropout", 0.0),
        ("activation", "nope"),
        ("seed", -1),
        ("updater", 0.1),
    ):
        with pytest.raises(ValueError, match=field):
            FineTuneConfiguration(**{field: value})


# -- TransferLearning.GraphBuilder ---------------------------------------------------------------
def test_graph_builder_freezes_ancestors_and_keeps_parameters_bit_for_bit() -> None:
    graph = _graph()
    new = (
        TransferLearning.GraphBuilder(graph)
        .fine_tune_configuration(FineTuneConfiguration(updater=Nesterovs(0.05, 0.9), weight_decay=1e-2))
        .set_feature_extractor("c")
        .remove_vertex_keep_connections("out")
        .add_layer("out", OutputLayer(2), "out-merge")  # the kept connection: 'out-merge' reads c and d
        .build()
    )
    kinds = {name: type(new.conf.spec(name).vertex).__name__ for name in ("a", "b", "m", "c", "d", "out")}
    assert kinds == {
        "a": "FrozenLayer", "b": "FrozenLayer", "m": "MergeVertex", "c": "FrozenLayer", "d": "DenseLayer",
        "out": "OutputLayer",
    }  # fmt: skip
    old, r_old, r_new = graph.params(), _ranges(graph), _ranges(new)
    for name in ("a", "b", "c", "d"):
        np.testing.assert_array_equal(
            _bits(new.params()[slice(*r_new[name])]), _bits(old[slice(*r_old[name])])
        )
    fresh = ComputationGraph(new.conf).init().params()
    np.testing.assert_array_equal(new.params()[slice(*r_new["out"])], fresh[slice(*r_new["out"])])
    before = new.params().copy()
    new.fit(X, np.eye(2, dtype=np.float32)[np.arange(48) % 2], epochs=3, batch_size=16)
    after = new.params()
    for start, stop in _frozen_ranges(new):
        np.testing.assert_array_equal(_bits(after[start:stop]), _bits(before[start:stop]))
    for name in ("d", "out"):
        assert np.all(after[slice(*r_new[name])] != before[slice(*r_new[name])])
    trained = sum(r_new[name][1] - r_new[name][0] for name in ("d", "out"))
    assert new.updater_state().size == trained  # Nesterovs: one velocity per trained parameter


def test_graph_builder_removes_vertices_with_connections_and_replaces_n_out() -> None:
    graph = _graph()
    new = (
        TransferLearning.GraphBuilder(graph)
        .remove_vertex_and_connections("d")
        .n_out_replace("c", 3, weight_init_next="zero")
        .build()
    )
    assert "d" not in {s.name for s in new.conf.vertices} and new.conf.spec("out").vertex.n_in == 3
    r_old, r_new = _ranges(graph), _ranges(new)
    for name in ("a", "b"):
        np.testing.assert_array_equal(new.params()[slice(*r_new[name])], graph.params()[slice(*r_old[name])])
    assert not new.params()[slice(*r_new["out"])].any()  # re-initialised with weight_init_next
    fresh = ComputationGraph(new.conf).init().params()
    np.testing.assert_array_equal(new.params()[slice(*r_new["c"])], fresh[slice(*r_new["c"])])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda b: b.set_feature_extractor("nope"),
            r"set_feature_extractor: 'nope' is not a vertex of the graph",
        ),
        (lambda b: b.set_feature_extractor("m"), r"vertex 'm' is a MergeVertex, not a layer"),
        (lambda b: b.set_feature_extractor("out"), r"vertex 'out' is an output layer"),
        (lambda b: b.set_feature_extractor(), r"name at least one layer vertex"),
        (lambda b: b.n_out_replace("zz", 2), r"n_out_replace: 'zz' is not a vertex"),
        (lambda b: b.set_feature_extractor("c").n_out_replace("a", 2), r"vertex 'a': is frozen"),
        (
            lambda b: b.n_out_replace("a", 2).set_feature_extractor("c").build(),
            r"vertex 'a' is re-initialised",
        ),
        (
            lambda b: b.remove_vertex_keep_connections("x"),
            r"remove_vertex_keep_connections: 'x' is not a vertex",
        ),
        (
            lambda b: b.remove_vertex_and_connections("x"),
            r"remove_vertex_and_connections: 'x' is not a vertex",
        ),
        (lambda b: b.remove_vertex_keep_connections("out").build(), r"outputs: 'out' is not a vertex"),
        (lambda b: b.remove_vertex_keep_connections("c").build(), r"vertex 'out-merge'.*unknown input 'c'"),
        (lambda b: b.add_layer("a", DenseLayer(2), "in"), r"vertex name 'a' is already used"),
    ],
)
def test_graph_builder_errors_name_the_vertex(edit, message) -> None:
    with pytest.raises(ValueError, match=message):
        edit(TransferLearning.GraphBuilder(_graph()))


# -- fine-tuning -----------------------------------------------------------------------------------
def test_a_frozen_feature_extractor_transfers_to_a_related_task() -> None:
    """Pretrain on the ten digit classes (half the training set); freeze the hidden layer and train a
    new head for odd/even on 40 examples of the other half. Over 8 seeds and three updaters (Adam,
    Nesterovs, Sgd) the transferred network scored 0.887-0.931 on the test set (mean 0.908-0.916 per
    updater) and the same network trained from scratch on the 40 examples 0.807-0.855 (mean
    0.832-0.837): the bounds leave about 0.04 below the lowest transfer and half the mean gap."""
    train, test = load_digits(test_fraction=0.3, seed=0, shape="flat")
    digit = train.labels.argmax(1)
    half = len(digit) // 2
    parity = np.eye(2, dtype=np.float32)
    xb, yb = train.features[half : half + 40], parity[digit[half : half + 40] % 2]
    xt, yt = test.features, test.labels.argmax(1) % 2
    transferred, scratch = [], []
    for seed in range(4):
        for updater in (Adam(1e-2), Nesterovs(0.05, 0.9)):
            conf = MultiLayerConfiguration(
                [DenseLayer(32, activation="relu"), OutputLayer(10)],
                input_type=InputType.feed_forward(64),
                updater=Adam(1e-2),
                seed=seed,
            )
            net = (
                MultiLayerNetwork(conf)
                .init()
                .fit(train.features[:half], train.labels[:half], epochs=15, batch_size=32)
            )
            new = (
                TransferLearning.Builder(net)
                .fine_tune_configuration(FineTuneConfiguration(updater=updater, seed=seed))
                .set_feature_extractor(0)
                .remove_output_layer()
                .add_layer(DenseLayer(16, activation="relu"))
                .add_layer(OutputLayer(2))
                .build()
            )
            new.fit(xb, yb, epochs=60, batch_size=10)
            transferred.append(np.mean(new.output(xt).argmax(1) == yt))
            head = dict(input_type=InputType.feed_forward(64), updater=updater, seed=seed)
            plain = MultiLayerNetwork(
                MultiLayerConfiguration(
                    [DenseLayer(32, activation="relu"), DenseLayer(16, activation="relu"), OutputLayer(2)],
                    **head,
                )
            ).init()
            scratch.append(np.mean(plain.fit(xb, yb, epochs=60, batch_size=10).output(xt).argmax(1) == yt))
    assert min(transferred) >= 0.85, transferred
    assert np.mean(transferred) >= np.mean(scratch) + 0.04, (transferred, scratch)
