"""Truncated BPTT in ComputationGraph: a chain graph trains bit for bit as the MultiLayerNetwork, a segment's
gradient is the float64 finite-difference gradient of its loss given the carried state, a graph with two
masked sequence inputs and a feed-forward input trains one update per segment (sequences cut, the rest
whole, as in DL4J), and the configuration validates and round-trips like MultiLayerConfiguration's."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.nn import (
    LSTM,
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    DuplicateToTimeSeriesVertex,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
    SimpleRnn,
)
from sparkgrad.nn.conf import BackpropType
from sparkgrad.nn.updaters import Adam, Sgd

EPS = 1e-6
MAX_REL_ERROR = 1e-5
N, T = 3, 7


def _mask(lengths, t: int = T) -> np.ndarray:
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


def _tbptt(forward: int = 3, backward: int = 3) -> dict:
    return {
        "backprop_type": "truncated_bptt",
        "tbptt_forward_length": forward,
        "tbptt_backward_length": backward,
    }


def _chain_layers() -> list:
    return [LSTM(4), DenseLayer(3, activation="tanh"), SimpleRnn(3), RnnOutputLayer(2)]


def _chain_pair(dtype: str, **kw) -> tuple[MultiLayerNetwork, ComputationGraph]:
    defaults = {"seed": 4, "dtype": dtype, "updater": Adam(1e-2), "l2": 1e-3, **kw}
    mln = MultiLayerNetwork(
        MultiLayerConfiguration(_chain_layers(), input_type=InputType.recurrent(3), **defaults)
    ).init()
    builder = ComputationGraphConfiguration.builder(**defaults).add_inputs("in")
    builder.set_input_types(InputType.recurrent(3))
    previous = "in"
    for i, layer in enumerate(_chain_layers()):
        builder.add_layer(f"l{i}", layer, previous)
        previous = f"l{i}"
    return mln, ComputationGraph(builder.set_outputs(previous).build()).init()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("forward", "backward"), [(3, 3), (3, 2), (7, 7)])
def test_chain_graph_with_truncated_bptt_equals_the_multilayer_network(
    dtype: str, forward: int, backward: int
) -> None:
    """Same layers, seed and data (features and labels masks, 7 steps): identical parameters and updater
    state after several truncated-BPTT epochs, and the same number of updates (one per segment)."""
    mln, graph = _chain_pair(dtype, **_tbptt(forward, backward))
    np.testing.assert_array_equal(graph.params(), mln.params())
    rng = np.random.default_rng(2)
    batches = []
    for _ in range(3):
        fmask = _mask(rng.integers(1, T + 1, 5)).astype(dtype)
        lmask = fmask * (rng.random((5, T)) < 0.8)
        x = rng.normal(size=(5, 3, T)).astype(dtype)
        y = np.eye(2)[rng.integers(0, 2, (5, T))].transpose(0, 2, 1).astype(dtype)
        batches.append(DataSet(x, y, features_mask=fmask, labels_mask=lmask.astype(dtype)))
    start = graph.params().copy()
    mln.fit(batches, epochs=2)
    graph.fit(batches, epochs=2)
    segments = -(-T // forward)
    assert graph.iteration_count == mln.iteration_count == 2 * 3 * segments
    assert not np.array_equal(graph.params(), start)
    np.testing.assert_array_equal(graph.params(), mln.params())
    np.testing.assert_array_equal(graph.updater_state(), mln.updater_state())
    assert graph.score() == mln.score()


def _three_input_graph(**kw) -> ComputationGraph:
    """Sequences a (3 features) and b (2), a vector c repeated along a's steps; a per-step output on
    all three and a vector output on a's last step."""
    conf = (
        ComputationGraphConfiguration.builder(seed=3, dtype="float64", updater=Sgd(0.3), **kw)
        .add_inputs("a", "b", "c")
        .set_input_types(InputType.recurrent(3), InputType.recurrent(2), InputType.feed_forward(2))
        .add_layer("la", LSTM(3), "a")
        .add_layer("lb", SimpleRnn(2, activation="tanh"), "b")
        .add_vertex("dup", DuplicateToTimeSeriesVertex("a"), "c")
        .add_layer("seq", RnnOutputLayer(2), "la", "lb", "dup")
        .add_layer("last", LastTimeStep(SimpleRnn(2, activation="tanh")), "la")
        .add_layer("vec", OutputLayer(2), "last")
        .set_outputs("seq", "vec")
        .build()
    )
    return ComputationGraph(conf).init()


