"""Layer configurations. They are pure data (JSON/YAML round trip); the network builds the runtime.

Each layer knows how to infer its input size from the incoming :class:`InputType` (``infer``), the
parameters it owns (``param_specs``, in flat-buffer order) and its output type. Fields left ``None``
(activation, weight_init, l1, l2, weight_decay, updater, gradient_normalization,
gradient_normalization_threshold) take the network-wide defaults.

Validation (ValueError naming the field): l1, l2 and weight_decay are finite and in [0, MAX_SCALE];
gradient_normalization_threshold is finite and in (0, MAX_SCALE]; dropout (a retain probability) is in
(0, 1]; batch-norm decay in [0, 1] and eps in (0, MAX_SCALE].
"""

from __future__ import annotations

import dataclasses
import enum
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
from sparkgrad.nn.enums import (
    Activation,
    ConvolutionMode,
    GradientNormalization,
    LossFunction,
    PoolingType,
    WeightInit,
)
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.updaters import NoOp, Updater, check_updater

# Parameter roles: which ones are initialised by weight_init / regularized (WEIGHT), start at zero
# (BIAS), start at one (GAMMA) and which are running statistics never touched by the updater.
WEIGHT, BIAS, GAMMA, BETA, RUNNING_MEAN, RUNNING_VAR = "W", "b", "gamma", "beta", "mean", "var"
_NO_UPDATE = NoOp()  # a FrozenLayer's updater


class ParamSpec(NamedTuple):
    """One parameter array of a layer: name, shape, role, and fan-in/out for weight initialisation."""

    name: str
    shape: tuple[int, ...]
    role: str
    fan_in: float = 1.0
    fan_out: float = 1.0
    # (start, stop, value): flat ranges that start at ``value`` instead of the role's default (the LSTM
    # forget-gate bias).
    fills: tuple = ()


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


def _check_count(field: str, value: Any) -> int:
    return check_int(field, value, minimum=1)


