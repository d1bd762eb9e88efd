"""MultiLayerNetwork: flat buffers, training bookkeeping, persistence, errors, evaluation."""

from __future__ import annotations

import io
import logging
import threading
import zipfile

import numpy as np
import pytest

from sparkgrad.data import DataSet, ListDataSetIterator
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn import (
    BatchNormalization,
    ConvolutionLayer,
    DenseLayer,
    DropoutLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    ScoreIterationListener,
    SubsamplingLayer,
    TrainingListener,
    updaters,
)


def _data(seed: int = 0, n: int = 32, n_in: int = 6, n_out: int = 3, dtype=np.float32) -> DataSet:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_in)).astype(dtype)
    y = np.eye(n_out, dtype=dtype)[np.argmax(x[:, :n_out], axis=1)]
    return DataSet(x, y)


def _mlp(updater=None, dtype: str = "float32", **kwargs) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [
            DenseLayer(8, activation="relu", dropout=0.9),
            BatchNormalization(),
            DenseLayer(7, activation="tanh", updater=updaters.Nesterovs(0.05)),
            OutputLayer(3),
        ],
        input_type=InputType.feed_forward(6),
        updater=updater or updaters.Adam(0.01),
        seed=7,
        dtype=dtype,
        **kwargs,
    )
    return MultiLayerNetwork(conf).init()


def test_params_is_one_live_buffer_and_layers_are_views() -> None:
    net = _mlp()
    flat = net.params()
    assert flat.ndim == 1 and flat.flags.c_contiguous and flat.dtype == np.float32
    assert net.num_params() == flat.size == (6 * 8 + 8) + 4 * 8 + (8 * 7 + 7) + (7 * 3 + 3)
    assert net.params() is flat
    w0 = net._runtimes[0].params["W"]
    assert np.shares_memory(w0, flat)
    flat[0] = 123.0
    assert w0[0, 0] == 123.0
    before = net.output(_data().features)
    flat[:] = 0.0  # layers see the change: every output row is now the uniform softmax
    np.testing.assert_allclose(net.output(_data().features), 1.0 / 3.0, rtol=1e-6)
    assert not np.allclose(before, 1.0 / 3.0)


def test_set_params_copies_into_the_buffer() -> None:
    net = _mlp()
    flat = net.params()
    new = np.arange(net.num_params(), dtype=np.float64) * 1e-3
    net.set_params(new)
    assert net.params() is flat
    np.testing.assert_allclose(flat, new.astype(np.float32))
    new[0] = 99.0
    assert flat[0] != 99.0
    with pytest.raises(ValueError, match="params: expected a flat vector of length"):
        net.set_params(np.zeros(3))


def test_dtype_float64_by_configuration() -> None:
    net = _mlp(dtype="float64")
    assert net.params().dtype == np.float64
    assert net.output(_data().features).dtype == np.float64
    _, score = net.compute_update(_data(dtype=np.float64))
    assert np.isfinite(score)


def test_seeded_initialisation_is_reproducible() -> None:
    a, b = _mlp(), _mlp()
    np.testing.assert_array_equal(a.params(), b.params())
    ds = _data()
    a.fit(ds, epochs=3)
    b.fit(ds, epochs=3)
    np.testing.assert_array_equal(a.params(), b.params())


def test_fit_equals_apply_update_of_compute_update() -> None:
    ds = _data()
    a, b = _mlp(), _mlp()
    for _ in range(4):
        a.fit(ds)
        update, score = b.compute_update(ds)
        b.apply_update(update)
        assert a.score() == pytest.approx(score)
    np.testing.assert_array_equal(a.params(), b.params())
    np.testing.assert_array_equal(a.updater_state(), b.updater_state())
    assert a.iteration_count == b.iteration_count == 4


def test_compute_update_advances_state_but_not_params() -> None:
    net = _mlp()
    params = net.params().copy()
    update, _ = net.compute_update(_data())
    np.testing.assert_array_equal(net.params(), params)
    assert net.iteration_count == 1
    assert np.any(net.updater_state() != 0)
    assert update.shape == params.shape and np.any(update != 0)


