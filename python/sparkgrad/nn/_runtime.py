"""Runtime of each layer type: forward/backward over preallocated buffers through the native kernels.

A runtime object owns the views of its parameters and gradients into the network's flat buffers and
a cache of work buffers keyed by name (reallocated only when the batch shape changes), so a training
step allocates nothing large. Returned arrays are work buffers: valid until the next forward pass.
Gradients are written (not accumulated) into the flat gradient views. A runtime computes on the
network's :class:`~sparkgrad.device.Device`: ``self.xp`` allocates and ``self.k`` holds the kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkgrad.device import Device
from sparkgrad.nn import layers as L
from sparkgrad.nn._attention import ATTENTION_RUNTIMES
from sparkgrad.nn._layer_runtime import LayerRuntime, activation_alpha
from sparkgrad.nn._recurrent import SequenceRuntime, build_sequence_runtime
from sparkgrad.nn.enums import Activation
from sparkgrad.nn.input_type import InputType

# What conv2d_forward applies in its epilogue (``activation=``) on every device.
_FUSED_CONV_ACTIVATIONS = (Activation.IDENTITY, Activation.RELU)


class DenseRuntime(LayerRuntime):
    """DenseLayer and the dense part of OutputLayer: ``z = x W + b``."""

    def preout(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x = self._input_dropout(x, train, seed)
        self.z = self.buf("z", (x.shape[0], self.conf.n_out))
        self.k.gemm(self.x, self.params[L.WEIGHT], out=self.z)
        if self.conf.has_bias:
            self.k.bias_add(self.z, self.params[L.BIAS])
        return self.z

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.y = self._activate(self.preout(x, train, seed))
        return self.y

    def backward_preout(self, dz: np.ndarray, need_dx: bool) -> np.ndarray | None:
        """Gradients given dL/dz."""
        self.k.gemm(self.x, dz, trans_a=True, out=self.grads[L.WEIGHT])
        if self.conf.has_bias:
            self.k.bias_grad(dz, self.grads[L.BIAS])
        if not need_dx:
            return None
        dx = self.buf("dx", self.x.shape)
        self.k.gemm(dz, self.params[L.WEIGHT], trans_b=True, out=dx)
        return self._input_dropout_backward(dx)

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        return self.backward_preout(self._activation_backward(self.z, self.y, dy), need_dx)


class OutputRuntime:
    """Loss on top of a pre-activation: OutputLayer (dense preout) and LossLayer (input as preout).

    ``forward`` returns the activated output; ``loss`` computes per-example scores and dL/dpreout
    divided by ``n_examples`` (DL4J: the score is the mean over the minibatch) and multiplied by the
    loss scale of fp16 training.
    """

    def __init__(self, conf: Any, dense: DenseRuntime | None, device: Device) -> None:
        self.conf = conf
        self.xp, self.k = device.xp, device.kernels
        self.dense = dense
        self.activation = conf.activation
        self.alpha = activation_alpha(conf.activation)
        self._buffers: dict[str, np.ndarray] = {}

    def buf(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        arr = self._buffers.get(name)
        if arr is None or arr.shape != shape:
            arr = self.xp.empty(shape, dtype=dtype)
            self._buffers[name] = arr
        return arr

    def preout(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.z = self.dense.preout(x, train, seed) if self.dense is not None else x
        return self.z

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        z = self.preout(x, train, seed)
        y = self.buf("y", z.shape, z.dtype)
        self.k.activation_forward(self.activation.value, z, y, alpha=self.alpha)
        return y

    def scores(self, labels: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """Per-example loss of the last ``preout`` (sum over columns, masked)."""
        out = self.buf("scores", (self.z.shape[0],), self.z.dtype)
        self.k.loss_score(
            self.conf.loss.value, self.activation.value, labels, self.z, out, mask=mask, alpha=self.alpha
        )
        return out

    def backward(
        self,
        labels: np.ndarray,
        mask: np.ndarray | None,
        n_examples: int,
        need_dx: bool,
        loss_scale: float = 1.0,
    ) -> np.ndarray | None:
        """dL/dpreout of the mean loss times ``loss_scale``, pushed through the dense part; returns dL/dx
        or None."""
        dz = self.buf("dz", self.z.shape, self.z.dtype)
        self.k.loss_gradient(
            self.conf.loss.value, self.activation.value, labels, self.z, dz, mask=mask, alpha=self.alpha
        )
        dz *= loss_scale / n_examples
        if self.dense is None:
            return dz
        return self.dense.backward_preout(dz, need_dx)


class ConvolutionRuntime(LayerRuntime):
    """ConvolutionLayer over NCHW input."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        c, it = self.conf, self.input_type
        self.p, self.q, self.pad_top, self.pad_left = L.spatial_output(0, c, it)
        self.stride = tuple(c.stride)

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x = self._input_dropout(x, train, seed)
        shape = (x.shape[0], self.conf.n_out, self.p, self.q)
        bias = self.params[L.BIAS] if self.conf.has_bias else None
        geometry = (*self.stride, self.pad_top, self.pad_left)
        if self.activation in _FUSED_CONV_ACTIVATIONS:
            # The kernel applies the activation as it writes the output: no second sweep, and y stands in
            # for z in the backward (relu's derivative depends only on the sign, which y keeps).
            self.z = self.y = self.buf("y", shape)
            self.k.conv2d_forward(
                self.x, self.params[L.WEIGHT], bias, self.y, *geometry, activation=self.activation.value
            )
            return self.y
        self.z = self.buf("z", shape)
        self.k.conv2d_forward(self.x, self.params[L.WEIGHT], bias, self.z, *geometry)
        self.y = self._activate(self.z)
        return self.y

    def forward_folded(self, x: np.ndarray, bn: BatchNormRuntime, activation: Activation) -> np.ndarray:
        """Inference through this convolution, ``bn`` reading its output and ``activation`` (identity
        or relu) after it, as ONE convolution: the batch norm's per-channel scale
        ``s = gamma / sqrt(var + eps)`` multiplies the weights, its shift becomes the bias
        ``(b - mean) s + beta``, and the activation runs in the kernel's epilogue. The folded weights
        are recomputed every call (K*C*R*S values), so they always follow the parameters."""
        xp, w, p = self.xp, self.params[L.WEIGHT], bn.params
        # scale and shift in float64, rounded once, as batchnorm_forward_inference computes them
        scale = p[L.GAMMA].astype(np.float64) / xp.sqrt(p[L.RUNNING_VAR].astype(np.float64) + bn.conf.eps)
        shift = p[L.BETA] - p[L.RUNNING_MEAN].astype(np.float64) * scale
        if self.conf.has_bias:
            shift += self.params[L.BIAS] * scale
        folded_w, folded_b = self.buf("folded_w", w.shape), self.buf("folded_b", shift.shape)
        xp.multiply(w, scale.astype(self.dtype)[:, None, None, None], out=folded_w)
        folded_b[...] = shift
        y = self.buf("y", (x.shape[0], self.conf.n_out, self.p, self.q))
        geometry = (*self.stride, self.pad_top, self.pad_left)
        self.k.conv2d_forward(x, folded_w, folded_b, y, *geometry, activation=activation.value)
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        dz = self._activation_backward(self.z, self.y, dy)
        geometry = (*self.stride, self.pad_top, self.pad_left)
        self.k.conv2d_backward_weight(self.x, dz, self.grads[L.WEIGHT], *geometry)
        if self.conf.has_bias:
            self.k.bias_grad(dz, self.grads[L.BIAS])
        if not need_dx:
            return None
        dx = self.buf("dx", self.x.shape)
        self.k.conv2d_backward_input(dz, self.params[L.WEIGHT], dx, *geometry)
        return self._input_dropout_backward(dx)


