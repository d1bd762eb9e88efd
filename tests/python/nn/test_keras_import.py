"""Keras import (issue 39 item 3): models built and saved by real Keras (JAX backend, CPU), imported from
both file formats, give Keras's outputs within float32 tolerance and train further."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
keras = pytest.importorskip("keras", reason="keras (test extra) is not installed: Keras import untested")
pytest.importorskip("h5py", reason="h5py (keras extra) is not installed")

from sparkgrad.data import DataSet  # noqa: E402
from sparkgrad.nn.keras import (  # noqa: E402
    KerasImportError,
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
    """The model saved in both formats, each imported, gives model.predict's output."""
    expected = model.predict(x, verbose=0)
    for fmt in FORMATS:
        net = import_keras_sequential_model_and_weights(_save(model, tmp_path, fmt))
        got = np.asarray(net.output(to_sparkgrad_layout(x, indices=indices)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=_tolerance(reduction, depth), err_msg=fmt)


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
