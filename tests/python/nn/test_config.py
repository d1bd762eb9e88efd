"""Configuration objects of sparkgrad.nn: round trips, enums, inference of n_in, validation messages."""

from __future__ import annotations

import pytest

from sparkgrad.nn import (
    Activation,
    ActivationLayer,
    BatchNormalization,
    ConvolutionLayer,
    DenseLayer,
    DropoutLayer,
    GlobalPoolingLayer,
    InputType,
    LossFunction,
    LossLayer,
    MultiLayerConfiguration,
    OutputLayer,
    SubsamplingLayer,
    WeightInit,
    updaters,
)

ALL_UPDATERS = [
    updaters.Sgd(0.05),
    updaters.Nesterovs(0.1, momentum=0.8),
    updaters.Adam(1e-3, beta1=0.8, beta2=0.99, epsilon=1e-7),
    updaters.AdaMax(2e-3),
    updaters.Nadam(3e-3),
    updaters.AmsGrad(4e-3),
    updaters.RmsProp(0.01, rms_decay=0.9, epsilon=1e-7),
    updaters.AdaGrad(0.2, epsilon=1e-5),
    updaters.AdaDelta(rho=0.9, epsilon=1e-5),
    updaters.NoOp(),
]


def _cnn_conf() -> MultiLayerConfiguration:
    return MultiLayerConfiguration(
        layers=[
            ConvolutionLayer(4, kernel_size=(3, 3), convolution_mode="same", activation="relu", dropout=0.9),
            BatchNormalization(decay=0.8),
            SubsamplingLayer("avg", kernel_size=2, stride=2),
            ConvolutionLayer(
                3, kernel_size=(2, 2), stride=(1, 1), padding=(1, 1), updater=updaters.Adam(0.01)
            ),
            GlobalPoolingLayer("sum"),
            DropoutLayer(0.5),
            ActivationLayer("tanh"),
            DenseLayer(7, weight_init="relu_uniform", l1=0.01, l2=0.02, weight_decay=0.001),
            OutputLayer(3, activation="sigmoid", loss="xent"),
        ],
        input_type=InputType.convolutional_flat(8, 8, 2),
        updater=updaters.Nesterovs(0.05),
        seed=42,
        weight_init="lecun_normal",
        activation="elu",
        l2=1e-4,
        dtype="float64",
    )


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_configuration_round_trip_preserves_equality(fmt: str) -> None:
    conf = _cnn_conf()
    text = conf.to_json() if fmt == "json" else conf.to_yaml()
    back = (
        MultiLayerConfiguration.from_json(text) if fmt == "json" else MultiLayerConfiguration.from_yaml(text)
    )
    assert back == conf
    assert back.layer_input_types == conf.layer_input_types
    assert back.to_json() == conf.to_json()


@pytest.mark.parametrize("updater", ALL_UPDATERS, ids=lambda u: type(u).__name__)
def test_every_updater_round_trips(updater: updaters.Updater) -> None:
    assert updaters.Updater.from_json(updater.to_json()) == updater
    assert updaters.Updater.from_yaml(updater.to_yaml()) == updater
    conf = MultiLayerConfiguration([OutputLayer(2, n_in=3)], updater=updater)
    assert MultiLayerConfiguration.from_json(conf.to_json()).updater == updater


def test_enums_accept_case_insensitive_strings() -> None:
    layer = DenseLayer(3, activation="ReLU", weight_init="Xavier_Uniform")
    assert layer.activation is Activation.RELU
    assert layer.weight_init is WeightInit.XAVIER_UNIFORM
    out = OutputLayer(2, loss="NegativeLogLikelihood", activation=Activation.SOFTMAX)
    assert out.loss is LossFunction.NEGATIVELOGLIKELIHOOD
    assert LossLayer(loss="Squared_Hinge").loss is LossFunction.SQUARED_HINGE
    assert DenseLayer(3, activation="relu") == DenseLayer(3, activation=Activation.RELU)
    with pytest.raises(ValueError, match="activation"):
        DenseLayer(3, activation="swishy")
    with pytest.raises(ValueError, match="loss"):
        OutputLayer(3, loss="cosine")


def test_n_in_inferred_from_input_type_and_previous_layers() -> None:
    conf = _cnn_conf()
    conv0, bn, _, conv3, _, _, _, dense, out = conf.layers
    assert conv0.n_in == 2  # channels of the flat image input
    assert bn.n_in == 4
    assert conv3.n_in == 4
    assert dense.n_in == 3  # global pooling leaves one value per channel
    assert out.n_in == 7
    # same mode keeps 8x8; avg pool 2 -> 4x4; 2x2 kernel with padding 1 -> 5x5
    assert conf.layer_input_types[2].describe() == "convolutional(4x8x8)"
    assert conf.layer_input_types[3].describe() == "convolutional(4x4x4)"
    assert conf.layer_input_types[4].describe() == "convolutional(3x5x5)"


def test_convolution_flattens_into_dense_layer() -> None:
    conf = MultiLayerConfiguration(
        [ConvolutionLayer(5, kernel_size=3), SubsamplingLayer(), OutputLayer(4)],
        input_type=InputType.convolutional(10, 9, 3),
    )
    # conv 3x3 truncate: 8x7, pool 2/2: 4x3 -> dense sees 5*4*3 inputs
    assert conf.layers[2].n_in == 60


def test_recurrent_input_type_sizes_dense_layers() -> None:
    conf = MultiLayerConfiguration([DenseLayer(6), OutputLayer(2)], input_type=InputType.recurrent(5, 7))
    assert conf.layers[0].n_in == 5
    assert conf.is_recurrent


