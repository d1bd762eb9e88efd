"""ONNX import (issue 39 item 3, the ONNX part): models built with ONNX's own graph API and models that
PyTorch's exporter wrote (tests/python/nn/data/onnx, made by make_models.py there) load into a
ComputationGraph and give the outputs of ONNX's reference implementation (onnx.reference) and of
PyTorch within float32 tolerance, train further, and every operator or attribute that does not map is
refused with an error naming its node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx (test extra) is not installed: ONNX import untested")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from sparkgrad.data import DataSet, MultiDataSet  # noqa: E402
from sparkgrad.nn import ComputationGraph  # noqa: E402
from sparkgrad.nn import layers as L  # noqa: E402
from sparkgrad.nn.enums import Activation, LossFunction  # noqa: E402
from sparkgrad.nn.onnx import OnnxImportError, import_onnx_model  # noqa: E402
from sparkgrad.nn.vertices import (  # noqa: E402
    ElementWiseVertex,
    LastTimeStepVertex,
    MergeVertex,
    PreprocessorVertex,
)

EPS = float(np.finfo(np.float32).eps)
DATA = Path(__file__).parent / "data" / "onnx"


def _tolerance(reduction: int, depth: int = 1) -> float:
    # float32 rounding of each dot product grows ~ with its length; depth layers compound it
    return 8 * EPS * reduction * depth


def _normal(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).normal(size=shape)).astype(np.float32)


def _model(nodes, inputs: dict, outputs: dict, weights: dict, opset: int = 17, check: bool = True):
    """An ONNX model, checked by onnx unless ``check`` is False: ``inputs`` and ``outputs`` {name: shape
    without the batch axis}, float32 throughout."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", *s]) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", *s]) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if check:
        onnx.checker.check_model(model)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)  # a well-formed graph
    return model


def _check(model, feeds: dict, reduction: int, depth: int, tmp_path=None):
    """The imported network's outputs equal ONNX's reference evaluator's; from a file, its bytes and
    the proto alike. Returns the network."""
    expected = ReferenceEvaluator(model).run(None, feeds)
    sources = [model, model.SerializeToString()]
    if tmp_path is not None:
        path = tmp_path / "model.onnx"
        onnx.save(model, path)
        sources += [path, str(path)]
    for source in sources:
        net = import_onnx_model(source)
        assert isinstance(net, ComputationGraph)
        got = net.output(*feeds.values())
        got = got if isinstance(got, list) else [got]
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=0, atol=_tolerance(reduction, depth), err_msg=f"output {i}")
    return net


def _layer(net, name):
    return net.conf.vertices[name].layer


def _spec(net, name):
    return net.conf.spec(name).vertex


def test_mlp_gemm_fuses_activations_and_trains(tmp_path):
    w1, b1 = _normal(1, 16, 12), _normal(2, 16)  # transB: (out, in), as PyTorch exports Linear
    w2, b2 = _normal(3, 16, 5), _normal(4, 1, 5)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="act1"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], name="fc2", alpha=0.5, beta=2.0),
        helper.make_node("Softmax", ["z"], ["y"], name="probs"),
    ]
    model = _model(nodes, {"x": (12,)}, {"y": (5,)}, {"w1": w1, "b1": b1, "w2": w2, "b2": b2})
    x = _normal(5, 8, 12)
    net = _check(model, {"x": x}, reduction=16, depth=2, tmp_path=tmp_path)
    fc1, fc2 = _spec(net, "fc1"), _spec(net, "fc2")
    assert isinstance(fc1, L.DenseLayer) and fc1.activation is Activation.RELU
    assert isinstance(fc2, L.OutputLayer) and fc2.activation is Activation.SOFTMAX
    assert fc2.loss is LossFunction.MCXENT
    assert [s.name for s in net.conf.vertices] == ["fc1", "fc2"]  # the activations folded away
    net.save(tmp_path / "imported.zip")  # an ordinary network: a sparkgrad model file round-trips it
    np.testing.assert_array_equal(
        ComputationGraph.load(tmp_path / "imported.zip").output(x)[0], net.output(x)[0]
    )
    labels = np.eye(5, dtype=np.float32)[np.arange(8) % 5]
    data = DataSet(x, labels)
    before = net.score(data)
    for _ in range(20):
        net.fit(data)
    assert net.score(data) < before


def test_matmul_and_add_become_one_dense_with_sigmoid_output():
    w1, b1, w2 = _normal(1, 6, 10), _normal(2, 10), _normal(3, 10, 3)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m"], name="mm"),
        helper.make_node("Add", ["b1", "m"], ["h"], name="bias"),  # the constant first
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("MatMul", ["t", "w2"], ["z"], name="head"),
        helper.make_node("Sigmoid", ["z"], ["y"], name="sig"),
    ]
    model = _model(nodes, {"x": (6,)}, {"y": (3,)}, {"w1": w1, "b1": b1, "w2": w2})
    net = _check(model, {"x": _normal(4, 7, 6)}, reduction=10, depth=2)
    mm, head = _spec(net, "mm"), _spec(net, "head")
    assert mm.has_bias and mm.activation is Activation.TANH
    assert isinstance(head, L.OutputLayer) and not head.has_bias
    assert head.activation is Activation.SIGMOID and head.loss is LossFunction.XENT