class DeconvolutionRuntime(LayerRuntime):
    """Deconvolution2D over NCHW input, through the convolution's kernels with the roles swapped. The
    layer's weights (n_in, n_out, kh, kw) are a convolution's (K, C, R, S) for a convolution from the
    deconvolution's output (C = n_out channels) to its input (K = n_in): the forward is that
    convolution's input gradient, dL/dx its forward and dL/dW its weight gradient with dL/dy as its input
    and x as its output gradient (both from one im2col of dL/dy: conv2d_forward_backward_weight). A
    dilation above 1 runs the kernels with the weights spread out into a zero kernel of size (kh - 1) dh +
    1 by (kw - 1) dw + 1; the weight gradient is read back at the taps."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.p, self.q, self.pad_top, self.pad_left = self.conf.output_geometry(0, self.input_type)
        self.geometry = (*self.conf.stride, self.pad_top, self.pad_left)
        self.dilated = tuple(self.conf.dilation) != (1, 1)

    def _taps(self, full: np.ndarray) -> np.ndarray:
        """The entries of a spread-out kernel that are the layer's weights."""
        dh, dw = self.conf.dilation
        return full[:, :, ::dh, ::dw]

    def _weights(self) -> np.ndarray:
        w = self.params[L.WEIGHT]
        if not self.dilated:
            return w
        (kh, kw), (dh, dw) = self.conf.kernel_size, self.conf.dilation
        full = self.buf("w_dilated", (*w.shape[:2], (kh - 1) * dh + 1, (kw - 1) * dw + 1))
        full.fill(0)
        self._taps(full)[...] = w
        return full

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x = self._input_dropout(x, train, seed)
        shape = (x.shape[0], self.conf.n_out, self.p, self.q)
        bias = self.params[L.BIAS] if self.conf.has_bias else None
        if self.activation in _FUSED_CONV_ACTIVATIONS:
            # as in ConvolutionRuntime: the bias and activation are applied as the kernel writes y
            self.z = self.y = self.buf("y", shape)
            self.k.conv2d_backward_input(
                self.x, self._weights(), self.y, *self.geometry, b=bias, activation=self.activation.value
            )
            return self.y
        self.z = self.buf("z", shape)
        self.k.conv2d_backward_input(self.x, self._weights(), self.z, *self.geometry, b=bias)
        self.y = self._activate(self.z)
        return self.y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        dz = self._activation_backward(self.z, self.y, dy)
        w = self._weights()
        dw = self.buf("dw_dilated", w.shape) if self.dilated else self.grads[L.WEIGHT]
        dx = self.buf("dx", self.x.shape) if need_dx else None
        # dL/dW and dL/dx from one im2col of dL/dy
        self.k.conv2d_forward_backward_weight(dz, w, self.x, dx, dw, *self.geometry)
        if self.dilated:
            self.grads[L.WEIGHT][...] = self._taps(dw)
        if self.conf.has_bias:
            self.k.bias_grad(dz, self.grads[L.BIAS])
        return None if dx is None else self._input_dropout_backward(dx)


