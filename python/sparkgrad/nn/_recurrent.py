"""Runtimes of the recurrent layers (LSTM, GRU, SimpleRnn, Bidirectional, LastTimeStep).

Sequence runtime interface (layers whose config has ``takes_sequences``), used by every network type:

- ``forward(x, train, seed, mask=None, stateful=False)``: ``x`` is (N, T, C), C-contiguous: DL4J's
  (batch, size, time) features with each example's time steps as contiguous rows. ``mask`` is the
  features mask (N, T) in the network dtype (1 = step present, 0 = padding) or None. Returns (N, T, H)
  (LastTimeStep: (N, H)), a work buffer valid until the next forward. With ``stateful`` the layer starts
  from the state its previous stateful forward ended in (``rnn_time_step``, truncated BPTT) and keeps
  the state it ends in; ``clear_state()`` forgets it. ``backward_steps`` (truncated BPTT) limits the
  following backward to the last that many time steps.
- ``backward(dy, need_dx)``: ``dy`` is dL/d(output) shaped as the output; writes the parameter gradients
  (not accumulated) and returns dL/dx (N, T, C) or None. It uses the mask of the last forward. No
  gradient flows into the initial state.

Masked steps follow DL4J: a recurrent layer's output and state are multiplied by the mask, so a masked
step outputs zero and the next present step starts from a zero state; its gradient is zero there.

Both network types run every layer through :func:`layer_forward` / :func:`layer_backward` (recurrent
layers see sequences, other layers given sequences run at every time step on (N*T, C) rows with their
masked steps zeroed) and read sequence data through :func:`sequence_features`, :func:`sequence_mask`
and :func:`steps_to_rows`; truncated BPTT cuts their minibatches with :class:`TbpttSegment`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkgrad.device import Device, is_gpu_array
from sparkgrad.nn import layers as L
from sparkgrad.nn._layer_runtime import LayerRuntime, activation_alpha


class SequenceRuntime(LayerRuntime):
    """Base of the recurrent runtimes: the stateful-inference state and the interface above."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.state: tuple[np.ndarray, ...] | None = None

    def clear_state(self) -> None:
        """Forget the state kept by stateful forwards."""
        self.state = None

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        """Whole sequences (N, T, C) with their mask (N, T); ``stateful`` starts from and keeps the state
        (``rnn_time_step``, truncated BPTT), ``backward_steps`` limits the gradient to the last steps."""
        raise NotImplementedError  # every recurrent runtime overrides this

    def _initial_state(self, n: int, stateful: bool) -> tuple[np.ndarray | None, ...]:
        if not stateful or self.state is None:
            return (None,) * self.state_arrays
        if self.state[0].shape[0] != n:
            raise ValueError(
                f"features: the stored recurrent state is for {self.state[0].shape[0]} examples but the "
                f"batch has {n}; call rnn_clear_previous_state() first"
            )
        return self.state

    state_arrays = 1

    def output_mask(self, mask: Any) -> Any:
        """The mask of the last forward's output given its input ``mask``: the same steps (the 1-D layers
        that change the number of steps override this)."""
        return mask

    def _start(
        self, x: np.ndarray, train: bool, seed: int, mask: Any, stateful: bool, steps: int | None
    ) -> tuple[np.ndarray | None, ...]:
        """What a cell's forward keeps for its backward (its input after dropout, the mask, the first step
        gradients reach); returns the initial state."""
        self.x = self._input_dropout(x, train, seed)
        self.mask = mask
        self.first_step = _first_step(x.shape[1], steps)
        return self._initial_state(x.shape[0], stateful)


