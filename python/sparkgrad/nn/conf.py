"""MultiLayerConfiguration: the layer stack plus network-wide defaults, validated on construction."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from sparkgrad._config import MAX_SCALE, Config, check_int, check_non_negative, check_positive, coerce_enum
from sparkgrad.nn.enums import Activation, GradientNormalization, WeightInit
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.layers import EmbeddingSequenceLayer, FrozenLayer, Layer, infer_layer, layer_error
from sparkgrad.nn.updaters import Sgd, Updater, check_updater

_DTYPES = ("float32", "float64")
PRECISIONS = ("float32", "bf16", "fp16")
# Per-layer settings that fall back to the network-wide value when a layer leaves them None.
INHERITED = (
    "activation",
    "weight_init",
    "l1",
    "l2",
    "weight_decay",
    "updater",
    "gradient_normalization",
    "gradient_normalization_threshold",
)


class BackpropType(enum.Enum):
    """Standard backpropagation, or truncated backpropagation through time (DL4J's BackpropType)."""

    STANDARD = "standard"
    TRUNCATED_BPTT = "truncated_bptt"


def check_network_defaults(conf: Any) -> None:
    """Validate (and coerce) the network-wide defaults every network configuration has:
    updater, seed, weight_init, activation, l1, l2, weight_decay, gradient_normalization (and its
    threshold), dtype and precision."""
    conf.weight_init = coerce_enum(WeightInit, conf.weight_init, "weight_init")
    conf.activation = coerce_enum(Activation, conf.activation, "activation")
    conf.gradient_normalization = coerce_enum(
        GradientNormalization, conf.gradient_normalization, "gradient_normalization"
    )
    for name in ("l1", "l2", "weight_decay"):
        setattr(conf, name, check_non_negative(name, getattr(conf, name), MAX_SCALE))
    conf.gradient_normalization_threshold = check_positive(
        "gradient_normalization_threshold", conf.gradient_normalization_threshold, MAX_SCALE
    )
    check_updater("updater", conf.updater)
    if conf.seed is not None:
        conf.seed = check_int("seed", conf.seed, minimum=0)
    if conf.dtype not in _DTYPES:
        raise ValueError(f"dtype: expected float32 or float64, got {conf.dtype!r}")
    if conf.precision not in PRECISIONS:
        raise ValueError(f"precision: expected 'float32', 'bf16' or 'fp16', got {conf.precision!r}")
    if conf.precision != "float32" and conf.dtype != "float32":
        raise ValueError(
            f"precision: {conf.precision!r} computes with float32 master weights and needs dtype float32, "
            f"got dtype {conf.dtype}"
        )


def check_backprop(conf: Any, sequences: bool, described: str, layers: Any = ()) -> None:
    """Validate (and coerce) backprop_type, tbptt_forward_length and tbptt_backward_length, the settings
    every network configuration has. ``sequences``: the network has the recurrent input and per-time-step
    output truncated BPTT needs; ``described``: its inputs and outputs, for the error; ``layers``: its
    layers (named, (name, layer) pairs), none of which may change the number of time steps under truncated
    BPTT (its segments cut features and labels at the same steps)."""
    conf.backprop_type = coerce_enum(BackpropType, conf.backprop_type, "backprop_type")
    conf.tbptt_forward_length = check_int("tbptt_forward_length", conf.tbptt_forward_length, minimum=1)
    conf.tbptt_backward_length = check_int(
        "tbptt_backward_length", conf.tbptt_backward_length, minimum=1, maximum=conf.tbptt_forward_length
    )
    if conf.backprop_type is BackpropType.TRUNCATED_BPTT and not sequences:
        raise ValueError(
            f"backprop_type: truncated_bptt needs recurrent input and per-time-step output, got {described}"
        )
    if conf.backprop_type is BackpropType.TRUNCATED_BPTT:
        for name, layer in layers:
            if getattr(layer, "changes_steps", False):
                raise ValueError(
                    f"backprop_type: truncated_bptt cuts features and labels at the same time steps, but "
                    f"{name} ({type(layer).__name__}) changes the number of steps"
                )


@dataclasses.dataclass
class MultiLayerConfiguration(Config):
    """A sequential network: layers in order, the input type and defaults for every layer.

    Args:
        layers: layer configurations; the last one must be an OutputLayer or LossLayer.
        input_type: shape of the input; lets ``n_in`` be inferred and convolutional layers be sized.
            Without it the first layer needs ``n_in`` and convolutional layers are not allowed.
        updater: default updater (layers may set their own).
        seed: seed of weight initialisation and dropout; None draws fresh entropy per network.
        weight_init: default for layers that leave it None.
        activation: default for layers that leave it None.
        l1: default for layers that leave it None; finite, in [0, MAX_SCALE].
        l2: default for layers that leave it None; finite, in [0, MAX_SCALE].
        weight_decay: default for layers that leave it None; finite, in [0, MAX_SCALE].
        dtype: "float32" or "float64" for parameters, gradients and activations.
        precision: "float32" (default), "bf16" or "fp16": mixed precision on a GPU, like PyTorch's
            autocast. The GPU's float32 GEMMs (dense layers, the im2col convolutions, LSTMs) run on the
            tensor cores with operands losing at most what bfloat16 / float16 loses (TF32, or operands
            rounded to 16 bits for large products) and accumulate in float32; every buffer (parameters
            as master weights, gradients, activations, updater state, the residual of threshold
            encoding) stays float32. "fp16" adds dynamic loss scaling (as PyTorch's
            GradScaler: ``MultiLayerNetwork.loss_scale``). Needs dtype float32. The CPU kernels compute
            in float32 whatever the setting: a network training on the CPU warns once and trains as
            "float32" (no loss scaling), as PyTorch's GradScaler does without CUDA, so one configuration
            serves GPU and CPU workers alike.
        backprop_type: "standard", or "truncated_bptt" (recurrent input and output): ``fit`` trains each
            minibatch as segments of ``tbptt_forward_length`` time steps, one update per segment, the
            recurrent state carried from segment to segment and gradients flowing back at most
            ``tbptt_backward_length`` (<= forward length) steps within a segment (DL4J defaults 20, 20).
        gradient_normalization: default for layers that leave it None: a
            :class:`~sparkgrad.nn.GradientNormalization` (or its string value) applied to each layer's
            raw gradient before l1/l2, the updater and weight decay (DL4J's); "none" by default.
        gradient_normalization_threshold: default for layers that leave it None: the bound of the clip
            modes (element value or L2 norm); finite, in (0, MAX_SCALE] (DL4J default 1.0).
    """

    layers: list
    input_type: InputType | None = None
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
    # Derived: the input type each layer sees (after flattening / reshaping), and the output type.
    layer_input_types: list = dataclasses.field(init=False, repr=False, compare=False)
    output_type: InputType = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_network_defaults(self)
        if self.input_type is not None and not isinstance(self.input_type, InputType):
            raise ValueError(f"input_type: expected an InputType, got {self.input_type!r}")
        if not isinstance(self.layers, (list, tuple)) or not self.layers:
            raise ValueError("layers: expected a non-empty list of layer configurations")
        self.layers = list(self.layers)
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, Layer):
                raise ValueError(f"layers[{i}]: expected a layer configuration, got {layer!r}")
            if layer.is_output and i != len(self.layers) - 1:
                raise layer_error(i, layer, "position", "an output layer must be the last layer")
            if layer.takes_indices and i != 0:
                raise layer_error(
                    i,
                    layer,
                    "position",
                    "an embedding layer reads the network's index input: it must be first",
                )
        if not self.layers[-1].is_output:
            raise layer_error(
                len(self.layers) - 1,
                self.layers[-1],
                "type",
                "the last layer must be an OutputLayer or LossLayer",
            )
        self._infer_types()
        self._check_frozen()
        check_backprop(
            self,
            self.is_recurrent and self.output_type.kind == "recurrent",
            f"{self.layer_input_types[0].describe()} -> {self.output_type.describe()}",
            [(f"layers[{i}]", layer) for i, layer in enumerate(self.layers)],
        )

    def _infer_types(self) -> None:
        current = self.input_type
        if current is None:
            first = self.layers[0]
            if isinstance(first.layer if isinstance(first, FrozenLayer) else first, EmbeddingSequenceLayer):
                raise layer_error(
                    0, first, "input", "needs input_type=InputType.recurrent(1) (index sequences)"
                )
            n_in = 1 if first.takes_indices else getattr(first, "n_in", None)
            if n_in is None:
                raise layer_error(0, first, "n_in", "required when the configuration has no input_type")
            current = InputType.feed_forward(n_in)
        elif current.kind == "convolutional_flat":  # the network reshapes flat rows to NCHW
            current = InputType.convolutional(current.height, current.width, current.channels)
        types = []
        for i, layer in enumerate(self.layers):
            types.append(current)
            self.layers[i], current = infer_layer(i, layer, current)
        self.layer_input_types = types
        self.output_type = current

    @property
    def trained_from(self) -> int:
        """The index of the lowest layer the backward pass reaches: one above the highest FrozenLayer
        (which passes no gradient back), else 0."""
        frozen = [i for i, layer in enumerate(self.layers) if isinstance(layer, FrozenLayer)]
        return frozen[-1] + 1 if frozen else 0

    def _check_frozen(self) -> None:
        """No layer with parameters below a FrozenLayer may be trainable: it would get no gradient."""
        top = self.trained_from - 1
        for i in range(top):
            layer = self.layers[i]
            if not isinstance(layer, FrozenLayer) and layer.param_specs(self.layer_input_types[i]):
                raise layer_error(
                    i,
                    layer,
                    "frozen",
                    f"has parameters but would get no gradient: the FrozenLayer layers[{top}] above it "
                    "passes none back (DL4J's FrozenLayer); freeze it too",
                )

    def setting(self, index: int, name: str) -> Any:
        """Effective value of an inheritable setting (``INHERITED``) for layer ``index``."""
        value = getattr(self.layers[index], name, None)
        return getattr(self, name) if value is None else value

    @property
    def is_recurrent(self) -> bool:
        """True when the input is a sequence and feed-forward layers run at every time step."""
        return self.input_type is not None and self.input_type.kind == "recurrent"


__all__ = ["BackpropType", "MultiLayerConfiguration"]
