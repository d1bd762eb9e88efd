"""Keras model import (DL4J's ``KerasModelImport``): models that Keras itself saves, in the ``.keras`` zip
format (``config.json`` + ``model.weights.h5``) or legacy HDF5 (``.h5``: the ``model_config`` attribute +
the ``model_weights`` group), with their weights: a Sequential model into a :class:`MultiLayerNetwork`, a
Functional one into a :class:`ComputationGraph`. Parsed with h5py and json only: Keras is not needed to
import (``pip install sparkgrad[keras]``).

Both kinds share one conversion: every Keras layer becomes at most one sparkgrad layer or vertex named
after it (Flatten, Reshape between vectors and InputLayer may become none), walked along the model's
inbound nodes (a Sequential model is the chain of its layers). Merge layers map to vertices: Add,
Subtract, Multiply, Average and Maximum to :class:`ElementWiseVertex`, Concatenate (on the last,
channels/features axis) to :class:`MergeVertex`.

Layout: Keras is channels-last, sparkgrad is DL4J's channels-first. The imported network takes
images as (batch, channels, height, width) and sequences as (batch, features, time) (token indices for
an ``Embedding`` first layer as (batch, 1, time)); :func:`to_sparkgrad_layout` converts Keras-layout
arrays. The weights are converted (convolution kernels transposed, recurrent gate blocks reordered, and
wherever a vector holds flattened image values, which sparkgrad orders (c, h, w) and Keras (h, w, c), the
rows of the Dense reading it, or the columns of the Dense feeding a Reshape to images, permuted), so
``net.output(to_sparkgrad_layout(x))`` equals ``keras_model.predict(x)`` (transposed back for sequence
output).

Every model output must come from a Dense: it becomes an :class:`OutputLayer` whose loss is the one the
model was compiled with (``categorical_crossentropy``, ``sparse_categorical_crossentropy`` (sparkgrad
takes one-hot labels): MCXENT, ``binary_crossentropy``: XENT, ``mean_squared_error``: MSE,
``mean_absolute_error``: L1, ``kl_divergence``, ``hinge``, ``squared_hinge``) or, for a model saved
without a compiled loss, the one its activation implies (softmax: MCXENT, sigmoid: XENT, linear: MSE),
so the network trains further with ``fit``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from . import layers as L
from ._import import set_weights
from .conf import MultiLayerConfiguration
from .enums import Activation, ConvolutionMode, LossFunction, PoolingType
from .graph import ComputationGraph, ComputationGraphConfiguration
from .input_type import InputType
from .network import MultiLayerNetwork
from .vertices import (
    CnnToFeedForwardPreProcessor,
    ElementWiseOp,
    ElementWiseVertex,
    FeedForwardToCnnPreProcessor,
    GraphVertex,
    MergeVertex,
    PreprocessorVertex,
)

__all__ = [
    "KerasImportError",
    "import_keras_model_and_weights",
    "import_keras_sequential_model_and_weights",
    "to_sparkgrad_layout",
]


class KerasImportError(ValueError):
    """A Keras model uses a layer or an option sparkgrad cannot import; the message names both."""


_ACTIVATIONS = {
    "linear": Activation.IDENTITY,
    "relu": Activation.RELU,
    "tanh": Activation.TANH,
    "sigmoid": Activation.SIGMOID,
    "softmax": Activation.SOFTMAX,
    "softplus": Activation.SOFTPLUS,
}
_ACTIVATION_LOSSES = {
    Activation.SOFTMAX: LossFunction.MCXENT,
    Activation.SIGMOID: LossFunction.XENT,
    Activation.IDENTITY: LossFunction.MSE,
}
_KERAS_LOSSES = {
    "categorical_crossentropy": LossFunction.MCXENT,
    "sparse_categorical_crossentropy": LossFunction.MCXENT,
    "binary_crossentropy": LossFunction.XENT,
    "mean_squared_error": LossFunction.MSE,
    "mse": LossFunction.MSE,
    "mean_absolute_error": LossFunction.L1,
    "mae": LossFunction.L1,
    "kl_divergence": LossFunction.KL_DIVERGENCE,
    "kld": LossFunction.KL_DIVERGENCE,
    "hinge": LossFunction.HINGE,
    "squared_hinge": LossFunction.SQUARED_HINGE,
}
_ELEMENT_WISE = {
    "Add": ElementWiseOp.ADD,
    "Subtract": ElementWiseOp.SUBTRACT,
    "Multiply": ElementWiseOp.PRODUCT,
    "Average": ElementWiseOp.AVERAGE,
    "Maximum": ElementWiseOp.MAX,
}


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "sparkgrad.nn.keras needs the 'h5py' package to read Keras files: pip install sparkgrad[keras]"
        ) from e
    return h5py


def _name(layer: dict) -> str:
    return str(layer.get("config", {}).get("name", layer.get("name", "?")))


def _error(layer: dict, message: str) -> KerasImportError:
    return KerasImportError(f"Keras layer {_name(layer)!r} ({layer['class_name']}): {message}")


def _fail(layer: dict, option: str, value: Any) -> KerasImportError:
    return _error(layer, f"unsupported {option}={value!r}")


def _activation(layer: dict, key: str = "activation") -> Activation:
    value = layer["config"].get(key, "linear")
    if isinstance(value, dict):
        value = value.get("config", {}).get("name", value.get("class_name"))
    if value not in _ACTIVATIONS:
        raise _fail(layer, key, value)
    return _ACTIVATIONS[value]


def _require(layer: dict, key: str, allowed: tuple) -> None:
    value = layer["config"].get(key, allowed[0])
    if isinstance(value, list):
        value = tuple(value)
    if value not in allowed:
        raise _fail(layer, key, value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_keras(path: Path) -> tuple[dict, dict[str, list[np.ndarray]], Any]:
    h5py = _h5py()
    with zipfile.ZipFile(path) as z:
        config = json.loads(z.read("config.json"))
        with z.open("model.weights.h5") as f, h5py.File(f, "r") as h:
            weights: dict[str, list[np.ndarray]] = {}
            if "layers" in h:
                # the groups are named by class and position in the model ("dense_1"); their "vars"
                # group carries the layer's own name, which the config uses
                for key, group in h["layers"].items():
                    name = group["vars"].attrs.get("name", key) if "vars" in group else key
                    weights[_text(name)] = _vars(group)
    return config, weights, (config.get("compile_config") or {}).get("loss")


def _vars(group: Any) -> list[np.ndarray]:
    """A layer group's variables in creation order: its own ``vars`` then its sub-objects' (a cell)."""
    out: list[np.ndarray] = []
    if "vars" in group:
        out += [np.asarray(group["vars"][k]) for k in sorted(group["vars"], key=int)]
    for key, sub in group.items():
        if key != "vars" and hasattr(sub, "items"):
            out += _vars(sub)
    return out


def _read_h5(path: Path) -> tuple[dict, dict[str, list[np.ndarray]], Any]:
    h5py = _h5py()
    with h5py.File(path, "r") as h:
        if "model_config" not in h.attrs:
            raise KerasImportError(f"{path}: no 'model_config' attribute: a weights-only file, not a model")
        config = json.loads(_text(h.attrs["model_config"]))
        training = json.loads(_text(h.attrs["training_config"])) if "training_config" in h.attrs else {}
        group = h["model_weights"] if "model_weights" in h else h
        weights = {}
        for name in group.attrs.get("layer_names", []):
            layer = group[_text(name)]
            weights[_text(name)] = [np.asarray(layer[_text(n)]) for n in layer.attrs.get("weight_names", [])]
    return config, weights, training.get("loss")


def _read(path: str | Path) -> tuple[dict, dict[str, list[np.ndarray]], Any]:
    """(model config, {layer name: weights in Keras's order}, the compiled loss or None)."""
    path = Path(path)
    return _read_keras(path) if zipfile.is_zipfile(path) else _read_h5(path)


def _lstm_gates(m: np.ndarray, h: int) -> np.ndarray:
    # Keras [i, f, c, o] -> DL4J [c (block input), f, o, i]
    i, f, c, o = (m[..., k * h : (k + 1) * h] for k in range(4))
    return np.concatenate([c, f, o, i], axis=-1)


def _gru_gates(m: np.ndarray, h: int) -> np.ndarray:
    # Keras [z (update), r (reset), h (candidate)] -> sparkgrad [r, u, c]
    z, r, c = (m[..., k * h : (k + 1) * h] for k in range(3))
    return np.concatenate([r, z, c], axis=-1)


def _flat_order(shape: tuple) -> np.ndarray:
    """Where each value of a flattened sparkgrad (c, h, w) image sits in Keras's (h, w, c) flattening."""
    h, w, c = shape
    return np.arange(h * w * c).reshape(h, w, c).transpose(2, 0, 1).ravel()


def _order(t: _Tensor) -> np.ndarray:
    return np.arange(t.shape[0]) if t.order is None else t.order


@dataclasses.dataclass
class _Tensor:
    """A Keras tensor as imported: the sparkgrad input or vertex holding it, its Keras shape (no batch axis)
    and, for a vector, ``order``: sparkgrad's value i is Keras's value ``order[i]`` (None: the same order)."""

    vertex: str
    shape: tuple
    order: np.ndarray | None = None


def _loss_name(value: Any, layer: dict) -> str:
    if isinstance(value, dict):  # a serialised loss object: {"class_name": "CategoricalCrossentropy", ...}
        if value.get("config", {}).get("from_logits"):
            raise _fail(layer, "loss from_logits (Keras's output is then not the loss's input)", True)
        value = value.get("class_name", value)
        value = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", value))
    return str(value).lower()


def _output_loss(layer: dict, activation: Activation, keras_loss: Any) -> LossFunction:
    """The output layer's loss: the compiled Keras loss when there is one, else its activation's."""
    if keras_loss is not None:
        name = _loss_name(keras_loss, layer)
        if name not in _KERAS_LOSSES:
            raise _fail(layer, "loss", name)
        return _KERAS_LOSSES[name]
    if activation not in _ACTIVATION_LOSSES:
        raise _fail(layer, "activation of an output layer (and no compiled loss)", activation.value)
    return _ACTIVATION_LOSSES[activation]


class _Converter:
    """Converts Keras layers one at a time into named sparkgrad layers and vertices with their weights.

    ``convert`` sets the state of its input tensor (``heads``: the sparkgrad name holding it, ``shape``:
    its Keras shape, ``order``), runs the layer's handler, which may ``add`` one sparkgrad layer or
    vertex (it then becomes the head) and updates the state, and returns the output tensor. ``graph``:
    vertices are allowed (a ComputationGraph), else the result must be a layer stack.
    """

    def __init__(self, weights: dict[str, list[np.ndarray]], graph: bool, reorders: dict[str, tuple]):
        self.weights = weights
        self.graph = graph
        self.reorders = reorders  # {Dense name: the image shape a Reshape after it wants its units in}
        self.nodes: list[tuple[str, L.Layer | GraphVertex, list[str], dict[str, np.ndarray]]] = []
        # the layer being converted, and the state of its input (becoming its output's)
        self.keras: dict = {}
        self.name = ""
        self.loss: Any = None
        self.last = False
        self.heads: list[str] = []
        self.shape: tuple = ()
        self.order: np.ndarray | None = None

    def add(self, item: L.Layer | GraphVertex, params: dict[str, np.ndarray] | None = None) -> None:
        if isinstance(item, GraphVertex) and not self.graph:
            raise _error(
                self.keras,
                f"needs a {type(item).__name__}, a graph vertex, which a MultiLayerNetwork has not (build "
                "the model as a Functional one)",
            )
        self.nodes.append((self.name, item, list(self.heads), params or {}))
        self.heads = [self.name]

    def w(self) -> list[np.ndarray]:
        return self.weights.get(self.name, [])

    def convert(self, layer: dict, inputs: list[_Tensor], loss: Any = None, output: bool = False) -> _Tensor:
        """The output tensor of Keras ``layer`` applied to ``inputs``; ``output``: it is a model output,
        trained with the compiled Keras ``loss`` (None: the one its activation implies)."""
        kind, cfg = layer["class_name"], layer["config"]
        self.keras, self.name, self.loss, self.last = layer, _name(layer), loss, output
        if output and kind != "Dense":
            raise _error(layer, "a model output must be a Dense (it becomes the OutputLayer)")
        if kind in _ELEMENT_WISE or kind == "Concatenate":
            return self._merge(layer, inputs)
        handler = getattr(self, "_" + kind, None)
        if handler is None:
            raise KerasImportError(f"Keras layer {self.name!r}: unsupported layer type {kind}")
        if len(inputs) != 1:
            raise _error(layer, f"takes one input, got {len(inputs)}")
        if "data_format" in cfg:
            _require(layer, "data_format", ("channels_last",))
        (x,) = inputs
        self.heads, self.shape, self.order = [x.vertex], x.shape, x.order
        handler(layer)
        return _Tensor(self.heads[0], self.shape, self.order)

    def _merge(self, layer: dict, inputs: list[_Tensor]) -> _Tensor:
        shapes = [t.shape for t in inputs]
        if len(inputs) < 2:
            raise _error(layer, f"merges at least two inputs, got {len(inputs)}")
        self.heads = [t.vertex for t in inputs]
        if layer["class_name"] == "Concatenate":
            rank, axis = len(shapes[0]) + 1, int(layer["config"].get("axis", -1))
            if axis % rank != rank - 1:
                raise _fail(
                    layer, "axis (only the last, the features/channels axis, maps to MergeVertex)", axis
                )
            if any(s[:-1] != shapes[0][:-1] for s in shapes):
                raise _fail(layer, "input shapes", shapes)
            self.add(MergeVertex())
            order = None
            if rank == 2 and any(t.order is not None for t in inputs):
                offsets = np.cumsum([0] + [s[0] for s in shapes[:-1]])
                order = np.concatenate([_order(t) + o for t, o in zip(inputs, offsets)])
            return _Tensor(self.name, (*shapes[0][:-1], sum(s[-1] for s in shapes)), order)
        if any(s != shapes[0] for s in shapes):
            raise _fail(layer, "input shapes (Keras broadcasts them, ElementWiseVertex does not)", shapes)
        if any(not np.array_equal(_order(t), _order(inputs[0])) for t in inputs if len(t.shape) == 1):
            raise _error(
                layer, "its inputs order their values differently (flattened images on one side only)"
            )
        self.add(ElementWiseVertex(op=_ELEMENT_WISE[layer["class_name"]]))
        return _Tensor(self.name, shapes[0], inputs[0].order)

    def _Dropout(self, layer: dict) -> None:
        self.add(L.DropoutLayer(dropout=1.0 - float(layer["config"]["rate"])))

    def _Activation(self, layer: dict) -> None:
        self.add(L.ActivationLayer(activation=_activation(layer)))

    def _flatten(self, layer: dict) -> None:
        if len(self.shape) == 3:
            if self.graph:  # a MultiLayerNetwork's Dense flattens images itself; a MergeVertex does not
                self.add(PreprocessorVertex(CnnToFeedForwardPreProcessor()))
            self.order = _flat_order(self.shape)
        elif len(self.shape) != 1:
            raise _fail(layer, "input shape", self.shape)
        self.shape = (int(np.prod(self.shape)),)

    def _Flatten(self, layer: dict) -> None:
        self._flatten(layer)

    def _Reshape(self, layer: dict) -> None:
        target_shape = _target_shape(layer, self.shape)
        if target_shape == self.shape:
            return
        if len(target_shape) == 1:
            self._flatten(layer)
            return
        if len(self.shape) == 1 and len(target_shape) == 3:
            if not np.array_equal(_order(self._tensor()), _flat_order(target_shape)):
                raise _error(
                    layer,
                    f"a Reshape of vectors to images {target_shape} needs them from a Dense (or a Flatten "
                    "of such images), whose values sparkgrad orders to fit",
                )
            h, w, c = target_shape
            self.add(PreprocessorVertex(FeedForwardToCnnPreProcessor(height=h, width=w, channels=c)))
            self.shape, self.order = target_shape, None
            return
        raise _fail(
            layer,
            "reshape (only between vectors and images, or to the same shape)",
            (self.shape, target_shape),
        )

    def _tensor(self) -> _Tensor:
        return _Tensor(self.heads[0], self.shape, self.order)

    def _Dense(self, layer: dict) -> None:
        if len(self.shape) != 1:
            raise _fail(
                layer, "input rank (Dense on sequences or images without Flatten)", len(self.shape) + 1
            )
        cfg, act = layer["config"], _activation(layer)
        bias = bool(cfg.get("use_bias", True))
        w = self.w()
        units = int(cfg["units"])
        kernel = w[0][_order(self._tensor())]  # rows in the order sparkgrad holds the input's values
        params = {L.WEIGHT: kernel}
        if bias:
            params[L.BIAS] = w[1]
        self.order = None
        if self.name in self.reorders:  # a Reshape to images reads the units: (c, h, w) order
            self.order = _flat_order(self.reorders[self.name])
            params = {k: v[..., self.order] for k, v in params.items()}
        if self.last:
            loss = _output_loss(layer, act, self.loss)
            self.add(L.OutputLayer(n_out=units, activation=act, loss=loss, has_bias=bias), params)
        else:
            self.add(L.DenseLayer(n_out=units, activation=act, has_bias=bias), params)
        self.shape = (units,)

    def _Conv2D(self, layer: dict) -> None:
        cfg = layer["config"]
        _require(layer, "dilation_rate", ((1, 1),))
        _require(layer, "groups", (1,))
        _require(layer, "padding", ("valid", "same"))
        w = self.w()
        params = {L.WEIGHT: np.ascontiguousarray(w[0].transpose(3, 2, 0, 1))}
        if cfg.get("use_bias", True):
            params[L.BIAS] = w[1]
        mode = ConvolutionMode.SAME if cfg["padding"] == "same" else ConvolutionMode.TRUNCATE
        conv = L.ConvolutionLayer(
            n_out=int(cfg["filters"]),
            kernel_size=tuple(cfg["kernel_size"]),
            stride=tuple(cfg["strides"]),
            convolution_mode=mode,
            activation=_activation(layer),
            has_bias=bool(cfg.get("use_bias", True)),
        )
        self.add(conv, params)
        self._spatial(layer, tuple(cfg["kernel_size"]), tuple(cfg["strides"]), int(cfg["filters"]))

    def _spatial(self, layer: dict, kernel: tuple, strides: tuple, channels: int) -> None:
        h, w, _ = self.shape
        size = []
        for n, k, s in zip((h, w), kernel, strides):
            size.append(-(-n // s) if layer["config"]["padding"] == "same" else (n - k) // s + 1)
        self.shape = (size[0], size[1], channels)

    def _pool2d(self, layer: dict, kind: PoolingType) -> None:
        cfg = layer["config"]
        _require(layer, "padding", ("valid", "same"))
        strides = tuple(cfg.get("strides") or cfg["pool_size"])
        mode = ConvolutionMode.SAME if cfg["padding"] == "same" else ConvolutionMode.TRUNCATE
        if kind is PoolingType.AVG and mode is ConvolutionMode.SAME:
            raise _fail(layer, "padding (average pooling counts padding differently)", "same")
        pool = L.SubsamplingLayer(
            pooling_type=kind, kernel_size=tuple(cfg["pool_size"]), stride=strides, convolution_mode=mode
        )
        self.add(pool)
        self._spatial(layer, tuple(cfg["pool_size"]), strides, self.shape[-1])

    def _MaxPooling2D(self, layer: dict) -> None:
        self._pool2d(layer, PoolingType.MAX)

    def _AveragePooling2D(self, layer: dict) -> None:
        self._pool2d(layer, PoolingType.AVG)

    def _ZeroPadding2D(self, layer: dict) -> None:
        (top, bottom), (left, right) = layer["config"]["padding"]
        self.add(L.ZeroPaddingLayer(padding=(top, bottom, left, right)))
        h, w, c = self.shape
        self.shape = (h + top + bottom, w + left + right, c)

    def _Cropping2D(self, layer: dict) -> None:
        (top, bottom), (left, right) = layer["config"]["cropping"]
        self.add(L.Cropping2D(cropping=(top, bottom, left, right)))
        h, w, c = self.shape
        self.shape = (h - top - bottom, w - left - right, c)

    def _UpSampling2D(self, layer: dict) -> None:
        _require(layer, "interpolation", ("nearest",))
        rows, cols = layer["config"]["size"]
        self.add(L.Upsampling2D(size=(rows, cols)))
        h, w, c = self.shape
        self.shape = (h * rows, w * cols, c)

    def _steps(self, layer: dict, kernel: int, stride: int, channels: int) -> None:
        t = self.shape[0]
        if t is not None:
            t = -(-t // stride) if layer["config"]["padding"] == "same" else (t - kernel) // stride + 1
        self.shape = (t, channels)

    def _Conv1D(self, layer: dict) -> None:
        cfg = layer["config"]
        _require(layer, "dilation_rate", ((1,),))
        _require(layer, "groups", (1,))
        _require(layer, "padding", ("valid", "same"))
        (k,), (stride,) = cfg["kernel_size"], cfg["strides"]
        w = self.w()
        params = {L.WEIGHT: np.ascontiguousarray(w[0].transpose(2, 1, 0)[..., None])}
        if cfg.get("use_bias", True):
            params[L.BIAS] = w[1]
        mode = ConvolutionMode.SAME if cfg["padding"] == "same" else ConvolutionMode.TRUNCATE
        conv = L.Convolution1DLayer(
            n_out=int(cfg["filters"]),
            kernel_size=k,
            stride=stride,
            convolution_mode=mode,
            activation=_activation(layer),
            has_bias=bool(cfg.get("use_bias", True)),
        )
        self.add(conv, params)
        self._steps(layer, k, stride, int(cfg["filters"]))

    def _pool1d(self, layer: dict, kind: PoolingType) -> None:
        cfg = layer["config"]
        _require(layer, "padding", ("valid",))
        (k,) = cfg["pool_size"]
        (stride,) = cfg.get("strides") or cfg["pool_size"]
        self.add(L.Subsampling1DLayer(pooling_type=kind, kernel_size=k, stride=stride))
        self._steps(layer, k, stride, self.shape[-1])

    def _MaxPooling1D(self, layer: dict) -> None:
        self._pool1d(layer, PoolingType.MAX)

    def _AveragePooling1D(self, layer: dict) -> None:
        self._pool1d(layer, PoolingType.AVG)

    def _global(self, layer: dict, kind: PoolingType) -> None:
        if layer["config"].get("keepdims"):
            raise _fail(layer, "keepdims", True)
        self.add(L.GlobalPoolingLayer(pooling_type=kind))
        self.shape = (self.shape[-1],)

    def _GlobalAveragePooling2D(self, layer: dict) -> None:
        self._global(layer, PoolingType.AVG)

    def _GlobalMaxPooling2D(self, layer: dict) -> None:
        self._global(layer, PoolingType.MAX)

    def _GlobalAveragePooling1D(self, layer: dict) -> None:
        self._global(layer, PoolingType.AVG)

    def _GlobalMaxPooling1D(self, layer: dict) -> None:
        self._global(layer, PoolingType.MAX)

    def _BatchNormalization(self, layer: dict) -> None:
        cfg = layer["config"]
        _require(layer, "axis", (-1, len(self.shape)))
        if not (cfg.get("center", True) and cfg.get("scale", True)):
            raise _fail(layer, "center/scale", (cfg.get("center"), cfg.get("scale")))
        gamma, beta, mean, var = (self._per_feature(v) for v in self.w())
        bn = L.BatchNormalization(decay=float(cfg.get("momentum", 0.99)), eps=float(cfg.get("epsilon", 1e-3)))
        self.add(bn, {L.GAMMA: gamma, L.BETA: beta, L.RUNNING_MEAN: mean, L.RUNNING_VAR: var})

    def _per_feature(self, values: np.ndarray) -> np.ndarray:
        """Per-feature parameters in the order sparkgrad holds the input's values."""
        if len(self.shape) != 1:
            return values
        if self.order is not None and not self.graph:  # the images are flattened by the next Dense only
            raise _error(
                self.keras,
                "follows a Flatten of images, which a MultiLayerNetwork flattens in its next Dense only "
                "(a Functional model imports)",
            )
        return values[_order(self._tensor())]

    def _LayerNormalization(self, layer: dict) -> None:
        cfg = layer["config"]
        axis = cfg.get("axis", -1)
        axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
        if len(self.shape) not in (1, 2):
            raise _fail(layer, "input shape (sparkgrad normalizes vectors and sequences)", self.shape)
        if axis not in (-1, len(self.shape)):
            raise _fail(layer, "axis (only the last, the features axis)", cfg.get("axis"))
        for option, allowed in (("scale", True), ("rms_scaling", False)):
            _require(layer, option, (allowed,))
        center = bool(cfg.get("center", True))
        w = [self._per_feature(v) for v in self.w()]
        params = {L.LAYER_NORM_GAIN: w[0]} | ({L.BIAS: w[1]} if center else {})
        self.add(L.LayerNormalization(eps=float(cfg.get("epsilon", 1e-3)), has_bias=center), params)

    def _Embedding(self, layer: dict) -> None:
        cfg = layer["config"]
        if cfg.get("mask_zero"):
            raise _fail(layer, "mask_zero", True)
        if len(self.shape) != 1:
            raise _fail(layer, "input shape", self.shape)
        emb = L.EmbeddingSequenceLayer(
            n_in=int(cfg["input_dim"]), n_out=int(cfg["output_dim"]), activation=Activation.IDENTITY
        )
        self.add(emb, {L.WEIGHT: self.w()[0]})
        self.shape = (self.shape[0], int(cfg["output_dim"]))

    def _recurrent(self, layer: dict, cell: L.Layer, params: dict[str, np.ndarray]) -> None:
        cfg = layer["config"]
        for option in ("go_backwards", "stateful", "return_state"):
            _require(layer, option, (False,))
        for option in ("dropout", "recurrent_dropout"):
            _require(layer, option, (0.0, 0))
        if not cfg.get("use_bias", True):
            raise _fail(layer, "use_bias", False)
        if cfg.get("return_sequences", False):
            self.add(cell, params)
            self.shape = (self.shape[0], int(cfg["units"]))
        else:
            self.add(L.LastTimeStep(layer=cell), params)
            self.shape = (int(cfg["units"]),)

    def _LSTM(self, layer: dict) -> None:
        h = int(layer["config"]["units"])
        kernel, recurrent, bias = self.w()
        cell = L.LSTM(
            n_out=h, activation=_activation(layer), gate_activation=_activation(layer, "recurrent_activation")
        )
        params = {
            L.WEIGHT: _lstm_gates(kernel, h),
            L.RECURRENT_WEIGHT: _lstm_gates(recurrent, h),
            L.BIAS: _lstm_gates(bias, h),
        }
        self._recurrent(layer, cell, params)

    def _GRU(self, layer: dict) -> None:
        h = int(layer["config"]["units"])
        if layer["config"].get("reset_after", True):
            raise _fail(
                layer,
                "reset_after (sparkgrad's GRU applies the reset gate before the recurrent product)",
                True,
            )
        kernel, recurrent, bias = self.w()
        cell = L.GRU(
            n_out=h, activation=_activation(layer), gate_activation=_activation(layer, "recurrent_activation")
        )
        params = {
            L.WEIGHT: _gru_gates(kernel, h),
            L.RECURRENT_WEIGHT: _gru_gates(recurrent, h),
            L.BIAS: _gru_gates(bias, h),
        }
        self._recurrent(layer, cell, params)

    def _SimpleRNN(self, layer: dict) -> None:
        kernel, recurrent, bias = self.w()
        cell = L.SimpleRnn(n_out=int(layer["config"]["units"]), activation=_activation(layer))
        self._recurrent(layer, cell, {L.WEIGHT: kernel, L.RECURRENT_WEIGHT: recurrent, L.BIAS: bias})


def _target_shape(layer: dict, shape: tuple) -> tuple:
    """A Reshape's target shape for input ``shape``, its -1 resolved."""
    target = [int(d) for d in layer["config"]["target_shape"]]
    if -1 in target:
        if None in shape:
            raise _fail(layer, "target_shape -1 with an unknown time axis", tuple(target))
        target[target.index(-1)] = int(np.prod(shape)) // int(np.prod([d for d in target if d != -1]))
    return tuple(target)


def _reorders(pairs: list[tuple[dict, dict]]) -> dict[str, tuple]:
    """{Dense name: image shape} for each Dense a Reshape to images reads directly (from (producer,
    consumer) layer pairs): that Dense emits its units in sparkgrad's (c, h, w) order."""
    out = {}
    for producer, consumer in pairs:
        if producer["class_name"] == "Dense" and consumer["class_name"] == "Reshape":
            target = _target_shape(consumer, (int(producer["config"]["units"]),))
            if len(target) == 3:
                out[_name(producer)] = target
    return out


def _input_type(shape: tuple, indices: bool) -> InputType:
    if any(s is None for s in shape[1:]) or (shape and shape[0] is None and len(shape) != 2):
        raise KerasImportError(f"input shape {shape}: only the time axis may be unknown")
    if indices:
        return InputType.recurrent(1, shape[0])
    if len(shape) == 1:
        return InputType.feed_forward(int(shape[0]))
    if len(shape) == 2:
        return InputType.recurrent(int(shape[1]), shape[0])
    if len(shape) == 3:
        return InputType.convolutional(int(shape[0]), int(shape[1]), int(shape[2]))
    raise KerasImportError(f"input shape {shape}: unsupported rank")


def _losses(loss: Any, outputs: list[str]) -> list[Any]:
    """The compiled Keras loss of each output (None where the model was not compiled)."""
    if isinstance(loss, list):
        if len(loss) != len(outputs):
            raise KerasImportError(f"the model has outputs {outputs} but {len(loss)} losses {loss}")
        return loss
    if isinstance(loss, dict) and "class_name" not in loss:
        return [loss.get(name) for name in outputs]
    return [loss] * len(outputs)


def _input_shape(config: dict) -> list:
    for layer in config["config"]["layers"]:
        shape = layer["config"].get("batch_shape") or layer["config"].get("batch_input_shape")
        if shape:
            return list(shape)
    shape = config["config"].get("build_input_shape")
    if shape:
        return list(shape)
    raise KerasImportError("the Keras model has no input shape (build it or give it an Input)")


def _sequential(config: dict, weights: dict[str, list[np.ndarray]], loss: Any, seed: int | None) -> Any:
    layers = [layer for layer in config["config"]["layers"] if layer["class_name"] != "InputLayer"]
    if not layers:
        raise KerasImportError("the Keras model has no layers")
    shape = _input_shape(config)
    converter = _Converter(weights, graph=False, reorders=_reorders(list(zip(layers, layers[1:]))))
    x = _Tensor("input", tuple(shape[1:]))
    input_type = _input_type(x.shape, layers[0]["class_name"] == "Embedding")
    (loss,) = _losses(loss, [_name(layers[-1])])
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1
        x = converter.convert(layer, [x], loss if last else None, output=last)
    conf = MultiLayerConfiguration(
        [item for _, item, _, _ in converter.nodes], input_type=input_type, seed=seed
    )
    given = {i: n[3] for i, n in enumerate(converter.nodes)}
    return set_weights(MultiLayerNetwork(conf).init(), given, "Keras", KerasImportError)


def _tensor_refs(layer: dict, value: Any) -> list[tuple]:
    """The (layer, node, tensor) histories of the Keras tensors in a call's arguments, in order."""
    if isinstance(value, list):
        return [ref for v in value for ref in _tensor_refs(layer, v)]
    if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
        name, node, index = value["config"]["keras_history"]
        if index != 0:
            raise _error(
                layer, f"reads output {index} of layer {name!r} (multi-output layers are not imported)"
            )
        return [(name, node)]
    if isinstance(value, dict):
        return [ref for v in value.values() for ref in _tensor_refs(layer, v)]
    return []


def _inbound(layer: dict) -> list[str]:
    nodes = layer.get("inbound_nodes", [])
    if len(nodes) > 1:
        raise _error(layer, f"is called {len(nodes)} times (shared layers are not imported)")
    if not nodes:
        return []
    if not isinstance(nodes[0], dict):
        raise _error(layer, "inbound nodes in the Keras 2 format (save the model with Keras 3)")
    if _tensor_refs(layer, nodes[0].get("kwargs", {})):
        raise _error(layer, "takes a tensor as a keyword argument (a mask or state)")
    return [name for name, _ in _tensor_refs(layer, nodes[0].get("args", []))]


def _names(entries: list) -> list[str]:
    # input_layers / output_layers: [[name, node, tensor], ...], or one [name, node, tensor]
    return [entries[0]] if entries and isinstance(entries[0], str) else [e[0] for e in entries]


def _functional(config: dict, weights: dict[str, list[np.ndarray]], loss: Any, seed: int | None) -> Any:
    cfg = config["config"]
    layers = {_name(layer): layer for layer in cfg["layers"]}
    inbound = {name: _inbound(layer) for name, layer in layers.items()}
    inputs, outputs = _names(cfg["input_layers"]), _names(cfg["output_layers"])
    consumers: dict[str, list[str]] = {name: [] for name in layers}
    for name, sources in inbound.items():
        for source in sources:
            consumers[source].append(name)
    for name in outputs:
        if consumers[name]:
            raise _error(
                layers[name], f"is a model output and feeds {consumers[name]} (an OutputLayer cannot)"
            )
    pairs = [(layers[s], layers[name]) for name, sources in inbound.items() for s in sources]
    converter = _Converter(weights, graph=True, reorders=_reorders(pairs))
    tensors: dict[str, _Tensor] = {}
    types = []
    for name in inputs:
        shape = tuple(layers[name]["config"]["batch_shape"][1:])
        tensors[name] = _Tensor(name, shape)
        indices = bool(consumers[name]) and all(
            layers[c]["class_name"] == "Embedding" for c in consumers[name]
        )
        types.append(_input_type(shape, indices))
    losses = dict(zip(outputs, _losses(loss, outputs)))
    pending = [name for name in layers if name not in tensors]
    while pending:  # Keras lists layers in a topological order; this also accepts any other
        ready = [name for name in pending if all(s in tensors for s in inbound[name])]
        if not ready:
            raise KerasImportError(f"Keras layers {pending}: their inputs are never computed")
        for name in ready:
            args = [tensors[s] for s in inbound[name]]
            tensors[name] = converter.convert(layers[name], args, losses.get(name), output=name in outputs)
            pending.remove(name)
    builder = ComputationGraphConfiguration.builder(seed=seed).add_inputs(*inputs)
    for name, item, heads, _ in converter.nodes:
        if isinstance(item, L.Layer):
            builder.add_layer(name, item, *heads)
        else:
            builder.add_vertex(name, item, *heads)
    conf = builder.set_outputs(*outputs).set_input_types(*types).build()
    given = {n[0]: n[3] for n in converter.nodes}
    return set_weights(ComputationGraph(conf).init(), given, "Keras", KerasImportError)


def import_keras_model_and_weights(
    path: str | Path, seed: int | None = None
) -> ComputationGraph | MultiLayerNetwork:
    """Load a model saved by Keras (``.keras`` or legacy ``.h5``) with its weights (DL4J's
    ``KerasModelImport.importKerasModelAndWeights``): a Functional model into an initialised
    :class:`ComputationGraph`, a Sequential one into a :class:`MultiLayerNetwork` (as
    :func:`import_keras_sequential_model_and_weights`).

    The graph's inputs are the model's ``Input`` layers and its outputs the Dense layers producing the
    model's outputs, in the model's order and under their Keras names; every other vertex is named after
    the Keras layer it comes from.

    Args:
        path: the ``.keras`` zip or the HDF5 file ``model.save`` wrote.
        seed: the network's seed (dropout masks when training further).

    Returns:
        The network; it takes sparkgrad's channels-first layout (see :func:`to_sparkgrad_layout`), one
        array per input, and ``output`` returns one array per model output.

    Raises:
        KerasImportError: a layer type or option that does not map, named with the layer.
        ImportError: h5py is missing.
    """
    config, weights, loss = _read(path)
    kind = config.get("class_name")
    if kind == "Sequential":
        return _sequential(config, weights, loss, seed)
    if kind not in ("Functional", "Model"):
        raise KerasImportError(f"{path}: a {kind} model; only Sequential and Functional models are imported")
    return _functional(config, weights, loss, seed)


def import_keras_sequential_model_and_weights(path: str | Path, seed: int | None = None) -> MultiLayerNetwork:
    """Load a Keras Sequential model saved by Keras (``.keras`` or legacy ``.h5``) into an initialised
    :class:`MultiLayerNetwork` carrying its weights (DL4J's
    ``KerasModelImport.importKerasSequentialModelAndWeights``).

    Args:
        path: the ``.keras`` zip or the HDF5 file ``model.save`` wrote.
        seed: the network's seed (dropout masks when training further).

    Returns:
        The network; it takes sparkgrad's channels-first layout (see :func:`to_sparkgrad_layout`).

    Raises:
        KerasImportError: a layer type or option that does not map, named with the layer; a model that
            is not Sequential (:func:`import_keras_model_and_weights` imports Functional ones).
        ImportError: h5py is missing.
    """
    config, weights, loss = _read(path)
    if config.get("class_name") != "Sequential":
        raise KerasImportError(
            f"{path}: a {config.get('class_name')} model, not Sequential: use import_keras_model_and_weights"
        )
    return _sequential(config, weights, loss, seed)


def to_sparkgrad_layout(x: Any, indices: bool = False) -> np.ndarray:
    """Keras channels-last data to the imported network's layout: images (N, H, W, C) -> (N, C, H, W),
    sequences (N, T, F) -> (N, F, T), token indices (N, T) -> (N, 1, T) when ``indices``; (N, F)
    unchanged. Sequence output goes back with ``y.transpose(0, 2, 1)``."""
    x = np.asarray(x)
    if indices:
        if x.ndim != 2:
            raise ValueError(f"x: token indices must be (batch, time), got shape {x.shape}")
        return x[:, None, :]
    if x.ndim == 4:
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if x.ndim == 3:
        return np.ascontiguousarray(x.transpose(0, 2, 1))
    return x