class SubsamplingRuntime(LayerRuntime):
    """SubsamplingLayer: windowed max / average pooling."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        c = self.conf
        self.p, self.q, pad_top, pad_left = L.spatial_output(0, c, self.input_type)
        self.kind = c.pooling_type.value
        self.geometry = (*c.kernel_size, *c.stride, pad_top, pad_left)

    def _argmax(self, shape: tuple[int, ...]) -> np.ndarray | None:
        return self.buf("argmax", shape, np.int64) if self.kind == "max" else None

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x_shape = x.shape
        y = self.buf("y", (x.shape[0], x.shape[1], self.p, self.q))
        self.k.pool2d_forward(self.kind, x, y, *self.geometry, argmax=self._argmax(y.shape))
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        dx = self.buf("dx", self.x_shape)
        self.k.pool2d_backward(self.kind, dy, dx, *self.geometry, argmax=self._argmax(dy.shape))
        return dx


class GlobalPoolingRuntime(LayerRuntime):
    """GlobalPoolingLayer: (N, C, H, W) -> (N, C)."""

    def _argmax(self, shape: tuple[int, ...]) -> np.ndarray | None:
        return self.buf("argmax", shape, np.int64) if self.conf.pooling_type.value == "max" else None

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x_shape = x.shape
        y = self.buf("y", x.shape[:2])
        self.k.global_pool_forward(self.conf.pooling_type.value, x, y, argmax=self._argmax(y.shape))
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        dx = self.buf("dx", self.x_shape)
        self.k.global_pool_backward(self.conf.pooling_type.value, dy, dx, argmax=self._argmax(dy.shape))
        return dx


class Upsampling2DRuntime(LayerRuntime):
    """Upsampling2D: every pixel repeated (rows, columns) times; the backward sums each block."""

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        n, c, h, w = x.shape
        sh, sw = self.conf.size
        self.x_shape = x.shape
        y = self.buf("y", (n, c, h, sh, w, sw))
        y[...] = x[:, :, :, None, :, None]
        return y.reshape(n, c, h * sh, w * sw)

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        n, c, h, w = self.x_shape
        sh, sw = self.conf.size
        return dy.reshape(n, c, h, sh, w, sw).sum(axis=(3, 5))


class _Window2DCopyRuntime(LayerRuntime):
    """ZeroPaddingLayer and Cropping2D: the smaller of input and output is the window at (top, left) of
    the larger; padding writes its input there in a zeroed output, cropping reads it (each is the other's
    backward)."""

    edges = "padding"  # the config field holding (top, bottom, left, right)

    def _window(self, small_hw: tuple[int, ...]) -> tuple[slice, slice]:
        top, _, left, _ = getattr(self.conf, self.edges)
        return slice(top, top + small_hw[0]), slice(left, left + small_hw[1])

    def _put(self, small: np.ndarray, large_hw: tuple[int, ...], name: str) -> np.ndarray:
        out = self.buf(name, (*small.shape[:2], *large_hw))
        out.fill(0)
        rows, cols = self._window(small.shape[2:])
        out[:, :, rows, cols] = small
        return out

    def _take(self, large: np.ndarray, small_hw: tuple[int, ...], name: str) -> np.ndarray:
        out = self.buf(name, (*large.shape[:2], *small_hw))
        rows, cols = self._window(small_hw)
        out[...] = large[:, :, rows, cols]
        return out

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x_shape = x.shape
        out_hw = self.conf.output_hw(*x.shape[2:])
        return self._put(x, out_hw, "y") if self.edges == "padding" else self._take(x, out_hw, "y")

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        hw = self.x_shape[2:]
        return self._take(dy, hw, "dx") if self.edges == "padding" else self._put(dy, hw, "dx")


class ZeroPaddingRuntime(_Window2DCopyRuntime):
    edges = "padding"


class Cropping2DRuntime(_Window2DCopyRuntime):
    edges = "cropping"


class BatchNormRuntime(LayerRuntime):
    """BatchNormalization. Training writes the new running statistics to ``new_mean``/``new_var``
    (not into the parameters): the network turns them into the update ``old - new``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        c, xp = (self.conf.n_in,), self.xp
        self.new_mean = xp.empty(c, dtype=self.dtype)
        self.new_var = xp.empty(c, dtype=self.dtype)
        self.batch_mean = xp.empty(c, dtype=self.dtype)
        self.batch_var = xp.empty(c, dtype=self.dtype)

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        p, eps = self.params, self.conf.eps
        self.x = x
        y = self.buf("y", x.shape)
        if train:
            self.xp.copyto(self.new_mean, p[L.RUNNING_MEAN])
            self.xp.copyto(self.new_var, p[L.RUNNING_VAR])
            self.k.batchnorm_forward_train(
                x, p[L.GAMMA], p[L.BETA], y, self.batch_mean, self.batch_var,
                self.new_mean, self.new_var, self.conf.decay, eps,
            )  # fmt: skip
        else:
            self.k.batchnorm_forward_inference(
                x, p[L.GAMMA], p[L.BETA], p[L.RUNNING_MEAN], p[L.RUNNING_VAR], y, eps
            )
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        dx = self.buf("dx", self.x.shape)
        self.k.batchnorm_backward(
            self.x, dy, self.params[L.GAMMA], self.batch_mean, self.batch_var,
            dx, self.grads[L.GAMMA], self.grads[L.BETA], self.conf.eps,
        )  # fmt: skip
        return dx if need_dx else None


