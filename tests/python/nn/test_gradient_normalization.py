"""Gradient normalization (DL4J's GradientNormalization): the update of every mode against a NumPy reference
computed from the raw gradient, per layer and per param type (LSTM matrices, batch-norm gamma/beta, the
running statistics left out), on MultiLayerNetwork and ComputationGraph; network-wide defaults and
per-layer overrides (wrappers too); persistence; validation; training; the emulated device."""

from __future__ import annotations

import io
import json
import math
from typing import Any, Callable

import numpy as np
import pytest
from emulated_device import EmulatedDevice

from prerequisites import require_gpu
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    LSTM,
    BatchNormalization,
    Bidirectional,
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    GradientNormalization,
    InputType,
    LastTimeStep,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
    SimpleRnn,
    updaters,
)
from sparkgrad.nn import layers as L
from sparkgrad.nn import serialization as model_files

GN = GradientNormalization
LR = 0.1
EPS = np.finfo(np.float64).eps
_PER_PARAM = (GN.RENORMALIZE_L2_PER_PARAM_TYPE, GN.CLIP_L2_PER_PARAM_TYPE)
_CLIP_L2 = (GN.CLIP_L2_PER_LAYER, GN.CLIP_L2_PER_PARAM_TYPE)
_RENORMALIZE = (GN.RENORMALIZE_L2_PER_LAYER, GN.RENORMALIZE_L2_PER_PARAM_TYPE)
_STATS = (L.RUNNING_MEAN, L.RUNNING_VAR)


# -- networks and data ---------------------------------------------------------------------------------
def _mln(layers: list, input_type: InputType, seed: int, **defaults: Any) -> MultiLayerNetwork:
    defaults.setdefault("dtype", "float64")
    conf = MultiLayerConfiguration(
        layers, input_type=input_type, updater=updaters.Sgd(LR), seed=seed, **defaults
    )
    return MultiLayerNetwork(conf).init()


def _dense(**defaults: Any) -> MultiLayerNetwork:
    return _mln([DenseLayer(5, activation="tanh"), OutputLayer(3)], InputType.feed_forward(4), 3, **defaults)


def _lstm_bn(**defaults: Any) -> MultiLayerNetwork:
    layers = [LSTM(4), BatchNormalization(), RnnOutputLayer(2, activation="identity", loss="mse")]
    return _mln(layers, InputType.recurrent(3), 4, **defaults)


def _graph(**defaults: Any) -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(updater=updaters.Sgd(LR), seed=5, dtype="float64", **defaults)
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(6, activation="tanh"), "x")
        .add_layer("bn", BatchNormalization(), "a")
        .add_layer("b", DenseLayer(3, activation="relu"), "x")
        .add_vertex("merge", MergeVertex(), "bn", "b")
        .add_layer("out", OutputLayer(3), "merge")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf).init()


def _data(net: Any, seed: int = 0, n: int = 6, scale: float = 1.0) -> DataSet:
    rng = np.random.default_rng(seed)
    if isinstance(net.conf, MultiLayerConfiguration) and net.conf.is_recurrent:
        x = scale * rng.normal(size=(n, 3, 5))
        return DataSet(x, rng.normal(size=(n, 2, 5)))
    x = scale * rng.normal(size=(n, 4))
    return DataSet(x, np.eye(3)[rng.integers(0, 3, n)])


NETWORKS: dict[str, Callable[..., Any]] = {"dense": _dense, "lstm_bn": _lstm_bn, "graph": _graph}


# -- the NumPy reference -----------------------------------------------------------------------------
def _layout(conf: Any) -> list[tuple[Any, list[tuple[int, int, str]]]]:
    """(setting key, [(start, stop, role) per parameter array]) of every layer, in the flat layout the
    networks document: layers in order (a graph's in topological order), each in ``param_specs`` order."""
    if isinstance(conf, MultiLayerConfiguration):
        units = [(i, layer, conf.layer_input_types[i]) for i, layer in enumerate(conf.layers)]
    else:
        units = [
            (name, conf.spec(name).vertex, conf.vertex_input_types[name][0])
            for name in conf.topological_order
            if conf.spec(name).is_layer
        ]
    out, offset = [], 0
    for key, layer, input_type in units:
        params = []
        for spec in layer.param_specs(input_type):
            size = math.prod(spec.shape)
            params.append((offset, offset + size, spec.role))
            offset += size
        out.append((key, params))
    return out