def test_batchnorm_running_statistics_travel_in_the_update() -> None:
    net = _mlp()
    bn = net._runtimes[1]
    mean_view = bn.params["mean"]
    ds = _data()
    grad, _ = net.compute_gradient_and_score(ds)
    start = net._stats[0][0]
    assert np.all(grad[start] == 0)  # the running statistics are not trained
    update, _ = net.compute_update(ds)
    expected_new = bn.new_mean.copy()
    np.testing.assert_array_equal(mean_view, 0.0)
    net.apply_update(update)
    np.testing.assert_allclose(mean_view, expected_new, rtol=1e-6)
    # running mean = decay * 0 + (1 - decay) * batch mean of the BN input
    np.testing.assert_allclose(mean_view, 0.1 * bn.batch_mean, rtol=1e-5)


def test_shared_updater_uses_one_block_and_mixed_updaters_use_slices() -> None:
    shared = MultiLayerNetwork(
        MultiLayerConfiguration([DenseLayer(4, n_in=3), OutputLayer(2)], updater=updaters.Adam(0.01))
    ).init()
    assert len(shared._blocks) == 1
    assert shared.updater_state().size == 2 * shared.num_params()
    net = _mlp()  # Adam, Adam, Nesterovs, Adam
    assert [type(b.updater).__name__ for b in net._blocks] == ["Adam", "Nesterovs", "Adam"]
    sizes = [(6 * 8 + 8) + 4 * 8, 8 * 7 + 7, 7 * 3 + 3]
    assert net.updater_state().size == 2 * sizes[0] + sizes[1] + 2 * sizes[2]


def test_sgd_update_matches_hand_computation_with_l2_and_weight_decay() -> None:
    conf = MultiLayerConfiguration(
        [OutputLayer(2, n_in=3, activation="identity", loss="mse")],
        updater=updaters.Sgd(0.1),
        l2=0.5,
        weight_decay=0.25,
        seed=1,
        dtype="float64",
    )
    net = MultiLayerNetwork(conf).init()
    ds = _data(n=5, n_in=3, n_out=2, dtype=np.float64)
    grad, score = net.compute_gradient_and_score(ds)
    w = net.params()[:6].copy()
    update, _ = net.compute_update(ds)
    expected = 0.1 * (grad[:6] + 0.5 * w) + 0.25 * 0.1 * w
    np.testing.assert_allclose(update[:6], expected, rtol=1e-12)
    np.testing.assert_allclose(update[6:], 0.1 * grad[6:], rtol=1e-12)  # biases: no regularization
    loss_only = net.score_examples(ds).mean()
    assert score == pytest.approx(loss_only + 0.25 * np.sum(w * w))


def test_score_and_score_examples() -> None:
    net = _mlp(l1=0.01)
    ds = _data()
    with pytest.raises(ValueError, match="no minibatch"):
        net.score()
    examples = net.score_examples(ds)
    assert examples.shape == (32,)
    penalty = net._penalty()
    assert penalty > 0
    assert net.score(ds) == pytest.approx(examples.mean() + penalty, rel=1e-6)
    np.testing.assert_allclose(net.score_examples(ds, include_regularization_terms=True), examples + penalty)
    net.fit(ds)
    assert np.isfinite(net.score())


def test_training_reduces_score_and_counts_epochs() -> None:
    net = _mlp()
    ds = _data(n=64)
    it = ListDataSetIterator(ds, batch_size=16)
    first = net.score(ds)
    net.fit(it, epochs=5)
    assert net.iteration_count == 20 and net.epoch_count == 5
    assert net.score(ds) < first


def test_listeners_are_called_and_score_listener_logs(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    class Recorder(TrainingListener):
        def iteration_done(self, model, iteration, epoch):
            calls.append((iteration, epoch))

    net = _mlp()
    net.set_listeners(Recorder(), ScoreIterationListener(print_every_n=2))
    with caplog.at_level(logging.INFO, logger="sparkgrad.nn"):
        net.fit([_data(1), _data(2), _data(3)], epochs=2)
    assert calls == [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1)]
    assert sum("Score at iteration" in r.message for r in caplog.records) == 3
    with pytest.raises(TypeError, match="listeners"):
        net.set_listeners(object())


