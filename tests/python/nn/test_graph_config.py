"""ComputationGraphConfiguration: builder, exact JSON/YAML round trip, validation errors naming the vertex."""

from __future__ import annotations

import json
import math

import pytest

from sparkgrad.nn import (
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    ElementWiseVertex,
    GraphBuilder,
    InputType,
    L2NormalizeVertex,
    L2Vertex,
    LossLayer,
    MergeVertex,
    OutputLayer,
    PreprocessorVertex,
    ReshapeVertex,
    ScaleVertex,
    ShiftVertex,
    StackVertex,
    SubsetVertex,
    UnstackVertex,
    VertexSpec,
    updaters,
)
from sparkgrad.nn.vertices import CnnToFeedForwardPreProcessor, FeedForwardToCnnPreProcessor


def _two_in_two_out() -> GraphBuilder:
    return (
        ComputationGraphConfiguration.builder(updater=updaters.Adam(1e-3), seed=3, l2=1e-4, dtype="float64")
        .add_inputs("img", "vec")
        .set_input_types(InputType.convolutional_flat(6, 6, 1), InputType.feed_forward(5))
        .add_layer("conv", ConvolutionLayer(4, kernel_size=(3, 3), activation="relu"), "img")
        .add_vertex("flat", PreprocessorVertex(CnnToFeedForwardPreProcessor()), "conv")
        .add_layer("dense", DenseLayer(8, activation="tanh", updater=updaters.Sgd(0.05)), "vec")
        .add_layer("joint", DenseLayer(6), "flat", "dense")
        .add_vertex("half", SubsetVertex(0, 2), "joint")
        .add_vertex("scaled", ScaleVertex(0.5), "half")
        .add_layer("cls", OutputLayer(3), "joint")
        .add_layer("reg", OutputLayer(2, activation="identity", loss="mse"), "scaled")
        .set_outputs("cls", "reg")
    )


def test_builder_infers_sizes_and_inserts_the_implicit_merge():
    conf = _two_in_two_out().build()
    assert conf.topological_order == [
        "conv",
        "flat",
        "dense",
        "joint-merge",
        "joint",
        "half",
        "scaled",
        "cls",
        "reg",
    ]
    assert conf.spec("joint-merge").vertex == MergeVertex()
    assert conf.spec("joint-merge").inputs == ["flat", "dense"]
    assert conf.spec("joint").inputs == ["joint-merge"]
    assert conf.spec("joint").vertex.n_in == 4 * 4 * 4 + 8
    assert conf.spec("conv").vertex.n_in == 1
    assert conf.output_types["half"] == InputType.feed_forward(3)
    assert conf.output_types["img"] == InputType.convolutional(6, 6, 1)
    assert conf.setting("dense", "updater") == updaters.Sgd(0.05)
    assert conf.setting("joint", "updater") == updaters.Adam(1e-3)
    assert conf.setting("joint", "activation").value == "sigmoid"


def test_building_leaves_the_builder_reusable():
    b = (
        GraphBuilder()
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(3))
        .add_layer("out", OutputLayer(2), "x")
        .set_outputs("out")
    )
    assert b.build().spec("out").vertex.n_in == 3
    assert b._vertices[0].vertex.n_in is None
    assert b.set_input_types(InputType.feed_forward(5)).build().spec("out").vertex.n_in == 5


def test_json_and_yaml_round_trip_exactly():
    conf = _two_in_two_out().build()
    for back in (
        ComputationGraphConfiguration.from_json(conf.to_json()),
        ComputationGraphConfiguration.from_yaml(conf.to_yaml()),
    ):
        assert back == conf
        assert back.to_json() == conf.to_json()
        assert back.topological_order == conf.topological_order


def test_topological_order_follows_definition_order_among_ready_vertices():
    conf = (
        GraphBuilder()
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(3))
        .add_layer("out", OutputLayer(2), "b", "a")
        .add_layer("b", DenseLayer(2), "x")
        .add_layer("a", DenseLayer(2), "x")
        .set_outputs("out")
        .build()
    )
    assert conf.topological_order == ["b", "a", "out-merge", "out"]


