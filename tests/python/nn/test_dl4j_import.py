"""DL4J model import (issue 39 item 3, ModelSerializer zips): zips that Deeplearning4j itself wrote, with
the outputs, gradients, training curves and trained parameters DL4J computed from them (the baselines of
DL4J's integration tests, tests/python/nn/data/dl4j/README.md), load into a MultiLayerNetwork that
predicts, differentiates and trains as DL4J did; what sparkgrad cannot reproduce is refused naming the
layer and the field, and damaged files name the file and the member."""

from __future__ import annotations

import copy
import gzip
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sparkgrad.data import DataSet, read_nd4j_array
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn import MultiLayerNetwork
from sparkgrad.nn import layers as L
from sparkgrad.nn.dl4j import Dl4jImportError, restore_multi_layer_network
from sparkgrad.nn.enums import Activation, LossFunction, PoolingType
from sparkgrad.nn.updaters import Adam, Nesterovs

EPS = float(np.finfo(np.float32).eps)
DATA = Path(__file__).parent / "data" / "dl4j"
MODEL = "Model_RANDOM_INIT_UNTRAINED.zip"
MOON, LSTM, BIDIRECTIONAL = "MLPMoon", "RnnCsvSequenceClassification1", "RnnCsvSequenceClassification2"
# DL4J's own acceptance between two DL4J runs of a training baseline (IntegrationTestRunner and
# TestCase's defaults): each score within 1e-4 relative error, each parameter within 1e-4 relative error
# unless the two differ by at most 1e-4; relative error |a - b| / (|a| + |b|). A trajectory of updates
# amplifies rounding differently on every BLAS, so the one-step bounds below do not apply to it.
TRAINED_RELATIVE, TRAINED_ABSOLUTE = 1e-4, 1e-4


def _tolerance(reduction: int, depth: int) -> float:
    # float32 rounding of each dot product grows ~ with its length; layers and time steps compound it
    return 8 * EPS * reduction * depth


def _dl4j(case: str, name: str) -> np.ndarray:
    return read_nd4j_array(DATA / case / name)


def _moon(name: str) -> tuple[np.ndarray, np.ndarray]:
    rows = np.loadtxt(DATA / name, delimiter=",", ndmin=2)
    return rows[:, 1:].astype(np.float32), np.eye(2, dtype=np.float32)[rows[:, 0].astype(int)]


def _sequences(case: str) -> tuple[np.ndarray, np.ndarray]:
    """The 101 training sequences (batch, 1, 60), normalized as the case's DL4J normalizer fitted them."""
    rows = np.loadtxt(DATA / "uci_train_0-100.csv.gz", delimiter=",")
    values, labels = rows[:, 1:], np.eye(6, dtype=np.float32)[rows[:, 0].astype(int)]
    if case == LSTM:  # MultiNormalizerStandardize: mean and population standard deviation
        values = (values - values.mean()) / values.std()
    else:  # MultiNormalizerMinMaxScaler onto [0, 1]
        values = (values - values.min()) / (values.max() - values.min())
    return values[:, None, :].astype(np.float32), labels


def _data(case: str) -> tuple[np.ndarray, np.ndarray]:
    return _moon("moon_data_eval_head.csv") if case == MOON else _sequences(case)


def _gradients(net: MultiLayerNetwork, flat: np.ndarray) -> dict[str, np.ndarray]:
    """A flat sparkgrad gradient as DL4J's gradient table: '<layer>_<param>' -> array."""
    return {
        f"{key}_{spec.name}": flat[start:stop].reshape(spec.shape)
        for (key, _, _), entries in zip(net._units, net._layouts)
        for spec, start, stop in entries
    }


def _dl4j_layout(net: MultiLayerNetwork) -> np.ndarray:
    """The network's parameters in DL4J's flat layout (each matrix in column-major order)."""
    return np.concatenate([value.ravel(order="F") for value in _gradients(net, net.params()).values()])


