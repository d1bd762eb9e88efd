"""ComputationGraph behaviour: equivalence with MultiLayerNetwork on a chain, DataSet and MultiDataSet
training, the score as the sum of the output losses, labels and features masks, evaluation of a chosen
output, save/load exactness, clone, errors."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import numpy as np
import pytest
from reference import nn as ref

import sparkgrad
from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.errors import CorruptDataError, TrainingError
from sparkgrad.eval import Evaluation, RegressionEvaluation
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    ElementWiseVertex,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    ScoreIterationListener,
    SubsamplingLayer,
    updaters,
)


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    """Tiny tensors: one thread avoids oversubscribing a loaded CI machine (results do not depend on it)."""
    previous = sparkgrad.get_num_threads()
    sparkgrad.set_num_threads(1)
    yield
    sparkgrad.set_num_threads(previous)


def _chain_layers():
    return [
        ConvolutionLayer(3, kernel_size=(3, 3), activation="relu"),
        SubsamplingLayer("max"),
        DenseLayer(6, activation="tanh", l2=1e-3),
        OutputLayer(3),
    ]


def _two_in_two_out(dtype: str = "float32", **defaults) -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(seed=5, dtype=dtype, updater=updaters.Adam(0.01), **defaults)
        .add_inputs("a", "b")
        .set_input_types(InputType.feed_forward(4), InputType.feed_forward(3))
        .add_layer("da", DenseLayer(5, activation="tanh"), "a")
        .add_layer("db", DenseLayer(5, activation="tanh"), "b")
        .add_vertex("sum", ElementWiseVertex("add"), "da", "db")
        .add_layer("cls", OutputLayer(3), "sum", "a")
        .add_layer("reg", OutputLayer(2, activation="identity", loss="mse"), "da")
        .set_outputs("cls", "reg")
        .build()
    )
    return ComputationGraph(conf).init()


def _mds(rng: np.random.Generator, n: int = 8, dtype=np.float32, **masks) -> MultiDataSet:
    return MultiDataSet(
        [rng.normal(size=(n, 4)).astype(dtype), rng.normal(size=(n, 3)).astype(dtype)],
        [np.eye(3, dtype=dtype)[rng.integers(0, 3, n)], rng.normal(size=(n, 2)).astype(dtype)],
        **masks,
    )


def test_a_chain_graph_equals_the_multilayer_network():
    mln = MultiLayerNetwork(
        MultiLayerConfiguration(
            _chain_layers(),
            input_type=InputType.convolutional_flat(6, 6, 1),
            updater=updaters.Adam(0.01),
            seed=1,
        )
    ).init()
    b = ComputationGraphConfiguration.builder(updater=updaters.Adam(0.01), seed=1).add_inputs("in")
    b.set_input_types(InputType.convolutional_flat(6, 6, 1))
    previous = "in"
    for i, layer in enumerate(_chain_layers()):
        b.add_layer(f"l{i}", layer, previous)
        previous = f"l{i}"
    graph = ComputationGraph(b.set_outputs(previous).build()).init(mln.params())
    assert graph.num_params() == mln.num_params()
    rng = np.random.default_rng(0)
    batches = [
        DataSet(rng.normal(size=(5, 36)).astype(np.float32), np.eye(3, dtype=np.float32)[[0, 1, 2, 1, 0]])
    ]
    batches.append(
        DataSet(rng.normal(size=(4, 36)).astype(np.float32), np.eye(3, dtype=np.float32)[[2, 2, 1, 0]])
    )
    np.testing.assert_array_equal(graph.output_single(batches[0].features), mln.output(batches[0].features))
    assert graph.score(batches[0]) == mln.score(batches[0])
    g_grad, g_score = graph.compute_gradient_and_score(batches[0])
    m_grad, m_score = mln.compute_gradient_and_score(batches[0])
    np.testing.assert_array_equal(g_grad, m_grad)
    assert g_score == m_score
    graph.fit(batches, epochs=3)
    mln.fit(batches, epochs=3)
    np.testing.assert_array_equal(graph.params(), mln.params())
    np.testing.assert_array_equal(graph.updater_state(), mln.updater_state())
    assert (graph.iteration_count, graph.epoch_count) == (6, 3)
    np.testing.assert_array_equal(graph.score_examples(batches[1]), mln.score_examples(batches[1]))


def test_score_is_the_sum_of_the_output_losses_plus_penalty():
    graph = _two_in_two_out(dtype="float64", l2=0.01)
    ds = _mds(np.random.default_rng(1), dtype=np.float64)
    cls_out, reg_out = graph.output(*ds.features)
    cls_loss = -(ds.labels[0] * np.log(cls_out)).sum(axis=1)
    reg_loss = ref.loss_score("mse", "identity", ds.labels[1], reg_out)
    penalty = sum(0.5 * 0.01 * float((w**2).sum()) for w, _, _ in graph._weights)
    expected = cls_loss.mean() + reg_loss.mean() + penalty
    # float64 sums of ~30 terms of size ~1: a few ulps of the total
    assert graph.score(ds) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(graph.score_examples(ds), cls_loss + reg_loss, rtol=1e-12)
    np.testing.assert_allclose(
        graph.score_examples(ds, include_regularization_terms=True), cls_loss + reg_loss + penalty, rtol=1e-12
    )


def test_labels_masks_change_the_score():
    rng = np.random.default_rng(2)
    graph = _two_in_two_out(dtype="float64")
    plain = _mds(rng, dtype=np.float64)
    mask = np.array([1, 0, 1, 1, 0, 1, 1, 1.0])
    masked = MultiDataSet(plain.features, plain.labels, labels_masks=[mask, None])
    per_output = np.ones((8, 2))
    per_output[3, 1] = 0.0
    masked_reg = MultiDataSet(plain.features, plain.labels, labels_masks=[None, per_output])
    cls_out, reg_out = graph.output(*plain.features)
    cls_loss = -(plain.labels[0] * np.log(cls_out)).sum(axis=1)
    reg_terms = ref.loss_score("mse", "identity", plain.labels[1], reg_out)
    np.testing.assert_allclose(graph.score_examples(masked), cls_loss * mask + reg_terms, rtol=1e-12)
    assert graph.score(masked) == pytest.approx((cls_loss * mask).mean() + reg_terms.mean(), rel=1e-12)
    assert graph.score(masked) < graph.score(plain)
    reg_masked = ref.loss_score("mse", "identity", plain.labels[1], reg_out, mask=per_output)
    np.testing.assert_allclose(graph.score_examples(masked_reg), cls_loss + reg_masked, rtol=1e-12)
    # masked examples do not matter: other labels there leave gradient and score unchanged
    other = plain.labels[0].copy()
    other[mask == 0] = np.roll(other[mask == 0], 1, axis=1)
    relabelled = MultiDataSet(plain.features, [other, plain.labels[1]], labels_masks=[mask, None])
    g_masked, s_masked = graph.compute_gradient_and_score(masked)
    g_other, s_other = graph.compute_gradient_and_score(relabelled)
    np.testing.assert_array_equal(g_masked, g_other)
    assert s_masked == s_other
    assert not np.allclose(g_masked, graph.compute_gradient_and_score(plain)[0])


def test_features_masks_reach_the_losses_of_the_outputs_that_depend_on_them():
    rng = np.random.default_rng(3)
    graph = _two_in_two_out(dtype="float64")
    plain = _mds(rng, dtype=np.float64)
    mask_a = np.array([1, 1, 0, 1, 1, 1, 1, 0.0])
    cls_out, reg_out = graph.output(*plain.features)
    cls_loss = -(plain.labels[0] * np.log(cls_out)).sum(axis=1)
    reg_loss = ref.loss_score("mse", "identity", plain.labels[1], reg_out)
    # only input "a" masked: "reg" depends on "a" alone, "cls" on both (a missing mask means all present)
    only_a = MultiDataSet(plain.features, plain.labels, features_masks=[mask_a, None])
    np.testing.assert_allclose(graph.score_examples(only_a), cls_loss + reg_loss * mask_a, rtol=1e-12)
    mask_b = np.array([0, 1, 1, 1, 1, 1, 0, 0.0])
    both = MultiDataSet(plain.features, plain.labels, features_masks=[mask_a, mask_b.reshape(-1, 1)])
    either = np.maximum(mask_a, mask_b)  # DL4J merges masks with OR
    np.testing.assert_allclose(graph.score_examples(both), cls_loss * either + reg_loss * mask_a, rtol=1e-12)
    # a labels mask takes precedence over the propagated features mask
    ones = np.ones(8)
    labelled = MultiDataSet(
        plain.features, plain.labels, features_masks=[mask_a, None], labels_masks=[None, ones]
    )
    np.testing.assert_allclose(graph.score_examples(labelled), cls_loss + reg_loss, rtol=1e-12)


def test_training_on_multi_data_sets_reduces_the_score_and_counts():
    rng = np.random.default_rng(4)
    graph = _two_in_two_out()
    batches = []
    for _ in range(4):  # learnable targets: the class and the regression follow the inputs
        a, b = rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)
        cls = np.eye(3, dtype=np.float32)[np.argmax(a[:, :3] + b, axis=1)]
        batches.append(MultiDataSet([a, b], [cls, 0.5 * a[:, :2]]))
    before = sum(graph.score(b) for b in batches)
    graph.fit(batches, epochs=15)
    assert sum(graph.score(b) for b in batches) < 0.5 * before
    assert (graph.iteration_count, graph.epoch_count) == (60, 15)
    assert graph.score() == graph._last_score


def test_fit_is_apply_update_of_compute_update():
    rng = np.random.default_rng(5)
    ds = _mds(rng)
    a, b = _two_in_two_out(), _two_in_two_out()
    a.fit(ds)
    update, score = b.compute_update(ds)
    b.apply_update(update)
    np.testing.assert_array_equal(a.params(), b.params())
    assert score == a.score()


def test_single_input_output_graph_takes_data_sets_and_evaluates():
    rng = np.random.default_rng(6)
    conf = (
        ComputationGraphConfiguration.builder(seed=3, updater=updaters.Adam(0.05))
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(2))
        .add_layer("h", DenseLayer(8, activation="tanh"), "x")
        .add_layer("out", OutputLayer(2), "h", "x")
        .set_outputs("out")
        .build()
    )
    x = rng.normal(size=(64, 2)).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[(x[:, 0] * x[:, 1] > 0).astype(int)]
    ds = DataSet(x, y)
    graph = ComputationGraph(conf).init().fit(ds.split(16), epochs=60)
    evaluation = graph.evaluate(ds)
    predicted = graph.output_single(x).argmax(axis=1)
    assert evaluation.accuracy() == pytest.approx(np.mean(predicted == y.argmax(axis=1)))
    assert evaluation.accuracy() > 0.9
    np.testing.assert_array_equal(graph.output(ds)[0], graph.output_single(x))
    roc = graph.evaluate_roc_multi_class(ds.split(20))
    assert roc.calculate_average_auc() > 0.9


def test_evaluation_of_a_chosen_output():
    rng = np.random.default_rng(7)
    graph = _two_in_two_out()
    ds = _mds(rng)
    cls_out, reg_out = graph.output(ds)
    expected = Evaluation()
    expected.eval(ds.labels[0], cls_out)
    assert graph.evaluate(ds).accuracy() == expected.accuracy()
    np.testing.assert_array_equal(graph.evaluate(ds).confusion_matrix(), expected.confusion_matrix())
    regression = graph.evaluate_regression([ds, ds], output_index=1)
    manual = RegressionEvaluation()
    manual.eval(ds.labels[1], reg_out)
    manual.eval(ds.labels[1], reg_out)
    assert regression.mean_squared_error(0) == manual.mean_squared_error(0)
    first, second = graph.do_evaluation(ds, RegressionEvaluation(), RegressionEvaluation(), output_index=1)
    assert first.mean_squared_error(1) == second.mean_squared_error(1) == manual.mean_squared_error(1)
    with pytest.raises(ValueError, match=r"output_index: expected 0..1 for outputs \['cls', 'reg'\], got 2"):
        graph.evaluate(ds, output_index=2)


def test_save_load_is_exact_and_training_continues_identically(tmp_path):
    rng = np.random.default_rng(8)
    graph = _two_in_two_out()
    batches = [_mds(rng) for _ in range(3)]
    graph.fit(batches, epochs=2)
    path = tmp_path / "graph.zip"
    graph.save(path)
    loaded = ComputationGraph.load(path)
    assert loaded.conf == graph.conf
    np.testing.assert_array_equal(loaded.params(), graph.params())
    np.testing.assert_array_equal(loaded.updater_state(), graph.updater_state())
    assert (loaded.iteration_count, loaded.epoch_count) == (6, 2)
    graph.fit(batches)
    loaded.fit(batches)
    np.testing.assert_array_equal(loaded.params(), graph.params())
    buffer = io.BytesIO()
    graph.save(buffer, save_updater=False)
    buffer.seek(0)
    fresh_state = ComputationGraph.load(buffer)
    np.testing.assert_array_equal(fresh_state.params(), graph.params())
    assert not fresh_state.updater_state().any()


def test_model_files_name_the_network_type(tmp_path):
    mln = MultiLayerNetwork(
        MultiLayerConfiguration([DenseLayer(3), OutputLayer(2)], input_type=InputType.feed_forward(2))
    ).init()
    mln.save(tmp_path / "mln.zip")
    with pytest.raises(CorruptDataError, match="holds a 'MultiLayerNetwork', not a 'ComputationGraph'"):
        ComputationGraph.load(tmp_path / "mln.zip")
    _two_in_two_out().save(tmp_path / "graph.zip")
    with pytest.raises(CorruptDataError, match="holds a 'ComputationGraph', not a 'MultiLayerNetwork'"):
        MultiLayerNetwork.load(tmp_path / "graph.zip")


def test_clone_is_independent_and_identical():
    rng = np.random.default_rng(9)
    graph = _two_in_two_out()
    ds = _mds(rng)
    graph.fit(ds)
    copy = graph.clone()
    np.testing.assert_array_equal(copy.params(), graph.params())
    np.testing.assert_array_equal(copy.updater_state(), graph.updater_state())
    graph.fit(ds)
    copy.fit(ds)
    np.testing.assert_array_equal(copy.params(), graph.params())
    copy.params()[0] += 1.0
    assert copy.params()[0] != graph.params()[0]


def test_listeners_see_the_graph(caplog: pytest.LogCaptureFixture):
    graph = _two_in_two_out()
    graph.set_listeners(ScoreIterationListener(2))
    with caplog.at_level(logging.INFO, logger="sparkgrad.nn"):
        graph.fit(_mds(np.random.default_rng(10)), epochs=4)
    assert [r.getMessage().split(" is ")[0] for r in caplog.records] == [
        "Score at iteration 2 (epoch 1)",
        "Score at iteration 4 (epoch 3)",
    ]


def test_bad_data_raises_clear_errors():
    rng = np.random.default_rng(11)
    graph = _two_in_two_out()
    ds = _mds(rng)
    with pytest.raises(ValueError, match=r"features: the graph has 2 input\(s\) \['a', 'b'\], got 1 array"):
        graph.output(ds.features[0])
    with pytest.raises(
        ValueError, match=r"features\[1\] \(input 'b'\): expected shape \(batch, 3\), got \(8, 4\)"
    ):
        graph.output(ds.features[0], ds.features[0])
    with pytest.raises(ValueError, match=r"labels: the graph has 2 output\(s\) \['cls', 'reg'\], got 1"):
        graph.fit(MultiDataSet(ds.features, ds.labels[:1]))
    with pytest.raises(
        ValueError, match=r"labels\[1\] \(output 'reg'\): expected shape \(batch, 2\), got \(8, 3\)"
    ):
        graph.score(MultiDataSet(ds.features, [ds.labels[0], ds.labels[0]]))
    with pytest.raises(
        ValueError, match=r"labels_masks\[0\] \(output 'cls'\): expected shape \(8,\), \(8, 1\) or"
    ):
        graph.score(MultiDataSet(ds.features, ds.labels, labels_masks=[np.ones((8, 2)), None]))
    with pytest.raises(ValueError, match=r"features_masks\[1\]: expected a per-example mask"):
        graph.score(MultiDataSet(ds.features, ds.labels, features_masks=[None, np.ones((8, 3))]))
    with pytest.raises(ValueError, match="labels are required"):
        graph.fit(MultiDataSet(ds.features))
    with pytest.raises(ValueError, match="output_single: the graph has 2 outputs"):
        graph.output_single(*ds.features)
    with pytest.raises(TypeError, match="data: expected a DataSet or MultiDataSet, got dict"):
        graph.score({"features": 1})
    with pytest.raises(ValueError, match="not initialised"):
        ComputationGraph(graph.conf).params()
    with pytest.raises(TypeError, match="conf: expected a ComputationGraphConfiguration"):
        ComputationGraph(MultiLayerConfiguration([OutputLayer(2, n_in=2)]))


def test_non_finite_input_names_the_array_and_leaves_the_graph_unchanged():
    rng = np.random.default_rng(12)
    graph = _two_in_two_out()
    ds = _mds(rng)
    features = [f.copy() for f in ds.features]
    features[1][2, 1] = np.nan
    before, state = graph.params().copy(), graph.updater_state().copy()
    with pytest.raises(TrainingError, match=r"iteration 0: non-finite .*features\[1\]\[2, 1\] = nan"):
        graph.fit(MultiDataSet(features, ds.labels))
    np.testing.assert_array_equal(graph.params(), before)
    np.testing.assert_array_equal(graph.updater_state(), state)
    assert graph.iteration_count == 0


def test_flat_layout_follows_the_topological_order_and_summary_lists_it():
    graph = _two_in_two_out()
    sizes = {"da": 4 * 5 + 5, "db": 3 * 5 + 5, "cls": 9 * 3 + 3, "reg": 5 * 2 + 2}
    assert graph.num_params() == sum(sizes.values())
    offset = 0
    for name, (start, stop) in zip(graph._layer_keys, graph._layer_ranges):
        assert (start, stop) == (offset, offset + sizes[name])
        offset = stop
    assert graph._layer_keys == ["da", "db", "cls", "reg"]
    text = graph.summary()
    assert "cls-merge  MergeVertex" in text and "sum, a" in text
    assert text.endswith(f"Total parameters: {graph.num_params()} (float32)")
