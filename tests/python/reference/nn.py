"""Pure-NumPy references for the native nn and optim kernels (see /work/nn-contract.md).

Written for clarity: explicit loops over output positions for convolution and pooling, the textbook
formula for everything else. Computations run in float64 and the caller casts.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-10

# ---- dense helpers -------------------------------------------------------------------------------


def bias_add(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return x + b.reshape(shape)


def bias_grad(dy: np.ndarray) -> np.ndarray:
    axes = (0,) + tuple(range(2, dy.ndim))
    return dy.astype(np.float64).sum(axis=axes)


# ---- activations ---------------------------------------------------------------------------------

ACTIVATIONS = ["identity", "relu", "leakyrelu", "elu", "tanh", "sigmoid", "softmax", "softplus", "hardtanh"]


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def activation(name: str, x: np.ndarray, alpha: float = 0.0) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if name == "identity":
        return x.copy()
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "leakyrelu":
        return np.where(x > 0, x, alpha * x)
    if name == "elu":
        return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if name == "softplus":
        return np.logaddexp(0.0, x)
    if name == "hardtanh":
        return np.clip(x, -1.0, 1.0)
    raise ValueError(name)


def activation_backward(name: str, x: np.ndarray, dy: np.ndarray, alpha: float = 0.0) -> np.ndarray:
    """dL/dx from dL/dy via the analytic derivative f'(x) (softmax: its Jacobian per row)."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    y = activation(name, x, alpha)
    if name == "softmax":
        jac = np.einsum("ni,ij->nij", y, np.eye(x.shape[1])) - np.einsum("ni,nj->nij", y, y)
        return np.einsum("nij,ni->nj", jac, dy)
    derivative = {
        "identity": lambda: np.ones_like(x),
        "relu": lambda: (x > 0).astype(np.float64),
        "leakyrelu": lambda: np.where(x > 0, 1.0, alpha),
        "elu": lambda: np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0.0))),
        "tanh": lambda: 1.0 - np.tanh(x) ** 2,
        "sigmoid": lambda: _sigmoid(x) * (1.0 - _sigmoid(x)),
        "softplus": lambda: _sigmoid(x),
        "hardtanh": lambda: ((x > -1) & (x < 1)).astype(np.float64),
    }[name]()
    return derivative * dy


# ---- losses --------------------------------------------------------------------------------------

LOSSES = [
    "mcxent",
    "negativeloglikelihood",
    "mse",
    "l1",
    "l2",
    "xent",
    "hinge",
    "squared_hinge",
    "kl_divergence",
]


def _mask_matrix(mask, shape):
    if mask is None:
        return np.ones(shape)
    mask = np.asarray(mask, np.float64)
    return np.broadcast_to(mask if mask.ndim == 2 else mask[:, None], shape)


def _loss_terms(loss: str, y: np.ndarray, p: np.ndarray) -> np.ndarray:
    c = y.shape[1]
    clip = np.maximum(p, EPS)
    return {
        "mcxent": lambda: -y * np.log(clip),
        "negativeloglikelihood": lambda: -y * np.log(clip),
        "xent": lambda: -(y * np.log(clip) + (1 - y) * np.log(np.maximum(1 - p, EPS))),
        "l2": lambda: (y - p) ** 2,
        "mse": lambda: (y - p) ** 2 / c,
        "l1": lambda: np.abs(y - p),
        "hinge": lambda: np.maximum(0.0, 1 - y * p),
        "squared_hinge": lambda: np.maximum(0.0, 1 - y * p) ** 2,
        "kl_divergence": lambda: np.where(y > 0, y * (np.log(np.where(y > 0, y, 1.0)) - np.log(clip)), 0.0),
    }[loss]()


def loss_score(loss, act, labels, preout, mask=None, alpha=0.0) -> np.ndarray:
    y = np.asarray(labels, np.float64)
    z = np.asarray(preout, np.float64)
    if loss in ("mcxent", "negativeloglikelihood") and act == "softmax":
        log_p = z - z.max(axis=1, keepdims=True)
        log_p = log_p - np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        terms = -y * np.maximum(log_p, np.log(EPS))
    elif loss == "xent" and act == "sigmoid":
        log_p = np.maximum(-np.logaddexp(0.0, -z), np.log(EPS))
        log_1mp = np.maximum(-np.logaddexp(0.0, z), np.log(EPS))
        terms = -(y * log_p + (1 - y) * log_1mp)
    else:
        terms = _loss_terms(loss, y, activation(act, z, alpha))
    return (terms * _mask_matrix(mask, y.shape)).sum(axis=1)