def _groups(layout: list, mode: GradientNormalization) -> list[np.ndarray]:
    """Index arrays of the gradient pieces normalized as one vector (running statistics left out)."""
    groups = []
    for _, params in layout:
        trained = [np.arange(a, b) for a, b, role in params if role not in _STATS]
        if not trained:
            continue
        groups.extend(trained if mode in _PER_PARAM else [np.concatenate(trained)])
    return groups


def _norm(g: np.ndarray) -> float:
    return math.sqrt(math.fsum(g * g))


def _normalized(
    grad: np.ndarray, groups: list[np.ndarray], mode: GradientNormalization, t: float
) -> np.ndarray:
    out = grad.copy()
    for idx in groups:
        g = grad[idx]
        norm = _norm(g)
        if mode is GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE:
            out[idx] = np.clip(g, -t, t)
        elif mode in _CLIP_L2:
            out[idx] = g * (t / norm) if norm > t else g
        else:
            out[idx] = g / norm if norm > 0 else g
    return out


def _threshold(grad: np.ndarray, groups: list[np.ndarray], mode: GradientNormalization, where: str) -> float:
    """A threshold below every group's norm (every element's magnitude), above all of them, or between."""
    if mode is GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE:
        values = np.abs(np.concatenate([grad[idx] for idx in groups]))
        values = values[values > 0]
    else:
        values = np.array([_norm(grad[idx]) for idx in groups])
    values = np.unique(values)  # sorted; between: strictly between two of them, equal to none
    assert values[0] > 0 and values.size > 1
    k = values.size // 2
    return {
        "below": 0.5 * values[0],
        "above": 2.0 * values[-1],
        "between": math.sqrt(values[k - 1] * values[k]),
    }[where]


# -- the update equals the reference -----------------------------------------------------------------
_CASES = [
    (m, "below") for m in GN if m is not GN.NONE and m not in (*_CLIP_L2, GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE)
]
_CASES += [
    (m, w) for m in (*_CLIP_L2, GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE) for w in ("below", "between", "above")
]


@pytest.mark.parametrize("name", list(NETWORKS))
@pytest.mark.parametrize(("mode", "where"), _CASES, ids=[f"{m.value}-{w}" for m, w in _CASES])
def test_update_is_the_learning_rate_times_the_normalized_raw_gradient(
    name: str, mode: GradientNormalization, where: str
) -> None:
    plain = NETWORKS[name]()
    ds = _data(plain)
    grad, _ = plain.compute_gradient_and_score(ds)
    layout = _layout(plain.conf)
    assert layout[-1][1][-1][1] == plain.num_params()
    groups = _groups(layout, mode)
    t = _threshold(grad, groups, mode, where)
    net = NETWORKS[name](gradient_normalization=mode.value, gradient_normalization_threshold=t)
    np.testing.assert_array_equal(net.params(), plain.params())  # same seed: same starting point

    update, _ = net.compute_update(ds)
    plain_update, _ = plain.compute_update(ds)
    expected = _normalized(grad, groups, mode, t)
    trained = np.concatenate(groups)
    # a group's norm sums len(group) squares: its rounding grows with the reduction length
    rtol = 4 * (max(len(idx) for idx in groups) + 2) * EPS
    np.testing.assert_allclose(update[trained], LR * expected[trained], rtol=rtol, atol=0)
    np.testing.assert_array_equal(plain_update[trained], LR * grad[trained])
    # running statistics: not normalized, their update is the plain network's (params - new statistics)
    stats = np.setdiff1d(np.arange(net.num_params()), trained)
    assert stats.size == {"dense": 0, "lstm_bn": 2 * 4, "graph": 2 * 6}[name]
    np.testing.assert_array_equal(update[stats], plain_update[stats])

    # the pieces a threshold acts on: the groups, or (element-wise) the non-zero elements
    if mode is GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE:
        pieces = [np.array([i]) for i in trained if grad[i] != 0]
    else:
        pieces = groups
    changed = [not np.array_equal(expected[idx], grad[idx]) for idx in pieces]
    if where == "above":  # clipping never triggers: bitwise the plain update
        assert not any(changed)
        np.testing.assert_array_equal(update, plain_update)
    elif where == "between":  # some pieces clipped, the others bitwise untouched
        assert any(changed) and not all(changed)
        for idx, was_changed in zip(pieces, changed):
            if not was_changed:
                np.testing.assert_array_equal(update[idx], plain_update[idx])
    else:
        assert all(changed)