class LayerNormRuntime(LayerRuntime):
    """LayerNormalization of (N, C) rows (every time step's row on sequences) through the native kernels."""

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x = self.xp.ascontiguousarray(x)
        rows = x.shape[0]
        y = self.buf("y", x.shape)
        self.mean, self.rstd = self.buf("mean", (rows,)), self.buf("rstd", (rows,))
        bias = self.params[L.BIAS] if self.conf.has_bias else None
        self.k.layer_norm_forward(
            self.x, self.params[L.LAYER_NORM_GAIN], bias, y, self.mean, self.rstd, eps=self.conf.eps
        )
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        dx = self.buf("dx", self.x.shape)
        dbias = self.grads[L.BIAS] if self.conf.has_bias else None
        self.k.layer_norm_backward(
            self.x, dy, self.params[L.LAYER_NORM_GAIN], self.mean, self.rstd,
            dx, self.grads[L.LAYER_NORM_GAIN], dbias,
        )  # fmt: skip
        return dx if need_dx else None


class DropoutRuntime(LayerRuntime):
    """DropoutLayer: inverted dropout in training, identity in inference."""

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        return self._input_dropout(x, train, seed)

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        return self._input_dropout_backward(dy) if need_dx else None


class ActivationRuntime(LayerRuntime):
    """ActivationLayer."""

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.x = x
        self.y = self._activate(x)
        return self.y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        return self._activation_backward(self.x, self.y, dy) if need_dx else None