def loss_gradient(loss, act, labels, preout, mask=None, alpha=0.0) -> np.ndarray:
    y = np.asarray(labels, np.float64)
    z = np.asarray(preout, np.float64)
    p = activation(act, z, alpha)
    c = y.shape[1]
    if loss in ("mcxent", "negativeloglikelihood") and act == "softmax":
        grad = p * y.sum(axis=1, keepdims=True) - y
    elif loss == "xent" and act == "sigmoid":
        grad = p - y
    else:
        clip = np.maximum(p, EPS)
        dp = {
            "mcxent": lambda: -y / clip,
            "negativeloglikelihood": lambda: -y / clip,
            "kl_divergence": lambda: -y / clip,
            "xent": lambda: -y / clip + (1 - y) / np.maximum(1 - p, EPS),
            "l2": lambda: 2 * (p - y),
            "mse": lambda: 2 * (p - y) / c,
            "l1": lambda: np.sign(p - y),
            "hinge": lambda: np.where(1 - y * p > 0, -y, 0.0),
            "squared_hinge": lambda: -2 * y * np.maximum(0.0, 1 - y * p),
        }[loss]()
        grad = activation_backward(act, z, dp, alpha)
    return grad * _mask_matrix(mask, y.shape)


# ---- convolution ---------------------------------------------------------------------------------


def _padded(x: np.ndarray, p: int, q: int, r: int, s: int, stride, pad):
    """x zero-padded so that every window of a (p, q) output lies inside it."""
    n, c, h, w = x.shape
    need_h = (p - 1) * stride[0] + r
    need_w = (q - 1) * stride[1] + s
    out = np.zeros((n, c, max(need_h, pad[0] + h), max(need_w, pad[1] + w)))
    out[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w] = x
    return out


def conv2d_forward(x, w, b, out_hw, stride, pad) -> np.ndarray:
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n = x.shape[0]
    k, _, r, s = w.shape
    p, q = out_hw
    xp = _padded(x, p, q, r, s, stride, pad)
    y = np.zeros((n, k, p, q))
    for i in range(p):
        for j in range(q):
            patch = xp[:, :, i * stride[0] : i * stride[0] + r, j * stride[1] : j * stride[1] + s]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w)
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def conv2d_backward_input(dy, w, x_shape, stride, pad) -> np.ndarray:
    dy = np.asarray(dy, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x_shape
    _, _, r, s = w.shape
    p, q = dy.shape[2:]
    dxp = _padded(np.zeros(x_shape), p, q, r, s, stride, pad)
    for i in range(p):
        for j in range(q):
            dxp[:, :, i * stride[0] : i * stride[0] + r, j * stride[1] : j * stride[1] + s] += np.einsum(
                "nk,kcrs->ncrs", dy[:, :, i, j], w
            )
    return dxp[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + wd]


def conv2d_backward_weight(x, dy, w_shape, stride, pad) -> np.ndarray:
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    _, _, r, s = w_shape
    p, q = dy.shape[2:]
    xp = _padded(x, p, q, r, s, stride, pad)
    dw = np.zeros(w_shape)
    for i in range(p):
        for j in range(q):
            patch = xp[:, :, i * stride[0] : i * stride[0] + r, j * stride[1] : j * stride[1] + s]
            dw += np.einsum("ncrs,nk->kcrs", patch, dy[:, :, i, j])
    return dw


# Winograd F(2x2, 3x3): y = A^T [ sum_c (G g G^T) . (B^T d B) ] A per 2x2 output tile, d its 4x4 patch.
WINOGRAD_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
WINOGRAD_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def _winograd_tiles(x, out_hw, pad) -> np.ndarray:
    """(n, c, tiles_h, tiles_w, 4, 4): the zero-padded 4x4 input patch of every 2x2 output tile."""
    n, c, h, w = x.shape
    th, tw = -(-out_hw[0] // 2), -(-out_hw[1] // 2)
    xp = np.zeros((n, c, 2 * th + 2 + h + pad[0], 2 * tw + 2 + w + pad[1]))
    xp[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w] = x
    windows = np.lib.stride_tricks.sliding_window_view(xp, (4, 4), axis=(2, 3))
    return windows[:, :, : 2 * th : 2, : 2 * tw : 2]


def winograd_forward_bound(x, w, b, out_hw, pad, unit_roundoff) -> np.ndarray:
    """Worst-case rounding error of each Winograd forward output: gamma_m times the sum the algorithm
    forms with every matrix, kernel and input replaced by its absolute value. m counts the roundings on
    the longest path: kernel transform 2 + 2 adds, input transform 1 + 1, the product 1, the sum over the
    c channels c - 1, output transform 2 + 2, bias 1 (m = c + 11; the halvings are exact)."""
    x, w = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64))
    bt, g, at = np.abs(WINOGRAD_BT), np.abs(WINOGRAD_G), np.abs(WINOGRAD_AT)
    u = np.einsum("ai,kcij,bj->kcab", g, w, g)
    v = np.einsum("ai,nctsij,bj->nctsab", bt, _winograd_tiles(x, out_hw, pad), bt)
    y = np.einsum("ia,nktsab,jb->nktsij", at, np.einsum("kcab,nctsab->nktsab", u, v), at)
    n, k, th, tw = y.shape[:4]
    y = y.transpose(0, 1, 2, 4, 3, 5).reshape(n, k, 2 * th, 2 * tw)[:, :, : out_hw[0], : out_hw[1]]
    if b is not None:
        y = y + np.abs(np.asarray(b, np.float64))[None, :, None, None]
    m = x.shape[1] + 11
    return m * unit_roundoff / (1 - m * unit_roundoff) * y


