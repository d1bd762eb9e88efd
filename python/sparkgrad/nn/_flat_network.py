"""The machinery every network over ONE flat parameter buffer shares (MultiLayerNetwork, ComputationGraph).

A subclass names its parametrised units in layout order (``_layer_units``: a key, the layer config and
the input type it sees); this base lays the units' parameters out one after the other, each unit's in
``param_specs`` order and each array C-contiguous, allocates the flat parameter and gradient buffers
(same layout), initialises them, builds each unit's runtime over views of the buffers and groups runs of
consecutive units sharing an updater into blocks with one slice of the flat updater state each
(``state_size`` entries, laid out as the kernel defines).

Devices: the buffers live on the network's :class:`~sparkgrad.device.Device` (``device=`` at
construction, :meth:`FlatNetwork.to` later) in the same layout, and every runtime allocates and computes
through that device's array module and kernel namespace. Host data crosses to the device once per
minibatch where it enters (features, labels, masks); parameters, gradients, updater state and
activations stay on the device. Every public entry point runs inside the device's ``scope`` (the
current GPU) and, off the CPU, with the GEMMs in the configuration's ``precision``
(:mod:`sparkgrad.nn._precision`; fp16 steps go through a :class:`~sparkgrad.nn._precision.LossScaler`).

On top of the subclass's ``_gradient`` (flat gradient, score) it implements the training step
(gradient normalization, regularization, updater, weight decay, batch-norm running statistics, the
non-finite check), ``fit`` with listeners, truncated BPTT (cutting minibatches into
:class:`~sparkgrad.nn._recurrent.TbpttSegment` for ``fit`` and the Spark workers alike), the
parameter/updater-state accessors, persistence through :mod:`sparkgrad.nn.serialization` (the file's
model name is the class name) and ``clone``. A unit's key is whatever the configuration's
``setting(key, name)`` takes: a layer index or a vertex name.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import warnings
from typing import Any, Callable, ClassVar, Iterable, TypeVar

import numpy as np

from sparkgrad.compress.codec import subtract_message
from sparkgrad.data.inputs import training_batches
from sparkgrad.device import CPU, Device, is_gpu_array, resolve_device
from sparkgrad.errors import CorruptDataError, TrainingError
from sparkgrad.nn import layers as L
from sparkgrad.nn import serialization as model_files
from sparkgrad.nn._precision import LossScaler, gemm_precision
from sparkgrad.nn._recurrent import TbpttSegment, sequence_steps
from sparkgrad.nn._runtime import (
    EmbeddingRuntime,
    FrozenRuntime,
    InferenceFold,
    build_runtime,
    inference_folds,
)
from sparkgrad.nn.conf import BackpropType
from sparkgrad.nn.enums import GradientNormalization
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.listeners import TrainingListener
from sparkgrad.nn.serialization import PathOrFile
from sparkgrad.nn.trained_ranges import TrainedRanges
from sparkgrad.nn.weight_init import init_weights

N = TypeVar("N", bound="FlatNetwork")
F = TypeVar("F", bound=Callable[..., Any])
# Parameter roles that are not trained, and the gradient-normalization modes by kind.
_STATS = (L.RUNNING_MEAN, L.RUNNING_VAR)
_PER_PARAM_TYPE = (
    GradientNormalization.RENORMALIZE_L2_PER_PARAM_TYPE,
    GradientNormalization.CLIP_L2_PER_PARAM_TYPE,
)
_RENORMALIZE = (
    GradientNormalization.RENORMALIZE_L2_PER_LAYER,
    GradientNormalization.RENORMALIZE_L2_PER_PARAM_TYPE,
)


def on_device(method: F) -> F:
    """Runs a network method inside its device's scope (where GPU allocations and kernels go), its GEMMs
    in the configuration's precision off the CPU."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._device.scope(), self._gemm_precision():
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class _UpdaterBlock:
    """A contiguous parameter range trained by one updater, with its slice of the flat state."""

    def __init__(self, updater: Any, start: int, stop: int) -> None:
        self.updater, self.start, self.stop = updater, start, stop
        self.state_start = self.state_stop = 0
        # with row-sparse tables inside: the ranges around them, and the tables (see _RowSparseTable)
        self.dense: list[slice] = [slice(start, stop)]
        self.tables: list[_RowSparseTable] = []


class _RowSparseTable:
    """An embedding table whose training step touches only the rows its lookups named: no l1, l2,
    weight decay or gradient normalization on it, and a row-sparse updater (Sgd, NoOp) or
    ``lazy_updates``. ``start`` and ``stop``: its range in the flat buffers."""

    def __init__(self, runtime: Any, start: int, stop: int) -> None:
        self.runtime, self.start, self.stop = runtime, start, stop


def _ranges_around(start: int, stop: int, tables: list[_RowSparseTable]) -> list[slice]:
    """The non-empty ranges of [start, stop) outside the tables' ranges (tables sorted by start)."""
    ranges, at = [], start
    for table in tables:
        if table.start > at:
            ranges.append(slice(at, table.start))
        at = table.stop
    if stop > at:
        ranges.append(slice(at, stop))
    return ranges


