"""ComputationGraph: a directed acyclic graph of layers and vertices over ONE flat parameter buffer.

A :class:`ComputationGraphConfiguration` names the network inputs, the vertices (each a layer or a
:mod:`~sparkgrad.nn.vertices` vertex, with its input names) and the outputs (output layers), built with
:class:`GraphBuilder`. It is validated where it is built: unknown, duplicate or unused names, cycles,
outputs that are not output layers and shape mismatches raise ValueError naming the vertex.

Layout: the layer vertices in topological order (Kahn's algorithm; among the vertices ready at once,
the one defined first goes first, so the order depends only on the configuration), each layer's
parameters in ``param_specs`` order, each array C-contiguous; vertices have no parameters. The
gradient and the update share one flat buffer with the same layout; the updater state is one flat
vector with one block per run of consecutive layers sharing an updater (as in MultiLayerNetwork).

Data: a DataSet feeds a graph with one input (and one output); a MultiDataSet feeds one features array
per input and one labels array per output, in the order of ``inputs`` and ``outputs``. The score is
the sum over the outputs of each output's mean loss (DL4J), plus the l1/l2 penalty once. Each output's
loss takes its labels mask; without one, the features masks of the inputs it depends on (propagated
through the vertices, DL4J's rules) mask its loss.

Sequences: recurrent inputs (``InputType.recurrent``) take features (batch, size, time) and masks
(batch, time). Layers run as in MultiLayerNetwork (:func:`~sparkgrad.nn._recurrent.layer_forward`:
recurrent layers see the sequence and its mask, other layers run at every time step with masked steps
zeroed); ``per_step`` vertices run at every time step. A layer passes its input's mask on, except that
a sequence-to-vector layer (LastTimeStep) ends it; a vertex combines its inputs' masks (``forward_mask``).
Recurrent outputs (RnnOutputLayer, RnnLossLayer) take labels (batch, n_out, time) and labels masks
(batch, time); their loss is summed over present steps and divided by the number of sequences.

Truncated BPTT (``backprop_type="truncated_bptt"``) works as in MultiLayerNetwork (the segmenting is
:class:`~sparkgrad.nn._flat_network.FlatNetwork`'s): ``fit`` cuts each minibatch into segments of
``tbptt_forward_length`` steps, one update each, every recurrent layer carrying its state from segment to
segment. As in DL4J, every sequence of the minibatch (recurrent inputs, recurrent outputs' labels and
their masks) is cut and must have the same length; a non-recurrent input or output (and its mask) goes
whole into every segment, so a vector output learns from each segment's last state.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Iterable

import numpy as np

from sparkgrad._config import Config
from sparkgrad.nn import layers as L
from sparkgrad.nn._flat_network import FlatNetwork, on_device
from sparkgrad.nn._recurrent import (
    LayerTrace,
    layer_backward,
    layer_forward,
    sequence_features,
    sequence_mask,
    steps_to_rows,
)
from sparkgrad.nn._runtime import index_dtype
from sparkgrad.nn.conf import BackpropType, check_backprop, check_network_defaults
from sparkgrad.nn.enums import Activation, GradientNormalization, WeightInit
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.updaters import Sgd, Updater
from sparkgrad.nn.vertices import GraphVertex, MergeVertex, vertex_error


@dataclasses.dataclass
class VertexSpec(Config):
    """One vertex of a graph configuration: its unique name, a layer or vertex, and its input names.

    Args:
        name: unique among inputs and vertices.
        vertex: a layer configuration (exactly one input) or a :class:`GraphVertex`.
        inputs: names of network inputs or other vertices, in order.
    """

    name: str
    vertex: Any
    inputs: list

    def __post_init__(self) -> None:
        _check_name("name", self.name)
        if not isinstance(self.vertex, (L.Layer, GraphVertex)):
            raise ValueError(f"vertex {self.name!r}: expected a layer or a GraphVertex, got {self.vertex!r}")
        if not isinstance(self.inputs, (list, tuple)) or not self.inputs:
            raise ValueError(f"vertex {self.name!r}: inputs: expected a non-empty list of names")
        self.inputs = list(self.inputs)
        for name in self.inputs:
            _check_name(f"vertex {self.name!r}: inputs", name)

    @property
    def is_layer(self) -> bool:
        return isinstance(self.vertex, L.Layer)


def _check_name(field: str, name: Any) -> None:
    # "@" starts the serialised form's reserved keys
    if not isinstance(name, str) or not name or name.startswith("@"):
        raise ValueError(f"{field}: expected a non-empty name not starting with '@', got {name!r}")


def _check_names(field: str, names: Any) -> list[str]:
    if not isinstance(names, (list, tuple)) or not names:
        raise ValueError(f"{field}: expected a non-empty list of names, got {names!r}")
    for name in names:
        _check_name(field, name)
    if len(set(names)) != len(names):
        raise ValueError(f"{field}: duplicate names in {list(names)}")
    return list(names)


@dataclasses.dataclass
class ComputationGraphConfiguration(Config):
    """A graph network: named inputs, vertices, outputs, input types and defaults for every layer.

    Build with :meth:`builder` (or :class:`GraphBuilder`). The defaults mean what they mean in
    :class:`~sparkgrad.nn.MultiLayerConfiguration`.

    Args:
        inputs: names of the network inputs, in the order features are given.
        vertices: :class:`VertexSpec` list (any order that defines each name once).
        outputs: names of the output layers, in the order labels are given.
        input_types: one InputType per input (feed-forward, convolutional, convolutional_flat or
            recurrent); they size every layer (``n_in``) and vertex.
        updater: network-wide default, as in MultiLayerConfiguration.
        seed: as in MultiLayerConfiguration.
        weight_init: network-wide default, as in MultiLayerConfiguration.
        activation: network-wide default, as in MultiLayerConfiguration.
        l1: network-wide default, as in MultiLayerConfiguration.
        l2: network-wide default, as in MultiLayerConfiguration.
        weight_decay: network-wide default, as in MultiLayerConfiguration.
        dtype: as in MultiLayerConfiguration.
        precision: as in MultiLayerConfiguration ("float32", "bf16" or "fp16": mixed precision on a GPU).
        backprop_type: as in MultiLayerConfiguration; truncated BPTT needs a recurrent input and a
            per-time-step output. ``fit`` cuts every sequence (recurrent inputs and outputs, with their
            masks) into segments and passes the other inputs and labels whole to every segment (DL4J's
            ComputationGraph).
        tbptt_forward_length: as in MultiLayerConfiguration.
        tbptt_backward_length: as in MultiLayerConfiguration.
        gradient_normalization: network-wide default, as in MultiLayerConfiguration.
        gradient_normalization_threshold: network-wide default, as in MultiLayerConfiguration.
    """

    inputs: list
    vertices: list
    outputs: list
    input_types: list
    updater: Updater = dataclasses.field(default_factory=lambda: Sgd(0.1))
    seed: int | None = None
    weight_init: WeightInit | str = WeightInit.XAVIER
    activation: Activation | str = Activation.SIGMOID
    l1: float = 0.0
    l2: float = 0.0
    weight_decay: float = 0.0
    dtype: str = "float32"
    precision: str = "float32"
    backprop_type: BackpropType | str = BackpropType.STANDARD
    tbptt_forward_length: int = 20
    tbptt_backward_length: int = 20
    gradient_normalization: GradientNormalization | str = GradientNormalization.NONE
    gradient_normalization_threshold: float = 1.0
    # Derived: vertex names in topological order, each vertex's input types and every name's output type.
    topological_order: list = dataclasses.field(init=False, repr=False, compare=False)
    vertex_input_types: dict = dataclasses.field(init=False, repr=False, compare=False)
    output_types: dict = dataclasses.field(init=False, repr=False, compare=False)

    @staticmethod
    def builder(**defaults: Any) -> GraphBuilder:
        """A :class:`GraphBuilder`; ``defaults`` are the network-wide settings (updater, seed, ...)."""
        return GraphBuilder(**defaults)

    def __post_init__(self) -> None:
        check_network_defaults(self)
        self.inputs = _check_names("inputs", self.inputs)
        self.outputs = _check_names("outputs", self.outputs)
        if not isinstance(self.vertices, (list, tuple)) or not self.vertices:
            raise ValueError("vertices: expected a non-empty list of VertexSpec")
        for spec in self.vertices:
            if not isinstance(spec, VertexSpec):
                raise ValueError(f"vertices: expected VertexSpec entries, got {spec!r}")
        # own copies: type inference fills each layer's n_in without touching the caller's specs
        self.vertices = [dataclasses.replace(spec) for spec in self.vertices]
        self._specs: dict[str, VertexSpec] = {}
        for spec in self.vertices:
            if spec.name in self._specs or spec.name in self.inputs:
                raise ValueError(f"vertex {spec.name!r}: the name is used twice")
            self._specs[spec.name] = spec
        self._check_structure()
        self.topological_order = self._topological_order()
        self._check_reachability()
        self._check_input_types()
        self._infer_types()
        self._check_frozen()
        types = self.output_types
        check_backprop(
            self,
            any(types[n].kind == "recurrent" for n in self.inputs)
            and any(types[n].kind == "recurrent" for n in self.outputs),
            " -> ".join(
                ", ".join(f"{n!r} {types[n].describe()}" for n in names)
                for names in (self.inputs, self.outputs)
            ),
            [(f"vertex {name!r}", spec.vertex) for name, spec in self._specs.items() if spec.is_layer],
        )

    def _check_structure(self) -> None:
        known = set(self.inputs) | set(self._specs)
        consumers: dict[str, list[str]] = {name: [] for name in known}
        for spec in self.vertices:
            for name in spec.inputs:
                if name not in known:
                    raise vertex_error(spec.name, spec.vertex, f"unknown input {name!r}")
                consumers[name].append(spec.name)
            count = len(spec.inputs)
            if spec.is_layer and count != 1:
                raise L.layer_error(
                    spec.name,
                    spec.vertex,
                    "inputs",
                    f"a layer takes one input, got {count} (GraphBuilder.add_layer merges several "
                    "with a MergeVertex)",
                )
            if not spec.is_layer:
                low, high = spec.vertex.min_inputs, spec.vertex.max_inputs
                if count < low or (high is not None and count > high):
                    wanted = (
                        f"{low}" if low == high else f"at least {low}" if high is None else f"{low}-{high}"
                    )
                    raise vertex_error(spec.name, spec.vertex, f"takes {wanted} inputs, got {count}")
        for name in self.outputs:
            spec = self._specs.get(name)
            if spec is None:
                raise ValueError(f"outputs: {name!r} is not a vertex")
            if not (spec.is_layer and spec.vertex.is_output):
                raise vertex_error(name, spec.vertex, "an output must be an OutputLayer or LossLayer")
        for spec in self.vertices:
            is_output = spec.is_layer and spec.vertex.is_output
            if is_output and spec.name not in self.outputs:
                raise vertex_error(spec.name, spec.vertex, "an output layer must be listed in outputs")
            if is_output and consumers[spec.name]:
                raise vertex_error(
                    spec.name,
                    spec.vertex,
                    f"an output layer cannot feed other vertices {consumers[spec.name]}",
                )
        for name in self.inputs:
            if not consumers[name]:
                raise ValueError(f"inputs: {name!r} feeds no vertex")
        for spec in self.vertices:
            source = spec.inputs[0]
            if not (spec.is_layer and spec.vertex.takes_indices):
                continue
            if source not in self.inputs:
                raise L.layer_error(
                    spec.name,
                    spec.vertex,
                    "inputs",
                    f"an embedding layer reads a graph input (the indices), got vertex {source!r}",
                )
            others = [
                c for c in consumers[source] if not getattr(self._specs[c].vertex, "takes_indices", False)
            ]
            if others:
                raise L.layer_error(
                    spec.name,
                    spec.vertex,
                    "inputs",
                    f"input {source!r} holds indices: only embedding layers may read it, not {others}",
                )

    @property
    def index_readers(self) -> dict[str, L.Layer]:
        """{input name: an embedding layer reading it}: the inputs that hold indices."""
        return {s.inputs[0]: s.vertex for s in self.vertices if s.is_layer and s.vertex.takes_indices}

    def _check_reachability(self) -> None:
        """Every vertex must lead to an output: a dead branch would get no gradient."""
        reaches = set(self.outputs)
        for name in reversed(self.topological_order):
            if name in reaches:
                reaches.update(self._specs[name].inputs)
        for spec in self.vertices:
            if spec.name not in reaches:
                raise vertex_error(spec.name, spec.vertex, "leads to no output")

    @property
    def no_gradient(self) -> set[str]:
        """The inputs and vertices that want no gradient of their output (nothing at or above them
        trains): the network inputs, the FrozenLayer vertices (which pass none back) and the vertices
        without parameters reading only such outputs."""
        dead = set(self.inputs)
        for name in self.topological_order:
            spec = self._specs[name]
            trains = spec.is_layer and spec.vertex.param_specs(self.vertex_input_types[name][0])
            if isinstance(spec.vertex, L.FrozenLayer) or (not trains and all(i in dead for i in spec.inputs)):
                dead.add(name)
        return dead

    def _check_frozen(self) -> None:
        """A trainable layer with parameters must get a gradient: a path to an output through no
        FrozenLayer (which passes none back)."""
        reached = set(self.outputs)
        for name in reversed(self.topological_order):
            spec = self._specs[name]
            if name in reached and not isinstance(spec.vertex, L.FrozenLayer):
                reached.update(spec.inputs)
        for spec in self.vertices:
            if (
                spec.name not in reached
                and spec.is_layer
                and not isinstance(spec.vertex, L.FrozenLayer)
                and spec.vertex.param_specs(self.vertex_input_types[spec.name][0])
            ):
                raise L.layer_error(
                    spec.name,
                    spec.vertex,
                    "frozen",
                    "has parameters but would get no gradient: every path from it to an output passes "
                    "through a FrozenLayer, which passes none back (DL4J's FrozenLayer); freeze it too",
                )

    def _topological_order(self) -> list[str]:
        position = {spec.name: i for i, spec in enumerate(self.vertices)}
        pending = {spec.name: len({n for n in spec.inputs if n in self._specs}) for spec in self.vertices}
        consumers: dict[str, set[str]] = {name: set() for name in self._specs}
        for spec in self.vertices:
            for name in spec.inputs:
                if name in self._specs:
                    consumers[name].add(spec.name)
        ready = [position[name] for name, count in pending.items() if count == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            name = self.vertices[heapq.heappop(ready)].name
            order.append(name)
            for consumer in consumers[name]:
                pending[consumer] -= 1
                if pending[consumer] == 0:
                    heapq.heappush(ready, position[consumer])
        if len(order) != len(self.vertices):
            # what is left is cycles and what hangs below them: peel off vertices feeding nothing left
            left = {name for name, count in pending.items() if count > 0}
            while True:
                below = {name for name in left if not consumers[name] & left}
                if not below:
                    break
                left -= below
            cycle = [spec.name for spec in self.vertices if spec.name in left]
            spec = self._specs[cycle[0]]
            raise vertex_error(spec.name, spec.vertex, f"is on a cycle through vertices {cycle}")
        return order

    def _check_input_types(self) -> None:
        types = self.input_types
        if not isinstance(types, (list, tuple)) or len(types) != len(self.inputs):
            raise ValueError(
                f"input_types: expected one InputType per input {self.inputs} "
                f"(GraphBuilder.set_input_types), got {types!r}"
            )
        self.input_types = list(types)
        for name, t in zip(self.inputs, self.input_types):
            if not isinstance(t, InputType):
                raise ValueError(f"input_types: input {name!r}: expected an InputType, got {t!r}")

    def _infer_types(self) -> None:
        out: dict[str, InputType] = {}
        for name, t in zip(self.inputs, self.input_types):
            # flat images are reshaped to NCHW where they enter the graph
            flat = t.kind == "convolutional_flat"
            out[name] = InputType.convolutional(t.height, t.width, t.channels) if flat else t
        in_types: dict[str, list[InputType]] = {}
        for name in self.topological_order:
            spec = self._specs[name]
            types = [out[i] for i in spec.inputs]
            in_types[name] = types
            if spec.is_layer:
                spec.vertex, out[name] = L.infer_layer(name, spec.vertex, types[0])
            else:
                out[name] = self._infer_vertex(spec, types)
        self.vertex_input_types = in_types
        self.output_types = out

    def _infer_vertex(self, spec: VertexSpec, types: list[InputType]) -> InputType:
        """A vertex's output type; recurrent inputs run a ``per_step`` vertex at every time step."""
        vertex = spec.vertex
        if vertex.time_series:
            reference = vertex.reference
            ref_type = dict(zip(self.inputs, self.input_types)).get(reference)
            if reference is not None and (ref_type is None or ref_type.kind != "recurrent"):
                raise vertex_error(spec.name, vertex, f"{reference!r} is not a recurrent network input")
            out = vertex.infer(spec.name, types)
            if out.kind == "recurrent" and ref_type is not None:
                out = InputType.recurrent(out.size, ref_type.time_steps)
            return out
        recurrent = [t.kind == "recurrent" for t in types]
        if not any(recurrent):
            return vertex.infer(spec.name, types)
        described = ", ".join(t.describe() for t in types)
        if not vertex.per_step:
            raise vertex_error(spec.name, vertex, f"does not take recurrent input, got {described}")
        if not all(recurrent):
            raise vertex_error(
                spec.name, vertex, f"inputs must be all recurrent or all non-recurrent, got {described}"
            )
        steps = {t.time_steps for t in types if t.time_steps is not None}
        if len(steps) > 1:
            raise vertex_error(spec.name, vertex, f"inputs have different time steps {sorted(steps)}")
        out = vertex.infer(spec.name, [InputType.feed_forward(t.size) for t in types])
        return InputType.recurrent(out.size, steps.pop() if steps else None)

    def check_output_index(self, output_index: Any) -> None:
        """ValueError unless ``output_index`` is a position in ``outputs`` (an int, not a bool)."""
        outputs = self.outputs
        if (
            isinstance(output_index, bool)
            or not isinstance(output_index, int)
            or not 0 <= output_index < len(outputs)
        ):
            raise ValueError(
                f"output_index: expected 0..{len(outputs) - 1} for outputs {outputs}, got {output_index!r}"
            )

    def spec(self, name: str) -> VertexSpec:
        """The :class:`VertexSpec` named ``name`` (KeyError for an unknown name)."""
        return self._specs[name]

    def setting(self, name: str, field: str) -> Any:
        """Effective value of an inheritable setting for the layer vertex ``name``."""
        value = getattr(self._specs[name].vertex, field, None)
        return getattr(self, field) if value is None else value