def _relative_error(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b) / np.maximum(np.abs(a) + np.abs(b), np.finfo(np.float64).tiny)


def test_configurations_translate_to_the_layers_dl4j_built() -> None:
    moon = restore_multi_layer_network(DATA / MOON / MODEL)
    dense, output = moon.conf.layers
    assert isinstance(dense, L.DenseLayer) and (dense.n_in, dense.n_out) == (2, 20)
    assert dense.activation is Activation.RELU and dense.updater == Nesterovs(0.005, 0.9)
    assert isinstance(output, L.OutputLayer) and output.loss is LossFunction.NEGATIVELOGLIKELIHOOD
    assert moon.conf.seed == 123 and moon.num_params() == 102

    lstm = restore_multi_layer_network(DATA / LSTM / MODEL)
    recurrent, pooling, output = lstm.conf.layers
    assert isinstance(recurrent, L.LSTM) and (recurrent.n_in, recurrent.n_out) == (1, 10)
    assert recurrent.gate_activation is Activation.SIGMOID and (recurrent.l1, recurrent.l2) == (1e-3, 1e-3)
    assert recurrent.updater == Adam(0.05)
    assert pooling.pooling_type is PoolingType.AVG and output.loss is LossFunction.MCXENT

    both = restore_multi_layer_network(DATA / BIDIRECTIONAL / MODEL).conf.layers[0]
    assert isinstance(both, L.Bidirectional) and both.mode.value == "concat" and both.layer.n_out == 10


def test_the_first_layer_parameters_are_dl4js_in_their_places() -> None:
    # DL4J initialised the LSTM's forget-gate bias block (the second of four) to forgetGateBiasInit 1.0
    # and the other blocks to 0: in sparkgrad's layout they land on the forget gate
    net = restore_multi_layer_network(DATA / LSTM / MODEL)
    bias = _gradients(net, net.params())["0_b"]
    np.testing.assert_array_equal(bias, np.repeat([0.0, 1.0, 0.0, 0.0], 10))


@pytest.mark.parametrize(
    ("case", "index", "rows", "tolerance"),
    [
        (MOON, 0, slice(0, 1), _tolerance(20, 2)),
        (MOON, 1, slice(0, 10), _tolerance(20, 2)),
        # 60 steps of an LSTM (reduction 1 + 10 per step) then pooling and the output layer
        (LSTM, 0, slice(0, 10), _tolerance(20, 62)),
        (BIDIRECTIONAL, 0, slice(0, 10), _tolerance(20, 62)),
    ],
)
def test_outputs_are_dl4js(case: str, index: int, rows: slice, tolerance: float) -> None:
    net = restore_multi_layer_network(DATA / case / MODEL)
    features, _ = _data(case)
    expected = _dl4j(case, f"predictions/output_{index}_0.bin")
    got = net.output(features[rows])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)


@pytest.mark.parametrize(
    ("case", "batch", "tolerance"),
    [(MOON, 5, _tolerance(20, 4)), (LSTM, 10, _tolerance(20, 124)), (BIDIRECTIONAL, 10, _tolerance(20, 124))],
)
def test_gradients_are_dl4js_divided_by_the_minibatch(case: str, batch: int, tolerance: float) -> None:
    # DL4J's computeGradientAndScore sums over the minibatch; its updater divides by the minibatch size
    net = restore_multi_layer_network(DATA / case / MODEL)
    features, labels = _data(case)
    flat, _ = net.compute_gradient_and_score(DataSet(features[:batch], labels[:batch]))
    table = _gradients(net, flat)
    files = sorted(p.stem for p in (DATA / case / "gradients").iterdir())
    assert sorted(table) == files  # every parameter of the network, no other
    for name in files:
        expected = _dl4j(case, f"gradients/{name}.bin").reshape(table[name].shape) / batch
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(table[name], expected, rtol=0, atol=tolerance * scale, err_msg=name)


