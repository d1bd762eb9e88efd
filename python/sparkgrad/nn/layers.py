"""Layer configurations. They are pure data (JSON/YAML round trip); the network builds the runtime.

Each layer knows how to infer its input size from the incoming :class:`InputType` (``infer``), the
parameters it owns (``param_specs``, in flat-buffer order) and its output type. Fields left ``None``
(activation, weight_init, l1, l2, weight_decay, updater) take the network-wide defaults.

Validation (ValueError naming the field): l1, l2 and weight_decay are finite and in [0, MAX_SCALE];
dropout (a retain probability) is in (0, 1]; batch-norm decay in [0, 1] and eps in (0, MAX_SCALE].
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from sparkgrad._config import (
    MAX_SCALE,
    Config,
    check_int,
    check_non_negative,
    check_positive,
    check_range,
    coerce_enum,
)
from sparkgrad.nn.enums import Activation, ConvolutionMode, LossFunction, PoolingType, WeightInit
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.updaters import Updater, check_updater

# Parameter roles: which ones are initialised by weight_init / regularized (WEIGHT), start at zero
# (BIAS), start at one (GAMMA) and which are running statistics never touched by the updater.
WEIGHT, BIAS, GAMMA, BETA, RUNNING_MEAN, RUNNING_VAR = "W", "b", "gamma", "beta", "mean", "var"


class ParamSpec(NamedTuple):
    """One parameter array of a layer: name, shape, role, and fan-in/out for weight initialisation."""

    name: str
    shape: tuple[int, ...]
    role: str
    fan_in: float = 1.0
    fan_out: float = 1.0


def layer_error(index: int | str, layer: Any, field: str, message: str) -> ValueError:
    """ValueError naming the layer index (or graph vertex name), its type and the field:
    ``layers[2] (DenseLayer).n_in: ...`` or ``vertex 'fc' (DenseLayer).n_in: ...``."""
    where = f"vertex {index!r}" if isinstance(index, str) else f"layers[{index}]"
    return ValueError(f"{where} ({type(layer).__name__}).{field}: {message}")


def _pair(field: str, value: Any, minimum: int) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{field}: expected an int or a pair of ints, got {value!r}")
    return (check_int(field, value[0], minimum=minimum), check_int(field, value[1], minimum=minimum))


def _optional(value: Any, check: Any, field: str, *args: Any) -> Any:
    return None if value is None else check(field, value, *args)


def _check_dropout(field: str, value: Any) -> float:
    return check_range(field, value, 0.0, 1.0, low_inclusive=False)


class Layer(Config):
    """Base of every layer configuration."""

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        """Check the layer against its input, fill ``n_in``; returns (layer, output type)."""
        return self, input_type

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        """Parameters in flat-buffer order for this layer given its (already inferred) input type."""
        return []

    @property
    def is_output(self) -> bool:
        return False

    @property
    def flattens_input(self) -> bool:
        """True for layers taking (batch, features): convolutional input is flattened in front of them."""
        return False

    def _common_post_init(self) -> None:
        """Validation of the optional per-layer settings shared by several layer types."""
        for name in ("activation", "weight_init"):
            if getattr(self, name, None) is not None:
                enum_cls = Activation if name == "activation" else WeightInit
                setattr(self, name, coerce_enum(enum_cls, getattr(self, name), name))
        for name in ("l1", "l2", "weight_decay"):
            if hasattr(self, name):
                setattr(self, name, _optional(getattr(self, name), check_non_negative, name, MAX_SCALE))
        if getattr(self, "dropout", None) is not None:
            self.dropout = _check_dropout("dropout", self.dropout)
        if getattr(self, "updater", None) is not None:
            check_updater("updater", self.updater)
        if getattr(self, "n_in", None) is not None:
            self.n_in = check_int("n_in", self.n_in, minimum=1)
        if hasattr(self, "n_out"):
            self.n_out = check_int("n_out", self.n_out, minimum=1)


def _infer_n_in(index: int, layer: Any, actual: int) -> Any:
    if layer.n_in is None:
        return dataclasses.replace(layer, n_in=actual)
    if layer.n_in != actual:
        raise layer_error(index, layer, "n_in", f"is {layer.n_in} but the input has size {actual}")
    return layer


def _check_conv_input(index: int, layer: Layer, input_type: InputType) -> None:
    if not input_type.is_convolutional:
        raise layer_error(index, layer, "input", f"needs convolutional input, got {input_type.describe()}")


def _dense_specs(n_in: int, n_out: int, has_bias: bool) -> list[ParamSpec]:
    specs = [ParamSpec(WEIGHT, (n_in, n_out), WEIGHT, n_in, n_out)]
    if has_bias:
        specs.append(ParamSpec(BIAS, (n_out,), BIAS))
    return specs


def _dense_infer(self: Any, index: int, input_type: InputType) -> tuple[Layer, InputType]:
    # convolutional input is flattened (C order of (C, H, W)) in front of a dense layer
    return _infer_n_in(index, self, input_type.size), InputType.feed_forward(self.n_out)


@dataclasses.dataclass
class DenseLayer(Layer):
    """Fully connected layer ``y = activation(x W + b)``; ``dropout`` (retain probability) is on its input."""

    n_out: int
    n_in: int | None = None
    activation: Activation | None = None
    weight_init: WeightInit | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None

    def __post_init__(self) -> None:
        self._common_post_init()

    @property
    def flattens_input(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        return _dense_infer(self, index, input_type)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return _dense_specs(self.n_in, self.n_out, self.has_bias)


@dataclasses.dataclass
class OutputLayer(Layer):
    """Dense layer followed by a loss; the last layer of a trainable network."""

    n_out: int
    n_in: int | None = None
    activation: Activation = Activation.SOFTMAX
    loss: LossFunction = LossFunction.MCXENT
    weight_init: WeightInit | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None

    def __post_init__(self) -> None:
        self._common_post_init()
        self.loss = coerce_enum(LossFunction, self.loss, "loss")

    @property
    def is_output(self) -> bool:
        return True

    @property
    def flattens_input(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        return _dense_infer(self, index, input_type)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return _dense_specs(self.n_in, self.n_out, self.has_bias)


@dataclasses.dataclass
class LossLayer(Layer):
    """Parameter-free output layer: ``activation`` then ``loss`` on its input."""

    loss: LossFunction = LossFunction.MCXENT
    activation: Activation = Activation.IDENTITY

    def __post_init__(self) -> None:
        self.loss = coerce_enum(LossFunction, self.loss, "loss")
        self.activation = coerce_enum(Activation, self.activation, "activation")

    @property
    def is_output(self) -> bool:
        return True

    @property
    def flattens_input(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        return self, InputType.feed_forward(input_type.size)


def conv_output_size(size: int, kernel: int, stride: int, pad: int, mode: ConvolutionMode) -> tuple[int, int]:
    """(output size, top/left padding) along one axis. SAME pads asymmetrically (extra at the end)."""
    if mode is ConvolutionMode.SAME:
        out = -(-size // stride)
        total = max((out - 1) * stride + kernel - size, 0)
        return out, total // 2
    return (size + 2 * pad - kernel) // stride + 1, pad


def spatial_output(index: int, layer: Any, input_type: InputType) -> tuple[int, int, int, int]:
    """(P, Q, pad_top, pad_left) for a windowed layer; errors name the layer when the window does not fit."""
    mode = layer.convolution_mode
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    p, pad_top = conv_output_size(input_type.height, kh, sh, ph, mode)
    q, pad_left = conv_output_size(input_type.width, kw, sw, pw, mode)
    if p < 1 or q < 1:
        raise layer_error(
            index,
            layer,
            "kernel_size",
            f"{layer.kernel_size} with padding {layer.padding} does not fit input "
            f"{input_type.height}x{input_type.width}",
        )
    return p, q, pad_top, pad_left


def _window_post_init(layer: Any) -> None:
    layer.kernel_size = _pair("kernel_size", layer.kernel_size, 1)
    layer.stride = _pair("stride", layer.stride, 1)
    layer.padding = _pair("padding", layer.padding, 0)
    layer.convolution_mode = coerce_enum(ConvolutionMode, layer.convolution_mode, "convolution_mode")


@dataclasses.dataclass
class ConvolutionLayer(Layer):
    """2-D convolution over NCHW input; ``n_in`` is the number of input channels."""

    n_out: int
    kernel_size: tuple = (3, 3)
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    convolution_mode: ConvolutionMode = ConvolutionMode.TRUNCATE
    activation: Activation | None = None
    n_in: int | None = None
    weight_init: WeightInit | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None

    def __post_init__(self) -> None:
        self._common_post_init()
        _window_post_init(self)

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_conv_input(index, self, input_type)
        layer = _infer_n_in(index, self, input_type.channels)
        p, q, _, _ = spatial_output(index, self, input_type)
        return layer, InputType.convolutional(p, q, self.n_out)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        fan_in = self.n_in * kh * kw
        fan_out = self.n_out * kh * kw / (sh * sw)
        specs = [ParamSpec(WEIGHT, (self.n_out, self.n_in, kh, kw), WEIGHT, fan_in, fan_out)]
        if self.has_bias:
            specs.append(ParamSpec(BIAS, (self.n_out,), BIAS))
        return specs


@dataclasses.dataclass
class SubsamplingLayer(Layer):
    """Max or average pooling over NCHW input (average divides by the in-bounds window size)."""

    pooling_type: PoolingType = PoolingType.MAX
    kernel_size: tuple = (2, 2)
    stride: tuple = (2, 2)
    padding: tuple = (0, 0)
    convolution_mode: ConvolutionMode = ConvolutionMode.TRUNCATE

    def __post_init__(self) -> None:
        self.pooling_type = coerce_enum(PoolingType, self.pooling_type, "pooling_type")
        if self.pooling_type is PoolingType.SUM:
            raise ValueError("pooling_type: SubsamplingLayer supports max and avg, got 'sum'")
        _window_post_init(self)

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_conv_input(index, self, input_type)
        p, q, _, _ = spatial_output(index, self, input_type)
        return self, InputType.convolutional(p, q, input_type.channels)


@dataclasses.dataclass
class GlobalPoolingLayer(Layer):
    """Pools every channel of convolutional input over its whole spatial extent: (N, C, H, W) -> (N, C)."""

    pooling_type: PoolingType = PoolingType.MAX

    def __post_init__(self) -> None:
        self.pooling_type = coerce_enum(PoolingType, self.pooling_type, "pooling_type")

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_conv_input(index, self, input_type)
        return self, InputType.feed_forward(input_type.channels)


@dataclasses.dataclass
class BatchNormalization(Layer):
    """Batch normalization per feature (dense input) or per channel (convolutional input).

    Running mean and variance live in the flat parameter buffer (saved and averaged with it) but are
    not trained: their change per step is carried in the update vector.
    """

    decay: float = 0.9
    eps: float = 1e-5
    n_in: int | None = None
    updater: Updater | None = None

    def __post_init__(self) -> None:
        self.decay = check_range("decay", self.decay, 0.0, 1.0)
        self.eps = check_positive("eps", self.eps, MAX_SCALE)
        self._common_post_init()

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        channels = input_type.channels if input_type.is_convolutional else input_type.size
        return _infer_n_in(index, self, channels), input_type

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        c = (self.n_in,)
        return [
            ParamSpec(GAMMA, c, GAMMA),
            ParamSpec(BETA, c, BETA),
            ParamSpec(RUNNING_MEAN, c, RUNNING_MEAN),
            ParamSpec(RUNNING_VAR, c, RUNNING_VAR),
        ]


@dataclasses.dataclass
class DropoutLayer(Layer):
    """Inverted dropout; ``dropout`` is the probability of RETAINING a unit (DL4J convention)."""

    dropout: float

    def __post_init__(self) -> None:
        self.dropout = _check_dropout("dropout", self.dropout)


@dataclasses.dataclass
class ActivationLayer(Layer):
    """Applies an activation function element-wise (softmax over features of dense input)."""

    activation: Activation

    def __post_init__(self) -> None:
        self.activation = coerce_enum(Activation, self.activation, "activation")

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if self.activation is Activation.SOFTMAX and input_type.is_convolutional:
            raise layer_error(index, self, "activation", "softmax needs dense input, got convolutional")
        return self, input_type


__all__ = [
    "ActivationLayer",
    "BatchNormalization",
    "ConvolutionLayer",
    "DenseLayer",
    "DropoutLayer",
    "GlobalPoolingLayer",
    "Layer",
    "LossLayer",
    "OutputLayer",
    "ParamSpec",
    "SubsamplingLayer",
]