def _three_input_data(rng: np.random.Generator, a_lengths, b_lengths) -> MultiDataSet:
    a, b, c = rng.normal(size=(N, 3, T)), rng.normal(size=(N, 2, T)), rng.normal(size=(N, 2))
    seq = np.eye(2)[rng.integers(0, 2, (N, T))].transpose(0, 2, 1)
    vec = np.eye(2)[rng.integers(0, 2, N)]
    lmask = _mask(a_lengths) * (rng.random((N, T)) < 0.8)
    return MultiDataSet(
        [a, b, c],
        [seq, vec],
        features_masks=[_mask(a_lengths), _mask(b_lengths), None],
        labels_masks=[lmask, None],
    )


def test_segments_cut_every_sequence_and_pass_the_rest_whole() -> None:
    data = _three_input_data(np.random.default_rng(1), [7, 4, 6], [5, 7, 6])
    net = _three_input_graph(**_tbptt(3, 2))
    segments = net.tbptt_segments(data)
    assert [s.first for s in segments] == [True, False, False]
    for segment, (lo, hi) in zip(segments, [(0, 3), (3, 6), (6, 7)]):
        assert segment.num_examples() == N
        for cut, whole in zip(segment.features[:2], data.features[:2]):
            np.testing.assert_array_equal(cut, whole[:, :, lo:hi])
        assert segment.features[2] is data.features[2]  # the vector input goes whole into each segment
        np.testing.assert_array_equal(segment.labels[0], data.labels[0][:, :, lo:hi])
        assert segment.labels[1] is data.labels[1]
        for cut, whole in zip(segment.features_masks[:2], data.features_masks[:2]):
            np.testing.assert_array_equal(cut, whole[:, lo:hi])
        assert segment.features_masks[2] is None
        np.testing.assert_array_equal(segment.labels_masks[0], data.labels_masks[0][:, lo:hi])
        assert segment.labels_masks[1] is None


def _segment_gradient_check(net: ComputationGraph, before: list, segment) -> None:
    """Analytic vs central-difference gradient of the segment's score for every parameter, the carried
    state each time the one the ``before`` segments end in with the unperturbed parameters (no gradient
    flows into the carried state). Round-off bound as in test_recurrent: terms * eps * |score| / 2 EPS
    absolute, the rest relative."""

    def carried_state() -> None:
        net.rnn_clear_previous_state()
        for s in before:
            net.rnn_time_step(*s.features, features_masks=s.features_masks)

    params = net.params()
    carried_state()
    grad, score = net.compute_gradient_and_score(segment)
    grad = grad.copy()
    terms = sum(np.asarray(y).size for y in segment.labels)
    atol = terms * np.finfo(np.float64).eps * max(1.0, abs(score)) / EPS
    checked = 0
    for i in range(params.size):
        orig = params[i]
        scores = []
        for value in (orig + EPS, orig - EPS):
            params[i] = orig
            carried_state()
            params[i] = value
            scores.append(net.compute_gradient_and_score(segment)[1])
        params[i] = orig
        numeric = (scores[0] - scores[1]) / (2 * EPS)
        assert abs(numeric - grad[i]) <= MAX_REL_ERROR * (abs(numeric) + abs(grad[i])) + atol, (
            i,
            numeric,
            grad[i],
        )
        checked += abs(grad[i]) > 1e-4
    assert checked > params.size // 2  # the check is not vacuous


def test_segment_gradient_matches_finite_differences_given_the_carried_state() -> None:
    data = _three_input_data(np.random.default_rng(6), [7, 5, 6], [6, 7, 4])
    net = _three_input_graph(**_tbptt(3, 3))
    first, second, third = net.tbptt_segments(data)
    _segment_gradient_check(net, [first], second)
    _segment_gradient_check(net, [first, second], third)
    # the state matters: from a zero state the second segment's gradient differs
    net.rnn_clear_previous_state()
    net.compute_gradient_and_score(first)
    carried = net.compute_gradient_and_score(second)[0].copy()
    net.rnn_clear_previous_state()
    assert not np.allclose(net.compute_gradient_and_score(second)[0], carried)