# Optional per-layer settings holding an enum (coerced from the member or its string value).
_ENUM_SETTINGS = {
    "activation": Activation,
    "weight_init": WeightInit,
    "gradient_normalization": GradientNormalization,
}


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

    @property
    def takes_sequences(self) -> bool:
        """True for layers whose runtime, given recurrent input, sees whole sequences (N, T, C) plus the
        features mask (see :mod:`sparkgrad.nn._recurrent`): recurrent layers and global pooling over time;
        other layers given recurrent input run at every time step."""
        return False

    @property
    def batch_statistics(self) -> bool:
        """True when the layer's training output depends on the other examples (batch normalization):
        on masked sequences it then sees only the present steps, so padding never enters the statistics."""
        return False

    @property
    def recurrent_aware(self) -> bool:
        """True when ``infer`` itself handles recurrent input types (recurrent and Rnn* layers)."""
        return self.takes_sequences

    @property
    def takes_indices(self) -> bool:
        """True for the embedding layers: their input is the network's integer index input (never another
        layer's activations), and they pass no gradient back to it."""
        return False

    def _common_post_init(self) -> None:
        """Validation of the optional per-layer settings shared by several layer types."""
        for name, enum_cls in _ENUM_SETTINGS.items():
            if getattr(self, name, None) is not None:
                setattr(self, name, coerce_enum(enum_cls, getattr(self, name), name))
        for name, scale_check in (
            ("l1", check_non_negative),
            ("l2", check_non_negative),
            ("weight_decay", check_non_negative),
            ("gradient_normalization_threshold", check_positive),
        ):
            if hasattr(self, name):
                setattr(self, name, _optional(getattr(self, name), scale_check, name, MAX_SCALE))
        # (field, its check, checked when None too): for every layer type that has the field
        for name, check, when_none in (
            ("dropout", _check_dropout, False),
            ("n_in", _check_count, False),
            ("n_out", _check_count, True),
        ):
            if hasattr(self, name) and (when_none or getattr(self, name) is not None):
                setattr(self, name, check(name, getattr(self, name)))
        updater = getattr(self, "updater", None)
        if updater is not None:
            check_updater("updater", updater)

    def _inferred_n_in(self) -> int:
        """``n_in`` as given or as ``infer`` filled it in: parameter shapes need it."""
        n_in = getattr(self, "n_in", None)
        if n_in is None:
            raise ValueError(f"{type(self).__name__}: n_in is neither given nor inferred from an input type")
        return int(n_in)


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
    activation: Activation | str | None = None
    weight_init: WeightInit | str | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self._common_post_init()

    @property
    def flattens_input(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        return _dense_infer(self, index, input_type)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return _dense_specs(self._inferred_n_in(), self.n_out, self.has_bias)


@dataclasses.dataclass
class OutputLayer(Layer):
    """Dense layer followed by a loss; the last layer of a trainable network."""

    n_out: int
    n_in: int | None = None
    activation: Activation | str = Activation.SOFTMAX
    loss: LossFunction | str = LossFunction.MCXENT
    weight_init: WeightInit | str | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

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
        return _dense_specs(self._inferred_n_in(), self.n_out, self.has_bias)


@dataclasses.dataclass
class LossLayer(Layer):
    """Parameter-free output layer: ``activation`` then ``loss`` on its input."""

    loss: LossFunction | str = LossFunction.MCXENT
    activation: Activation | str = Activation.IDENTITY

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


def _check_strict(
    index: int | str, layer: Any, sizes: tuple, kernel: tuple, stride: tuple, pad: tuple
) -> None:
    """STRICT mode: every axis's padded input must be tiled exactly by the windows (DL4J's check)."""
    if layer.convolution_mode is not ConvolutionMode.STRICT:
        return
    for size, k, s, p in zip(sizes, kernel, stride, pad):
        if size + 2 * p >= k and (size + 2 * p - k) % s:
            raise layer_error(
                index,
                layer,
                "convolution_mode",
                f"strict: input {size} + 2 x padding {p} - kernel {k} is not a multiple of stride {s} "
                "(use truncate to drop the remainder, or same)",
            )


def spatial_output(index: int, layer: Any, input_type: InputType) -> tuple[int, int, int, int]:
    """(P, Q, pad_top, pad_left) for a windowed layer; errors name the layer when the window does not fit."""
    mode = layer.convolution_mode
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    p, pad_top = conv_output_size(input_type.height, kh, sh, ph, mode)
    q, pad_left = conv_output_size(input_type.width, kw, sw, pw, mode)
    _check_strict(index, layer, (input_type.height, input_type.width), (kh, kw), (sh, sw), (ph, pw))
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
    convolution_mode: ConvolutionMode | str = ConvolutionMode.TRUNCATE
    activation: Activation | str | None = None
    n_in: int | None = None
    weight_init: WeightInit | str | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self._common_post_init()
        _window_post_init(self)

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_conv_input(index, self, input_type)
        layer = _infer_n_in(index, self, input_type.channels)
        p, q, _, _ = spatial_output(index, self, input_type)
        return layer, InputType.convolutional(p, q, self.n_out)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        (kh, kw), (sh, sw), n_in = self.kernel_size, self.stride, self._inferred_n_in()
        fan_in = n_in * kh * kw
        fan_out = self.n_out * kh * kw / (sh * sw)
        specs = [ParamSpec(WEIGHT, (self.n_out, n_in, kh, kw), WEIGHT, fan_in, fan_out)]
        if self.has_bias:
            specs.append(ParamSpec(BIAS, (self.n_out,), BIAS))
        return specs


def deconv_output_size(
    size: int, kernel: int, stride: int, pad: int, dilation: int, mode: ConvolutionMode
) -> tuple[int, int]:
    """(output size, top/left padding) of a transposed convolution along one axis, as DL4J computes them
    (``ConvolutionUtils.getDeconvolutionOutputSize`` and libnd4j's deconv2d): SAME gives ``stride * size``
    and trims ``(k_eff - stride) // 2`` from the top/left (the rest, if any, from the bottom/right);
    TRUNCATE and STRICT give ``stride * (size - 1) + k_eff - 2 padding``, trimming ``padding`` from both
    ends. ``k_eff = (kernel - 1) dilation + 1``. Where ``k_eff < stride`` in SAME mode the last
    ``stride - k_eff`` rows of the output receive no input (bias only)."""
    effective = (kernel - 1) * dilation + 1
    if mode is ConvolutionMode.SAME:
        return stride * size, max(effective - stride, 0) // 2
    return stride * (size - 1) + effective - 2 * pad, pad


@dataclasses.dataclass
class Deconvolution2D(Layer):
    """DL4J's Deconvolution2D: a transposed 2-D convolution over NCHW input (the adjoint of a
    ConvolutionLayer with the same kernel, stride, padding and dilation), upsampling (batch, n_in, h, w) to
    (batch, n_out, h', w'): truncate and strict give ``h' = stride (h - 1) + k_eff - 2 padding`` (the same
    for both: a transposed convolution drops nothing), same gives ``h' = stride h``, with
    ``k_eff = (kernel - 1) dilation + 1``; likewise for w.

    Parameters: ``W`` (n_in, n_out, kernel_h, kernel_w) (DL4J's layout for this layer) and ``b`` (n_out).
    The forward is a convolution's input gradient, the input gradient a convolution's forward and the
    weight gradient a convolution's weight gradient with the roles of input and output swapped: it runs
    the ConvolutionLayer's kernels (im2col/Winograd on the CPU, cuDNN or im2col on a GPU). A dilation above
    1 runs them with the kernel spread out (zeros between its taps), which costs as a kernel of size k_eff.

    Args:
        n_out: output channels.
        kernel_size: (height, width) of the kernel, or one int for both.
        stride: (rows, columns) step: the upsampling factor.
        padding: rows and columns trimmed from each edge of the output (truncate and strict modes).
        dilation: (rows, columns) spacing of the kernel's taps.
        convolution_mode: truncate, strict or same.
        activation: the layer's activation (None: the network default).
        n_in: input channels, inferred from the input type when None.
        weight_init: the weights' initialisation (None: the network default); fan-in
            ``n_in * kernel_h * kernel_w``, fan-out ``n_out * kernel_h * kernel_w / (stride_h * stride_w)``
            as DL4J's.
        has_bias: whether the layer has the bias ``b``.
        l1: L1 regularization of the weights (None: the network default).
        l2: L2 regularization of the weights (None: the network default).
        dropout: retain probability of the layer's input during training (None: no dropout).
        weight_decay: weight decay of the weights (None: the network default).
        updater: the layer's own updater (None: the network's).
        gradient_normalization: the layer's gradient normalization (None: the network default).
        gradient_normalization_threshold: its threshold (None: the network default).
    """

    n_out: int
    kernel_size: tuple = (3, 3)
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    convolution_mode: ConvolutionMode | str = ConvolutionMode.TRUNCATE
    activation: Activation | str | None = None
    n_in: int | None = None
    weight_init: WeightInit | str | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self._common_post_init()
        _window_post_init(self)
        self.dilation = _pair("dilation", self.dilation, 1)

    def output_geometry(self, index: int | str, input_type: InputType) -> tuple[int, int, int, int]:
        """(h', w', pad_top, pad_left) for a convolutional input; errors name the layer."""
        mode = ConvolutionMode(self.convolution_mode)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self.padding, self.dilation
        p, pad_top = deconv_output_size(input_type.height, kh, sh, ph, dh, mode)
        q, pad_left = deconv_output_size(input_type.width, kw, sw, pw, dw, mode)
        if p < 1 or q < 1:
            raise layer_error(
                index,
                self,
                "padding",
                f"{self.padding} trims the whole {p + 2 * ph}x{q + 2 * pw} output of the "
                f"{input_type.height}x{input_type.width} input",
            )
        return p, q, pad_top, pad_left

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_conv_input(index, self, input_type)
        layer = _infer_n_in(index, self, input_type.channels)
        p, q, _, _ = self.output_geometry(index, input_type)
        return layer, InputType.convolutional(p, q, self.n_out)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        (kh, kw), (sh, sw), n_in = self.kernel_size, self.stride, self._inferred_n_in()
        fan_in = n_in * kh * kw
        fan_out = self.n_out * kh * kw / (sh * sw)
        specs = [ParamSpec(WEIGHT, (n_in, self.n_out, kh, kw), WEIGHT, fan_in, fan_out)]
        if self.has_bias:
            specs.append(ParamSpec(BIAS, (self.n_out,), BIAS))
        return specs


@dataclasses.dataclass
class SubsamplingLayer(Layer):
    """Max or average pooling over NCHW input (average divides by the in-bounds window size)."""

    pooling_type: PoolingType | str = PoolingType.MAX
    kernel_size: tuple = (2, 2)
    stride: tuple = (2, 2)
    padding: tuple = (0, 0)
    convolution_mode: ConvolutionMode | str = ConvolutionMode.TRUNCATE

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
    """Pools every channel of convolutional input over its whole spatial extent: (N, C, H, W) -> (N, C);
    pools every feature of recurrent input over time: (N, C, T) -> (N, C).

    With a features mask only the present steps count (DL4J's masked time-series pooling): max over the
    steps whose mask is non-zero, sum of ``x * mask``, average ``sum(x * mask) / sum(mask)``; an example
    with no present step pools to zero.
    """

    pooling_type: PoolingType | str = PoolingType.MAX

    def __post_init__(self) -> None:
        self.pooling_type = coerce_enum(PoolingType, self.pooling_type, "pooling_type")

    @property
    def takes_sequences(self) -> bool:
        return True  # recurrent input: pooled over the present time steps (see the class docstring)

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if input_type.kind == "recurrent":
            return self, InputType.feed_forward(input_type.size)
        _check_conv_input(index, self, input_type)
        return self, InputType.feed_forward(input_type.channels)


def _four(field: str, value: Any) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) from an int (all four), a pair (rows, columns) or four ints."""
    if isinstance(value, (tuple, list)) and len(value) == 4:
        return tuple(check_int(field, v, minimum=0) for v in value)  # type: ignore[return-value]
    rows, cols = _pair(field, value, 0)
    return rows, rows, cols, cols


class _Copy2D(Layer):
    """Base of the 2-D layers that copy their input into a new shape (Upsampling2D, ZeroPaddingLayer,
    Cropping2D): no parameters; the copies are done by the device's array module."""

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """The output (height, width) for an input of (height, width)."""
        raise NotImplementedError  # every copy layer overrides this

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_conv_input(index, self, input_type)
        h, w = self.output_hw(input_type.height, input_type.width)
        if h < 1 or w < 1:
            raise layer_error(
                index, self, "cropping", f"leaves nothing of the {input_type.height}x{input_type.width} input"
            )
        return self, InputType.convolutional(h, w, input_type.channels)