@pytest.mark.parametrize(("case", "batch"), [(MOON, 32), (LSTM, 10), (BIDIRECTIONAL, 10)])
def test_training_follows_dl4js_curve_to_dl4js_parameters(case: str, batch: int) -> None:
    """One epoch in file order, one minibatch per step (DL4J's fit of its iterator): Nesterovs for the
    MLP; Adam with l1 and l2 through an LSTM for the others."""
    net = restore_multi_layer_network(DATA / case / MODEL)
    features, labels = _moon("moon_data_train.csv.gz") if case == MOON else _sequences(case)
    curve = np.array([float(v) for v in (DATA / case / "trainingCurve.csv").read_text().split(",")])
    scores = []
    for start in range(0, len(features), batch):
        net.fit(DataSet(features[start : start + batch], labels[start : start + batch]))
        scores.append(net.score())
    assert len(scores) == len(curve)
    assert _relative_error(scores, curve).max() <= TRAINED_RELATIVE
    expected = _dl4j(case, "paramsPostTrain.bin").ravel()
    got = _dl4j_layout(net)
    exceeds = (_relative_error(got, expected) > TRAINED_RELATIVE) & (
        np.abs(got - expected) > TRAINED_ABSOLUTE
    )
    assert not exceeds.any(), np.flatnonzero(exceeds)
    assert (
        np.abs(got - _dl4j_layout(restore_multi_layer_network(DATA / case / MODEL))).max() > 1e-2
    )  # trained


def test_an_imported_network_saves_and_loads_as_sparkgrads(tmp_path) -> None:
    net = restore_multi_layer_network(DATA / BIDIRECTIONAL / MODEL)
    net.save(tmp_path / "net.zip")
    loaded = MultiLayerNetwork.load(tmp_path / "net.zip")
    features, _ = _sequences(BIDIRECTIONAL)
    np.testing.assert_array_equal(loaded.params(), net.params())
    np.testing.assert_array_equal(loaded.output(features[:4]), net.output(features[:4]))


def test_sources_path_str_and_file_object_read_alike() -> None:
    path = DATA / MOON / MODEL
    expected = restore_multi_layer_network(path).params()
    np.testing.assert_array_equal(restore_multi_layer_network(str(path)).params(), expected)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(restore_multi_layer_network(f).params(), expected)
    np.testing.assert_array_equal(
        restore_multi_layer_network(io.BytesIO(path.read_bytes())).params(), expected
    )