class GraphBuilder:
    """Builds a :class:`ComputationGraphConfiguration` step by step (DL4J's GraphBuilder).

    Args:
        defaults: network-wide settings passed to the configuration (updater, seed, weight_init,
            activation, l1, l2, weight_decay, dtype, precision, backprop_type, tbptt_forward_length,
            tbptt_backward_length, gradient_normalization, gradient_normalization_threshold).
    """

    def __init__(self, **defaults: Any) -> None:
        self._defaults = defaults
        self._inputs: list[str] = []
        self._vertices: list[VertexSpec] = []
        self._outputs: list[str] = []
        self._input_types: list[InputType] = []  # set_input_types; the configuration names it if missing

    def add_inputs(self, *names: str) -> GraphBuilder:
        """Declare network inputs, in the order their features are given."""
        self._inputs.extend(names)
        return self

    def add_layer(self, name: str, layer: L.Layer, *inputs: str) -> GraphBuilder:
        """Add a layer vertex. Several inputs are concatenated by an implicit MergeVertex ``<name>-merge``."""
        if not isinstance(layer, L.Layer):
            raise TypeError(
                f"add_layer: {name!r}: expected a layer configuration, got {type(layer).__name__}"
            )
        if len(inputs) > 1:
            merge = f"{name}-merge"
            self._vertices.append(VertexSpec(merge, MergeVertex(), list(inputs)))
            inputs = (merge,)
        self._vertices.append(VertexSpec(name, layer, list(inputs)))
        return self

    def add_vertex(self, name: str, vertex: GraphVertex, *inputs: str) -> GraphBuilder:
        """Add a parameter-free vertex (MergeVertex, ElementWiseVertex, ...)."""
        if not isinstance(vertex, GraphVertex):
            raise TypeError(f"add_vertex: {name!r}: expected a GraphVertex, got {type(vertex).__name__}")
        self._vertices.append(VertexSpec(name, vertex, list(inputs)))
        return self

    def set_outputs(self, *names: str) -> GraphBuilder:
        """The output layers, in the order their labels are given."""
        self._outputs = list(names)
        return self

    def set_input_types(self, *input_types: InputType) -> GraphBuilder:
        """One InputType per input, in input order."""
        self._input_types = list(input_types)
        return self

    def build(self) -> ComputationGraphConfiguration:
        """Validate and return the configuration (ValueError naming the vertex on a problem)."""
        return ComputationGraphConfiguration(
            inputs=list(self._inputs),
            vertices=list(self._vertices),
            outputs=list(self._outputs),
            input_types=self._input_types,
            **self._defaults,
        )