@dataclasses.dataclass
class Upsampling2D(_Copy2D):
    """DL4J's Upsampling2D: nearest-neighbour upsampling, every pixel repeated ``size`` = (rows, columns)
    times, (batch, c, h, w) -> (batch, c, rows * h, columns * w)."""

    size: tuple = (2, 2)

    def __post_init__(self) -> None:
        self.size = _pair("size", self.size, 1)

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        return self.size[0] * height, self.size[1] * width


@dataclasses.dataclass
class ZeroPaddingLayer(_Copy2D):
    """DL4J's ZeroPaddingLayer: zero rows and columns around every image. ``padding``: an int, (rows,
    columns) or (top, bottom, left, right)."""

    padding: tuple = (1, 1, 1, 1)

    def __post_init__(self) -> None:
        self.padding = _four("padding", self.padding)

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        top, bottom, left, right = self.padding
        return top + height + bottom, left + width + right


@dataclasses.dataclass
class Cropping2D(_Copy2D):
    """DL4J's Cropping2D: rows and columns cut from the edges of every image. ``cropping``: an int,
    (rows, columns) or (top, bottom, left, right)."""

    cropping: tuple = (0, 0, 0, 0)

    def __post_init__(self) -> None:
        self.cropping = _four("cropping", self.cropping)

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        top, bottom, left, right = self.cropping
        return height - top - bottom, width - left - right