class _GatedRuntime(SequenceRuntime):
    """Base of the gated cells (LSTM, GRU): the activations their kernels take."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        c = self.conf
        self.kernel_args = {
            "activation": c.activation.value,
            "gate_activation": c.gate_activation.value,
            "alpha": activation_alpha(c.activation),
            "gate_alpha": activation_alpha(c.gate_activation),
        }


class LSTMRuntime(_GatedRuntime):
    """LSTM through the native whole-sequence kernels (cpp/src/nn/lstm.cpp)."""

    state_arrays = 2

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        self.h0, self.c0 = self._start(x, train, seed, mask, stateful, backward_steps)
        n, t, _ = x.shape
        h = self.conf.n_out
        hs, cs = self.buf("hs", (n, t, h)), self.buf("cs", (n, t, h))
        gates, act_c = self.buf("gates", (n, t, 4 * h)), self.buf("act_c", (n, t, h))
        p = self.params
        self.k.lstm_forward(
            self.x, p[L.WEIGHT], p[L.RECURRENT_WEIGHT], p[L.BIAS], hs, cs, gates, act_c,
            mask=mask, h0=self.h0, c0=self.c0, **self.kernel_args,
        )  # fmt: skip
        if stateful:
            self.state = (hs[:, -1].copy(), cs[:, -1].copy())
        self.hs, self.cs, self.gates, self.act_c = hs, cs, gates, act_c
        return hs

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        g, p = self.grads, self.params
        dx = self.buf("dx", self.x.shape) if need_dx else None
        self.k.lstm_backward(
            self.x, p[L.WEIGHT], p[L.RECURRENT_WEIGHT], self.hs, self.cs, self.gates, self.act_c,
            self.xp.ascontiguousarray(dy), self.buf("dgates", self.gates.shape),
            g[L.WEIGHT], g[L.RECURRENT_WEIGHT], g[L.BIAS],
            dx=dx, mask=self.mask, h0=self.h0, c0=self.c0, first_step=self.first_step, **self.kernel_args,
        )  # fmt: skip
        return self._input_dropout_backward(dx) if dx is not None else None


class GRURuntime(_GatedRuntime):
    """GRU through the native whole-sequence kernels (cpp/src/nn/gru.cpp)."""

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        (self.h0,) = self._start(x, train, seed, mask, stateful, backward_steps)
        n, t, _ = x.shape
        h = self.conf.n_out
        hs, gates = self.buf("hs", (n, t, h)), self.buf("gates", (n, t, 3 * h))
        p = self.params
        self.k.gru_forward(
            self.x, p[L.WEIGHT], p[L.RECURRENT_WEIGHT], p[L.BIAS], hs, gates,
            mask=mask, h0=self.h0, **self.kernel_args,
        )  # fmt: skip
        if stateful:
            self.state = (hs[:, -1].copy(),)
        self.hs, self.gates = hs, gates
        return hs

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        g, p = self.grads, self.params
        dx = self.buf("dx", self.x.shape) if need_dx else None
        self.k.gru_backward(
            self.x, p[L.WEIGHT], p[L.RECURRENT_WEIGHT], self.hs, self.gates, self.xp.ascontiguousarray(dy),
            self.buf("dgates", self.gates.shape), g[L.WEIGHT], g[L.RECURRENT_WEIGHT], g[L.BIAS],
            dx=dx, mask=self.mask, h0=self.h0, first_step=self.first_step, **self.kernel_args,
        )  # fmt: skip
        return self._input_dropout_backward(dx) if dx is not None else None


class SimpleRnnRuntime(SequenceRuntime):
    """SimpleRnn through the native whole-sequence kernels (cpp/src/nn/simple_rnn.cpp)."""

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        (self.h0,) = self._start(x, train, seed, mask, stateful, backward_steps)
        n, t, _ = x.shape
        h = self.conf.n_out
        hs, act = self.buf("hs", (n, t, h)), self.buf("act", (n, t, h))
        p = self.params
        self.k.simple_rnn_forward(
            self.x, p[L.WEIGHT], p[L.RECURRENT_WEIGHT], p[L.BIAS], hs, act,
            mask=mask, h0=self.h0, activation=self._activation_name, alpha=self.alpha,
        )  # fmt: skip
        if stateful:
            self.state = (hs[:, -1].copy(),)
        self.hs, self.act = hs, act
        return hs

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        g, p = self.grads, self.params
        dx = self.buf("dx", self.x.shape) if need_dx else None
        self.k.simple_rnn_backward(
            self.x, p[L.WEIGHT], p[L.RECURRENT_WEIGHT], self.hs, self.act, self.xp.ascontiguousarray(dy),
            self.buf("dz", self.hs.shape), g[L.WEIGHT], g[L.RECURRENT_WEIGHT], g[L.BIAS],
            dx=dx, mask=self.mask, h0=self.h0, activation=self._activation_name, alpha=self.alpha,
            first_step=self.first_step,
        )  # fmt: skip
        return self._input_dropout_backward(dx) if dx is not None else None


def last_present_steps(mask: Any, n: int, t: int, xp: Any) -> Any:
    """Each example's last present time step: the last non-zero mask entry (0 when a row has none), or
    the last step without a mask; an index array of the array module ``xp``."""
    if mask is None:
        return xp.full(n, t - 1)
    present = mask != 0
    return xp.where(present.any(axis=1), t - 1 - xp.argmax(present[:, ::-1], axis=1), 0)


def _first_step(steps: int, backward_steps: int | None) -> int:
    """The first time step gradients reach: all of them, or the last ``backward_steps`` (truncated BPTT)."""
    return 0 if backward_steps is None else max(0, steps - backward_steps)


def _inner(outer: LayerRuntime, conf: Any, prefix: str = "") -> SequenceRuntime:
    """The runtime of the LSTM / GRU / SimpleRnn ``conf`` wrapped by ``outer``, over its parameters named
    ``prefix + name``, on its device."""
    names = [s.name for s in conf.param_specs(outer.input_type)]
    p = {name: outer.params[prefix + name] for name in names}
    g = {name: outer.grads[prefix + name] for name in names}
    return build_sequence_runtime(conf, outer.input_type, outer.activation, outer.dtype, p, g, outer.device)


class BidirectionalRuntime(SequenceRuntime):
    """Bidirectional: a forward-time and a backward-time copy of the wrapped layer, outputs combined."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.fwd = _inner(self, self.conf.layer, "f")
        self.bwd = _inner(self, self.conf.layer, "b")

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        if stateful:
            raise ValueError(
                "features: Bidirectional layers need the whole sequence: no rnn_time_step or truncated BPTT"
            )
        xp = self.xp
        self.yf = self.fwd.forward(x, train, seed, mask)
        x_rev = xp.ascontiguousarray(x[:, ::-1])
        m_rev = None if mask is None else xp.ascontiguousarray(mask[:, ::-1])
        self.yb = self.bwd.forward(x_rev, train, seed + 1, m_rev)[:, ::-1]
        mode = self.conf.mode
        if mode is L.BidirectionalMode.CONCAT:
            return xp.concatenate([self.yf, self.yb], axis=2)
        if mode is L.BidirectionalMode.ADD:
            return self.yf + self.yb
        if mode is L.BidirectionalMode.MUL:
            return self.yf * self.yb
        return 0.5 * (self.yf + self.yb)

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        mode, h = self.conf.mode, self.conf.layer.n_out
        if mode is L.BidirectionalMode.CONCAT:
            df, db = dy[:, :, :h], dy[:, :, h:]
        elif mode is L.BidirectionalMode.ADD:
            df = db = dy
        elif mode is L.BidirectionalMode.MUL:
            df, db = dy * self.yb, dy * self.yf
        else:
            df = db = 0.5 * dy
        dxf = self.fwd.backward(self.xp.ascontiguousarray(df), need_dx)
        dxb = self.bwd.backward(self.xp.ascontiguousarray(db[:, ::-1]), need_dx)
        if dxf is None or dxb is None:  # need_dx is False
            return None
        return dxf + dxb[:, ::-1]