def winograd_weight_bound(x, dy, pad, unit_roundoff) -> np.ndarray:
    """The same worst case for the weight gradient G^T [ sum over tiles (A dy A^T) . (B^T d B) ] G: m =
    gradient transform 3 (a sum of the four dy values), input transform 1 + 1, the product 1, the sum over
    the n * tiles terms, output transform 2 + 2."""
    x, dy = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(dy, np.float64))
    bt, g, at = np.abs(WINOGRAD_BT), np.abs(WINOGRAD_G), np.abs(WINOGRAD_AT)
    n, k, p, q = dy.shape
    th, tw = -(-p // 2), -(-q // 2)
    dyp = np.zeros((n, k, 2 * th, 2 * tw))
    dyp[:, :, :p, :q] = dy
    dy_tiles = dyp.reshape(n, k, th, 2, tw, 2).transpose(0, 1, 2, 4, 3, 5)
    e = np.einsum("ai,nktsij,bj->nktsab", at.T, dy_tiles, at.T)
    v = np.einsum("ai,nctsij,bj->nctsab", bt, _winograd_tiles(x, (p, q), pad), bt)
    total = np.einsum("nktsab,nctsab->kcab", e, v)
    m = n * th * tw + 9
    return m * unit_roundoff / (1 - m * unit_roundoff) * np.einsum("ai,kcab,bj->kcij", g, total, g)


# ---- pooling -------------------------------------------------------------------------------------


def _windows(h, w, p, q, kernel, stride, pad):
    """Yields (i, j, rows, cols): the in-bounds input index ranges of output position (i, j)."""
    for i in range(p):
        top = i * stride[0] - pad[0]
        rows = range(max(top, 0), min(top + kernel[0], h))
        for j in range(q):
            left = j * stride[1] - pad[1]
            yield i, j, rows, range(max(left, 0), min(left + kernel[1], w))


def pool2d_forward(kind, x, out_hw, kernel, stride, pad):
    """Returns (y, argmax); argmax is the flat (h, w) index of the first maximum (max pooling only)."""
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    p, q = out_hw
    y = np.zeros((n, c, p, q))
    argmax = np.zeros((n, c, p, q), np.int64)
    for i, j, rows, cols in _windows(h, w, p, q, kernel, stride, pad):
        window = x[:, :, rows.start : rows.stop, cols.start : cols.stop].reshape(n, c, len(rows) * len(cols))
        if kind == "max":
            best = window.argmax(axis=2)
            y[:, :, i, j] = window.max(axis=2)
            argmax[:, :, i, j] = (rows.start + best // len(cols)) * w + cols.start + best % len(cols)
        else:
            y[:, :, i, j] = window.mean(axis=2)
    return y, argmax


def pool2d_backward(kind, dy, x_shape, kernel, stride, pad, argmax=None):
    dy = np.asarray(dy, np.float64)
    n, c, h, w = x_shape
    p, q = dy.shape[2:]
    dx = np.zeros(x_shape)
    for i, j, rows, cols in _windows(h, w, p, q, kernel, stride, pad):
        if kind == "max":
            flat = dx.reshape(n * c, h * w)
            np.add.at(flat, (np.arange(n * c), argmax[:, :, i, j].reshape(-1)), dy[:, :, i, j].reshape(-1))
        else:
            count = len(rows) * len(cols)
            dx[:, :, rows.start : rows.stop, cols.start : cols.stop] += (
                dy[:, :, i, j][:, :, None, None] / count
            )
    return dx


def global_pool_forward(kind, x):
    x = np.asarray(x, np.float64)
    flat = x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3])
    if kind == "max":
        return flat.max(axis=2), flat.argmax(axis=2)
    return (flat.mean(axis=2) if kind == "avg" else flat.sum(axis=2)), None


def global_pool_backward(kind, dy, x_shape, argmax=None):
    dy = np.asarray(dy, np.float64)
    n, c = dy.shape
    size = int(np.prod(x_shape[2:]))
    if kind == "max":
        dx = np.zeros((n, c, size))
        np.put_along_axis(dx, argmax[:, :, None], dy[:, :, None], axis=2)
    else:
        dx = np.repeat(dy[:, :, None] / (size if kind == "avg" else 1), size, axis=2)
    return dx.reshape(x_shape)


