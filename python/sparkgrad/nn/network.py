"""MultiLayerNetwork: a sequential network over ONE flat parameter buffer.

Layout: layers in order, each layer's parameters in ``param_specs`` order (dense: W (n_in, n_out) then
b; convolution: W (K, C, R, S) then b; batch norm: gamma, beta, running mean, running var), each array
C-contiguous. The gradient and the update share one flat buffer with the same layout; the updater
state is one flat vector made of one block per run of consecutive layers sharing an updater
(``state_size`` entries each, laid out as the kernel defines). The buffers, the training step, ``fit``
and persistence are :class:`~sparkgrad.nn._flat_network.FlatNetwork`'s.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from sparkgrad.nn import layers as L
from sparkgrad.nn._flat_network import FlatNetwork
from sparkgrad.nn._runtime import OutputRuntime
from sparkgrad.nn.conf import MultiLayerConfiguration
from sparkgrad.nn.input_type import InputType


class MultiLayerNetwork(FlatNetwork):
    """A sequential network built from a :class:`MultiLayerConfiguration`.

    Args:
        conf: the configuration (not copied; treat it as immutable once the network exists).
    """

    _conf_class = MultiLayerConfiguration

    @classmethod
    def _layer_units(cls, conf: MultiLayerConfiguration) -> list[tuple[Any, L.Layer, InputType]]:
        return [(i, layer, conf.layer_input_types[i]) for i, layer in enumerate(conf.layers)]

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


__all__ = ["MultiLayerNetwork"]
