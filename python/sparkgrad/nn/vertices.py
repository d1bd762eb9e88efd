"""Graph vertices: the parameter-free nodes of a ComputationGraph (DL4J's GraphVertex family).

Each vertex configuration is pure data (JSON/YAML round trip) and knows how many inputs it takes
(``min_inputs``/``max_inputs``), its output type given its input types (``infer``, ValueError naming the
vertex on a mismatch) and how to build its runtime. Runtimes take and return batches: dense activations
``(N, size)`` and convolutional ones ``(N, C, H, W)``; "features" means axis 1 (the size of dense input,
the channels of convolutional input). Arithmetic runs in native kernels (``elementwise_*``,
``scale_shift``, ``l2_normalize_*``, ``l2_distance_*``); merge, subset, stack, unstack and reshape only
copy or view. A runtime computes on the network's device (``self.xp`` allocates, ``self.k`` holds
the kernels).

A runtime's ``backward`` returns one gradient per input, each an array the caller may overwrite (never
shared between two inputs), and ``forward_mask`` maps the per-example masks of its inputs to its output's
(DL4J: with several inputs a missing mask means "all present", so the result is None, else the OR).
Vertices with ``per_step`` (merge, element-wise, subset, scale, shift, L2 normalize) also take recurrent
inputs (all of them recurrent): the graph runs them at every time step, their masks (N, T) combined
the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, ClassVar

import numpy as np

from sparkgrad._config import MAX_SCALE, Config, check_int, check_positive, check_range, coerce_enum
from sparkgrad.device import Device
from sparkgrad.nn.input_type import InputType


def vertex_error(name: str, vertex: Any, message: str) -> ValueError:
    """ValueError naming the vertex and its type: ``vertex 'merge' (MergeVertex): ...``."""
    return ValueError(f"vertex {name!r} ({type(vertex).__name__}): {message}")


class ElementWiseOp(enum.Enum):
    """Combination of an ElementWiseVertex's inputs (subtract takes exactly two)."""

    ADD = "add"
    SUBTRACT = "subtract"
    PRODUCT = "product"
    AVERAGE = "average"
    MAX = "max"


