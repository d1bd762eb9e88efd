"""Float64 gradient checks: compute_gradient_and_score against central differences of the score,
through whole networks, for every layer type, activation and loss."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.data import DataSet
from sparkgrad.nn import (
    ActivationLayer,
    BatchNormalization,
    ConvolutionLayer,
    Cropping2D,
    Deconvolution2D,
    DenseLayer,
    DropoutLayer,
    GlobalPoolingLayer,
    InputType,
    LossLayer,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SubsamplingLayer,
    Upsampling2D,
    ZeroPaddingLayer,
)

EPS = 1e-6
MAX_REL_ERROR = 1e-5
MIN_MAGNITUDE = 1e-8  # entries whose analytic and numeric values are both below this are round-off


def _max_relative_error(net: MultiLayerNetwork, ds: DataSet, regularized: bool = False) -> float:
    """Worst relative error between the analytic and the central-difference gradient over all params."""
    grad, _ = net.compute_gradient_and_score(ds)
    if regularized:  # the score carries l1/l2 penalties; the gradient gets them in compute_update
        for w, _, i in net._weights:
            l1, l2 = net.conf.setting(i, "l1"), net.conf.setting(i, "l2")
            start = w.__array_interface__["data"][0] - net.params().__array_interface__["data"][0]
            sl = slice(start // 8, start // 8 + w.size)
            grad[sl] += l2 * w.ravel() + l1 * np.sign(w.ravel())
    params = net.params()
    worst = 0.0
    for i in range(params.size):
        orig = params[i]
        params[i] = orig + EPS
        plus = net.compute_gradient_and_score(ds)[1]
        params[i] = orig - EPS
        minus = net.compute_gradient_and_score(ds)[1]
        params[i] = orig
        numeric = (plus - minus) / (2 * EPS)
        magnitude = abs(numeric) + abs(grad[i])
        if magnitude > MIN_MAGNITUDE:
            worst = max(worst, abs(numeric - grad[i]) / magnitude)
    return worst


def _check(layers, input_type, ds: DataSet, regularized: bool = False, **kwargs) -> None:
    conf = MultiLayerConfiguration(layers, input_type=input_type, seed=12345, dtype="float64", **kwargs)
    net = MultiLayerNetwork(conf).init()
    err = _max_relative_error(net, ds, regularized)
    print(f"max relative error {err:.3e}")
    assert err < MAX_REL_ERROR


def _one_hot(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return np.eye(k)[rng.integers(0, k, n)]


def _dense_data(rng: np.random.Generator, n: int = 6, n_in: int = 4, n_out: int = 3) -> DataSet:
    return DataSet(rng.normal(size=(n, n_in)), _one_hot(rng, n, n_out))


ACTIVATIONS = ["identity", "relu", "leakyrelu", "elu", "tanh", "sigmoid", "softmax", "softplus", "hardtanh"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradient_every_activation(activation: str) -> None:
    rng = np.random.default_rng(1)
    ds = _dense_data(rng)
    _check(
        [DenseLayer(5, activation=activation), ActivationLayer(activation), OutputLayer(3)],
        InputType.feed_forward(4),
        ds,
    )


def _labels_for(loss: str, rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    if loss in ("mcxent", "negativeloglikelihood"):
        return _one_hot(rng, n, k)
    if loss == "xent":
        return rng.integers(0, 2, (n, k)).astype(np.float64)
    if loss in ("hinge", "squared_hinge"):
        return rng.choice([-1.0, 1.0], (n, k))
    if loss == "kl_divergence":
        p = rng.random((n, k)) + 0.1
        return p / p.sum(axis=1, keepdims=True)
    return rng.normal(size=(n, k))


LOSS_ACTIVATIONS = [
    ("mcxent", "softmax"),
    ("mcxent", "sigmoid"),
    ("negativeloglikelihood", "softmax"),
    ("mse", "identity"),
    ("mse", "tanh"),
    ("l1", "identity"),
    ("l2", "sigmoid"),
    ("xent", "sigmoid"),
    ("hinge", "identity"),
    ("squared_hinge", "tanh"),
    ("kl_divergence", "softmax"),
]


@pytest.mark.parametrize(("loss", "activation"), LOSS_ACTIVATIONS)
def test_gradient_every_loss(loss: str, activation: str) -> None:
    rng = np.random.default_rng(2)
    ds = DataSet(rng.normal(size=(7, 4)), _labels_for(loss, rng, 7, 3))
    _check(
        [DenseLayer(5, activation="tanh"), OutputLayer(3, activation=activation, loss=loss)],
        InputType.feed_forward(4),
        ds,
    )


# A per-output mask multiplies the gradient element-wise (DL4J), which is the exact gradient of the
# masked score only for element-wise output activations; softmax outputs take per-example masks.
@pytest.mark.parametrize(
    ("mask_shape", "loss", "activation"),
    [
        ((6,), "mcxent", "softmax"),
        ((6, 1), "mse", "tanh"),
        ((6, 3), "xent", "sigmoid"),
        ((6, 3), "l2", "identity"),
    ],
)
def test_gradient_with_labels_mask(mask_shape: tuple, loss: str, activation: str) -> None:
    rng = np.random.default_rng(3)
    features = rng.normal(size=(6, 4))
    mask = rng.integers(0, 2, mask_shape).astype(np.float64)
    ds = DataSet(features, _labels_for(loss, rng, 6, 3), labels_mask=mask)
    _check(
        [DenseLayer(5, activation="sigmoid"), OutputLayer(3, loss=loss, activation=activation)],
        InputType.feed_forward(4),
        ds,
    )


def test_gradient_loss_layer() -> None:
    rng = np.random.default_rng(4)
    ds = DataSet(rng.normal(size=(5, 4)), rng.normal(size=(5, 3)))
    _check([DenseLayer(3, activation="tanh"), LossLayer("mse", "identity")], InputType.feed_forward(4), ds)


def _image_data(rng: np.random.Generator, n: int, c: int, h: int, w: int, k: int = 3) -> DataSet:
    return DataSet(rng.normal(size=(n, c, h, w)), _one_hot(rng, n, k))


@pytest.mark.parametrize(
    "conv",
    [
        ConvolutionLayer(3, kernel_size=(3, 2), stride=(1, 1), activation="tanh"),
        ConvolutionLayer(2, kernel_size=(2, 3), stride=(2, 1), padding=(1, 2), activation="sigmoid"),
        ConvolutionLayer(2, kernel_size=(3, 3), stride=(2, 2), convolution_mode="same", activation="elu"),
        ConvolutionLayer(
            2, kernel_size=(2, 2), convolution_mode="same", has_bias=False, activation="softplus"
        ),
    ],
    ids=["truncate", "stride_padding", "same_stride2", "same_no_bias"],
)
def test_gradient_convolution(conv: ConvolutionLayer) -> None:
    rng = np.random.default_rng(5)
    _check([conv, OutputLayer(3)], InputType.convolutional(5, 6, 2), _image_data(rng, 3, 2, 5, 6))


def test_gradient_convolution_with_fused_relu() -> None:
    # A relu convolution's kernel applies the relu as it writes y, which then stands in for z in the
    # backward (tests/python/nn/test_kernels_winograd.py checks the same epilogue on the Winograd path).
    rng = np.random.default_rng(8)
    _check(
        [ConvolutionLayer(3, kernel_size=(3, 3), convolution_mode="same", activation="relu"), OutputLayer(3)],
        InputType.convolutional(5, 6, 2),
        _image_data(rng, 3, 2, 5, 6),
    )


@pytest.mark.parametrize("pooling", ["max", "avg"])
@pytest.mark.parametrize("mode", ["truncate", "same"])
def test_gradient_subsampling(pooling: str, mode: str) -> None:
    rng = np.random.default_rng(6)
    _check(
        [
            ConvolutionLayer(2, kernel_size=(2, 2), activation="tanh"),
            SubsamplingLayer(
                pooling, kernel_size=(2, 3), stride=(2, 2), padding=(1, 0), convolution_mode=mode
            ),
            OutputLayer(3),
        ],
        InputType.convolutional(6, 7, 1),
        _image_data(rng, 3, 1, 6, 7),
    )


COPIES = {
    "upsampling": lambda: [
        ConvolutionLayer(2, (2, 2), activation="tanh"),
        Upsampling2D((2, 1)),
        OutputLayer(3),
    ],
    "padding_conv": lambda: [
        ZeroPaddingLayer((1, 0, 2, 1)),
        ConvolutionLayer(2, (3, 3), activation="tanh"),
        SubsamplingLayer("max", (2, 2), (1, 1)),
        OutputLayer(3),
    ],
    "conv_cropping": lambda: [
        ConvolutionLayer(3, (2, 2), activation="softplus"),
        Cropping2D((1, 0, 0, 1)),
        Upsampling2D(2),
        Cropping2D(1),
        OutputLayer(3),
    ],
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_gradient_upsampling_padding_cropping(name: str) -> None:
    rng = np.random.default_rng(len(name))
    ds = DataSet(rng.normal(size=(3, 2, 5, 4)), _one_hot(rng, 3, 3))
    _check(COPIES[name](), InputType.convolutional(5, 4, 2), ds)


DECONV_NETS = {
    "truncate_stride2": lambda: [
        Deconvolution2D(3, (3, 2), (2, 2), activation="tanh"),
        OutputLayer(3),
    ],
    "padding_dilation_no_bias": lambda: [
        Deconvolution2D(2, (2, 3), (2, 1), (1, 1), (2, 2), has_bias=False, activation="softplus"),
        OutputLayer(3),
    ],
    "same_between_convolutions": lambda: [
        ConvolutionLayer(3, (2, 2), (2, 2), activation="tanh"),
        Deconvolution2D(2, (3, 3), (2, 2), convolution_mode="same", activation="sigmoid"),
        ConvolutionLayer(2, (2, 2), activation="identity"),
        OutputLayer(3),
    ],
    "same_kernel_below_stride": lambda: [
        Deconvolution2D(2, (1, 2), (3, 3), convolution_mode="same", activation="tanh"),
        DenseLayer(3, activation="tanh"),
        OutputLayer(3),
    ],
}


@pytest.mark.parametrize("name", sorted(DECONV_NETS))
def test_gradient_deconvolution(name: str) -> None:
    rng = np.random.default_rng(len(name))
    ds = DataSet(rng.normal(size=(3, 2, 4, 5)), _one_hot(rng, 3, 3))
    _check(DECONV_NETS[name](), InputType.convolutional(4, 5, 2), ds)


def test_gradient_deconvolution_regularized() -> None:
    """l1/l2 reach the deconvolution's weights (the regularized check adds them to the score's gradient)."""
    rng = np.random.default_rng(4)
    ds = DataSet(rng.normal(size=(3, 2, 3, 3)), _one_hot(rng, 3, 3))
    _check(
        [Deconvolution2D(2, 2, 2, activation="tanh", l1=1e-2, l2=1e-2), OutputLayer(3)],
        InputType.convolutional(3, 3, 2),
        ds,
        regularized=True,
    )


@pytest.mark.parametrize("pooling", ["max", "avg", "sum"])
def test_gradient_global_pooling(pooling: str) -> None:
    rng = np.random.default_rng(7)
    _check(
        [
            ConvolutionLayer(3, kernel_size=(2, 2), activation="tanh"),
            GlobalPoolingLayer(pooling),
            OutputLayer(3),
        ],
        InputType.convolutional(4, 5, 2),
        _image_data(rng, 3, 2, 4, 5),
    )


def test_gradient_batch_normalization_dense() -> None:
    rng = np.random.default_rng(8)
    _check(
        [DenseLayer(5, activation="identity"), BatchNormalization(), ActivationLayer("tanh"), OutputLayer(3)],
        InputType.feed_forward(4),
        _dense_data(rng, n=8),
    )


def test_gradient_batch_normalization_convolutional() -> None:
    rng = np.random.default_rng(9)
    _check(
        [
            ConvolutionLayer(2, kernel_size=(2, 2), activation="identity"),
            BatchNormalization(),
            OutputLayer(3),
        ],
        InputType.convolutional(4, 4, 1),
        _image_data(rng, 4, 1, 4, 4),
    )


def test_gradient_dropout_layers_with_fixed_mask() -> None:
    rng = np.random.default_rng(10)
    _check(
        [DenseLayer(6, activation="tanh", dropout=0.7), DropoutLayer(0.6), OutputLayer(3, dropout=0.8)],
        InputType.feed_forward(4),
        _dense_data(rng),
    )


def test_gradient_convolutional_flat_input_into_dense() -> None:
    rng = np.random.default_rng(11)
    ds = DataSet(rng.normal(size=(3, 2 * 4 * 3)), _one_hot(rng, 3, 3))
    _check(
        [
            ConvolutionLayer(2, kernel_size=(2, 2), activation="relu"),
            DenseLayer(4, activation="tanh"),
            OutputLayer(3),
        ],
        InputType.convolutional_flat(4, 3, 2),
        ds,
    )


def test_gradient_recurrent_input_time_distributed() -> None:
    rng = np.random.default_rng(12)
    n, size, steps = 3, 4, 5
    labels = np.eye(3)[rng.integers(0, 3, (n, steps))].transpose(0, 2, 1)
    mask = rng.integers(0, 2, (n, steps)).astype(np.float64)
    ds = DataSet(rng.normal(size=(n, size, steps)), labels, labels_mask=mask)
    _check([DenseLayer(5, activation="tanh"), OutputLayer(3)], InputType.recurrent(size, steps), ds)


def test_gradient_with_l1_l2_regularization_in_score() -> None:
    rng = np.random.default_rng(13)
    _check(
        [DenseLayer(5, activation="tanh", l1=0.01), OutputLayer(3, l2=0.05)],
        InputType.feed_forward(4),
        _dense_data(rng),
        regularized=True,
        l2=0.02,
    )