# -- files DL4J wrote, edited to hold what sparkgrad refuses -----------------------------------------
def _members(case: str = LSTM) -> dict[str, bytes]:
    with zipfile.ZipFile(DATA / case / MODEL) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _zip(members: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    out.seek(0)
    return out


def _edited(edit, case: str = LSTM) -> io.BytesIO:
    """The case's zip with its configuration JSON changed by ``edit(conf)``."""
    members = _members(case)
    conf = json.loads(members["configuration.json"])
    edit(conf)
    members["configuration.json"] = json.dumps(conf).encode()
    return _zip(members)


def _layer(conf: dict, index: int = 0) -> dict:
    return conf["confs"][index]["layer"]


def _swap_fwd(conf: dict) -> None:
    _layer(conf)["fwd"]["nout"] = 11


REFUSED = {
    "layer type": (
        lambda c: _layer(c).update({"@class": "org.deeplearning4j.nn.conf.layers.GravesLSTM"}),
        LSTM,
        r"layer 0 \('layer0', GravesLSTM\): @class = .*GravesLSTM.*not imported",
    ),
    "activation": (
        lambda c: _layer(c, 2)["activationFn"].update({"@class": "x.ActivationSwish"}),
        LSTM,
        r"layer 2 \('layer2', OutputLayer\): activationFn = 'ActivationSwish'",
    ),
    "relu cap": (
        lambda c: _layer(
            c,
            0,
        )["activationFn"].update({"max": 6.0}),
        MOON,
        r"layer 0 \('layer0', DenseLayer\): activationFn.max = 6.0",
    ),
    "gate activation": (
        lambda c: _layer(c)["gateActivationFn"].update({"@class": "x.ActivationHardSigmoid"}),
        LSTM,
        r"layer 0 .*gateActivationFn = 'ActivationHardSigmoid'",
    ),
    "updater schedule": (
        lambda c: _layer(c)["iupdater"].update({"learningRateSchedule": {"@class": "x.MapSchedule"}}),
        LSTM,
        r"layer 0 .*iupdater.learningRateSchedule = 'MapSchedule': schedules",
    ),
    "bias regularization": (
        lambda c: _layer(c).update({"regularizationBias": [{"@class": "x.L2Regularization"}]}),
        LSTM,
        r"layer 0 .*regularizationBias",
    ),
    "layer norm": (
        lambda c: _layer(c).update({"hasLayerNorm": True}),
        MOON,
        r"layer 0 .*hasLayerNorm = True",
    ),
    "weight noise": (
        lambda c: _layer(c, 1).update({"weightNoise": {"@class": "x.DropConnect"}}),
        MOON,
        r"layer 1 \('layer1', OutputLayer\): weightNoise",
    ),
    "loss weights": (
        lambda c: _layer(c, 1)["lossFn"].update({"weights": [1.0, 2.0]}),
        MOON,
        r"layer 1 .*lossFn.weights = \[1.0, 2.0\]",
    ),
    "pooling pnorm": (
        lambda c: _layer(c, 1).update({"poolingType": "PNORM"}),
        LSTM,
        r"layer 1 .*poolingType = 'PNORM'",
    ),
    "directions differ": (_swap_fwd, BIDIRECTIONAL, r"layer 0 .*Bidirectional\): bwd .*copies one layer"),
    "bidirectional mode": (
        lambda c: _layer(c).update({"mode": "SUM"}),
        BIDIRECTIONAL,
        r"layer 0 .*mode = 'SUM'",
    ),
    "preprocessor": (
        lambda c: c.update({"inputPreProcessors": {"1": {"@class": "x.RnnToFeedForwardPreProcessor"}}}),
        MOON,
        r"inputPreProcessors\[1\]: @class = 'RnnToFeedForwardPreProcessor'",
    ),
    "half precision": (lambda c: c.update({"dataType": "HALF"}), MOON, r"dataType = 'HALF'"),
    "no minibatch division": (
        lambda c: c["confs"][1].update({"miniBatch": False}),
        MOON,
        r"layer 1 .*miniBatch = False",
    ),
    "weight decay without lr": (
        lambda c: _layer(c).update(
            {
                "regularization": [
                    {
                        "@class": "x.WeightDecay",
                        "applyLR": False,
                        "coeff": {"@class": "x.FixedSchedule", "value": 0.1},
                    }
                ]
            }
        ),
        MOON,
        r"layer 0 .*regularization.applyLR = False",
    ),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_what_sparkgrad_cannot_reproduce_is_refused_naming_layer_and_field(what: str) -> None:
    edit, case, message = REFUSED[what]
    with pytest.raises(Dl4jImportError, match=message):
        restore_multi_layer_network(_edited(edit, case))


def test_a_weight_decay_with_the_learning_rate_carries_over() -> None:
    decay = {
        "@class": "x.WeightDecay",
        "applyLR": True,
        "coeff": {"@class": "x.FixedSchedule", "value": 0.25},
    }
    net = restore_multi_layer_network(_edited(lambda c: _layer(c).update({"regularization": [decay]}), MOON))
    assert net.conf.layers[0].weight_decay == 0.25 and net.conf.layers[0].l2 is None


def test_a_computation_graph_zip_is_refused_by_name() -> None:
    def graph(conf: dict) -> None:
        conf["vertices"] = {}

    with pytest.raises(Dl4jImportError, match="holds a DL4J ComputationGraph"):
        restore_multi_layer_network(_edited(graph))


def _utf(text: str) -> bytes:
    return len(text).to_bytes(2, "big") + text.encode()


def _coefficients(values: np.ndarray) -> bytes:
    """Nd4j.write of a float row vector: a 'c' order [1, n] record (dl4j-reference.md 6.2)."""
    info = np.array([2, 1, values.size, values.size, 1, 0, 1, 99], dtype=">i8")
    records = [("LONG", info), ("FLOAT", values.astype(">f4"))]
    return b"".join(
        _utf("MIXED_DATA_TYPES") + a.size.to_bytes(8, "big") + _utf(kind) + a.tobytes() for kind, a in records
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("configuration.json"), r"not a DL4J model zip \(missing configuration.json\)"),
        (lambda m: m.update({"configuration.json": b"{not json"}), r"configuration.json: not JSON"),
        (lambda m: m.update({"configuration.json": b"[]"}), r"configuration.json: expected a JSON object"),
        (lambda m: m.pop("coefficients.bin"), r"neither coefficients.bin nor noParams.marker"),
        (
            lambda m: m.update({"coefficients.bin": _coefficients(np.ones(102))}),
            r"coefficients.bin: 102 parameters, the configuration has 546",
        ),
        (
            lambda m: m.update({"coefficients.bin": _coefficients(np.full(546, np.nan))}),
            r"coefficients.bin: element 0 is not finite",
        ),
        (
            lambda m: m.update({"coefficients.bin": m["coefficients.bin"][:-5]}),
            r"coefficients.bin.*truncated",
        ),
    ],
)
def test_damaged_members_name_the_file_and_member(change, message: str) -> None:
    members = _members(LSTM)
    change(members)
    with pytest.raises(CorruptDataError, match=message):
        restore_multi_layer_network(_zip(members))