@pytest.mark.parametrize("mode", [m for m in GN if m is not GN.NONE], ids=lambda m: m.value)
def test_float32_gradients_normalize_within_float32_rounding(mode: GradientNormalization) -> None:
    plain = _lstm_bn(dtype="float32")
    ds = _data(plain)
    grad, _ = plain.compute_gradient_and_score(ds)
    groups = _groups(_layout(plain.conf), mode)
    below = _threshold(grad.astype(np.float64), groups, mode, "below")
    above = _threshold(grad.astype(np.float64), groups, mode, "above")
    plain_update, _ = plain.compute_update(ds)
    trained = np.concatenate(groups)
    for t in (below, above):
        net = _lstm_bn(dtype="float32", gradient_normalization=mode, gradient_normalization_threshold=t)
        update, _ = net.compute_update(ds)
        assert update.dtype == np.float32
        expected = LR * _normalized(grad.astype(np.float64), groups, mode, np.float32(t))
        rtol = 4 * (max(len(idx) for idx in groups) + 2) * np.finfo(np.float32).eps
        np.testing.assert_allclose(update[trained], expected[trained], rtol=rtol, atol=0)
        if t == above and mode not in _RENORMALIZE:  # within the threshold: bitwise untouched
            np.testing.assert_array_equal(update, plain_update)


def test_per_param_type_normalizes_lstm_matrices_and_bias_separately() -> None:
    net = _lstm_bn(gradient_normalization="renormalize_l2_per_param_type")
    update, _ = net.compute_update(_data(net))
    # LSTM(3 -> 4): W (3, 16), RW (4, 16), b (16); BatchNormalization(4): gamma, beta (then mean, var)
    pieces = [(0, 48), (48, 112), (112, 128), (128, 132), (132, 136), (144, 152), (152, 154)]
    for a, b in pieces:
        assert _norm(update[a:b]) == pytest.approx(LR, rel=4 * (b - a) * EPS)
    assert _norm(update[0:128]) == pytest.approx(LR * math.sqrt(3), rel=1e-12)  # not per layer


def test_normalization_comes_before_l1_l2_and_weight_decay() -> None:
    kwargs = {"l1": 0.05, "l2": 0.3, "weight_decay": 0.2}
    plain = _dense(**kwargs)
    ds = _data(plain)
    grad, _ = plain.compute_gradient_and_score(ds)
    w = plain.params().copy()
    groups = _groups(_layout(plain.conf), GN.CLIP_L2_PER_LAYER)
    t = _threshold(grad, groups, GN.CLIP_L2_PER_LAYER, "below")
    net = _dense(gradient_normalization="clip_l2_per_layer", gradient_normalization_threshold=t, **kwargs)
    update, _ = net.compute_update(ds)
    expected = LR * _normalized(grad, groups, GN.CLIP_L2_PER_LAYER, t)
    weights = np.r_[0:20, 25:40]  # Dense W (4, 5) then b (5); Output W (5, 3) then b (3)
    expected[weights] += LR * (0.05 * np.sign(w[weights]) + 0.3 * w[weights]) + 0.2 * LR * w[weights]
    np.testing.assert_allclose(update, expected, rtol=4 * 32 * EPS, atol=4 * 32 * EPS * LR)


def test_renormalizing_a_zero_gradient_leaves_it_zero() -> None:
    net = MultiLayerNetwork(
        MultiLayerConfiguration(
            [DenseLayer(5, n_in=4, activation="tanh"), OutputLayer(2, activation="identity", loss="mse")],
            updater=updaters.Sgd(LR),
            gradient_normalization="renormalize_l2_per_param_type",
            seed=1,
            dtype="float64",
        )
    ).init()
    x = np.random.default_rng(0).normal(size=(5, 4))
    ds = DataSet(x, net.output(x))  # perfect predictions: the gradient is exactly zero
    grad, _ = net.compute_gradient_and_score(ds)
    assert not grad.any()
    update, _ = net.compute_update(ds)
    np.testing.assert_array_equal(update, np.zeros_like(update))