class EmbeddingRuntime(LayerRuntime):
    """EmbeddingLayer, and EmbeddingSequenceLayer at every time step: ``z = W[index] + b``.

    The weight gradient is row-sparse: a backward zeroes only the rows the previous one wrote, when the
    network says (``grad_clean``) that nothing else wrote the table's gradient since, else the whole
    table, then adds the batch's rows. ``touched`` holds the sorted distinct rows of the last backward.
    ``where`` is the unit's key (layer index or vertex name), named in errors.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.where: Any = "?"
        self.touched: Any = None
        self.grad_clean = False

    def _indices(self, x: np.ndarray) -> np.ndarray:
        """The (N,) int64 indices of (N, 1) input: integer arrays as they are, floats that hold integers."""
        flat = x.reshape(-1)
        if flat.dtype.kind in "iu":
            return self.xp.ascontiguousarray(flat, dtype=np.int64)
        with np.errstate(invalid="ignore"):  # nan and huge values: caught just below
            idx = flat.astype(np.int64)
        exact = self.xp.isfinite(flat) & (idx == flat)
        if not bool(exact.all()):
            pos = int(self.xp.argmin(exact))
            raise L.layer_error(
                self.where,
                self.conf,
                "input",
                f"index {float(flat[pos])!r} at position {pos} is not an integer",
            )
        return idx

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        self.idx = self._indices(x)
        self.z = self.buf("z", (self.idx.shape[0], self.conf.n_out))
        try:
            self.k.embedding_forward(self.idx, self.params[L.WEIGHT], self.z)
        except ValueError as e:  # "[embedding_forward] index 7 at position 3 is outside [0, 5)"
            raise L.layer_error(self.where, self.conf, "input", str(e).split("] ", 1)[-1]) from None
        if self.conf.has_bias:
            self.k.bias_add(self.z, self.params[L.BIAS])
        self.y = self._activate(self.z)
        return self.y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        """Writes the table's gradient (rows outside the batch zero) and the bias's; indices have no
        gradient, so this returns None."""
        dz = self._activation_backward(self.z, self.y, dy)
        gw = self.grads[L.WEIGHT]
        if self.grad_clean and self.touched is not None:
            gw[self.touched] = 0
        else:
            gw.fill(0)
        self.k.embedding_backward(self.idx, dz, gw)
        self.touched = self.xp.unique(self.idx)
        self.grad_clean = False  # until the network says its step wrote no other row
        if self.conf.has_bias:
            self.k.bias_grad(dz, self.grads[L.BIAS])
        return None


def index_dtype(layer: Any, features: Any, dtype: np.dtype) -> Any:
    """The dtype network input ``features`` takes on the device when ``layer`` reads it: for an embedding
    layer int64 if they are integers (exact for any table) and float64 otherwise (integers exact up to
    2**53; the layer checks that they are integers), else the network's ``dtype``."""
    if not layer.takes_indices:
        return dtype
    kind = np.dtype(getattr(features, "dtype", np.float64)).kind
    return np.int64 if kind in "iub" else np.float64