# -- runtimes ----------------------------------------------------------------------------------------
class VertexRuntime:
    """Base of the vertex runtimes: a cache of work buffers (reallocated when the batch shape changes)."""

    def __init__(self, conf: Any, input_types: list[InputType], dtype: np.dtype, device: Device) -> None:
        self.conf = conf
        self.xp, self.k = device.xp, device.kernels
        self.input_types = input_types
        self.dtype = dtype
        self._buffers: dict[str, np.ndarray] = {}

    def buf(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A cached work array of ``shape`` (contents undefined)."""
        arr = self._buffers.get(name)
        if arr is None or arr.shape != shape:
            arr = self.xp.empty(shape, dtype=self.dtype)
            self._buffers[name] = arr
        return arr

    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        """The output for ``inputs`` (valid until the next forward)."""
        raise NotImplementedError  # every concrete runtime overrides this

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        """dL/d input for every input, from dL/d output of the last forward (``dy`` may be reused)."""
        raise NotImplementedError  # every concrete runtime overrides this

    def forward_mask(self, masks: list[np.ndarray | None]) -> np.ndarray | None:
        """Per-example mask of the output from those of the inputs."""
        if any(m is None for m in masks):
            return None
        out = masks[0]
        for m in masks[1:]:
            out = self.xp.maximum(out, m)
        return out


class _MergeRuntime(VertexRuntime):
    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        self.shapes = [x.shape for x in inputs]
        y = self.buf("y", (inputs[0].shape[0], sum(s[1] for s in self.shapes), *inputs[0].shape[2:]))
        offset = 0
        for x in inputs:
            self.xp.copyto(y[:, offset : offset + x.shape[1]], x)
            offset += x.shape[1]
        return y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        grads, offset = [], 0
        for i, shape in enumerate(self.shapes):
            dx = self.buf(f"dx{i}", shape)
            self.xp.copyto(dx, dy[:, offset : offset + shape[1]])
            grads.append(dx)
            offset += shape[1]
        return grads


class _ElementWiseRuntime(VertexRuntime):
    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        self.inputs = [self.xp.ascontiguousarray(x) for x in inputs]
        y = self.buf("y", inputs[0].shape)
        self.k.elementwise_forward(self.conf.op.value, self.inputs, y)
        return y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        grads = [self.buf(f"dx{i}", dy.shape) for i in range(len(self.inputs))]
        self.k.elementwise_backward(self.conf.op.value, self.inputs, self.xp.ascontiguousarray(dy), grads)
        return grads


class _SubsetRuntime(VertexRuntime):
    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        x = inputs[0]
        self.shape = x.shape
        lo, hi = self.conf.from_index, self.conf.to_index + 1
        y = self.buf("y", (x.shape[0], hi - lo, *x.shape[2:]))
        self.xp.copyto(y, x[:, lo:hi])
        return y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        dx = self.buf("dx", self.shape)
        dx[...] = 0.0
        dx[:, self.conf.from_index : self.conf.to_index + 1] = dy
        return [dx]


class _StackRuntime(VertexRuntime):
    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        self.rows = [x.shape[0] for x in inputs]
        y = self.buf("y", (sum(self.rows), *inputs[0].shape[1:]))
        self.xp.concatenate(inputs, axis=0, out=y)
        return y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        grads, start = [], 0
        for i, rows in enumerate(self.rows):
            dx = self.buf(f"dx{i}", (rows, *dy.shape[1:]))
            self.xp.copyto(dx, dy[start : start + rows])
            grads.append(dx)
            start += rows
        return grads

    def forward_mask(self, masks: list[np.ndarray | None]) -> np.ndarray | None:
        if all(m is None for m in masks):
            return None
        filled = [self.xp.ones(rows, self.dtype) if m is None else m for m, rows in zip(masks, self.rows)]
        return self.xp.concatenate(filled)


class _UnstackRuntime(VertexRuntime):
    def _rows(self, n: int) -> slice:
        k = self.conf.stack_size
        if n % k:
            raise ValueError(f"UnstackVertex: the input has {n} examples, not a multiple of stack_size {k}")
        step = n // k
        return slice(self.conf.from_index * step, (self.conf.from_index + 1) * step)

    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        x = inputs[0]
        self.shape = x.shape
        return x[self._rows(x.shape[0])]

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        dx = self.buf("dx", self.shape)
        dx[...] = 0.0
        dx[self._rows(self.shape[0])] = dy
        return [dx]

    def forward_mask(self, masks: list[np.ndarray | None]) -> np.ndarray | None:
        return None if masks[0] is None else masks[0][self._rows(masks[0].shape[0])]


class _ScaleShiftRuntime(VertexRuntime):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.scale = getattr(self.conf, "scale_factor", 1.0)
        self.shift = getattr(self.conf, "shift_factor", 0.0)

    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        x = self.xp.ascontiguousarray(inputs[0])
        y = self.buf("y", x.shape)
        self.k.scale_shift(x, y, self.scale, self.shift)
        return y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        if self.scale != 1.0:  # a shift passes the gradient through unchanged
            dy = self.xp.ascontiguousarray(dy)
            self.k.scale_shift(dy, dy, self.scale, 0.0)
        return [dy]


class _L2NormalizeRuntime(VertexRuntime):
    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        x = self.xp.ascontiguousarray(inputs[0])
        self.y = self.buf("y", x.shape)
        self.norms = self.buf("norms", (x.shape[0],))
        self.k.l2_normalize_forward(x, self.y, self.norms, self.conf.eps)
        return self.y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        dy = self.xp.ascontiguousarray(dy)
        self.k.l2_normalize_backward(self.y, self.norms, dy, dy, self.conf.eps)
        return [dy]


class _L2Runtime(VertexRuntime):
    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        self.a, self.b = (self.xp.ascontiguousarray(x) for x in inputs)
        self.y = self.buf("y", (self.a.shape[0], 1))
        self.k.l2_distance_forward(self.a, self.b, self.y.reshape(-1))
        return self.y

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        da, db = self.buf("da", self.a.shape), self.buf("db", self.b.shape)
        dy = self.xp.ascontiguousarray(dy).reshape(-1)
        self.k.l2_distance_backward(self.a, self.b, self.y.reshape(-1), dy, da, db, self.conf.eps)
        return [da, db]


class _ReshapeRuntime(VertexRuntime):
    def __init__(
        self, conf: Any, input_types: list[InputType], dtype: np.dtype, device: Device, shape: tuple
    ) -> None:
        super().__init__(conf, input_types, dtype, device)
        self.out_shape = shape

    def forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        x = self.xp.ascontiguousarray(inputs[0])
        self.shape = x.shape
        return x.reshape((x.shape[0], *self.out_shape))

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        return [self.xp.ascontiguousarray(dy).reshape(self.shape)]


class _LastTimeStepRuntime(VertexRuntime):
    def forward_time_series(
        self,
        x: np.ndarray,
        mask: np.ndarray | None,
        reference: np.ndarray | None,
        ref_mask: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(N, T, C) -> (N, C) at each example's last present step (the reference input's mask when the
        vertex names one, else its input's); the output has no mask."""
        from sparkgrad.nn._recurrent import last_present_steps

        n, t = x.shape[:2]
        self.shape = x.shape
        self.last = last_present_steps(ref_mask if self.conf.mask_input else mask, n, t, self.xp)
        return x[self.xp.arange(n), self.last], None

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        dx = self.buf("dx", self.shape)
        dx.fill(0.0)
        dx[self.xp.arange(self.shape[0]), self.last] = dy
        return [dx]


class _DuplicateToTimeSeriesRuntime(VertexRuntime):
    def forward_time_series(
        self,
        x: np.ndarray,
        mask: np.ndarray | None,
        reference: np.ndarray | None,
        ref_mask: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(N, C) -> (N, T, C) with T and the mask of the reference input."""
        if reference is None:
            raise ValueError("DuplicateToTimeSeriesVertex: needs the activations of its reference input")
        if reference.shape[0] != x.shape[0]:
            raise ValueError(
                f"DuplicateToTimeSeriesVertex: input {self.conf.input_name!r} has {reference.shape[0]} "
                f"examples, the vertex input {x.shape[0]}"
            )
        y = self.buf("y", (x.shape[0], reference.shape[1], x.shape[1]))
        self.xp.copyto(y, x[:, None, :])
        return y, ref_mask

    def backward(self, dy: np.ndarray) -> list[np.ndarray]:
        return [dy.sum(axis=1)]


# -- configurations ----------------------------------------------------------------------------------
class GraphVertex(Config):
    """Base of the vertex configurations."""

    min_inputs: ClassVar[int] = 1
    max_inputs: ClassVar[int | None] = 1  # None: any number
    # True: on recurrent inputs the vertex runs at every time step (the graph hands it (N*T, C) rows)
    per_step: ClassVar[bool] = False
    # True: the vertex moves between sequences and vectors, reading the time axis or mask of a named
    # network input (``reference``); its runtime implements ``forward_time_series``
    time_series: ClassVar[bool] = False

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        """Output type for ``input_types`` (already checked against min/max_inputs)."""
        raise NotImplementedError  # every concrete vertex overrides this

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        """The runtime over ``input_types`` computing in ``dtype`` on ``device``."""
        raise NotImplementedError  # every concrete vertex overrides this

    def _same_types(self, name: str, input_types: list[InputType]) -> InputType:
        first = input_types[0]
        for t in input_types[1:]:
            if t.kind != first.kind or t.shape() != first.shape():
                described = ", ".join(t.describe() for t in input_types)
                raise vertex_error(name, self, f"inputs must have the same shape, got {described}")
        return first


def _with_features(input_type: InputType, features: int) -> InputType:
    """``input_type`` with its feature axis (size or channels) resized to ``features``."""
    if input_type.is_convolutional:
        return InputType.convolutional(input_type.height, input_type.width, features)
    return InputType.feed_forward(features)


def _features(input_type: InputType) -> int:
    return input_type.channels if input_type.is_convolutional else input_type.size


@dataclasses.dataclass
class MergeVertex(GraphVertex):
    """Concatenates its inputs along the features (dense) or channels (convolutional) axis."""

    per_step: ClassVar[bool] = True

    max_inputs: ClassVar[int | None] = None

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        first = input_types[0]
        described = ", ".join(t.describe() for t in input_types)
        for t in input_types[1:]:
            if t.is_convolutional != first.is_convolutional:
                raise vertex_error(
                    name,
                    self,
                    f"inputs must be all dense or all convolutional, got {described} (flatten the "
                    "convolutional ones with PreprocessorVertex(CnnToFeedForwardPreProcessor()))",
                )
            if first.is_convolutional and (t.height, t.width) != (first.height, first.width):
                raise vertex_error(
                    name, self, f"convolutional inputs must have one height and width, got {described}"
                )
        return _with_features(first, sum(_features(t) for t in input_types))

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _MergeRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class ElementWiseVertex(GraphVertex):
    """Element-wise add, subtract (exactly two inputs), product, average or max of same-shape inputs."""

    per_step: ClassVar[bool] = True

    op: ElementWiseOp = ElementWiseOp.ADD
    max_inputs: ClassVar[int | None] = None

    def __post_init__(self) -> None:
        self.op = coerce_enum(ElementWiseOp, self.op, "op")

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        if self.op is ElementWiseOp.SUBTRACT and len(input_types) != 2:
            raise vertex_error(name, self, f"subtract takes exactly 2 inputs, got {len(input_types)}")
        return self._same_types(name, input_types)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _ElementWiseRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class SubsetVertex(GraphVertex):
    """Features (dense) or channels (convolutional) ``from_index`` to ``to_index``, both inclusive."""

    per_step: ClassVar[bool] = True

    from_index: int
    to_index: int

    def __post_init__(self) -> None:
        self.from_index = check_int("from_index", self.from_index, minimum=0)
        self.to_index = check_int("to_index", self.to_index, minimum=self.from_index)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        features = _features(input_types[0])
        if self.to_index >= features:
            raise vertex_error(
                name, self, f"to_index {self.to_index} is out of range for {input_types[0].describe()}"
            )
        return _with_features(input_types[0], self.to_index - self.from_index + 1)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _SubsetRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class StackVertex(GraphVertex):
    """Stacks same-shape inputs along the batch axis: k inputs of N examples give k*N examples."""

    max_inputs: ClassVar[int | None] = None

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        return self._same_types(name, input_types)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _StackRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class UnstackVertex(GraphVertex):
    """Part ``from_index`` of ``stack_size`` equal parts of the batch (the inverse of StackVertex)."""

    from_index: int
    stack_size: int

    def __post_init__(self) -> None:
        self.stack_size = check_int("stack_size", self.stack_size, minimum=1)
        self.from_index = check_int("from_index", self.from_index, minimum=0, maximum=self.stack_size - 1)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        return input_types[0]

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _UnstackRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class ScaleVertex(GraphVertex):
    """Multiplies its input by ``scale_factor``."""

    per_step: ClassVar[bool] = True

    scale_factor: float

    def __post_init__(self) -> None:
        self.scale_factor = check_range("scale_factor", self.scale_factor, -MAX_SCALE, MAX_SCALE)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        return input_types[0]

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _ScaleShiftRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class ShiftVertex(GraphVertex):
    """Adds ``shift_factor`` to its input."""

    per_step: ClassVar[bool] = True

    shift_factor: float

    def __post_init__(self) -> None:
        self.shift_factor = check_range("shift_factor", self.shift_factor, -MAX_SCALE, MAX_SCALE)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        return input_types[0]

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _ScaleShiftRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class L2NormalizeVertex(GraphVertex):
    """Divides every example by its L2 norm over all non-batch axes, the norm clamped below at ``eps``."""

    per_step: ClassVar[bool] = True

    eps: float = 1e-8

    def __post_init__(self) -> None:
        self.eps = check_positive("eps", self.eps, MAX_SCALE)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        return input_types[0]

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _L2NormalizeRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class L2Vertex(GraphVertex):
    """L2 distance between two same-shape inputs per example: output (N, 1). The gradient divides by
    the distance clamped below at ``eps`` (DL4J)."""

    eps: float = 1e-8
    min_inputs: ClassVar[int] = 2
    max_inputs: ClassVar[int | None] = 2

    def __post_init__(self) -> None:
        self.eps = check_positive("eps", self.eps, MAX_SCALE)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        self._same_types(name, input_types)
        return InputType.feed_forward(1)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _L2Runtime(self, input_types, dtype, device)


def _type_of_shape(shape: tuple[int, ...]) -> InputType:
    return (
        InputType.feed_forward(shape[0])
        if len(shape) == 1
        else InputType.convolutional(shape[1], shape[2], shape[0])
    )


@dataclasses.dataclass
class ReshapeVertex(GraphVertex):
    """Reshapes every example (C order) to ``shape``: ``(size,)`` (dense) or ``(channels, height, width)``."""

    shape: tuple

    def __post_init__(self) -> None:
        if not isinstance(self.shape, (tuple, list)) or len(self.shape) not in (1, 3):
            raise ValueError(f"shape: expected (size,) or (channels, height, width), got {self.shape!r}")
        self.shape = tuple(check_int("shape", d, minimum=1) for d in self.shape)

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        if math.prod(self.shape) != input_types[0].size:
            raise vertex_error(
                name,
                self,
                f"shape {self.shape} holds {math.prod(self.shape)} values, the input "
                f"{input_types[0].describe()} has {input_types[0].size}",
            )
        return _type_of_shape(self.shape)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _ReshapeRuntime(self, input_types, dtype, device, self.shape)


class InputPreProcessor(Config):
    """Base of the preprocessors a PreprocessorVertex applies."""

    def output_type(self, name: str, vertex: Any, input_type: InputType) -> InputType:
        """The output type, or ValueError naming the vertex when the input does not fit."""
        raise NotImplementedError  # every concrete preprocessor overrides this


@dataclasses.dataclass
class CnnToFeedForwardPreProcessor(InputPreProcessor):
    """Flattens convolutional activations (C order of channels, height, width) to dense rows."""

    def output_type(self, name: str, vertex: Any, input_type: InputType) -> InputType:
        if not input_type.is_convolutional:
            raise vertex_error(name, vertex, f"needs convolutional input, got {input_type.describe()}")
        return InputType.feed_forward(input_type.size)


@dataclasses.dataclass
class FeedForwardToCnnPreProcessor(InputPreProcessor):
    """Reshapes dense rows of ``channels * height * width`` values to (channels, height, width)."""

    height: int
    width: int
    channels: int

    def __post_init__(self) -> None:
        for field in ("height", "width", "channels"):
            setattr(self, field, check_int(field, getattr(self, field), minimum=1))

    def output_type(self, name: str, vertex: Any, input_type: InputType) -> InputType:
        out = InputType.convolutional(self.height, self.width, self.channels)
        if input_type.is_convolutional or input_type.size != out.size:
            raise vertex_error(
                name, vertex, f"needs dense input of size {out.size}, got {input_type.describe()}"
            )
        return out


@dataclasses.dataclass
class PreprocessorVertex(GraphVertex):
    """Applies an :class:`InputPreProcessor` (CnnToFeedForward / FeedForwardToCnn) to its input."""

    preprocessor: InputPreProcessor

    def __post_init__(self) -> None:
        if not isinstance(self.preprocessor, InputPreProcessor):
            raise ValueError(f"preprocessor: expected an InputPreProcessor, got {self.preprocessor!r}")

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        return self.preprocessor.output_type(name, self, input_types[0])

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        out = self.preprocessor.output_type("", self, input_types[0])
        return _ReshapeRuntime(self, input_types, dtype, device, out.shape())


@dataclasses.dataclass
class LastTimeStepVertex(GraphVertex):
    """A sequence's activations at each example's last present step: (batch, size, time) -> (batch, size)
    (DL4J's LastTimeStepVertex).

    Args:
        mask_input: a recurrent network input whose features mask decides the last present step; None
            uses the mask that reaches the vertex with its input.
    """

    mask_input: str | None = None
    time_series: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.mask_input is not None and (not isinstance(self.mask_input, str) or not self.mask_input):
            raise ValueError(f"mask_input: expected a network input name or None, got {self.mask_input!r}")

    @property
    def reference(self) -> str | None:
        return self.mask_input

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        if input_types[0].kind != "recurrent":
            raise vertex_error(name, self, f"needs recurrent input, got {input_types[0].describe()}")
        return InputType.feed_forward(input_types[0].size)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _LastTimeStepRuntime(self, input_types, dtype, device)


@dataclasses.dataclass
class DuplicateToTimeSeriesVertex(GraphVertex):
    """A vector per example repeated at every time step of a recurrent network input: (batch, size) ->
    (batch, size, time), with that input's length and features mask (DL4J's DuplicateToTimeSeriesVertex).

    Args:
        input_name: the recurrent network input giving the time steps and the mask.
    """

    input_name: str
    time_series: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.input_name, str) or not self.input_name:
            raise ValueError(f"input_name: expected a network input name, got {self.input_name!r}")

    @property
    def reference(self) -> str | None:
        return self.input_name

    def infer(self, name: str, input_types: list[InputType]) -> InputType:
        if input_types[0].kind != "feed_forward":
            raise vertex_error(name, self, f"needs feed-forward input, got {input_types[0].describe()}")
        return InputType.recurrent(input_types[0].size)

    def build_runtime(self, input_types: list[InputType], dtype: np.dtype, device: Device) -> VertexRuntime:
        return _DuplicateToTimeSeriesRuntime(self, input_types, dtype, device)


__all__ = [
    "CnnToFeedForwardPreProcessor",
    "DuplicateToTimeSeriesVertex",
    "ElementWiseOp",
    "ElementWiseVertex",
    "FeedForwardToCnnPreProcessor",
    "GraphVertex",
    "InputPreProcessor",
    "L2NormalizeVertex",
    "L2Vertex",
    "LastTimeStepVertex",
    "MergeVertex",
    "PreprocessorVertex",
    "ReshapeVertex",
    "ScaleVertex",
    "ShiftVertex",
    "StackVertex",
    "SubsetVertex",
    "UnstackVertex",
    "vertex_error",
]