def test_unknown_field_in_json_is_rejected():
    data = json.loads(_two_in_two_out().build().to_json())
    data["vertices"][0]["color"] = "red"
    with pytest.raises(ValueError, match="VertexSpec: unknown field 'color'"):
        ComputationGraphConfiguration.from_json(json.dumps(data))
    data = json.loads(_two_in_two_out().build().to_json())
    data["shortcut"] = True
    with pytest.raises(ValueError, match="unknown field 'shortcut'"):
        ComputationGraphConfiguration.from_json(json.dumps(data))


def _simple(*steps) -> GraphBuilder:
    b = GraphBuilder().add_inputs("x").set_input_types(InputType.feed_forward(4))
    for step in steps:
        step(b)
    return b


def _out(b: GraphBuilder, source: str = "x") -> None:
    b.add_layer("out", OutputLayer(2), source).set_outputs("out")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: _simple(lambda b: _out(b, "nope")).build(),
            "vertex 'out' \\(OutputLayer\\): unknown input 'nope'",
        ),
        (
            lambda: _simple(
                lambda b: b.add_layer("d", DenseLayer(3), "x").add_layer("d", DenseLayer(3), "x"), _out
            ).build(),
            "vertex 'd': the name is used twice",
        ),
        (
            lambda: _simple(lambda b: b.add_layer("x", DenseLayer(3), "x"), _out).build(),
            "vertex 'x': the name is used twice",
        ),
        (
            lambda: _simple(
                lambda b: b.add_vertex("a", ElementWiseVertex("add"), "x", "b").add_layer(
                    "b", DenseLayer(4), "a"
                ),
                lambda b: _out(b, "a"),
            ).build(),
            "vertex 'a' \\(ElementWiseVertex\\): is on a cycle through vertices \\['a', 'b'\\]",
        ),
        (
            lambda: _simple(lambda b: b.add_layer("out", OutputLayer(2), "x")).build(),
            "outputs: expected a non-empty list",
        ),
        (
            lambda: _simple(lambda b: b.add_layer("d", DenseLayer(3), "x").set_outputs("d")).build(),
            "vertex 'd' \\(DenseLayer\\): an output must be an OutputLayer or LossLayer",
        ),
        (
            lambda: _simple(_out, lambda b: b.add_layer("extra", OutputLayer(2), "x")).build(),
            "vertex 'extra' \\(OutputLayer\\): an output layer must be listed in outputs",
        ),
        (
            lambda: _simple(
                lambda b: b.add_layer("o1", OutputLayer(2), "x").add_layer("o2", OutputLayer(2), "o1"),
                lambda b: b.set_outputs("o1", "o2"),
            ).build(),
            "vertex 'o1' \\(OutputLayer\\): an output layer cannot feed other vertices",
        ),
        (
            lambda: _simple(lambda b: b.add_layer("dead", DenseLayer(3), "x"), _out).build(),
            "vertex 'dead' \\(DenseLayer\\): leads to no output",
        ),
        (
            lambda: (
                _simple(lambda b: b.add_inputs("unused"), _out)
                .set_input_types(InputType.feed_forward(4), InputType.feed_forward(2))
                .build()
            ),
            "inputs: 'unused' feeds no vertex",
        ),
        (
            lambda: _simple(
                lambda b: b.add_layer("a", DenseLayer(3), "x").add_layer("b", DenseLayer(5), "x"),
                lambda b: b.add_vertex("sum", ElementWiseVertex("add"), "a", "b"),
                lambda b: _out(b, "sum"),
            ).build(),
            "vertex 'sum' \\(ElementWiseVertex\\): inputs must have the same shape, got feed_forward\\(3\\), "
            "feed_forward\\(5\\)",
        ),
        (
            lambda: _simple(
                lambda b: b.add_layer("out", OutputLayer(2, n_in=7), "x").set_outputs("out")
            ).build(),
            "vertex 'out' \\(OutputLayer\\).n_in: is 7 but the input has size 4",
        ),
        (
            lambda: _simple(
                lambda b: b.add_vertex("s", ElementWiseVertex("subtract"), "x", "x", "x"),
                lambda b: _out(b, "s"),
            ).build(),
            "vertex 's' \\(ElementWiseVertex\\): subtract takes exactly 2 inputs, got 3",
        ),
        (
            lambda: _simple(lambda b: b.add_vertex("d", L2Vertex(), "x"), lambda b: _out(b, "d")).build(),
            "vertex 'd' \\(L2Vertex\\): takes 2 inputs, got 1",
        ),
        (
            lambda: _simple(
                lambda b: b.add_vertex("s", SubsetVertex(2, 4), "x"), lambda b: _out(b, "s")
            ).build(),
            "vertex 's' \\(SubsetVertex\\): to_index 4 is out of range for feed_forward\\(4\\)",
        ),
        (
            lambda: _simple(
                lambda b: b.add_vertex("r", ReshapeVertex((1, 3, 1)), "x"), lambda b: _out(b, "r")
            ).build(),
            "vertex 'r' \\(ReshapeVertex\\): shape \\(1, 3, 1\\) holds 3 values",
        ),
        (
            lambda: _simple(
                lambda b: b.add_vertex("p", PreprocessorVertex(FeedForwardToCnnPreProcessor(1, 2, 3)), "x"),
                lambda b: _out(b, "p"),
            ).build(),
            "vertex 'p' \\(PreprocessorVertex\\): needs dense input of size 6, got feed_forward\\(4\\)",
        ),
        (
            lambda: _simple(
                lambda b: b.add_layer("c", ConvolutionLayer(2), "x"), lambda b: _out(b, "c")
            ).build(),
            "vertex 'c' \\(ConvolutionLayer\\).input: needs convolutional input",
        ),
        (lambda: _simple(_out).set_input_types().build(), "input_types: expected one InputType per input"),
        (
            lambda: (
                _simple(lambda b: b.add_vertex("s", StackVertex(), "x"), lambda b: _out(b, "s"))
                .set_input_types(InputType.recurrent(4))
                .build()
            ),
            r"vertex 's' \(StackVertex\): does not take recurrent input",
        ),
    ],
)
def test_validation_errors_name_the_vertex(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (InputType.convolutional(5, 4, 1), "convolutional inputs must have one height and width"),
        (
            InputType.feed_forward(3),
            "inputs must be all dense or all convolutional, got .* PreprocessorVertex",
        ),
    ],
)
def test_merge_rejects_mismatched_inputs(second, message):
    b = (
        GraphBuilder()
        .add_inputs("a", "b")
        .set_input_types(InputType.convolutional(4, 4, 1), second)
        .add_vertex("m", MergeVertex(), "a", "b")
        .add_layer("out", OutputLayer(2), "m")
        .set_outputs("out")
    )
    with pytest.raises(ValueError, match="vertex 'm' \\(MergeVertex\\): " + message):
        b.build()


