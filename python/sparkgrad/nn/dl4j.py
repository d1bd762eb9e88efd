"""DL4J model import: the zips Deeplearning4j's ``ModelSerializer`` writes (``MultiLayerNetwork.save``,
``ModelSerializer.writeModel``), read into a :class:`MultiLayerNetwork` with DL4J's parameters, so a
network trained in DL4J predicts the same in sparkgrad and trains further here.

The zip (dl4j-reference.md 6.4): ``configuration.json`` (``MultiLayerConfiguration.toJson()``),
``coefficients.bin`` (``Nd4j.write`` of the flat parameter row vector) and, not read, ``updaterState.bin``
(a restored network starts with a fresh updater state, as DL4J's ``restoreMultiLayerNetwork(file,
false)``), ``normalizer.bin`` (a warning says it was not applied), ``preprocessor.bin`` and ``objects/``
entries. Every byte is checked as hostile input: the zip's directory and sizes as for sparkgrad's own
model files, the array record as :func:`sparkgrad.data.read_nd4j_array`, and the configuration field by
field: a damaged file raises :class:`~sparkgrad.errors.CorruptDataError` naming the file and member, a
configuration sparkgrad cannot reproduce :class:`Dl4jImportError` naming the layer and the field.

Layers (DL4J class -> sparkgrad), with their settings (activation, updater, l1/l2/weight decay, dropout,
gradient normalization, has-bias) carried over:

    DenseLayer          -> DenseLayer          W (n_in, n_out), b
    OutputLayer         -> OutputLayer         W, b; the loss function
    RnnOutputLayer      -> RnnOutputLayer      W, b; the loss function
    LSTM                -> LSTM                W (n_in, 4 n_out), RW (n_out, 4 n_out), b; DL4J's gate order
    Bidirectional(LSTM) -> Bidirectional(LSTM) the forward layer's parameters, then the backward one's
    GlobalPoolingLayer  -> GlobalPoolingLayer  max, avg or sum (no parameters)
    ActivationLayer     -> ActivationLayer     (no parameters)
    DropoutLayer        -> DropoutLayer        (no parameters)

DL4J lays each weight matrix out in column-major ('f') order inside the flat vector and sparkgrad in
row-major order; the layers' parameters otherwise follow the same order (sparkgrad's layers use
DL4J's layout), so the import reshapes each slice and checks that the slices use the vector exactly.
Anything else (other layers, GravesLSTM's peepholes, input preprocessors, schedules, bias
regularization or a separate bias updater, weight noise, constraints, layer normalization, loss
weights, half precision, and any field the import does not know unless it is null or empty) raises
:class:`Dl4jImportError` instead of importing a network that would compute something else.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from sparkgrad.data.nd4j import read_nd4j_array
from sparkgrad.errors import CorruptDataError

from . import layers as L
from . import updaters as U
from ._import import set_weights
from .conf import BackpropType, MultiLayerConfiguration
from .enums import Activation, GradientNormalization, LossFunction, PoolingType
from .input_type import InputType
from .network import MultiLayerNetwork
from .serialization import PathOrFile, ZipArchive

__all__ = ["Dl4jImportError", "restore_multi_layer_network"]

CONF_MEMBER = "configuration.json"
COEFF_MEMBER = "coefficients.bin"
NO_PARAMS_MEMBER = "noParams.marker"
NORMALIZER_MEMBER = "normalizer.bin"
_MAX_CONF_BYTES = 1 << 24
_MAX_COEFF_BYTES = 1 << 34  # 4 Gi float32 values: beyond anything a MultiLayerNetwork zip holds

_ACTIVATIONS = {
    "ActivationIdentity": Activation.IDENTITY,
    "ActivationReLU": Activation.RELU,
    "ActivationLReLU": Activation.LEAKYRELU,
    "ActivationELU": Activation.ELU,
    "ActivationTanH": Activation.TANH,
    "ActivationSigmoid": Activation.SIGMOID,
    "ActivationSoftmax": Activation.SOFTMAX,
    "ActivationSoftPlus": Activation.SOFTPLUS,
    "ActivationHardTanH": Activation.HARDTANH,
}
# fields an activation may carry, with the only values sparkgrad's activation computes
_ACTIVATION_FIELDS: dict[str, dict[str, tuple]] = {
    "ActivationReLU": {"max": (None, 0.0), "negativeSlope": (None, 0.0), "threshold": (None, 0.0)},
    "ActivationLReLU": {"alpha": (0.01,)},
    "ActivationELU": {"alpha": (1.0,)},
}
_LOSSES = {
    "LossMCXENT": LossFunction.MCXENT,
    "LossNegativeLogLikelihood": LossFunction.NEGATIVELOGLIKELIHOOD,
    "LossMSE": LossFunction.MSE,
    "LossL1": LossFunction.L1,
    "LossL2": LossFunction.L2,
    "LossBinaryXENT": LossFunction.XENT,
    "LossHinge": LossFunction.HINGE,
    "LossSquaredHinge": LossFunction.SQUARED_HINGE,
    "LossKLD": LossFunction.KL_DIVERGENCE,
}
# DL4J updater class -> (sparkgrad updater, {DL4J field: sparkgrad argument})
_UPDATERS: dict[str, tuple[type, dict[str, str]]] = {
    "Sgd": (U.Sgd, {"learningRate": "learning_rate"}),
    "Nesterovs": (U.Nesterovs, {"learningRate": "learning_rate", "momentum": "momentum"}),
    "RmsProp": (U.RmsProp, {"learningRate": "learning_rate", "rmsDecay": "rms_decay", "epsilon": "epsilon"}),
    "AdaGrad": (U.AdaGrad, {"learningRate": "learning_rate", "epsilon": "epsilon"}),
    "AdaDelta": (U.AdaDelta, {"rho": "rho", "epsilon": "epsilon"}),
    "NoOp": (U.NoOp, {}),
}
for _name, _cls in (("Adam", U.Adam), ("AdaMax", U.AdaMax), ("Nadam", U.Nadam), ("AMSGrad", U.AmsGrad)):
    _UPDATERS[_name] = (
        _cls,
        {"learningRate": "learning_rate", "beta1": "beta1", "beta2": "beta2", "epsilon": "epsilon"},
    )
_NORMALIZATIONS = {
    "None": GradientNormalization.NONE,
    "RenormalizeL2PerLayer": GradientNormalization.RENORMALIZE_L2_PER_LAYER,
    "RenormalizeL2PerParamType": GradientNormalization.RENORMALIZE_L2_PER_PARAM_TYPE,
    "ClipElementWiseAbsoluteValue": GradientNormalization.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE,
    "ClipL2PerLayer": GradientNormalization.CLIP_L2_PER_LAYER,
    "ClipL2PerParamType": GradientNormalization.CLIP_L2_PER_PARAM_TYPE,
}
_POOLING = {"MAX": PoolingType.MAX, "AVG": PoolingType.AVG, "SUM": PoolingType.SUM}
_BIDIRECTIONAL_MODES = {"CONCAT": "concat", "ADD": "add", "MUL": "mul", "AVERAGE": "average"}
_DATA_TYPES = {"FLOAT": "float32", "DOUBLE": "float64"}
_RECURRENT = ("LSTM", "Bidirectional")
# layer settings that must be absent (null, or an empty list) for the layer to compute as sparkgrad's
_ABSENT = ("biasUpdater", "weightNoise", "constraints", "regularizationBias")
# Every field the import knows, per object; any other field with a value (not null or empty) is refused,
# since sparkgrad cannot tell what it changes (an older DL4J's numeric "l2" on the layer, a newer option).
_INIT_ONLY = set(
    "@class layerName biasInit gainInit weightInitFn weightInitFnRecurrent helperAllowFallback".split()
)
_NO_PARAMS = {"idropout", "constraints", "gradientNormalization", "gradientNormalizationThreshold"}
_TRAINED = _NO_PARAMS | {"iupdater", "biasUpdater", "regularization", "regularizationBias", "weightNoise"}
_DENSE = _TRAINED | {"nin", "nout", "activationFn", "hasBias"}
_KNOWN_FIELDS = {
    "network": set(
        "backpropType cacheMode confs dataType epochCount inferenceWorkspaceMode inputPreProcessors "
        "iterationCount tbpttBackLength tbpttFwdLength trainingWorkspaceMode "
        "validateOutputLayerConfig".split()
    ),
    "layer conf": set(
        "cacheMode dataType epochCount iterationCount layer maxNumLineSearchIterations miniBatch minimize "
        "optimizationAlgo seed stepFunction variables".split()
    ),
    "DenseLayer": _DENSE | {"hasLayerNorm"},
    "OutputLayer": _DENSE | {"lossFn"},
    "RnnOutputLayer": _DENSE | {"lossFn", "rnnDataFormat"},
    "LSTM": _TRAINED | set("nin nout activationFn gateActivationFn forgetGateBiasInit rnnDataFormat".split()),
    "Bidirectional": _NO_PARAMS | {"fwd", "bwd", "mode", "nin", "nout"},
    "GlobalPoolingLayer": _NO_PARAMS | {"poolingType", "pnorm", "collapseDimensions", "poolingDimensions"},
    "ActivationLayer": _NO_PARAMS | {"activationFn"},
    # a FeedForwardLayer in DL4J, so it carries an activation and updater, which its dropout ignores
    "DropoutLayer": _DENSE,
}


class Dl4jImportError(ValueError):
    """A DL4J configuration sparkgrad cannot reproduce; the message names the layer and the field."""


def restore_multi_layer_network(source: PathOrFile, seed: int | None = None) -> MultiLayerNetwork:
    """Read a DL4J ``MultiLayerNetwork`` zip (DL4J's ``ModelSerializer.restoreMultiLayerNetwork``).

    Args:
        source: a path (a Hadoop URI such as ``hdfs://`` or ``s3a://`` is read through the active Spark
            session's FileSystem) or a readable, seekable binary file.
        seed: the seed of the imported network's dropout (and of nothing else: the parameters are
            DL4J's); None keeps the seed DL4J's configuration holds.

    Returns:
        An initialised :class:`MultiLayerNetwork` whose ``output`` equals DL4J's ``output`` on the same
        input (float32 rounding apart), with DL4J's iteration and epoch counts. Its gradient is DL4J's
        ``computeGradientAndScore`` gradient divided by the minibatch size: DL4J divides in its updater,
        sparkgrad in the loss.

    Raises:
        FileNotFoundError: the path does not exist.
        CorruptDataError: not a DL4J model zip, or damaged (names the file and the member).
        Dl4jImportError: a layer or setting sparkgrad does not reproduce (names the layer and field).
    """
    with ZipArchive(source, "a DL4J model zip", (CONF_MEMBER,), None) as archive:
        text = archive.read(CONF_MEMBER, _MAX_CONF_BYTES)
        try:
            conf = json.loads(text.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise CorruptDataError(f"{archive.name}: {CONF_MEMBER}: not JSON ({exc})") from exc
        if not isinstance(conf, dict):
            raise CorruptDataError(f"{archive.name}: {CONF_MEMBER}: expected a JSON object")
        if "vertices" in conf:
            raise Dl4jImportError(
                f"{archive.name}: holds a DL4J ComputationGraph; only MultiLayerNetwork zips are imported"
            )
        configuration, counters = _Translator(archive.name).network(conf, seed)
        where = f"{archive.name}: {COEFF_MEMBER}"
        if COEFF_MEMBER in archive:
            flat = read_nd4j_array(archive.read(COEFF_MEMBER, _MAX_COEFF_BYTES), where)
        elif NO_PARAMS_MEMBER in archive:
            flat = np.zeros(0, dtype=np.float32)
        else:
            raise CorruptDataError(f"{archive.name}: neither {COEFF_MEMBER} nor {NO_PARAMS_MEMBER}")
        # checked before the network allocates what its configuration claims
        expected = MultiLayerNetwork._configured_num_params(configuration)
        if flat.size != expected:
            raise CorruptDataError(f"{where}: {flat.size} parameters, the configuration has {expected}")
        net = MultiLayerNetwork(configuration)
        net.init()
        _set_params(net, flat, where)
        if NORMALIZER_MEMBER in archive:
            warnings.warn(
                f"{archive.name}: holds a DL4J normalizer ({NORMALIZER_MEMBER}); it is not read, so "
                "normalize the network's inputs as DL4J's normalizer did",
                stacklevel=2,
            )
    net.iteration_count, net.epoch_count = counters
    return net


def _set_params(net: MultiLayerNetwork, flat: np.ndarray, where: str) -> None:
    """Slice DL4J's flat vector along the network's layout, each matrix from column-major order."""
    if flat.dtype.kind != "f":
        raise CorruptDataError(f"{where}: holds {flat.dtype} values, not floating point")
    if flat.ndim > 2 or (flat.ndim == 2 and flat.shape[0] != 1):
        raise CorruptDataError(f"{where}: shape {flat.shape}, expected a row vector")
    flat = flat.ravel()
    if not np.isfinite(flat).all():
        raise CorruptDataError(f"{where}: element {int(np.flatnonzero(~np.isfinite(flat))[0])} is not finite")
    # the network's layout follows DL4J's order, so each parameter sits at the same offsets in both
    given = {
        key: {spec.name: flat[start:stop].reshape(spec.shape, order="F") for spec, start, stop in entries}
        for (key, _, _), entries in zip(net._units, net._layouts)
    }
    set_weights(net, given, "the DL4J zip", Dl4jImportError)


def _brief(value: Any) -> str:
    """A file's value in a message: its repr, cut short (a hostile file may hold megabytes there)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Translator:
    """DL4J configuration JSON -> sparkgrad configuration, refusing what sparkgrad would compute
    differently."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.where = file

    def fail(self, field: str, value: Any, why: str = "not supported") -> Dl4jImportError:
        return Dl4jImportError(f"{self.where}: {field} = {_brief(value)}: {why}")

    def get(self, obj: dict, field: str, kinds: type | tuple[type, ...], default: Any = ...) -> Any:
        """``obj[field]`` of one of ``kinds`` (a malformed file is CorruptDataError, not a KeyError)."""
        if field not in obj:
            if default is ...:
                raise CorruptDataError(f"{self.where}: {field} is missing")
            return default
        value = obj[field]
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise CorruptDataError(f"{self.where}: {field} = {_brief(value)} has the wrong type")
        return value

    def number(self, obj: dict, field: str, default: Any = ...) -> float:
        value = self.get(obj, field, (int, float), default)
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float's range
            number = float("inf")
        if not np.isfinite(number):
            raise CorruptDataError(f"{self.where}: {field} = {_brief(value)} is not a finite number")
        return number

    def size(self, obj: dict, field: str) -> int:
        value = self.get(obj, field, int)
        if not 0 < value < 1 << 31:
            raise CorruptDataError(f"{self.where}: {field} = {_brief(value)} is not a layer size")
        return int(value)

    def kind(self, obj: Any, field: str) -> str:
        """The short class name of a polymorphic JSON object ({"@class": "org....Name", ...})."""
        if not isinstance(obj, dict):
            raise CorruptDataError(f"{self.where}: {field} = {_brief(obj)} is not a DL4J object")
        return self.get(obj, "@class", str).rsplit(".", 1)[-1][:80]  # DL4J's names are far shorter

    # -- the network --------------------------------------------------------------------------------
    def known(self, obj: dict, kind: str) -> None:
        """Refuses a field with a value that ``kind``'s translation does not know."""
        for field, value in obj.items():
            if field not in _KNOWN_FIELDS[kind] and field not in _INIT_ONLY and value not in (None, [], {}):
                raise self.fail(field, value, "a field this import does not know: what it changes is unknown")

    def network(self, conf: dict, seed: int | None) -> tuple[MultiLayerConfiguration, tuple[int, int]]:
        self.known(conf, "network")
        confs = self.get(conf, "confs", list)
        if not confs:
            raise CorruptDataError(f"{self.file}: confs is empty")
        preprocessors = self.get(conf, "inputPreProcessors", dict, {})
        if preprocessors:
            index, pre = next(iter(preprocessors.items()))
            self.where = f"{self.file}: inputPreProcessors[{index}]"
            raise self.fail("@class", self.kind(pre, "preprocessor"), "input preprocessors are not imported")
        dtype = _DATA_TYPES.get(self.get(conf, "dataType", str, "FLOAT"))
        if dtype is None:
            raise self.fail("dataType", conf["dataType"], "sparkgrad computes in FLOAT or DOUBLE")
        layers = [self.layer(i, c) for i, c in enumerate(confs)]
        self.where = self.file
        first = self.get(confs[0], "layer", dict)
        input_type = None
        if self.kind(first, "layer") in _RECURRENT:
            input_type = InputType.recurrent(self.size(first, "nin"))
        backprop = self.get(conf, "backpropType", str, "Standard")
        if backprop not in ("Standard", "TruncatedBPTT"):
            raise self.fail("backpropType", backprop)
        network_seed = self.get(confs[0], "seed", int, None)
        with self.invalid_values():
            configuration = MultiLayerConfiguration(
                layers=layers,
                input_type=input_type,
                seed=network_seed if seed is None else seed,
                dtype=dtype,
                backprop_type=BackpropType.TRUNCATED_BPTT
                if backprop != "Standard"
                else BackpropType.STANDARD,
                tbptt_forward_length=self.get(conf, "tbpttFwdLength", int, 20),
                tbptt_backward_length=self.get(conf, "tbpttBackLength", int, 20),
            )
        iterations, epochs = (self.get(conf, key, int, 0) for key in ("iterationCount", "epochCount"))
        if not (0 <= iterations < 2**63 and 0 <= epochs < 2**63):
            raise CorruptDataError(f"{self.file}: iteration or epoch count {iterations, epochs} out of range")
        return configuration, (iterations, epochs)

    def layer(self, index: int, conf: Any) -> L.Layer:
        if not isinstance(conf, dict):
            raise CorruptDataError(f"{self.file}: confs[{index}] is not a JSON object")
        layer = self.get(conf, "layer", dict)
        kind = self.kind(layer, "layer")
        self.where = f"{self.file}: layer {index} ({_brief(layer.get('layerName'))}, {kind})"
        self.known(conf, "layer conf")
        for field, expected in (
            ("miniBatch", True),
            ("minimize", True),
            ("optimizationAlgo", "STOCHASTIC_GRADIENT_DESCENT"),
            ("stepFunction", None),
        ):
            if conf.get(field, expected) != expected:
                raise self.fail(field, conf[field])
        build = getattr(self, f"_{kind}", None)
        if build is None:
            raise self.fail("@class", layer["@class"], "this layer type is not imported")
        self.known(layer, kind)
        with self.invalid_values():
            return build(layer)

    @contextmanager
    def invalid_values(self) -> Iterator[None]:
        """A value sparkgrad's configuration rejects (a negative l2, sizes that do not chain) is damage:
        DL4J writes none."""
        try:
            yield
        except (Dl4jImportError, CorruptDataError):
            raise
        except ValueError as exc:
            raise CorruptDataError(f"{self.where}: {exc}") from exc

    def absent(self, layer: dict, fields: tuple[str, ...]) -> None:
        """Refuses any of ``fields`` set (not null or an empty list)."""
        for field in fields:
            if layer.get(field) not in (None, []):
                raise self.fail(field, layer[field])

    def parameter_free(self, layer: dict) -> None:
        """A layer without settings of its own: nothing that would change its output or gradient."""
        self.absent(layer, ("idropout", *_ABSENT))

    # -- settings every trained layer carries --------------------------------------------------------
    def common(self, layer: dict) -> dict[str, Any]:
        self.absent(layer, _ABSENT)
        if layer.get("hasLayerNorm"):
            raise self.fail("hasLayerNorm", True)
        settings: dict[str, Any] = {
            "updater": self.updater(self.get(layer, "iupdater", dict)),
            **self.regularization(self.get(layer, "regularization", list, [])),
            "dropout": self.dropout(layer.get("idropout")),
        }
        normalization = self.get(layer, "gradientNormalization", str, "None")
        if normalization not in _NORMALIZATIONS:
            raise self.fail("gradientNormalization", normalization)
        settings["gradient_normalization"] = _NORMALIZATIONS[normalization]
        if settings["gradient_normalization"] is not GradientNormalization.NONE:
            threshold = self.number(layer, "gradientNormalizationThreshold")
            settings["gradient_normalization_threshold"] = threshold
        return settings

    def activation(self, obj: Any, field: str) -> Activation:
        kind = self.kind(obj, field)
        if kind not in _ACTIVATIONS:
            raise self.fail(field, kind, "this activation is not imported")
        for name, allowed in _ACTIVATION_FIELDS.get(kind, {}).items():
            if obj.get(name) not in allowed:
                raise self.fail(f"{field}.{name}", obj.get(name), f"sparkgrad's {kind} needs {allowed[-1]}")
        return _ACTIVATIONS[kind]

    def updater(self, obj: dict) -> U.Updater:
        kind = self.kind(obj, "iupdater")
        if kind not in _UPDATERS:
            raise self.fail("iupdater", kind, "this updater is not imported")
        cls, fields = _UPDATERS[kind]
        for field, value in obj.items():
            if field.endswith("Schedule") and value is not None:
                raise self.fail(f"iupdater.{field}", self.kind(value, field), "schedules are not imported")
        return cls(**{arg: self.number(obj, field) for field, arg in fields.items() if field in obj})

    def regularization(self, items: list) -> dict[str, float]:
        out: dict[str, float] = {}
        for item in items:
            kind = self.kind(item, "regularization")
            field, arg = {"L1Regularization": ("l1", "l1"), "L2Regularization": ("l2", "l2")}.get(
                kind, ("coeff", "weight_decay")
            )
            if kind == "WeightDecay" and item.get("applyLR") is not True:
                raise self.fail("regularization.applyLR", item.get("applyLR"), "sparkgrad's decay has lr")
            if kind not in ("L1Regularization", "L2Regularization", "WeightDecay"):
                raise self.fail("regularization", kind)
            schedule = self.get(item, field, dict)
            if self.kind(schedule, field) != "FixedSchedule":
                raise self.fail(f"regularization.{field}", schedule["@class"], "schedules are not imported")
            out[arg] = self.number(schedule, "value")
        return out

    def dropout(self, obj: Any) -> float | None:
        if obj is None:
            return None
        kind = self.kind(obj, "idropout")
        if kind != "Dropout" or obj.get("pSchedule") is not None:
            raise self.fail("idropout", kind, "only a fixed Dropout is imported")
        return self.number(obj, "p")

    def loss(self, layer: dict) -> LossFunction:
        obj = self.get(layer, "lossFn", dict)
        kind = self.kind(obj, "lossFn")
        if kind not in _LOSSES:
            raise self.fail("lossFn", kind, "this loss function is not imported")
        if obj.get("weights") is not None:
            raise self.fail("lossFn.weights", obj["weights"], "weighted losses are not imported")
        return _LOSSES[kind]

    def dense_args(self, layer: dict) -> dict[str, Any]:
        return {
            "n_in": self.size(layer, "nin"),
            "n_out": self.size(layer, "nout"),
            "activation": self.activation(layer.get("activationFn"), "activationFn"),
            "has_bias": self.get(layer, "hasBias", bool, True),
            **self.common(layer),
        }

    # -- one method per DL4J layer class ---------------------------------------------------------
    def _DenseLayer(self, layer: dict) -> L.Layer:
        return L.DenseLayer(**self.dense_args(layer))

    def _OutputLayer(self, layer: dict) -> L.Layer:
        return L.OutputLayer(loss=self.loss(layer), **self.dense_args(layer))

    def _RnnOutputLayer(self, layer: dict) -> L.Layer:
        if layer.get("rnnDataFormat", "NCW") != "NCW":
            raise self.fail("rnnDataFormat", layer["rnnDataFormat"], "sparkgrad's sequences are NCW")
        return L.RnnOutputLayer(loss=self.loss(layer), **self.dense_args(layer))

    def _LSTM(self, layer: dict) -> L.Layer:
        if layer.get("rnnDataFormat", "NCW") != "NCW":
            raise self.fail("rnnDataFormat", layer["rnnDataFormat"], "sparkgrad's sequences are NCW")
        return L.LSTM(
            n_in=self.size(layer, "nin"),
            n_out=self.size(layer, "nout"),
            activation=self.activation(layer.get("activationFn"), "activationFn"),
            gate_activation=self.activation(layer.get("gateActivationFn"), "gateActivationFn"),
            forget_gate_bias_init=self.number(layer, "forgetGateBiasInit", 1.0),
            **self.common(layer),
        )

    def _Bidirectional(self, layer: dict) -> L.Layer:
        self.parameter_free(layer)
        forward, backward = self.get(layer, "fwd", dict), self.get(layer, "bwd", dict)
        if forward != backward:
            raise self.fail("bwd", "a different configuration", "sparkgrad's Bidirectional copies one layer")
        if self.kind(forward, "fwd") != "LSTM":
            raise self.fail("fwd", forward["@class"], "only a Bidirectional LSTM is imported")
        self.known(forward, "LSTM")
        mode = _BIDIRECTIONAL_MODES.get(self.get(layer, "mode", str, "CONCAT"))
        if mode is None:
            raise self.fail("mode", layer["mode"])
        return L.Bidirectional(self._LSTM(forward), mode=mode)

    def _GlobalPoolingLayer(self, layer: dict) -> L.Layer:
        self.parameter_free(layer)
        pooling = _POOLING.get(self.get(layer, "poolingType", str, "MAX"))
        if pooling is None:
            raise self.fail("poolingType", layer["poolingType"])
        if not self.get(layer, "collapseDimensions", bool, True):
            raise self.fail("collapseDimensions", False)
        if layer.get("poolingDimensions") is not None:
            raise self.fail("poolingDimensions", layer["poolingDimensions"], "sparkgrad pools time or space")
        return L.GlobalPoolingLayer(pooling_type=pooling)

    def _ActivationLayer(self, layer: dict) -> L.Layer:
        self.parameter_free(layer)
        return L.ActivationLayer(activation=self.activation(layer.get("activationFn"), "activationFn"))

    def _DropoutLayer(self, layer: dict) -> L.Layer:
        retain = self.dropout(layer.get("idropout"))
        return L.DropoutLayer(dropout=1.0 if retain is None else retain)  # none set: DL4J passes through
