"""ONNX model import: a model saved in the ONNX format (by ``torch.onnx.export``, tf2onnx, skl2onnx or any
other exporter) with its weights, into an initialised :class:`ComputationGraph`. Read with the ``onnx``
package (``pip install sparkgrad[onnx]``); no runtime is needed.

The subset is the one :mod:`sparkgrad.nn.keras` imports, in ONNX's operators: Gemm and MatMul (+ Add of
a bias), Conv (2-D, and 1-D over sequences), ConvTranspose, MaxPool, AveragePool, GlobalAveragePool,
GlobalMaxPool, ReduceMean/Max/Sum over time or space, BatchNormalization, LayerNormalization, the
activations, Flatten and Reshape to vectors, Pad, nearest Resize, Add/Sub/Mul/Max/Sum/Mean between
computed tensors, Concat along channels or features, Gather from a table by an integer input (an
embedding of one index or of a sequence of them), LSTM, GRU and RNN (forward or bidirectional, from a
zero state) and the Transposes, Squeezes, Reshapes and Gathers of the last step around them that
exporters write; Dropout and Identity pass their input on. Every node becomes at most one sparkgrad layer or
vertex named after it (its name, or its first output where it has none); an activation right after the
Gemm, MatMul or convolution it alone reads becomes that layer's activation. Anything else raises
:class:`OnnxImportError` naming the node and its operator or attribute.

Layout: ONNX's images are NCHW and 1-D convolutions read (N, C, L), which is sparkgrad's (and DL4J's)
layout for images and for sequences (batch, features, time): data goes in unchanged. Flattening orders
values (c, h, w) in both. Integer indices go in as (batch, 1), whether ONNX declares (batch,) or
(batch, 1), and a sequence of them (batch, time) as (batch, 1, time). A sequence input a recurrent
operator reads as (batch, time, features) (PyTorch's ``batch_first``) goes in as sparkgrad's (batch,
features, time): ``x.transpose(0, 2, 1)``.

ONNX carries no loss. Each graph output becomes trainable: from a Gemm/MatMul an :class:`OutputLayer`
(with its fused activation), from an activation node a :class:`LossLayer` with that activation, from
anything else a :class:`LossLayer` on the value (on a sequence, a per-step :class:`RnnOutputLayer` or
:class:`RnnLossLayer`, whose output comes back as (batch, features, time)); the loss is the one the
activation implies (softmax: MCXENT, sigmoid: XENT, otherwise MSE), so ``fit`` trains the imported
network further.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from . import layers as L
from ._import import set_weights
from .enums import Activation, ConvolutionMode, LossFunction, PoolingType
from .graph import ComputationGraph, ComputationGraphConfiguration
from .input_type import InputType
from .vertices import (
    CnnToFeedForwardPreProcessor,
    ElementWiseOp,
    ElementWiseVertex,
    GraphVertex,
    LastTimeStepVertex,
    MergeVertex,
    PreprocessorVertex,
)

__all__ = ["OnnxImportError", "import_onnx_model"]


class OnnxImportError(ValueError):
    """An ONNX model uses an operator or an attribute sparkgrad cannot import, or the file is not a valid
    ONNX model; the message names the node (or the file) and what does not map."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError("sparkgrad.nn.onnx needs the 'onnx' package: pip install sparkgrad[onnx]") from e
    return onnx


_ELEMENT_WISE = {
    "Add": ElementWiseOp.ADD,
    "Sum": ElementWiseOp.ADD,
    "Sub": ElementWiseOp.SUBTRACT,
    "Mul": ElementWiseOp.PRODUCT,
    "Mean": ElementWiseOp.AVERAGE,
    "Max": ElementWiseOp.MAX,
}
_ACTIVATIONS = {
    "Relu": Activation.RELU,
    "Sigmoid": Activation.SIGMOID,
    "Tanh": Activation.TANH,
    "Softmax": Activation.SOFTMAX,
    "Softplus": Activation.SOFTPLUS,
    "LeakyRelu": Activation.LEAKYRELU,
    "Elu": Activation.ELU,
    "Clip": Activation.HARDTANH,
}
# the one parameter sparkgrad's activation kernels take, as DL4J fixes it: ONNX's must match
_ALPHAS = {"LeakyRelu": 0.01, "Elu": 1.0}
_IMPLIED_LOSSES = {Activation.SOFTMAX: LossFunction.MCXENT, Activation.SIGMOID: LossFunction.XENT}
# the operators a node computing from constants only may have (shape arithmetic), and the largest constant
# it may make
_FOLDS = frozenset(
    ("Constant", "ConstantOfShape", "Concat", "Reshape", "Slice", "Transpose", "Cast", "Gather", "Unsqueeze",
     "Squeeze", "Add", "Sub", "Mul", "Div", "Neg", "Identity")
)  # fmt: skip
_FOLD_LIMIT = 1 << 24
# a Reshape's shape and a Pad's pads lie in [-_INT_LIMIT, _INT_LIMIT) (int32's range): sizes summed from
# them stay within int64
_INT_LIMIT = 1 << 31
# the largest whole factor a Resize may upsample an axis by: models upsample by 2 to 32; past 2**16 a
# factor only asks for absurd memory at run time
_UPSAMPLING_LIMIT = 1 << 16
# the batch size a Shape of a computed tensor reports: what is computed from it is batch dependent
_BATCH = 1
# recurrent operators: ONNX's gate blocks in sparkgrad's order (LSTM: ONNX i, o, f, c -> DL4J's c, f, o,
# i; GRU: z, r, h -> r, u, c), their default activations, and the sparkgrad layer
_RECURRENT = {
    "LSTM": ((3, 2, 1, 0), ("Sigmoid", "Tanh", "Tanh")),
    "GRU": ((1, 0, 2), ("Sigmoid", "Tanh")),
    "RNN": ((0,), ("Tanh",)),
}
_POOLS = {"ReduceMean": PoolingType.AVG, "ReduceMax": PoolingType.MAX, "ReduceSum": PoolingType.SUM}
# layers an activation right after them folds into
_FUSES = (L.DenseLayer, L.ConvolutionLayer, L.Deconvolution2D, L.Convolution1DLayer)


@dataclasses.dataclass
class _Value:
    """An ONNX tensor as the imported graph holds it: the vertex (or input) computing it and its ONNX shape
    without the batch axis ((C, H, W) images, (C, L) sequences, (F,) vectors). ``flat``: sparkgrad holds
    it as a vector although ONNX keeps unit axes (a global pooling's (C, 1, 1)); sparkgrad holds an
    ``indices`` input as (batch, 1) and a sequence of them as (batch, 1, time).

    ``order``: a sequence (sparkgrad holds every one as (batch, features, time)) whose ONNX axes are not
    (batch, channels, time), named by letters: n the batch, t time, c features, d a recurrent operator's
    directions (the features are then (d, c)); ``shape`` lists the other axes' sizes in that order."""

    vertex: str
    shape: tuple
    flat: bool = False
    indices: bool = False  # a model input of integer indices: only a Gather from a table reads it
    order: str = ""

    def letters(self) -> str:
        """Every ONNX axis, batch included, named (see ``order``): images nchw, vectors nc."""
        return self.order or {1: "nc", 2: "nct", 3: "nchw"}.get(len(self.shape), "")

    def sizes(self) -> dict[str, int]:
        return dict(zip(self.letters().replace("n", ""), self.shape))

    def onnx_shape(self, batch: int) -> list[int]:
        sizes = self.sizes()
        return [batch if a == "n" else sizes[a] for a in self.letters()]