def test_a_layer_with_two_inputs_in_a_raw_configuration_is_rejected():
    with pytest.raises(
        ValueError, match="vertex 'out' \\(OutputLayer\\).inputs: a layer takes one input, got 2"
    ):
        ComputationGraphConfiguration(
            inputs=["a", "b"],
            vertices=[VertexSpec("out", OutputLayer(2), ["a", "b"])],
            outputs=["out"],
            input_types=[InputType.feed_forward(2), InputType.feed_forward(2)],
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "", "vertex": DenseLayer(2), "inputs": ["x"]}, "name: expected a non-empty name"),
        ({"name": "@type", "vertex": DenseLayer(2), "inputs": ["x"]}, "not starting with '@'"),
        ({"name": "d", "vertex": "dense", "inputs": ["x"]}, "vertex 'd': expected a layer or a GraphVertex"),
        (
            {"name": "d", "vertex": DenseLayer(2), "inputs": []},
            "vertex 'd': inputs: expected a non-empty list",
        ),
    ],
)
def test_vertex_spec_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VertexSpec(**kwargs)


def test_builder_type_errors_and_vertex_field_validation():
    with pytest.raises(TypeError, match="add_layer: 'v': expected a layer configuration"):
        GraphBuilder().add_layer("v", MergeVertex(), "x")
    with pytest.raises(TypeError, match="add_vertex: 'l': expected a GraphVertex"):
        GraphBuilder().add_vertex("l", LossLayer(), "x")
    with pytest.raises(ValueError, match="op: expected one of"):
        ElementWiseVertex("divide")
    with pytest.raises(ValueError, match="to_index: must be >= 3"):
        SubsetVertex(3, 1)
    with pytest.raises(ValueError, match="from_index: must be <= 1"):
        UnstackVertex(2, 2)
    with pytest.raises(ValueError, match="scale_factor: expected a finite number"):
        ScaleVertex(float("inf"))
    b = ComputationGraphConfiguration.builder(dtype="int8").add_inputs("x")
    _out(b.set_input_types(InputType.feed_forward(4)))
    with pytest.raises(ValueError, match="dtype: expected float32 or float64"):
        b.build()