def test_bytes_that_are_not_a_zip_name_the_file(tmp_path) -> None:
    path = tmp_path / "model.zip"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CorruptDataError, match="model.zip"):
        restore_multi_layer_network(path)


def test_a_malformed_field_is_corrupt_data_naming_it() -> None:
    with pytest.raises(CorruptDataError, match=r"layer 0 .*nout = 'ten' has the wrong type"):
        restore_multi_layer_network(_edited(lambda c: _layer(c).update({"nout": "ten"})))
    with pytest.raises(CorruptDataError, match=r"layer 0 .*nin = -1 is not a layer size"):
        restore_multi_layer_network(_edited(lambda c: _layer(c).update({"nin": -1}), MOON))


def test_a_normalizer_in_the_zip_is_named_in_a_warning() -> None:
    members = _members(MOON)
    members["normalizer.bin"] = b"\x00"
    with pytest.warns(UserWarning, match="normalizer.bin.*not read"):
        net = restore_multi_layer_network(_zip(members))
    np.testing.assert_array_equal(net.params(), restore_multi_layer_network(DATA / MOON / MODEL).params())


def test_the_training_data_files_are_the_documented_ones() -> None:
    # the README's description of the shipped inputs (row counts, the 101 sequences of 60 values)
    assert np.loadtxt(DATA / "moon_data_eval_head.csv", delimiter=",").shape == (10, 3)
    with gzip.open(DATA / "moon_data_train.csv.gz", "rt") as f:
        assert np.loadtxt(f, delimiter=",").shape == (2000, 3)
    assert np.loadtxt(DATA / "uci_train_0-100.csv.gz", delimiter=",").shape == (101, 61)


def test_seed_overrides_dl4js_dropout_seed_only() -> None:
    net = restore_multi_layer_network(DATA / MOON / MODEL, seed=7)
    assert net.conf.seed == 7
    np.testing.assert_array_equal(net.params(), restore_multi_layer_network(DATA / MOON / MODEL).params())
    assert copy.deepcopy(net.conf.layers) == restore_multi_layer_network(DATA / MOON / MODEL).conf.layers