@dataclasses.dataclass
class BatchNormalization(Layer):
    """Batch normalization per feature (dense input) or per channel (convolutional input); on sequences
    per feature at every time step, the batch statistics over the present (unmasked) steps only.

    Running mean and variance live in the flat parameter buffer (saved and averaged with it) but are
    not trained: their change per step is carried in the update vector.
    """

    decay: float = 0.9
    eps: float = 1e-5
    n_in: int | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self.decay = check_range("decay", self.decay, 0.0, 1.0)
        self.eps = check_positive("eps", self.eps, MAX_SCALE)
        self._common_post_init()

    @property
    def batch_statistics(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        channels = input_type.channels if input_type.is_convolutional else input_type.size
        return _infer_n_in(index, self, channels), input_type

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        c = (self._inferred_n_in(),)
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

    activation: Activation | str

    def __post_init__(self) -> None:
        self.activation = coerce_enum(Activation, self.activation, "activation")

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if self.activation is Activation.SOFTMAX and input_type.is_convolutional:
            raise layer_error(index, self, "activation", "softmax needs dense input, got convolutional")
        return self, input_type


LAYER_NORM_GAIN = "gain"


@dataclasses.dataclass
class LayerNormalization(Layer):
    """Layer normalization (Ba et al. 2016; libnd4j's ``layer_norm``, which DL4J's layers and SameDiff use):
    each example's features are normalized over the feature axis, ``y = (x - mean) / sqrt(var + eps) *
    gain + bias`` with the biased variance, on dense input per example and on recurrent input (batch,
    features, time) per example and time step (masked steps output zero). Unlike BatchNormalization it
    keeps no running statistics and computes the same in training and inference.

    Parameters: ``gain`` (n_in) starting at 1, then ``b`` (n_in) starting at 0 when ``has_bias``.

    Args:
        eps: added to the variance, in (0, MAX_SCALE] (libnd4j's 1e-5).
        has_bias: whether the layer has the bias ``b``.
        n_in: the number of features (inferred).
        updater: as DenseLayer.
        gradient_normalization: as DenseLayer.
        gradient_normalization_threshold: as DenseLayer.
    """

    eps: float = 1e-5
    has_bias: bool = True
    n_in: int | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self.eps = check_positive("eps", self.eps, MAX_SCALE)
        if not isinstance(self.has_bias, bool):
            raise ValueError(f"has_bias: expected a bool, got {self.has_bias!r}")
        self._common_post_init()

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if input_type.kind != "feed_forward":
            raise layer_error(
                index, self, "input", f"needs dense or recurrent input (vectors), got {input_type.describe()}"
            )
        return _infer_n_in(index, self, input_type.size), input_type

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        c = (self._inferred_n_in(),)
        return [ParamSpec(LAYER_NORM_GAIN, c, GAMMA)] + ([ParamSpec(BIAS, c, BIAS)] if self.has_bias else [])


# ---- recurrent layers ------------------------------------------------------------------------------
# Data layout (DL4J's): recurrent features are (batch, size, time), masks (batch, time) with 1 = the step
# is present. Inside the network each example's steps are contiguous rows, (batch, time, size).

RECURRENT_WEIGHT = "RW"


def infer_layer(index: int, layer: Layer, input_type: InputType) -> tuple[Layer, InputType]:
    """``layer.infer`` with the automatic preprocessing between recurrent and feed-forward layers.

    A layer that is not recurrent-aware, given recurrent input, runs at every time step (DL4J's
    RnnToFeedForward / FeedForwardToRnn preprocessors): it is inferred on the per-step type (a vector,
    or the image of ``InputType.recurrent_images``: RnnToCnn) and its output becomes recurrent again with
    the same number of time steps (images stay images; a recurrent layer after them sees every step's
    flattened activations: CnnToRnn). Convolutional layers need image steps (their ``infer`` names the
    layer otherwise).

    Returns:
        (the layer with ``n_in`` filled, its output type).
    """
    if input_type.kind != "recurrent" or layer.recurrent_aware:
        return layer.infer(index, input_type)
    layer, out = layer.infer(index, input_type.step_type())
    if out.kind == "feed_forward":
        out = InputType.recurrent(out.size, input_type.time_steps)
    elif out.is_convolutional:  # a sequence of images stays one (RnnToCnn / CnnToRnn)
        out = InputType.recurrent_images(out.height, out.width, out.channels, input_type.time_steps)
    return layer, out


def _check_recurrent_input(index: int, layer: Layer, input_type: InputType) -> None:
    if input_type.kind != "recurrent":
        raise layer_error(
            index, layer, "input", f"needs recurrent input (InputType.recurrent), got {input_type.describe()}"
        )


def _check_elementwise(field: str, value: Activation | str) -> Activation | str:
    if value is Activation.SOFTMAX:
        raise ValueError(f"{field}: recurrent layers need an elementwise activation, got softmax")
    return value


def _gated_post_init(layer: Any) -> None:
    """Validation of a gated cell (LSTM, GRU): both activations elementwise."""
    layer._common_post_init()
    layer.activation = _check_elementwise("activation", layer.activation)
    layer.gate_activation = _check_elementwise(
        "gate_activation", coerce_enum(Activation, layer.gate_activation, "gate_activation")
    )


def _gated_specs(layer: Any, gates: int, fills: tuple = ()) -> list[ParamSpec]:
    """W (n_in, gates n_out), RW (n_out, gates n_out), b (gates n_out) of a gated cell; fan-in / fan-out as
    DL4J's LSTMParamInitializer: n_out and n_in + n_out for both matrices."""
    n_in, h = layer._inferred_n_in(), layer.n_out
    fan_in, fan_out = h, n_in + h
    return [
        ParamSpec(WEIGHT, (n_in, gates * h), WEIGHT, fan_in, fan_out),
        ParamSpec(RECURRENT_WEIGHT, (h, gates * h), WEIGHT, fan_in, fan_out),
        ParamSpec(BIAS, (gates * h,), BIAS, fills=fills),
    ]


class _RecurrentCell(Layer):
    """Base of the recurrent layers with ``n_in`` / ``n_out``: whole sequences in, sequences of n_out out."""

    n_in: int | None
    n_out: int

    @property
    def takes_sequences(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_recurrent_input(index, self, input_type)
        layer = _infer_n_in(index, self, input_type.size)
        return layer, InputType.recurrent(self.n_out, input_type.time_steps)


@dataclasses.dataclass
class LSTM(_RecurrentCell):
    """DL4J's LSTM (no peepholes). Input (batch, n_in, time) -> output (batch, n_out, time).

    Parameters, in flat-buffer order (DL4J's layout): ``W`` (n_in, 4 n_out), ``RW`` (n_out, 4 n_out),
    ``b`` (4 n_out). The 4 n_out columns are the gate blocks in DL4J's order [block input a, forget f,
    output o, input gate i]; per step ``z = x W + h_prev RW + b``, ``a = activation(z_a)``,
    ``f, o, i = gate_activation(z_f, z_o, z_i)``, ``c = f c_prev + i a``, ``h = o activation(c)``.
    The forget-gate bias starts at ``forget_gate_bias_init``. A masked time step outputs zero and the
    next step starts from a zero state (DL4J multiplies h and c by the mask).

    Args:
        n_out: hidden size.
        n_in: input size (inferred).
        activation: block input and cell output activation (tanh unless set; elementwise only).
        gate_activation: sigmoid unless set.
        forget_gate_bias_init: initial forget-gate bias, in [0, MAX_SCALE] (DL4J default 1.0).
        weight_init: as DenseLayer.
        l1: as DenseLayer.
        l2: as DenseLayer.
        dropout: retain probability, on the input; as DenseLayer.
        weight_decay: as DenseLayer.
        updater: as DenseLayer.
        gradient_normalization: the network's unless set; per param type treats W, RW and b
            separately.
        gradient_normalization_threshold: the network's unless set.
    """

    n_out: int
    n_in: int | None = None
    activation: Activation | str = Activation.TANH
    gate_activation: Activation | str = Activation.SIGMOID
    forget_gate_bias_init: float = 1.0
    weight_init: WeightInit | str | None = None
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        _gated_post_init(self)
        self.forget_gate_bias_init = check_non_negative(
            "forget_gate_bias_init", self.forget_gate_bias_init, MAX_SCALE
        )

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        # the forget gate's block of b starts at forget_gate_bias_init
        return _gated_specs(self, 4, fills=((self.n_out, 2 * self.n_out, self.forget_gate_bias_init),))


@dataclasses.dataclass
class GRU(_RecurrentCell):
    """DL4J's GRU (libnd4j's ``gru`` cell). Input (batch, n_in, time) -> output (batch, n_out, time).

    Parameters, in flat-buffer order: ``W`` (n_in, 3 n_out), ``RW`` (n_out, 3 n_out), ``b`` (3 n_out). The
    3 n_out columns are the gate blocks [reset r, update u, candidate c]; per step
    ``r = gate_activation(x W_r + h_prev RW_r + b_r)``, ``u`` likewise,
    ``c = activation(x W_c + (r h_prev) RW_c + b_c)`` (the reset gate acts before the recurrent product:
    the original GRU, Keras's ``reset_after=False``; PyTorch's nn.GRU applies it after) and
    ``h = u h_prev + (1 - u) c``. A masked time step outputs zero and the next step starts from a zero
    state (h is multiplied by the mask, as for the LSTM).

    Args:
        n_out: hidden size.
        n_in: input size (inferred).
        activation: the candidate's activation (tanh unless set; elementwise only).
        gate_activation: the reset and update gates' (sigmoid unless set; elementwise only).
        weight_init: as DenseLayer (fan-in and fan-out as the LSTM's).
        l1: as DenseLayer.
        l2: as DenseLayer.
        dropout: retain probability, on the input; as DenseLayer.
        weight_decay: as DenseLayer.
        updater: as DenseLayer.
        gradient_normalization: the network's unless set; per param type treats W, RW and b
            separately.
        gradient_normalization_threshold: the network's unless set.
    """

    n_out: int
    n_in: int | None = None
    activation: Activation | str = Activation.TANH
    gate_activation: Activation | str = Activation.SIGMOID
    weight_init: WeightInit | str | None = None
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        _gated_post_init(self)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return _gated_specs(self, 3)


@dataclasses.dataclass
class SimpleRnn(_RecurrentCell):
    """DL4J's SimpleRnn: ``h_t = activation(x_t W + h_{t-1} RW + b)``; a masked step outputs zero and the
    next step starts from a zero state. Parameters: ``W`` (n_in, n_out), ``RW`` (n_out, n_out), ``b``.

    Args: as :class:`DenseLayer` (``activation`` elementwise, inherited from the network when None).
    """

    n_out: int
    n_in: int | None = None
    activation: Activation | str | None = None
    weight_init: WeightInit | str | None = None
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self._common_post_init()
        if self.activation is not None:
            _check_elementwise("activation", self.activation)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        h, n_in = self.n_out, self._inferred_n_in()
        return [
            ParamSpec(WEIGHT, (n_in, h), WEIGHT, n_in, h),
            ParamSpec(RECURRENT_WEIGHT, (h, h), WEIGHT, h, h),
            ParamSpec(BIAS, (h,), BIAS),
        ]


_WRAPPED = (LSTM, GRU, SimpleRnn)


class _Wrapper(Layer):
    """Layers wrapping one recurrent layer: the per-layer settings are the wrapped layer's."""

    layer: Any

    def _check_wrapped(self) -> None:
        if not isinstance(self.layer, _WRAPPED):
            raise ValueError(f"layer: expected an LSTM, GRU or SimpleRnn configuration, got {self.layer!r}")

    @property
    def takes_sequences(self) -> bool:
        return True

    activation = property(lambda self: self.layer.activation)
    weight_init = property(lambda self: self.layer.weight_init)
    l1 = property(lambda self: self.layer.l1)
    l2 = property(lambda self: self.layer.l2)
    weight_decay = property(lambda self: self.layer.weight_decay)
    updater = property(lambda self: self.layer.updater)
    gradient_normalization = property(lambda self: self.layer.gradient_normalization)
    gradient_normalization_threshold = property(lambda self: self.layer.gradient_normalization_threshold)


class BidirectionalMode(enum.Enum):
    """How Bidirectional combines the two directions' outputs (DL4J's Bidirectional.Mode)."""

    CONCAT = "concat"
    ADD = "add"
    MUL = "mul"
    AVERAGE = "average"


@dataclasses.dataclass
class Bidirectional(_Wrapper):
    """Runs ``layer`` forward in time and a second copy backward in time, then combines the outputs.

    Parameters: the forward copy's with prefix ``f`` then the backward copy's with prefix ``b``
    (``fW, fRW, fb, bW, bRW, bb``: DL4J's layout). The backward copy sees the sequence and its mask
    reversed; with end padding its state therefore starts from zero at each sequence's last present step.

    Args:
        layer: an LSTM, GRU or SimpleRnn configuration.
        mode: concat (output size 2 n_out), add, mul or average.
    """

    layer: Any
    mode: BidirectionalMode | str = BidirectionalMode.CONCAT

    def __post_init__(self) -> None:
        self._check_wrapped()
        self.mode = coerce_enum(BidirectionalMode, self.mode, "mode")

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        inner, out = self.layer.infer(index, input_type)
        size = 2 * out.size if self.mode is BidirectionalMode.CONCAT else out.size
        return dataclasses.replace(self, layer=inner), InputType.recurrent(size, out.time_steps)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        inner = self.layer.param_specs(input_type)
        return [s._replace(name=prefix + s.name) for prefix in ("f", "b") for s in inner]


@dataclasses.dataclass
class LastTimeStep(_Wrapper):
    """The output of ``layer`` at the last present time step of each sequence: (batch, n_out).

    With a features mask the step is the last one whose mask is non-zero (an example with no present
    step gets the zero output of its masked step 0); without one it is the last step.

    Args:
        layer: an LSTM, GRU or SimpleRnn configuration (parameters exactly as the wrapped layer's).
    """

    layer: Any

    def __post_init__(self) -> None:
        self._check_wrapped()

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        inner, out = self.layer.infer(index, input_type)
        return dataclasses.replace(self, layer=inner), InputType.feed_forward(out.size)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return self.layer.param_specs(input_type)


@dataclasses.dataclass
class FrozenLayer(Layer):
    """``layer`` with its parameters frozen (DL4J's FrozenLayer; the TransferLearning builders wrap the
    feature extractor in it).

    A frozen layer's parameters never change: it has no updater (DL4J's NoOp), no l1, l2 or weight decay
    (and no penalty in the score) and no gradient normalization, and its entries of every update are
    exactly zero, so gradient sharing never encodes or sends them. As in DL4J it always runs in inference
    mode, in training too: no dropout, and batch normalization normalizes with its running statistics
    and leaves them as they are. It passes no gradient back to its input (DL4J's FrozenLayer), so the
    backward pass stops at the highest frozen layer; a layer with parameters below a frozen layer would
    never train, and the configuration refuses it (freeze it too). Parameters keep the wrapped layer's
    names, shapes and flat layout; every other setting reads through to the wrapped layer.

    Args:
        layer: any layer configuration but an output or loss layer (or another FrozenLayer).
    """

    layer: Any

    def __post_init__(self) -> None:
        if not isinstance(self.layer, Layer) or isinstance(self.layer, FrozenLayer) or self.layer.is_output:
            raise ValueError(
                f"layer: expected a layer configuration that is not an output layer or a FrozenLayer, got "
                f"{self.layer!r}"
            )

    def __getattr__(self, name: str) -> Any:
        # only for what the class does not define: the wrapped layer's fields (n_out, dropout, ...)
        if name == "layer" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.layer, name)

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        inner, out = self.layer.infer(index, input_type)
        return dataclasses.replace(self, layer=inner), out

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return self.layer.param_specs(input_type)

    flattens_input = property(lambda self: self.layer.flattens_input)
    takes_sequences = property(lambda self: self.layer.takes_sequences)
    recurrent_aware = property(lambda self: self.layer.recurrent_aware)
    takes_indices = property(lambda self: self.layer.takes_indices)
    batch_statistics = property(lambda self: False)  # inference mode: running statistics only
    # nothing trains it: no updater, regularization or gradient normalization
    updater = property(lambda self: _NO_UPDATE)
    l1 = l2 = weight_decay = property(lambda self: 0.0)
    gradient_normalization = property(lambda self: GradientNormalization.NONE)


class _Time1D(Layer):
    """Base of the 1-D layers over sequences (Convolution1DLayer, Subsampling1DLayer, Upsampling1D,
    ZeroPadding1DLayer): (batch, size, time) in, (batch, size', time') out, whole sequences and the
    features mask (see :mod:`sparkgrad.nn._recurrent`). The mask that leaves the layer has time' steps."""

    @property
    def takes_sequences(self) -> bool:
        return True

    def time_output(self, steps: int) -> int:
        """The number of output steps for ``steps`` input steps (< 1: the input is too short)."""
        raise NotImplementedError  # every 1-D layer overrides this

    @property
    def changes_steps(self) -> bool:
        """Whether the output has another number of steps than the input (for some input length)."""
        return any(self.time_output(t) != t for t in (1, 2, 3, 7, 16))

    def _out_size(self, input_type: InputType) -> int:
        return input_type.size

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_recurrent_input(index, self, input_type)
        if input_type.channels:
            raise layer_error(
                index, self, "input", f"needs a sequence of vectors, got {input_type.describe()}"
            )
        layer = _infer_n_in(index, self, input_type.size) if hasattr(self, "n_in") else self
        steps = input_type.time_steps
        if steps is not None and self.time_output(steps) < 1:
            raise layer_error(index, self, "kernel_size", f"does not fit {steps} time steps")
        out_steps = None if steps is None else self.time_output(steps)
        return layer, InputType.recurrent(layer._out_size(input_type), out_steps)


def _window_1d_post_init(layer: Any) -> None:
    layer.kernel_size = check_int("kernel_size", layer.kernel_size, minimum=1)
    layer.stride = check_int("stride", layer.stride, minimum=1)
    layer.padding = check_int("padding", layer.padding, minimum=0)
    layer.convolution_mode = coerce_enum(ConvolutionMode, layer.convolution_mode, "convolution_mode")


class _Window1D(_Time1D):
    """A 1-D window (convolution, pooling) run as its 2-D layer over a height-1 view: time is the width,
    (batch, size, time) the NCHW input (batch, size, 1, time), where the 2-D kernels' rows are contiguous
    (the parameters keep DL4J's layout, (n_out, n_in, kernel_size, 1): the same memory as (n_out, n_in,
    1, kernel_size))."""

    kernel_size: int
    stride: int
    padding: int
    convolution_mode: Any  # a ConvolutionMode once validated

    def time_output(self, steps: int) -> int:
        return conv_output_size(steps, self.kernel_size, self.stride, self.padding, self.convolution_mode)[0]

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if input_type.kind == "recurrent" and input_type.time_steps is not None:
            _check_strict(
                index, self, (input_type.time_steps,), (self.kernel_size,), (self.stride,), (self.padding,)
            )
        return super().infer(index, input_type)

    def as_2d(self) -> Layer:
        """The 2-D layer this layer runs as over the width-1 view."""
        raise NotImplementedError  # every windowed 1-D layer overrides this

    def _window_2d(self) -> dict[str, Any]:
        return {
            "kernel_size": (1, self.kernel_size),
            "stride": (1, self.stride),
            "padding": (0, self.padding),
            "convolution_mode": self.convolution_mode,
        }


@dataclasses.dataclass
class Convolution1DLayer(_Window1D):
    """DL4J's Convolution1DLayer: a convolution along time. Input (batch, n_in, time) -> output
    (batch, n_out, time'), time' as a ConvolutionLayer's height (truncate: ``(T + 2 padding - k) //
    stride + 1``; same: ``ceil(T / stride)``).

    Parameters: ``W`` (n_out, n_in, kernel_size, 1) (DL4J's layout) and ``b`` (n_out). It runs the 2-D
    convolution kernels over the sequence viewed as (batch, n_in, 1, time) images. With a features mask the
    mask is reduced as DL4J does (unchanged for same mode with stride 1, otherwise max-pooled with the
    layer's window: an output step is present when any step of its window is) and the output is multiplied
    by it; the reduced mask goes on to the next layer.

    Args:
        n_out: output channels.
        kernel_size: window length along time.
        stride: step along time.
        padding: zero steps added at both ends (truncate mode).
        convolution_mode: truncate or same.

    The other fields (activation, n_in, weight_init, has_bias, l1, l2, dropout, weight_decay, updater,
    gradient_normalization, gradient_normalization_threshold) are as ConvolutionLayer's.
    """

    n_out: int
    kernel_size: int = 3
    stride: int = 1
    padding: int = 0
    convolution_mode: ConvolutionMode | str = ConvolutionMode.TRUNCATE
    activation: Activation | str | None = None
    n_in: int | None = None
    weight_init: WeightInit | str | None = None
    has_bias: bool = True
    l1: float | None = None
    l2: float | None = None
    dropout: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self._common_post_init()
        _window_1d_post_init(self)

    def _out_size(self, input_type: InputType) -> int:
        return self.n_out

    def as_2d(self) -> Layer:
        return ConvolutionLayer(
            self.n_out, **self._window_2d(), activation=self.activation, n_in=self._inferred_n_in(),
            has_bias=self.has_bias, dropout=self.dropout,
        )  # fmt: skip

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        (w, *rest) = self.as_2d().param_specs(
            InputType.convolutional(1, self.kernel_size, self._inferred_n_in())
        )
        return [w._replace(shape=(self.n_out, self._inferred_n_in(), self.kernel_size, 1)), *rest]


@dataclasses.dataclass
class Subsampling1DLayer(_Window1D):
    """DL4J's Subsampling1DLayer: max or average pooling along time, (batch, size, time) -> (batch, size,
    time') with time' as Convolution1DLayer's. It runs the 2-D pooling kernels over the (batch, size, 1,
    time) view; masks as Convolution1DLayer's (the reduced mask multiplies the output and goes on)."""

    pooling_type: PoolingType | str = PoolingType.MAX
    kernel_size: int = 2
    stride: int = 2
    padding: int = 0
    convolution_mode: ConvolutionMode | str = ConvolutionMode.TRUNCATE

    def __post_init__(self) -> None:
        self.pooling_type = coerce_enum(PoolingType, self.pooling_type, "pooling_type")
        if self.pooling_type is PoolingType.SUM:
            raise ValueError("pooling_type: Subsampling1DLayer supports max and avg, got 'sum'")
        _window_1d_post_init(self)

    def as_2d(self) -> Layer:
        return SubsamplingLayer(self.pooling_type, **self._window_2d())


@dataclasses.dataclass
class Upsampling1D(_Time1D):
    """DL4J's Upsampling1D: every time step repeated ``size`` times, (batch, size', time) -> (batch, size',
    size * time). The features mask is repeated the same way (each output step is present when the step it
    repeats is); DL4J passes the mask on unchanged, which no longer matches the output's steps."""

    size: int = 2

    def __post_init__(self) -> None:
        self.size = check_int("size", self.size, minimum=1)

    def time_output(self, steps: int) -> int:
        return self.size * steps


@dataclasses.dataclass
class ZeroPadding1DLayer(_Time1D):
    """DL4J's ZeroPadding1DLayer: zero steps added before and after every sequence, (batch, size, time) ->
    (batch, size, left + time + right). ``padding``: an int (both ends) or (left, right). The added steps
    are absent in the features mask that goes on (DL4J passes the mask on unchanged, which no longer
    matches the output's steps)."""

    padding: tuple = (1, 1)

    def __post_init__(self) -> None:
        self.padding = _pair("padding", self.padding, 0)

    def time_output(self, steps: int) -> int:
        return self.padding[0] + steps + self.padding[1]


@dataclasses.dataclass
class RnnOutputLayer(OutputLayer):
    """OutputLayer applied at every time step of recurrent input: labels (batch, n_out, time), the loss of
    every present step (labels mask, else the features mask) summed and divided by the batch size."""

    @property
    def recurrent_aware(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_recurrent_input(index, self, input_type)
        layer, out = _dense_infer(self, index, InputType.feed_forward(input_type.size))
        return layer, InputType.recurrent(out.size, input_type.time_steps)


@dataclasses.dataclass
class RnnLossLayer(LossLayer):
    """LossLayer applied at every time step of recurrent input (per-step loss as RnnOutputLayer)."""

    @property
    def recurrent_aware(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_recurrent_input(index, self, input_type)
        return self, InputType.recurrent(input_type.size, input_type.time_steps)


# ---- embedding layers ------------------------------------------------------------------------------


class _Embedding(Layer):
    """Base of the embedding layers: a lookup table ``W`` (n_in, n_out) whose rows are the indices'
    vectors, plus an optional bias; the gradient touches only the looked-up rows."""

    n_in: int
    n_out: int
    has_bias: bool

    @property
    def takes_indices(self) -> bool:
        return True

    def _check_table(self) -> None:
        if self.n_in is None:
            raise ValueError("n_in: required (the number of rows of the table: indices are in [0, n_in))")
        for name in ("has_bias", "lazy_updates"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return _dense_specs(self.n_in, self.n_out, self.has_bias)


@dataclasses.dataclass
class EmbeddingLayer(_Embedding):
    """DL4J's EmbeddingLayer: input (batch, 1) of integer indices in [0, n_in), one per example; output
    (batch, n_out) = ``activation(W[index] + b)``. Equivalent to a DenseLayer on one-hot input, without
    the one-hot vectors. It must read the network's input (the first layer; a graph vertex reading a
    graph input); an index outside [0, n_in) is a ValueError naming the layer, the index and its
    position. Features may be integer arrays (kept exact) or floats holding integers.

    Parameters: ``W`` (n_in, n_out), initialised by ``weight_init`` with fan-in n_in and fan-out n_out
    (DL4J's), then ``b`` (n_out) when ``has_bias``.

    Args:
        n_in: the number of rows (the vocabulary size).
        n_out: the size of each row (the embedding size).
        activation: the network's unless set (DL4J's default is the network's too).
        weight_init: as DenseLayer.
        has_bias: whether the layer has a bias (DL4J's default: no).
        l1: as DenseLayer. l1, l2 and weight decay act on every row: the update is then dense.
        l2: as DenseLayer.
        weight_decay: as DenseLayer.
        updater: as DenseLayer. With Sgd or NoOp (stateless) a training step's cost follows the rows the
            batch touches, not the table's size; stateful updaters (Adam, ...) update every row as DL4J
            does, unless ``lazy_updates``.
        gradient_normalization: as DenseLayer.
        gradient_normalization_threshold: as DenseLayer.
        lazy_updates: a stateful updater steps only the rows the batch looked up, the other rows'
            state (Adam's moments, a velocity) frozen until their next lookup, bias corrections at the
            network's iteration (TensorFlow's LazyAdam, PyTorch's SparseAdam). NOT DL4J's semantics, which
            move every row every step; off by default. The table then trains row-sparsely under any
            updater (without l1, l2, weight decay and gradient normalization); with Sgd or NoOp it
            changes nothing.
    """

    n_in: int
    n_out: int
    activation: Activation | str | None = None
    weight_init: WeightInit | str | None = None
    has_bias: bool = False
    l1: float | None = None
    l2: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None
    lazy_updates: bool = False

    def __post_init__(self) -> None:
        self._check_table()
        self._common_post_init()

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if input_type.kind != "feed_forward" or input_type.size != 1:
            raise layer_error(
                index,
                self,
                "input",
                f"needs one index per example, feed_forward(1); got {input_type.describe()}",
            )
        return self, InputType.feed_forward(self.n_out)


@dataclasses.dataclass
class EmbeddingSequenceLayer(_Embedding):
    """DL4J's EmbeddingSequenceLayer: a sequence of indices per example, input (batch, 1, time) (DL4J's
    NCW layout; ``InputType.recurrent(1)`` or ``recurrent(1, time)``), output (batch, n_out, time) with
    ``activation(W[index] + b)`` at every step. With a features mask (batch, time) a masked step outputs
    zero and sends no gradient to the table (DL4J multiplies the output by the mask); its index is still
    checked, so pad with a valid index (0). Parameters, the first-layer rule and the arguments are
    :class:`EmbeddingLayer`'s.
    """

    n_in: int
    n_out: int
    activation: Activation | str | None = None
    weight_init: WeightInit | str | None = None
    has_bias: bool = False
    l1: float | None = None
    l2: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None
    lazy_updates: bool = False

    def __post_init__(self) -> None:
        self._check_table()
        self._common_post_init()

    @property
    def recurrent_aware(self) -> bool:
        return True  # runs at every step (the network's per-step path), its output a sequence

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        if input_type.kind != "recurrent" or input_type.size != 1 or input_type.channels:
            raise layer_error(
                index,
                self,
                "input",
                f"needs a sequence of indices, InputType.recurrent(1); got {input_type.describe()}",
            )
        return self, InputType.recurrent(self.n_out, input_type.time_steps)


# ---- attention layers ------------------------------------------------------------------------------
# DL4J's parameter names and layouts: the projections Wq, Wk, Wv (n_heads, head_size, n_in) and the output
# projection Wo (n_heads * head_size, n_out); LearnedSelfAttentionLayer's queries Q (n_in, n_queries).

ATTENTION_QUERY, ATTENTION_KEY, ATTENTION_VALUE, ATTENTION_OUT, LEARNED_QUERIES = "Wq", "Wk", "Wv", "Wo", "Q"


class _Attention(Layer):
    """Base of the attention layers: DL4J's multi-head dot-product attention over whole sequences."""

    n_out: int
    n_heads: int
    head_size: int | None
    project_input: bool
    n_in: int | None

    @property
    def takes_sequences(self) -> bool:
        return True

    def _attention_post_init(self) -> None:
        if not isinstance(self.project_input, bool):
            raise ValueError(f"project_input: expected a bool, got {self.project_input!r}")
        self.n_heads = check_int("n_heads", self.n_heads, minimum=1)
        if self.head_size is not None:
            self.head_size = check_int("head_size", self.head_size, minimum=1)
        self._common_post_init()
        if not self.project_input:
            if self.n_heads != 1:
                raise ValueError(f"n_heads: project_input=False needs n_heads 1 (DL4J), got {self.n_heads}")
            if self.head_size is not None:
                raise ValueError("head_size: only used with project_input=True")
        elif self.head_size is None and self.n_out % self.n_heads != 0:
            raise ValueError(
                f"head_size: n_out ({self.n_out}) is not a multiple of n_heads ({self.n_heads}); "
                "give head_size"
            )

    @property
    def projected_size(self) -> int:
        """The size of each head's queries, keys and values: ``head_size``, else n_out / n_heads (DL4J);
        without projection the input size."""
        if not self.project_input:
            return self._inferred_n_in()
        return self.head_size if self.head_size is not None else self.n_out // self.n_heads

    def _infer_attention(self, index: int, input_type: InputType) -> Any:
        _check_recurrent_input(index, self, input_type)
        if input_type.channels:
            raise layer_error(
                index, self, "input", f"needs a sequence of vectors, got {input_type.describe()}"
            )
        layer = _infer_n_in(index, self, input_type.size)
        if not self.project_input and layer.n_in != self.n_out:
            raise layer_error(
                index,
                self,
                "n_out",
                f"project_input=False needs n_out == n_in ({layer.n_in}), got {self.n_out}",
            )
        return layer

    def _projection_specs(self) -> list[ParamSpec]:
        if not self.project_input:
            return []
        n_in, h, d = self._inferred_n_in(), self.n_heads, self.projected_size
        return [
            *(
                ParamSpec(name, (h, d, n_in), WEIGHT, n_in, h * d)
                for name in (ATTENTION_QUERY, ATTENTION_KEY, ATTENTION_VALUE)
            ),
            ParamSpec(ATTENTION_OUT, (h * d, self.n_out), WEIGHT, h * d, self.n_out),
        ]


@dataclasses.dataclass
class SelfAttentionLayer(_Attention):
    """DL4J's SelfAttentionLayer: multi-head scaled dot-product self-attention over a sequence, input
    (batch, n_in, time) -> output (batch, n_out, time).

    With ``project_input`` every head ``j`` projects the input steps into queries, keys and values
    (``x Wq[j]^T``, ...: ``head_size`` each), each query step attends to every key step with the weights
    ``softmax(q k^T / sqrt(head_size))``, and the heads' outputs, concatenated in head order, go through
    ``Wo``. Without it (one head, n_out == n_in) the input itself is queries, keys and values, scaled by
    ``1 / sqrt(n_in)``. With a features mask a masked step gets no attention weight as a key and outputs
    zero as a query (and its mask goes on). There is no bias and no activation.

    Parameters (``project_input`` only): ``Wq``, ``Wk``, ``Wv`` (n_heads, head_size, n_in) and ``Wo``
    (n_heads * head_size, n_out), DL4J's layouts.

    Args:
        n_out: output size (n_in without projection).
        n_heads: number of heads (1 without projection).
        head_size: each head's size; n_out / n_heads unless set (DL4J).
        project_input: whether the input is projected (DL4J's default: true).
        n_in: input size (inferred).
        weight_init: as DenseLayer (fan-in n_in and fan-out n_heads * head_size for Wq, Wk, Wv).
        l1: as DenseLayer.
        l2: as DenseLayer.
        weight_decay: as DenseLayer.
        updater: as DenseLayer.
        gradient_normalization: as DenseLayer.
        gradient_normalization_threshold: as DenseLayer.
    """

    n_out: int
    n_heads: int = 1
    head_size: int | None = None
    project_input: bool = True
    n_in: int | None = None
    weight_init: WeightInit | str | None = None
    l1: float | None = None
    l2: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self._attention_post_init()

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        layer = self._infer_attention(index, input_type)
        return layer, InputType.recurrent(self.n_out, input_type.time_steps)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        return self._projection_specs()


@dataclasses.dataclass
class LearnedSelfAttentionLayer(_Attention):
    """DL4J's LearnedSelfAttentionLayer: ``n_queries`` learned queries attend to the input sequence, input
    (batch, n_in, time) -> output (batch, n_out, n_queries), a fixed-size summary of any length. Attention,
    projections and masks as :class:`SelfAttentionLayer`'s (masked steps get no weight); the output has no
    mask (DL4J: the mask is used up, as by global pooling).

    Parameters: ``Q`` (n_in, n_queries), then with ``project_input`` ``Wq``, ``Wk``, ``Wv`` and ``Wo`` as
    SelfAttentionLayer's.

    Args:
        n_out: output size (n_in without projection).
        n_queries: the number of learned queries (output time steps).
        n_heads: as SelfAttentionLayer.
        head_size: as SelfAttentionLayer.
        project_input: as SelfAttentionLayer.
        n_in: input size (inferred).
        weight_init: as DenseLayer (Q: fan-in n_in, fan-out n_queries).
        l1: as DenseLayer.
        l2: as DenseLayer.
        weight_decay: as DenseLayer.
        updater: as DenseLayer.
        gradient_normalization: as DenseLayer.
        gradient_normalization_threshold: as DenseLayer.
    """

    n_out: int
    n_queries: int
    n_heads: int = 1
    head_size: int | None = None
    project_input: bool = True
    n_in: int | None = None
    weight_init: WeightInit | str | None = None
    l1: float | None = None
    l2: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self.n_queries = check_int("n_queries", self.n_queries, minimum=1)
        self._attention_post_init()

    @property
    def changes_steps(self) -> bool:
        return True  # n_queries output steps for any input length

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        layer = self._infer_attention(index, input_type)
        return layer, InputType.recurrent(self.n_out, self.n_queries)

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        n_in = self._inferred_n_in()
        queries = ParamSpec(LEARNED_QUERIES, (n_in, self.n_queries), WEIGHT, n_in, self.n_queries)
        return [queries, *self._projection_specs()]


@dataclasses.dataclass
class PositionEmbeddingLayer(Layer):
    """A learned position embedding: adds a trainable table ``W`` (n_in, sequence_length) to every sequence,
    ``y[:, :, t] = x[:, :, t] + W[:, t]`` (input and output (batch, n_in, time), time <= sequence_length), so
    that attention, which is blind to the order of the steps, can tell them apart (BERT's and Keras-NLP's
    PositionEmbedding; DL4J has none). Masked steps output zero and send no gradient to the table. It needs
    the whole sequence (no rnn_time_step, no truncated BPTT).

    Args:
        sequence_length: the longest sequence (the table's columns).
        n_in: the number of features (inferred).
        weight_init: as DenseLayer (fan-in sequence_length, fan-out n_in).
        l1: as DenseLayer.
        l2: as DenseLayer.
        weight_decay: as DenseLayer.
        updater: as DenseLayer.
        gradient_normalization: as DenseLayer.
        gradient_normalization_threshold: as DenseLayer.
    """

    sequence_length: int
    n_in: int | None = None
    weight_init: WeightInit | str | None = None
    l1: float | None = None
    l2: float | None = None
    weight_decay: float | None = None
    updater: Updater | None = None
    gradient_normalization: GradientNormalization | str | None = None
    gradient_normalization_threshold: float | None = None

    def __post_init__(self) -> None:
        self.sequence_length = check_int("sequence_length", self.sequence_length, minimum=1)
        self._common_post_init()

    @property
    def takes_sequences(self) -> bool:
        return True

    def infer(self, index: int, input_type: InputType) -> tuple[Layer, InputType]:
        _check_recurrent_input(index, self, input_type)
        if input_type.channels:
            raise layer_error(
                index, self, "input", f"needs a sequence of vectors, got {input_type.describe()}"
            )
        steps = input_type.time_steps
        if steps is not None and steps > self.sequence_length:
            raise layer_error(
                index,
                self,
                "sequence_length",
                f"is {self.sequence_length} but the input has {steps} time steps",
            )
        return _infer_n_in(index, self, input_type.size), input_type

    def param_specs(self, input_type: InputType) -> list[ParamSpec]:
        n_in = self._inferred_n_in()
        return [ParamSpec(WEIGHT, (n_in, self.sequence_length), WEIGHT, self.sequence_length, n_in)]


__all__ = [
    "ActivationLayer",
    "BatchNormalization",
    "Bidirectional",
    "BidirectionalMode",
    "Convolution1DLayer",
    "ConvolutionLayer",
    "Cropping2D",
    "Deconvolution2D",
    "DenseLayer",
    "DropoutLayer",
    "EmbeddingLayer",
    "EmbeddingSequenceLayer",
    "FrozenLayer",
    "GRU",
    "GlobalPoolingLayer",
    "LSTM",
    "LastTimeStep",
    "Layer",
    "LayerNormalization",
    "LearnedSelfAttentionLayer",
    "LossLayer",
    "OutputLayer",
    "ParamSpec",
    "PositionEmbeddingLayer",
    "RnnLossLayer",
    "RnnOutputLayer",
    "SelfAttentionLayer",
    "SimpleRnn",
    "Subsampling1DLayer",
    "SubsamplingLayer",
    "Upsampling1D",
    "Upsampling2D",
    "ZeroPadding1DLayer",
    "ZeroPaddingLayer",
    "infer_layer",
]