def test_fit_rejects_one_shot_iterator_for_several_epochs() -> None:
    net = _mlp()
    with pytest.raises(ValueError, match="one-shot iterator"):
        net.fit(iter([_data()]), epochs=2)
    with pytest.raises(ValueError, match="epochs"):
        net.fit(_data(), epochs=0)


def test_save_load_is_exact_and_training_continues_identically(tmp_path) -> None:
    ds = _data()
    net = _mlp()
    net.fit(ds, epochs=3)
    path = tmp_path / "model.zip"
    net.save(path)
    with zipfile.ZipFile(path) as zf:
        assert {"configuration.json", "coefficients.bin", "updaterState.bin", "sparkgrad-format.json"} <= set(
            zf.namelist()
        )
    loaded = MultiLayerNetwork.load(path)
    assert loaded.conf == net.conf
    np.testing.assert_array_equal(loaded.params(), net.params())
    np.testing.assert_array_equal(loaded.updater_state(), net.updater_state())
    assert (loaded.iteration_count, loaded.epoch_count) == (3, 3)
    np.testing.assert_array_equal(loaded.output(ds.features), net.output(ds.features))
    net.fit(ds, epochs=2)
    loaded.fit(ds, epochs=2)
    np.testing.assert_array_equal(loaded.params(), net.params())


def test_save_to_binary_file_without_updater() -> None:
    net = _mlp()
    net.fit(_data())
    buf = io.BytesIO()
    net.save(buf, save_updater=False)
    buf.seek(0)
    loaded = MultiLayerNetwork.load(buf)
    np.testing.assert_array_equal(loaded.params(), net.params())
    assert not np.any(loaded.updater_state())