class LastTimeStepRuntime(SequenceRuntime):
    """LastTimeStep: the wrapped layer's output at each example's last present step."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.inner = _inner(self, self.conf.layer)

    def clear_state(self) -> None:
        self.inner.clear_state()

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        y = self.inner.forward(x, train, seed, mask, stateful, backward_steps)
        n, t = y.shape[:2]
        self.last = last_present_steps(mask, n, t, self.xp)
        self.y_shape = y.shape
        return y[self.xp.arange(n), self.last]

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        full = self.buf("dy_full", self.y_shape)
        full.fill(0.0)
        full[self.xp.arange(self.y_shape[0]), self.last] = dy
        return self.inner.backward(full, need_dx)


class GlobalPoolingTimeRuntime(SequenceRuntime):
    """GlobalPoolingLayer on sequences: (N, T, C) -> (N, C) over the present steps (DL4J's masked
    time-series pooling: max over steps with a non-zero mask, sum of x * mask, sum(x * mask) / sum(mask));
    an example with no present step pools to zero."""

    def forward(
        self,
        x: np.ndarray,
        train: bool,
        seed: int,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        n, t, c = x.shape
        self.x_shape = x.shape
        kind, xp = self.conf.pooling_type, self.xp
        weights = xp.ones((n, t, 1), dtype=self.dtype) if mask is None else mask[:, :, None]
        if kind is L.PoolingType.MAX:
            if mask is None:  # every step present: no copy of x with the absent steps at -inf
                self.argmax, self.any_present = xp.argmax(x, axis=1), None  # (N, C)
                return xp.take_along_axis(x, self.argmax[:, None, :], axis=1)[:, 0]
            present = weights != 0
            self.argmax = xp.argmax(xp.where(present, x, -np.inf), axis=1)
            self.any_present = present.any(axis=1)  # (N, 1)
            y = xp.take_along_axis(x, self.argmax[:, None, :], axis=1)[:, 0] * self.any_present
            return y.astype(self.dtype, copy=False)
        self.scale = weights  # (N, T, 1): dy/dx of every step
        if kind is L.PoolingType.AVG:
            count = weights.sum(axis=1, keepdims=True)
            self.scale = weights / xp.where(count == 0, 1, count)
        return xp.einsum("ntc,nt->nc", x, self.scale[:, :, 0])

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        n, t, c = self.x_shape
        dx, xp = self.buf("dx", self.x_shape), self.xp
        if self.conf.pooling_type is L.PoolingType.MAX:
            dx.fill(0.0)
            rows, cols = xp.meshgrid(xp.arange(n), xp.arange(c), indexing="ij")
            dx[rows, self.argmax, cols] = dy if self.any_present is None else dy * self.any_present
        else:
            xp.multiply(dy[:, None, :], self.scale, out=dx)
        return dx


_SEQUENCE_RUNTIMES = {
    L.LSTM: LSTMRuntime,
    L.GRU: GRURuntime,
    L.SimpleRnn: SimpleRnnRuntime,
    L.Bidirectional: BidirectionalRuntime,
    L.LastTimeStep: LastTimeStepRuntime,
    L.GlobalPoolingLayer: GlobalPoolingTimeRuntime,
}


def build_sequence_runtime(
    conf: Any, input_type: Any, activation: Any, dtype: np.dtype, params: dict, grads: dict, device: Device
) -> SequenceRuntime:
    """The runtime of a layer whose config ``takes_sequences`` (interface in the module docstring)."""
    return _SEQUENCE_RUNTIMES[type(conf)](conf, input_type, activation, dtype, params, grads, device)


class LayerTrace:
    """What :func:`layer_forward` keeps for :func:`layer_backward`: the runtime's output shape, the
    per-step mask (N*T, 1) of a per-step layer on masked sequences (None otherwise) and, for a layer with
    batch statistics on masked sequences, the present rows it ran on out of ``n_rows``; ``mask`` is the
    features mask of the layer's output (its input's, unless the layer changes the number of steps)."""

    __slots__ = ("out_shape", "step_mask", "rows", "n_rows", "mask")

    def __init__(
        self,
        out_shape: tuple[int, ...],
        step_mask: np.ndarray | None,
        rows: np.ndarray | None = None,
        n_rows: int = 0,
        mask: np.ndarray | None = None,
    ) -> None:
        self.out_shape, self.step_mask, self.rows, self.n_rows = out_shape, step_mask, rows, n_rows
        self.mask = mask


def layer_forward(
    rt: Any,
    layer: L.Layer,
    input_type: Any,
    x: np.ndarray,
    mask: np.ndarray | None,
    train: bool,
    seed: int,
    preout: bool = False,
    stateful: bool = False,
    backward_steps: int | None = None,
) -> tuple[np.ndarray, LayerTrace]:
    """One layer's forward pass in a network (DL4J's automatic preprocessing and per-step masking).

    Args:
        rt: the layer's runtime.
        layer: its configuration.
        input_type: the type of its input.
        x: its input: (N, T, C) for a recurrent input type (images flattened per step), else (N, ...).
        mask: the features mask (N, T) of recurrent input, or None.
        train, seed: training mode and dropout seed.
        preout: return the output layer's pre-activation (as output rows) instead of its output.
        stateful, backward_steps: passed to recurrent layers (``rnn_time_step``, truncated BPTT).

    Returns:
        (the output: (N, T, H) for a sequence output, (N*T, H) rows for a per-step pre-activation, else
        (N, ...); the trace :func:`layer_backward` needs).
    """
    sequence = input_type.kind == "recurrent"
    xp = rt.xp
    if sequence and layer.takes_sequences:
        y = rt.forward(x, train, seed, mask=mask, stateful=stateful, backward_steps=backward_steps)
        return y, LayerTrace(y.shape, None, mask=rt.output_mask(mask))
    step_mask = rows = None
    if sequence:  # one row (or image) per time step
        n, t = x.shape[:2]
        step = (-1,) if layer.flattens_input else input_type.step_type().shape()
        x = x.reshape((n * t, *step))
        step_mask = None if mask is None else mask.reshape(-1, 1)
        if step_mask is not None and layer.batch_statistics:
            present = xp.flatnonzero(step_mask[:, 0])
            if 0 < present.size < n * t:  # batch statistics over the present steps only
                rows = present
                x = x[rows]
    elif x.ndim > 2 and layer.flattens_input:
        x = x.reshape(x.shape[0], -1)  # automatic flattening in front of dense layers
    if preout:
        return rt.preout(x, train, seed), LayerTrace(x.shape, step_mask, mask=mask)
    y = rt.forward(x, train, seed)
    trace = LayerTrace(y.shape, step_mask, rows, n * t if sequence else 0, mask)
    if rows is not None:  # padded steps output zero
        full = xp.zeros((n * t, *y.shape[1:]), dtype=y.dtype)
        full[rows] = y
        y = full
    if sequence:
        y = y.reshape(n, t, -1)
    if mask is not None and step_mask is not None:
        y = y * mask[:, :, None]  # a new array: the runtime keeps its own output for backward
    return y, trace


def layer_backward(rt: Any, dy: np.ndarray, trace: LayerTrace, need_dx: bool) -> np.ndarray | None:
    """Backward pass of a layer run by :func:`layer_forward` (not an output layer).

    Args:
        rt: the layer's runtime.
        dy: dL/d(output), any shape with the output's element count.
        trace: what the forward kept.
        need_dx: whether dL/d(input) is wanted.

    Returns:
        dL/d(input) in the runtime's input layout (rows for a per-step layer), or None.
    """
    xp = rt.xp
    if trace.step_mask is not None:  # masked steps of per-step layers get no gradient
        dy = dy.reshape(trace.step_mask.shape[0], -1) * trace.step_mask
    if trace.rows is not None:  # the layer ran on the present steps only
        dx = rt.backward(xp.ascontiguousarray(dy[trace.rows].reshape(trace.out_shape)), need_dx=need_dx)
        if dx is None:
            return None
        full = xp.zeros((trace.n_rows, *dx.shape[1:]), dtype=dx.dtype)
        full[trace.rows] = dx
        return full
    dy = dy.reshape(trace.out_shape)
    strided_ok = getattr(rt, "reads_strided", False)
    return rt.backward(dy if strided_ok else xp.ascontiguousarray(dy), need_dx=need_dx)


def sequence_features(x: Any, input_type: Any, device: Device, where: str, contiguous: bool = True) -> Any:
    """DL4J's (batch, size, time) features -> the (N, T, C) C-contiguous layout layers see, checked
    (``contiguous=False``: the (N, T, C) view, for a caller that decides on the copy itself).

    Args:
        x: the features, already an array of ``device`` in the network dtype.
        input_type: its recurrent InputType (size, optional fixed time steps).
        device: the network's device.
        where: the argument named in errors (``features``, ``features[1] (input 'a')``).
    """
    if x.ndim != 3 or x.shape[1] != input_type.size or x.shape[2] < 1:
        raise ValueError(f"{where}: expected shape (batch, {input_type.size}, time), got {x.shape}")
    if input_type.time_steps is not None and x.shape[2] != input_type.time_steps:
        raise ValueError(
            f"{where}: the input type has {input_type.time_steps} time steps but the features have "
            f"{x.shape[2]}; use InputType.recurrent(size) for variable-length sequences"
        )
    return device.xp.ascontiguousarray(x.transpose(0, 2, 1)) if contiguous else x.transpose(0, 2, 1)


def sequence_mask(mask: Any, x: Any, device: Device, dtype: np.dtype, where: str) -> Any:
    """A features mask (N, T) checked against sequence features ``x`` (N, T, C): an array of ``device``
    in ``dtype`` (host masks are copied there once)."""
    m = device.asarray(mask, dtype)
    if m.shape != x.shape[:2]:
        raise ValueError(f"{where}: expected shape (batch, time) = {x.shape[:2]}, got {m.shape}")
    if not bool(device.xp.isfinite(m).all()):
        raise ValueError(f"{where}: values must be finite (1 = step present, 0 = padding)")
    return m


def steps_to_rows(arr: Any, device: Device, dtype: np.dtype, where: str, is_mask: bool) -> Any:
    """Per-step labels (N, C, T) -> (N*T, C) output rows; a per-step mask (N, T) -> (N*T,); arrays of
    ``device`` in ``dtype`` (host arrays are copied there once)."""
    a, xp = device.asarray(arr, dtype), device.xp
    if a.ndim == 3:
        return xp.ascontiguousarray(a.transpose(0, 2, 1).reshape(-1, a.shape[1]))
    if a.ndim == 2 and is_mask:
        return a.reshape(-1)
    raise ValueError(f"{where}: expected a per-time-step array for recurrent output, got shape {a.shape}")


class TbpttSegment:
    """Time steps [start, stop) of a recurrent minibatch: one truncated-BPTT training step.

    Cuts a DataSet or a MultiDataSet the way DL4J does: sequences (features and labels (N, C, T)) are
    sliced along time, each with its mask ((N, T), or per-output (N, C, T)); every other array and its
    mask (a graph's feed-forward or convolutional input, a vector output) goes whole into every segment.
    A segment has the attributes of what it cuts (``features``, ``labels``, ``features_mask``,
    ``labels_mask`` of a DataSet; the lists ``features``, ``labels``, ``features_masks``,
    ``labels_masks`` of a MultiDataSet), all views. ``first`` marks the segment that starts a minibatch
    (the recurrent state is cleared before it).
    """

    # set from ``data``'s fields: arrays of a DataSet, lists of a MultiDataSet
    features: Any
    labels: Any

    def __init__(self, data: Any, start: int, stop: int) -> None:
        def cut(arr: Any, mask: Any) -> tuple[Any, Any]:
            if arr is None or len(np.shape(arr)) != 3:
                return arr, mask
            return _time_window(arr, start, stop), _time_window(mask, start, stop)

        self._multi = hasattr(data, "features_masks")
        for name in ("features", "labels"):
            if self._multi:
                arrays, masks = _as_list(getattr(data, name, None)), getattr(data, f"{name}_masks", None)
                given = _as_list(masks)
                pairs = [cut(a, given[k] if k < len(given) else None) for k, a in enumerate(arrays)]
                setattr(self, name, [a for a, _ in pairs])
                setattr(self, f"{name}_masks", None if masks is None else [m for _, m in pairs])
            else:
                arr, mask = cut(getattr(data, name, None), getattr(data, f"{name}_mask", None))
                setattr(self, name, arr)
                setattr(self, f"{name}_mask", mask)
        self.first = start == 0

    def num_examples(self) -> int:
        """Examples (sequences) in the segment."""
        return int(np.shape(self.features[0] if self._multi else self.features)[0])


def _as_list(value: Any) -> list:
    return [] if value is None else list(value)


def _time_window(arr: Any, start: int, stop: int) -> Any:
    """A view of steps [start, stop) along the last (time) axis of a host or device array; a mask with
    no time axis, or None, as it is."""
    if arr is None:
        return None
    a = arr if is_gpu_array(arr) or isinstance(arr, np.ndarray) else np.asarray(arr)
    return a[..., start:stop] if a.ndim >= 2 else a


def sequence_steps(data: Any) -> int:
    """The number of time steps of a minibatch's sequences (features and labels (N, C, T) of a DataSet or
    MultiDataSet), which truncated BPTT needs to be the same for all of them (DL4J)."""
    steps: dict[str, int] = {}
    multi = hasattr(data, "features_masks")
    for name in ("features", "labels"):
        arrays = _as_list(getattr(data, name, None)) if multi else [getattr(data, name, None)]
        for k, arr in enumerate(arrays):
            shape: tuple[int, ...] = np.shape(arr) if arr is not None else ()
            if len(shape) == 3:
                steps[f"{name}[{k}]" if multi else name] = int(shape[2])
    if not steps:
        raise ValueError(
            "dataset: truncated BPTT needs sequences (features or labels shaped (batch, size, time)), "
            "got none"
        )
    if len(set(steps.values())) > 1:
        found = ", ".join(f"{name} {t}" for name, t in steps.items())
        raise ValueError(
            f"dataset: truncated BPTT needs every sequence to have the same number of time steps, got {found}"
        )
    return next(iter(steps.values()))


__all__ = [
    "LayerTrace",
    "SequenceRuntime",
    "TbpttSegment",
    "build_sequence_runtime",
    "last_present_steps",
    "layer_backward",
    "layer_forward",
    "sequence_features",
    "sequence_mask",
    "sequence_steps",
    "steps_to_rows",
]
