"""MultiLayerNetwork: a sequential network over ONE flat parameter buffer.

Layout: layers in order, each layer's parameters in ``param_specs`` order (dense: W (n_in, n_out) then
b; convolution: W (K, C, R, S) then b; batch norm: gamma, beta, running mean, running var), each array
C-contiguous. The gradient and the update share one flat buffer with the same layout; the updater
state is one flat vector made of one block per run of consecutive layers sharing an updater
(``state_size`` entries each, laid out as the kernel defines).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Iterable

import numpy as np

from sparkgrad._native import _core
from sparkgrad.data.inputs import training_batches
from sparkgrad.errors import TrainingError
from sparkgrad.nn import layers as L
from sparkgrad.nn import serialization as model_files
from sparkgrad.nn._runtime import OutputRuntime, build_runtime
from sparkgrad.nn.conf import MultiLayerConfiguration
from sparkgrad.nn.listeners import TrainingListener
from sparkgrad.nn.serialization import PathOrFile
from sparkgrad.nn.weight_init import init_weights


class _UpdaterBlock:
    """A contiguous parameter range trained by one updater, with its slice of the flat state."""

    def __init__(self, updater: Any, start: int, stop: int) -> None:
        self.updater, self.start, self.stop = updater, start, stop
        self.state_start = self.state_stop = 0


class MultiLayerNetwork:
    """A sequential network built from a :class:`MultiLayerConfiguration`.

    Args:
        conf: the configuration (not copied; treat it as immutable once the network exists).
    """

    def __init__(self, conf: MultiLayerConfiguration) -> None:
        if not isinstance(conf, MultiLayerConfiguration):
            raise TypeError(f"conf: expected a MultiLayerConfiguration, got {type(conf).__name__}")
        self.conf = conf
        self.dtype = np.dtype(conf.dtype)
        self.iteration_count = 0
        self.epoch_count = 0
        self.listeners: list[TrainingListener] = []
        self._params: np.ndarray | None = None
        self._last_score: float | None = None

    # -- construction -------------------------------------------------------------------------
    def init(self, params: np.ndarray | None = None) -> MultiLayerNetwork:
        """Allocate the flat buffers and initialise parameters (seeded by ``conf.seed``).

        Args:
            params: optional flat parameter vector copied in instead of the random initialisation.

        Returns:
            self
        """
        conf = self.conf
        layouts = []
        offset = 0
        for i, layer in enumerate(conf.layers):
            entries = []
            for spec in layer.param_specs(conf.layer_input_types[i]):
                size = int(np.prod(spec.shape))
                entries.append((spec, offset, offset + size))
                offset += size
            layouts.append(entries)
        self._n_params = offset
        self._params = np.zeros(offset, dtype=self.dtype)
        self._grad = np.zeros(offset, dtype=self.dtype)
        rng = np.random.default_rng(conf.seed)
        # dropout seeds derive from this, the iteration and the layer index: reproducible, thread-free
        self._dropout_seed = int(rng.integers(0, 2**62)) if conf.seed is None else conf.seed
        self._runtimes: list[Any] = []
        self._weights: list[tuple[np.ndarray, np.ndarray, int]] = []  # (param view, grad view, layer)
        self._stats: list[tuple[slice, Any]] = []  # batch-norm running statistics
        self._layer_ranges: list[tuple[int, int]] = []
        for i, (layer, entries) in enumerate(zip(conf.layers, layouts)):
            pviews, gviews = {}, {}
            for spec, start, stop in entries:
                pviews[spec.name] = self._params[start:stop].reshape(spec.shape)
                gviews[spec.name] = self._grad[start:stop].reshape(spec.shape)
                self._init_param(i, spec, pviews[spec.name], rng)
                if spec.role == L.WEIGHT:
                    self._weights.append((pviews[spec.name], gviews[spec.name], i))
            start = entries[0][1] if entries else 0
            stop = entries[-1][2] if entries else 0
            self._layer_ranges.append((start, stop))
            activation = conf.setting(i, "activation") if hasattr(layer, "activation") else None
            runtime = build_runtime(layer, conf.layer_input_types[i], activation, self.dtype, pviews, gviews)
            self._runtimes.append(runtime)
            if isinstance(layer, L.BatchNormalization):  # running mean then running var close the layer
                self._stats.append((slice(entries[2][1], stop), runtime))
        self._build_updater_blocks()
        if params is not None:
            self.set_params(params)
        return self

    def _init_param(self, index: int, spec: L.ParamSpec, view: np.ndarray, rng: np.random.Generator) -> None:
        if spec.role == L.WEIGHT:
            init_weights(self.conf.setting(index, "weight_init"), view, spec.fan_in, spec.fan_out, rng)
        else:  # biases, beta and running mean start at 0; gamma and running variance at 1
            view[...] = 1.0 if spec.role in (L.GAMMA, L.RUNNING_VAR) else 0.0

    def _build_updater_blocks(self) -> None:
        blocks: list[_UpdaterBlock] = []
        for i, (start, stop) in enumerate(self._layer_ranges):
            if start == stop:
                continue
            updater = self.conf.setting(i, "updater")
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
        self._state = np.zeros(state, dtype=self.dtype)

    def _require_init(self) -> None:
        if self._params is None:
            raise ValueError("the network is not initialised: call init() first")

    # -- parameters and updater state --------------------------------------------------------
    def params(self) -> np.ndarray:
        """The live flat parameter buffer (every layer's weights are views of it)."""
        self._require_init()
        return self._params

    def num_params(self) -> int:
        """Total number of parameters (including batch-norm running statistics)."""
        self._require_init()
        return self._n_params

    def set_params(self, flat: np.ndarray) -> None:
        """Copy ``flat`` (length ``num_params()``) into the parameter buffer."""
        self._require_init()
        self._copy_into(self._params, flat, "params")

    def updater_state(self) -> np.ndarray:
        """The live flat updater state (empty for stateless updaters such as Sgd)."""
        self._require_init()
        return self._state

    def set_updater_state(self, flat: np.ndarray) -> None:
        """Copy ``flat`` (length ``len(updater_state())``) into the updater state."""
        self._require_init()
        self._copy_into(self._state, flat, "updater state")

    @staticmethod
    def _copy_into(dest: np.ndarray, flat: Any, name: str) -> None:
        arr = np.asarray(flat)
        if arr.ndim != 1 or arr.shape[0] != dest.shape[0]:
            raise ValueError(
                f"{name}: expected a flat vector of length {dest.shape[0]}, got shape {arr.shape}"
            )
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"{name}: expected a floating-point vector, got dtype {arr.dtype}")
        np.copyto(dest, arr)

    # -- data preparation -----------------------------------------------------------------------
    def _features(self, features: Any) -> np.ndarray:
        """Features as the first layer sees them: contiguous, network dtype, NCHW / time folded."""
        x = np.ascontiguousarray(features, dtype=self.dtype)
        it = self.conf.input_type
        expected = it.shape() if it is not None else (self.conf.layers[0].n_in,)
        if it is not None and it.kind == "recurrent":
            if x.ndim != 3 or x.shape[1] != it.size:
                raise ValueError(f"features: expected shape (batch, {it.size}, time), got {x.shape}")
            return np.ascontiguousarray(x.transpose(0, 2, 1).reshape(-1, it.size))
        if it is not None and it.kind == "convolutional_flat":
            if x.ndim != 2 or x.shape[1] != it.size:
                raise ValueError(
                    f"features: expected shape (batch, {it.size}) (flattened images), got {x.shape}"
                )
            return x.reshape((x.shape[0], *expected))
        if x.shape[1:] != expected:
            raise ValueError(
                f"features: expected shape (batch, {', '.join(map(str, expected))}), got {x.shape}"
            )
        return x

    def _to_steps(self, arr: np.ndarray | None, name: str, n: int) -> np.ndarray | None:
        """Recurrent labels (N, C, T) -> (N*T, C); masks (N, T) -> (N*T,)."""
        if arr is None:
            return None
        a = np.asarray(arr, dtype=self.dtype)
        if self.conf.is_recurrent:
            if a.ndim == 3:
                a = a.transpose(0, 2, 1).reshape(-1, a.shape[1])
            elif a.ndim == 2 and name == "labels_mask":
                a = a.reshape(-1)
            else:
                raise ValueError(
                    f"{name}: expected a per-time-step array for recurrent input, got shape {a.shape}"
                )
        if a.shape[0] != n:
            raise ValueError(f"{name}: has {a.shape[0]} rows but the features give {n}")
        return np.ascontiguousarray(a)

    def _labels(self, dataset: Any, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        labels = getattr(dataset, "labels", None)
        if labels is None:
            raise ValueError("dataset: labels are required for training and scoring")
        y = self._to_steps(labels, "labels", n)
        last = len(self.conf.layers) - 1
        n_out = self.conf.output_type.size
        if y.ndim != 2 or y.shape[1] != n_out:
            raise L.layer_error(
                last, self.conf.layers[last], "n_out", f"is {n_out} but the labels have shape {y.shape}"
            )
        return y, self._to_steps(getattr(dataset, "labels_mask", None), "labels_mask", n)

    # -- forward / backward -------------------------------------------------------------------
    def _seed(self, index: int) -> int:
        return (self._dropout_seed * 1_000_003 + self.iteration_count * 1_009 + index) % (2**63)

    def _forward(self, x: np.ndarray, train: bool, activate_output: bool) -> np.ndarray:
        self._shapes = []
        last = len(self._runtimes) - 1
        for i, rt in enumerate(self._runtimes):
            self._shapes.append(x.shape)
            if x.ndim > 2 and self.conf.layers[i].flattens_input:
                x = x.reshape(x.shape[0], -1)  # automatic flattening in front of dense layers
            if i == last and not activate_output:
                return rt.preout(x, train, self._seed(i))
            x = rt.forward(x, train, self._seed(i))
        return x

    def _n_examples(self, dataset: Any) -> int:
        return int(np.shape(dataset.features)[0])

    def _gradient(self, dataset: Any) -> float:
        """Flat gradient (no regularization) into ``self._grad``; returns the score with penalties."""
        self._require_init()
        x = self._features(dataset.features)
        labels, mask = self._labels(dataset, x.shape[0])
        n = self._n_examples(dataset)
        self._forward(x, train=True, activate_output=False)
        out: OutputRuntime = self._runtimes[-1]
        score = float(out.scores(labels, mask).sum()) / n
        dy = out.backward(labels, mask, n, need_dx=len(self._runtimes) > 1)
        for i in range(len(self._runtimes) - 2, -1, -1):
            dy = dy.reshape(self._shapes[i + 1])
            dy = self._runtimes[i].backward(dy, need_dx=i > 0)
        for sl, _ in self._stats:
            self._grad[sl] = 0.0
        self._last_score = score + self._penalty()
        return self._last_score

    def _penalty(self) -> float:
        """DL4J's regularization score: sum over weights of l1 |w| + l2 / 2 w^2."""
        total = 0.0
        for w, _, i in self._weights:
            l1, l2 = self.conf.setting(i, "l1"), self.conf.setting(i, "l2")
            if l1 > 0:
                total += l1 * float(np.abs(w).sum())
            if l2 > 0:
                total += 0.5 * l2 * float(np.dot(w.ravel(), w.ravel()))
        return total

    def compute_gradient_and_score(self, dataset: Any) -> tuple[np.ndarray, float]:
        """Gradient of the mean loss over the minibatch (training mode) and the score.

        Args:
            dataset: a DataSet with features and labels (and optional labels_mask).

        Returns:
            (a copy of the flat gradient, without regularization terms; the score including the l1/l2
            penalty). Batch-norm running statistics have zero gradient.
        """
        score = self._gradient(dataset)
        return self._grad.copy(), score

    def _compute_update(self, dataset: Any) -> tuple[np.ndarray, float]:
        score = self._gradient(dataset)
        grad = self._grad
        # Checked before the updater runs, so a bad batch leaves parameters and updater state untouched.
        if not (np.isfinite(score) and np.isfinite(grad).all()):
            self._raise_non_finite("score" if not np.isfinite(score) else "gradient", score, dataset)
        for w, g, i in self._weights:
            l1, l2 = self.conf.setting(i, "l1"), self.conf.setting(i, "l2")
            if l1 > 0 or l2 > 0:
                _core.regularize_gradient(w, g, l1, l2)
        for block in self._blocks:
            block.updater.apply(
                grad[block.start : block.stop],
                self._state[block.state_start : block.state_stop],
                self.iteration_count,
            )
        for w, g, i in self._weights:
            wd = self.conf.setting(i, "weight_decay")
            if wd > 0:
                _core.apply_weight_decay(w, g, wd * self.conf.setting(i, "updater").learning_rate)
        for sl, rt in self._stats:  # running statistics: params -= (old - new) sets them to new
            c = rt.new_mean.shape[0]
            grad[sl.start : sl.start + c] = self._params[sl.start : sl.start + c] - rt.new_mean
            grad[sl.start + c : sl.stop] = self._params[sl.start + c : sl.stop] - rt.new_var
        if not np.isfinite(grad).all():
            self._raise_non_finite("update", score, dataset)
        self.iteration_count += 1
        return grad, score

    def _raise_non_finite(self, what: str, score: float, dataset: Any) -> None:
        """TrainingError naming the iteration and the first non-finite input, if any input is."""
        inputs = [
            ("features", getattr(dataset, "features", None)),
            ("labels", getattr(dataset, "labels", None)),
            ("features_mask", getattr(dataset, "features_mask", None)),
            ("labels_mask", getattr(dataset, "labels_mask", None)),
            ("parameters", self._params),
        ]
        cause = "every input is finite: the computation overflowed (learning rate or inputs too large?)"
        for name, value in inputs:
            if value is None:
                continue
            arr = np.asarray(value)
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

    def compute_update(self, dataset: Any) -> tuple[np.ndarray, float]:
        """gradient -> l1/l2 -> updater -> weight decay: the flat vector that ``fit`` subtracts.

        Advances the updater state and ``iteration_count``; parameters are unchanged.

        Args:
            dataset: a DataSet with features and labels.

        Returns:
            (a copy of the flat update, the minibatch score).
        """
        update, score = self._compute_update(dataset)
        return update.copy(), score

    def apply_update(self, update: np.ndarray) -> None:
        """``params -= update`` in place."""
        self._require_init()
        u = np.asarray(update)
        if u.shape != self._params.shape:
            raise ValueError(
                f"update: expected a flat vector of length {self._n_params}, got shape {u.shape}"
            )
        np.subtract(self._params, u, out=self._params, casting="same_kind")

    # -- training -----------------------------------------------------------------------------
    def fit(
        self, data: Any, labels: Any = None, epochs: int = 1, batch_size: int | None = None
    ) -> MultiLayerNetwork:
        """Train: each minibatch is ``apply_update(compute_update(batch)[0])`` plus listeners.

        Args:
            data: a DataSet (one minibatch per epoch unless ``batch_size`` is given), a feature array
                with ``labels``, an ``(x, y)`` tuple of arrays, or a re-iterable collection of DataSets
                or ``(x, y)`` batches (see :func:`sparkgrad.data.inputs.training_batches`).
            labels: the label array when ``data`` is a feature array.
            epochs: number of passes over ``data``; ``epoch_count`` grows by one per pass.
            batch_size: examples per minibatch (default 32 for arrays; batches as given otherwise).

        Returns:
            self
        """
        self._require_init()
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs: expected a positive integer, got {epochs!r}")
        batches = training_batches(data, labels, batch_size, epochs)
        for _ in range(epochs):
            for batch in batches:
                update, _ = self._compute_update(batch)
                self.apply_update(update)
                for listener in self.listeners:
                    listener.iteration_done(self, self.iteration_count, self.epoch_count)
            self.epoch_count += 1
            for listener in self.listeners:
                listener.on_epoch_end(self)
        return self

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

    # -- inference and scoring ----------------------------------------------------------------
    def output(self, features: Any, train: bool = False) -> np.ndarray:
        """Network output (activated) for ``features``; a new array.

        Args:
            features: a batch shaped as the input type says (or a DataSet, whose features are used).
            train: run in training mode (dropout on, batch statistics in batch norm).

        Returns:
            (batch, n_out) array, or (batch, n_out, time) for recurrent input.
        """
        self._require_init()
        features = getattr(features, "features", features)
        x = self._features(features)
        y = self._forward(x, train=train, activate_output=True).copy()
        if self.conf.is_recurrent:
            n = np.shape(features)[0]
            y = np.ascontiguousarray(y.reshape(n, -1, y.shape[1]).transpose(0, 2, 1))
        return y

    def _example_scores(self, dataset: Any) -> np.ndarray:
        x = self._features(dataset.features)
        labels, mask = self._labels(dataset, x.shape[0])
        self._forward(x, train=False, activate_output=False)
        scores = self._runtimes[-1].scores(labels, mask).astype(np.float64)
        if self.conf.is_recurrent:
            scores = scores.reshape(self._n_examples(dataset), -1).sum(axis=1)
        return scores

    def score(self, dataset: Any = None) -> float:
        """Mean loss over the examples (inference mode) plus the l1/l2 penalty.

        Args:
            dataset: a DataSet; None returns the score of the last minibatch trained.
        """
        self._require_init()
        if dataset is None:
            if self._last_score is None:
                raise ValueError("dataset: no minibatch has been trained yet, pass a DataSet")
            return self._last_score
        return float(self._example_scores(dataset).sum()) / self._n_examples(dataset) + self._penalty()

    def get_score(self, dataset: Any = None) -> float:
        """DL4J-style alias of :meth:`score`."""
        return self.score(dataset)

    def score_examples(self, dataset: Any, include_regularization_terms: bool = False) -> np.ndarray:
        """Per-example loss (inference mode), optionally each plus the l1/l2 penalty."""
        self._require_init()
        scores = self._example_scores(dataset)
        if include_regularization_terms:
            scores += self._penalty()
        return scores

    # -- evaluation ---------------------------------------------------------------------------
    def _batches(self, data: Any) -> Iterable[Any]:
        return [data] if hasattr(data, "features") else data

    def do_evaluation(self, data: Any, *evaluations: Any) -> list:
        """Feed every batch of ``data`` through the network into each evaluation (``.eval``).

        Returns:
            the evaluations, in order.
        """
        if not evaluations:
            raise ValueError("evaluations: pass at least one evaluation object")
        for batch in self._batches(data):
            out = self.output(batch.features)
            n = out.shape[0]
            labels = self._to_steps(batch.labels, "labels", self._features(batch.features).shape[0])
            mask = self._to_steps(getattr(batch, "labels_mask", None), "labels_mask", labels.shape[0])
            if self.conf.is_recurrent:
                out = out.transpose(0, 2, 1).reshape(-1, out.shape[1])
            elif out.shape[0] != n:
                raise ValueError("labels: row count differs from the features")
            for ev in evaluations:
                ev.eval(labels, out, mask=mask) if mask is not None else ev.eval(labels, out)
        return list(evaluations)

    def evaluate(self, data: Any) -> Any:
        """Classification :class:`sparkgrad.eval.Evaluation` over ``data``."""
        from sparkgrad.eval import Evaluation

        return self.do_evaluation(data, Evaluation())[0]

    def evaluate_roc(self, data: Any, threshold_steps: int = 0) -> Any:
        """Binary :class:`sparkgrad.eval.ROC` (single output column or two-class softmax)."""
        from sparkgrad.eval import ROC

        return self.do_evaluation(data, ROC(threshold_steps=threshold_steps))[0]

    def evaluate_roc_multi_class(self, data: Any, threshold_steps: int = 0) -> Any:
        """One-vs-all :class:`sparkgrad.eval.ROCMultiClass`."""
        from sparkgrad.eval import ROCMultiClass

        return self.do_evaluation(data, ROCMultiClass(threshold_steps=threshold_steps))[0]

    def evaluate_regression(self, data: Any) -> Any:
        """:class:`sparkgrad.eval.RegressionEvaluation` over ``data``."""
        from sparkgrad.eval import RegressionEvaluation

        return self.do_evaluation(data, RegressionEvaluation())[0]

    # -- persistence --------------------------------------------------------------------------
    def save(self, path_or_binary_file: PathOrFile, save_updater: bool = True) -> None:
        """Write the model as a zip (format documented in :mod:`sparkgrad.nn.serialization`).

        Args:
            path_or_binary_file: a path (created or truncated) or a writable binary file object.
            save_updater: also save the updater state (recorded in the file either way, so that a
                loader can tell a state that was not saved from one that was lost).

        Raises:
            ValueError: non-finite parameters or updater state (such a file could not be loaded).
        """
        self._require_init()
        model_files.write_model(
            path_or_binary_file,
            type(self).__name__,
            self.conf.to_json(),
            self._params,
            self._state if save_updater else None,
            self.iteration_count,
            self.epoch_count,
        )

    @classmethod
    def load(cls, path_or_binary_file: PathOrFile, load_updater: bool = True) -> MultiLayerNetwork:
        """Read a model written by :meth:`save` (format versions 1 and 2).

        Args:
            path_or_binary_file: a path or a readable, seekable binary file object.
            load_updater: restore the updater state. A file saved with ``save_updater=False`` (or by a
                stateless updater) has none and loads with a fresh (zero) state; a state the file
                says was saved but that is missing or damaged is an error either way.

        Returns:
            The network, with parameters, updater state and iteration/epoch counts as saved.

        Raises:
            FileNotFoundError: the path does not exist.
            CorruptDataError: a foreign or damaged file, naming the file and the member: bad zip
                structure or CRC, invalid metadata or counters, a configuration that does not
                parse, coefficients or state of the wrong dtype or length or not finite.
        """
        with model_files.ModelReader(path_or_binary_file, cls.__name__) as reader:
            conf = reader.configuration(MultiLayerConfiguration.from_json)
            dtype = np.dtype(conf.dtype)
            params = reader.vector(model_files.COEFF_MEMBER, _configured_num_params(conf), dtype)
            net = cls(conf).init(params)
            if reader.has_updater_state:
                state = reader.vector(model_files.STATE_MEMBER, net._state.size, dtype)
                if load_updater:
                    net.set_updater_state(state)
            net.iteration_count = reader.iteration_count
            net.epoch_count = reader.epoch_count
        return net

    def clone(self) -> MultiLayerNetwork:
        """An independent copy: configuration, parameters, updater state and counters."""
        self._require_init()
        net = type(self)(copy.deepcopy(self.conf)).init(self._params)
        net.set_updater_state(self._state)
        net.iteration_count, net.epoch_count = self.iteration_count, self.epoch_count
        net._dropout_seed = self._dropout_seed
        net._last_score = self._last_score
        return net

    def summary(self) -> str:
        """A table of layers with input/output shapes and parameter counts."""
        self._require_init()
        conf = self.conf
        rows = [("#", "layer", "input", "output", "params", "count")]
        for i, layer in enumerate(conf.layers):
            out_type = conf.layer_input_types[i + 1] if i + 1 < len(conf.layers) else conf.output_type
            specs = layer.param_specs(conf.layer_input_types[i])
            shapes = ", ".join(f"{s.name}{list(s.shape)}" for s in specs) or "-"
            start, stop = self._layer_ranges[i]
            in_type = conf.layer_input_types[i].describe()
            rows.append(
                (str(i), type(layer).__name__, in_type, out_type.describe(), shapes, str(stop - start))
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"Total parameters: {self._n_params} ({conf.dtype})")
        return "\n".join(lines)


def _configured_num_params(conf: MultiLayerConfiguration) -> int:
    """The parameter count ``init`` will allocate, computed without allocating (bounds file reads)."""
    return sum(
        math.prod(spec.shape)
        for i, layer in enumerate(conf.layers)
        for spec in layer.param_specs(conf.layer_input_types[i])
    )


__all__ = ["MultiLayerNetwork"]