def test_load_rejects_foreign_and_corrupt_files_naming_the_file(tmp_path) -> None:
    garbage = tmp_path / "garbage.zip"
    garbage.write_bytes(b"not a zip at all")
    with pytest.raises(CorruptDataError, match="garbage.zip"):
        MultiLayerNetwork.load(garbage)
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(CorruptDataError, match="foreign.zip.*missing"):
        MultiLayerNetwork.load(foreign)
    good = tmp_path / "good.zip"
    _mlp().save(good)
    truncated = tmp_path / "truncated.zip"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(truncated, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data[: len(data) // 2] if name == "coefficients.bin" else data)
    with pytest.raises(CorruptDataError, match="truncated.zip"):
        MultiLayerNetwork.load(truncated)


def test_clone_is_independent_and_identical() -> None:
    net = _mlp()
    ds = _data()
    net.fit(ds)
    twin = net.clone()
    assert twin.params() is not net.params()
    np.testing.assert_array_equal(twin.params(), net.params())
    np.testing.assert_array_equal(twin.updater_state(), net.updater_state())
    net.fit(ds)
    twin.fit(ds)
    np.testing.assert_array_equal(twin.params(), net.params())
    twin.params()[:] = 0
    assert np.any(net.params() != 0)


def test_updater_state_round_trip_and_validation() -> None:
    net = _mlp()
    net.fit(_data())
    state = net.updater_state().copy()
    other = _mlp()
    other.set_updater_state(state)
    np.testing.assert_array_equal(other.updater_state(), state)
    with pytest.raises(ValueError, match="updater state"):
        other.set_updater_state(state[:-1])


def test_summary_lists_layers_shapes_and_counts() -> None:
    text = _mlp().summary()
    assert "DenseLayer" in text and "BatchNormalization" in text and "OutputLayer" in text
    assert "W[6, 8]" in text and f"Total parameters: {_mlp().num_params()}" in text


def test_bad_shapes_raise_clear_errors() -> None:
    net = _mlp()
    with pytest.raises(ValueError, match=r"features: expected shape \(batch, 6\)"):
        net.output(np.zeros((4, 5), np.float32))
    bad_labels = DataSet(np.zeros((4, 6), np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"layers\[3\] \(OutputLayer\)\.n_out: is 3 but the labels"):
        net.fit(bad_labels)
    params = net.params().copy()
    with pytest.raises(ValueError, match="labels"):
        net.compute_update(DataSet(np.zeros((4, 6), np.float32)))
    assert net.iteration_count == 0  # a rejected batch changes nothing
    with pytest.raises(ValueError, match="update"):
        net.apply_update(np.zeros(3, np.float32))
    np.testing.assert_array_equal(net.params(), params)
    with pytest.raises(ValueError, match="init"):
        MultiLayerNetwork(net.conf).params()


def test_convolutional_flat_input_is_reshaped_to_nchw() -> None:
    conf = MultiLayerConfiguration(
        [ConvolutionLayer(2, kernel_size=(2, 2)), SubsamplingLayer(), OutputLayer(3)],
        input_type=InputType.convolutional_flat(4, 4, 2),
        seed=3,
    )
    image_conf = MultiLayerConfiguration.from_json(
        conf.to_json().replace('"convolutional_flat"', '"convolutional"')
    )
    flat_net = MultiLayerNetwork(conf).init()
    image_net = MultiLayerNetwork(image_conf).init(flat_net.params())
    x = np.random.default_rng(0).random((5, 2, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(flat_net.output(x.reshape(5, -1)), image_net.output(x))


def test_dropout_only_in_training_and_reproducible() -> None:
    conf = MultiLayerConfiguration(
        [DenseLayer(16, n_in=6, activation="identity"), DropoutLayer(0.5), OutputLayer(3)], seed=5
    )
    net = MultiLayerNetwork(conf).init()
    x = _data().features
    np.testing.assert_array_equal(net.output(x), net.output(x))
    assert not np.allclose(net.output(x, train=True), net.output(x))
    np.testing.assert_array_equal(net.output(x, train=True), net.output(x, train=True))


def test_evaluate_family() -> None:
    net = _mlp()
    ds = _data(n=64)
    net.fit(ds, epochs=30)
    ev = net.evaluate(ds)
    assert 0.0 <= ev.accuracy() <= 1.0
    assert ev.accuracy() > 0.6
    roc = net.evaluate_roc_multi_class(ListDataSetIterator(ds, batch_size=20))
    assert 0.5 < roc.calculate_average_auc() <= 1.0
    reg = net.evaluate_regression(ds)
    assert reg.average_mean_squared_error() < 0.25
    a, b = net.do_evaluation(ds, type(ev)(), type(reg)())
    assert a.accuracy() == ev.accuracy()


def test_binary_roc_evaluation() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 3)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    conf = MultiLayerConfiguration(
        [OutputLayer(1, n_in=3, activation="sigmoid", loss="xent")], updater=updaters.Sgd(0.5), seed=0
    )
    net = MultiLayerNetwork(conf).init().fit(DataSet(x, y), epochs=50)
    assert net.evaluate_roc(DataSet(x, y)).calculate_auc() > 0.95


def test_networks_train_in_parallel_threads_like_sequentially() -> None:
    datasets = [_data(seed) for seed in range(4)]
    expected = []
    for ds in datasets:
        net = _mlp()
        net.fit(ds, epochs=3)
        expected.append(net.params().copy())
    nets = [_mlp() for _ in datasets]
    threads = [
        threading.Thread(target=n.fit, args=(ds,), kwargs={"epochs": 3}) for n, ds in zip(nets, datasets)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for net, params in zip(nets, expected):
        np.testing.assert_array_equal(net.params(), params)


@pytest.mark.parametrize(
    "updater",
    [
        updaters.Sgd(0.1),
        updaters.Nesterovs(0.05),
        updaters.Adam(0.01),
        updaters.AdaMax(0.01),
        updaters.Nadam(0.01),
        updaters.AmsGrad(0.01),
        updaters.RmsProp(0.01),
        updaters.AdaGrad(0.1),
        updaters.AdaDelta(),
    ],
    ids=lambda u: type(u).__name__,
)
def test_every_updater_trains(updater: updaters.Updater) -> None:
    conf = MultiLayerConfiguration(
        [DenseLayer(8, n_in=6, activation="tanh"), OutputLayer(3)], updater=updater, seed=4, l1=1e-4
    )
    net = MultiLayerNetwork(conf).init()
    ds = _data(n=48)
    first = net.score(ds)
    net.fit(ds, epochs=40)
    assert net.score(ds) < first
    assert net.updater_state().size == updater.state_size(net.num_params())


def test_noop_updater_leaves_parameters_unchanged() -> None:
    conf = MultiLayerConfiguration(
        [OutputLayer(3, n_in=6)], updater=updaters.NoOp(), weight_decay=0.1, seed=1
    )
    net = MultiLayerNetwork(conf).init()
    before = net.params().copy()
    net.fit(_data(), epochs=3)
    np.testing.assert_array_equal(net.params(), before)
    assert net.iteration_count == 3


def test_recurrent_input_applies_layers_per_time_step() -> None:
    conf = MultiLayerConfiguration(
        [DenseLayer(5, activation="tanh"), OutputLayer(3)], input_type=InputType.recurrent(4), seed=2
    )
    net = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 4, 6)).astype(np.float32)
    out = net.output(x)
    assert out.shape == (2, 3, 6)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
    # time step t of example n equals the feed-forward output of that column alone
    ff = MultiLayerNetwork(
        MultiLayerConfiguration(
            [DenseLayer(5, activation="tanh"), OutputLayer(3)], input_type=InputType.feed_forward(4)
        )
    ).init(net.params())
    # Same kernels, different GEMM shapes (12 rows against 1), so only float32 rounding may differ.
    # Per layer a = h W + b rounds n_in + 1 times: |da| <= gamma(n_in + 1) (|h| |W| + |b|) + |dh| |W|;
    # tanh is 1-Lipschitz (plus a few ulps of its own); softmax moves p_k by <= 2 p_k max|dz| plus its
    # C + 5 roundings. Twice the one-sided bound covers the two computations.
    u = 2.0**-24

    def gamma(n: int) -> float:
        return n * u / (1 - n * u)

    flat = net.params().astype(np.float64)
    assert flat.size == (4 * 5 + 5) + (5 * 3 + 3)  # W1, b1, W2, b2 in this order
    w1, b1 = flat[:20].reshape(4, 5), flat[20:25]
    w2, b2 = flat[25:40].reshape(5, 3), flat[40:43]
    col = x[1:2, :, 4].astype(np.float64)
    h = np.tanh(col @ w1 + b1)
    dh = gamma(5) * (np.abs(col) @ np.abs(w1) + np.abs(b1)) + gamma(4) * np.abs(h)
    z = h @ w2 + b2
    dz = gamma(6) * (np.abs(h) @ np.abs(w2) + np.abs(b2)) + dh @ np.abs(w2)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    bound = 2 * p * (2 * dz.max() + gamma(3 + 5))
    assert np.all(np.abs(out[1, :, 4] - ff.output(x[1:2, :, 4])[0]) <= bound[0])
    labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (2, 6))].transpose(0, 2, 1)
    scores = net.score_examples(DataSet(x, labels))
    assert scores.shape == (2,)
    # every (example, time step) is one evaluated row: the confusion matrix counts the output's argmax
    # over the classes against the label's, 2 x 6 = 12 rows in all
    evaluation = net.evaluate(DataSet(x, labels))
    expected = np.zeros((3, 3), np.int64)
    np.add.at(expected, (labels.argmax(axis=1).ravel(), out.argmax(axis=1).ravel()), 1)
    np.testing.assert_array_equal(evaluation.confusion_matrix(), expected)
    assert evaluation.num_rows() == 12
    assert evaluation.accuracy() == np.trace(expected) / 12