# -- network-wide defaults and per-layer overrides ---------------------------------------------------
def test_layers_inherit_the_network_setting_unless_they_override_it() -> None:
    conf = MultiLayerConfiguration(
        [
            Bidirectional(LSTM(3, gradient_normalization=GN.NONE)),
            LastTimeStep(SimpleRnn(4, activation="tanh", gradient_normalization_threshold=0.05)),
            DenseLayer(4, activation="tanh", gradient_normalization="clip_element_wise_absolute_value"),
            OutputLayer(2),
        ],
        input_type=InputType.recurrent(3),
        updater=updaters.Sgd(LR),
        gradient_normalization="clip_l2_per_layer",
        gradient_normalization_threshold=0.02,
        seed=2,
        dtype="float64",
    )
    assert [conf.setting(i, "gradient_normalization") for i in range(4)] == [
        GN.NONE,
        GN.CLIP_L2_PER_LAYER,
        GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE,
        GN.CLIP_L2_PER_LAYER,
    ]
    assert [conf.setting(i, "gradient_normalization_threshold") for i in range(4)] == [0.02, 0.05, 0.02, 0.02]

    net = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(1)
    ds = DataSet(rng.normal(size=(6, 3, 4)), np.eye(2)[rng.integers(0, 2, 6)])
    grad, _ = net.compute_gradient_and_score(ds)
    update, _ = net.compute_update(ds)
    expected = grad.copy()
    for (i, params), (mode, t) in zip(
        _layout(conf),
        [(GN.NONE, 0), (GN.CLIP_L2_PER_LAYER, 0.05), (GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE, 0.02)]
        + [(GN.CLIP_L2_PER_LAYER, 0.02)],
    ):
        if mode is not GN.NONE:
            expected = _normalized(expected, _groups([(i, params)], mode), mode, t)
    assert not np.array_equal(expected, grad)  # the thresholds are low enough to clip
    np.testing.assert_allclose(update, LR * expected, rtol=4 * 60 * EPS, atol=0)
    bidirectional = slice(0, _layout(conf)[0][1][-1][1])
    np.testing.assert_array_equal(update[bidirectional], LR * grad[bidirectional])


def test_graph_vertices_inherit_the_builder_defaults_unless_they_override_them() -> None:
    conf = (
        ComputationGraphConfiguration.builder(
            gradient_normalization=GN.CLIP_L2_PER_PARAM_TYPE, gradient_normalization_threshold=0.5
        )
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(4))
        .add_layer("a", DenseLayer(3, gradient_normalization="none"), "x")
        .add_layer("b", BatchNormalization(gradient_normalization_threshold=2.0), "a")
        .add_layer("out", OutputLayer(2), "b")
        .set_outputs("out")
        .build()
    )
    assert conf.setting("a", "gradient_normalization") is GN.NONE
    assert conf.setting("b", "gradient_normalization") is GN.CLIP_L2_PER_PARAM_TYPE
    assert conf.setting("b", "gradient_normalization_threshold") == 2.0
    assert conf.setting("out", "gradient_normalization_threshold") == 0.5


def test_defaults_are_none_and_one() -> None:
    conf = _dense().conf
    assert conf.gradient_normalization is GN.NONE and conf.gradient_normalization_threshold == 1.0
    assert (
        DenseLayer(3).gradient_normalization is None
        and DenseLayer(3).gradient_normalization_threshold is None
    )


# -- persistence ----------------------------------------------------------------------------------------
def _conf() -> MultiLayerConfiguration:
    return MultiLayerConfiguration(
        [
            LastTimeStep(LSTM(3, gradient_normalization="renormalize_l2_per_param_type")),
            BatchNormalization(
                gradient_normalization=GN.CLIP_L2_PER_LAYER, gradient_normalization_threshold=3
            ),
            OutputLayer(2, gradient_normalization_threshold=0.25),
        ],
        input_type=InputType.recurrent(2),
        gradient_normalization="CLIP_ELEMENT_WISE_ABSOLUTE_VALUE",
        gradient_normalization_threshold=0.5,
    )