def test_cnn_padding_pooling_batchnorm(tmp_path):
    c1, c2 = _normal(1, 8, 3, 3, 3, scale=0.3), _normal(2, 6, 8, 3, 3, scale=0.2)
    bn = [np.abs(_normal(s, 8)) + 0.5 if s in (3, 6) else _normal(s, 8) for s in (3, 4, 5, 6)]
    fc = _normal(7, 4, 6 * 4 * 4, scale=0.1)
    nodes = [
        helper.make_node("Conv", ["x", "c1", "c1b"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"], name="relu1"),
        # padded max pooling: the padding never wins
        helper.make_node(
            "MaxPool", ["ar"], ["p"], name="pool1", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "BatchNormalization", ["p", "g", "b", "m", "v"], ["n"], name="bn", epsilon=1e-3, momentum=0.8
        ),
        # asymmetric padding: a ZeroPaddingLayer in front of the convolution
        helper.make_node("Conv", ["n", "c2"], ["c"], name="conv2", pads=[0, 1, 2, 1], strides=[1, 1]),
        helper.make_node("AveragePool", ["c"], ["q"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["q"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="out", transB=1),
    ]
    weights = {
        "c1": c1,
        "c1b": _normal(8, 8),
        "g": bn[0],
        "b": bn[1],
        "m": bn[2],
        "v": bn[3],
        "c2": c2,
        "fc": fc,
    }
    model = _model(nodes, {"x": (3, 15, 15)}, {"y": (4,)}, weights)
    net = _check(model, {"x": _normal(9, 4, 3, 15, 15)}, reduction=96, depth=3, tmp_path=tmp_path)
    assert isinstance(_spec(net, "conv2/pad"), L.ZeroPaddingLayer)
    assert _spec(net, "conv2/pad").padding == (0, 2, 1, 1)
    assert _spec(net, "bn").decay == pytest.approx(0.8) and _spec(net, "bn").eps == pytest.approx(1e-3)
    out = _spec(net, "out")
    assert isinstance(out, L.OutputLayer) and out.loss is LossFunction.MSE


def test_graph_with_two_inputs_merges_and_two_outputs():
    ka, kb = _normal(1, 4, 2, 3, 3, scale=0.4), _normal(2, 4, 3, 1, 1, scale=0.4)
    w, v = _normal(3, 8, 6, scale=0.3), _normal(4, 8, 2, scale=0.3)
    nodes = [
        helper.make_node("Conv", ["a", "ka"], ["ca"], name="conv_a", auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("Conv", ["b", "kb"], ["cb"], name="conv_b", strides=[2, 2]),
        helper.make_node("Add", ["ca", "cb"], ["s"], name="sum"),
        helper.make_node("Mul", ["ca", "cb"], ["p"], name="product"),
        helper.make_node("Concat", ["s", "p"], ["cat"], name="cat", axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w"], ["z"], name="logits"),
        helper.make_node("Softmax", ["z"], ["y1"], name="y1"),
        # a second head reading the same features, through a standalone activation
        helper.make_node("Gemm", ["f", "v"], ["u"], name="reg"),
        helper.make_node("Relu", ["u"], ["ur"], name="reg_relu"),
        helper.make_node("Sigmoid", ["u"], ["y2"], name="y2"),
    ]
    inputs = {"a": (2, 9, 9), "b": (3, 9, 9)}
    outputs = {"y1": (6,), "y2": (2,), "ur": (2,)}
    model = _model(nodes, inputs, outputs, {"ka": ka, "kb": kb, "w": w, "v": v})
    feeds = {"a": _normal(5, 3, 2, 9, 9), "b": _normal(6, 3, 3, 9, 9)}
    net = _check(model, feeds, reduction=18, depth=3)
    assert net.conf.outputs == ["logits", "y2", "reg_relu"]
    assert isinstance(_spec(net, "cat"), MergeVertex) and isinstance(_spec(net, "sum"), ElementWiseVertex)
    # "reg" feeds two activations: it stays a DenseLayer, each activation an output LossLayer
    assert isinstance(_spec(net, "reg"), L.DenseLayer) and _spec(net, "reg").activation is Activation.IDENTITY
    assert _spec(net, "y2").loss is LossFunction.XENT and _spec(net, "y2").activation is Activation.SIGMOID
    assert _spec(net, "reg_relu").loss is LossFunction.MSE
    labels = [
        np.eye(6, dtype=np.float32)[[0, 3, 5]],
        np.full((3, 2), 0.5, np.float32),
        np.ones((3, 2), np.float32),
    ]
    data = MultiDataSet(list(feeds.values()), labels)
    before = net.score(data)
    for _ in range(20):
        net.fit(data)
    assert net.score(data) < before


@pytest.mark.parametrize(
    "resize",
    [
        {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},  # PyTorch's export
        {"coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_ceil"},
        {},  # ONNX's defaults: half_pixel, round_prefer_floor
    ],
)
def test_transposed_convolution_resize_and_pad(resize):
    k = _normal(1, 3, 4, 4, 4, scale=0.3)  # (in, out, kh, kw)
    fc = _normal(2, 4, 3, scale=0.3)
    nodes = [
        helper.make_node(
            "ConvTranspose", ["x", "k", "kb"], ["d"], name="up", strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["d"], ["dr"], name="up_relu"),
        helper.make_node("Resize", ["dr", "", "scales"], ["r"], name="resize", mode="nearest", **resize),
        helper.make_node("Pad", ["r", "pads"], ["pd"], name="pad", mode="constant"),
        helper.make_node("GlobalMaxPool", ["pd"], ["g"], name="gmp"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="out"),
    ]
    weights = {
        "k": k,
        "kb": _normal(3, 4),
        "fc": fc,
        "scales": np.array([1, 1, 2, 3], np.float32),
        "pads": np.array([0, 0, 1, 0, 0, 0, 2, 3], np.int64),
    }
    model = _model(nodes, {"x": (3, 5, 6)}, {"y": (3,)}, weights)
    # the relu'd upsampling is >= 0, so the zero padding decides nothing in the max: check it exists
    net = _check(model, {"x": _normal(4, 2, 3, 5, 6)}, reduction=48, depth=2)
    assert _spec(net, "up").activation is Activation.RELU
    assert _spec(net, "resize").size == (2, 3)
    assert _spec(net, "pad").padding == (1, 2, 0, 3)


def test_one_dimensional_convolution_over_sequences():
    k = _normal(1, 6, 4, 3, scale=0.4)
    fc = _normal(2, 6, 2, scale=0.4)
    nodes = [
        helper.make_node("Conv", ["x", "k", "kb"], ["c"], name="conv", pads=[1, 1]),
        helper.make_node("Elu", ["c"], ["e"], name="elu"),
        helper.make_node("MaxPool", ["e"], ["p0"], name="pool", kernel_shape=[2], strides=[2]),
        helper.make_node("BatchNormalization", ["p0", "bn_g", "bn_b", "bn_m", "bn_v"], ["p"], name="bn"),
        helper.make_node("AveragePool", ["p"], ["q"], name="avg", kernel_shape=[3], strides=[1], pads=[1, 1]),
        helper.make_node("GlobalAveragePool", ["q"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="out"),
    ]
    stats = {
        "bn_g": _normal(5, 6),
        "bn_b": _normal(6, 6),
        "bn_m": _normal(7, 6),
        "bn_v": np.abs(_normal(8, 6)) + 0.5,
    }
    model = _model(nodes, {"x": (4, 11)}, {"y": (2,)}, {"k": k, "kb": _normal(3, 6), "fc": fc, **stats})
    net = _check(model, {"x": _normal(4, 5, 4, 11)}, reduction=12, depth=3)
    assert (
        isinstance(_spec(net, "conv"), L.Convolution1DLayer)
        and _spec(net, "conv").activation is Activation.ELU
    )
    assert isinstance(_spec(net, "pool"), L.Subsampling1DLayer)


def test_layer_normalization_and_standalone_activations():
    w = _normal(1, 10, 8, scale=0.5)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gain", "beta"], ["n"], name="ln", epsilon=1e-4),
        helper.make_node("LeakyRelu", ["n"], ["l"], name="leaky"),  # ONNX's default alpha, DL4J's 0.01
        helper.make_node("Clip", ["l", "lo", "hi"], ["c"], name="hardtanh"),
        helper.make_node("Dropout", ["c"], ["d"], name="drop"),
        helper.make_node("Identity", ["d"], ["i"], name="same"),
        helper.make_node("MatMul", ["i", "w"], ["m"], name="mm"),
        helper.make_node("Softplus", ["m"], ["y"], name="softplus"),
    ]
    weights = {
        "gain": _normal(2, 10),
        "beta": _normal(3, 10),
        "lo": np.array(-1, np.float32),
        "hi": np.array(1, np.float32),
        "w": w,
    }
    model = _model(nodes, {"x": (10,)}, {"y": (8,)}, weights)
    net = _check(model, {"x": _normal(4, 6, 10, scale=3.0)}, reduction=10, depth=2)
    assert _spec(net, "leaky").activation is Activation.LEAKYRELU
    assert _spec(net, "hardtanh").activation is Activation.HARDTANH
    assert _spec(net, "mm").activation is Activation.SOFTPLUS and _spec(net, "mm").loss is LossFunction.MSE


def _mlp(node, extra: dict | None = None, features: int = 4, check: bool = True):
    """x (4) -> ``node`` (reading "x", writing "h") -> Gemm to 2 outputs."""
    nodes = [node, helper.make_node("Gemm", ["h", "w"], ["y"], name="out")]
    weights = {"w": _normal(1, features, 2), **(extra or {})}
    return _model(nodes, {"x": (4,)}, {"y": (2,)}, weights, check=check)


def _image_net(node, extra: dict | None = None, channels: int = 2, check: bool = True):
    nodes = [
        node,
        helper.make_node("GlobalAveragePool", ["h"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w"], ["y"], name="out"),
    ]
    weights = {"w": _normal(1, channels, 2), **(extra or {})}
    return _model(nodes, {"x": (2, 6, 6)}, {"y": (2,)}, weights, check=check)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: _mlp(helper.make_node("Selu", ["x"], ["h"], name="s")),
            r"'s' \(Selu\): unsupported operator Selu",
        ),
        (
            lambda: _mlp(helper.make_node("LeakyRelu", ["x"], ["h"], name="lr", alpha=0.2)),
            r"'lr' \(LeakyRelu\): unsupported alpha",
        ),
        (
            lambda: _mlp(
                helper.make_node("Clip", ["x", "lo", "hi"], ["h"], name="relu6"),
                {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)},
            ),
            r"'relu6' \(Clip\): unsupported clip range",
        ),
        (
            lambda: _mlp(
                helper.make_node("Gemm", ["x", "v"], ["h"], name="g", transA=1), {"v": _normal(2, 4, 4)}
            ),
            r"'g' \(Gemm\): unsupported transA=1",
        ),
        (
            lambda: _mlp(helper.make_node("Add", ["x", "c"], ["h"], name="shift"), {"c": _normal(2, 4)}),
            r"'shift' \(Add\): adds a constant other than as the bias",
        ),
        (
            lambda: _image_net(
                helper.make_node("Conv", ["x", "k"], ["h"], name="grouped", group=2),
                {"k": _normal(2, 2, 1, 3, 3)},
            ),
            r"'grouped' \(Conv\): unsupported group=2",
        ),
        (
            lambda: _image_net(
                helper.make_node("Conv", ["x", "k"], ["h"], name="dil", dilations=[2, 2]),
                {"k": _normal(2, 2, 2, 3, 3)},
            ),
            r"'dil' \(Conv\): unsupported dilations=\(2, 2\)",
        ),
        (
            lambda: _image_net(
                helper.make_node("MaxPool", ["x"], ["h"], name="mp", kernel_shape=[2, 2], ceil_mode=1)
            ),
            r"'mp' \(MaxPool\): unsupported ceil_mode=1",
        ),
        (
            lambda: _image_net(
                helper.make_node(
                    "AveragePool",
                    ["x"],
                    ["h"],
                    name="ap",
                    kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1],
                    count_include_pad=1,
                )
            ),
            r"'ap' \(AveragePool\): unsupported count_include_pad=1",
        ),
        (
            lambda: _image_net(
                helper.make_node("Resize", ["x", "", "s"], ["h"], name="rs", mode="linear"),
                {"s": np.array([1, 1, 2, 2], np.float32)},
            ),
            r"'rs' \(Resize\): unsupported mode='linear'",
        ),
        (
            lambda: _image_net(
                helper.make_node(
                    "Resize",
                    ["x", "", "s"],
                    ["h"],
                    name="rs",
                    mode="nearest",
                    coordinate_transformation_mode="asymmetric",
                    nearest_mode="round_prefer_ceil",
                ),
                {"s": np.array([1, 1, 2, 2], np.float32)},
            ),
            r"'rs' \(Resize\): unsupported nearest_mode='round_prefer_ceil'",
        ),
        (
            lambda: _image_net(
                helper.make_node("Resize", ["x", "", "s"], ["h"], name="rs", mode="nearest"),
                {"s": np.array([1, 1, 1.5, 2], np.float32)},
            ),
            r"'rs' \(Resize\): unsupported scales",
        ),
    ],
)
def test_what_does_not_map_is_refused_naming_the_node(make, match):  # fmt: skip
    with pytest.raises(OnnxImportError, match=match):
        import_onnx_model(make())


def test_broadcasting_and_softmax_on_images_are_refused():
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["a"], name="a"),
        helper.make_node("Gemm", ["x", "v"], ["b"], name="b"),
        helper.make_node("Add", ["a", "b"], ["y"], name="broadcast"),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
            [numpy_helper.from_array(_normal(1, 4, 3), "w"), numpy_helper.from_array(_normal(2, 4, 1), "v")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(OnnxImportError, match=r"'broadcast' \(Add\): unsupported input shapes"):
        import_onnx_model(model)
    soft = _image_net(helper.make_node("Softmax", ["x"], ["h"], name="sm", axis=1))
    with pytest.raises(OnnxImportError, match=r"'sm' \(Softmax\): softmax over a \(2, 6, 6\) tensor"):
        import_onnx_model(soft)


def test_unknown_axes_and_bad_bytes_are_refused(tmp_path):
    model = _mlp(helper.make_node("Relu", ["x"], ["h"], name="r"))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"
    with pytest.raises(OnnxImportError, match=r"ONNX input 'x': only the batch axis may be unknown"):
        import_onnx_model(model)
    path = tmp_path / "broken.onnx"
    good = _mlp(helper.make_node("Relu", ["x"], ["h"], name="r")).SerializeToString()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(OnnxImportError, match=f"{path}: not an ONNX model"):
        import_onnx_model(path)
    with pytest.raises(OnnxImportError, match="the given bytes: not an ONNX model"):
        import_onnx_model(b"\x00" * 64)
    with pytest.raises(FileNotFoundError):
        import_onnx_model(tmp_path / "missing.onnx")


# Constant inputs of the wrong rank, size or element type, or with a value out of range, are refused naming
# the node and the input (onnx's checker would refuse most of them first: check=False).
_PADS = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
_NOT_ONE_FINITE_NUMBER = [
    np.full((2, 2), -1, np.float32),
    np.zeros(0, np.float32),
    np.array(np.nan, np.float32),
    np.array(-np.inf, np.float32),
]
_NOT_AXES = [
    np.array([2, 3], np.int64).reshape(1, 1, 2),
    np.array(2, np.int64),
    np.array([2, 3], np.float32),
    np.array([6, 7], np.int64),  # of a rank-4 tensor: in [-4, 4)
    np.array([-6, -5], np.int64),
]


@pytest.mark.parametrize("bound", ["min", "max"])
@pytest.mark.parametrize("value", _NOT_ONE_FINITE_NUMBER)
def test_clip_bound_that_is_not_one_finite_number_is_refused(bound, value):
    bounds = {"min": np.array(-1, np.float32), "max": np.array(1, np.float32), bound: value}
    model = _mlp(helper.make_node("Clip", ["x", "min", "max"], ["h"], name="clip"), bounds, check=False)
    with pytest.raises(OnnxImportError, match=rf"'clip' \(Clip\): its {bound} must be one finite number"):
        import_onnx_model(model)


@pytest.mark.parametrize("value", _NOT_ONE_FINITE_NUMBER)
def test_pad_constant_value_that_is_not_one_finite_number_is_refused(value):
    node = helper.make_node("Pad", ["x", "pads", "value"], ["h"], name="pad")
    model = _image_net(node, {"pads": _PADS, "value": value}, check=False)
    with pytest.raises(OnnxImportError, match=r"'pad' \(Pad\): its constant_value must be one finite number"):
        import_onnx_model(model)


@pytest.mark.parametrize(
    "pads",
    [
        _PADS.reshape(2, 4),
        np.array(1, np.int64),
        _PADS.astype(np.float32),
        np.array([0, 0, 1, 2**64 - 1, 0, 0, 1, 1], np.uint64),
        np.array([0, 0, 1 << 62, 1, 0, 0, 1 << 62, 1], np.int64),  # its padded size overflows int64
    ],
)
def test_pads_other_than_a_vector_of_int32s_are_refused(pads):
    model = _image_net(helper.make_node("Pad", ["x", "pads"], ["h"], name="pad"), {"pads": pads}, check=False)
    with pytest.raises(OnnxImportError, match=r"'pad' \(Pad\): its pads must be a 1-D tensor of integers"):
        import_onnx_model(model)


@pytest.mark.parametrize("pads", [[0, 0, -1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 1, -2]])
def test_negative_pads_crop_and_are_refused(pads):
    model = _image_net(helper.make_node("Pad", ["x", "pads"], ["h"], name="pad"), {"pads": np.array(pads)})
    with pytest.raises(OnnxImportError, match=r"'pad' \(Pad\): its pads must be >= 0 \(negative pads crop"):
        import_onnx_model(model)


def _resize(given: str, value: np.ndarray, check: bool = True):
    """x (2, 6, 6) -> a nearest Resize by the constant ``value`` as its input ``given`` (scales or sizes)."""
    inputs = {"scales": ["x", "", "scales"], "sizes": ["x", "", "", "sizes"]}[given]
    node = helper.make_node("Resize", inputs, ["h"], name="resize", mode="nearest")
    return _image_net(node, {given: value}, check=check)


def _fix_batch(model, batch: int):
    """``model`` with its inputs and outputs declaring ``batch`` examples."""
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = batch
    return model


def test_resize_by_sizes_and_by_the_largest_factor():
    model = _fix_batch(_resize("sizes", np.array([2, 2, 12, 18])), 2)  # ONNX resizes the batch too
    net = _check(model, {"x": _normal(1, 2, 2, 6, 6)}, reduction=216, depth=1)
    assert _spec(net, "resize").size == (2, 3)
    sizes = [  # sizes computed from the input's Shape: any batch
        helper.make_node("Shape", ["x"], ["shape"], name="shape", end=2),
        helper.make_node("Concat", ["shape", "spatial"], ["sizes"], name="sizes", axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["h"], name="resize", mode="nearest"),
    ]
    model = _image_net(sizes[0], {"spatial": np.array([12, 18])}, check=False)
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[0], *sizes[1:], *nodes[1:]])
    onnx.checker.check_model(model)
    net = _check(model, {"x": _normal(2, 3, 2, 6, 6)}, reduction=216, depth=1)
    assert _spec(net, "resize").size == (2, 3)
    net = import_onnx_model(_resize("scales", np.array([1, 1, 1 << 16, 1], np.float32)))
    assert _spec(net, "resize").size == (1 << 16, 1)


@pytest.mark.parametrize(
    "given, value",
    [
        ("scales", np.array([1, 1, 2, 2], np.float32).reshape(2, 2)),
        ("scales", np.array(2, np.float32)),
        ("scales", np.array([1, 1, 2, 2])),
        ("scales", np.array([1, 1, np.nan, 2], np.float32)),
        ("scales", np.array([1, 1, 2, np.inf], np.float32)),
        ("sizes", np.array([2, 2, 12, 12]).reshape(2, 2)),
        ("sizes", np.array(12)),
        ("sizes", np.array([2, 2, 12, 12], np.float32)),
    ],
)
def test_resize_scales_or_sizes_other_than_a_vector_of_their_type_are_refused(given, value):
    with pytest.raises(OnnxImportError, match=rf"'resize' \(Resize\): its {given} must be a 1-D tensor of"):
        import_onnx_model(_resize(given, value, check=False))


@pytest.mark.parametrize("batch", [None, 3])
def test_resize_sizes_that_resize_the_batch_are_refused(batch):
    """ONNX resizes the batch axis to sizes[0] too (a batch of 3 came back as 2 examples); sparkgrad's
    batch is the data's, so a constant sizes[0] must be the batch the inputs declare."""
    model = _resize("sizes", np.array([2, 2, 12, 18]), check=batch is None)
    if batch is not None:
        model = _fix_batch(model, batch)
    inputs = "free" if batch is None else batch
    with pytest.raises(
        OnnxImportError, match=rf"'resize' \(Resize\): its sizes fix the batch at 2, the inputs' is {inputs}"
    ):
        import_onnx_model(model)


@pytest.mark.parametrize(
    "given, value",
    [
        ("scales", np.array([1, 1, 1e30, 1], np.float32)),
        ("scales", np.array([1, 1, 2, 1 + (1 << 16)], np.float32)),
        ("sizes", np.array([2, 2, 6 << 17, 6])),
    ],
)
def test_resize_factors_beyond_2_to_the_16_are_refused(given, value):
    match = rf"'resize' \(Resize\): unsupported {given} \(whole factors in \[1, 65536\]"
    with pytest.raises(OnnxImportError, match=match):
        import_onnx_model(_resize(given, value, check=False))


@pytest.mark.parametrize(
    "shape",
    [
        np.array([[-1, 18]], np.int64),
        np.array(18, np.int64),
        np.array([-1, 18], np.float32),
        np.array([2**64 - 1, 18], np.uint64),
        np.array([-1, 1 << 40], np.int64),
    ],
)
def test_reshape_shape_other_than_a_vector_of_int32s_is_refused(shape):
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w"], ["y"], name="out"),
    ]
    model = _model(
        nodes, {"x": (2, 3, 3)}, {"y": (4,)}, {"w": _normal(1, 18, 4), "shape": shape}, check=False
    )
    with pytest.raises(OnnxImportError, match=r"'flatten' \(Reshape\): its shape must be a 1-D tensor"):
        import_onnx_model(model)


