"""Keras import (issue 39 item 3): Sequential and Functional models built and saved by real Keras (JAX
backend, CPU), imported from both file formats, give Keras's outputs within float32 tolerance and train
further."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
keras = pytest.importorskip("keras", reason="keras (test extra) is not installed: Keras import untested")
pytest.importorskip("h5py", reason="h5py (keras extra) is not installed")

from sparkgrad.data import DataSet, MultiDataSet  # noqa: E402
from sparkgrad.nn import ComputationGraph, MultiLayerNetwork  # noqa: E402
from sparkgrad.nn.enums import LossFunction  # noqa: E402
from sparkgrad.nn.keras import (  # noqa: E402
    KerasImportError,
    import_keras_model_and_weights,
    import_keras_sequential_model_and_weights,
    to_sparkgrad_layout,
)

EPS = float(np.finfo(np.float32).eps)
FORMATS = ("keras", "h5")


def _tolerance(reduction: int, depth: int = 1) -> float:
    # float32 rounding of each dot product grows ~ with its length; depth layers compound it
    return 8 * EPS * reduction * depth


def _save(model, tmp_path, fmt):
    path = tmp_path / f"model.{fmt}"
    model.save(path)
    return path


def _check(model, tmp_path, x, reduction, depth, indices=False):
    """The Sequential model saved in both formats, each imported by both functions, gives
    model.predict's output."""
    expected = model.predict(x, verbose=0)
    for fmt in FORMATS:
        path = _save(model, tmp_path, fmt)
        for net in (import_keras_sequential_model_and_weights(path), import_keras_model_and_weights(path)):
            assert isinstance(net, MultiLayerNetwork)
            got = np.asarray(net.output(to_sparkgrad_layout(x, indices=indices)))
            np.testing.assert_allclose(got, expected, rtol=0, atol=_tolerance(reduction, depth), err_msg=fmt)


def _check_graph(model, tmp_path, xs, reduction, depth):
    """The Functional model saved in both formats, each imported into a ComputationGraph, gives
    model.predict's outputs (one per model output); returns the last graph."""
    expected = model.predict(xs if len(xs) > 1 else xs[0], verbose=0)
    expected = expected if isinstance(expected, list) else [expected]
    for fmt in FORMATS:
        net = import_keras_model_and_weights(_save(model, tmp_path, fmt))
        assert isinstance(net, ComputationGraph)
        got = net.output(*(to_sparkgrad_layout(x) for x in xs))
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(
                g, e, rtol=0, atol=_tolerance(reduction, depth), err_msg=f"{fmt} output {i}"
            )
    return net