def test_parameter_free_layers_pass_dl4js_values_through_at_inference() -> None:
    # an identity ActivationLayer and a DropoutLayer (retain 0.5: inference leaves values as they are)
    # between DL4J's Dense and Output layers: the same parameters, DL4J's outputs
    def insert(conf: dict) -> None:
        activation = {
            "@class": "org.deeplearning4j.nn.conf.layers.ActivationLayer",
            "layerName": "act",
            "activationFn": {"@class": "org.nd4j.linalg.activations.impl.ActivationIdentity"},
        }
        dropout = {
            "@class": "org.deeplearning4j.nn.conf.layers.DropoutLayer",
            "layerName": "drop",
            "idropout": {"@class": "org.deeplearning4j.nn.conf.dropout.Dropout", "p": 0.5},
        }
        conf["confs"][1:1] = [{"layer": activation}, {"layer": dropout}]

    net = restore_multi_layer_network(_edited(insert, MOON))
    assert [type(layer).__name__ for layer in net.conf.layers] == [
        "DenseLayer", "ActivationLayer", "DropoutLayer", "OutputLayer"
    ]  # fmt: skip
    assert net.conf.layers[2].dropout == 0.5
    features, _ = _moon("moon_data_eval_head.csv")
    expected = _dl4j(MOON, "predictions/output_1_0.bin")
    np.testing.assert_allclose(net.output(features), expected, rtol=0, atol=_tolerance(20, 2))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # a value sparkgrad's configuration rejects: damage, named with the layer
        (lambda c: _layer(c)["regularization"].append(_fixed("L2Regularization", "l2", -1.0)),
         r"layer 0 \('layer0', LSTM\): l2"),
        # sizes that do not chain from layer to layer
        (lambda c: _layer(c, 2).update({"nin": 7}), r"n_in"),
        # a configuration claiming 43 billion parameters: refused before anything is allocated
        (lambda c: _layer(c).update({"nin": 2**30}), r"546 parameters, the configuration has 42949673466"),
        (lambda c: _layer(c)["iupdater"].update({"learningRate": 10**400}), r"learningRate = .* finite"),
    ],
)  # fmt: skip
def test_values_dl4j_never_writes_are_corrupt_data_naming_the_file(edit, message: str) -> None:
    with pytest.raises(CorruptDataError, match=message):
        restore_multi_layer_network(_edited(edit))


def _fixed(kind: str, field: str, value: float) -> dict:
    schedule = {"@class": "org.nd4j.linalg.schedule.FixedSchedule", "value": value}
    return {"@class": f"org.nd4j.linalg.learning.regularization.{kind}", field: schedule}


def test_a_megabyte_of_hostile_text_stays_out_of_the_message() -> None:
    def huge(conf: dict) -> None:
        _layer(conf).update({"layerName": "n" * 10**6, "@class": "x." + "C" * 10**6})

    with pytest.raises(Dl4jImportError, match="not imported") as caught:
        restore_multi_layer_network(_edited(huge))
    assert len(str(caught.value)) < 400


def _peepholes(conf: dict) -> None:
    for direction in ("fwd", "bwd"):
        _layer(conf)[direction]["peepholes"] = True


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # an older DL4J's numeric l2 on the layer: refused, not silently dropped
        (
            lambda c: _layer(c).update({"l2": 0.001}),
            r"layer 0 \('layer0', Bidirectional\): l2 = 0.001: a field",
        ),
        (lambda c: c["confs"][1].update({"learningRatePolicy": "Step"}), r"layer 1 .*learningRatePolicy"),
        (lambda c: c.update({"futureOption": 3}), r"<BytesIO>: futureOption = 3"),
        (_peepholes, r"layer 0 .*peepholes = True"),
    ],
)
def test_fields_the_import_does_not_know_are_refused_unless_empty(edit, message: str) -> None:
    case = BIDIRECTIONAL
    with pytest.raises(Dl4jImportError, match=message):
        restore_multi_layer_network(_edited(edit, case))
    empty = restore_multi_layer_network(_edited(lambda c: _layer(c).update({"l2": None, "later": []}), case))
    np.testing.assert_array_equal(empty.params(), restore_multi_layer_network(DATA / case / MODEL).params())