@pytest.mark.parametrize("axes", _NOT_AXES)
def test_squeeze_axes_other_than_a_vector_of_the_tensors_axes_are_refused(axes):
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
        helper.make_node("Squeeze", ["g", "axes"], ["f"], name="squeeze"),
        helper.make_node("Gemm", ["f", "w"], ["y"], name="out"),
    ]
    model = _model(nodes, {"x": (2, 6, 6)}, {"y": (2,)}, {"w": _normal(1, 2, 2), "axes": axes}, check=False)
    with pytest.raises(OnnxImportError, match=r"'squeeze' \(Squeeze\): its axes must be a 1-D tensor of int"):
        import_onnx_model(model)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum"])
@pytest.mark.parametrize("axes", _NOT_AXES)
def test_reduce_axes_other_than_a_vector_of_the_tensors_axes_are_refused(op, axes):
    nodes = [
        helper.make_node(op, ["x", "axes"], ["g"], name="pool", keepdims=0),
        helper.make_node("Gemm", ["g", "w"], ["y"], name="out"),
    ]
    weights = {"w": _normal(1, 2, 2), "axes": axes}
    model = _model(nodes, {"x": (2, 6, 6)}, {"y": (2,)}, weights, opset=18, check=False)
    with pytest.raises(OnnxImportError, match=rf"'pool' \({op}\): its axes must be a 1-D tensor of integers"):
        import_onnx_model(model)