class _Node:
    """Runtime of one vertex: its runtime object and where its inputs come from."""

    def __init__(
        self,
        spec: VertexSpec,
        index: int,
        runtime: Any,
        no_gradient: set[str],
        conf: ComputationGraphConfiguration,
    ) -> None:
        self.name = spec.name
        self.layer = spec.vertex if spec.is_layer else None
        self.index = index  # topological position: the dropout seed's unit index
        self.inputs = spec.inputs
        self.runtime = runtime
        self.is_layer = spec.is_layer
        self.is_output = spec.is_layer and spec.vertex.is_output
        # whether some input wants dL/d(input): not the network inputs, nor what only frozen layers read
        self.need_dx = any(name not in no_gradient for name in spec.inputs)
        self.frozen = isinstance(spec.vertex, L.FrozenLayer)
        # recurrent input: a layer sees (N, T, C) and the mask, a vertex runs at every time step
        self.input_type = conf.vertex_input_types[spec.name][0]
        self.sequence = self.input_type.kind == "recurrent"
        self.per_step = self.sequence and not spec.is_layer and spec.vertex.per_step
        self.time_series = not spec.is_layer and spec.vertex.time_series
        self.reference = spec.vertex.reference if self.time_series else None
        self.recurrent_output = conf.output_types[spec.name].kind == "recurrent"
        self.input_shape: tuple[int, ...] = ()
        self.input_shapes: list[tuple[int, ...]] = []  # a per-step vertex's inputs, for its backward
        self.trace: LayerTrace | None = None