def _normal(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def test_mlp(tmp_path):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(16),
            keras.layers.Activation("tanh"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    # moved statistics so that the running mean/variance (not the defaults) decide the output
    bn = model.layers[1]
    bn.moving_mean.assign(np.random.default_rng(0).normal(size=32).astype("float32"))
    bn.moving_variance.assign(np.random.default_rng(1).uniform(0.5, 2, size=32).astype("float32"))
    x = np.random.default_rng(2).normal(size=(20, 12)).astype("float32")
    _check(model, tmp_path, x, reduction=32, depth=3)


def test_cnn(tmp_path):
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [
            keras.Input((10, 9, 3)),
            keras.layers.Conv2D(6, (3, 3), activation="relu", padding="same"),
            keras.layers.MaxPooling2D((2, 2)),
            keras.layers.Conv2D(5, (2, 3), strides=(1, 2), activation="relu"),
            keras.layers.AveragePooling2D((2, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    x = np.random.default_rng(3).normal(size=(6, 10, 9, 3)).astype("float32")
    _check(model, tmp_path, x, reduction=60, depth=3)


def test_global_pooling_cnn(tmp_path):
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 2)),
            keras.layers.Conv2D(4, (3, 3), activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2, activation="sigmoid"),
        ]
    )
    x = np.random.default_rng(4).normal(size=(5, 8, 8, 2)).astype("float32")
    _check(model, tmp_path, x, reduction=36, depth=3)


def _text_model(recurrent):
    return keras.Sequential(
        [
            keras.Input((7,), dtype="int32"),
            keras.layers.Embedding(30, 8),
            recurrent,
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple_rnn", "lstm_seq"])
def test_text_models(tmp_path, kind):
    keras.utils.set_random_seed(4)
    layer = {
        "lstm": lambda: keras.layers.LSTM(6),
        "gru": lambda: keras.layers.GRU(6, reset_after=False),
        "simple_rnn": lambda: keras.layers.SimpleRNN(6),
        "lstm_seq": lambda: keras.layers.LSTM(6, return_sequences=True),
    }[kind]()
    if kind == "lstm_seq":
        model = keras.Sequential(
            [
                keras.Input((7,), dtype="int32"),
                keras.layers.Embedding(30, 8),
                layer,
                keras.layers.GlobalMaxPooling1D(),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )
    else:
        model = _text_model(layer)
    # non-zero biases so that every gate block's place is tested
    for w in model.layers[1].weights:
        if len(w.shape) == 1:
            w.assign(np.random.default_rng(5).normal(size=w.shape).astype("float32"))
    x = np.random.default_rng(6).integers(0, 30, size=(9, 7)).astype("int32")
    _check(model, tmp_path, x, reduction=14 * 7, depth=2, indices=True)


def test_gru_reset_after_is_refused(tmp_path):
    model = _text_model(keras.layers.GRU(4))  # Keras 3's default reset_after=True
    with pytest.raises(KerasImportError, match="reset_after"):
        import_keras_sequential_model_and_weights(_save(model, tmp_path, "keras"))


def test_unsupported_layer_and_option_are_named(tmp_path):
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activation="gelu"), keras.layers.Dense(1)]
    )
    with pytest.raises(KerasImportError, match=r"'dense[_0-9]*' \(Dense\).*activation='gelu'"):
        import_keras_sequential_model_and_weights(_save(model, tmp_path, "keras"))
    model = keras.Sequential([keras.Input((4,)), keras.layers.GaussianNoise(0.1), keras.layers.Dense(1)])
    with pytest.raises(KerasImportError, match="GaussianNoise"):
        import_keras_sequential_model_and_weights(_save(model, tmp_path, "h5"))


def test_imported_network_trains_further(tmp_path):
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    net = import_keras_sequential_model_and_weights(_save(model, tmp_path, "keras"), seed=0)
    rng = np.random.default_rng(8)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = np.eye(3, dtype="float32")[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)]
    data = DataSet(x, y)
    before = net.score(data)
    net.fit(data, epochs=20)
    after = net.score(data)
    assert after < 0.9 * before, (before, after)