# the longest dot product of each model: Linear(12, 32), Conv2d(1, 6, 5) then Conv2d(6, 12, 3) (54) and
# Linear(108, 10), ConvTranspose2d(4, 6, 4) then Conv2d(6, 3, 3) (54), Conv1d(3, 8, 5) then Conv1d(8, 8, 3)
# (24), Conv2d(8, 8, 3) (72)
_EXPORTED = {"mlp": 32, "cnn": 108, "upsampling": 54, "conv1d": 24, "residual": 72}


@pytest.mark.parametrize("name", sorted(_EXPORTED))
def test_models_pytorch_exported_give_pytorchs_outputs(name):
    """PyTorch's exporter's own graphs (Gemm with transB, batch norm, padding computed by a constant
    subgraph, Resize, 1-D convolutions, LayerNormalization, a residual graph): the import gives PyTorch's
    outputs, which ONNX's reference implementation gives too (a check on the files)."""
    model = onnx.load(DATA / f"{name}.onnx")
    data = np.load(DATA / f"{name}.npz")
    x, expected = data["x"], data["y"]
    reference = ReferenceEvaluator(model).run(None, {"x": x})[0]
    depth = sum(n.op_type in ("Gemm", "Conv", "ConvTranspose") for n in model.graph.node)
    tol = _tolerance(_EXPORTED[name], depth)
    np.testing.assert_allclose(reference, expected, rtol=0, atol=tol)
    net = import_onnx_model(model)
    (got,) = net.output(x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)