def test_settings_round_trip_through_json_and_yaml() -> None:
    conf = _conf()
    assert conf.gradient_normalization is GN.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE  # coerced from the name
    assert conf.layers[1].gradient_normalization_threshold == 3.0
    data = json.loads(conf.to_json())
    assert data["gradient_normalization"] == "clip_element_wise_absolute_value"
    assert data["layers"][0]["layer"]["gradient_normalization"] == "renormalize_l2_per_param_type"
    for again in (
        MultiLayerConfiguration.from_json(conf.to_json()),
        MultiLayerConfiguration.from_yaml(conf.to_yaml()),
    ):
        assert again == conf
        assert again.setting(0, "gradient_normalization") is GN.RENORMALIZE_L2_PER_PARAM_TYPE
        assert again.setting(2, "gradient_normalization_threshold") == 0.25
    graph = _graph(gradient_normalization="clip_l2_per_layer", gradient_normalization_threshold=0.75).conf
    assert ComputationGraphConfiguration.from_json(graph.to_json()) == graph
    assert ComputationGraphConfiguration.from_yaml(graph.to_yaml()) == graph


def _without_the_fields(data: Any) -> Any:
    """A configuration mapping as written before gradient normalization existed."""
    if isinstance(data, dict):
        return {
            k: _without_the_fields(v) for k, v in data.items() if not k.startswith("gradient_normalization")
        }
    if isinstance(data, list):
        return [_without_the_fields(v) for v in data]
    return data


def test_model_files_written_without_the_fields_load_with_the_defaults() -> None:
    net = _lstm_bn(gradient_normalization="clip_l2_per_layer")
    old_json = json.dumps(_without_the_fields(json.loads(net.conf.to_json())))
    assert "gradient_normalization" not in old_json
    buf = io.BytesIO()
    model_files.write_model(buf, "MultiLayerNetwork", old_json, net.params(), None, 3, 1)
    buf.seek(0)
    loaded = MultiLayerNetwork.load(buf)
    assert loaded.conf.gradient_normalization is GN.NONE
    assert loaded.conf.gradient_normalization_threshold == 1.0
    assert all(
        layer.gradient_normalization is None for layer in loaded.conf.layers if hasattr(layer, "updater")
    )
    np.testing.assert_array_equal(loaded.params(), net.params())
    # and a network saved with the settings keeps them
    buf = io.BytesIO()
    net.save(buf)
    buf.seek(0)
    assert MultiLayerNetwork.load(buf).conf == net.conf


# -- validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gradient_normalization", "clip"),
        ("gradient_normalization", 3),
        ("gradient_normalization_threshold", 0.0),
        ("gradient_normalization_threshold", -1.0),
        ("gradient_normalization_threshold", math.inf),
        ("gradient_normalization_threshold", math.nan),
        ("gradient_normalization_threshold", 1e300),
        ("gradient_normalization_threshold", "1"),
        ("gradient_normalization_threshold", True),
    ],
)
def test_bad_values_name_the_field(field: str, value: Any) -> None:
    pattern = rf"(^|\W){field}: "
    with pytest.raises(ValueError, match=pattern):
        DenseLayer(3, **{field: value})
    with pytest.raises(ValueError, match=pattern):
        Bidirectional(LSTM(3, **{field: value}))
    with pytest.raises(ValueError, match=pattern):
        MultiLayerConfiguration([OutputLayer(2, n_in=2)], **{field: value})
    with pytest.raises(ValueError, match=pattern):
        _graph(**{field: value})
    data = json.loads(_conf().to_json())
    data["layers"][2][field] = value
    with pytest.raises(ValueError, match=pattern):
        MultiLayerConfiguration.from_json(json.dumps(data))


def test_the_network_setting_cannot_be_none() -> None:
    for field in ("gradient_normalization", "gradient_normalization_threshold"):
        with pytest.raises(ValueError, match=rf"^{field}: "):
            MultiLayerConfiguration([OutputLayer(2, n_in=2)], **{field: None})