@pytest.mark.parametrize(
    ("cls", "field", "kwargs"),
    [
        (ScaleVertex, "scale_factor", {}),
        (ShiftVertex, "shift_factor", {}),
        (L2Vertex, "eps", {}),
        (L2NormalizeVertex, "eps", {}),
    ],
)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e300])
def test_vertex_float_fields_reject_non_finite_and_huge_values(cls, field, kwargs, bad):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        cls(**{field: bad}, **kwargs)
    data = cls(**{field: 0.5}, **kwargs).to_dict()
    data[field] = repr(bad) if not math.isfinite(bad) else bad
    with pytest.raises(ValueError, match=rf"^{field}: "):
        cls.from_json(json.dumps(data))


def test_every_vertex_type_round_trips():
    b = (
        GraphBuilder()
        .add_inputs("x", "y")
        .set_input_types(InputType.feed_forward(12), InputType.feed_forward(12))
        .add_vertex("img", ReshapeVertex((3, 2, 2)), "x")
        .add_vertex("flat", PreprocessorVertex(CnnToFeedForwardPreProcessor()), "img")
        .add_vertex("back", PreprocessorVertex(FeedForwardToCnnPreProcessor(2, 2, 3)), "flat")
        .add_vertex("vec", ReshapeVertex((12,)), "back")
        .add_vertex("max", ElementWiseVertex("max"), "vec", "y")
        .add_vertex("norm", L2NormalizeVertex(eps=1e-6), "max")
        .add_vertex("scaled", ScaleVertex(2.0), "norm")
        .add_vertex("shifted", ShiftVertex(-1.0), "scaled")
        .add_vertex("stack", StackVertex(), "shifted", "y")
        .add_vertex("first", UnstackVertex(0, 2), "stack")
        .add_vertex("part", SubsetVertex(0, 5), "first")
        .add_vertex("dist", L2Vertex(), "x", "y")
        .add_layer("out", OutputLayer(2), "part", "dist")
        .set_outputs("out")
    )
    conf = b.build()
    assert conf.output_types["stack"] == InputType.feed_forward(12)
    assert conf.output_types["out-merge"] == InputType.feed_forward(7)
    for back in (
        ComputationGraphConfiguration.from_json(conf.to_json()),
        ComputationGraphConfiguration.from_yaml(conf.to_yaml()),
    ):
        assert back == conf
        assert back.spec("img").vertex.shape == (3, 2, 2)
        assert back.spec("back").vertex.preprocessor == FeedForwardToCnnPreProcessor(2, 2, 3)
