"""MultiLayerNetwork: a sequential network over ONE flat parameter buffer.

Layout: layers in order, each layer's parameters in ``param_specs`` order (dense: W (n_in, n_out) then
b; convolution: W (K, C, R, S) then b; batch norm: gamma, beta, running mean, running var), each array
C-contiguous. The gradient and the update share one flat buffer with the same layout; the updater
state is one flat vector made of one block per run of consecutive layers sharing an updater
(``state_size`` entries each, laid out as the kernel defines). The buffers, the training step, ``fit``
and persistence are :class:`~sparkgrad.nn._flat_network.FlatNetwork`'s.
"""

from __future__ import annotations

from typing import Any, Iterable, overload

import numpy as np

from sparkgrad.nn import layers as L
from sparkgrad.nn._flat_network import FlatNetwork, on_device
from sparkgrad.nn._recurrent import (
    GlobalPoolingTimeRuntime,
    LayerTrace,
    TbpttSegment,
    layer_backward,
    layer_forward,
    sequence_features,
    sequence_mask,
    steps_to_rows,
)
from sparkgrad.nn._runtime import OutputRuntime, Window1DRuntime, index_dtype
from sparkgrad.nn.conf import MultiLayerConfiguration
from sparkgrad.nn.input_type import InputType


class MultiLayerNetwork(FlatNetwork):
    """A sequential network built from a :class:`MultiLayerConfiguration`.

    Args:
        conf: the configuration (not copied; treat it as immutable once the network exists).
        device: where parameters, gradients, updater state and activations live and the kernels run:
            ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`~sparkgrad.device.Device`.
    """

    _conf_class = MultiLayerConfiguration
    conf: MultiLayerConfiguration

    @classmethod
    def _layer_units(cls, conf: MultiLayerConfiguration) -> list[tuple[Any, L.Layer, InputType]]:
        return [(i, layer, conf.layer_input_types[i]) for i, layer in enumerate(conf.layers)]

    # -- data preparation -----------------------------------------------------------------------
    @property
    def _recurrent_output(self) -> bool:
        return self.conf.output_type.kind == "recurrent"

    def _features(self, features: Any) -> Any:
        """Features as the first layer sees them: on the device, contiguous, network dtype, NCHW;
        recurrent (N, T, C) (a 1-D window layer first gets the (N, T, C) view of (N, C, T) features)."""
        x = self._device.asarray(features, index_dtype(self.conf.layers[0], features, self.dtype))
        it = self.conf.input_type
        expected = it.shape() if it is not None else self.conf.layer_input_types[0].shape()
        if it is not None and it.kind == "recurrent":
            x = sequence_features(x, it, self._device, "features", contiguous=False)
            first = getattr(self, "_runtimes", [None])[0]
            return x if isinstance(first, Window1DRuntime) else self._device.xp.ascontiguousarray(x)
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

    def _features_mask(self, mask: Any, x: np.ndarray) -> np.ndarray | None:
        """The features mask (N, T) in the network dtype for features ``x`` as ``_features`` returns them."""
        if mask is None:
            return None
        if not self.conf.is_recurrent:
            raise ValueError(
                "features_mask: only recurrent input (InputType.recurrent) takes a features mask, the "
                f"network input is {self.conf.layer_input_types[0].describe()}"
            )
        return sequence_mask(mask, x, self._device, self.dtype, "features_mask")

    @overload
    def _to_steps(self, arr: np.ndarray, name: str, n: int) -> np.ndarray: ...
    @overload
    def _to_steps(self, arr: None, name: str, n: int) -> None: ...
    def _to_steps(self, arr: np.ndarray | None, name: str, n: int) -> np.ndarray | None:
        """Recurrent-output labels (N, C, T) -> (N*T, C); masks (N, T) -> (N*T,); ``n`` rows expected."""
        if arr is None:
            return None
        if self._recurrent_output:
            a = steps_to_rows(arr, self._device, self.dtype, name, is_mask=name == "labels_mask")
        else:
            a = self._device.asarray(arr, self.dtype)
        if a.shape[0] != n:
            raise ValueError(f"{name}: has {a.shape[0]} rows but the features give {n}")
        return a

    def _labels(self, dataset: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Labels and the loss mask as output rows after a forward pass of features ``x``: the labels mask,
        else (recurrent output) the features mask as it reached the output layer, so that padded steps
        never count (DL4J passes the features mask on to the output layer)."""
        labels = getattr(dataset, "labels", None)
        if labels is None:
            raise ValueError("dataset: labels are required for training and scoring")
        # rows of the output layer: examples, or examples times its time steps for recurrent output
        n = x.shape[0] * self._out_steps if self._recurrent_output else x.shape[0]
        y = self._to_steps(labels, "labels", n)
        last = len(self.conf.layers) - 1
        n_out = self.conf.output_type.size
        if y.ndim != 2 or y.shape[1] != n_out:
            raise L.layer_error(
                last, self.conf.layers[last], "n_out", f"is {n_out} but the labels have shape {y.shape}"
            )
        mask = self._to_steps(getattr(dataset, "labels_mask", None), "labels_mask", n)
        if mask is None and self._out_mask is not None and self._recurrent_output:
            mask = self._out_mask.reshape(-1)
        return y, mask

    def _inputs(self, data: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """(features, features mask) of a DataSet or of a bare features array."""
        features = getattr(data, "features", data)
        x = self._features(features)
        return x, self._features_mask(getattr(data, "features_mask", None), x)

    # -- forward / backward -------------------------------------------------------------------
    def _forward(
        self,
        x: np.ndarray,
        train: bool,
        activate_output: bool,
        mask: np.ndarray | None = None,
        stateful: bool = False,
        backward_steps: int | None = None,
    ) -> np.ndarray:
        """Forward pass. Recurrent activations travel as (N, T, C) with the features mask (N, T); layers
        that are not recurrent run at every step on (N*T, C) rows, their masked steps' outputs zeroed
        (DL4J's per-step masking); a layer that changes the number of steps (the 1-D layers) passes its
        own mask on. Returns the (folded) pre-activation or the activated output; keeps the mask and the
        number of steps that reached the output layer (``_out_mask``, ``_out_steps``)."""
        self._traces: list[LayerTrace] = []
        last = len(self._runtimes) - 1
        folds, absorbed = self._inference_plan(train)
        for i, rt in enumerate(self._runtimes):
            if i in folds or i in absorbed:  # inference: conv + batch norm (+ activation) in one kernel
                x = folds[i].forward(x) if i in folds else x
                self._traces.append(LayerTrace(x.shape, None))
                continue
            preout = i == last and not activate_output
            if i == last:
                self._out_mask, self._out_steps = mask, x.shape[1] if x.ndim > 1 else 1
            x, trace = layer_forward(
                rt, self.conf.layers[i], self.conf.layer_input_types[i], x, mask, train, self._seed(i),
                preout=preout, stateful=stateful, backward_steps=backward_steps,
            )  # fmt: skip
            mask = trace.mask
            self._traces.append(trace)
        return x

    def _build_runtimes(self) -> None:
        super()._build_runtimes()
        # adjacent 1-D window layers (and the global pooling after them) hand on their (N, C, T) results
        # as (N, T, C) views instead of copying them into that layout and back
        for below, above in zip(self._runtimes, self._runtimes[1:]):
            if isinstance(below, Window1DRuntime):
                below.hands_channel_major = isinstance(above, (Window1DRuntime, GlobalPoolingTimeRuntime))
                if isinstance(above, Window1DRuntime):
                    above.returns_channel_major_dx = True

    def _sole_consumers(self) -> dict[Any, Any]:
        return {i: i + 1 for i in range(len(self.conf.layers) - 1)}

    def _n_examples(self, dataset: Any) -> int:
        return int(np.shape(dataset.features)[0])

    def _backward(self, labels: np.ndarray, mask: np.ndarray | None, n: int, loss_scale: float) -> None:
        """Backward pass after ``_forward(activate_output=False)``: gradients of the loss times
        ``loss_scale`` into ``self._grad``."""
        out: OutputRuntime = self._runtimes[-1]
        # a frozen layer passes no gradient back: the pass stops above the highest one
        bottom = self.conf.trained_from
        dy = out.backward(labels, mask, n, need_dx=len(self._runtimes) - 1 > bottom, loss_scale=loss_scale)
        for i in range(len(self._runtimes) - 2, bottom - 1, -1):
            assert dy is not None  # every layer above the lowest trained one passes dL/dx down
            dy = layer_backward(self._runtimes[i], dy, self._traces[i], need_dx=i > bottom)
        for sl, _ in self._stats:
            self._grad[sl] = 0.0

    def _gradient(self, dataset: Any, loss_scale: float = 1.0) -> float:
        """Flat gradient (no regularization) of the loss times ``loss_scale`` into ``self._grad``; returns
        the (unscaled) score with penalties."""
        self._require_init()
        x, fmask = self._inputs(dataset)
        n = self._n_examples(dataset)
        steps = self._tbptt_backward_steps(dataset, x.shape[1] if self.conf.is_recurrent else 0)
        self._forward(
            x, train=True, activate_output=False, mask=fmask, stateful=steps is not None, backward_steps=steps
        )
        labels, mask = self._labels(dataset, x)
        score = float(self._runtimes[-1].scores(labels, mask).sum()) / n
        self._backward(labels, mask, n, loss_scale)
        self._last_score = score + self._penalty()
        return self._last_score

    # -- inference and scoring ----------------------------------------------------------------
    @on_device
    def output(self, features: Any, train: bool = False, features_mask: Any = None) -> Any:
        """Network output (activated) for ``features``; a new array.

        Args:
            features: a batch shaped as the input type says (recurrent: (batch, size, time)), or a
                DataSet, whose features and features mask are used. A host array (NumPy) gives a
                NumPy output; an array of the network's device gives one of that device.
            train: run in training mode (dropout on, batch statistics in batch norm).
            features_mask: (batch, time) mask of recurrent input (1 = present, 0 = padding); overrides
                a DataSet's. Outputs at masked steps are zero.

        Returns:
            (batch, n_out) array, or (batch, n_out, time) for recurrent output.
        """
        self._require_init()
        x, mask = self._inputs(features)
        if features_mask is not None:
            mask = self._features_mask(features_mask, x)
        y = self._forward(x, train=train, activate_output=True, mask=mask)
        return self._external(y, x.shape[0], getattr(features, "features", features))

    def _external(self, y: Any, n: int, given: Any) -> Any:
        """Output rows -> DL4J's layout: (N, C), or (N, C, T) for recurrent output; a new array of the
        kind ``given`` is (see ``_result``)."""
        if self._recurrent_output:
            y = y.reshape(n, -1, y.shape[-1]).transpose(0, 2, 1)
        return self._result(y, given)

    @on_device
    def rnn_time_step(self, features: Any, features_mask: Any = None) -> Any:
        """Stateful inference: continue every recurrent layer from the state the previous call ended in.

        Args:
            features: (batch, size) for one time step or (batch, size, time) for several.
            features_mask: optional (batch, time) mask ((batch, 1) or (batch,) for one step).

        Returns:
            (batch, n_out) for a single step given as 2-D, else as :meth:`output` (the same kind of
            array as ``features``).
        """
        self._require_init()
        if not self.conf.is_recurrent:
            raise ValueError("features: rnn_time_step needs a network with recurrent input")
        arr = self._device.asarray(features, index_dtype(self.conf.layers[0], features, self.dtype))
        single = arr.ndim == 2
        x = self._features(arr[:, :, None] if single else arr)
        m = features_mask
        if m is not None and single:
            m = self._device.asarray(m).reshape(-1, 1)
        mask = self._features_mask(m, x)
        y = self._forward(x, train=False, activate_output=True, mask=mask, stateful=True)
        if single and self._recurrent_output:
            return self._result(y.reshape(x.shape[0], -1), features)  # one step: (N, C)
        return self._external(y, x.shape[0], features)

    def _example_scores(self, dataset: Any) -> Any:
        x, fmask = self._inputs(dataset)
        self._forward(x, train=False, activate_output=False, mask=fmask)
        labels, mask = self._labels(dataset, x)
        scores = self._runtimes[-1].scores(labels, mask).astype(np.float64)
        if self._recurrent_output:  # sum over the (unmasked) steps of each example
            scores = scores.reshape(self._n_examples(dataset), -1).sum(axis=1)
        return scores

    @on_device
    def score(self, dataset: Any = None) -> float:
        """Mean loss over the examples (inference mode) plus the l1/l2 penalty.

        Recurrent output: each example's loss is the sum over its present time steps (DL4J).

        Args:
            dataset: a DataSet; None returns the score of the last minibatch trained.
        """
        self._require_init()
        if dataset is None:
            if self._last_score is None:
                raise ValueError("dataset: no minibatch has been trained yet, pass a DataSet")
            return self._last_score
        return float(self._example_scores(dataset).sum()) / self._n_examples(dataset) + self._penalty()

    @on_device
    def score_examples(self, dataset: Any, include_regularization_terms: bool = False) -> np.ndarray:
        """Per-example loss (inference mode), optionally each plus the l1/l2 penalty; a NumPy array.

        Recurrent output: the sum over each example's present (unmasked) time steps.
        """
        self._require_init()
        scores = self._example_scores(dataset)
        if include_regularization_terms:
            scores += self._penalty()
        return self._device.to_host(scores)

    # -- evaluation ---------------------------------------------------------------------------
    def _batches(self, data: Any) -> Iterable[Any]:
        return [data] if hasattr(data, "features") else data

    @on_device
    def do_evaluation(self, data: Any, *evaluations: Any) -> list:
        """Feed every batch of ``data`` through the network into each evaluation (``.eval``).

        Recurrent output is evaluated per time step; masked steps (labels mask, else features mask)
        are not counted. On a GPU the outputs, labels and masks of each batch are copied to the host
        (evaluations count on the host).

        Returns:
            the evaluations, in order.
        """
        if not evaluations:
            raise ValueError("evaluations: pass at least one evaluation object")
        self._require_init()
        for batch in self._batches(data):
            x, fmask = self._inputs(batch)
            out = self._forward(x, train=False, activate_output=True, mask=fmask)
            labels, mask = self._labels(batch, x)
            out = out.reshape(labels.shape[0], -1)
            labels, out = self._device.to_host(labels), self._device.to_host(out)
            mask = None if mask is None else self._device.to_host(mask)
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


__all__ = ["MultiLayerNetwork", "TbpttSegment"]