class InferenceFold:
    """A ConvolutionLayer, the BatchNormalization that alone reads its output and, when the batch norm
    feeds only an identity or relu ActivationLayer, that activation: in inference (not training) they
    run as one convolution (:meth:`ConvolutionRuntime.forward_folded`), with no batch-norm or
    activation sweep over the output. ``absorbed``: the keys of the units whose forward it does."""

    def __init__(
        self, conv: ConvolutionRuntime, bn: BatchNormRuntime, activation: Activation, absorbed: tuple
    ) -> None:
        self.conv, self.bn, self.activation, self.absorbed = conv, bn, activation, absorbed

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.conv.forward_folded(x, self.bn, self.activation)


def inference_folds(
    units: list[tuple[Any, Any, InputType]], runtimes: list[Any], sole_consumer: dict[Any, Any]
) -> dict[Any, InferenceFold]:
    """The convolution + batch-norm (+ activation) folds of a network, keyed by the convolution's unit.

    Args:
        units: (key, layer config, input type) of every layer, as the network lays them out.
        runtimes: their runtimes, in the same order.
        sole_consumer: for a unit whose output one layer alone reads (and nothing else: no vertex, no
            network output), that layer's key.

    Returns:
        {convolution key: fold}: convolutions over images (not per time step of a sequence) with the
        identity activation, whose output only a BatchNormalization reads.
    """
    by_key = {key: (layer, rt) for (key, layer, _), rt in zip(units, runtimes)}
    folds: dict[Any, InferenceFold] = {}
    for (key, layer, input_type), rt in zip(units, runtimes):
        if not (
            isinstance(layer, L.ConvolutionLayer)
            and input_type.kind == "convolutional"
            and rt.activation is Activation.IDENTITY
            and key in sole_consumer
        ):
            continue
        bn_key = sole_consumer[key]
        bn_layer, bn = by_key[bn_key]
        if not isinstance(bn_layer, L.BatchNormalization):
            continue
        act_key = sole_consumer.get(bn_key)
        act_layer, act = by_key.get(act_key, (None, None))
        if isinstance(act_layer, L.ActivationLayer) and act.activation in _FUSED_CONV_ACTIVATIONS:
            folds[key] = InferenceFold(rt, bn, act.activation, (bn_key, act_key))
        else:
            folds[key] = InferenceFold(rt, bn, Activation.IDENTITY, (bn_key,))
    return folds


def _row_kernel(arr: Any) -> Any:
    """A 1-D convolution's (n_out, n_in, k, 1) weights as the (n_out, n_in, 1, k) of a 2-D one (a view);
    other arrays as they are."""
    return arr.reshape(*arr.shape[:2], 1, arr.shape[2]) if arr.ndim == 4 else arr


class _Time1DRuntime(SequenceRuntime):
    """Base of the 1-D layers' runtimes: their forward sets ``mask``, the mask of their output."""

    mask: Any = None

    def output_mask(self, mask: Any) -> Any:
        return self.mask


