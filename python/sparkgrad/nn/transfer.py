"""Transfer learning: DL4J's TransferLearning builders and FineTuneConfiguration.

A builder starts from a trained network and edits its configuration: freeze a feature extractor
(:class:`~sparkgrad.nn.layers.FrozenLayer`), remove the output layer or more, change a layer's ``n_out``,
add layers and vertices, and override training settings with a :class:`FineTuneConfiguration`.
``build()`` returns a new, initialised network: every kept layer has its trained parameters, bit for
bit; new layers, and layers whose parameter shapes changed (``n_out_replace`` and the layers reading
the replaced one), are initialised from their configuration with the configuration's seed. The new
network starts with a fresh (zero) updater state and iteration and epoch counts at 0; the original
network is left as it was.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from sparkgrad._config import MAX_SCALE, Config, check_int, check_non_negative, check_positive, coerce_enum
from sparkgrad.nn import layers as L
from sparkgrad.nn.enums import Activation, GradientNormalization, WeightInit
from sparkgrad.nn.graph import ComputationGraph, VertexSpec
from sparkgrad.nn.network import MultiLayerNetwork
from sparkgrad.nn.updaters import Updater, check_updater
from sparkgrad.nn.vertices import GraphVertex, MergeVertex

# FineTuneConfiguration fields that are network-wide defaults and per-layer settings alike
_LAYER_SETTINGS = (
    "updater",
    "l1",
    "l2",
    "weight_decay",
    "dropout",
    "activation",
    "weight_init",
    "gradient_normalization",
    "gradient_normalization_threshold",
)
_NETWORK_SETTINGS = tuple(s for s in _LAYER_SETTINGS if s != "dropout") + ("seed",)


@dataclasses.dataclass
class FineTuneConfiguration(Config):
    """Training settings a TransferLearning builder overrides (DL4J's FineTuneConfiguration); None
    leaves a setting as the original network has it.

    A given setting replaces the network-wide default and the value of every layer that has the
    setting, so new layers take it unless they set their own; frozen layers ignore it (they do not
    train). One difference from DL4J: ``activation`` is not applied to output layers, whose
    activation goes with their loss.

    Args:
        updater: updater (learning rate, momentum, ...) of the trained layers.
        l1: l1 regularization, finite and in [0, MAX_SCALE].
        l2: l2 regularization, finite and in [0, MAX_SCALE].
        weight_decay: weight decay, finite and in [0, MAX_SCALE].
        dropout: retain probability of the layers that have ``dropout``, in (0, 1].
        activation: activation of the hidden layers that have one.
        weight_init: weight initialisation of new and re-initialised layers.
        gradient_normalization: a :class:`~sparkgrad.nn.GradientNormalization` (or its value).
        gradient_normalization_threshold: its bound, finite and in (0, MAX_SCALE].
        seed: seed of the new network (initialisation of its new layers, dropout).
    """

    updater: Updater | None = None
    l1: float | None = None
    l2: float | None = None
    weight_decay: float | None = None
    dropout: float | None = None
    activation: Activation | str | None = None
    weight_init: WeightInit | str | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.updater is not None:
            check_updater("updater", self.updater)
        for name in ("l1", "l2", "weight_decay"):
            if getattr(self, name) is not None:
                setattr(self, name, check_non_negative(name, getattr(self, name), MAX_SCALE))
        if self.dropout is not None:
            self.dropout = L._check_dropout("dropout", self.dropout)
        if self.gradient_normalization_threshold is not None:
            self.gradient_normalization_threshold = check_positive(
                "gradient_normalization_threshold", self.gradient_normalization_threshold, MAX_SCALE
            )
        for name, enum_cls in L._ENUM_SETTINGS.items():
            if getattr(self, name) is not None:
                setattr(self, name, coerce_enum(enum_cls, getattr(self, name), name))
        if self.seed is not None:
            self.seed = check_int("seed", self.seed, minimum=0)

    def _given(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def apply_to_layer(self, layer: Any, unset_only: bool = False) -> Any:
        """``layer`` with the given settings it has replaced (in the wrapped layer of Bidirectional and
        LastTimeStep); a FrozenLayer as it is. ``unset_only``: only where the layer leaves them None
        (a new layer's own settings win, as in DL4J)."""
        if isinstance(layer, L.FrozenLayer):
            return layer
        if isinstance(layer, (L.Bidirectional, L.LastTimeStep)):
            return dataclasses.replace(layer, layer=self.apply_to_layer(layer.layer, unset_only))
        fields = {f.name for f in dataclasses.fields(layer)}
        changes = {
            k: v
            for k, v in self._given(_LAYER_SETTINGS).items()
            if k in fields and not (unset_only and getattr(layer, k) is not None)
        }
        if layer.is_output:
            changes.pop("activation", None)
        return dataclasses.replace(layer, **changes) if changes else layer

    def network_settings(self) -> dict[str, Any]:
        """The given settings that are network-wide defaults (all but ``dropout``)."""
        return self._given(_NETWORK_SETTINGS)


def _without_n_in(layer: Any) -> Any:
    """``layer`` with ``n_in`` cleared (in a wrapped layer too), so that the new network infers it."""
    if isinstance(layer, (L.FrozenLayer, L.Bidirectional, L.LastTimeStep)):
        return dataclasses.replace(layer, layer=_without_n_in(layer.layer))
    if getattr(layer, "n_in", None) is not None:
        return dataclasses.replace(layer, n_in=None)
    return layer


def _n_out_replaced(where: str, layer: Any, n_out: Any, weight_init: Any) -> Any:
    n_out = check_int("n_out", n_out, minimum=1)
    if isinstance(layer, L.FrozenLayer):
        raise ValueError(f"{where}: is frozen; n_out_replace changes a layer that trains")
    if "n_out" not in {f.name for f in dataclasses.fields(layer)}:
        raise ValueError(f"{where} ({type(layer).__name__}): has no n_out to replace")
    changes: dict[str, Any] = {"n_out": n_out}
    if weight_init is not None:
        changes["weight_init"] = coerce_enum(WeightInit, weight_init, "weight_init")
    return dataclasses.replace(layer, **changes)


def _with_weight_init(layer: Any, weight_init: Any) -> Any:
    if weight_init is None or isinstance(layer, L.FrozenLayer):
        return layer
    value = coerce_enum(WeightInit, weight_init, "weight_init_next")
    if isinstance(layer, (L.Bidirectional, L.LastTimeStep)):
        return dataclasses.replace(layer, layer=_with_weight_init(layer.layer, value))
    if "weight_init" in {f.name for f in dataclasses.fields(layer)}:
        return dataclasses.replace(layer, weight_init=value)
    return layer


def _frozen(layer: L.Layer) -> L.Layer:
    return layer if isinstance(layer, L.FrozenLayer) else L.FrozenLayer(layer)


def _copy_kept(old: Any, new: Any, kept: dict[Any, Any]) -> None:
    """Copy the parameters of the kept layers ({new key: old key}) from ``old`` into ``new``; a layer
    whose parameter shapes changed keeps its new initialisation."""
    old_params, params = old.params(), new.params().copy()
    old_ranges = dict(zip(old._layer_keys, zip(old._units, old._layer_ranges)))
    for (key, layer, input_type), (start, stop) in zip(new._units, new._layer_ranges):
        if key not in kept or start == stop:
            continue
        (_, old_layer, old_type), (old_start, old_stop) = old_ranges[kept[key]]
        if [s.shape for s in layer.param_specs(input_type)] == [
            s.shape for s in old_layer.param_specs(old_type)
        ]:
            params[start:stop] = old_params[old_start:old_stop]
    new.set_params(params)


class _Builder:
    """What both builders share: the network, the fine-tune configuration and the build's last step."""

    def __init__(self, net: Any, network_type: type[Any]) -> None:
        if not isinstance(net, network_type):
            raise TypeError(f"net: expected a {network_type.__name__}, got {type(net).__name__}")
        net._require_init()
        self._net = net
        self._fine_tune: FineTuneConfiguration | None = None

    def fine_tune_configuration(self, fine_tune: FineTuneConfiguration) -> Any:
        """Override training settings of the new network (see :class:`FineTuneConfiguration`)."""
        if not isinstance(fine_tune, FineTuneConfiguration):
            raise TypeError(f"fine_tune: expected a FineTuneConfiguration, got {type(fine_tune).__name__}")
        self._fine_tune = fine_tune
        return self

    def _tuned(self, layer: L.Layer, new: bool) -> L.Layer:
        return layer if self._fine_tune is None else self._fine_tune.apply_to_layer(layer, unset_only=new)

    def _settings(self) -> dict[str, Any]:
        return {} if self._fine_tune is None else self._fine_tune.network_settings()

    def _network(self, conf: Any, kept: dict[Any, Any]) -> Any:
        net = type(self._net)(conf, device=self._net.device).init()
        _copy_kept(self._net, net, kept)
        return net


class TransferLearning:
    """DL4J's TransferLearning: :class:`TransferLearning.Builder` edits a trained MultiLayerNetwork,
    :class:`TransferLearning.GraphBuilder` a trained ComputationGraph (module docstring: what ``build``
    keeps and initialises)."""

    class Builder(_Builder):
        """Edits a trained :class:`~sparkgrad.nn.MultiLayerNetwork` into a new one (DL4J's
        ``TransferLearning.Builder``). Layer indices are those of the layer list as edited so far.

        Args:
            net: an initialised MultiLayerNetwork (left unchanged).
        """

        def __init__(self, net: MultiLayerNetwork) -> None:
            super().__init__(net, MultiLayerNetwork)
            # [layer, index in the original network or None (new), re-initialised]
            self._layers: list[list[Any]] = [[layer, i, False] for i, layer in enumerate(net.conf.layers)]
            self._frozen_until = -1

        def _index(self, field: str, index: Any) -> int:
            count = len(self._layers)
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < count:
                raise ValueError(
                    f"{field}: layer index {index!r} is out of range: the network has layers 0..{count - 1}"
                )
            return int(index)

        def set_feature_extractor(self, layer_index: int) -> TransferLearning.Builder:
            """Freeze layers 0..``layer_index`` (inclusive): they keep their parameters, run in inference
            mode and pass no gradient back (:class:`~sparkgrad.nn.layers.FrozenLayer`)."""
            index = self._index("set_feature_extractor", layer_index)
            if self._layers[index][0].is_output:
                raise ValueError(
                    f"set_feature_extractor: layers[{index}] is the output layer; freezing it would leave "
                    "nothing to train"
                )
            self._frozen_until = index
            return self

        def remove_output_layer(self) -> TransferLearning.Builder:
            """Remove the last layer (add a new output layer with :meth:`add_layer`)."""
            return self.remove_layers_from_output(1)

        def remove_layers_from_output(self, n: int) -> TransferLearning.Builder:
            """Remove the last ``n`` layers."""
            n = check_int("remove_layers_from_output", n, minimum=1, maximum=len(self._layers))
            del self._layers[len(self._layers) - n :]
            return self

        def n_out_replace(
            self, layer_index: int, n_out: int, weight_init: Any = None, weight_init_next: Any = None
        ) -> TransferLearning.Builder:
            """Change layer ``layer_index``'s ``n_out``; it is re-initialised (with ``weight_init`` if
            given), and so is the next layer, whose input size changes (with ``weight_init_next`` if
            given), as in DL4J; a layer between them whose parameters follow the size (a batch
            normalization) is re-initialised too."""
            index = self._index("n_out_replace", layer_index)
            entry = self._layers[index]
            entry[0] = _n_out_replaced(f"n_out_replace: layers[{index}]", entry[0], n_out, weight_init)
            entry[2] = True
            if index + 1 < len(self._layers):
                following = self._layers[index + 1]
                following[0] = _with_weight_init(following[0], weight_init_next)
                following[2] = True
            return self

        def add_layer(self, layer: L.Layer) -> TransferLearning.Builder:
            """Append a new layer (initialised from its configuration; ``n_in`` is inferred)."""
            if not isinstance(layer, L.Layer):
                raise TypeError(f"add_layer: expected a layer configuration, got {type(layer).__name__}")
            self._layers.append([layer, None, False])
            return self

        def build(self) -> MultiLayerNetwork:
            """The new, initialised network (module docstring); ValueError naming the layer when the
            edited configuration is invalid."""
            conf = self._net.conf
            if self._frozen_until >= len(self._layers):
                raise ValueError(
                    f"set_feature_extractor: layer index {self._frozen_until} is out of range after the "
                    f"removals: the network has layers 0..{len(self._layers) - 1}"
                )
            layers = []
            for i, (layer, old, reinit) in enumerate(self._layers):
                if i <= self._frozen_until:
                    if reinit:
                        raise ValueError(
                            f"n_out_replace: layers[{i}] is re-initialised but inside the feature extractor "
                            f"(layers 0..{self._frozen_until}), which keeps its parameters frozen"
                        )
                    layer = _frozen(layer)
                layer = self._tuned(layer, new=old is None)  # a frozen layer as it is: it does not train
                layers.append(_without_n_in(layer) if i > 0 or conf.input_type is not None else layer)
            new_conf = dataclasses.replace(conf, layers=layers, **self._settings())
            kept = {i: old for i, (_, old, again) in enumerate(self._layers) if old is not None and not again}
            return self._network(new_conf, kept)

    class GraphBuilder(_Builder):
        """Edits a trained :class:`~sparkgrad.nn.ComputationGraph` into a new one (DL4J's
        ``TransferLearning.GraphBuilder``); vertices are named as in the graph.

        Args:
            graph: an initialised ComputationGraph (left unchanged).
        """

        def __init__(self, graph: ComputationGraph) -> None:
            super().__init__(graph, ComputationGraph)
            conf = graph.conf
            self._specs: dict[str, VertexSpec] = {s.name: dataclasses.replace(s) for s in conf.vertices}
            self._outputs = list(conf.outputs)
            self._frozen: set[str] = set()
            self._reinit: set[str] = set()
            self._new: set[str] = set()

        def _vertex(self, field: str, name: Any) -> VertexSpec:
            spec = self._specs.get(name) if isinstance(name, str) else None
            if spec is None:
                vertices = list(self._specs)
                raise ValueError(f"{field}: {name!r} is not a vertex of the graph; vertices: {vertices}")
            return spec

        def _layer_name(self, field: str, name: Any) -> str:
            spec = self._vertex(field, name)
            if not spec.is_layer:
                raise ValueError(f"{field}: vertex {name!r} is a {type(spec.vertex).__name__}, not a layer")
            return str(name)

        def set_feature_extractor(self, *names: str) -> TransferLearning.GraphBuilder:
            """Freeze the named layer vertices and every vertex they depend on (their ancestors)."""
            if not names:
                raise ValueError("set_feature_extractor: name at least one layer vertex")
            pending = [self._layer_name("set_feature_extractor", name) for name in names]
            for name in pending:
                if self._specs[name].vertex.is_output:
                    raise ValueError(
                        f"set_feature_extractor: vertex {name!r} is an output layer; freezing it would "
                        "leave it nothing to train"
                    )
            while pending:
                name = pending.pop()
                spec = self._specs.get(name)
                if spec is None or name in self._frozen:  # a network input, or done
                    continue
                self._frozen.add(name)
                pending.extend(spec.inputs)
            return self

        def n_out_replace(
            self, name: str, n_out: int, weight_init: Any = None, weight_init_next: Any = None
        ) -> TransferLearning.GraphBuilder:
            """Change layer vertex ``name``'s ``n_out``; it is re-initialised (with ``weight_init`` if
            given), and so are the layers reading it, whose input size changes (with
            ``weight_init_next`` if given)."""
            name = self._layer_name("n_out_replace", name)
            spec = self._specs[name]
            where = f"n_out_replace: vertex {name!r}"
            if name in self._frozen:
                raise ValueError(f"{where}: is frozen; n_out_replace changes a layer that trains")
            spec.vertex = _n_out_replaced(where, spec.vertex, n_out, weight_init)
            self._reinit.add(name)
            pending = [name]  # the layers reading it, directly or through parameter-free vertices
            while pending:
                source = pending.pop()
                for reader in self._specs.values():
                    if source not in reader.inputs:
                        continue
                    if not reader.is_layer:
                        pending.append(reader.name)
                    elif reader.name not in self._reinit:
                        reader.vertex = _with_weight_init(reader.vertex, weight_init_next)
                        self._reinit.add(reader.name)
            return self

        def remove_vertex_keep_connections(self, name: str) -> TransferLearning.GraphBuilder:
            """Remove vertex ``name`` but keep its connections: the vertices reading it (and the outputs)
            still name it, so add a new vertex of that name (e.g. a new output layer)."""
            self._remove("remove_vertex_keep_connections", name)
            return self

        def remove_vertex_and_connections(self, name: str) -> TransferLearning.GraphBuilder:
            """Remove vertex ``name`` and its connections: it leaves the inputs of the vertices reading it
            and the outputs."""
            self._remove("remove_vertex_and_connections", name)
            for spec in self._specs.values():
                spec.inputs = [i for i in spec.inputs if i != name]
            self._outputs = [o for o in self._outputs if o != name]
            return self

        def _remove(self, field: str, name: Any) -> None:
            del self._specs[self._vertex(field, name).name]
            for marks in (self._frozen, self._new, self._reinit):
                marks.discard(name)

        def add_layer(self, name: str, layer: L.Layer, *inputs: str) -> TransferLearning.GraphBuilder:
            """Add a new layer vertex reading ``inputs`` (initialised from its configuration); several
            inputs are concatenated by a MergeVertex ``<name>-merge``, as GraphBuilder does."""
            if not isinstance(layer, L.Layer):
                raise TypeError(
                    f"add_layer: {name!r}: expected a layer configuration, got {type(layer).__name__}"
                )
            if len(inputs) > 1:
                self._add(f"{name}-merge", MergeVertex(), inputs)
                inputs = (f"{name}-merge",)
            return self._add(name, layer, inputs)

        def add_vertex(self, name: str, vertex: GraphVertex, *inputs: str) -> TransferLearning.GraphBuilder:
            """Add a parameter-free vertex (MergeVertex, ElementWiseVertex, ...)."""
            if not isinstance(vertex, GraphVertex):
                raise TypeError(f"add_vertex: {name!r}: expected a GraphVertex, got {type(vertex).__name__}")
            return self._add(name, vertex, inputs)

        def _add(self, name: str, vertex: Any, inputs: tuple[str, ...]) -> TransferLearning.GraphBuilder:
            if name in self._specs or name in self._net.conf.inputs:
                raise ValueError(f"add: vertex name {name!r} is already used")
            self._specs[name] = VertexSpec(name, vertex, list(inputs))
            self._new.add(name)
            return self

        def set_outputs(self, *names: str) -> TransferLearning.GraphBuilder:
            """The output layers of the new graph, in the order their labels are given."""
            self._outputs = list(names)
            return self

        def build(self) -> ComputationGraph:
            """The new, initialised graph (module docstring); ValueError naming the vertex when the edited
            configuration is invalid."""
            both = sorted(self._reinit & self._frozen)
            if both:
                raise ValueError(
                    f"n_out_replace: vertex {both[0]!r} is re-initialised but inside the feature extractor, "
                    "which keeps its parameters frozen"
                )
            vertices = []
            for name, spec in self._specs.items():
                vertex = spec.vertex
                if spec.is_layer:  # a frozen layer is not tuned: it does not train
                    vertex = _frozen(vertex) if name in self._frozen else vertex
                    vertex = _without_n_in(self._tuned(vertex, new=name in self._new))
                vertices.append(VertexSpec(name, vertex, list(spec.inputs)))
            new_conf = dataclasses.replace(
                self._net.conf, vertices=vertices, outputs=list(self._outputs), **self._settings()
            )
            kept = {n: n for n, s in self._specs.items() if s.is_layer and n not in self._new | self._reinit}
            return self._network(new_conf, kept)


__all__ = ["FineTuneConfiguration", "TransferLearning"]