def test_global_defaults_flow_into_layers_that_leave_them_none() -> None:
    conf = MultiLayerConfiguration(
        [
            DenseLayer(3, n_in=2),
            DenseLayer(3, activation="tanh", l2=0.5, updater=updaters.Sgd(0.3)),
            OutputLayer(1),
        ],
        activation="relu",
        weight_init="ones",
        l1=0.1,
        l2=0.2,
        weight_decay=0.3,
        updater=updaters.Adam(0.01),
    )
    assert conf.setting(0, "activation") is Activation.RELU
    assert conf.setting(1, "activation") is Activation.TANH
    assert conf.setting(0, "weight_init") is WeightInit.ONES
    assert conf.setting(0, "l2") == 0.2 and conf.setting(1, "l2") == 0.5
    assert conf.setting(1, "l1") == 0.1 and conf.setting(2, "weight_decay") == 0.3
    assert conf.setting(0, "updater") == updaters.Adam(0.01)
    assert conf.setting(1, "updater") == updaters.Sgd(0.3)
    # the layer's own activation wins over the global default (OutputLayer's default is softmax)
    assert conf.setting(2, "activation") is Activation.SOFTMAX


def test_mismatched_n_in_names_layer_index_and_field() -> None:
    with pytest.raises(ValueError, match=r"layers\[1\] \(DenseLayer\)\.n_in: is 5 but the input has size 4"):
        MultiLayerConfiguration([DenseLayer(4, n_in=3), DenseLayer(2, n_in=5), OutputLayer(2)])


def test_kernel_too_large_names_layer_index() -> None:
    with pytest.raises(ValueError, match=r"layers\[2\] \(ConvolutionLayer\)\.kernel_size"):
        MultiLayerConfiguration(
            [
                ConvolutionLayer(2, kernel_size=3),
                SubsamplingLayer(),
                ConvolutionLayer(2, kernel_size=5),
                OutputLayer(2),
            ],
            input_type=InputType.convolutional(8, 8, 1),
        )


def test_convolution_on_dense_input_names_layer_index() -> None:
    with pytest.raises(
        ValueError, match=r"layers\[1\] \(ConvolutionLayer\)\.input: needs convolutional input"
    ):
        MultiLayerConfiguration(
            [DenseLayer(4), ConvolutionLayer(2), OutputLayer(2)], input_type=InputType.feed_forward(3)
        )


def test_structural_errors_name_the_layer() -> None:
    with pytest.raises(ValueError, match=r"layers\[0\] \(DenseLayer\)\.n_in: required"):
        MultiLayerConfiguration([DenseLayer(4), OutputLayer(2)])
    with pytest.raises(ValueError, match=r"layers\[1\] \(DenseLayer\)\.type: the last layer"):
        MultiLayerConfiguration([DenseLayer(4, n_in=2), DenseLayer(2)])
    with pytest.raises(ValueError, match=r"layers\[0\] \(OutputLayer\)\.position"):
        MultiLayerConfiguration([OutputLayer(4, n_in=2), OutputLayer(2)])
    with pytest.raises(ValueError, match=r"layers\[1\]: expected a layer"):
        MultiLayerConfiguration([DenseLayer(4, n_in=2), "dense", OutputLayer(2)])


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: DenseLayer(0), "n_out"),
        (lambda: DenseLayer(3, dropout=0.0), "dropout"),
        (lambda: DenseLayer(3, dropout=1.5), "dropout"),
        (lambda: DenseLayer(3, l2=-1.0), "l2"),
        (lambda: DenseLayer(3, updater="adam"), "updater"),
        (lambda: ConvolutionLayer(3, kernel_size=(0, 2)), "kernel_size"),
        (lambda: ConvolutionLayer(3, stride=(1, 2, 3)), "stride"),
        (lambda: ConvolutionLayer(3, convolution_mode="valid"), "convolution_mode"),
        (lambda: SubsamplingLayer("sum"), "pooling_type"),
        (lambda: BatchNormalization(decay=1.5), "decay"),
        (lambda: BatchNormalization(eps=0.0), "eps"),
        (lambda: DropoutLayer(0.0), "dropout"),
        (lambda: updaters.Adam(learning_rate=-1.0), "learning_rate"),
        (lambda: updaters.Adam(beta1=1.0), "beta1"),
        (lambda: updaters.RmsProp(rms_decay=2.0), "rms_decay"),
        (lambda: updaters.AdaDelta(epsilon=0.0), "epsilon"),
        (lambda: MultiLayerConfiguration([OutputLayer(2, n_in=2)], dtype="float16"), "dtype"),
        (lambda: MultiLayerConfiguration([OutputLayer(2, n_in=2)], l1=-0.1), "l1"),
        (lambda: MultiLayerConfiguration([OutputLayer(2, n_in=2)], seed=-3), "seed"),
        (lambda: InputType.convolutional(0, 3, 1), "height"),
        (lambda: InputType.feed_forward(0), "size"),
    ],
)
def test_out_of_range_values_raise_naming_the_field(factory, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        factory()


def test_unknown_fields_are_rejected_on_load() -> None:
    text = MultiLayerConfiguration([OutputLayer(2, n_in=2)]).to_json().replace('"has_bias"', '"has_biass"')
    with pytest.raises(ValueError, match="has_biass"):
        MultiLayerConfiguration.from_json(text)


def test_dropout_is_retain_probability_and_round_trips() -> None:
    layer = DenseLayer(3, dropout=0.8)
    assert layer.dropout == 0.8
    assert DenseLayer.from_json(layer.to_json()) == layer