class Window1DRuntime(_Time1DRuntime):
    """Convolution1DLayer / Subsampling1DLayer: the runtime of the 2-D layer they run as (``as_2d``) over
    the (N, C, 1, T) view of the (N, T, C) sequence, rebuilt when the number of steps changes; the mask
    reduced with the layer's window as DL4J does (``ConvolutionUtils.cnn1dMaskReduction``: unchanged for
    same mode with stride 1, else max-pooled, padding reading zero) multiplies the output and goes on."""

    reads_strided = True  # takes dL/dy as a view (layer_backward makes no contiguous copy)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.inner_conf = self.conf.as_2d()
        self.inner: Any = None
        self.steps = 0
        # set by MultiLayerNetwork when the next layer reads strided sequences (another 1-D window layer,
        # global pooling): the output is then the (N, T, C) view of the inner (N, C, T) one, no copy
        self.hands_channel_major = False
        # set when the layer below is a 1-D window layer: dL/dx goes back as such a view as well
        self.returns_channel_major_dx = False

    def _inner_for(self, t: int) -> Any:
        if self.inner is None or self.steps != t:
            c = self.conf
            if c.time_output(t) < 1:
                raise ValueError(
                    f"features: {type(c).__name__} (kernel_size {c.kernel_size}, padding {c.padding}) does "
                    f"not fit sequences of {t} time steps"
                )
            it = InputType.convolutional(1, t, self.input_type.size)
            cls = _RUNTIMES[type(self.inner_conf)]
            # W (n_out, n_in, k, 1) seen as the 2-D layer's (n_out, n_in, 1, k): the same memory
            params, grads = ({k: _row_kernel(v) for k, v in d.items()} for d in (self.params, self.grads))
            self.inner = cls(self.inner_conf, it, self.activation, self.dtype, params, grads, self.device)
            self.steps = t
        return self.inner

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
        inner = self._inner_for(t)
        channel_major = x.transpose(0, 2, 1)
        if channel_major.flags.c_contiguous:  # the view a 1-D window layer below handed on
            x4 = channel_major.reshape(n, c, 1, t)
        else:
            x4 = self.buf("x4", (n, c, 1, t))  # the inner runtime keeps it for its backward
            self.k.swap_last_axes(self.xp.ascontiguousarray(x), x4.reshape(n, c, t))
        y4 = inner.forward(x4, train, seed)
        self.y4_shape = y4.shape
        if self.hands_channel_major and mask is None:
            self.mask = None  # not an earlier call's: the backward reads it
            return y4.reshape(n, y4.shape[1], y4.shape[3]).transpose(0, 2, 1)
        y = self.buf("y", (n, y4.shape[3], y4.shape[1]))
        self.k.swap_last_axes(self.xp.ascontiguousarray(y4).reshape(n, y4.shape[1], y4.shape[3]), y)
        self.mask = self._reduce_mask(mask, n, t, y.shape[1])
        if self.mask is not None:
            y *= self.mask[:, :, None]
        return y

    def _reduce_mask(self, mask: Any, n: int, t: int, steps: int) -> Any:
        c = self.conf
        if mask is None or (c.convolution_mode is L.ConvolutionMode.SAME and c.stride == 1):
            return mask
        _, pad = L.conv_output_size(t, c.kernel_size, c.stride, c.padding, c.convolution_mode)
        # zero-padded so that a window of padding only (padding >= kernel_size) is absent
        padded = self.buf("mask_padded", (n, 1, 1, max(pad + t, (steps - 1) * c.stride + c.kernel_size)))
        padded.fill(0)
        padded[:, 0, 0, pad : pad + t] = mask
        out = self.buf("mask_out", (n, steps))
        self.k.pool2d_forward(
            "max", padded, out.reshape(n, 1, 1, steps), 1, c.kernel_size, 1, c.stride, 0, 0,
            argmax=self.buf("mask_argmax", (n, 1, 1, steps), np.int64),
        )  # fmt: skip
        return out

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if self.mask is not None:  # masked output steps pass no gradient
            dy = dy * self.mask[:, :, None]
        n, c_out, _, t_out = self.y4_shape
        dy4 = self.buf("dy4", self.y4_shape)  # its own copy: the inner backward overwrites it
        channel_major = dy.transpose(0, 2, 1)
        if channel_major.flags.c_contiguous:  # the view a 1-D window layer above handed back
            dy4.reshape(n, c_out, t_out)[...] = channel_major
        else:
            self.k.swap_last_axes(self.xp.ascontiguousarray(dy), dy4.reshape(n, c_out, t_out))
        dx4 = self.inner.backward(dy4, need_dx)
        if dx4 is None:
            return None
        n, c, _, t = dx4.shape
        if self.returns_channel_major_dx:
            return dx4.reshape(n, c, t).transpose(0, 2, 1)
        dx = self.buf("dx", (n, t, c))
        self.k.swap_last_axes(self.xp.ascontiguousarray(dx4).reshape(n, c, t), dx)
        return dx


_RUNTIMES = {
    L.DenseLayer: DenseRuntime,
    L.OutputLayer: DenseRuntime,
    L.RnnOutputLayer: DenseRuntime,
    L.ConvolutionLayer: ConvolutionRuntime,
    L.Deconvolution2D: DeconvolutionRuntime,
    L.SubsamplingLayer: SubsamplingRuntime,
    L.GlobalPoolingLayer: GlobalPoolingRuntime,
    L.BatchNormalization: BatchNormRuntime,
    L.LayerNormalization: LayerNormRuntime,
    L.DropoutLayer: DropoutRuntime,
    L.ActivationLayer: ActivationRuntime,
    L.EmbeddingLayer: EmbeddingRuntime,
    L.EmbeddingSequenceLayer: EmbeddingRuntime,
    L.Upsampling2D: Upsampling2DRuntime,
    L.ZeroPaddingLayer: ZeroPaddingRuntime,
    L.Cropping2D: Cropping2DRuntime,
}


