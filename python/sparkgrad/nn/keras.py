"""Keras model import (DL4J's ``KerasModelImport``): Sequential models that Keras itself saves, in the
``.keras`` zip format (``config.json`` + ``model.weights.h5``) or legacy HDF5 (``.h5``: the
``model_config`` attribute + the ``model_weights`` group), into a :class:`MultiLayerNetwork` with their
weights. Parsed with h5py and json only: Keras is not needed to import (``pip install sparkgrad[keras]``).

Layout: Keras is channels-last, sparkgrad is DL4J's channels-first. The imported network takes
images as (batch, channels, height, width) and sequences as (batch, features, time) (token indices for
an ``Embedding`` first layer as (batch, 1, time)); :func:`to_sparkgrad_layout` converts Keras-layout
arrays. The weights are converted (convolution kernels transposed, the rows of a Dense after a Flatten
permuted from Keras's (h, w, c) order to sparkgrad's (c, h, w), recurrent gate blocks reordered), so
``net.output(to_sparkgrad_layout(x))`` equals ``keras_model.predict(x)`` (transposed back for sequence
output).

The last layer must be a Dense: it becomes an :class:`OutputLayer` whose loss follows its activation
(softmax: MCXENT, sigmoid: XENT, linear: MSE), so the network trains further with ``fit``.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from . import layers as L
from .conf import MultiLayerConfiguration
from .enums import Activation, ConvolutionMode, LossFunction, PoolingType
from .input_type import InputType
from .network import MultiLayerNetwork

__all__ = ["KerasImportError", "import_keras_sequential_model_and_weights", "to_sparkgrad_layout"]


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
_LOSSES = {
    Activation.SOFTMAX: LossFunction.MCXENT,
    Activation.SIGMOID: LossFunction.XENT,
    Activation.IDENTITY: LossFunction.MSE,
}


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "sparkgrad.nn.keras needs the 'h5py' package to read Keras files: pip install sparkgrad[keras]"
        ) from e
    return h5py


def _fail(layer: dict, option: str, value: Any) -> KerasImportError:
    name = layer.get("config", {}).get("name", "?")
    return KerasImportError(f"Keras layer {name!r} ({layer['class_name']}): unsupported {option}={value!r}")


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


def _read_keras(path: Path) -> tuple[dict, dict[str, list[np.ndarray]]]:
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
                    weights[name.decode() if isinstance(name, bytes) else str(name)] = _vars(group)
    return config, weights


def _vars(group: Any) -> list[np.ndarray]:
    """A layer group's variables in creation order: its own ``vars`` then its sub-objects' (a cell)."""
    out: list[np.ndarray] = []
    if "vars" in group:
        out += [np.asarray(group["vars"][k]) for k in sorted(group["vars"], key=int)]
    for key, sub in group.items():
        if key != "vars" and hasattr(sub, "items"):
            out += _vars(sub)
    return out


def _read_h5(path: Path) -> tuple[dict, dict[str, list[np.ndarray]]]:
    h5py = _h5py()
    with h5py.File(path, "r") as h:
        if "model_config" not in h.attrs:
            raise KerasImportError(f"{path}: no 'model_config' attribute: a weights-only file, not a model")
        raw = h.attrs["model_config"]
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        group = h["model_weights"] if "model_weights" in h else h
        weights = {}
        for name in group.attrs.get("layer_names", []):
            name = name.decode() if isinstance(name, bytes) else str(name)
            layer = group[name]
            names = [
                n.decode() if isinstance(n, bytes) else str(n) for n in layer.attrs.get("weight_names", [])
            ]
            weights[name] = [np.asarray(layer[n]) for n in names]
    return config, weights


def _lstm_gates(m: np.ndarray, h: int) -> np.ndarray:
    # Keras [i, f, c, o] -> DL4J [c (block input), f, o, i]
    i, f, c, o = (m[..., k * h : (k + 1) * h] for k in range(4))
    return np.concatenate([c, f, o, i], axis=-1)


def _gru_gates(m: np.ndarray, h: int) -> np.ndarray:
    # Keras [z (update), r (reset), h (candidate)] -> sparkgrad [r, u, c]
    z, r, c = (m[..., k * h : (k + 1) * h] for k in range(3))
    return np.concatenate([r, z, c], axis=-1)


class _Builder:
    """Walks the Keras layers, tracking the Keras-side shape, and emits sparkgrad layers + weights."""

    def __init__(self, weights: dict[str, list[np.ndarray]]) -> None:
        self.weights = weights
        self.layers: list[L.Layer] = []
        self.params: list[dict[str, np.ndarray]] = []
        self.shape: tuple = ()  # Keras shape without the batch axis
        self.flatten_from: tuple | None = None  # (h, w, c) when a Flatten of images precedes

    def add(self, layer: L.Layer, params: dict[str, np.ndarray] | None = None) -> None:
        self.layers.append(layer)
        self.params.append(params or {})

    def w(self, layer: dict) -> list[np.ndarray]:
        return self.weights.get(layer["config"]["name"], [])

    def layer(self, layer: dict, last: bool) -> None:
        kind, cfg = layer["class_name"], layer["config"]
        handler = getattr(self, "_" + kind, None)
        if handler is None:
            raise KerasImportError(f"Keras layer {cfg.get('name', '?')!r}: unsupported layer type {kind}")
        if last and kind != "Dense":
            raise KerasImportError(
                f"Keras layer {cfg.get('name', '?')!r} ({kind}): the last layer must be a Dense (it becomes "
                "the OutputLayer)"
            )
        if "data_format" in cfg:
            _require(layer, "data_format", ("channels_last",))
        handler(layer, last) if kind == "Dense" else handler(layer)

    def _InputLayer(self, layer: dict) -> None:
        pass

    def _Dropout(self, layer: dict) -> None:
        self.add(L.DropoutLayer(dropout=1.0 - float(layer["config"]["rate"])))

    def _Activation(self, layer: dict) -> None:
        self.add(L.ActivationLayer(activation=_activation(layer)))

    def _Flatten(self, layer: dict) -> None:
        if len(self.shape) == 3:
            self.flatten_from = self.shape
        elif len(self.shape) != 1:
            raise _fail(layer, "input shape", self.shape)
        self.shape = (int(np.prod(self.shape)),)

    def _Dense(self, layer: dict, last: bool) -> None:
        if len(self.shape) != 1:
            raise _fail(
                layer, "input rank (Dense on sequences or images without Flatten)", len(self.shape) + 1
            )
        cfg, act = layer["config"], _activation(layer)
        w = self.w(layer)
        kernel = w[0]
        if self.flatten_from is not None:  # rows in Keras's (h, w, c) order -> sparkgrad's (c, h, w)
            h, wd, c = self.flatten_from
            kernel = kernel.reshape(h, wd, c, -1).transpose(2, 0, 1, 3).reshape(h * wd * c, -1)
            self.flatten_from = None
        params = {L.WEIGHT: kernel}
        if cfg.get("use_bias", True):
            params[L.BIAS] = w[1]
        units, bias = int(cfg["units"]), bool(cfg.get("use_bias", True))
        if last:
            if act not in _LOSSES:
                raise _fail(layer, "activation of the output layer", act.value)
            self.add(L.OutputLayer(n_out=units, activation=act, loss=_LOSSES[act], has_bias=bias), params)
        else:
            self.add(L.DenseLayer(n_out=units, activation=act, has_bias=bias), params)
        self.shape = (units,)

    def _Conv2D(self, layer: dict) -> None:
        cfg = layer["config"]
        _require(layer, "dilation_rate", ((1, 1),))
        _require(layer, "groups", (1,))
        _require(layer, "padding", ("valid", "same"))
        w = self.w(layer)
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
        w = self.w(layer)
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
        gamma, beta, mean, var = self.w(layer)
        bn = L.BatchNormalization(decay=float(cfg.get("momentum", 0.99)), eps=float(cfg.get("epsilon", 1e-3)))
        self.add(bn, {L.GAMMA: gamma, L.BETA: beta, L.RUNNING_MEAN: mean, L.RUNNING_VAR: var})

    def _Embedding(self, layer: dict) -> None:
        cfg = layer["config"]
        if cfg.get("mask_zero"):
            raise _fail(layer, "mask_zero", True)
        if len(self.shape) != 1:
            raise _fail(layer, "input shape", self.shape)
        emb = L.EmbeddingSequenceLayer(
            n_in=int(cfg["input_dim"]), n_out=int(cfg["output_dim"]), activation=Activation.IDENTITY
        )
        self.add(emb, {L.WEIGHT: self.w(layer)[0]})
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
        kernel, recurrent, bias = self.w(layer)
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
        kernel, recurrent, bias = self.w(layer)
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
        kernel, recurrent, bias = self.w(layer)
        cell = L.SimpleRnn(n_out=int(layer["config"]["units"]), activation=_activation(layer))
        self._recurrent(layer, cell, {L.WEIGHT: kernel, L.RECURRENT_WEIGHT: recurrent, L.BIAS: bias})


def _input_shape(config: dict) -> tuple:
    for layer in config["config"]["layers"]:
        cfg = layer["config"]
        shape = cfg.get("batch_shape") or cfg.get("batch_input_shape")
        if shape:
            return tuple(shape[1:])
    shape = config["config"].get("build_input_shape")
    if shape:
        return tuple(shape[1:])
    raise KerasImportError("the Keras model has no input shape (build it or give it an Input)")


def _input_type(shape: tuple, first: dict) -> InputType:
    if any(s is None for s in shape[1:]) or (shape and shape[0] is None and len(shape) != 2):
        raise KerasImportError(f"input shape {shape}: only the time axis may be unknown")
    if first["class_name"] == "Embedding":
        return InputType.recurrent(1, shape[0])
    if len(shape) == 1:
        return InputType.feed_forward(int(shape[0]))
    if len(shape) == 2:
        return InputType.recurrent(int(shape[1]), shape[0])
    if len(shape) == 3:
        return InputType.convolutional(int(shape[0]), int(shape[1]), int(shape[2]))
    raise KerasImportError(f"input shape {shape}: unsupported rank")


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
        KerasImportError: a layer type or option that does not map, named with the layer.
        ImportError: h5py is missing.
    """
    path = Path(path)
    config, weights = _read_keras(path) if zipfile.is_zipfile(path) else _read_h5(path)
    if config.get("class_name") != "Sequential":
        raise KerasImportError(f"{path}: a {config.get('class_name')} model; only Sequential is supported")
    layers = [layer for layer in config["config"]["layers"] if layer["class_name"] != "InputLayer"]
    if not layers:
        raise KerasImportError(f"{path}: the model has no layers")
    builder = _Builder(weights)
    builder.shape = _input_shape(config)
    input_type = _input_type(builder.shape, layers[0])
    for i, layer in enumerate(layers):
        builder.layer(layer, last=i == len(layers) - 1)
    conf = MultiLayerConfiguration(builder.layers, input_type=input_type, seed=seed)
    net = MultiLayerNetwork(conf).init()
    flat = net.params().copy()
    for entries, given, layer in zip(net._layouts, builder.params, builder.layers):
        for spec, start, stop in entries:
            if spec.name not in given:
                raise KerasImportError(f"{type(layer).__name__}: Keras gave no {spec.name!r} weight")
            value = np.asarray(given[spec.name], dtype=flat.dtype)
            if value.shape != tuple(spec.shape):
                raise KerasImportError(
                    f"{type(layer).__name__} {spec.name!r}: Keras shape {value.shape}, expected {spec.shape}"
                )
            flat[start:stop] = value.ravel()
    net.set_params(flat)
    return net


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