def test_constant_subgraphs_fold_and_are_bounded():
    """A Reshape's shape computed from constants (as exporters write it) folds at import; a constant-only
    node that is not shape arithmetic, or one that would make a huge constant, is refused."""
    w = _normal(1, 2 * 3 * 3, 4)
    nodes = [
        helper.make_node("Constant", [], ["batch"], value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Constant", [], ["rest"], value=numpy_helper.from_array(np.array([18], np.int64))),
        helper.make_node("Concat", ["batch", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w"], ["y"], name="out"),
    ]
    model = _model(nodes, {"x": (2, 3, 3)}, {"y": (4,)}, {"w": w})
    net = _check(model, {"x": _normal(2, 5, 2, 3, 3)}, reduction=18, depth=1)
    assert isinstance(_spec(net, "flatten"), PreprocessorVertex)

    huge = helper.make_node("ConstantOfShape", ["dims"], ["h"], name="huge")
    nodes = [huge, helper.make_node("Add", ["x", "h"], ["y"], name="add")]
    model = _model(nodes, {"x": (4,)}, {"y": (4,)}, {"dims": np.array([1 << 40, 4], np.int64)})
    with pytest.raises(OnnxImportError, match=r"'huge' \(ConstantOfShape\): would make a constant of 4398"):
        import_onnx_model(model)
    noise = helper.make_node("RandomNormal", [], ["n"], name="noise", shape=[1, 4])
    nodes = [noise, helper.make_node("Add", ["x", "n"], ["y"], name="add")]
    model = _model(nodes, {"x": (4,)}, {"y": (4,)}, {})
    with pytest.raises(OnnxImportError, match=r"'noise' \(RandomNormal\): computes from constants only"):
        import_onnx_model(model)


def test_a_second_output_or_a_mismatched_kernel_is_refused():
    nodes = [
        helper.make_node("Dropout", ["x"], ["d", "mask"], name="drop"),
        helper.make_node("Identity", ["mask"], ["h"], name="same"),
        helper.make_node("Gemm", ["h", "w"], ["y"], name="out"),
    ]
    model = _model(nodes, {"x": (4,)}, {"y": (2,)}, {"w": _normal(1, 4, 2)}, check=False)  # a bool mask
    with pytest.raises(OnnxImportError, match=r"'same' \(Identity\): reads 'mask', which no earlier node"):
        import_onnx_model(model)
    conv = helper.make_node("Conv", ["x", "k"], ["h"], name="conv", kernel_shape=[3, 3])
    model = _image_net(conv, {"k": _normal(2, 2, 2, 1, 1)})
    with pytest.raises(
        OnnxImportError, match=r"'conv' \(Conv\): unsupported kernel_shape \(the weight's is \(1, 1\)\)"
    ):
        import_onnx_model(model)


def test_embeddings_of_integer_inputs_beside_numeric_features():
    """Gather from a table by an integer model input becomes an EmbeddingLayer reading that input;
    sparkgrad takes the indices as (batch, 1) whether ONNX's input is (batch,) or (batch, 1)."""
    users, items = _normal(1, 30, 6), _normal(2, 9, 3)
    w, v = _normal(3, 6 + 3 + 4, 8, scale=0.4), _normal(4, 8, 1, scale=0.4)
    nodes = [
        helper.make_node("Gather", ["users", "user"], ["u"], name="user_embedding"),
        helper.make_node("Gather", ["items", "item"], ["i3"], name="item_embedding"),
        helper.make_node("Squeeze", ["i3", "one"], ["i"], name="squeeze"),
        helper.make_node("Concat", ["u", "i", "x"], ["c"], name="cat", axis=1),
        helper.make_node("Gemm", ["c", "w"], ["h"], name="deep"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "v"], ["z"], name="out"),
        helper.make_node("Sigmoid", ["z"], ["y"], name="p"),
    ]
    graph = helper.make_graph(
        nodes,
        "ctr",
        [
            helper.make_tensor_value_info("user", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("item", TensorProto.INT64, ["N", 1]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [
            numpy_helper.from_array(a, n)
            for n, a in {"users": users, "items": items, "w": w, "v": v, "one": np.array([1])}.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    rng = np.random.default_rng(5)
    user, item, x = rng.integers(0, 30, 7), rng.integers(0, 9, (7, 1)), _normal(6, 7, 4)
    (expected,) = ReferenceEvaluator(model).run(None, {"user": user, "item": item, "x": x})
    net = import_onnx_model(model)
    (got,) = net.output(user[:, None], item, x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=_tolerance(13, 2))
    table = _spec(net, "user_embedding")
    assert isinstance(table, L.EmbeddingLayer) and (table.n_in, table.n_out) == (30, 6)
    assert net.conf.spec("user_embedding").inputs == ["user"]
    assert _spec(net, "out").loss is LossFunction.XENT
    # an index outside the table is refused as sparkgrad refuses it, naming the layer
    with pytest.raises(ValueError, match="user_embedding"):
        net.output(np.array([[30]]), item[:1], x[:1])


def test_integer_inputs_other_than_indices_or_their_sequences_are_refused():
    nodes = [helper.make_node("Gather", ["table", "tokens"], ["y"], name="lookup")]
    graph = helper.make_graph(
        nodes,
        "grid",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4, 2])],
        [numpy_helper.from_array(_normal(1, 20, 2), "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(
        OnnxImportError, match=r"ONNX input 'tokens': integer input of shape \(batch, \[3, 4\]\)"
    ):
        import_onnx_model(model)
    relu = helper.make_node("Relu", ["user"], ["h"], name="relu")
    graph = helper.make_graph(
        [relu],
        "bad",
        [helper.make_tensor_value_info("user", TensorProto.INT64, ["N", 1])],
        [helper.make_tensor_value_info("h", TensorProto.INT64, ["N", 1])],
    )
    with pytest.raises(OnnxImportError, match=r"'relu' \(Relu\): reads the integer input 'user'"):
        import_onnx_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_wide_and_deep_pytorch_exported_gives_pytorchs_output():
    model = onnx.load(DATA / "wide_and_deep.onnx")
    data = np.load(DATA / "wide_and_deep.npz")
    feeds = {n: data[n] for n in ("user", "item", "x")}
    np.testing.assert_allclose(
        ReferenceEvaluator(model).run(None, feeds)[0], data["y"], rtol=0, atol=_tolerance(17, 2)
    )
    net = import_onnx_model(model)
    assert net.conf.inputs == ["user", "item", "x"]
    (got,) = net.output(feeds["user"][:, None], feeds["item"], feeds["x"])
    np.testing.assert_allclose(got, data["y"], rtol=0, atol=_tolerance(17, 2))


def _check_batch_first(model, x: np.ndarray, tolerance: float):
    """The model reads ``x`` as (batch, time, features); the imported network, given it as (batch,
    features, time), gives the reference evaluator's output. Returns the network."""
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    net = import_onnx_model(model)
    (got,) = net.output(x.transpose(0, 2, 1))
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)
    return net


def _token_model(nodes, steps: int, output: tuple, weights: dict):
    """A checked model reading token indices "tokens" (batch, steps), writing float "y" (batch, *output)."""
    graph = helper.make_graph(
        nodes,
        "tokens",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", steps])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *output])],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _check_tokens(model, tokens: np.ndarray):
    """(the imported network, its output for ``tokens`` given as (batch, 1, time), the reference's)."""
    (expected,) = ReferenceEvaluator(model).run(None, {"tokens": tokens})
    net = import_onnx_model(model)
    (got,) = net.output(tokens[:, None, :])
    return net, got, expected


def _recurrent_weights(seed: int, dirs: int, gates: int, hidden: int, features: int) -> dict:
    return {
        "W": _normal(seed, dirs, gates * hidden, features, scale=0.4),
        "R": _normal(seed + 1, dirs, gates * hidden, hidden, scale=0.4),
        "B": _normal(seed + 2, dirs, 2 * gates * hidden, scale=0.3),
    }


def test_lstm_on_batch_first_features_last_step_and_final_state():
    """PyTorch's pattern for nn.LSTM(batch_first=True): Transpose to time-major, LSTM, Squeeze of the
    directions axis, Transpose back, the last step by Gather; beside it the final state Y_h. sparkgrad
    takes the (batch, time, features) input as (batch, features, time)."""
    steps, features, hidden = 7, 3, 5
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], name="to_time_major", perm=[1, 0, 2]),
        helper.make_node("LSTM", ["xt", "W", "R", "B"], ["Y", "Y_h"], name="lstm", hidden_size=hidden),
        helper.make_node("Squeeze", ["Y", "one"], ["ys"], name="squeeze"),
        helper.make_node("Transpose", ["ys"], ["yb"], name="to_batch_first", perm=[1, 0, 2]),
        helper.make_node("Gather", ["yb", "last"], ["h"], name="last_step", axis=1),
        helper.make_node("Gather", ["Y_h", "zero"], ["state"], name="final_state", axis=0),
        helper.make_node("Concat", ["h", "state"], ["both"], name="both", axis=1),
        helper.make_node("Gemm", ["both", "w"], ["z"], name="out"),
        helper.make_node("Softmax", ["z"], ["y"], name="probs"),
    ]
    weights = _recurrent_weights(1, 1, 4, hidden, features) | {
        "w": _normal(9, 2 * hidden, 3),
        "one": np.array([1]),
        "last": np.array(-1),
        "zero": np.array(0),
    }
    model = _model(nodes, {"x": (steps, features)}, {"y": (3,)}, weights)
    net = _check_batch_first(model, _normal(4, 6, steps, features), _tolerance(features + hidden, steps))
    lstm = _spec(net, "lstm")
    assert isinstance(lstm, L.LSTM) and lstm.n_out == hidden
    assert isinstance(_spec(net, "last_step"), LastTimeStepVertex)
    assert isinstance(_spec(net, "lstm/last"), LastTimeStepVertex)


@pytest.mark.parametrize("layout", [0, 1])
def test_bidirectional_gru_over_token_sequences_pooled_over_time(layout):
    """A text classifier: token indices (batch, time) looked up in a table (an EmbeddingSequenceLayer),
    a bidirectional GRU whose directions' outputs are merged by Reshape into features (sparkgrad's
    Bidirectional CONCAT), averaged over time by ReduceMean (global pooling)."""
    steps, size, hidden = 6, 4, 3
    to_gru = [helper.make_node("Transpose", ["e"], ["et"], name="to_time_major", perm=[1, 0, 2])]
    gru_in = "et" if layout == 0 else "e"
    nodes = [
        helper.make_node("Gather", ["table", "tokens"], ["e"], name="embed"),
        *(to_gru if layout == 0 else []),
        helper.make_node(
            "GRU", [gru_in, "W", "R", "B"], ["Y"], name="gru", hidden_size=hidden, direction="bidirectional",
            layout=layout,
        ),
        # (time, 2, batch, h) -> (time, batch, 2, h) -> (time, batch, 2h); layout 1: (batch, time, 2, h)
        *(
            [helper.make_node("Transpose", ["Y"], ["Yt"], name="directions_last", perm=[0, 2, 1, 3])]
            if layout == 0
            else []
        ),
        helper.make_node("Reshape", ["Yt" if layout == 0 else "Y", "merge"], ["m"], name="merge"),
        helper.make_node("ReduceMean", ["m"], ["p"], name="mean", axes=[0 if layout == 0 else 1], keepdims=0),
        helper.make_node("Gemm", ["p", "w"], ["y"], name="out"),
    ]  # fmt: skip
    weights = _recurrent_weights(3, 2, 3, hidden, size) | {
        "table": _normal(1, 30, size),
        "merge": np.array([0, 0, -1]),
        "w": _normal(2, 2 * hidden, 2),
    }
    model = _token_model(nodes, steps, (2,), weights)
    net, got, expected = _check_tokens(model, np.random.default_rng(4).integers(0, 30, (5, steps)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=_tolerance(size + hidden, steps))
    assert isinstance(_spec(net, "embed"), L.EmbeddingSequenceLayer)
    assert isinstance(_spec(net, "gru"), L.Bidirectional) and isinstance(_spec(net, "gru").layer, L.GRU)
    assert isinstance(_spec(net, "mean"), L.GlobalPoolingLayer)


def test_simple_rnn_and_recurrent_refusals():
    steps, features, hidden = 5, 2, 4
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[1, 0, 2]),
        helper.make_node(
            "RNN", ["xt", "W", "R"], ["Y", "Y_h"], name="rnn", hidden_size=hidden, activations=["Tanh"]
        ),
        helper.make_node("Squeeze", ["Y_h", "zero"], ["h"], name="final"),
        helper.make_node("Gemm", ["h", "w"], ["y"], name="out"),
    ]
    weights = _recurrent_weights(5, 1, 1, hidden, features) | {
        "w": _normal(2, hidden, 2),
        "zero": np.array([0]),
    }
    del weights["B"]
    model = _model(nodes, {"x": (steps, features)}, {"y": (2,)}, weights)
    net = _check_batch_first(model, _normal(3, 4, steps, features), _tolerance(features + hidden, steps))
    assert _spec(net, "rnn").activation is Activation.TANH

    def variant(**attrs):
        node = helper.make_node(
            "GRU", ["xt", "W", "R"], ["Y", "Y_h"], name="gru", hidden_size=hidden, **attrs
        )
        w = _recurrent_weights(5, 2 if attrs.get("direction") == "bidirectional" else 1, 3, hidden, features)
        del w["B"]
        graph = [nodes[0], node, *nodes[2:]]
        extra = w | {"w": weights["w"], "zero": weights["zero"]}
        return _model(graph, {"x": (steps, features)}, {"y": (2,)}, extra, check=False)  # refused first

    with pytest.raises(OnnxImportError, match=r"'gru' \(GRU\): unsupported linear_before_reset"):
        import_onnx_model(variant(linear_before_reset=1))  # what PyTorch's nn.GRU exports
    with pytest.raises(OnnxImportError, match=r"'gru' \(GRU\): unsupported direction='reverse'"):
        import_onnx_model(variant(direction="reverse"))
    with pytest.raises(OnnxImportError, match=r"'gru' \(GRU\): its final state is read: of both directions"):
        import_onnx_model(variant(direction="bidirectional"))
    # the sequence read in the wrong order: a 1-D convolution of a time-major sequence
    conv = [nodes[0], helper.make_node("Conv", ["xt", "k"], ["y"], name="conv")]
    model = _model(conv, {"x": (steps, features)}, {"y": (2, 3)}, {"k": _normal(1, 2, 2, 2)}, check=False)
    with pytest.raises(OnnxImportError, match=r"'conv' \(Conv\): reads a sequence with axes \(time, batch"):
        import_onnx_model(model)


@pytest.mark.parametrize("name", ["text_lstm", "text_bilstm"])
def test_text_classifiers_pytorch_exported_give_pytorchs_outputs(name):
    """nn.Embedding + nn.LSTM(batch_first) as PyTorch exports them: its zero initial state computed from
    the batch size (Shape, Gather, Concat, ConstantOfShape), the time-major Transposes, the last step or
    (bidirectional) the directions merged by Reshape and the mean over time."""
    model = onnx.load(DATA / f"{name}.onnx")
    data = np.load(DATA / f"{name}.npz")
    tokens, expected = data["tokens"], data["y"]
    tol = _tolerance(8 + 16, 12 + 1)  # 12 steps of 8 inputs + 16 recurrent units, then the Linear
    np.testing.assert_allclose(
        ReferenceEvaluator(model).run(None, {"tokens": tokens})[0], expected, rtol=0, atol=tol
    )
    net = import_onnx_model(model)
    (got,) = net.output(tokens[:, None, :])
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)


def test_per_step_classifier_over_a_sequence():
    """A tagger: token embeddings, a MatMul + bias + Relu at every step, a per-step softmax over the
    classes. The output becomes an RnnOutputLayer; sparkgrad returns it as (batch, classes, time)."""
    steps, size, hidden, classes = 7, 5, 6, 3
    nodes = [
        helper.make_node("Gather", ["table", "tokens"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w1"], ["m"], name="hidden"),
        helper.make_node("Add", ["m", "b1"], ["h"], name="bias"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["z"], name="tags"),
        helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1),
    ]
    weights = {"table": _normal(1, 40, size), "w1": _normal(2, size, hidden), "b1": _normal(3, hidden)}
    weights["w2"] = _normal(4, hidden, classes)
    model = _token_model(nodes, steps, (steps, classes), weights)
    tokens = np.random.default_rng(5).integers(0, 40, (4, steps))
    net, got, expected = _check_tokens(model, tokens)
    np.testing.assert_allclose(got.transpose(0, 2, 1), expected, rtol=0, atol=_tolerance(hidden, 2))
    tags = _spec(net, "tags")
    assert isinstance(tags, L.RnnOutputLayer) and tags.activation is Activation.SOFTMAX
    assert tags.loss is LossFunction.MCXENT and _spec(net, "hidden").activation is Activation.RELU
    labels = np.eye(classes, dtype=np.float32)[np.random.default_rng(6).integers(0, classes, (4, steps))]
    data = DataSet(tokens[:, None, :], labels.transpose(0, 2, 1))
    before = net.score(data)
    for _ in range(10):
        net.fit(data)
    assert net.score(data) < before
    # a softmax over the time axis is refused
    model.graph.node[-1].attribute[0].i = 1
    with pytest.raises(OnnxImportError, match=r"'softmax' \(Softmax\): unsupported axis \(the features'\)=1"):
        import_onnx_model(model)