class Upsampling1DRuntime(_Time1DRuntime):
    """Upsampling1D: every step and its mask value repeated ``size`` times; the backward sums the repeats."""

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
        size = self.conf.size
        self.x_shape = x.shape
        y = self.buf("y", (n, t, size, c))
        y[...] = x[:, :, None, :]
        self.mask = None if mask is None else self.xp.repeat(mask, size, axis=1)
        return y.reshape(n, t * size, c)

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        n, t, c = self.x_shape
        return dy.reshape(n, t, self.conf.size, c).sum(axis=2)


class ZeroPadding1DRuntime(_Time1DRuntime):
    """ZeroPadding1DLayer: zero steps before and after; the added steps are absent in the mask."""

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
        left, right = self.conf.padding
        self.t = t
        y = self.buf("y", (n, left + t + right, c))
        y.fill(0)
        y[:, left : left + t] = x
        self.mask = None
        if mask is not None:
            self.mask = self.buf("mask", (n, left + t + right))
            self.mask.fill(0)
            self.mask[:, left : left + t] = mask
        return y

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        left = self.conf.padding[0]
        return self.xp.ascontiguousarray(dy[:, left : left + self.t])


class FrozenRuntime:
    """A FrozenLayer's runtime: the wrapped layer's, always forward in inference mode (no dropout, batch
    norm on its running statistics). The networks never run its backward (a frozen layer passes no
    gradient back), so its gradient views stay zero; everything else reads through to the wrapped
    runtime."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def forward(self, x: np.ndarray, train: bool, seed: int, **sequence: Any) -> np.ndarray:
        return self.inner.forward(x, False, seed, **sequence)

    def __getattr__(self, name: str) -> Any:
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


# The 1-D layers over sequences and the attention layers (sequence runtimes of their own, the latter in
# sparkgrad.nn._attention: the other sequence layers are in sparkgrad.nn._recurrent). Upsampling and
# padding are copies, done by the array module of the device.
_TIME_RUNTIMES = {
    L.Convolution1DLayer: Window1DRuntime,
    L.Subsampling1DLayer: Window1DRuntime,
    L.Upsampling1D: Upsampling1DRuntime,
    L.ZeroPadding1DLayer: ZeroPadding1DRuntime,
    **ATTENTION_RUNTIMES,
}


def build_runtime(
    conf: Any,
    input_type: InputType,
    activation: Activation | None,
    dtype: np.dtype,
    params: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    device: Device,
) -> Any:
    """The runtime object for one layer config (output layers are wrapped in an OutputRuntime, frozen
    layers in a FrozenRuntime), computing on ``device`` over the parameter and gradient views (arrays of
    that device)."""
    if isinstance(conf, L.FrozenLayer):
        return FrozenRuntime(build_runtime(conf.layer, input_type, activation, dtype, params, grads, device))
    if isinstance(conf, L.LossLayer):
        return OutputRuntime(conf, None, device)
    if input_type.kind == "recurrent":
        if type(conf) in _TIME_RUNTIMES:
            return _TIME_RUNTIMES[type(conf)](conf, input_type, activation, dtype, params, grads, device)
        if conf.takes_sequences:  # whole sequences plus the features mask
            return build_sequence_runtime(conf, input_type, activation, dtype, params, grads, device)
        input_type = input_type.step_type()  # the layer runs at every time step
    runtime = _RUNTIMES[type(conf)](conf, input_type, activation, dtype, params, grads, device)
    return OutputRuntime(conf, runtime, device) if isinstance(conf, L.OutputLayer) else runtime


__all__ = [
    "EmbeddingRuntime",
    "FrozenRuntime",
    "InferenceFold",
    "index_dtype",
    "OutputRuntime",
    "build_runtime",
    "inference_folds",
]