@pytest.mark.parametrize("backward", [3, 2])
def test_two_sequence_graph_trains_one_update_per_segment_with_the_state_carried(backward: int) -> None:
    """fit equals compute_update/apply_update over the segments by hand, the second segment starting
    from the state the first ended in with the old parameters (short sequences end inside a segment);
    no state carries from one minibatch to the next."""
    rng = np.random.default_rng(9)
    batches = [_three_input_data(rng, [7, 2, 5], [3, 7, 6]) for _ in range(2)]
    net = _three_input_graph(**_tbptt(3, backward))
    start = net.params().copy()
    net.fit(batches)
    assert net.iteration_count == 6
    ref = _three_input_graph(**_tbptt(3, backward))
    for batch in batches:
        segments = ref.tbptt_segments(batch)
        ran_with: list[np.ndarray] = []  # the parameters each segment trained with
        for k, segment in enumerate(segments):
            current = ref.params().copy()
            ref.rnn_clear_previous_state()  # rebuild the carried state by inference, segment by segment
            for s, params in zip(segments[:k], ran_with):
                ref.set_params(params)
                ref.rnn_time_step(*s.features, features_masks=s.features_masks)
            ref.set_params(current)
            ran_with.append(current)
            ref.apply_update(ref.compute_update(segment)[0])
    assert not np.array_equal(net.params(), start)
    np.testing.assert_allclose(net.params(), ref.params(), rtol=1e-12, atol=1e-14)
    # a whole minibatch longer than a segment is refused, naming the setting
    with pytest.raises(ValueError, match="7 time steps exceed tbptt_forward_length 3"):
        net.compute_update(batches[0])


def test_truncated_bptt_training_lowers_the_loss() -> None:
    rng = np.random.default_rng(10)
    data = _three_input_data(rng, [7, 4, 6], [5, 7, 6])
    net = _three_input_graph(**_tbptt(2, 2))
    before = net.score(data)
    net.fit(data, epochs=30)
    assert net.iteration_count == 30 * 4
    assert net.score(data) < 0.8 * before


def test_sequences_of_different_lengths_are_refused() -> None:
    rng = np.random.default_rng(11)
    full = _three_input_data(rng, [7, 7, 7], [7, 7, 7])
    data = MultiDataSet(full.features, [full.labels[0][:, :, :6], full.labels[1]])
    net = _three_input_graph(**_tbptt(3, 3))
    with pytest.raises(ValueError, match=r"same number of time steps, got features\[0\] 7, .*labels\[0\] 6"):
        net.fit(data)


def _recurrent_builder(**kw):
    return (
        ComputationGraphConfiguration.builder(**kw)
        .add_inputs("in")
        .set_input_types(InputType.recurrent(3))
        .add_layer("rnn", LSTM(4), "in")
    )


def test_truncated_bptt_graph_configuration_is_checked_and_round_trips() -> None:
    conf = _recurrent_builder(**_tbptt(7, 5)).add_layer("out", RnnOutputLayer(2), "rnn").set_outputs("out")
    conf = conf.build()
    assert conf.backprop_type is BackpropType.TRUNCATED_BPTT
    assert (conf.tbptt_forward_length, conf.tbptt_backward_length) == (7, 5)
    assert ComputationGraphConfiguration.from_json(conf.to_json()) == conf
    assert ComputationGraphConfiguration.from_yaml(conf.to_yaml()) == conf
    assert '"backprop_type": "truncated_bptt"' in conf.to_json()
    standard = _recurrent_builder().add_layer("out", RnnOutputLayer(2), "rnn").set_outputs("out").build()
    assert standard.backprop_type is BackpropType.STANDARD
    assert (standard.tbptt_forward_length, standard.tbptt_backward_length) == (20, 20)  # DL4J's
    assert standard != conf

    def build(**kw):
        builder = _recurrent_builder(**kw).add_layer("out", RnnOutputLayer(2), "rnn")
        return builder.set_outputs("out").build()

    with pytest.raises(ValueError, match="tbptt_backward_length"):
        build(**_tbptt(3, 4))
    with pytest.raises(ValueError, match="tbptt_forward_length"):
        build(**_tbptt(0, 1))
    with pytest.raises(ValueError, match="backprop_type"):
        build(backprop_type="sideways")
    with pytest.raises(
        ValueError,
        match=r"backprop_type: truncated_bptt needs recurrent input and per-time-step output, got "
        r"'in' recurrent\(3\) -> 'out' feed_forward\(2\)",
    ):
        builder = _recurrent_builder(**_tbptt()).add_layer("last", LastTimeStep(SimpleRnn(2)), "rnn")
        builder.add_layer("out", OutputLayer(2), "last").set_outputs("out").build()
    # the same messages as MultiLayerConfiguration's
    with pytest.raises(ValueError) as graph_error:
        build(**_tbptt(3, 4))
    with pytest.raises(ValueError) as mln_error:
        MultiLayerConfiguration(
            [LSTM(4), RnnOutputLayer(2)], input_type=InputType.recurrent(3), **_tbptt(3, 4)
        )
    assert str(graph_error.value) == str(mln_error.value)