# ---- batch normalization -------------------------------------------------------------------------


def _channel_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _per_channel(v, x):
    return np.asarray(v, np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))


def batchnorm_forward_train(x, gamma, beta, eps):
    """Returns (y, batch_mean, batch_var) with the biased batch variance."""
    x = np.asarray(x, np.float64)
    axes = _channel_axes(x)
    mean = x.mean(axis=axes)
    var = x.var(axis=axes)
    return batchnorm_forward_inference(x, gamma, beta, mean, var, eps), mean, var


def batchnorm_forward_inference(x, gamma, beta, mean, var, eps):
    x = np.asarray(x, np.float64)
    xhat = (x - _per_channel(mean, x)) / np.sqrt(_per_channel(var, x) + eps)
    return _per_channel(gamma, x) * xhat + _per_channel(beta, x)


def batchnorm_backward(x, dy, gamma, mean, var, eps):
    """Returns (dx, dgamma, dbeta) of the training-mode forward (statistics depend on x)."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    axes = _channel_axes(x)
    m = x.size // x.shape[1]
    inv_std = 1.0 / np.sqrt(_per_channel(var, x) + eps)
    xhat = (x - _per_channel(mean, x)) * inv_std
    dbeta = dy.sum(axis=axes)
    dgamma = (dy * xhat).sum(axis=axes)
    dxhat = dy * _per_channel(gamma, x)
    dx = (
        inv_std
        / m
        * (
            m * dxhat
            - dxhat.sum(axis=axes, keepdims=True)
            - xhat * (dxhat * xhat).sum(axis=axes, keepdims=True)
        )
    )
    return dx, dgamma, dbeta


# ---- regularization and updaters -----------------------------------------------------------------

UPDATER_STATE = {
    "sgd": 0,
    "noop": 0,
    "nesterovs": 1,
    "rmsprop": 1,
    "adagrad": 1,
    "adam": 2,
    "adamax": 2,
    "nadam": 2,
    "adadelta": 2,
    "amsgrad": 3,
}


def regularize_gradient(params, grad, l1, l2):
    return grad + l2 * params + l1 * np.sign(params)


def updater_step(
    kind,
    g,
    state,
    iteration,
    lr=0.0,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    momentum=0.9,
    rms_decay=0.95,
    rho=0.95,
):
    """One DL4J update: returns (update, new_state); state is split into UPDATER_STATE[kind] vectors."""
    g = np.asarray(g, np.float64)
    parts = (
        [s.copy() for s in np.split(np.asarray(state, np.float64), UPDATER_STATE[kind])]
        if UPDATER_STATE[kind]
        else []
    )
    t = iteration + 1
    if kind == "sgd":
        u = lr * g
    elif kind == "noop":
        u = np.zeros_like(g)
    elif kind == "nesterovs":
        (v,) = parts
        v_new = momentum * v - lr * g
        u = momentum * v - (1 + momentum) * v_new
        parts = [v_new]
    elif kind in ("adam", "nadam", "amsgrad"):
        m, v = parts[0], parts[1]
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        if kind == "adam":
            u = lr * np.sqrt(1 - beta2**t) / (1 - beta1**t) * m / (np.sqrt(v) + eps)
            parts = [m, v]
        elif kind == "nadam":
            m_hat = beta1 * m / (1 - beta1 ** (t + 1)) + (1 - beta1) * g / (1 - beta1**t)
            u = lr * m_hat / (np.sqrt(v / (1 - beta2**t)) + eps)
            parts = [m, v]
        else:
            vhat = np.maximum(parts[2], v)
            u = lr * np.sqrt(1 - beta2**t) / (1 - beta1**t) * m / (np.sqrt(vhat) + eps)
            parts = [m, v, vhat]
    elif kind == "adamax":
        m, u_inf = parts
        m = beta1 * m + (1 - beta1) * g
        u_inf = np.maximum(beta2 * u_inf, np.abs(g))
        u = lr / (1 - beta1**t) * m / (u_inf + eps)
        parts = [m, u_inf]
    elif kind == "rmsprop":
        (s,) = parts
        s = rms_decay * s + (1 - rms_decay) * g * g
        u = lr * g / np.sqrt(s + eps)
        parts = [s]
    elif kind == "adagrad":
        (h,) = parts
        h = h + g * g
        u = lr * g / (np.sqrt(h) + eps)
        parts = [h]
    elif kind == "adadelta":
        eg, edx = parts
        eg = rho * eg + (1 - rho) * g * g
        u = np.sqrt(edx + eps) / np.sqrt(eg + eps) * g
        edx = rho * edx + (1 - rho) * u * u
        parts = [eg, edx]
    else:
        raise ValueError(kind)
    return u, (np.concatenate(parts) if parts else np.zeros(0))


# ---- dropout -------------------------------------------------------------------------------------


# ---- embedding lookup ----------------------------------------------------------------------------


def embedding_forward(indices: np.ndarray, w: np.ndarray) -> np.ndarray:
    return w[indices]


def embedding_backward(indices: np.ndarray, dy: np.ndarray, dw: np.ndarray) -> np.ndarray:
    """``dw`` plus dW of ``y = W[indices]``: each row's positions added in order, in dy's dtype."""
    dw = dw.copy()
    for i, row in enumerate(indices):
        dw[row] += dy[i]
    return dw


def dropout_mask(size: int, retain: float, seed: int) -> np.ndarray:
    """1/retain where the i-th splitmix64 draw of the stream at `seed` is below retain, else 0."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.arange(size, dtype=np.uint64) + np.uint64(1)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    uniform = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.where(uniform < retain, 1.0 / retain, 0.0)