class FlatNetwork:
    """Base of the network types: flat buffers, training step, fit loop, persistence.

    Args:
        conf: the configuration (not copied; treat it as immutable once the network exists).
        device: where the buffers live and the kernels run: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
            :class:`~sparkgrad.device.Device` (see :func:`~sparkgrad.device.resolve_device`).
    """

    _conf_class: ClassVar[type[Any]]  # the configuration type this network takes (and ``load`` parses)
    fold_batch_norm: bool = True
    """Inference (``output``, ``score``, evaluation; not training) runs a convolution with the identity
    activation whose output only a BatchNormalization reads, that batch norm and an identity or relu
    ActivationLayer reading only the batch norm as ONE convolution, the batch norm folded into its
    weights and bias (the same results up to float rounding). Set False on a network to run every
    layer on its own, as training does."""

    def __init__(self, conf: Any, device: Any = "cpu") -> None:
        if not isinstance(conf, self._conf_class):
            raise TypeError(f"conf: expected a {self._conf_class.__name__}, got {type(conf).__name__}")
        self._device = resolve_device(device)
        self.conf = conf
        self.dtype = np.dtype(conf.dtype)
        # fp16's dynamic loss scaling; kept on every device, used off the CPU (float32 kernels there)
        self._loss_scaler = LossScaler() if conf.precision == "fp16" else None
        self._warned_cpu_precision = False
        self.iteration_count = 0
        self.epoch_count = 0
        self.listeners: list[TrainingListener] = []
        self._params: Any = None  # the device's array (NumPy or CuPy); None before init()
        self._last_score: float | None = None

    # -- hooks of the subclasses -----------------------------------------------------------------
    @classmethod
    def _layer_units(cls, conf: Any) -> list[tuple[Any, L.Layer, InputType]]:
        """(setting key, layer config, input type) of every layer, in flat-buffer order."""
        raise NotImplementedError  # every network type overrides this

    def _gradient(self, dataset: Any, loss_scale: float = 1.0) -> float:
        """Flat gradient (no regularization) of the loss times ``loss_scale`` into ``self._grad``; returns
        the (unscaled) score with penalties."""
        raise NotImplementedError  # every network type overrides this

    def score(self, dataset: Any = None) -> float:
        """The score (loss plus penalties) of ``dataset``, or of the last training minibatch."""
        raise NotImplementedError  # every network type overrides this

    def _sole_consumers(self) -> dict[Any, Any]:
        """{unit key: key of the one layer that alone reads that unit's output}: where nothing else
        (no vertex, no second layer, no network output) does."""
        raise NotImplementedError  # every network type overrides this

    def evaluate(self, data: Any) -> Any:
        """Classification :class:`sparkgrad.eval.Evaluation` over ``data`` (of the first output)."""
        raise NotImplementedError  # every network type overrides this

    # -- construction -------------------------------------------------------------------------
    @on_device
    def init(self: N, params: Any = None) -> N:
        """Allocate the flat buffers on the network's device and initialise parameters (seeded by
        ``conf.seed``; drawn on the host, then copied to the device once).

        Args:
            params: optional flat parameter vector copied in instead of the random initialisation.

        Returns:
            self
        """
        conf = self.conf
        units = self._layer_units(conf)
        layouts = []
        offset = 0
        for _, layer, input_type in units:
            entries = []
            for spec in layer.param_specs(input_type):
                size = int(np.prod(spec.shape))
                entries.append((spec, offset, offset + size))
                offset += size
            layouts.append(entries)
        self._units, self._layouts = units, layouts
        self._n_params = offset
        host = np.zeros(offset, dtype=self.dtype)
        rng = np.random.default_rng(conf.seed)
        # dropout seeds derive from this, the iteration and the unit index: reproducible, thread-free
        self._dropout_seed = int(rng.integers(0, 2**62)) if conf.seed is None else conf.seed
        if params is None:  # given parameters replace every entry: no draw of a large table to discard
            for (key, _, _), entries in zip(units, layouts):
                for spec, start, stop in entries:
                    self._init_param(key, spec, host[start:stop].reshape(spec.shape), rng)
        self._layer_keys = [key for key, _, _ in units]
        self._layer_ranges = [(e[0][1], e[-1][2]) if e else (0, 0) for e in layouts]
        self._build_updater_blocks()
        self._normalized = self._gradient_normalization_groups()
        xp = self._device.xp
        self._params = self._device.from_host(host)
        self._grad = xp.zeros(offset, dtype=self.dtype)
        self._state = xp.zeros(self._blocks[-1].state_stop if self._blocks else 0, dtype=self.dtype)
        self._build_runtimes()
        if params is not None:
            self.set_params(params)
        return self

    def _build_runtimes(self) -> None:
        """Every unit's runtime over views of the current buffers, on the network's device."""
        self._runtimes: list[Any] = []
        self._weights: list[tuple[Any, Any, Any]] = []  # (param view, grad view, key)
        self._stats: list[tuple[slice, Any]] = []  # batch-norm running statistics
        for (key, layer, input_type), entries in zip(self._units, self._layouts):
            pviews, gviews = {}, {}
            for spec, start, stop in entries:
                pviews[spec.name] = self._params[start:stop].reshape(spec.shape)
                gviews[spec.name] = self._grad[start:stop].reshape(spec.shape)
                if spec.role == L.WEIGHT:
                    self._weights.append((pviews[spec.name], gviews[spec.name], key))
            activation = self.conf.setting(key, "activation") if hasattr(layer, "activation") else None
            runtime = build_runtime(layer, input_type, activation, self.dtype, pviews, gviews, self._device)
            inner = runtime.inner if isinstance(runtime, FrozenRuntime) else runtime
            if isinstance(inner, EmbeddingRuntime):
                inner.where = key
            self._runtimes.append(runtime)
            if isinstance(layer, L.BatchNormalization):  # running mean then running var close the layer
                self._stats.append((slice(entries[2][1], entries[-1][2]), runtime))
        self._folds = inference_folds(self._units, self._runtimes, self._sole_consumers())
        self._plan_row_sparse_step()

    def _plan_row_sparse_step(self) -> None:
        """Which embedding tables train row-sparsely (``_RowSparseTable``), the flat ranges around them
        (``_dense_ranges``) and, per updater block, its ranges and tables."""
        tables = []
        for (key, layer, _), entries, rt in zip(self._units, self._layouts, self._runtimes):
            setting = functools.partial(self.conf.setting, key)
            if (
                isinstance(rt, EmbeddingRuntime)
                and (setting("updater").row_sparse or getattr(layer, "lazy_updates", False))
                and setting("l1") == setting("l2") == setting("weight_decay") == 0
                and setting("gradient_normalization") is GradientNormalization.NONE
            ):
                _, start, stop = entries[0]  # W comes first
                tables.append(_RowSparseTable(rt, start, stop))
        self._sparse_tables = tables
        self._dense_ranges = _ranges_around(0, self._n_params, tables)
        for block in self._blocks:
            block.tables = [t for t in tables if block.start <= t.start < block.stop]
            block.dense = _ranges_around(block.start, block.stop, block.tables)

    def _row_sparse(self) -> bool:
        """Whether this step may touch only the looked-up rows of the row-sparse tables: each table's
        gradient is zero outside the rows of its last backward (``touched``)."""
        return bool(self._sparse_tables) and all(t.runtime.touched is not None for t in self._sparse_tables)

    def _all_finite(self, vec: Any, sparse: bool) -> bool:
        """Whether ``vec`` (gradient or update) is finite where this step may have written it."""
        xp = self._device.xp
        if not sparse:
            return bool(xp.isfinite(vec).all())
        parts = [vec[sl] for sl in self._dense_ranges]
        parts += [self._table_rows(vec, t) for t in self._sparse_tables]
        return all(bool(xp.isfinite(p).all()) for p in parts)

    def _table_rows(self, vec: Any, table: _RowSparseTable) -> Any:
        """A copy of the touched rows of ``table``'s range of ``vec``: (rows, n_out)."""
        return self._table(vec, table)[table.runtime.touched]

    def _table(self, vec: Any, table: _RowSparseTable) -> Any:
        return vec[table.start : table.stop].reshape(-1, table.runtime.conf.n_out)

    def _inference_plan(self, train: bool) -> tuple[dict[Any, InferenceFold], set[Any]]:
        """(the folds a forward pass runs, keyed by their convolution's unit; the keys of the units
        they absorb, which the pass skips): none in training or with ``fold_batch_norm`` off."""
        if train or not self.fold_batch_norm:
            return {}, set()
        return self._folds, {key for fold in self._folds.values() for key in fold.absorbed}

    def _gemm_precision(self) -> Any:
        """The context in which the network's kernels run at its precision: the GPU's GEMM mode (set for
        float32 networks too, so that a float32 network called inside a bf16 one computes in float32)."""
        return contextlib.nullcontext() if self._device is CPU else gemm_precision(self.conf.precision)

    def _step_loss_scaler(self) -> LossScaler | None:
        """The loss scaler a training step uses: fp16 off the CPU. Mixed precision on the CPU warns once
        per network (the CPU kernels compute in float32) and trains as float32."""
        if self.conf.precision == "float32":
            return None
        if self._device is CPU:
            if not self._warned_cpu_precision:
                self._warned_cpu_precision = True
                warnings.warn(
                    f"precision {self.conf.precision!r} has no effect on the CPU: its kernels compute in "
                    "float32 (and without loss scaling); mixed precision applies on a GPU",
                    UserWarning,
                    stacklevel=5,  # the caller of fit / compute_update
                )
            return None
        return self._loss_scaler

    @property
    def loss_scale(self) -> float | None:
        """The current loss scale of an fp16 network (dynamic loss scaling, as PyTorch's
        ``GradScaler.get_scale()``); None for float32 and bf16. Read-only: it starts at 2**16, doubles
        after 2000 consecutive steps with a finite gradient and halves at each skipped step. Saved and
        loaded with the updater state; it changes only when the network trains on a GPU."""
        return None if self._loss_scaler is None else self._loss_scaler.scale

    @property
    def skipped_steps(self) -> int:
        """Training steps an fp16 network skipped for a non-finite gradient (0 for float32 and bf16). A
        skipped step changes neither the parameters, the updater state nor ``iteration_count``."""
        return 0 if self._loss_scaler is None else self._loss_scaler.skipped_steps

    @property
    def device(self) -> Device:
        """The :class:`~sparkgrad.device.Device` holding the buffers (``.name``: "cpu", "cuda:N")."""
        return self._device

    def to(self: N, device: Any) -> N:
        """Move the network, in place, to ``device``: parameters, gradients and updater state are copied
        there in the same flat layout, and the layers compute there from now on (their work buffers
        are allocated there; state kept by ``rnn_time_step`` is cleared).

        Args:
            device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`~sparkgrad.device.Device`.

        Returns:
            self
        """
        target = resolve_device(device)
        if target is self._device:
            return self
        if self._params is not None:
            source = self._device
            with target.scope():
                buffers = [
                    target.from_host(source.to_host(b)) for b in (self._params, self._grad, self._state)
                ]
            self._params, self._grad, self._state = buffers
        self._device = target
        if self._params is not None:
            with target.scope():
                self._build_runtimes()
        return self

    @classmethod
    def _configured_num_params(cls, conf: Any) -> int:
        """The parameter count ``init`` will allocate, computed without allocating (bounds file reads)."""
        return sum(
            math.prod(spec.shape)
            for _, layer, input_type in cls._layer_units(conf)
            for spec in layer.param_specs(input_type)
        )

    def _init_param(self, key: Any, spec: L.ParamSpec, view: np.ndarray, rng: np.random.Generator) -> None:
        if spec.role == L.WEIGHT:
            init_weights(self.conf.setting(key, "weight_init"), view, spec.fan_in, spec.fan_out, rng)
        else:  # biases, beta and running mean start at 0; gamma and running variance at 1
            view[...] = 1.0 if spec.role in (L.GAMMA, L.RUNNING_VAR) else 0.0
            for start, stop, value in spec.fills:  # e.g. the LSTM forget-gate bias
                view[start:stop] = value

    def _build_updater_blocks(self) -> None:
        """Blocks over the trained ranges: a frozen layer's range is in none (no updater state, an update
        that stays zero there)."""
        blocks: list[_UpdaterBlock] = []
        for (key, layer, _), (start, stop) in zip(self._units, self._layer_ranges):
            if start == stop or isinstance(layer, L.FrozenLayer):
                continue
            updater = self.conf.setting(key, "updater")
            if blocks and blocks[-1].updater == updater and blocks[-1].stop == start:
                blocks[-1].stop = stop
            else:
                blocks.append(_UpdaterBlock(updater, start, stop))
        state = 0
        for block in blocks:
            block.state_start = state
            state += block.updater.state_size(block.stop - block.start)
            block.state_stop = state
        self._blocks = blocks

    def _gradient_normalization_groups(self) -> list[tuple[GradientNormalization, Any, slice]]:
        """(mode, threshold, flat-gradient slice normalized as one vector) of every unit with gradient
        normalization: its trained parameters (per layer) or each of them (per param type)."""
        groups: list[tuple[GradientNormalization, Any, slice]] = []
        for (key, _, _), entries in zip(self._units, self._layouts):
            mode = self.conf.setting(key, "gradient_normalization")
            # running statistics are not trained; they close their layer, so the rest is contiguous
            trained = [slice(start, stop) for spec, start, stop in entries if spec.role not in _STATS]
            if mode is GradientNormalization.NONE or not trained:
                continue
            # in the gradient's dtype: then t / max(norm, t) is exactly 1 within the threshold (numpy 1.x too)
            threshold = self.dtype.type(self.conf.setting(key, "gradient_normalization_threshold"))
            if mode in _PER_PARAM_TYPE:
                groups.extend((mode, threshold, sl) for sl in trained)
            else:
                groups.append((mode, threshold, slice(trained[0].start, trained[-1].stop)))
        return groups

    def _normalize_gradient(self) -> None:
        """DL4J's gradient normalization of the raw gradient, in place. Norms are computed in the
        gradient's dtype (as DL4J's) without overflow; scale factors stay on the device (no read-back), and
        a zero gradient stays zero."""
        xp = self._device.xp
        for mode, threshold, sl in self._normalized:
            g = self._grad[sl]
            if mode is GradientNormalization.CLIP_ELEMENT_WISE_ABSOLUTE_VALUE:
                xp.clip(g, -threshold, threshold, out=g)
                continue
            # the norm of g / max|g|, times max|g|: a finite gradient of float32 elements above 1.8e19
            # (an exploding RNN with a finite loss) would overflow dot(g, g) and scale to 0
            peak = xp.maximum(g.max(), -g.min())
            peak = xp.where(peak > 0, peak, 1)
            unit = g / peak
            norm = peak * xp.sqrt(xp.dot(unit, unit))
            if mode in _RENORMALIZE:
                g /= xp.where(norm > 0, norm, 1)
            else:  # clip L2: a factor of exactly 1 where the norm is within the threshold
                g *= threshold / xp.maximum(norm, threshold)

    def _require_init(self) -> None:
        if self._params is None:
            raise ValueError("the network is not initialised: call init() first")

    def _seed(self, index: int) -> int:
        """Dropout seed of unit ``index`` at the current iteration."""
        return (self._dropout_seed * 1_000_003 + self.iteration_count * 1_009 + index) % (2**63)

    # -- parameters and updater state --------------------------------------------------------
    @on_device
    def params(self) -> np.ndarray:
        """The flat parameter vector as a NumPy array: on the CPU the live buffer (every layer's weights
        are views of it); on a GPU a host copy (a host array is what checkpoints, averaging and Spark
        exchange), written back with :meth:`set_params`."""
        self._require_init()
        return self._device.to_host(self._params)

    def num_params(self) -> int:
        """Total number of parameters (including batch-norm running statistics)."""
        self._require_init()
        return self._n_params

    @on_device
    def set_params(self, flat: Any) -> None:
        """Copy ``flat`` (length ``num_params()``; a host or device array) into the parameter buffer."""
        self._require_init()
        self._copy_into(self._params, flat, "params")

    def trained_ranges(self) -> TrainedRanges:
        """The ranges of the flat parameter vector that training changes: every layer's but a frozen
        layer's (the updater state covers these only). Parameter averaging sends just these."""
        self._require_init()
        return TrainedRanges.of(((block.start, block.stop) for block in self._blocks), self._n_params)

    @property
    def updaters(self) -> tuple[Any, ...]:
        """The updater configuration of every range of trained parameters, in flat-buffer order (layers
        sharing one updater in a row count once)."""
        self._require_init()
        return tuple(block.updater for block in self._blocks)

    @on_device
    def updater_state(self) -> np.ndarray:
        """The flat updater state (empty for stateless updaters such as Sgd) as a NumPy array: the live
        buffer on the CPU, a host copy on a GPU (written back with :meth:`set_updater_state`)."""
        self._require_init()
        return self._device.to_host(self._state)

    @on_device
    def set_updater_state(self, flat: Any) -> None:
        """Copy ``flat`` (length ``len(updater_state())``; a host or device array) into the updater state."""
        self._require_init()
        self._copy_into(self._state, flat, "updater state")

    @on_device
    def mask_momentum(self, sent: Any) -> None:
        """Deep Gradient Compression's momentum factor masking (Lin et al. 2018): zeroes the velocity of
        every parameter whose element of ``sent`` is non-zero, so momentum built up before a parameter's
        update was sent does not keep pushing it afterwards. Only updaters with a velocity
        (``Updater.masks_momentum``: Nesterovs) are masked; other state is left alone.

        Args:
            sent: a flat vector of ``num_params()`` elements on the network's device: a worker's own
                decoded message (non-zero exactly where it sent an update).
        """
        self._require_init()
        if sent.shape != self._params.shape:
            raise ValueError(
                f"sent: expected a flat vector of length {self._n_params}, got shape {sent.shape}"
            )
        for block in self._blocks:
            if block.updater.masks_momentum:
                velocity = self._state[block.state_start : block.state_start + block.stop - block.start]
                velocity[sent[block.start : block.stop] != 0] = 0

    def _copy_into(self, dest: Any, flat: Any, name: str) -> None:
        device = self._device
        arr = device.asarray(flat) if device.owns(flat) or is_gpu_array(flat) else np.asarray(flat)
        if arr.ndim != 1 or arr.shape[0] != dest.shape[0]:
            raise ValueError(
                f"{name}: expected a flat vector of length {dest.shape[0]}, got shape {arr.shape}"
            )
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"{name}: expected a floating-point vector, got dtype {arr.dtype}")
        device.xp.copyto(dest, device.asarray(arr))

    # -- training step ------------------------------------------------------------------------
    def _penalty(self) -> float:
        """DL4J's regularization score: sum over weights of l1 |w| + l2 / 2 w^2."""
        xp = self._device.xp
        total = 0.0
        for w, _, key in self._weights:
            l1, l2 = self.conf.setting(key, "l1"), self.conf.setting(key, "l2")
            if l1 > 0:
                total += l1 * float(xp.abs(w).sum())
            if l2 > 0:
                total += 0.5 * l2 * float(xp.dot(w.ravel(), w.ravel()))
        return total

    @on_device
    def compute_gradient_and_score(self, dataset: Any) -> tuple[Any, float]:
        """Gradient of the mean loss over the minibatch (training mode) and the score.

        Args:
            dataset: a minibatch with features and labels (and optional masks): host arrays (copied to
                the device once) or arrays of the network's device.

        Returns:
            (a copy of the flat gradient, without regularization terms, on the network's device; the
            score including the l1/l2 penalty). Batch-norm running statistics have zero gradient.
        """
        score = self._gradient(dataset)
        return self._grad.copy(), score

    def _compute_update(self, dataset: Any) -> tuple[Any, float, bool]:
        """(the flat update, the score, whether the step counts): an fp16 step with a non-finite gradient
        is skipped, its update zero."""
        scaler = self._step_loss_scaler()
        score = self._gradient(dataset, 1.0 if scaler is None else scaler.scale)
        grad = self._grad
        kernels = self._device.kernels
        # Checked before the updater runs, so a bad batch leaves parameters and updater state untouched.
        # On a GPU this check and the one after the updater each read back one boolean. The score is
        # unscaled (the scale enters at the loss gradient): a non-finite one is an error at any precision.
        if not np.isfinite(score):
            self._raise_non_finite("score", score, dataset)
        sparse = self._row_sparse()
        finite = self._all_finite(grad, sparse)
        if scaler is not None:
            if not finite:  # overflow of the scaled gradient: skip the step (a zero update), back off
                scaler.update(False)
                grad.fill(0)
                return grad, score, False
            grad *= 1.0 / scaler.scale  # a power of two: exact (a dense pass: fp16 runs on GPUs)
        elif not finite:
            self._raise_non_finite("gradient", score, dataset)
        self._normalize_gradient()
        for w, g, key in self._weights:
            l1, l2 = self.conf.setting(key, "l1"), self.conf.setting(key, "l2")
            if l1 > 0 or l2 > 0:
                kernels.regularize_gradient(w, g, l1, l2)
        # Schedules (learning rate, momentum) read the counters before this step's increment, as in
        # DL4J; weight decay scales by the same step's (scheduled) learning rate.
        iteration, epoch = int(self.iteration_count), int(self.epoch_count)
        # every block's values first: a scheduled value out of range fails before any state changes
        hyper = [block.updater.kernel_kwargs(iteration, epoch) for block in self._blocks]
        for block, values in zip(self._blocks, hyper):
            state = self._state[block.state_start : block.state_stop]
            if sparse and block.tables and state.size:  # lazy_updates: a stateful updater, touched rows
                self._lazy_update(block, state, iteration, epoch, values)
                continue
            for sl in block.dense if sparse else (slice(block.start, block.stop),):
                block.updater.apply(grad[sl], state, iteration, kernels, epoch, values)
            for table in block.tables if sparse else ():  # the touched rows; the others stay zero
                rows = self._table_rows(grad, table)
                block.updater.apply(rows.reshape(-1), state, iteration, kernels, epoch, values)
                self._table(grad, table)[table.runtime.touched] = rows
        for w, g, key in self._weights:
            wd = self.conf.setting(key, "weight_decay")
            if wd > 0:
                lr = self.conf.setting(key, "updater").learning_rate_at(iteration, epoch)
                kernels.apply_weight_decay(w, g, wd * lr)
        for sl, rt in self._stats:  # running statistics: params -= (old - new) sets them to new
            c = rt.new_mean.shape[0]
            grad[sl.start : sl.start + c] = self._params[sl.start : sl.start + c] - rt.new_mean
            grad[sl.start + c : sl.stop] = self._params[sl.start + c : sl.stop] - rt.new_var
        if not self._all_finite(grad, sparse):
            self._raise_non_finite("update", score, dataset)
        if scaler is not None:
            scaler.update(True)
        for table in self._sparse_tables:  # its gradient is zero but for the touched rows, then
            table.runtime.grad_clean = sparse
        self.iteration_count += 1
        return grad, score, True

    def _lazy_update(self, block: _UpdaterBlock, state: Any, iteration: int, epoch: int, values: Any) -> None:
        """The updater of ``block`` (stateful; its state laid out as consecutive blocks of one value per
        parameter) over the block's ranges around its tables and the tables' touched rows only: those
        entries of the gradient and of every state block are gathered, stepped and written back."""
        xp = self._device.xp
        parts = [xp.arange(sl.start, sl.stop) for sl in block.dense]
        for table in block.tables:
            width = table.runtime.conf.n_out
            rows = table.runtime.touched
            parts.append((table.start + rows[:, None] * width + xp.arange(width)[None, :]).reshape(-1))
        pos = xp.concatenate(parts)
        n = block.stop - block.start
        state_pos = ((pos - block.start)[None, :] + n * xp.arange(state.size // n)[:, None]).reshape(-1)
        grad, kept = self._grad[pos], state[state_pos]
        block.updater.apply(grad, kept, iteration, self._device.kernels, epoch, values)
        self._grad[pos] = grad
        state[state_pos] = kept

    @on_device
    def _fit_step(self, dataset: Any) -> tuple[float, bool]:
        """One training step in place: ``apply_update(compute_update(dataset)[0])`` without the copy of
        the update and, after a row-sparse step, subtracting only where it wrote, as ``fit`` steps;
        parameter averaging's workers run it. Returns (score, whether the step counted: an fp16 step with a
        non-finite gradient changes nothing)."""
        update, score, stepped = self._compute_update(dataset)
        if stepped:
            self.apply_update(update)
        return score, stepped

    def update_support(self, update: Any) -> Any:
        """Where ``update`` may be non-zero when it is the network's own update buffer after a row-sparse
        step (``compute_update(copy=False)``): the flat indices of the ranges around the row-sparse tables
        and of the tables' looked-up rows (distinct, not sorted), an int64 array of the network's device.
        The update is exactly zero elsewhere, so an encoder adds only these elements to its residual
        (:meth:`sparkgrad.compress.EncodingHandler.encode`'s ``support``). None (non-zero anywhere, as
        far as the caller knows) for any other array, after a dense step, or when those indices are an
        eighth of the parameters or more (a pass over the whole vector then costs no more).

        Args:
            update: the array ``compute_update`` returned.
        """
        self._require_init()
        tables = self._sparse_tables
        if update is not self._grad or not (tables and all(t.runtime.grad_clean for t in tables)):
            return None
        size = sum(sl.stop - sl.start for sl in self._dense_ranges)
        size += sum(int(t.runtime.touched.size) * t.runtime.conf.n_out for t in tables)
        if 8 * size >= self._n_params:
            return None
        xp = self._device.xp
        parts = [xp.arange(sl.start, sl.stop, dtype=xp.int64) for sl in self._dense_ranges]
        for table in tables:
            width = table.runtime.conf.n_out
            rows = table.runtime.touched.astype(xp.int64)
            parts.append((table.start + rows[:, None] * width + xp.arange(width)[None, :]).reshape(-1))
        return xp.concatenate(parts)

    def _apply_own_update(self, factor: Any) -> bool:
        """``params -= `` the update the last step left in the network's own buffer (times ``factor``
        unless None), where a row-sparse step wrote it only (the ranges around the tables and the
        tables' touched rows); False (nothing done) when the last step was dense."""
        if not (self._sparse_tables and all(t.runtime.grad_clean for t in self._sparse_tables)):
            return False
        params, update = self._params, self._grad
        for sl in self._dense_ranges:
            params[sl] -= update[sl] if factor is None else update[sl] * factor
        for table in self._sparse_tables:
            rows = self._table_rows(update, table)
            self._table(params, table)[table.runtime.touched] -= rows if factor is None else rows * factor
        return True

    def _result(self, y: Any, given: Any) -> Any:
        """A new array holding ``y`` (an array of the device): on the device when ``given`` (the
        caller's input) is a GPU array of any kind (CuPy, ``__cuda_array_interface__``, DLPack) or one
        of the device's own arrays, else on the host (NumPy in, NumPy out)."""
        device = self._device
        if device.owns(given) or is_gpu_array(given):
            return y.copy()
        host = device.to_host(y)
        return host.copy() if host is y else host

    def _raise_non_finite(self, what: str, score: float, dataset: Any) -> None:
        """TrainingError naming the iteration and the first non-finite input, if any input is."""
        inputs: list[tuple[str, Any]] = []
        for name in ("features", "labels", "features_mask", "labels_mask", "features_masks", "labels_masks"):
            value = getattr(dataset, name, None)
            if isinstance(value, list):  # a MultiDataSet's arrays, named by position
                inputs.extend((f"{name}[{k}]", v) for k, v in enumerate(value))
            else:
                inputs.append((name, value))
        inputs.append(("parameters", self._params))
        device = self._device
        cause = "every input is finite: the computation overflowed (learning rate or inputs too large?)"
        for name, value in inputs:
            if value is None:
                continue
            arr = device.to_host(device.asarray(value))
            if not np.issubdtype(arr.dtype, np.floating):
                continue
            bad = np.argwhere(~np.isfinite(arr))
            if bad.size:
                index = ", ".join(str(int(i)) for i in bad[0])
                cause = f"first non-finite input: {name}[{index}] = {arr[tuple(bad[0])]}"
                break
        kept = "parameters were" if what == "update" else "parameters and updater state were"
        raise TrainingError(
            f"iteration {int(self.iteration_count)}: non-finite {what} (score {score}); {cause}; "
            f"{kept} left unchanged"
        )

    @on_device
    def compute_update(self, dataset: Any, *, copy: bool = True) -> tuple[Any, float]:
        """gradient -> gradient normalization -> l1/l2 -> updater -> weight decay: the flat vector that
        ``fit`` subtracts.

        Advances the updater state and ``iteration_count``; parameters are unchanged. An fp16 network on
        a GPU whose scaled gradient is not finite skips the step (``skipped_steps``): the update is zero
        (nothing for gradient sharing to encode), the updater state and ``iteration_count`` stay as they
        were and the loss scale halves.

        Args:
            dataset: a minibatch with features and labels (host arrays, or arrays of the device).
            copy: False returns the network's own update buffer instead of a copy (a pass over every
                parameter saved: 10 ms a step at 17M parameters): read-only, and valid only until the
                network's next step.

        Returns:
            (the flat update on the network's device, the minibatch score).
        """
        update, score, _ = self._compute_update(dataset)
        return (update.copy() if copy else update), score

    @on_device
    def params_finite(self, indices: Any = None) -> bool:
        """Whether every parameter is finite: one float64 sum on the network's device (no temporary of
        the parameters' size); only a sum that overflows float64 looks at every element.

        Args:
            indices: only these parameters (an integer array, e.g. those a sparse update changed: the
                others kept their values).
        """
        self._require_init()
        xp = self._device.xp
        if indices is not None:
            return bool(xp.isfinite(self._params[self._device.asarray(indices)]).all())
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing or nan sum is the answer
            total = float(xp.sum(self._params, dtype=xp.float64))
        return math.isfinite(total) or bool(xp.isfinite(self._params).all())

    @on_device
    def apply_update(self, update: Any, scale: float = 1.0) -> None:
        """``params -= update * scale`` in place (``update``: a device array, or a host array copied
        across; ``scale`` a factor in the parameters' dtype, the product rounded as ``update * scale``
        is). Given the network's own update buffer (``compute_update(copy=False)``) after a row-sparse
        step, only where that step wrote it: a step costs what its batch looked up, not the tables' size."""
        self._require_init()
        factor = None if scale == 1.0 else self._params.dtype.type(scale)
        if update is self._grad and self._apply_own_update(factor):
            return
        u = self._device.asarray(update)
        if u.shape != self._params.shape:
            raise ValueError(
                f"update: expected a flat vector of length {self._n_params}, got shape {u.shape}"
            )
        if factor is not None:
            u = u * factor
        self._device.xp.subtract(self._params, u, out=self._params, casting="same_kind")

    @on_device
    def apply_sparse_message(self, message: np.ndarray) -> None:
        """``params -= `` a sparse threshold-encoded message decoded, touching only its indices: what
        ``apply_update`` of the message decoded into zeros does, bit for bit, in O(entries) instead of two
        passes over every parameter (:func:`sparkgrad.compress.subtract_message`). How a gradient-sharing
        replica on the CPU or a CUDA GPU applies a peer's sparse message.

        Args:
            message: 1-D int32 host message with flag 0 (sparse) of ``num_params()`` elements; a bitmap
                or malformed message raises ``ValueError`` and changes nothing.
        """
        self._require_init()
        subtract_message(message, self._params)

    # -- training -----------------------------------------------------------------------------
    @on_device
    def fit(self: N, data: Any, labels: Any = None, epochs: int = 1, batch_size: int | None = None) -> N:
        """Train: each minibatch is ``apply_update(compute_update(batch)[0])`` plus listeners (a step an fp16
        network skips for a non-finite gradient is neither applied nor reported to the listeners).

        Args:
            data: a DataSet or MultiDataSet (one minibatch per epoch unless ``batch_size`` is given), a
                feature array with ``labels``, an ``(x, y)`` tuple of arrays, or a re-iterable collection
                of those minibatches (see :func:`sparkgrad.data.inputs.training_batches`).
            labels: the label array when ``data`` is a feature array.
            epochs: number of passes over ``data``; ``epoch_count`` grows by one per pass.
            batch_size: examples per minibatch (default 32 for arrays; batches as given otherwise).
                Each minibatch's host arrays are copied to the network's device once.

        Returns:
            self
        """
        self._require_init()
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs: expected a positive integer, got {epochs!r}")
        batches = training_batches(data, labels, batch_size, epochs)
        for _ in range(epochs):
            for batch in self._training_batches(batches):
                update, _, stepped = self._compute_update(batch)  # as _fit_step (one frame less: warnings)
                if not stepped:  # fp16 skipped it: no update, no iteration for the listeners
                    continue
                self.apply_update(update)
                for listener in self.listeners:
                    listener.iteration_done(self, self.iteration_count, self.epoch_count)
            self.epoch_count += 1
            for listener in self.listeners:
                listener.on_epoch_end(self)
        return self

    def rnn_clear_previous_state(self) -> None:
        """Forget the state kept by ``rnn_time_step`` in every recurrent layer."""
        self._require_init()
        for rt in self._runtimes:
            if hasattr(rt, "clear_state"):
                rt.clear_state()

    def get_score(self, dataset: Any = None) -> float:
        """DL4J-style alias of ``score``."""
        return self.score(dataset)

    # -- truncated BPTT -----------------------------------------------------------------------
    def tbptt_segments(self, dataset: Any) -> list[TbpttSegment]:
        """A minibatch cut into the truncated-BPTT segments ``fit`` trains one update each.

        Args:
            dataset: a DataSet or MultiDataSet whose sequences (features (batch, size, time) and labels
                (batch, n_out, time)) all have the same number of time steps; its other arrays (a
                graph's non-recurrent inputs and outputs) go whole into every segment (DL4J).

        Returns:
            segments of ``conf.tbptt_forward_length`` time steps (the last may be shorter); the first
            clears the recurrent state, the others continue from the state the previous one ended in.
        """
        length = self.conf.tbptt_forward_length
        steps = sequence_steps(dataset)
        return [TbpttSegment(dataset, start, min(start + length, steps)) for start in range(0, steps, length)]

    def _training_batches(self, batches: Iterable[Any]) -> Iterable[Any]:
        """The minibatches ``fit`` and the Spark workers train, one update each: as given, or cut into
        truncated-BPTT segments."""
        if self.conf.backprop_type is not BackpropType.TRUNCATED_BPTT:
            yield from batches
            return
        for batch in batches:
            yield from self.tbptt_segments(batch)
            self.rnn_clear_previous_state()  # DL4J: no state carries over to the next minibatch

    def _tbptt_backward_steps(self, dataset: Any, steps: int) -> int | None:
        """How far the backward of a training pass over ``dataset`` reaches back in time (None: all the
        way, a non-stateful pass). A segment clears the recurrent state if it starts its minibatch and
        runs statefully; a whole minibatch of a truncated-BPTT network (``steps``: its longest input
        sequence) may be no longer than one segment."""
        if isinstance(dataset, TbpttSegment):
            if dataset.first:
                self.rnn_clear_previous_state()
            return self.conf.tbptt_backward_length
        if self.conf.backprop_type is BackpropType.TRUNCATED_BPTT and steps > self.conf.tbptt_forward_length:
            raise ValueError(
                f"dataset: {steps} time steps exceed tbptt_forward_length "
                f"{self.conf.tbptt_forward_length}; with truncated BPTT train through fit(), or pass the "
                "segments of tbptt_segments(dataset)"
            )
        return None

    def set_listeners(self, *listeners: TrainingListener) -> None:
        """Replace the training listeners."""
        for listener in listeners:
            if not isinstance(listener, TrainingListener):
                raise TypeError(
                    f"listeners: expected TrainingListener instances, got {type(listener).__name__}"
                )
        self.listeners = list(listeners)

    def add_listeners(self, *listeners: TrainingListener) -> None:
        """Append training listeners."""
        self.set_listeners(*self.listeners, *listeners)

    # -- persistence --------------------------------------------------------------------------
    @on_device
    def save(self, path_or_binary_file: PathOrFile, save_updater: bool = True, compress: bool = True) -> None:
        """Write the model as a zip (format documented in :mod:`sparkgrad.nn.serialization`).

        Args:
            path_or_binary_file: a path (created or truncated) or a writable binary file object.
            save_updater: also save the updater state (recorded in the file either way, so that a
                loader can tell a state that was not saved from one that was lost) and an fp16
                network's loss-scaler state (scale, good steps, skipped steps).
            compress: deflate the parameters and updater state (False stores them: several times
                faster to write, a few per cent larger for float32 values; checkpoints use it).

        Raises:
            ValueError: non-finite parameters or updater state (such a file could not be loaded).
        """
        self._require_init()
        model_files.write_model(
            path_or_binary_file,
            type(self).__name__,
            self.conf.to_json(),
            self._device.to_host(self._params),
            self._device.to_host(self._state) if save_updater else None,
            self.iteration_count,
            self.epoch_count,
            self._loss_scaler.state() if save_updater and self._loss_scaler is not None else None,
            compress,
        )

    @classmethod
    def load(
        cls: type[N], path_or_binary_file: PathOrFile, load_updater: bool = True, device: Any = "cpu"
    ) -> N:
        """Read a model written by :meth:`save` (format versions 1 and 2).

        Args:
            path_or_binary_file: a path or a readable, seekable binary file object.
            load_updater: restore the updater state and an fp16 network's loss-scaler state. A file
                saved with ``save_updater=False`` (or by a stateless updater) has none and loads with a
                fresh (zero) state; a state the file says was saved but that is missing or damaged is
                an error either way. Without a saved loss-scaler state the scaler starts afresh.
            device: the device of the loaded network (as for the constructor).

        Returns:
            The network, with parameters, updater state and iteration/epoch counts as saved.

        Raises:
            FileNotFoundError: the path does not exist.
            CorruptDataError: a foreign or damaged file, naming the file and the member: bad zip
                structure or CRC, invalid metadata or counters, a configuration that does not
                parse, coefficients or state of the wrong dtype or length or not finite.
        """
        with model_files.ModelReader(path_or_binary_file, cls.__name__) as reader:
            conf = reader.configuration(cls._conf_class.from_json)
            dtype = np.dtype(conf.dtype)
            params = reader.vector(model_files.COEFF_MEMBER, cls._configured_num_params(conf), dtype)
            net = cls(conf, device=device).init(params)
            if reader.has_updater_state:
                state = reader.vector(model_files.STATE_MEMBER, net._state.size, dtype)
                if load_updater:
                    net.set_updater_state(state)
            scaler = reader.loss_scaler
            if scaler is not None and net._loss_scaler is None:
                raise CorruptDataError(
                    f"{reader.name}: {model_files.META_MEMBER}: holds a loss-scaler state, but the "
                    f"configuration's precision is {conf.precision!r}, not 'fp16'"
                )
            if scaler is not None and load_updater:
                net._loss_scaler = scaler
            net.iteration_count = reader.iteration_count
            net.epoch_count = reader.epoch_count
        return net

    @on_device
    def clone(self: N) -> N:
        """An independent copy on the same device: configuration, parameters, updater state, counters, an
        fp16 network's loss-scaler state and ``fold_batch_norm``."""
        self._require_init()
        net = type(self)(copy.deepcopy(self.conf), device=self._device).init(self._params)
        net.set_updater_state(self._state)
        net.iteration_count, net.epoch_count = self.iteration_count, self.epoch_count
        net._dropout_seed = self._dropout_seed
        net._last_score = self._last_score
        net.fold_batch_norm = self.fold_batch_norm
        net._loss_scaler = copy.copy(self._loss_scaler)
        return net


__all__ = ["FlatNetwork"]
