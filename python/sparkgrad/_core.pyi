# Generated from the built module (CPU build; the cuda_* entry points exist there too and raise):
#   PYTHONPATH=python pybind11-stubgen sparkgrad._core -o <dir> --numpy-array-use-type-var
# then ruff format. tests/python/test_typing.py checks it names exactly the functions the module has.
"""
sparkgrad native core (private; use the sparkgrad package)
"""

from __future__ import annotations

import typing

import numpy
import numpy.typing
import typing_extensions

__all__: list[str] = [
    "BOUND_BLOCK",
    "BOUND_GROUP",
    "accumulate",
    "activation_backward",
    "activation_forward",
    "apply_weight_decay",
    "attention_backward",
    "attention_forward",
    "batchnorm_backward",
    "batchnorm_forward_inference",
    "batchnorm_forward_train",
    "bias_add",
    "bias_grad",
    "bitmap_encode",
    "blas_info",
    "bounds_length",
    "clip",
    "conv2d_backward_input",
    "conv2d_backward_weight",
    "conv2d_forward",
    "conv2d_forward_backward_weight",
    "cuda_accumulate",
    "cuda_available",
    "cuda_bitmap_encode",
    "cuda_built",
    "cuda_clip",
    "cuda_decode",
    "cuda_devices",
    "cuda_encode_smaller",
    "cuda_message_entries",
    "cuda_precision",
    "cuda_set_precision",
    "cuda_set_stream",
    "cuda_set_sync_each_op",
    "cuda_subtract_sparse",
    "cuda_sync_each_op",
    "cuda_threshold_encode",
    "decode",
    "dropout_backward",
    "dropout_forward",
    "elementwise_backward",
    "elementwise_forward",
    "embedding_backward",
    "embedding_forward",
    "encode_smaller",
    "gemm",
    "global_pool_backward",
    "global_pool_forward",
    "gru_backward",
    "gru_forward",
    "l2_distance_backward",
    "l2_distance_forward",
    "l2_normalize_backward",
    "l2_normalize_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "loss_gradient",
    "loss_score",
    "lstm_backward",
    "lstm_forward",
    "max_threads",
    "openmp_version",
    "pack_message",
    "pool2d_backward",
    "pool2d_forward",
    "regularize_gradient",
    "residual_bounds",
    "scale_shift",
    "set_num_threads",
    "simple_rnn_backward",
    "simple_rnn_forward",
    "subtract_sparse",
    "swap_last_axes",
    "threshold_encode",
    "unpack_message",
    "updater_apply",
    "updater_state_size",
]

def accumulate(
    residual: typing.Any,
    update: typing.Any,
    scale: typing.SupportsFloat | typing.SupportsIndex = 1.0,
    at: typing.Any = None,
) -> None:
    """
    residual += scale * update (the product rounded, then added); with `at` (int64 indices) only there.
    """