def test_padding_cropping_upsampling(tmp_path):
    keras.utils.set_random_seed(9)
    model = keras.Sequential(
        [
            keras.Input((6, 5, 2)),
            keras.layers.ZeroPadding2D(((1, 2), (0, 1))),
            keras.layers.Conv2D(3, (3, 3), activation="relu"),
            keras.layers.UpSampling2D((2, 1)),
            keras.layers.Cropping2D(((1, 0), (0, 2))),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    x = np.random.default_rng(10).normal(size=(4, 6, 5, 2)).astype("float32")
    _check(model, tmp_path, x, reduction=18 * 4, depth=2)


def test_conv1d_time_series(tmp_path):
    keras.utils.set_random_seed(11)
    model = keras.Sequential(
        [
            keras.Input((16, 3)),
            keras.layers.Conv1D(5, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling1D(2),
            keras.layers.Conv1D(4, 2, strides=2, activation="tanh"),
            keras.layers.AveragePooling1D(2),
            keras.layers.GlobalMaxPooling1D(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    x = np.random.default_rng(12).normal(size=(5, 16, 3)).astype("float32")
    _check(model, tmp_path, x, reduction=10, depth=3)


def test_sequential_reshape_to_images_needs_a_graph(tmp_path):
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(12),
            keras.layers.Reshape((2, 3, 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    with pytest.raises(KerasImportError, match=r"'reshape[_0-9]*' \(Reshape\).*Functional"):
        import_keras_sequential_model_and_weights(_save(model, tmp_path, "keras"))


def test_layer_normalization_sequential(tmp_path):
    keras.utils.set_random_seed(13)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.LayerNormalization(epsilon=1e-2),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    for i, w in enumerate(model.layers[1].weights):  # gain and bias away from their 1 and 0
        w.assign(_normal(14 + i, *w.shape) + 1.0)
    _check(model, tmp_path, _normal(15, 6, 6), reduction=8, depth=3)
    model = keras.Sequential(
        [
            keras.Input((3, 3, 2)),
            keras.layers.Flatten(),
            keras.layers.LayerNormalization(name="norm"),
            keras.layers.Dense(1),
        ]
    )
    with pytest.raises(KerasImportError, match="'norm'.*follows a Flatten"):
        import_keras_sequential_model_and_weights(_save(model, tmp_path, "keras"))


def test_normalization_after_flatten_in_a_graph(tmp_path):
    keras.utils.set_random_seed(16)
    x = keras.Input((3, 3, 2))
    norm = keras.layers.LayerNormalization()
    batch_norm = keras.layers.BatchNormalization()
    # the normalized features in Keras's (h, w, c) order: their parameters permuted to sparkgrad's
    h = batch_norm(norm(keras.layers.Flatten()(x)))
    model = keras.Model(x, keras.layers.Dense(3, activation="softmax")(h))
    for i, w in enumerate(norm.weights + batch_norm.weights):
        w.assign(np.abs(_normal(17 + i, *w.shape)) + 0.5)
    _check_graph(model, tmp_path, [_normal(18, 6, 3, 3, 2)], reduction=18, depth=3)


# -- Functional models -> ComputationGraph -------------------------------------------------------------
def test_two_inputs_concatenate(tmp_path):
    keras.utils.set_random_seed(20)
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(5, activation="tanh")(a)
    merged = keras.layers.Concatenate()([b, h])  # b first: the merge order is checked
    out = keras.layers.Dense(3, activation="softmax")(merged)
    model = keras.Model([a, b], out)
    net = _check_graph(model, tmp_path, [_normal(21, 8, 6), _normal(22, 8, 3)], reduction=8, depth=2)
    assert net.conf.inputs == ["a", "b"]
    assert net.conf.spec(net.conf.outputs[0]).vertex.loss is LossFunction.MCXENT


def test_residual_block_add(tmp_path):
    keras.utils.set_random_seed(23)
    x = keras.Input((8,))
    h = keras.layers.Dense(8, activation="relu")(x)
    r = keras.layers.Dense(8)(h)
    s = keras.layers.Activation("relu")(keras.layers.Add()([h, r]))
    model = keras.Model(x, keras.layers.Dense(2, activation="sigmoid")(s))
    _check_graph(model, tmp_path, [_normal(24, 10, 8)], reduction=8, depth=4)


def test_element_wise_merges(tmp_path):
    keras.utils.set_random_seed(25)
    a, b = keras.Input((5,)), keras.Input((5,))
    merged = keras.layers.Concatenate()(
        [
            keras.layers.Subtract()([a, b]),  # a - b: the input order is checked
            keras.layers.Multiply()([a, b]),
            keras.layers.Average()([a, b, a]),
            keras.layers.Maximum()([b, a]),
        ]
    )
    model = keras.Model([a, b], keras.layers.Dense(2)(merged))
    _check_graph(model, tmp_path, [_normal(26, 7, 5), _normal(27, 7, 5)], reduction=20, depth=2)


def test_multi_output_losses_and_training(tmp_path):
    keras.utils.set_random_seed(28)
    x = keras.Input((10,))
    trunk = keras.layers.Dense(12, activation="relu")(x)
    cls = keras.layers.Dense(3, activation="softmax", name="cls")(trunk)
    reg = keras.layers.Dense(2, name="reg")(trunk)
    model = keras.Model(x, [cls, reg])
    net = _check_graph(model, tmp_path, [_normal(29, 6, 10)], reduction=12, depth=2)
    assert net.conf.outputs == ["cls", "reg"]
    assert [net.conf.spec(n).vertex.loss for n in net.conf.outputs] == [LossFunction.MCXENT, LossFunction.MSE]
    # the compiled losses decide where there are some
    model.compile(loss={"cls": "categorical_crossentropy", "reg": "mae"})
    for fmt in FORMATS:
        net = import_keras_model_and_weights(_save(model, tmp_path, fmt), seed=0)
        assert [net.conf.spec(n).vertex.loss for n in net.conf.outputs] == [
            LossFunction.MCXENT,
            LossFunction.L1,
        ]
    features = _normal(30, 64, 10)
    labels = [np.eye(3, dtype="float32")[(features[:, 0] > 0).astype(int) * 2], features[:, 1:3].copy()]
    data = MultiDataSet([features], labels)
    before = net.score(data)
    net.fit(data, epochs=20)
    assert net.score(data) < 0.9 * before


def test_reshape_between_vectors_and_images(tmp_path):
    keras.utils.set_random_seed(31)
    a, b = keras.Input((7,)), keras.Input((3, 3, 2))
    # a Dense feeding a Reshape to images: its units are emitted in sparkgrad's (c, h, w) order
    h = keras.layers.Reshape((2, 3, 4))(keras.layers.Dense(24, activation="relu")(a))
    h = keras.layers.Conv2D(3, (2, 2), padding="same", activation="relu")(h)
    h = keras.layers.Reshape((-1,))(h)  # images -> vectors, as a Flatten
    # a Flatten and a Reshape back to the same images
    g = keras.layers.Reshape((3, 3, 2))(keras.layers.Flatten()(b))
    g = keras.layers.Flatten()(keras.layers.Conv2D(2, (2, 2), activation="tanh")(g))
    merged = keras.layers.Concatenate()([h, g])  # two flattened images: the Dense's rows permuted twice
    model = keras.Model([a, b], keras.layers.Dense(2)(merged))
    _check_graph(model, tmp_path, [_normal(32, 5, 7), _normal(33, 5, 3, 3, 2)], reduction=26, depth=4)


def test_conv_skip_connection(tmp_path):
    keras.utils.set_random_seed(34)
    x = keras.Input((8, 8, 3))
    c1 = keras.layers.Conv2D(4, (3, 3), padding="same", activation="relu")(x)
    c2 = keras.layers.Conv2D(4, (3, 3), padding="same")(c1)
    s = keras.layers.Activation("relu")(keras.layers.Add()([c1, c2]))
    merged = keras.layers.Concatenate(axis=-1)(
        [keras.layers.MaxPooling2D((2, 2))(s), keras.layers.AveragePooling2D((2, 2))(c1)]
    )
    out = keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(merged))
    model = keras.Model(x, out)
    _check_graph(model, tmp_path, [_normal(35, 4, 8, 8, 3)], reduction=128, depth=4)


def test_layer_normalization_on_sequences(tmp_path):
    keras.utils.set_random_seed(36)
    x = keras.Input((5, 4))
    h = keras.layers.LSTM(6, return_sequences=True)(x)
    norm = keras.layers.LayerNormalization(center=False)
    h = keras.layers.GlobalAveragePooling1D()(norm(h))
    model = keras.Model(x, keras.layers.Dense(2)(h))
    norm.gamma.assign(_normal(37, 6) + 1.0)
    net = _check_graph(model, tmp_path, [_normal(38, 3, 5, 4)], reduction=4 * 5, depth=3)
    assert not net.conf.spec(norm.name).vertex.has_bias


def test_functional_refusals_name_the_layer(tmp_path):
    x = keras.Input((4, 4, 2))
    c = keras.layers.Conv2D(2, (1, 1))(x)
    bad_axis = keras.layers.Concatenate(axis=1, name="rows")([c, x])
    model = keras.Model(x, keras.layers.Dense(1)(keras.layers.Flatten()(bad_axis)))
    with pytest.raises(KerasImportError, match=r"'rows' \(Concatenate\).*axis.*=1"):
        import_keras_model_and_weights(_save(model, tmp_path, "keras"))

    v = keras.Input((4,))
    noisy = keras.layers.GaussianNoise(0.1, name="noise")(v)
    model = keras.Model(v, keras.layers.Dense(1)(noisy))
    with pytest.raises(KerasImportError, match="'noise'.*GaussianNoise"):
        import_keras_model_and_weights(_save(model, tmp_path, "h5"))

    shared = keras.layers.Dense(4, name="shared")
    model = keras.Model(v, keras.layers.Dense(1)(shared(shared(v))))
    with pytest.raises(KerasImportError, match="'shared'.*called 2 times"):
        import_keras_model_and_weights(_save(model, tmp_path, "keras"))

    model = keras.Model(x, keras.layers.Reshape((8, 4), name="squash")(x))
    with pytest.raises(KerasImportError, match="'squash'.*must be a Dense"):
        import_keras_model_and_weights(_save(model, tmp_path, "keras"))

    squash = keras.layers.Flatten()(keras.layers.Reshape((2, 4, 4), name="squash")(x))
    model = keras.Model(x, keras.layers.Dense(1)(squash))
    with pytest.raises(KerasImportError, match=r"'squash' \(Reshape\).*reshape"):
        import_keras_model_and_weights(_save(model, tmp_path, "keras"))

    with pytest.raises(KerasImportError, match="not Sequential"):
        import_keras_sequential_model_and_weights(_save(model, tmp_path, "keras"))


def test_compiled_losses_that_do_not_map_are_named(tmp_path):
    v = keras.Input((4,))
    model = keras.Model(v, keras.layers.Dense(2, name="counts")(v))
    model.compile(loss="poisson")
    with pytest.raises(KerasImportError, match="'counts'.*loss='poisson'"):
        import_keras_model_and_weights(_save(model, tmp_path, "keras"))
    # from_logits: Keras's outputs are logits, the loss applies the softmax: no OutputLayer computes that
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    with pytest.raises(KerasImportError, match="'counts'.*from_logits"):
        import_keras_model_and_weights(_save(model, tmp_path, "h5"))


def test_text_graph_with_two_inputs(tmp_path):
    keras.utils.set_random_seed(39)
    tokens, extra = keras.Input((6,), dtype="int32"), keras.Input((6, 2))
    embedded = keras.layers.Embedding(20, 5)(tokens)
    sequence = keras.layers.Concatenate()([embedded, extra])  # features of every time step
    h = keras.layers.GRU(4, reset_after=False)(sequence)
    model = keras.Model([tokens, extra], keras.layers.Dense(2, activation="softmax")(h))
    for w in model.layers[-2].weights:  # non-zero biases
        if len(w.shape) == 1:
            w.assign(_normal(40, *w.shape))
    x = np.random.default_rng(41).integers(0, 20, size=(5, 6)).astype("int32")
    xs = [x, _normal(42, 5, 6, 2)]
    expected = model.predict(xs, verbose=0)
    inputs = [to_sparkgrad_layout(x, indices=True), to_sparkgrad_layout(xs[1])]
    for fmt in FORMATS:
        net = import_keras_model_and_weights(_save(model, tmp_path, fmt))
        got = net.output_single(*inputs)
        np.testing.assert_allclose(got, expected, rtol=0, atol=_tolerance(11 * 6, 2), err_msg=fmt)
        # the imported configuration is ordinary data: it round-trips and rebuilds the same network
        conf = type(net.conf).from_json(net.conf.to_json())
        assert conf.to_yaml() == net.conf.to_yaml()
        again = ComputationGraph(conf).init(params=net.params())
        np.testing.assert_array_equal(again.output_single(*inputs), got)