# ---- geometry ------------------------------------------------------------------------------------


def output_geometry(size: int, kernel: int, stride: int, pad: int, mode: str) -> tuple[int, int]:
    """(output size, leading padding) along one axis, DL4J style.

    "truncate": (size + 2 pad - kernel) // stride + 1 with `pad` on both sides; "same": ceil(size / stride)
    with the total padding split evenly and any odd element at the end (bottom / right).
    """
    if mode == "same":
        out = -(-size // stride)
        return out, max(0, (out - 1) * stride + kernel - size) // 2
    return (size + 2 * pad - kernel) // stride + 1, pad


# ---- numerical gradients -------------------------------------------------------------------------


def numerical_gradient(fn, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar fn at the float64 array x (x is perturbed and restored)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + h
        up = fn(x)
        flat[i] = keep - h
        down = fn(x)
        flat[i] = keep
        gflat[i] = (up - down) / (2 * h)
    return grad


# ---- graph vertices ------------------------------------------------------------------------------

ELEMENTWISE_OPS = ["add", "subtract", "product", "average", "max"]


def elementwise(op: str, inputs: list) -> np.ndarray:
    stack = np.stack([np.asarray(x, np.float64) for x in inputs])
    if op == "add":
        return stack.sum(axis=0)
    if op == "subtract":
        return stack[0] - stack[1]
    if op == "product":
        return stack.prod(axis=0)
    if op == "average":
        return stack.mean(axis=0)
    return stack.max(axis=0)


def elementwise_backward(op: str, inputs: list, dy: np.ndarray) -> list:
    """dL/d inputs[i]; max routes dy to the first maximal input."""
    stack = np.stack([np.asarray(x, np.float64) for x in inputs])
    k = len(inputs)
    if op == "add":
        return [dy.astype(np.float64) for _ in range(k)]
    if op == "subtract":
        return [dy.astype(np.float64), -dy.astype(np.float64)]
    if op == "average":
        return [dy / k for _ in range(k)]
    if op == "product":
        return [dy * np.prod(np.delete(stack, i, axis=0), axis=0) for i in range(k)]
    first = np.argmax(stack, axis=0)
    return [np.where(first == i, dy, 0.0) for i in range(k)]


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """Each example (row of the (N, ...) array) divided by max(its L2 norm, eps)."""
    rows = x.reshape(len(x), int(np.prod(x.shape[1:]))).astype(np.float64)
    norms = np.maximum(np.sqrt((rows**2).sum(axis=1, keepdims=True)), eps)
    return (rows / norms).reshape(x.shape)


def l2_normalize_backward(x: np.ndarray, dy: np.ndarray, eps: float) -> np.ndarray:
    """Jacobian-transpose product of l2_normalize: (dy - y <dy, y>) / norm, or dy / eps when clamped."""
    rows = x.reshape(len(x), int(np.prod(x.shape[1:]))).astype(np.float64)
    g = dy.reshape(len(x), int(np.prod(x.shape[1:]))).astype(np.float64)
    norm = np.sqrt((rows**2).sum(axis=1, keepdims=True))
    y = rows / np.maximum(norm, eps)
    dot = (g * y).sum(axis=1, keepdims=True)
    dx = np.where(norm > eps, (g - y * dot) / np.maximum(norm, eps), g / eps)
    return dx.reshape(x.shape)


def l2_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    diff = (a.astype(np.float64) - b).reshape(len(a), int(np.prod(a.shape[1:])))
    return np.sqrt((diff**2).sum(axis=1))


def l2_distance_backward(a: np.ndarray, b: np.ndarray, dy: np.ndarray, eps: float) -> tuple:
    diff = a.astype(np.float64) - b
    scale = dy / np.maximum(l2_distance(a, b), eps)
    da = diff * scale.reshape((-1,) + (1,) * (a.ndim - 1))
    return da, -da


# ---- LSTM ----------------------------------------------------------------------------------------


def lstm_forward(x, w, rw, b, mask=None, h0=None, c0=None, act="tanh", gate="sigmoid"):
    """DL4J LSTM, step by step: gate blocks [a, f, o, i]; masked steps multiply h and c by the mask.

    x: (N, T, C); returns hs (N, T, H) and cs (N, T, H)."""
    n, t, _ = x.shape
    h = rw.shape[0]
    hp = np.zeros((n, h)) if h0 is None else np.asarray(h0, np.float64)
    cp = np.zeros((n, h)) if c0 is None else np.asarray(c0, np.float64)
    hs, cs = np.zeros((n, t, h)), np.zeros((n, t, h))
    for s in range(t):
        z = x[:, s].astype(np.float64) @ w + hp @ rw + b
        a = activation(act, z[:, :h])
        f, o, i = (activation(gate, z[:, k * h : (k + 1) * h]) for k in (1, 2, 3))
        c = f * cp + i * a
        hcur = o * activation(act, c)
        m = np.ones((n, 1)) if mask is None else mask[:, s : s + 1]
        hp, cp = m * hcur, m * c
        hs[:, s], cs[:, s] = hp, cp
    return hs, cs


def lstm_backward(x, w, rw, b, dh, mask=None, h0=None, c0=None, act="tanh", gate="sigmoid"):
    """Gradients (dx, dw, drw, db) of sum(lstm_forward(...)[0] * dh) by central differences."""

    def loss() -> float:
        return float((lstm_forward(x, w, rw, b, mask, h0, c0, act, gate)[0] * dh).sum())

    return tuple(numerical_gradient(lambda _: loss(), arr) for arr in (x, w, rw, b))


# ---- SimpleRnn -----------------------------------------------------------------------------------


def simple_rnn_forward(x, w, rw, b, mask=None, h0=None, act="tanh", alpha=0.0):
    """DL4J SimpleRnn, step by step: h_t = m_t * act(x_t W + h_{t-1} RW + b). x: (N, T, C); returns
    hs (N, T, H)."""
    n, t, _ = x.shape
    hp = np.zeros((n, rw.shape[0])) if h0 is None else np.asarray(h0, np.float64)
    hs = np.zeros((n, t, rw.shape[0]))
    for s in range(t):
        m = np.ones((n, 1)) if mask is None else mask[:, s : s + 1]
        hp = m * activation(act, x[:, s].astype(np.float64) @ w + hp @ rw + b, alpha)
        hs[:, s] = hp
    return hs


def simple_rnn_backward(x, w, rw, b, dh, mask=None, h0=None, act="tanh", alpha=0.0):
    """Gradients (dx, dw, drw, db) of sum(simple_rnn_forward(...) * dh) by central differences."""

    def loss() -> float:
        return float((simple_rnn_forward(x, w, rw, b, mask, h0, act, alpha) * dh).sum())

    return tuple(numerical_gradient(lambda _: loss(), arr) for arr in (x, w, rw, b))


# ---- GRU -----------------------------------------------------------------------------------------


def gru_forward(x, w, rw, b, mask=None, h0=None, act="tanh", gate="sigmoid"):
    """libnd4j's GRU cell (DL4J), step by step: gate blocks [r, u, c]; r, u = gate(x W + h RW + b),
    c = act(x W_c + (r h) RW_c + b_c), h = u h + (1 - u) c; masked steps multiply h by the mask.

    x: (N, T, C); returns hs (N, T, H)."""
    n, t, _ = x.shape
    h = rw.shape[0]
    hp = np.zeros((n, h)) if h0 is None else np.asarray(h0, np.float64)
    hs = np.zeros((n, t, h))
    for s in range(t):
        zx = x[:, s].astype(np.float64) @ w + b
        r = activation(gate, zx[:, :h] + hp @ rw[:, :h])
        u = activation(gate, zx[:, h : 2 * h] + hp @ rw[:, h : 2 * h])
        c = activation(act, zx[:, 2 * h :] + (r * hp) @ rw[:, 2 * h :])
        m = np.ones((n, 1)) if mask is None else mask[:, s : s + 1]
        hp = m * (u * hp + (1 - u) * c)
        hs[:, s] = hp
    return hs


def gru_backward(x, w, rw, b, dh, mask=None, h0=None, act="tanh", gate="sigmoid"):
    """Gradients (dx, dw, drw, db) of sum(gru_forward(...) * dh) by central differences."""

    def loss() -> float:
        return float((gru_forward(x, w, rw, b, mask, h0, act, gate) * dh).sum())

    return tuple(numerical_gradient(lambda _: loss(), arr) for arr in (x, w, rw, b))


# ---- 1-D layers over sequences -------------------------------------------------------------------


def _window_starts(t, kernel, stride, pad, out_len):
    """Index of each output step's first input step (may be negative: padding)."""
    return [p * stride - pad for p in range(out_len)]


def conv1d_forward(x, w, b, stride, pad, out_len):
    """x: (N, C, T), w: (K, C, k), b: (K) or None -> (N, K, out_len); steps outside [0, T) read zero."""
    n, c, t = x.shape
    k_out, _, k = w.shape
    y = np.zeros((n, k_out, out_len))
    for p, start in enumerate(_window_starts(t, k, stride, pad, out_len)):
        for j in range(k):
            if 0 <= start + j < t:
                y[:, :, p] += x[:, :, start + j].astype(np.float64) @ w[:, :, j].T.astype(np.float64)
    return y if b is None else y + np.asarray(b, np.float64)[None, :, None]


def pool1d_forward(kind, x, kernel, stride, pad, out_len):
    """Max or average (over the in-bounds steps) of each window of x: (N, C, T) -> (N, C, out_len)."""
    t = x.shape[2]
    out = np.zeros((*x.shape[:2], out_len))
    for p, start in enumerate(_window_starts(t, kernel, stride, pad, out_len)):
        window = x[:, :, max(start, 0) : min(start + kernel, t)].astype(np.float64)
        out[:, :, p] = window.max(axis=2) if kind == "max" else window.mean(axis=2)
    return out


def mask_reduction_1d(mask, kernel, stride, pad, out_len, same_stride_1=False):
    """DL4J's cnn1dMaskReduction: the mask unchanged for same mode with stride 1, else the max of each
    window (an output step is present when any input step of its window is)."""
    if same_stride_1:
        return np.asarray(mask, np.float64)
    out = np.zeros((len(mask), out_len))
    for p, start in enumerate(_window_starts(mask.shape[1], kernel, stride, pad, out_len)):
        window = [mask[:, i] for i in range(start, start + kernel) if 0 <= i < mask.shape[1]]
        out[:, p] = np.max([np.zeros(len(mask)), *window], axis=0)  # padding reads zero
    return out


def layer_norm_forward(x, gain, bias, eps):
    """Each row of x (rows, C) normalized over its C values with the biased variance; returns (y, mean,
    rstd)."""
    mean = x.mean(axis=1)
    rstd = 1.0 / np.sqrt(x.var(axis=1) + eps)
    y = (x - mean[:, None]) * rstd[:, None] * gain
    return (y if bias is None else y + bias), mean, rstd


def layer_norm_backward(x, dy, gain, eps):
    """(dx, dgain, dbias) of layer_norm_forward, by the textbook formula."""
    _, mean, rstd = layer_norm_forward(x, gain, None, eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * gain
    dx = rstd[:, None] * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def attention_forward(q, k, v, heads, scale, mask=None):
    """Multi-head dot-product attention, heads interleaved in the last axis: q (N, TQ, H*D), k (N, TK, H*D),
    v (N, TK, H*DV), mask (N, TK) or None. A key with mask 0 gets weight 0; a query with no present key all
    zeros. Returns (weights (N, H, TQ, TK), y (N, TQ, H*DV))."""
    n, tq, _ = q.shape
    tk = k.shape[1]
    split = lambda a, t: a.reshape(n, t, heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
    scores = scale * split(q, tq) @ split(k, tk).transpose(0, 1, 3, 2)
    present = np.ones((n, tk), bool) if mask is None else mask != 0
    scores = np.where(present[:, None, None, :], scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.where(present[:, None, None, :], np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total > 0, total, 1)
    y = (weights @ split(v, tk)).transpose(0, 2, 1, 3).reshape(n, tq, -1)
    return weights, y


def attention_backward(q, k, v, weights, dy, heads, scale):
    """Backward of attention_forward given its weights: (dq, dk, dv) shaped as q, k, v."""
    n, tq, _ = q.shape
    tk = k.shape[1]
    split = lambda a, t: a.reshape(n, t, heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
    merge = lambda a: a.transpose(0, 2, 1, 3).reshape(n, a.shape[2], -1)  # noqa: E731
    qs, ks, vs, dys = split(q, tq), split(k, tk), split(v, tk), split(dy, tq)
    dweights = dys @ vs.transpose(0, 1, 3, 2)
    dscores = scale * weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
    dq = dscores @ ks
    dk = dscores.transpose(0, 1, 3, 2) @ qs
    dv = weights.transpose(0, 1, 3, 2) @ dys
    return merge(dq), merge(dk), merge(dv)


def self_attention_layer(x, wq, wk, wv, wo, mask=None):
    """DL4J's SelfAttentionLayer on x (N, T, C): per head j the projections x wq[j]^T (wq: (H, D, C)),
    attention scaled by 1/sqrt(D), heads concatenated and times wo (H*D, n_out); masked query steps output
    zero. Without projection (wq None) x is queries, keys and values, scaled by 1/sqrt(C)."""
    if wq is None:
        _, y = attention_forward(x, x, x, 1, 1 / np.sqrt(x.shape[2]), mask)
    else:
        heads, d, c = wq.shape
        proj = [x @ w.reshape(heads * d, c).T for w in (wq, wk, wv)]
        _, att = attention_forward(*proj, heads, 1 / np.sqrt(d), mask)
        y = att @ wo
    return y if mask is None else y * mask[:, :, None]


def learned_self_attention_layer(x, queries, wq, wk, wv, wo, mask=None):
    """DL4J's LearnedSelfAttentionLayer: the learned queries (C, NQ), tiled over the batch, attend to x
    (N, T, C); projections as self_attention_layer. Returns (N, NQ, n_out)."""
    n, _, c = x.shape
    qs = np.broadcast_to(queries.T, (n, *queries.T.shape))
    if wq is None:
        return attention_forward(qs, x, x, 1, 1 / np.sqrt(c), mask)[1]
    heads, d, _ = wq.shape
    q, k, v = (a @ w.reshape(heads * d, c).T for a, w in ((qs, wq), (x, wk), (x, wv)))
    return attention_forward(q, k, v, heads, 1 / np.sqrt(d), mask)[1] @ wo


# ---- transposed convolution (Deconvolution2D) ------------------------------------------------------


def deconv_geometry(
    size: int, kernel: int, stride: int, pad: int, dilation: int, mode: str
) -> tuple[int, int]:
    """(output size, rows trimmed at the top / left) along one axis, as DL4J's
    ConvolutionUtils.getDeconvolutionOutputSize and libnd4j's deconv2d compute them: "same" gives
    stride * size and trims (k_eff - stride) // 2 (libnd4j's calcPadding2D with input and output
    swapped; none when k_eff < stride); "truncate" and "strict" give stride (size - 1) + k_eff - 2 pad."""
    effective = (kernel - 1) * dilation + 1
    if mode == "same":
        return stride * size, max(effective - stride, 0) // 2
    return stride * (size - 1) + effective - 2 * pad, pad


def _deconv_frame(x_shape, w_shape, out_hw, stride, pad, dilation):
    """The untrimmed output frame's size, large enough for every scattered tap and the trimmed window."""
    (_, _, h, wd), (_, _, r, s) = x_shape, w_shape
    rows = max((h - 1) * stride[0] + (r - 1) * dilation[0] + 1, pad[0] + out_hw[0])
    cols = max((wd - 1) * stride[1] + (s - 1) * dilation[1] + 1, pad[1] + out_hw[1])
    return rows, cols


def deconv2d_forward(x, w, b, out_hw, stride, pad, dilation) -> np.ndarray:
    """Transposed convolution by its definition: every input pixel (i, j) scatters x[n, c, i, j] *
    w[c, o, kr, kc] to frame position (i stride + kr dilation, j stride + kc dilation); the output is the
    frame's window starting at (pad_top, pad_left) of size out_hw, plus the bias. x: (N, C, h, w),
    w: (C, O, R, S) (DL4J's layout), b: (O) or None -> (N, O, P, Q)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, _, h, wd = x.shape
    _, o, r, s = w.shape
    frame = np.zeros((n, o, *_deconv_frame(x.shape, w.shape, out_hw, stride, pad, dilation)))
    for i in range(h):
        for j in range(wd):
            for kr in range(r):
                for kc in range(s):
                    frame[:, :, i * stride[0] + kr * dilation[0], j * stride[1] + kc * dilation[1]] += (
                        x[:, :, i, j] @ w[:, :, kr, kc]
                    )
    y = frame[:, :, pad[0] : pad[0] + out_hw[0], pad[1] : pad[1] + out_hw[1]]
    return y if b is None else y + np.asarray(b, np.float64)[None, :, None, None]


def deconv2d_backward(x, w, dy, stride, pad, dilation) -> tuple[np.ndarray, np.ndarray]:
    """(dL/dx, dL/dw) of deconv2d_forward given dL/dy: dy placed back into the untrimmed frame (zero where
    the output was trimmed), then each tap's gather (dx) and product sum (dw) of the scatter above."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    n, _, h, wd = x.shape
    _, _, r, s = w.shape
    frame = np.zeros((n, dy.shape[1], *_deconv_frame(x.shape, w.shape, dy.shape[2:], stride, pad, dilation)))
    frame[:, :, pad[0] : pad[0] + dy.shape[2], pad[1] : pad[1] + dy.shape[3]] = dy
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    for i in range(h):
        for j in range(wd):
            for kr in range(r):
                for kc in range(s):
                    g = frame[:, :, i * stride[0] + kr * dilation[0], j * stride[1] + kc * dilation[1]]
                    dx[:, :, i, j] += g @ w[:, :, kr, kc].T
                    dw[:, :, kr, kc] += x[:, :, i, j].T @ g
    return dx, dw