# -- training ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["renormalize_l2_per_layer", "clip_l2_per_param_type"])
def test_a_network_with_gradient_normalization_trains(mode: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 4))
    ds = DataSet(x, np.eye(3)[np.argmax(x[:, :3], axis=1)])
    net = _dense(gradient_normalization=mode, gradient_normalization_threshold=0.1)
    first = net.score(ds)
    net.fit(ds, epochs=60, batch_size=16)
    assert net.score(ds) < 0.5 * first
    assert net.evaluate(ds).accuracy() > 0.8


def test_normalized_training_on_a_device_is_bitwise_the_cpu_and_reads_nothing_back() -> None:
    """The normalization computes on the device's arrays (the emulated device refuses host arrays) and keeps
    its scale factors there: a step copies exactly as much across the host boundary as without it."""
    copies = {}
    for mode in (
        "none",
        "renormalize_l2_per_layer",
        "clip_l2_per_param_type",
        "clip_element_wise_absolute_value",
    ):
        cpu = _lstm_bn(gradient_normalization=mode, gradient_normalization_threshold=0.05)
        emu = EmulatedDevice()
        on_device = _lstm_bn(gradient_normalization=mode, gradient_normalization_threshold=0.05).to(emu)
        batches = [_data(cpu, seed) for seed in range(3)]
        cpu.fit(batches)
        before = emu.downloads
        on_device.fit(batches)
        copies[mode] = emu.downloads - before
        np.testing.assert_array_equal(on_device.params(), cpu.params())
    assert len(set(copies.values())) == 1, copies


@pytest.mark.parametrize("mode", [GN.CLIP_L2_PER_LAYER, GN.RENORMALIZE_L2_PER_LAYER])
def test_a_finite_gradient_too_large_to_square_is_still_normalized(mode: GradientNormalization) -> None:
    """An exploding float32 gradient (elements above sqrt(float32 max), 1.8e19) with a finite loss: its
    squared norm overflows, which used to scale the whole layer to zero instead of to the threshold."""
    net = _dense(dtype="float32", gradient_normalization=mode, gradient_normalization_threshold=0.5)
    rng = np.random.default_rng(0)
    huge = (rng.normal(size=net.num_params()) * 1e25).astype(np.float32)
    with np.errstate(over="ignore"):
        assert np.isfinite(huge).all() and not np.isfinite(np.dot(huge, huge))
    net._grad[:] = huge
    net._normalize_gradient()
    for a, b in ((0, 25), (25, 43)):  # Dense(4 -> 5) and Output(5 -> 3), each normalized as one vector
        expected = huge[a:b].astype(np.float64) / np.linalg.norm(huge[a:b].astype(np.float64))
        expected *= 0.5 if mode is GN.CLIP_L2_PER_LAYER else 1.0
        np.testing.assert_allclose(net._grad[a:b], expected, rtol=4 * (b - a + 2) * np.finfo(np.float32).eps)


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(NETWORKS))
@pytest.mark.parametrize("mode", [m for m in GN if m is not GN.NONE], ids=lambda m: m.value)
def test_normalized_training_on_the_gpu_matches_the_cpu(name: str, mode: GradientNormalization) -> None:
    """Three normalized SGD steps on cuda:0 against the CPU in float64. The kernels differ only in their
    summation order: each gradient element sums at most batch x steps x the widest fan-in products
    (`terms`), each rounding by eps, and the normalization's norms and scales add a few roundings, so
    the parameters differ by at most steps x 16 x terms x eps x the largest parameter (a loose bound:
    the threshold 0.05 is far from every norm here, so no clip decision can flip)."""
    require_gpu()
    cpu = NETWORKS[name](gradient_normalization=mode, gradient_normalization_threshold=0.05)
    gpu = NETWORKS[name](gradient_normalization=mode, gradient_normalization_threshold=0.05).to("cuda:0")
    batches = [_data(cpu, seed) for seed in range(3)]
    cpu.fit(batches)
    gpu.fit(batches)
    terms = 6 * 5 * 8  # batch x time steps x the widest fan-in of the three networks
    tol = len(batches) * 16 * terms * EPS * float(np.abs(cpu.params()).max())
    np.testing.assert_allclose(gpu.params(), cpu.params(), rtol=0, atol=tol)
    assert not np.array_equal(cpu.params(), NETWORKS[name]().params())  # it trained