def _as_list(value: Any) -> list:
    return [] if value is None else list(value)


class ComputationGraph(FlatNetwork):
    """A graph network built from a :class:`ComputationGraphConfiguration`.

    Args:
        conf: the configuration (not copied; treat it as immutable once the network exists).
        device: where parameters, gradients, updater state and activations live and the kernels run:
            ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`~sparkgrad.device.Device`.
    """

    _conf_class = ComputationGraphConfiguration
    conf: ComputationGraphConfiguration

    @classmethod
    def _layer_units(cls, conf: ComputationGraphConfiguration) -> list[tuple[Any, L.Layer, InputType]]:
        return [
            (name, conf.spec(name).vertex, conf.vertex_input_types[name][0])
            for name in conf.topological_order
            if conf.spec(name).is_layer
        ]

    def _build_runtimes(self) -> None:
        """The layers' runtimes (FlatNetwork's) plus the vertices' and the graph nodes over them."""
        super()._build_runtimes()
        conf = self.conf
        layer_runtimes = dict(zip(self._layer_keys, self._runtimes))
        no_gradient = conf.no_gradient
        self._nodes = []
        for index, name in enumerate(conf.topological_order):
            spec = conf.spec(name)
            runtime = (
                layer_runtimes[name]
                if spec.is_layer
                else spec.vertex.build_runtime(conf.vertex_input_types[name], self.dtype, self._device)
            )
            self._nodes.append(_Node(spec, index, runtime, no_gradient, conf))
        self._by_name = {node.name: node for node in self._nodes}
        self._sum_buffers: dict[str, Any] = {}

    def _sole_consumers(self) -> dict[Any, Any]:
        readers: dict[str, list[str]] = {}
        for spec in self.conf.vertices:
            for name in spec.inputs:
                readers.setdefault(name, []).append(spec.name)
        return {
            name: found[0]
            for name, found in readers.items()
            if len(found) == 1 and self.conf.spec(found[0]).is_layer and name not in self.conf.outputs
        }

    # -- data preparation -----------------------------------------------------------------------
    @staticmethod
    def _parts(data: Any) -> tuple[list, list, list, list]:
        """(features, labels, features masks, labels masks) of a DataSet or MultiDataSet, as lists."""
        if hasattr(data, "features_masks"):  # MultiDataSet
            return (
                list(data.features),
                _as_list(data.labels),
                _as_list(data.features_masks),
                _as_list(data.labels_masks),
            )
        if hasattr(data, "features"):  # DataSet
            labels = getattr(data, "labels", None)
            return (
                [data.features],
                [] if labels is None else [labels],
                [getattr(data, "features_mask", None)],
                [getattr(data, "labels_mask", None)],
            )
        raise TypeError(f"data: expected a DataSet or MultiDataSet, got {type(data).__name__}")

    def _inputs(self, features: list) -> list[np.ndarray]:
        """Features as the graph's inputs see them: contiguous, network dtype, flat images as NCHW."""
        names = self.conf.inputs
        if len(features) != len(names):
            raise ValueError(
                f"features: the graph has {len(names)} input(s) {names}, got {len(features)} array(s)"
            )
        out: list[np.ndarray] = []
        for k, (name, raw, it) in enumerate(zip(names, features, self.conf.input_types)):
            where = f"features[{k}] (input {name!r})"
            reader = self.conf.index_readers.get(name)
            x = self._device.asarray(
                raw, self.dtype if reader is None else index_dtype(reader, raw, self.dtype)
            )
            if it.kind == "recurrent":
                x = sequence_features(x, it, self._device, where)  # (N, T, C)
            elif it.kind == "convolutional_flat":
                if x.ndim != 2 or x.shape[1] != it.size:
                    raise ValueError(
                        f"{where}: expected shape (batch, {it.size}) (flattened images), got {x.shape}"
                    )
                x = x.reshape((x.shape[0], *it.shape()))
            elif x.shape[1:] != it.shape():
                raise ValueError(
                    f"{where}: expected shape (batch, {', '.join(map(str, it.shape()))}), got {x.shape}"
                )
            if x.shape[0] == 0:
                raise ValueError(f"{where}: the minibatch has no examples")
            if out and x.shape[0] != out[0].shape[0]:
                raise ValueError(f"{where}: has {x.shape[0]} examples, features[0] has {out[0].shape[0]}")
            out.append(x)
        return out

    def _check_rows(self, outs: list[np.ndarray], ys: list[np.ndarray]) -> None:
        """Labels have one row per example the output produced (a StackVertex multiplies them)."""
        for j, (name, out, y) in enumerate(zip(self.conf.outputs, outs, ys)):
            if y.shape[0] != out.shape[0]:
                raise ValueError(
                    f"labels[{j}] (output {name!r}): has {y.shape[0]} rows, the output gives {out.shape[0]}"
                )

    def _feature_masks(self, masks: list, xs: list[np.ndarray]) -> list[np.ndarray | None]:
        """Masks per input: (N, T) for recurrent inputs, per-example (N,) otherwise; None where none."""
        if len(masks) > len(xs):
            raise ValueError(f"features_masks: {len(masks)} masks for {len(xs)} input(s) {self.conf.inputs}")
        out: list[np.ndarray | None] = []
        for k, x in enumerate(xs):
            m = masks[k] if k < len(masks) else None
            if m is not None and self.conf.input_types[k].kind == "recurrent":
                where = f"features_masks[{k}] (input {self.conf.inputs[k]!r})"
                m = sequence_mask(m, x, self._device, self.dtype, where)
            elif m is not None:
                m = self._device.asarray(m, self.dtype)
                if m.shape not in ((x.shape[0],), (x.shape[0], 1)):
                    raise ValueError(
                        f"features_masks[{k}]: expected a per-example mask of shape ({x.shape[0]},) or "
                        f"({x.shape[0]}, 1) for input {self.conf.inputs[k]!r}, got {m.shape}"
                    )
                m = m.reshape(-1)
            out.append(m)
        return out

    def _labels(self, labels: list, masks: list) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        names = self.conf.outputs
        if not labels:
            raise ValueError("dataset: labels are required for training and scoring")
        if len(labels) != len(names):
            raise ValueError(
                f"labels: the graph has {len(names)} output(s) {names}, got {len(labels)} array(s)"
            )
        ys, ms = [], []
        for j, (name, raw) in enumerate(zip(names, labels)):
            where = f"labels[{j}] (output {name!r})"
            n_out = self.conf.output_types[name].size
            sequence = self.conf.output_types[name].kind == "recurrent"
            if sequence:  # per-step labels (N, n_out, T) -> (N*T, n_out) output rows
                y = steps_to_rows(raw, self._device, self.dtype, where, is_mask=False)
            else:
                y = self._device.asarray(raw, self.dtype)
            if y.ndim != 2 or y.shape[1] != n_out:
                shape = f"(batch, {n_out}, time)" if sequence else f"(batch, {n_out})"
                raise ValueError(f"{where}: expected shape {shape}, got {np.shape(raw)}")
            m = masks[j] if j < len(masks) else None
            if m is not None:
                m = (
                    steps_to_rows(m, self._device, self.dtype, f"labels_masks[{j}] (output {name!r})", True)
                    if sequence
                    else self._device.asarray(m, self.dtype)
                )
                if m.shape not in ((y.shape[0],), (y.shape[0], 1), y.shape):
                    raise ValueError(
                        f"labels_masks[{j}] (output {name!r}): expected shape ({y.shape[0]},), "
                        f"({y.shape[0]}, 1) or {y.shape}, got {m.shape}"
                    )
            ys.append(y)
            ms.append(m)
        return ys, ms

    def _prepare(self, data: Any) -> tuple[list[np.ndarray], list[np.ndarray], list, list]:
        """(inputs, labels as output rows, labels masks as rows, features masks) of a minibatch."""
        features, labels, fmasks, lmasks = self._parts(data)
        xs = self._inputs(features)
        ys, label_masks = self._labels(labels, lmasks)
        return xs, ys, label_masks, self._feature_masks(fmasks, xs)

    def _loss_masks(self, label_masks: list) -> list[np.ndarray | None]:
        """Each output's loss mask as output rows: its labels mask, else the features masks that reached
        it through the graph in the last forward pass (DL4J)."""
        return [
            m if m is not None else (None if (fm := self._masks[name]) is None else fm.reshape(-1))
            for m, name in zip(label_masks, self.conf.outputs)
        ]

    # -- forward / backward -------------------------------------------------------------------
    def _forward(
        self,
        xs: list[np.ndarray],
        masks: list[np.ndarray | None],
        train: bool,
        activate_outputs: bool,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> list[np.ndarray]:
        """Forward pass; keeps every vertex's mask in ``self._masks``. Outputs: activated ones as the
        vertex produces them ((N, T, C) for sequences), pre-activations as output rows. ``stateful``:
        recurrent layers continue from the state their previous stateful forward ended in;
        ``backward_steps`` (truncated BPTT) limits their backward to the last that many steps."""
        acts: dict[str, np.ndarray] = dict(zip(self.conf.inputs, xs))
        self._masks: dict[str, np.ndarray | None] = dict(zip(self.conf.inputs, masks))
        folds, absorbed = self._inference_plan(train)
        for node in self._nodes:
            ins = [acts[name] for name in node.inputs]
            in_masks = [self._masks[name] for name in node.inputs]
            if node.name in folds or node.name in absorbed:  # inference: conv + batch norm (+ activation)
                acts[node.name] = folds[node.name].forward(ins[0]) if node.name in folds else ins[0]
                self._masks[node.name] = in_masks[0]
                continue
            if node.time_series:  # LastTimeStepVertex, DuplicateToTimeSeriesVertex
                ref = node.reference
                acts[node.name], self._masks[node.name] = node.runtime.forward_time_series(
                    ins[0], in_masks[0], *((acts[ref], self._masks[ref]) if ref is not None else (None, None))
                )
                continue
            if not node.is_layer:
                if node.per_step:  # at every time step: (N, T, C) -> (N*T, C) rows and back
                    node.input_shapes = [x.shape for x in ins]
                    n, t = ins[0].shape[:2]
                    y = node.runtime.forward([x.reshape(n * t, -1) for x in ins])
                    acts[node.name] = y.reshape(n, t, -1)
                else:
                    acts[node.name] = node.runtime.forward(ins)
                self._masks[node.name] = node.runtime.forward_mask(in_masks)
                continue
            x, mask = ins[0], in_masks[0]
            assert node.layer is not None  # node.is_layer
            node.input_shape = x.shape
            acts[node.name], node.trace = layer_forward(
                node.runtime, node.layer, node.input_type, x, mask if node.sequence else None, train,
                self._seed(node.index), preout=node.is_output and not activate_outputs, stateful=stateful,
                backward_steps=backward_steps,
            )  # fmt: skip
            # a sequence-to-vector layer (LastTimeStep) ends the sequence mask; other layers pass it on (the
            # 1-D layers that change the number of steps, their own)
            passed = node.trace.mask if node.sequence else mask  # a per-example mask goes on as it is
            self._masks[node.name] = passed if node.sequence == node.recurrent_output else None
        return [acts[name] for name in self.conf.outputs]

    def _summed(self, name: str, grads: list[np.ndarray]) -> np.ndarray:
        """The total gradient of a vertex's output from its consumers (each sum has its own buffer)."""
        if len(grads) == 1:
            return grads[0]
        out = self._sum_buffers.get(name)
        if out is None or out.shape != grads[0].shape:
            out = self._sum_buffers[name] = self._device.xp.empty(grads[0].shape, dtype=self.dtype)
        xp = self._device.xp
        self._device.kernels.elementwise_forward("add", [xp.ascontiguousarray(g) for g in grads], out)
        return out

    def _gradient(self, dataset: Any, loss_scale: float = 1.0) -> float:
        """Flat gradient (no regularization) of the loss times ``loss_scale`` into ``self._grad``; returns
        the (unscaled) score with penalties."""
        self._require_init()
        xs, ys, label_masks, input_masks = self._prepare(dataset)
        sequences = [x.shape[1] for x, t in zip(xs, self.conf.input_types) if t.kind == "recurrent"]
        steps = self._tbptt_backward_steps(dataset, max(sequences, default=0))
        outs = self._forward(
            xs, input_masks, train=True, activate_outputs=False, stateful=steps is not None,
            backward_steps=steps,
        )  # fmt: skip
        self._check_rows(outs, ys)
        masks = self._loss_masks(label_masks)
        grads: dict[str, list[np.ndarray]] = {}
        score = 0.0
        for name, y, mask in zip(self.conf.outputs, ys, masks):
            node = self._by_name[name]
            n = node.input_shape[0]  # examples (sequences), whatever the rows of the output
            score += float(node.runtime.scores(y, mask).sum()) / n
            dx = node.runtime.backward(y, mask, n, need_dx=node.need_dx, loss_scale=loss_scale)
            if dx is not None:
                grads.setdefault(node.inputs[0], []).append(dx.reshape(node.input_shape))
        for node in reversed(self._nodes):
            # an output, a frozen layer (it passes nothing back) or what only frozen layers read
            if node.is_output or node.frozen or node.name not in grads:
                continue
            dy = self._summed(node.name, grads.pop(node.name))
            if node.is_layer:
                assert node.trace is not None  # set by the forward pass
                dx = layer_backward(node.runtime, dy, node.trace, need_dx=node.need_dx)
                if dx is not None:
                    grads.setdefault(node.inputs[0], []).append(dx.reshape(node.input_shape))
            elif node.need_dx:
                if node.per_step:
                    shapes = node.input_shapes
                    dxs = node.runtime.backward(dy.reshape(shapes[0][0] * shapes[0][1], -1))
                    dxs = [dx.reshape(shape) for dx, shape in zip(dxs, shapes)]
                else:
                    dxs = node.runtime.backward(dy)
                for name, dx in zip(node.inputs, dxs):
                    if name in self._by_name and not self._by_name[name].frozen:
                        grads.setdefault(name, []).append(dx)
        for sl, _ in self._stats:
            self._grad[sl] = 0.0
        self._last_score = score + self._penalty()
        return self._last_score

    # -- inference and scoring ----------------------------------------------------------------
    @on_device
    def output(self, *features: Any, train: bool = False, features_masks: Any = None) -> list[Any]:
        """Activated outputs for one features array per input; new arrays.

        Args:
            features: one array per input in ``conf.inputs`` order (recurrent: (batch, size, time)), or a
                single DataSet/MultiDataSet whose features and features masks are used. Outputs are
                arrays of the network's device when the first features array is one, else NumPy.
            train: run in training mode (dropout on, batch statistics in batch norm).
            features_masks: one mask or None per input ((batch, time) for recurrent inputs); overrides
                a dataset's. Outputs at masked steps are zero.

        Returns:
            one array per output, in ``conf.outputs`` order: (batch, n_out), or (batch, n_out, time) for
            a recurrent output.
        """
        self._require_init()
        masks: list = []
        if len(features) == 1 and hasattr(features[0], "features"):
            parts = self._parts(features[0])
            features, masks = tuple(parts[0]), parts[2]
        if features_masks is not None:
            masks = list(features_masks)
        xs = self._inputs(list(features))
        outs = self._forward(xs, self._feature_masks(masks, xs), train=train, activate_outputs=True)
        given = features[0] if features else None
        return [
            self._result(y.transpose(0, 2, 1) if self._by_name[name].recurrent_output else y, given)
            for name, y in zip(self.conf.outputs, outs)
        ]

    @on_device
    def rnn_time_step(self, *features: Any, features_masks: Any = None) -> list[Any]:
        """Stateful inference: every recurrent layer continues from the state the previous call ended in
        (:meth:`rnn_clear_previous_state` forgets it).

        Args:
            features: one array per input; a recurrent input takes (batch, size) for one time step or
                (batch, size, time) for several.
            features_masks: optional mask per input ((batch, time), or (batch, 1) for one step).

        Returns:
            as :meth:`output`; when every recurrent input was given one step as 2-D, recurrent outputs
            are (batch, n_out).
        """
        self._require_init()
        kinds = [t.kind for t in self.conf.input_types]
        if "recurrent" not in kinds:
            raise ValueError("features: rnn_time_step needs a graph with a recurrent input")
        readers = self.conf.index_readers
        arrays = [
            self._device.asarray(
                f, index_dtype(readers[name], f, self.dtype) if name in readers else self.dtype
            )
            for name, f in zip(self.conf.inputs, features)
        ]
        single = len(arrays) == len(kinds) and all(
            a.ndim == 2 for a, kind in zip(arrays, kinds) if kind == "recurrent"
        )
        if single:
            arrays = [a[:, :, None] if kind == "recurrent" else a for a, kind in zip(arrays, kinds)]
        masks = list(features_masks or [])
        if single:
            masks = [None if m is None else self._device.asarray(m).reshape(-1, 1) for m in masks]
        xs = self._inputs(arrays)
        outs = self._forward(
            xs, self._feature_masks(masks, xs), train=False, activate_outputs=True, stateful=True
        )
        result = []
        given = features[0] if features else None
        for name, y in zip(self.conf.outputs, outs):
            if self._by_name[name].recurrent_output:
                y = y[:, 0] if single else y.transpose(0, 2, 1)
            result.append(self._result(y, given))
        return result

    def output_single(self, *features: Any, train: bool = False) -> np.ndarray:
        """The output of a graph with exactly one output (as :meth:`output`)."""
        if len(self.conf.outputs) != 1:
            raise ValueError(
                f"output_single: the graph has {len(self.conf.outputs)} outputs "
                f"{self.conf.outputs}; use output()"
            )
        return self.output(*features, train=train)[0]

    def _example_scores(self, dataset: Any) -> tuple[list[np.ndarray], list[int]]:
        """Per-example loss of every output (inference mode) and each output's example count."""
        xs, ys, label_masks, input_masks = self._prepare(dataset)
        self._check_rows(self._forward(xs, input_masks, train=False, activate_outputs=False), ys)
        masks = self._loss_masks(label_masks)
        scores, counts = [], []
        for name, y, mask in zip(self.conf.outputs, ys, masks):
            node = self._by_name[name]
            n = node.input_shape[0]
            # recurrent output: each example's loss is the sum over its (unmasked) steps
            scores.append(node.runtime.scores(y, mask).astype(np.float64).reshape(n, -1).sum(axis=1))
            counts.append(n)
        return scores, counts

    @on_device
    def score(self, dataset: Any = None) -> float:
        """Sum over the outputs of the mean loss (inference mode), plus the l1/l2 penalty.

        Args:
            dataset: a DataSet or MultiDataSet; None returns the score of the last minibatch trained.
        """
        self._require_init()
        if dataset is None:
            if self._last_score is None:
                raise ValueError("dataset: no minibatch has been trained yet, pass a DataSet or MultiDataSet")
            return self._last_score
        scores, counts = self._example_scores(dataset)
        return sum(float(s.sum()) / n for s, n in zip(scores, counts)) + self._penalty()

    @on_device
    def score_examples(self, dataset: Any, include_regularization_terms: bool = False) -> np.ndarray:
        """Per-example loss summed over the outputs (inference mode), optionally each plus the penalty;
        a NumPy array."""
        self._require_init()
        scores, counts = self._example_scores(dataset)
        scores = [self._device.to_host(s) for s in scores]
        if len(set(counts)) != 1:
            raise ValueError(f"dataset: the outputs have different example counts {counts}")
        total = np.sum(scores, axis=0)
        if include_regularization_terms:
            total += self._penalty()
        return total

    # -- evaluation ---------------------------------------------------------------------------
    def _batches(self, data: Any) -> Iterable[Any]:
        return [data] if hasattr(data, "features") else data

    @on_device
    def do_evaluation(self, data: Any, *evaluations: Any, output_index: int = 0) -> list:
        """Feed every batch of ``data`` through the graph into each evaluation (``.eval``); on a GPU each
        batch's output, labels and mask are copied to the host (evaluations count on the host).

        Args:
            data: a DataSet / MultiDataSet or an iterable of them.
            evaluations: evaluation objects (Evaluation, ROC, RegressionEvaluation, ...).
            output_index: which output (position in ``conf.outputs``) is evaluated.

        Returns:
            the evaluations, in order.
        """
        if not evaluations:
            raise ValueError("evaluations: pass at least one evaluation object")
        self.conf.check_output_index(output_index)
        self._require_init()
        for batch in self._batches(data):
            xs, ys, label_masks, input_masks = self._prepare(batch)
            outs = [
                y.reshape(-1, y.shape[-1]) if y.ndim == 3 and self._by_name[name].recurrent_output else y
                for name, y in zip(
                    self.conf.outputs, self._forward(xs, input_masks, train=False, activate_outputs=True)
                )
            ]
            self._check_rows(outs, ys)
            out = outs[output_index]
            masks = self._loss_masks(label_masks)
            to_host = self._device.to_host
            out, labels, mask = to_host(out), to_host(ys[output_index]), masks[output_index]
            mask = None if mask is None else to_host(mask)
            for ev in evaluations:
                ev.eval(labels, out, mask=mask) if mask is not None else ev.eval(labels, out)
        return list(evaluations)

    def evaluate(self, data: Any, output_index: int = 0) -> Any:
        """Classification :class:`sparkgrad.eval.Evaluation` of output ``output_index`` over ``data``."""
        from sparkgrad.eval import Evaluation

        return self.do_evaluation(data, Evaluation(), output_index=output_index)[0]

    def evaluate_roc(self, data: Any, threshold_steps: int = 0, output_index: int = 0) -> Any:
        """Binary :class:`sparkgrad.eval.ROC` of output ``output_index``."""
        from sparkgrad.eval import ROC

        return self.do_evaluation(data, ROC(threshold_steps=threshold_steps), output_index=output_index)[0]

    def evaluate_roc_multi_class(self, data: Any, threshold_steps: int = 0, output_index: int = 0) -> Any:
        """One-vs-all :class:`sparkgrad.eval.ROCMultiClass` of output ``output_index``."""
        from sparkgrad.eval import ROCMultiClass

        evaluation = ROCMultiClass(threshold_steps=threshold_steps)
        return self.do_evaluation(data, evaluation, output_index=output_index)[0]

    def evaluate_regression(self, data: Any, output_index: int = 0) -> Any:
        """:class:`sparkgrad.eval.RegressionEvaluation` of output ``output_index``."""
        from sparkgrad.eval import RegressionEvaluation

        return self.do_evaluation(data, RegressionEvaluation(), output_index=output_index)[0]

    def summary(self) -> str:
        """A table of vertices in topological order with inputs, types and parameter counts."""
        self._require_init()
        conf = self.conf
        ranges = dict(zip(self._layer_keys, self._layer_ranges))
        rows = [("vertex", "type", "inputs", "output", "params", "count")]
        for name in conf.inputs:
            rows.append((name, "input", "-", conf.output_types[name].describe(), "-", "0"))
        for name in conf.topological_order:
            spec = conf.spec(name)
            specs = spec.vertex.param_specs(conf.vertex_input_types[name][0]) if spec.is_layer else []
            shapes = ", ".join(f"{s.name}{list(s.shape)}" for s in specs) or "-"
            start, stop = ranges.get(name, (0, 0))
            rows.append(
                (
                    name,
                    type(spec.vertex).__name__,
                    ", ".join(spec.inputs),
                    conf.output_types[name].describe(),
                    shapes,
                    str(stop - start),
                )
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"Outputs: {', '.join(conf.outputs)}")
        lines.append(f"Total parameters: {self._n_params} ({conf.dtype})")
        return "\n".join(lines)


__all__ = ["ComputationGraph", "ComputationGraphConfiguration", "GraphBuilder", "VertexSpec"]