def activation_backward(
    name: str,
    x: typing.Any,
    y: typing.Any,
    dy: typing.Any,
    dx: typing.Any,
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    dx = dL/dx from x, y = f(x) and dy = dL/dy. dx may be dy.
    """

def activation_forward(
    name: str, x: typing.Any, y: typing.Any, alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0
) -> None:
    """
    y = f(x); softmax over axis 1 of a 2-D array. y may be x.
    """

def apply_weight_decay(
    params: typing.Any, update: typing.Any, coeff: typing.SupportsFloat | typing.SupportsIndex
) -> None:
    """
    update += coeff * params, in place.
    """

def attention_backward(
    q: typing.Any,
    k: typing.Any,
    v: typing.Any,
    weights: typing.Any,
    dy: typing.Any,
    dweights: typing.Any,
    dq: typing.Any,
    dk: typing.Any,
    dv: typing.Any,
    heads: typing.SupportsInt | typing.SupportsIndex,
    scale: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    Backward of attention_forward given its weights and dy (N, TQ, heads*DV): writes dq, dk, dv (dweights is scratch, shaped as weights).
    """

def attention_forward(
    q: typing.Any,
    k: typing.Any,
    v: typing.Any,
    weights: typing.Any,
    y: typing.Any,
    heads: typing.SupportsInt | typing.SupportsIndex,
    scale: typing.SupportsFloat | typing.SupportsIndex,
    mask: typing.Any = None,
) -> None:
    """
    Multi-head dot-product attention: per example and head, weights (N, heads, TQ, TK) = softmax(scale q k^T) over the keys whose mask (N, TK) is non-zero (masked keys 0; none present: all 0), y = weights v. Heads interleaved in the last axis: q (N, TQ, heads*D), k (N, TK, heads*D), v (N, TK, heads*DV), y (N, TQ, heads*DV).
    """

def batchnorm_backward(
    x: typing.Any,
    dy: typing.Any,
    gamma: typing.Any,
    batch_mean: typing.Any,
    batch_var: typing.Any,
    dx: typing.Any,
    dgamma: typing.Any,
    dbeta: typing.Any,
    eps: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    dx, dgamma, dbeta of the training-mode forward.
    """

def batchnorm_forward_inference(
    x: typing.Any,
    gamma: typing.Any,
    beta: typing.Any,
    running_mean: typing.Any,
    running_var: typing.Any,
    y: typing.Any,
    eps: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    Normalizes x with the running statistics.
    """

def batchnorm_forward_train(
    x: typing.Any,
    gamma: typing.Any,
    beta: typing.Any,
    y: typing.Any,
    batch_mean: typing.Any,
    batch_var: typing.Any,
    running_mean: typing.Any,
    running_var: typing.Any,
    decay: typing.SupportsFloat | typing.SupportsIndex,
    eps: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    Normalizes x with its per-channel batch statistics; updates the running averages in place.
    """

def bias_add(x: typing.Any, b: typing.Any) -> None:
    """
    x[n, c, ...] += b[c] in place; x: (N, C) or (N, C, H, W).
    """

def bias_grad(dy: typing.Any, db: typing.Any) -> None:
    """
    db[c] = sum of dy over every axis but 1.
    """

def bitmap_encode(
    residual: typing.Any, threshold: typing.SupportsFloat | typing.SupportsIndex
) -> tuple[numpy.typing.NDArray[numpy.int32], int]:
    """
    Bitmap encoding of `residual` (modified in place).
    """

def blas_info() -> str:
    """
    OpenBLAS configuration string.
    """

def bounds_length(n: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Elements of the bounds of a residual of n elements: one per BOUND_BLOCK, then one per group.
    """

def clip(
    residual: typing.Any, limit: typing.SupportsFloat | typing.SupportsIndex, bounds: typing.Any = None
) -> None:
    """
    residual = clip(residual, -limit, limit). With `bounds` (residual_bounds, holding) only the blocks whose bound reaches the limit are read, and their bounds become the limit.
    """

def conv2d_backward_input(
    dy: typing.Any,
    w: typing.Any,
    dx: typing.Any,
    stride_h: typing.SupportsInt | typing.SupportsIndex,
    stride_w: typing.SupportsInt | typing.SupportsIndex,
    pad_top: typing.SupportsInt | typing.SupportsIndex,
    pad_left: typing.SupportsInt | typing.SupportsIndex,
    algorithm: str = "auto",
    b: typing.Any = None,
    activation: str = "identity",
) -> None:
    """
    dx (N, C, H, W) = activation(conv-input-gradient(dy (N, K, P, Q), w (K, C, R, S)) + b (C)): a transposed convolution's forward. activation: identity or relu (fused).
    """

def conv2d_backward_weight(
    x: typing.Any,
    dy: typing.Any,
    dw: typing.Any,
    stride_h: typing.SupportsInt | typing.SupportsIndex,
    stride_w: typing.SupportsInt | typing.SupportsIndex,
    pad_top: typing.SupportsInt | typing.SupportsIndex,
    pad_left: typing.SupportsInt | typing.SupportsIndex,
    algorithm: str = "auto",
) -> None:
    """
    dw (K, C, R, S) from x (N, C, H, W) and dy (N, K, P, Q), summed over the batch.
    """

def conv2d_forward(
    x: typing.Any,
    w: typing.Any,
    b: typing.Any,
    y: typing.Any,
    stride_h: typing.SupportsInt | typing.SupportsIndex,
    stride_w: typing.SupportsInt | typing.SupportsIndex,
    pad_top: typing.SupportsInt | typing.SupportsIndex,
    pad_left: typing.SupportsInt | typing.SupportsIndex,
    activation: str = "identity",
    algorithm: str = "auto",
) -> None:
    """
    y (N, K, P, Q) = activation(conv(x (N, C, H, W), w (K, C, R, S)) + b); padding reads zeros. activation: identity or relu (fused). algorithm: auto (per shape and device), im2col, winograd (CPU; 3x3, stride 1, padding <= 2) or cudnn (GPU).
    """

def conv2d_forward_backward_weight(
    x: typing.Any,
    w: typing.Any,
    dy: typing.Any,
    y: typing.Any,
    dw: typing.Any,
    stride_h: typing.SupportsInt | typing.SupportsIndex,
    stride_w: typing.SupportsInt | typing.SupportsIndex,
    pad_top: typing.SupportsInt | typing.SupportsIndex,
    pad_left: typing.SupportsInt | typing.SupportsIndex,
    algorithm: str = "auto",
) -> None:
    """
    conv2d_forward(x, w, None, y) (y may be None: skipped) and conv2d_backward_weight(x, dy, dw) from one im2col of x: a transposed convolution's backward (its dL/dx and dL/dW). The same results as the two calls.
    """

def cuda_accumulate(
    residual: typing.SupportsInt | typing.SupportsIndex,
    update: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
) -> None: ...
def cuda_available() -> bool:
    """
    True if built with CUDA and a GPU is visible.
    """

def cuda_bitmap_encode(
    x: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
    threshold: typing.SupportsFloat | typing.SupportsIndex,
    out: typing.SupportsInt | typing.SupportsIndex,
) -> int: ...
def cuda_built() -> bool:
    """
    True in a CUDA build of the extension.
    """

def cuda_clip(
    residual: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
    limit: typing.SupportsFloat | typing.SupportsIndex,
) -> None: ...
def cuda_decode(
    message: typing.SupportsInt | typing.SupportsIndex,
    length: typing.SupportsInt | typing.SupportsIndex,
    target: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
    flag: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def cuda_devices() -> list:
    """
    The GPUs the CUDA runtime sees: index, name, compute_capability, total_memory (bytes).
    """

def cuda_encode_smaller(
    x: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
    threshold: typing.SupportsFloat | typing.SupportsIndex,
) -> tuple[numpy.typing.NDArray[numpy.int32], bool]:
    """
    encode_smaller of a device residual: (host message, is_bitmap).
    """

def cuda_message_entries(message: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Word 0 of a device message once the current stream has run.
    """

def cuda_precision() -> str:
    """
    The calling thread's GEMM precision on the current GPU ('float32' until set).
    """

def cuda_set_precision(precision: str) -> None:
    """
    Sets the calling thread's precision of float32 GEMMs on the current GPU: 'float32', 'bf16' or 'fp16' (tensor cores, operands losing at most what 16 bits lose, float32 accumulation and output). The CPU build keeps the value per thread; its kernels ignore it.
    """

def cuda_set_stream(stream: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Runs the calling thread's CUDA ops on the current device on this stream (a raw cudaStream_t). The kernels take CuPy's current stream themselves; the compress codecs' raw cuda_* entry points need this first (sparkgrad.cuda.launch). No-op in the CPU build.
    """

def cuda_set_sync_each_op(on: bool) -> None:
    """
    Debug switch: every CUDA op waits for the device before it returns.
    """

def cuda_subtract_sparse(
    message: typing.SupportsInt | typing.SupportsIndex,
    length: typing.SupportsInt | typing.SupportsIndex,
    target: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
) -> None: ...
def cuda_sync_each_op() -> bool:
    """
    Whether every CUDA op waits for the device.
    """

def cuda_threshold_encode(
    x: typing.SupportsInt | typing.SupportsIndex,
    n: typing.SupportsInt | typing.SupportsIndex,
    dtype: numpy.dtype[typing.Any],
    threshold: typing.SupportsFloat | typing.SupportsIndex,
    boundary: typing.SupportsInt | typing.SupportsIndex,
    message: typing.SupportsInt | typing.SupportsIndex,
) -> None:
    """
    Queues the sparse encoding of the first min(count, boundary) qualifying elements (boundary < 0: all) into message: (4 + min(n, boundary),) without waiting; word 0 holds the entry count once the stream has run.
    """

def decode(message: typing.Any, target: typing.Any, flag: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    target += decoded message after validation; flag 0 sparse, 1 bitmap, -1 either.
    """

def dropout_backward(dy: typing.Any, mask: typing.Any, dx: typing.Any) -> None:
    """
    dx = dy * mask.
    """

def dropout_forward(
    x: typing.Any,
    y: typing.Any,
    mask: typing.Any,
    retain: typing.SupportsFloat | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> None:
    """
    Inverted dropout: mask = 1/retain with probability retain else 0; y = x * mask.
    """

def elementwise_backward(kind: str, inputs: typing.Any, dy: typing.Any, dx: typing.Any) -> None:
    """
    dx[i] = dL/d inputs[i] from dy; max routes dy to the first maximal input.
    """

def elementwise_forward(kind: str, inputs: typing.Any, y: typing.Any) -> None:
    """
    y = add / subtract / product / average / max of the same-shape arrays in inputs (subtract: 2).
    """

def embedding_backward(indices: typing.Any, dy: typing.Any, dw: typing.Any) -> None:
    """
    dw[indices[i]] += dy[i] (accumulates; deterministic for any thread count); ValueError as embedding_forward.
    """

def embedding_forward(indices: typing.Any, w: typing.Any, y: typing.Any) -> None:
    """
    y (n, dim) = rows of w (vocab, dim) at indices (n,) int64; ValueError for an index outside [0, vocab).
    """

def encode_smaller(
    residual: typing.Any, threshold: typing.SupportsFloat | typing.SupportsIndex, bounds: typing.Any = None
) -> tuple[numpy.typing.NDArray[numpy.int32], bool]:
    """
    Encodes `residual` as whichever of sparse/bitmap is smaller; returns (message, is_bitmap). With `bounds` (residual_bounds) only the blocks whose bound reaches the threshold are read, and the bounds of the blocks encoded from are made exact.
    """

def gemm(
    a: typing.Any,
    b: typing.Any,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: typing.SupportsFloat | typing.SupportsIndex = 1.0,
    beta: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    out: typing.Any = None,
) -> typing.Any:
    """
    Row-major GEMM: alpha * op(a) @ op(b) + beta * out, through OpenBLAS for host arrays and cuBLAS for device arrays. Without out (beta == 0 only) returns a new array (NumPy, or CuPy on a GPU).
    """

def global_pool_backward(kind: str, dy: typing.Any, dx: typing.Any, argmax: typing.Any = None) -> None:
    """
    dx (N, C, H, W) from dy (N, C); max needs argmax.
    """

def global_pool_forward(kind: str, x: typing.Any, y: typing.Any, argmax: typing.Any = None) -> None:
    """
    Global max / avg / sum pooling of x (N, C, H, W) into y (N, C).
    """

def gru_backward(
    x: typing.Any,
    w: typing.Any,
    rw: typing.Any,
    hs: typing.Any,
    gates: typing.Any,
    dh: typing.Any,
    dgates: typing.Any,
    dw: typing.Any,
    drw: typing.Any,
    db: typing.Any,
    dx: typing.Any = None,
    mask: typing.Any = None,
    h0: typing.Any = None,
    activation: str = "tanh",
    gate_activation: str = "sigmoid",
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    gate_alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    first_step: typing.SupportsInt | typing.SupportsIndex = 0,
) -> None:
    """
    Backward of gru_forward given dh = dL/dhs (N, T, H): writes dgates = dL/d(pre-activations), dw, drw, db and dx (if given); steps before first_step get no gradient (truncated BPTT).
    """

def gru_forward(
    x: typing.Any,
    w: typing.Any,
    rw: typing.Any,
    b: typing.Any,
    hs: typing.Any,
    gates: typing.Any,
    mask: typing.Any = None,
    h0: typing.Any = None,
    activation: str = "tanh",
    gate_activation: str = "sigmoid",
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    gate_alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    GRU (libnd4j's cell, reset before the recurrent product) over x (N, T, C) with w (C, 3H), rw (H, 3H), b (3H), gate order [r, u, c]: writes hs (N, T, H) and the activated gates (N, T, 3H). mask (N, T) multiplies h per step.
    """

def l2_distance_backward(
    a: typing.Any,
    b: typing.Any,
    y: typing.Any,
    dy: typing.Any,
    da: typing.Any,
    db: typing.Any,
    eps: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    da = dy (a - b) / max(y, eps), db = -da.
    """

def l2_distance_forward(a: typing.Any, b: typing.Any, y: typing.Any) -> None:
    """
    y (N,) = ||a_i - b_i||_2 per example of the (N, ...) arrays a and b.
    """

def l2_normalize_backward(
    y: typing.Any,
    norms: typing.Any,
    dy: typing.Any,
    dx: typing.Any,
    eps: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    dx from y, norms and dy of l2_normalize_forward; dx may be dy.
    """

def l2_normalize_forward(
    x: typing.Any, y: typing.Any, norms: typing.Any, eps: typing.SupportsFloat | typing.SupportsIndex
) -> None:
    """
    y = x / max(||x_i||, eps) per example (row of the (N, ...) array); norms (N,).
    """

def layer_norm_backward(
    x: typing.Any,
    dy: typing.Any,
    gain: typing.Any,
    mean: typing.Any,
    rstd: typing.Any,
    dx: typing.Any,
    dgain: typing.Any,
    dbias: typing.Any = None,
) -> None:
    """
    Backward of layer_norm_forward: dx (rows, C), dgain and dbias (C,) (dbias None: not written); the column sums are the same bits for any thread count. dx may be dy.
    """

def layer_norm_forward(
    x: typing.Any,
    gain: typing.Any,
    bias: typing.Any,
    y: typing.Any,
    mean: typing.Any,
    rstd: typing.Any,
    eps: typing.SupportsFloat | typing.SupportsIndex = 1e-05,
) -> None:
    """
    Layer normalization of each row of x (rows, C): y = (x - mean) rstd gain + bias (bias None: none), rstd = 1 / sqrt(biased var + eps); writes mean and rstd (rows,).
    """

def loss_gradient(
    loss: str,
    activation: str,
    labels: typing.Any,
    preout: typing.Any,
    grad: typing.Any,
    mask: typing.Any = None,
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    grad (N, C) = d(example loss)/d(preout), times mask; not divided by N.
    """

def loss_score(
    loss: str,
    activation: str,
    labels: typing.Any,
    preout: typing.Any,
    scores: typing.Any,
    mask: typing.Any = None,
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    scores (N,) = per-example loss (sum over columns) of activation(preout) against labels, times mask.
    """

def lstm_backward(
    x: typing.Any,
    w: typing.Any,
    rw: typing.Any,
    hs: typing.Any,
    cs: typing.Any,
    gates: typing.Any,
    act_c: typing.Any,
    dh: typing.Any,
    dgates: typing.Any,
    dw: typing.Any,
    drw: typing.Any,
    db: typing.Any,
    dx: typing.Any = None,
    mask: typing.Any = None,
    h0: typing.Any = None,
    c0: typing.Any = None,
    activation: str = "tanh",
    gate_activation: str = "sigmoid",
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    gate_alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    first_step: typing.SupportsInt | typing.SupportsIndex = 0,
) -> None:
    """
    Backward of lstm_forward given dh = dL/dhs (N, T, H): writes dgates, dw, drw, db and dx (if given); steps before first_step get no gradient (truncated BPTT).
    """

def lstm_forward(
    x: typing.Any,
    w: typing.Any,
    rw: typing.Any,
    b: typing.Any,
    hs: typing.Any,
    cs: typing.Any,
    gates: typing.Any,
    act_c: typing.Any,
    mask: typing.Any = None,
    h0: typing.Any = None,
    c0: typing.Any = None,
    activation: str = "tanh",
    gate_activation: str = "sigmoid",
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    gate_alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    LSTM over x (N, T, C) with w (C, 4H), rw (H, 4H), b (4H), gate order [a, f, o, i] (DL4J): writes hs, cs, act_c (N, T, H) and the activated gates (N, T, 4H). mask (N, T) multiplies h and c per step.
    """

def max_threads() -> int:
    """
    Number of OpenMP threads native kernels use.
    """

def openmp_version() -> int:
    """
    The OpenMP specification date the core was built with.
    """

def pack_message(message: typing.Any) -> typing.Any:
    """
    The packed wire form of a sparse message with strictly ascending entries, or None when it has none or would not be smaller.
    """

def pool2d_backward(
    kind: str,
    dy: typing.Any,
    dx: typing.Any,
    kernel_h: typing.SupportsInt | typing.SupportsIndex,
    kernel_w: typing.SupportsInt | typing.SupportsIndex,
    stride_h: typing.SupportsInt | typing.SupportsIndex,
    stride_w: typing.SupportsInt | typing.SupportsIndex,
    pad_top: typing.SupportsInt | typing.SupportsIndex,
    pad_left: typing.SupportsInt | typing.SupportsIndex,
    argmax: typing.Any = None,
) -> None:
    """
    dx (N, C, H, W) from dy (N, C, P, Q); max needs argmax.
    """

def pool2d_forward(
    kind: str,
    x: typing.Any,
    y: typing.Any,
    kernel_h: typing.SupportsInt | typing.SupportsIndex,
    kernel_w: typing.SupportsInt | typing.SupportsIndex,
    stride_h: typing.SupportsInt | typing.SupportsIndex,
    stride_w: typing.SupportsInt | typing.SupportsIndex,
    pad_top: typing.SupportsInt | typing.SupportsIndex,
    pad_left: typing.SupportsInt | typing.SupportsIndex,
    argmax: typing.Any = None,
) -> None:
    """
    Max / avg pooling of x (N, C, H, W) into y (N, C, P, Q).
    """

def regularize_gradient(
    params: typing.Any,
    grad: typing.Any,
    l1: typing.SupportsFloat | typing.SupportsIndex,
    l2: typing.SupportsFloat | typing.SupportsIndex,
) -> None:
    """
    grad += l2 * params + l1 * sign(params), in place.
    """

def residual_bounds(residual: typing.Any, bounds: typing.Any, at: typing.Any = None) -> None:
    """
    bounds[b] = max |residual| (NaN left out) over block b of BOUND_BLOCK elements, then for each group of BOUND_GROUP blocks its largest bound (bounds: (bounds_length(n),)): for every block and group, or for the blocks holding the int64 indices `at`, their groups' bounds raised to hold them.
    """

def scale_shift(
    x: typing.Any,
    y: typing.Any,
    scale: typing.SupportsFloat | typing.SupportsIndex = 1.0,
    shift: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    y = x * scale + shift; y may be x.
    """

def set_num_threads(n: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Set the OpenMP and OpenBLAS thread counts for this process.
    """

def simple_rnn_backward(
    x: typing.Any,
    w: typing.Any,
    rw: typing.Any,
    hs: typing.Any,
    act: typing.Any,
    dh: typing.Any,
    dz: typing.Any,
    dw: typing.Any,
    drw: typing.Any,
    db: typing.Any,
    dx: typing.Any = None,
    mask: typing.Any = None,
    h0: typing.Any = None,
    activation: str = "tanh",
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    first_step: typing.SupportsInt | typing.SupportsIndex = 0,
) -> None:
    """
    Backward of simple_rnn_forward given dh = dL/dhs (N, T, H): writes dz = dL/d(pre-activations), dw, drw, db and dx (if given); steps before first_step get no gradient (truncated BPTT).
    """

def simple_rnn_forward(
    x: typing.Any,
    w: typing.Any,
    rw: typing.Any,
    b: typing.Any,
    hs: typing.Any,
    act: typing.Any,
    mask: typing.Any = None,
    h0: typing.Any = None,
    activation: str = "tanh",
    alpha: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    SimpleRnn over x (N, T, C) with w (C, H), rw (H, H), b (H): writes the outputs hs and act = the activations before the mask, both (N, T, H). mask (N, T) multiplies each step's output.
    """

def subtract_sparse(message: typing.Any, target: typing.Any) -> None:
    """
    target -= decoded sparse message after validation, touching only its indices.
    """

def swap_last_axes(x: typing.Any, y: typing.Any) -> None:
    """
    y (N, cols, rows) = x (N, rows, cols) with its last two axes swapped; y must not be x.
    """

def threshold_encode(
    residual: typing.Any,
    threshold: typing.SupportsFloat | typing.SupportsIndex,
    boundary: typing.SupportsInt | typing.SupportsIndex = -1,
) -> numpy.typing.NDArray[numpy.int32]:
    """
    Sparse threshold encoding of `residual` (modified in place); boundary < 0 means unlimited.
    """

def unpack_message(packed: typing_extensions.Buffer) -> numpy.typing.NDArray[numpy.int32]:
    """
    The int32 sparse message of a packed one, every byte checked.
    """

def updater_apply(
    kind: str,
    gradient: typing.Any,
    state: typing.Any,
    iteration: typing.SupportsInt | typing.SupportsIndex,
    learning_rate: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    beta1: typing.SupportsFloat | typing.SupportsIndex = 0.9,
    beta2: typing.SupportsFloat | typing.SupportsIndex = 0.999,
    epsilon: typing.SupportsFloat | typing.SupportsIndex = 1e-08,
    momentum: typing.SupportsFloat | typing.SupportsIndex = 0.9,
    rms_decay: typing.SupportsFloat | typing.SupportsIndex = 0.95,
    rho: typing.SupportsFloat | typing.SupportsIndex = 0.95,
) -> None:
    """
    Turns the flat gradient (in place) into the update to subtract and advances the flat state.
    """

def updater_state_size(kind: str, n: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Length of the flat updater state for n parameters.
    """

BOUND_BLOCK: int = 16
BOUND_GROUP: int = 64