@dataclasses.dataclass
class _Node:
    name: str
    item: L.Layer | GraphVertex
    heads: list[str]
    params: dict[str, np.ndarray]


def _axes(order: str) -> str:
    names = {"n": "batch", "t": "time", "c": "features", "d": "directions"}
    return "(" + ", ".join(names[a] for a in order) + ")"


def _describe(node: Any) -> str:
    return f"ONNX node {node.name or node.output[0]!r} ({node.op_type})"


def _shown(value: np.ndarray) -> str:
    """A constant in an error message: its element type, shape and first values."""
    return f"{value.dtype} of shape {value.shape}: {value.reshape(-1)[:8].tolist()}"


class _Converter:
    """Converts ONNX nodes, in the graph's (topological) order, into named sparkgrad layers and vertices."""

    def __init__(self, onnx: Any, graph: Any):
        self.onnx = onnx
        self.constants = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        self.values: dict[str, _Value] = {}
        self.nodes: list[_Node] = []
        self.index: dict[str, int] = {}  # vertex name -> position in nodes
        self.reads: Counter[str] = Counter(i for n in graph.node for i in n.input if i)
        self.reads.update(o.name for o in graph.output)
        self.inputs = {v.name for v in graph.input if v.name not in self.constants}
        self.batch_dependent: set[str] = set()  # constants computed from a Shape (see _Shape)
        self.batch: int | None = None  # the batch size every model input declares, if they do
        self.node: Any = None
        self.attrs: dict[str, Any] = {}

    # -- helpers ------------------------------------------------------------------------------------------
    def error(self, message: str) -> OnnxImportError:
        return OnnxImportError(f"{_describe(self.node)}: {message}")

    def fail(self, option: str, value: Any) -> OnnxImportError:
        return self.error(f"unsupported {option}={value!r}")

    def attr(self, name: str, default: Any) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def require(self, name: str, default: Any, allowed: tuple) -> Any:
        value = self.attr(name, default)
        value = tuple(value) if isinstance(value, list) else value
        if value not in allowed:
            raise self.fail(name, value)
        return value

    def constant(self, position: int, what: str) -> np.ndarray:
        name = self.node.input[position] if position < len(self.node.input) else ""
        if name not in self.constants:
            raise self.error(f"its {what} must be a constant (an initializer), got computed tensor {name!r}")
        return self.constants[name]

    def optional_constant(self, position: int, what: str) -> np.ndarray | None:
        if position >= len(self.node.input) or not self.node.input[position]:
            return None
        return self.constant(position, what)

    def ints(self, value: Any, what: str, limit: int = _INT_LIMIT) -> tuple[int, ...]:
        """A 1-D integer constant (or an attribute's ints) as Python ints, each in [-limit, limit)."""
        value = np.asarray(value)
        integers = value.ndim == 1 and (value.dtype.kind in "iu" or value.size == 0)  # asarray([]): float64
        ints = tuple(value.tolist()) if integers else ()
        if not integers or not all(-limit <= i < limit for i in ints):
            raise self.error(
                f"its {what} must be a 1-D tensor of integers in [{-limit}, {limit}), got {_shown(value)}"
            )
        return ints

    def floats(self, value: np.ndarray, what: str) -> tuple[float, ...]:
        """A 1-D floating-point constant as Python floats, each finite."""
        if value.ndim != 1 or value.dtype.kind != "f" or not np.isfinite(value).all():
            raise self.error(f"its {what} must be a 1-D tensor of finite floats, got {_shown(value)}")
        return tuple(value.tolist())

    def scalar(self, value: np.ndarray, what: str) -> float:
        """A one-element constant as a finite float."""
        if value.size != 1 or value.dtype.kind not in "iuf" or not np.isfinite(value).all():
            raise self.error(f"its {what} must be one finite number, got {_shown(value)}")
        return float(value.reshape(()))

    def input(self, position: int = 0, orders: tuple[str, ...] | None = ("",)) -> _Value:
        """The computed tensor the node reads at ``position``; a sequence must come in one of ``orders``
        (None: any)."""
        name = self.node.input[position]
        if name in self.constants:
            raise self.error(f"input {name!r} is a constant; only computed tensors are imported there")
        if name not in self.values:
            raise self.error(f"reads {name!r}, which no earlier node computes (or only as a second output)")
        value = self.values[name]
        if value.indices:
            raise self.error(f"reads the integer input {name!r}, which only a Gather from a table may")
        if orders is not None and value.order not in orders:
            wanted = " or ".join(_axes(o or "nct") for o in orders)
            raise self.error(f"reads a sequence with axes {_axes(value.order)}; it takes {wanted}")
        return value

    def add(
        self, item: L.Layer | GraphVertex, heads: list[str], params: dict | None = None, name: str = ""
    ) -> str:
        """Append a vertex named ``name`` (default: after the node) reading ``heads``; returns its name."""
        name = name or self.node.name or self.node.output[0]
        if name in self.index or name in self.inputs:
            name = f"{name}/{self.node.output[0] if self.node is not None else 'loss'}"
        self.index[name] = len(self.nodes)
        self.nodes.append(_Node(name, item, heads, params or {}))
        return name

    def produce(self, value: _Value, position: int = 0) -> None:
        if value.order in ("nct", "nc"):  # the orders sparkgrad holds sequences and vectors in
            value = dataclasses.replace(value, order="")
        self.values[self.node.output[position]] = value

    def pads(self, rank: int) -> tuple[int, ...]:
        """The node's pads, (begin..., end...) of its ``rank`` spatial axes, auto_pad NOTSET or VALID."""
        self.require("auto_pad", "NOTSET", ("NOTSET", "VALID"))
        if self.attr("auto_pad", "NOTSET") == "VALID":
            return (0,) * 2 * rank
        pads = tuple(int(p) for p in self.attr("pads", [0] * 2 * rank))
        if len(pads) != 2 * rank:
            raise self.fail("pads", pads)
        return pads

    def kernel_of(self, weight: np.ndarray) -> tuple[int, ...]:
        """A convolution's kernel shape: its weight's, which kernel_shape may only repeat."""
        kernel = tuple(int(k) for k in weight.shape[2:])
        if tuple(int(k) for k in self.attr("kernel_shape", kernel)) != kernel:
            raise self.fail(f"kernel_shape (the weight's is {kernel})", tuple(self.attr("kernel_shape", ())))
        return kernel

    def axes(self, rank: int) -> tuple[int, ...]:
        """The node's axes of a ``rank`` tensor: its second input (Squeeze from opset 13, the Reduce
        operators from 18) or, before, its attribute; none given: ()."""
        given = self.optional_constant(1, "axes")
        return self.ints(self.attr("axes", []) if given is None else given, "axes", limit=rank)

    def window(self, rank: int, kernel: tuple) -> tuple[tuple, tuple]:
        strides = tuple(int(s) for s in self.attr("strides", [1] * rank))
        if len(kernel) != rank or len(strides) != rank:
            raise self.fail("kernel_shape/strides", (kernel, strides))
        self.require("dilations", [1] * rank, ((1,) * rank,))
        return kernel, strides

    # -- conversion ---------------------------------------------------------------------------------------
    def convert(self, node: Any) -> None:
        self.node = node
        self.attrs = {a.name: self.onnx.helper.get_attribute_value(a) for a in node.attribute}
        if all(i in self.constants or not i for i in node.input):
            self.fold()
            return
        if node.op_type in _ACTIVATIONS:
            self.activation(_ACTIVATIONS[node.op_type])
            return
        if node.op_type in _ELEMENT_WISE:
            self.element_wise()
            return
        handler = getattr(self, "_" + node.op_type, None)
        if handler is None:
            raise OnnxImportError(f"{_describe(node)}: unsupported operator {node.op_type}")
        handler()

    def fold(self) -> None:
        """A node computing from constants only (exporters write the pads of a ZeroPad2d, a Reshape's
        shape, ... as such subgraphs): evaluated now by ONNX's reference implementation, its outputs become
        constants. Only shape arithmetic folds, and only into constants of at most _FOLD_LIMIT values."""
        if self.node.op_type not in _FOLDS:
            raise self.error("computes from constants only, which only shape arithmetic may")
        feeds = {i: self.constants[i] for i in self.node.input if i}
        if self.node.op_type == "ConstantOfShape":
            size = float(np.prod(feeds[self.node.input[0]].astype(np.float64)))
        elif self.node.op_type in ("Add", "Sub", "Mul", "Div"):
            try:
                shape = np.broadcast_shapes(*(v.shape for v in feeds.values()))
                size = float(np.prod(shape, dtype=np.float64))
            except ValueError as e:
                raise self.error(f"its constant operands do not broadcast: {e}") from e
        elif self.node.op_type == "Gather":
            data, indices = (feeds[i] for i in self.node.input[:2])
            axis = int(self.attr("axis", 0)) % max(data.ndim, 1)
            size = float(indices.size * (data.size // max(data.shape[axis], 1))) if data.ndim else 0.0
        else:  # no larger than the operands
            size = 0.0
        if size > _FOLD_LIMIT:
            raise self.error(f"would make a constant of {size:.0f} values (at most {_FOLD_LIMIT} fold)")
        from onnx.reference import ReferenceEvaluator

        try:
            results = ReferenceEvaluator(self.node).run(None, feeds)
        except Exception as e:  # the reference implementation's own complaint about these operands
            raise self.error(f"cannot be evaluated: {type(e).__name__}: {e}") from e
        for name, value in zip(self.node.output, results):
            self.constants[name] = np.asarray(value)
            if any(i in self.batch_dependent for i in self.node.input):
                self.batch_dependent.add(name)

    def activation(self, act: Activation) -> None:
        x, source = self.input(orders=None), self.node.input[0]
        op = self.node.op_type
        if op in _ALPHAS and not np.isclose(float(self.attr("alpha", _ALPHAS[op])), _ALPHAS[op]):
            raise self.fail("alpha (sparkgrad's is DL4J's fixed value)", self.attr("alpha", None))
        if op == "Clip":
            given = self.optional_constant(1, "min"), self.optional_constant(2, "max")
            low = self.attr("min", None) if given[0] is None else self.scalar(given[0], "min")
            high = self.attr("max", None) if given[1] is None else self.scalar(given[1], "max")
            if (low, high) != (-1.0, 1.0):
                raise self.fail("clip range (only [-1, 1], hard tanh)", (low, high))
        if op == "Softmax":  # over the features: of vectors, or at every step of a sequence
            letters = x.letters()
            axis = int(self.attr("axis", -1))
            if x.flat or len(letters) not in (2, 3) or "d" in letters:
                raise self.error(f"softmax over a {x.shape} tensor: sparkgrad's runs over features only")
            if not -len(letters) <= axis < len(letters) or letters[axis] != "c":
                raise self.fail("axis (the features')", axis)
        at = self.index.get(x.vertex)
        node = self.nodes[at] if at is not None else None
        if (
            node is not None
            and isinstance(node.item, _FUSES)
            and node.item.activation is Activation.IDENTITY
            and self.reads[source] == 1
        ):
            node.item = dataclasses.replace(node.item, activation=act)
            self.produce(x)
            return
        self.produce(dataclasses.replace(x, vertex=self.add(L.ActivationLayer(activation=act), [x.vertex])))

    def element_wise(self) -> None:
        op = self.node.op_type
        if op == "Add" and any(i in self.constants for i in self.node.input):
            self.bias_add()
            return
        inputs = [self.input(i, orders=None) for i in range(len(self.node.input))]
        if len(inputs) < 2 or (op == "Sub" and len(inputs) != 2):
            raise self.error(f"takes {len(inputs)} inputs")
        if any(
            (v.shape, v.flat, v.order) != (inputs[0].shape, inputs[0].flat, inputs[0].order) for v in inputs
        ):
            raise self.fail(
                "input shapes (ONNX broadcasts them, ElementWiseVertex does not)", [v.shape for v in inputs]
            )
        vertex = self.add(ElementWiseVertex(op=_ELEMENT_WISE[op]), [v.vertex for v in inputs])
        self.produce(dataclasses.replace(inputs[0], vertex=vertex))

    def bias_add(self) -> None:
        """Add(MatMul(x, W), b): the bias of the DenseLayer the MatMul became."""
        position = 1 if self.node.input[1] in self.constants else 0
        x, b = self.input(1 - position, orders=None), self.constants[self.node.input[position]]
        at = self.index.get(x.vertex)
        node = self.nodes[at] if at is not None else None
        if (
            node is None
            or not isinstance(node.item, L.DenseLayer)
            or node.item.has_bias
            or node.item.activation is not Activation.IDENTITY
            or self.reads[self.node.input[1 - position]] != 1
        ):
            raise self.error("adds a constant other than as the bias of the MatMul it alone reads")
        n_out = node.item.n_out
        if b.size != n_out:
            raise self.fail("bias shape", b.shape)
        node.item = dataclasses.replace(node.item, has_bias=True)
        node.params[L.BIAS] = b.reshape(n_out)
        self.produce(x)

    def vector(self) -> _Value:
        x = self.input()
        if len(x.shape) != 1 and not x.flat:
            raise self.error(f"reads a {x.shape} tensor: flatten it to vectors first")
        return x

    def dense(self, weight: np.ndarray, bias: np.ndarray | None, steps: bool = False) -> None:
        """A DenseLayer on vectors; with ``steps`` also at every step of a sequence whose last ONNX axis
        holds its features (MatMul of a (batch, time, features) tensor)."""
        x = self.input(orders=None) if steps else self.vector()
        sequence = "t" in x.order
        if steps and not sequence:
            x = self.vector()
        elif sequence and (not x.order.endswith("c") or "d" in x.order):
            raise self.error(f"multiplies a sequence with axes {_axes(x.order)}: its features must come last")
        n_in = x.sizes()["c"] if sequence else int(np.prod(x.shape))
        if weight.ndim != 2 or weight.shape[0] != n_in:
            raise self.error(f"weight shape {weight.shape} does not take {n_in} features")
        n_out = weight.shape[1]
        params = {L.WEIGHT: weight}
        if bias is not None:
            if bias.size != n_out:
                raise self.fail("bias shape", bias.shape)
            params[L.BIAS] = bias.reshape(n_out)
        layer = L.DenseLayer(n_out=n_out, activation=Activation.IDENTITY, has_bias=bias is not None)
        vertex = self.add(layer, [x.vertex], params)
        if sequence:
            sizes = x.sizes() | {"c": n_out}
            self.produce(_Value(vertex, tuple(sizes[a] for a in x.order if a != "n"), order=x.order))
        else:
            self.produce(_Value(vertex, (n_out,)))

    def _Gemm(self) -> None:
        self.require("transA", 0, (0,))
        weight = self.constant(1, "B (the weight)")
        weight = weight.T if self.attr("transB", 0) else weight
        bias = self.optional_constant(2, "C (the bias)")
        alpha, beta = float(self.attr("alpha", 1.0)), float(self.attr("beta", 1.0))
        self.dense(weight * alpha, None if bias is None else bias * beta)

    def _MatMul(self) -> None:
        self.dense(self.constant(1, "second operand (the weight)"), None, steps=True)

    def _Conv(self) -> None:
        x = self.input()
        weight = self.constant(1, "W")
        bias = self.optional_constant(2, "B")
        rank = weight.ndim - 2
        if rank not in (1, 2) or len(x.shape) != rank + 1 or x.flat:
            raise self.error(f"a {rank}-D convolution of a {x.shape} tensor")
        self.require("group", 1, (1,))
        kernel, strides = self.window(rank, self.kernel_of(weight))
        pads, mode = self.conv_pads(rank)
        params = {L.WEIGHT: weight if rank == 2 else weight[..., None]}
        if bias is not None:
            params[L.BIAS] = bias
        n_out = weight.shape[0]
        common = dict(
            n_out=n_out, activation=Activation.IDENTITY, has_bias=bias is not None, convolution_mode=mode
        )
        heads, shape = [x.vertex], self.spatial(x, kernel, strides, pads, n_out, mode)
        if rank == 2:
            if pads[0] != pads[2] or pads[1] != pads[3]:  # asymmetric: zero padding in front
                padding = L.ZeroPaddingLayer(padding=(pads[0], pads[2], pads[1], pads[3]))
                heads = [self.add(padding, heads, name=f"{self.node.name or self.node.output[0]}/pad")]
                pads = (0, 0, 0, 0)
            layer: L.Layer = L.ConvolutionLayer(
                kernel_size=kernel, stride=strides, padding=pads[:2], **common
            )
        else:
            if pads[0] != pads[1]:
                raise self.fail("pads (1-D: the same at both ends)", pads)
            layer = L.Convolution1DLayer(kernel_size=kernel[0], stride=strides[0], padding=pads[0], **common)
        self.produce(_Value(self.add(layer, heads, params), shape))

    def conv_pads(self, rank: int) -> tuple[tuple[int, ...], ConvolutionMode]:
        if self.attr("auto_pad", "NOTSET") == "SAME_UPPER":  # DL4J's same: the odd row at the bottom/right
            return (0,) * 2 * rank, ConvolutionMode.SAME
        return self.pads(rank), ConvolutionMode.TRUNCATE

    def spatial(
        self, x: _Value, kernel: tuple, strides: tuple, pads: tuple, channels: int, mode: ConvolutionMode
    ) -> tuple:
        rank, size = len(kernel), []
        for i, (n, k, s) in enumerate(zip(x.shape[1:], kernel, strides)):
            if mode is ConvolutionMode.SAME:
                size.append(-(-n // s))
            else:
                size.append((n + pads[i] + pads[i + rank] - k) // s + 1)
        if min(size) < 1:
            raise self.error(f"its window does not fit the {x.shape[1:]} input")
        return (channels, *size)

    def _ConvTranspose(self) -> None:
        x = self.input()
        weight = self.constant(1, "W")
        bias = self.optional_constant(2, "B")
        if weight.ndim != 4 or len(x.shape) != 3 or x.flat:
            raise self.error(f"a transposed convolution of a {x.shape} tensor: 2-D images only")
        self.require("group", 1, (1,))
        self.require("output_padding", [0, 0], ((0, 0),))
        if "output_shape" in self.attrs:
            raise self.fail("output_shape (give pads)", self.attrs["output_shape"])
        kernel = self.kernel_of(weight)
        strides = tuple(int(s) for s in self.attr("strides", [1, 1]))
        dilation = tuple(int(d) for d in self.attr("dilations", [1, 1]))
        pads = self.pads(2)
        if pads[0] != pads[2] or pads[1] != pads[3]:
            raise self.fail("pads (the same at both ends)", pads)
        n_out = weight.shape[1]
        layer = L.Deconvolution2D(
            n_out=n_out, kernel_size=kernel, stride=strides, padding=pads[:2], dilation=dilation,
            activation=Activation.IDENTITY, has_bias=bias is not None,
        )  # fmt: skip
        params = {L.WEIGHT: weight} | ({L.BIAS: bias} if bias is not None else {})
        size = [
            s * (n - 1) + (k - 1) * d + 1 - 2 * p
            for n, k, s, d, p in zip(x.shape[1:], kernel, strides, dilation, pads)
        ]
        self.produce(_Value(self.add(layer, [x.vertex], params), (n_out, *size)))

    def pool(self, kind: PoolingType) -> None:
        x = self.input()
        rank = len(x.shape) - 1
        if rank not in (1, 2) or x.flat:
            raise self.error(f"pools a {x.shape} tensor")
        self.require("ceil_mode", 0, (0,))
        self.require("storage_order", 0, (0,))
        kernel, strides = self.window(rank, tuple(int(k) for k in self.attr("kernel_shape", [])))
        pads = self.pads(rank)
        if any(p > 0 for p in pads) and kind is PoolingType.AVG:
            self.require("count_include_pad", 0, (0,))  # sparkgrad averages over the in-bounds values
        if pads[:rank] != pads[rank:]:
            raise self.fail("pads (the same at both ends)", pads)
        if rank == 2:
            layer: L.Layer = L.SubsamplingLayer(
                pooling_type=kind, kernel_size=kernel, stride=strides, padding=pads[:2]
            )
        else:
            layer = L.Subsampling1DLayer(
                pooling_type=kind, kernel_size=kernel[0], stride=strides[0], padding=pads[0]
            )
        shape = self.spatial(x, kernel, strides, pads, x.shape[0], ConvolutionMode.TRUNCATE)
        self.produce(_Value(self.add(layer, [x.vertex]), shape))

    def _MaxPool(self) -> None:
        self.pool(PoolingType.MAX)

    def _AveragePool(self) -> None:
        self.pool(PoolingType.AVG)

    def global_pool(self, kind: PoolingType) -> None:
        x = self.input()
        if len(x.shape) not in (2, 3) or x.flat:
            raise self.error(f"pools a {x.shape} tensor")
        vertex = self.add(L.GlobalPoolingLayer(pooling_type=kind), [x.vertex])
        self.produce(_Value(vertex, (x.shape[0],) + (1,) * (len(x.shape) - 1), flat=True))

    def _GlobalAveragePool(self) -> None:
        self.global_pool(PoolingType.AVG)

    def _GlobalMaxPool(self) -> None:
        self.global_pool(PoolingType.MAX)

    def _BatchNormalization(self) -> None:
        x = self.input()
        self.require("training_mode", 0, (0,))
        n = x.shape[0]  # channels of images and sequences, features of vectors
        gamma, beta, mean, var = (
            self.constant(i, what) for i, what in enumerate(("scale", "B", "mean", "var"), 1)
        )
        if any(v.shape != (n,) for v in (gamma, beta, mean, var)):
            raise self.fail("parameter shapes", [v.shape for v in (gamma, beta, mean, var)])
        layer = L.BatchNormalization(
            decay=float(self.attr("momentum", 0.9)), eps=float(self.attr("epsilon", 1e-5))
        )
        params = {L.GAMMA: gamma, L.BETA: beta, L.RUNNING_MEAN: mean, L.RUNNING_VAR: var}
        self.produce(dataclasses.replace(x, vertex=self.add(layer, [x.vertex], params)))

    def _LayerNormalization(self) -> None:
        x = self.vector()
        self.require("axis", -1, (-1, 1))
        self.require("stash_type", 1, (1,))
        gain, bias = self.constant(1, "Scale"), self.optional_constant(2, "B")
        layer = L.LayerNormalization(eps=float(self.attr("epsilon", 1e-5)), has_bias=bias is not None)
        params = {L.LAYER_NORM_GAIN: gain.reshape(-1)} | (
            {L.BIAS: bias.reshape(-1)} if bias is not None else {}
        )
        self.produce(dataclasses.replace(x, vertex=self.add(layer, [x.vertex], params)))

    def flatten(self) -> None:
        x = self.input()
        if len(x.shape) == 1 or x.flat:
            self.produce(_Value(x.vertex, (int(np.prod(x.shape)),)))
            return
        if len(x.shape) != 3:
            raise self.error(f"flattens a {x.shape} tensor (images or vectors only)")
        vertex = self.add(PreprocessorVertex(CnnToFeedForwardPreProcessor()), [x.vertex])
        self.produce(_Value(vertex, (int(np.prod(x.shape)),)))

    def _Flatten(self) -> None:
        self.require("axis", 1, (1,))
        self.flatten()

    def _Reshape(self) -> None:
        x, shape = self.input(orders=None), self.ints(self.constant(1, "shape"), "shape")
        batch = (0, -1, _BATCH) if self.node.input[1] in self.batch_dependent else (0, -1)
        if "d" in x.order:
            self.merge_directions(x, shape, batch)
            return
        size = int(np.prod(x.shape))
        if len(shape) != 2 or shape[1] not in (-1, size) or shape[0] not in batch or shape.count(-1) > 1:
            raise self.fail("shape (only (batch, features): a flatten)", shape)
        self.flatten()

    def merge_directions(self, x: _Value, shape: tuple[int, ...], batch: tuple) -> None:
        """Reshape of a recurrent output's adjacent (directions, features) axes into features: the
        directions' outputs side by side, as sparkgrad's Bidirectional concatenates them."""
        letters = x.letters()
        merged = letters.replace("dc", "c")
        if merged == letters or len(shape) != len(merged):
            raise self.fail("shape (of a recurrent output: only directions and features merged)", shape)
        sizes = x.sizes()
        sizes["c"] *= sizes["d"]
        expected = [sizes.get(a, 0) for a in merged]
        for i, (a, want) in enumerate(zip(merged, expected)):
            got = shape[i]
            ok = (
                got in batch
                if a == "n"
                else got in (want, -1) or (got == 0 and i < len(letters) and letters[i] == a)
            )
            if not ok:
                raise self.fail("shape (of a recurrent output: only directions and features merged)", shape)
        self.produce(_Value(x.vertex, tuple(sizes[a] for a in merged if a != "n"), order=merged))

    def _Gather(self) -> None:
        if self.node.input[0] in self.constants:
            self.lookup()
        else:
            self.select()

    def lookup(self) -> None:
        """Gather(table, indices) of a model input of integer indices: an EmbeddingLayer, or for a
        sequence of them an EmbeddingSequenceLayer."""
        table = self.constant(0, "data (the embedding table)")
        name = self.node.input[1]
        x = self.values.get(name)
        if x is None or not x.indices:
            raise self.error(f"gathers by {name!r}: only by a model input of integer indices (an embedding)")
        self.require("axis", 0, (0,))
        if table.ndim != 2:
            raise self.fail("table shape", table.shape)
        rows, size = table.shape
        if x.shape and x.shape[0] > 1:  # (batch, time) indices: (batch, time, size) vectors
            layer: L.Layer = L.EmbeddingSequenceLayer(n_in=rows, n_out=size, activation=Activation.IDENTITY)
            self.produce(
                _Value(self.add(layer, [x.vertex], {L.WEIGHT: table}), (x.shape[0], size), order="ntc")
            )
            return
        layer = L.EmbeddingLayer(n_in=rows, n_out=size, activation=Activation.IDENTITY)
        vertex = self.add(layer, [x.vertex], {L.WEIGHT: table})
        self.produce(_Value(vertex, (*x.shape, size), flat=bool(x.shape)))

    def select(self) -> None:
        """Gather of one index along an axis of a computed tensor: a sequence's last step (a
        LastTimeStepVertex) or the one direction of a recurrent operator's output."""
        x = self.input(orders=None)
        index = self.constant(1, "indices")
        letters = x.letters()
        axis = letters[int(self.attr("axis", 0)) % len(letters)]
        size = x.sizes().get(axis)
        if index.ndim != 0 or axis not in "td" or int(index) not in (-1, (size or 0) - 1):
            raise self.fail(
                f"selection (only the last step of a sequence), index {index.tolist()} of axis", axis
            )
        rest = letters.replace(axis, "")
        if axis == "d" and size == 1:
            self.produce(self.reordered(x, rest))
            return
        if axis == "d" or rest != "nc":
            raise self.error(f"selects along {_axes(axis)} of a sequence with axes {_axes(letters)}")
        self.produce(_Value(self.add(LastTimeStepVertex(), [x.vertex]), (x.sizes()["c"],)))

    def reordered(self, x: _Value, letters: str) -> _Value:
        """``x`` with ONNX axes ``letters`` (a subset or permutation of its own)."""
        sizes = x.sizes()
        return _Value(x.vertex, tuple(sizes[a] for a in letters if a != "n"), order=letters)

    def _Squeeze(self) -> None:
        """Squeeze of unit axes sparkgrad does not hold: a looked-up (1, E), a global pooling's (C, 1, 1), a
        one-directional recurrent operator's directions axis."""
        x = self.input(orders=None)
        axes = self.axes(len(x.shape) + 1)
        if x.order:
            letters = x.letters()
            dropped_letters = {letters[a % len(letters)] for a in axes}
            if dropped_letters != {"d"} or x.sizes()["d"] != 1:
                raise self.fail("axes (of a sequence: only a directions axis of size 1)", axes)
            self.produce(self.reordered(x, letters.replace("d", "")))
            return
        rank = len(x.shape) + 1
        dropped = {a % rank for a in axes} if axes else {i + 1 for i, n in enumerate(x.shape) if n == 1}
        if 0 in dropped or any(x.shape[a - 1] != 1 for a in dropped) or (dropped and not x.flat):
            raise self.fail("axes (only unit axes of a pooled or looked-up vector)", axes)
        shape = tuple(n for i, n in enumerate(x.shape) if i + 1 not in dropped)
        self.produce(_Value(x.vertex, shape, flat=len(shape) > 1))

    def _Transpose(self) -> None:
        """A permutation of a sequence's axes (sparkgrad holds it as it is; its ONNX axes move)."""
        x = self.input(orders=None)
        letters = x.letters()
        identity = list(range(len(letters)))
        perm = [int(p) for p in self.attr("perm", identity[::-1])]
        if sorted(perm) != identity:
            raise self.fail("perm", tuple(perm))
        if perm == identity:
            self.produce(x)
            return
        if "t" not in letters or x.flat:
            raise self.error(f"permutes the axes of a {x.shape} tensor: only a sequence's axes may move")
        self.produce(self.reordered(x, "".join(letters[p] for p in perm)))

    def _Shape(self) -> None:
        """The ONNX shape of a computed tensor, its batch size reported as _BATCH: the constants computed
        from it are batch dependent (a recurrent operator's zero initial state, a Reshape's target)."""
        x = self.input(orders=None)
        start, end = int(self.attr("start", 0)), self.attr("end", None)
        shape = np.array(x.onnx_shape(_BATCH), np.int64)[start : None if end is None else int(end)]
        self.constants[self.node.output[0]] = shape
        self.batch_dependent.add(self.node.output[0])

    def recurrent(self) -> None:
        """LSTM, GRU and RNN: sparkgrad's LSTM, GRU and SimpleRnn (in a Bidirectional for both
        directions), from a zero state, reading the whole sequence."""
        op = self.node.op_type
        blocks, defaults = _RECURRENT[op]
        layout = self.require("layout", 0, (0, 1))
        x = self.input(orders=("ntc",) if layout else ("tnc",))
        direction = self.require("direction", "forward", ("forward", "bidirectional"))
        dirs = 2 if direction == "bidirectional" else 1
        for option in ("clip", "activation_alpha", "activation_beta"):
            if option in self.attrs:
                raise self.fail(option, self.attrs[option])
        if op == "LSTM":
            self.require("input_forget", 0, (0,))
        if op == "GRU":
            if int(self.attr("linear_before_reset", 0)):  # PyTorch's nn.GRU exports 1
                raise self.fail(
                    "linear_before_reset (sparkgrad's GRU resets before the recurrent product)", 1
                )
        given_names = self.attrs.get("activations")
        names = [a.decode() for a in given_names] if given_names else list(defaults) * dirs
        per = len(defaults)
        if len(names) != per * dirs or names[per:] not in ([], names[:per]):
            raise self.fail("activations (the same for both directions)", names)
        names = names[:per]
        elementwise = {a for a in _ACTIVATIONS if a not in _ALPHAS and a != "Softmax"}
        if any(a not in elementwise for a in names) or (op == "LSTM" and names[1] != names[2]):
            raise self.fail("activations", names)
        w, r = self.constant(1, "W"), self.constant(2, "R")
        bias = self.optional_constant(3, "B")
        if r.ndim != 3:
            raise self.fail("R shape", r.shape)
        hidden, gates = r.shape[-1], len(blocks)
        if "hidden_size" in self.attrs and int(self.attrs["hidden_size"]) != hidden:
            raise self.fail(f"hidden_size (R's is {hidden})", self.attrs["hidden_size"])
        features = x.sizes()["c"]
        if w.shape != (dirs, gates * hidden, features) or r.shape != (dirs, gates * hidden, hidden):
            raise self.fail("W/R shapes", (w.shape, r.shape))
        if bias is None:
            bias = np.zeros((dirs, 2 * gates * hidden), w.dtype)
        if bias.shape != (dirs, 2 * gates * hidden):
            raise self.fail("B shape", bias.shape)
        if len(self.node.input) > 4 and self.node.input[4]:
            raise self.error(
                "has sequence_lens (mask the sequences instead: sparkgrad takes a features mask)"
            )
        for position in range(5, len(self.node.input)):
            state = self.optional_constant(position, "initial state or peepholes")
            if state is not None and np.any(state):
                raise self.fail("initial state or peepholes (only zeros)", self.node.input[position])

        def gated(m: np.ndarray) -> np.ndarray:  # ONNX's gate blocks (rows) to sparkgrad's (columns)
            return np.concatenate([m[k * hidden : (k + 1) * hidden] for k in blocks]).T

        params = []
        for d in range(dirs):
            b = bias[d, : gates * hidden] + bias[d, gates * hidden :]
            params.append(
                {L.WEIGHT: gated(w[d]), L.RECURRENT_WEIGHT: gated(r[d]), L.BIAS: gated(b[:, None])[0]}
            )
        act, gate = _ACTIVATIONS[names[-1]], _ACTIVATIONS[names[0]]
        if op == "RNN":
            cell: L.Layer = L.SimpleRnn(n_out=hidden, activation=_ACTIVATIONS[names[0]])
        elif op == "LSTM":
            cell = L.LSTM(n_out=hidden, activation=act, gate_activation=gate)
        else:
            cell = L.GRU(n_out=hidden, activation=act, gate_activation=gate)
        if dirs == 2:
            layer: L.Layer = L.Bidirectional(layer=cell)
            given = {f"{p}{k}": v for p, ps in zip("fb", params) for k, v in ps.items()}
        else:
            layer, given = cell, params[0]
        vertex = self.add(layer, [x.vertex], given)
        steps = x.sizes()["t"]
        self.produce(_Value(vertex, (steps, dirs, hidden), order="ntdc" if layout else "tdnc"))
        if len(self.node.output) > 1 and self.reads[self.node.output[1]]:  # Y_h: the last step's output
            if dirs != 1:
                raise self.error("its final state is read: of both directions, which is not imported")
            last = self.add(LastTimeStepVertex(), [vertex], name=f"{vertex}/last")
            self.produce(_Value(last, (1, hidden), order="ndc" if layout else "dnc"), position=1)
        if len(self.node.output) > 2 and self.reads[self.node.output[2]]:
            raise self.error("its final cell state is read, which is not imported")

    def _LSTM(self) -> None:
        self.recurrent()

    def _GRU(self) -> None:
        self.recurrent()

    def _RNN(self) -> None:
        self.recurrent()

    def reduce(self, kind: PoolingType) -> None:
        """A mean, max or sum over a sequence's time axis or an image's spatial axes: global pooling."""
        x = self.input(orders=None)
        letters = x.letters()
        axes = self.axes(len(x.shape) + 1)
        reduced = {letters[a % len(letters)] for a in axes}
        if x.flat or not (
            reduced == {"t"} and "d" not in letters or reduced == {"h", "w"} and letters == "nchw"
        ):
            raise self.fail("axes (only the time axis of a sequence or the spatial axes of images)", axes)
        vertex = self.add(L.GlobalPoolingLayer(pooling_type=kind), [x.vertex])
        channels = x.sizes()["c"]
        if not int(self.attr("keepdims", 1)):
            if "".join(a for a in letters if a not in reduced) != "nc":
                raise self.fail("axes (the pooled tensor's axes are then (batch, features))", axes)
            self.produce(_Value(vertex, (channels,)))
            return
        kept = "".join("1" if a in reduced else a for a in letters)
        if not kept.startswith("n"):
            raise self.fail("axes (the pooled tensor's batch axis comes first)", axes)
        self.produce(_Value(vertex, tuple(1 if a == "1" else channels for a in kept[1:]), flat=True))

    def _ReduceMean(self) -> None:
        self.reduce(PoolingType.AVG)

    def _ReduceMax(self) -> None:
        self.reduce(PoolingType.MAX)

    def _ReduceSum(self) -> None:
        self.reduce(PoolingType.SUM)

    def _Dropout(self) -> None:
        self.produce(self.input(orders=None))

    def _Identity(self) -> None:
        self.produce(self.input(orders=None))

    def _Pad(self) -> None:
        x = self.input()
        self.require("mode", "constant", ("constant",))
        given = self.attr("pads", None)
        pads = self.ints(self.constant(1, "pads") if given is None else given, "pads")
        if min(pads, default=0) < 0:
            raise self.error(f"its pads must be >= 0 (negative pads crop, which is not imported), got {pads}")
        value = self.optional_constant(2, "constant_value")
        fill = 0.0 if value is None else self.scalar(value, "constant_value")
        if fill != 0.0 or float(self.attr("value", 0.0)) != 0.0:
            raise self.fail("constant_value (zero padding only)", value)
        if len(pads) != 2 * (len(x.shape) + 1) or x.flat or len(x.shape) not in (2, 3):
            raise self.fail("pads", pads)
        rank = len(x.shape) + 1
        begin, end = pads[:rank], pads[rank:]
        if begin[:2] != (0, 0) or end[:2] != (0, 0):
            raise self.fail("pads (of the spatial axes only)", pads)
        if rank == 4:
            layer: L.Layer = L.ZeroPaddingLayer(padding=(begin[2], end[2], begin[3], end[3]))
        else:
            layer = L.ZeroPadding1DLayer(padding=(begin[2], end[2]))
        shape = (x.shape[0], *(n + b + e for n, b, e in zip(x.shape[1:], begin[2:], end[2:])))
        self.produce(_Value(self.add(layer, [x.vertex]), shape))

    def _Resize(self) -> None:
        x = self.input()
        if len(x.shape) != 3 or x.flat:
            raise self.error(f"resizes a {x.shape} tensor (images only)")
        self.require("mode", "nearest", ("nearest",))
        # modes under which an integer scale repeats every pixel (half_pixel keeps every source position
        # strictly inside a pixel, so its rounding never ties)
        repeats = {
            "asymmetric": ("floor", "round_prefer_floor"),
            "half_pixel": None,
            "pytorch_half_pixel": None,
        }
        transform = self.require("coordinate_transformation_mode", "half_pixel", tuple(repeats))
        modes = repeats[transform]
        if modes is not None:
            self.require("nearest_mode", "round_prefer_floor", modes)
        scales, sizes = self.optional_constant(2, "scales"), self.optional_constant(3, "sizes")
        if scales is not None and scales.size:
            what, given = "scales", self.floats(scales, "scales")
            factors = given
        elif sizes is not None and sizes.size:
            what, given = "sizes", self.ints(sizes, "sizes")
            factors = (1.0, *(s / n for s, n in zip(given[1:], x.shape)))
        else:
            raise self.error("has neither scales nor sizes")
        whole = all(f.is_integer() and 1 <= f <= _UPSAMPLING_LIMIT for f in factors[2:])
        if len(factors) != 4 or factors[:2] != (1.0, 1.0) or not whole:
            raise self.fail(f"{what} (whole factors in [1, {_UPSAMPLING_LIMIT}] of the spatial axes)", given)
        if what == "sizes" and self.node.input[3] not in self.batch_dependent and given[0] != self.batch:
            # ONNX resizes the batch axis to sizes[0] too; sparkgrad's batch is the data's
            inputs = "free" if self.batch is None else self.batch
            raise self.error(
                f"its sizes fix the batch at {given[0]}, the inputs' is {inputs} (ONNX resizes the batch "
                "too): compute sizes from the input's Shape, or give scales"
            )
        rows, cols = int(factors[2]), int(factors[3])
        vertex = self.add(L.Upsampling2D(size=(rows, cols)), [x.vertex])
        self.produce(_Value(vertex, (x.shape[0], x.shape[1] * rows, x.shape[2] * cols)))

    def _Concat(self) -> None:
        inputs = [self.input(i) for i in range(len(self.node.input))]
        rank = len(inputs[0].shape) + 1
        axis = int(self.attr("axis", 1))
        if axis % rank != 1:
            raise self.fail("axis (only 1, the channels/features axis, maps to MergeVertex)", axis)
        if any(v.shape[1:] != inputs[0].shape[1:] or v.flat != inputs[0].flat for v in inputs):
            raise self.fail("input shapes", [v.shape for v in inputs])
        vertex = self.add(MergeVertex(), [v.vertex for v in inputs])
        channels = sum(v.shape[0] for v in inputs)
        self.produce(_Value(vertex, (channels, *inputs[0].shape[1:]), inputs[0].flat))

    # -- outputs ------------------------------------------------------------------------------------------
    def output(self, name: str) -> str:
        """Make the value of graph output ``name`` trainable; returns the vertex that outputs it."""
        x = self.values[name]
        at = self.index.get(x.vertex)
        node = self.nodes[at] if at is not None else None
        fed = sum(x.vertex in n.heads for n in self.nodes)
        steps = "t" in x.letters()  # a sequence: a loss at every step
        if node is not None and not fed and isinstance(node.item, L.DenseLayer):
            dense = node.item
            act = Activation(dense.activation)
            loss = _IMPLIED_LOSSES.get(act, LossFunction.MSE)
            output = L.RnnOutputLayer if steps else L.OutputLayer
            node.item = output(n_out=dense.n_out, activation=act, loss=loss, has_bias=dense.has_bias)
            return node.name
        losses = L.RnnLossLayer if steps else L.LossLayer
        if node is not None and not fed and isinstance(node.item, L.ActivationLayer):
            act = Activation(node.item.activation)
            node.item = losses(activation=act, loss=_IMPLIED_LOSSES.get(act, LossFunction.MSE))
            return node.name
        self.node = None
        return self.add(losses(activation=Activation.IDENTITY, loss=LossFunction.MSE), [x.vertex], name=name)


def _input_type(name: str, shape: tuple) -> InputType:
    if len(shape) == 1:
        return InputType.feed_forward(shape[0])
    if len(shape) == 2:
        return InputType.recurrent(shape[0], shape[1])
    if len(shape) == 3:
        return InputType.convolutional(shape[1], shape[2], shape[0])
    raise OnnxImportError(f"ONNX input {name!r}: shape (batch, {shape}) has an unsupported rank")


_INDEX_TYPES = ("INT64", "INT32")


def _declared_batch(value: Any) -> int | None:
    """The batch size a model input declares (its first axis), None where it is free."""
    batch = value.type.tensor_type.shape.dim[0]  # _input checked there is one
    return int(batch.dim_value) if batch.HasField("dim_value") else None


def _input(value: Any, batch_first: bool) -> tuple[_Value, InputType]:
    """A model input: its value and its input type. Float tensors of rank 2-4, a rank-3 one read as
    (batch, time, features) where ``batch_first`` (sparkgrad takes it as (batch, features, time));
    integer indices, one (batch,) or (batch, 1) or a sequence (batch, time) per example, which sparkgrad
    takes as (batch, 1) and (batch, 1, time)."""
    tensor = value.type.tensor_type
    dims = tensor.shape.dim
    if not dims:
        raise OnnxImportError(f"ONNX input {value.name!r}: no shape")
    shape = []
    for d in dims[1:]:
        if not d.HasField("dim_value") or d.dim_value < 1:
            raise OnnxImportError(
                f"ONNX input {value.name!r}: only the batch axis may be unknown, got "
                f"{[x.dim_param or x.dim_value for x in dims]}"
            )
        shape.append(int(d.dim_value))
    kind = _onnx().TensorProto.DataType.Name(tensor.elem_type)
    if kind in _INDEX_TYPES:
        if len(shape) > 1:
            raise OnnxImportError(
                f"ONNX input {value.name!r}: integer input of shape (batch, {shape}); indices are imported "
                "one per example, (batch,) or (batch, 1), or as a sequence, (batch, time)"
            )
        if shape and shape[0] > 1:
            return _Value(value.name, tuple(shape), indices=True), InputType.recurrent(1, shape[0])
        return _Value(value.name, tuple(shape), indices=True), InputType.feed_forward(1)
    if kind not in ("FLOAT", "DOUBLE", "FLOAT16"):
        raise OnnxImportError(f"ONNX input {value.name!r}: element type {kind}")
    if batch_first and len(shape) == 2:
        return _Value(value.name, tuple(shape), order="ntc"), InputType.recurrent(shape[1], shape[0])
    return _Value(value.name, tuple(shape)), _input_type(value.name, tuple(shape))


def _batch_first(graph: Any, name: str) -> bool:
    """Whether a rank-3 input is a (batch, time, features) sequence: a recurrent operator reads it as
    such (layout 1), or through a Transpose to time-major; otherwise it is (batch, channels, time)."""
    for node in graph.node:
        if name not in node.input:
            continue
        attrs = {a.name: a for a in node.attribute}
        if node.op_type in _RECURRENT and "layout" in attrs and attrs["layout"].i == 1:
            return True
        if node.op_type == "Transpose" and "perm" in attrs and list(attrs["perm"].ints) == [1, 0, 2]:
            return True
    return False


def _load(onnx: Any, model: str | Path | bytes | Any) -> Any:
    if isinstance(model, onnx.ModelProto):
        return model
    where = "the given bytes" if isinstance(model, bytes) else str(model)
    try:
        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        proto = onnx.load_from_string(data)
    except OSError:
        raise
    except Exception as e:  # protobuf's DecodeError and friends: the bytes are not an ONNX model
        raise OnnxImportError(f"{where}: not an ONNX model ({type(e).__name__}: {e})") from e
    if not proto.graph.node:
        raise OnnxImportError(f"{where}: not an ONNX model (its graph has no nodes)")
    return proto


def import_onnx_model(model: str | Path | bytes | Any, seed: int | None = None) -> ComputationGraph:
    """Load an ONNX model with its weights into an initialised :class:`ComputationGraph`.

    The graph's inputs are the model's inputs (initializers excluded), under their ONNX names and in its
    order, taking the same layout as the model (NCHW images, (N, C, L) sequences, (N, F) vectors); its
    outputs the model's outputs, in order, each made trainable (see the module docstring). Every other
    vertex is named after the ONNX node it comes from.

    Args:
        model: the ``.onnx`` file's path, its bytes, or an ``onnx.ModelProto``.
        seed: the network's seed (dropout masks when training further).

    Returns:
        The network: ``output(x1, x2, ...)`` takes one array per model input and returns one per output.

    Raises:
        OnnxImportError: an operator or attribute that does not map, named with its node; bytes that are
            not an ONNX model, named with the file.
        ImportError: the ``onnx`` package is missing.
    """
    onnx = _onnx()
    proto = _load(onnx, model)
    graph = proto.graph
    converter = _Converter(onnx, graph)
    inputs = [v for v in graph.input if v.name not in converter.constants]
    types = []
    for value in inputs:
        converter.values[value.name], input_type = _input(value, _batch_first(graph, value.name))
        types.append(input_type)
    batches = {_declared_batch(value) for value in inputs}
    converter.batch = batches.pop() if len(batches) == 1 else None
    for node in graph.node:
        converter.convert(node)
    outputs = []
    for value in graph.output:
        if value.name not in converter.values:
            raise OnnxImportError(f"ONNX output {value.name!r} is not computed from the inputs")
        outputs.append(converter.output(value.name))
    builder = ComputationGraphConfiguration.builder(seed=seed).add_inputs(*(v.name for v in inputs))
    for node in converter.nodes:
        if isinstance(node.item, L.Layer):
            builder.add_layer(node.name, node.item, *node.heads)
        else:
            builder.add_vertex(node.name, node.item, *node.heads)
    conf = builder.set_outputs(*outputs).set_input_types(*types).build()
    given = {n.name: n.params for n in converter.nodes}
    return set_weights(ComputationGraph(conf).init(), given, "ONNX", OnnxImportError)
