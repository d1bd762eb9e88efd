"""Classification evaluation: multi-class ``Evaluation`` and independent-output ``EvaluationBinary``.

Semantics follow Deeplearning4j's ``Evaluation``/``EvaluationBinary`` (dl4j-reference.md section 7.1,
7.4) with sparkgrad's decisions: micro-averaged FNR uses fn and tp, and ``f_beta`` with two classes
honours the requested averaging (DL4J always returned class 1's value).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, Sequence

import numpy as np

from sparkgrad._config import coerce_enum
from sparkgrad.eval import _rates
from sparkgrad.eval.base import (
    BaseEvaluation,
    check_columns,
    check_names,
    flatten_inputs,
    format_value,
    name_width,
)

_CONFUSION_PRINT_MAX_CLASSES = 20
_RULE = "=" * 66


class Averaging(enum.Enum):
    """How per-class metrics combine: unweighted mean over classes, or from the summed counts."""

    MACRO = "macro"
    MICRO = "micro"


class ConfusionCounts(NamedTuple):
    """True/false positive/negative counts (scalars, or one entry per class or output)."""

    tp: Any
    fp: Any
    tn: Any
    fn: Any


def _check_threshold(value: float | None, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"{field}: expected a finite number, got {value!r}")
    return float(value)


class Evaluation(BaseEvaluation):
    """Multi-class classification counts: confusion matrix and the metrics derived from it.

    Args:
        num_classes: number of classes; inferred at the first ``eval`` when None (1 column = 2 classes).
        labels: optional class names; fixes ``num_classes`` to their count.
        top_n: also count a prediction correct when the true class is among the ``top_n`` highest.
        binary_decision_threshold: with 1 prediction column, class 1 iff p > threshold (default 0.5);
            with 2 columns, class 1 iff p[:, 1] > threshold (default: argmax).
        binary_positive_class: with 2 classes, the class whose value metrics report when called with
            neither ``cls`` nor ``averaging`` (DL4J's ``binaryPositiveClass``); None means macro.
    """

    def __init__(
        self,
        num_classes: int | None = None,
        labels: Sequence[str] | None = None,
        top_n: int = 1,
        binary_decision_threshold: float | None = None,
        binary_positive_class: int | None = None,
    ) -> None:
        names = check_names(labels, "labels")
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2
        ):
            raise ValueError(f"num_classes: expected an integer >= 2, got {num_classes!r}")
        if names is not None:
            if num_classes is not None and num_classes != len(names):
                raise ValueError(f"labels: {len(names)} names given for num_classes={num_classes}")
            num_classes = len(names)
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n: expected an integer >= 1, got {top_n!r}")
        if binary_positive_class not in (None, 0, 1):
            raise ValueError(f"binary_positive_class: expected None, 0 or 1, got {binary_positive_class!r}")
        self._label_names = names
        self._top_n = top_n
        self._threshold = _check_threshold(binary_decision_threshold, "binary_decision_threshold")
        self._positive = binary_positive_class
        self._cm: np.ndarray | None = None if num_classes is None else np.zeros((num_classes,) * 2, np.int64)
        self._top_n_correct = 0
        self._top_n_total = 0

    # -- accumulation --------------------------------------------------------------------------
    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Accumulate one batch of one-hot labels (or one 0/1 column) and class probabilities.

        Args:
            labels: one-hot (batch, classes), or (batch, 1) 0/1 for binary; rank 3 (batch, classes, time).
            predictions: same shape; must not contain NaN.
            mask: optional (batch,) or (batch, time) mask; 0 removes the example or time step.
        """
        lab, pred, _ = flatten_inputs(labels, predictions, mask, owner="Evaluation", per_output_mask=False)
        ncol = lab.shape[1]
        n_classes = check_columns(self.num_classes, max(ncol, 2), "Evaluation", "classes")
        if ncol == 1:
            actual = (lab[:, 0] > 0.5).astype(np.int64)
            threshold = 0.5 if self._threshold is None else self._threshold
            predicted = (pred[:, 0] > threshold).astype(np.int64)
        else:
            actual = np.argmax(lab, axis=1)
            if ncol == 2 and self._threshold is not None:
                predicted = (pred[:, 1] > self._threshold).astype(np.int64)
            else:
                predicted = np.argmax(pred, axis=1)
        counts = np.bincount(actual * n_classes + predicted, minlength=n_classes * n_classes)
        if self._cm is None:
            self._cm = np.zeros((n_classes, n_classes), np.int64)
        self._cm += counts.reshape(n_classes, n_classes)
        if self._top_n > 1 and ncol > 1:
            true_score = pred[np.arange(len(actual)), actual]
            higher = np.count_nonzero(pred > true_score[:, None], axis=1)
            self._top_n_correct += int(np.count_nonzero(higher < self._top_n))
            self._top_n_total += len(actual)

    def merge(self, other: Evaluation) -> Evaluation:
        self._check_mergeable(other)
        if (self._top_n, self._threshold) != (other._top_n, other._threshold):
            raise ValueError("other: top_n or binary_decision_threshold differs from this evaluation's")
        if other._cm is not None:
            if self._cm is None:
                self._cm = other._cm.copy()
            else:
                check_columns(self.num_classes, other._cm.shape[0], "Evaluation", "classes", "other")
                self._cm += other._cm
        if self._label_names is None:
            self._label_names = other._label_names
        self._top_n_correct += other._top_n_correct
        self._top_n_total += other._top_n_total
        return self

    def reset(self) -> None:
        if self._cm is not None:
            self._cm[:] = 0
        self._top_n_correct = self._top_n_total = 0

    # -- counts --------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int | None:
        """Number of classes, None before the first ``eval`` when not given."""
        return None if self._cm is None else self._cm.shape[0]

    @property
    def label_names(self) -> list[str]:
        """Class names: the given ones, else the class indices as strings."""
        if self._label_names is not None:
            return list(self._label_names)
        return [str(i) for i in range(self.num_classes or 0)]

    def _matrix(self) -> np.ndarray:
        if self._cm is None:
            raise ValueError("Evaluation: no data has been evaluated (number of classes unknown)")
        return self._cm

    def confusion_matrix(self) -> np.ndarray:
        """Counts (classes, classes); rows are actual classes, columns predicted classes."""
        return self._matrix().copy()

    def num_rows(self) -> int:
        """Number of evaluated examples (time steps count separately)."""
        return int(self._matrix().sum())

    def confusion_counts(self) -> ConfusionCounts:
        """Per-class one-vs-rest counts as int64 arrays of length ``num_classes``."""
        cm = self._matrix()
        tp = np.diag(cm).copy()
        fp = cm.sum(axis=0) - tp
        fn = cm.sum(axis=1) - tp
        return ConfusionCounts(tp, fp, cm.sum() - tp - fp - fn, fn)

    # -- metrics -------------------------------------------------------------------------------
    def _reduce(
        self,
        per_class: Any,
        cls: int | None,
        averaging: str | Averaging | None,
        exclude_undefined: bool,
    ) -> float:
        """Select a class, or average ``per_class(tp, fp, tn, fn)`` (NaN = undefined) over classes."""
        counts = self.confusion_counts()
        if cls is not None:
            if averaging is not None:
                raise ValueError("averaging: give either cls or averaging, not both")
            if (
                isinstance(cls, bool)
                or not isinstance(cls, (int, np.integer))
                or not 0 <= cls < len(counts.tp)
            ):
                raise ValueError(f"cls: expected a class index in [0, {len(counts.tp)}), got {cls!r}")
            value = float(per_class(*(c[cls : cls + 1] for c in counts))[0])
            return 0.0 if exclude_undefined and np.isnan(value) else value
        if averaging is None:
            if self._positive is not None and len(counts.tp) == 2:
                return self._reduce(per_class, self._positive, None, exclude_undefined)
            averaging = Averaging.MACRO
        if coerce_enum(Averaging, averaging, "averaging") is Averaging.MICRO:
            value = float(per_class(*(c.sum(keepdims=True) for c in counts))[0])
            return 0.0 if exclude_undefined and np.isnan(value) else value
        values = per_class(*counts)
        if exclude_undefined:
            values = values[~np.isnan(values)]
        return float(values.mean()) if values.size else float("nan")

    def accuracy(self) -> float:
        """Fraction of examples whose predicted class is the actual class."""
        cm = self._matrix()
        total = cm.sum()
        return float(np.trace(cm) / total) if total else float("nan")

    def top_n_accuracy(self) -> float:
        """Fraction of examples whose true class is among the ``top_n`` highest predictions."""
        if self._top_n <= 1:
            return self.accuracy()
        return self._top_n_correct / self._top_n_total if self._top_n_total else float("nan")

    def precision(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """tp / (tp + fp) of class ``cls`` (0 if undefined), or averaged.

        Args:
            cls: class index; None averages over classes.
            averaging: "macro" (default; classes with undefined precision are excluded) or "micro".

        Returns:
            The precision.
        """
        return self._reduce(lambda tp, fp, tn, fn: _rates.ratio(tp, tp + fp, np.nan), cls, averaging, True)

    def recall(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """tp / (tp + fn); arguments and averaging as in :meth:`precision`."""
        return self._reduce(lambda tp, fp, tn, fn: _rates.ratio(tp, tp + fn, np.nan), cls, averaging, True)

    def f_beta(self, beta: float, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """(1+b^2) P R / (b^2 P + R); macro averages the classes whose P and R are defined.

        Args:
            beta: weight of recall relative to precision, > 0.
            cls: class index; None averages over classes.
            averaging: "macro" (default) or "micro".

        Returns:
            The F-beta score.
        """
        b = _rates.check_beta(beta)

        def per_class(tp: np.ndarray, fp: np.ndarray, tn: np.ndarray, fn: np.ndarray) -> np.ndarray:
            return _rates.f_beta(b, _rates.ratio(tp, tp + fp, np.nan), _rates.ratio(tp, tp + fn, np.nan))

        return self._reduce(per_class, cls, averaging, True)

    def f1(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """F-beta with beta = 1; see :meth:`f_beta`."""
        return self.f_beta(1.0, cls, averaging)

    def g_measure(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """sqrt(precision * recall) (undefined P or R counts as 0); macro averages all classes."""

        def per_class(tp: np.ndarray, fp: np.ndarray, tn: np.ndarray, fn: np.ndarray) -> np.ndarray:
            return _rates.g_measure(_rates.ratio(tp, tp + fp, 0.0), _rates.ratio(tp, tp + fn, 0.0))

        return self._reduce(per_class, cls, averaging, False)

    def matthews_correlation(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """Matthews correlation of class ``cls`` against the rest (NaN if undefined); macro over all."""
        return self._reduce(_rates.matthews, cls, averaging, False)

    def false_positive_rate(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """fp / (fp + tn), 0 where undefined; macro averages all classes."""
        return self._reduce(lambda tp, fp, tn, fn: _rates.ratio(fp, fp + tn, 0.0), cls, averaging, False)

    def false_negative_rate(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """fn / (fn + tp), 0 where undefined; macro averages all classes (micro sums fn and tp)."""
        return self._reduce(lambda tp, fp, tn, fn: _rates.ratio(fn, fn + tp, 0.0), cls, averaging, False)

    def false_alarm_rate(self, cls: int | None = None, averaging: str | Averaging | None = None) -> float:
        """(FPR + FNR) / 2."""
        return (self.false_positive_rate(cls, averaging) + self.false_negative_rate(cls, averaging)) / 2

    # -- report --------------------------------------------------------------------------------
    def stats(self) -> str:
        if self._cm is None:
            return "Evaluation: no data available (no evaluation has been performed)"
        counts = self.confusion_counts()
        n = len(counts.tp)
        lines = ["", "========================Evaluation Metrics========================"]
        lines.append(f" # of classes:    {n}")
        lines.append(f" Accuracy:        {format_value(self.accuracy())}")
        if self._top_n > 1:
            lines.append(f" Top {self._top_n} Accuracy:  {format_value(self.top_n_accuracy())}")
        single = self._positive is not None and n == 2
        for title, metric, undefined in (
            ("Precision:       ", self.precision, counts.tp + counts.fp == 0),
            ("Recall:          ", self.recall, counts.tp + counts.fn == 0),
            ("F1 Score:        ", self.f1, (counts.tp + counts.fp == 0) | (counts.tp + counts.fn == 0)),
        ):
            line = f" {title}{format_value(metric())}"
            excluded = int(undefined.sum())
            if excluded and not single:
                line += f"\t({excluded} class{'es' if excluded > 1 else ''} excluded from average)"
            lines.append(line)
        if single:
            assert self._positive is not None
            name = self.label_names[self._positive]
            lines.append(
                "Precision, recall & F1: reported for positive class "
                f'(class {self._positive} - "{name}") only'
            )
        else:
            lines.append(f"Precision, recall & F1: macro-averaged (equally weighted avg. of {n} classes)")
        if n <= _CONFUSION_PRINT_MAX_CLASSES:
            lines += [
                "",
                "",
                "=========================Confusion Matrix=========================",
                self._matrix_text(),
            ]
        lines.append(_RULE)
        return "\n".join(lines)

    def _matrix_text(self) -> str:
        cm = self._matrix()
        n = cm.shape[0]
        width = max(len(str(int(cm.max()))), len(str(n - 1))) + 1
        names = self.label_names
        header = "".join(f"{i:>{width}d}" for i in range(n))
        rows = ["".join(f"{v:>{width}d}" for v in cm[i]) + f" | {i} = {names[i]}" for i in range(n)]
        return "\n".join(
            [
                header,
                "-" * len(header),
                *rows,
                "",
                "Confusion matrix format: Actual (rowClass) predicted as (columnClass) N times",
            ]
        )

    # -- state ---------------------------------------------------------------------------------
    def _get_state(self) -> dict[str, Any]:
        return {
            "label_names": self._label_names,
            "top_n": self._top_n,
            "threshold": self._threshold,
            "positive": self._positive,
            "confusion": self._cm,
            "top_n_correct": self._top_n_correct,
            "top_n_total": self._top_n_total,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._label_names = state["label_names"]
        self._top_n = int(state["top_n"])
        self._threshold = state["threshold"]
        self._positive = state["positive"]
        cm = state["confusion"]
        self._cm = None if cm is None else np.asarray(cm, dtype=np.int64).copy()
        self._top_n_correct = int(state["top_n_correct"])
        self._top_n_total = int(state["top_n_total"])


class EvaluationBinary(BaseEvaluation):
    """Counts for several independent binary outputs (multi-label classification), one column each.

    Args:
        size: number of outputs; inferred at the first ``eval`` when None.
        decision_threshold: per-output thresholds (predicted positive iff p > threshold); default 0.5.
        labels: optional output names.
    """

    def __init__(
        self,
        size: int | None = None,
        decision_threshold: Sequence[float] | np.ndarray | None = None,
        labels: Sequence[str] | None = None,
    ) -> None:
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"size: expected a positive integer, got {size!r}")
        thr = None
        if decision_threshold is not None:
            thr = np.asarray(decision_threshold, dtype=np.float64).reshape(-1)
            if not np.isfinite(thr).all():
                raise ValueError("decision_threshold: must be finite numbers")
            if size is not None and size != thr.size:
                raise ValueError(f"decision_threshold: {thr.size} thresholds given for size={size}")
            size = thr.size
        names = check_names(labels, "labels")
        if names is not None:
            if size is not None and size != len(names):
                raise ValueError(f"labels: {len(names)} names given for {size} outputs")
            size = len(names)
        self._threshold = thr
        self._label_names = names
        self._counts = None if size is None else np.zeros((4, size), np.int64)  # rows: tp, fp, tn, fn

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Accumulate one batch.

        Args:
            labels: 0/1 array (batch, outputs) or (batch, outputs, time).
            predictions: probabilities, same shape; must not contain NaN.
            mask: per-example, per-time-step or per-output (the labels' shape); 0 removes the entry.
        """
        lab, pred, out_mask = flatten_inputs(
            labels, predictions, mask, owner="EvaluationBinary", per_output_mask=True
        )
        size = check_columns(self.size, lab.shape[1], "EvaluationBinary", "outputs")
        threshold = 0.5 if self._threshold is None else self._threshold
        actual = lab > 0.5
        predicted = pred > threshold
        keep = np.ones_like(actual) if out_mask is None else out_mask
        batch = np.stack(
            [
                np.count_nonzero(actual & predicted & keep, axis=0),
                np.count_nonzero(~actual & predicted & keep, axis=0),
                np.count_nonzero(~actual & ~predicted & keep, axis=0),
                np.count_nonzero(actual & ~predicted & keep, axis=0),
            ]
        )
        if self._counts is None:
            self._counts = np.zeros((4, size), np.int64)
        self._counts += batch

    def merge(self, other: EvaluationBinary) -> EvaluationBinary:
        self._check_mergeable(other)
        if (self._threshold is None) != (other._threshold is None) or (
            self._threshold is not None
            and other._threshold is not None
            and not np.array_equal(self._threshold, other._threshold)
        ):
            raise ValueError("other: decision_threshold differs from this evaluation's")
        if other._counts is not None:
            if self._counts is None:
                self._counts = other._counts.copy()
            else:
                check_columns(self.size, other._counts.shape[1], "EvaluationBinary", "outputs", "other")
                self._counts += other._counts
        if self._label_names is None:
            self._label_names = other._label_names
        return self

    def reset(self) -> None:
        if self._counts is not None:
            self._counts[:] = 0

    @property
    def size(self) -> int | None:
        """Number of outputs, None before the first ``eval`` when not given."""
        return None if self._counts is None else self._counts.shape[1]

    def confusion_counts(self) -> ConfusionCounts:
        """Per-output counts as int64 arrays of length ``size``."""
        if self._counts is None:
            raise ValueError("EvaluationBinary: no data has been evaluated (number of outputs unknown)")
        return ConfusionCounts(*(c.copy() for c in self._counts))

    def _select(self, values: np.ndarray, output: int | None) -> float:
        if output is None:
            return float(values.mean())
        if (
            isinstance(output, bool)
            or not isinstance(output, (int, np.integer))
            or not 0 <= output < len(values)
        ):
            raise ValueError(f"output: expected an output index in [0, {len(values)}), got {output!r}")
        return float(values[output])

    def _precision_recall(self) -> tuple[np.ndarray, np.ndarray]:
        c = self.confusion_counts()
        return _rates.ratio(c.tp, c.tp + c.fp, np.nan), _rates.ratio(c.tp, c.tp + c.fn, np.nan)

    def accuracy(self, output: int | None = None) -> float:
        """(tp + tn) / total of one output, or the unweighted mean over outputs when ``output`` is None."""
        c = self.confusion_counts()
        return self._select(_rates.ratio(c.tp + c.tn, c.tp + c.fp + c.tn + c.fn, np.nan), output)

    def precision(self, output: int | None = None) -> float:
        """tp / (tp + fp), NaN where undefined; mean over outputs when ``output`` is None."""
        return self._select(self._precision_recall()[0], output)

    def recall(self, output: int | None = None) -> float:
        """tp / (tp + fn), NaN where undefined; mean over outputs when ``output`` is None."""
        return self._select(self._precision_recall()[1], output)

    def f_beta(self, beta: float, output: int | None = None) -> float:
        """F-beta of one output, or the mean over outputs.

        Args:
            beta: weight of recall relative to precision, > 0.
            output: output index; None averages over outputs.

        Returns:
            The F-beta score.
        """
        return self._select(_rates.f_beta(_rates.check_beta(beta), *self._precision_recall()), output)

    def f1(self, output: int | None = None) -> float:
        """F-beta with beta = 1."""
        return self.f_beta(1.0, output)

    def g_measure(self, output: int | None = None) -> float:
        """sqrt(precision * recall)."""
        return self._select(_rates.g_measure(*self._precision_recall()), output)

    def matthews_correlation(self, output: int | None = None) -> float:
        """Matthews correlation coefficient (NaN where undefined)."""
        return self._select(_rates.matthews(*self.confusion_counts()), output)

    def false_positive_rate(self, output: int | None = None) -> float:
        """fp / (fp + tn), 0 where undefined."""
        c = self.confusion_counts()
        return self._select(_rates.ratio(c.fp, c.fp + c.tn, 0.0), output)

    def false_negative_rate(self, output: int | None = None) -> float:
        """fn / (fn + tp), 0 where undefined."""
        c = self.confusion_counts()
        return self._select(_rates.ratio(c.fn, c.fn + c.tp, 0.0), output)

    def false_alarm_rate(self, output: int | None = None) -> float:
        """(FPR + FNR) / 2."""
        return (self.false_positive_rate(output) + self.false_negative_rate(output)) / 2

    def stats(self) -> str:
        if self._counts is None:
            return "EvaluationBinary: no data available (no evaluation has been performed)"
        names = self._label_names or [str(i) for i in range(self.size or 0)]
        width = name_width(names)
        head = ["Label", "Accuracy", "F1", "Precision", "Recall", "Total", "TP", "TN", "FP", "FN"]
        lines = [
            f"{head[0]:<{width}}"
            + "".join(f"{h:<12}" for h in head[1:5])
            + "".join(f"{h:<{w}}" for h, w in zip(head[5:], (8, 7, 7, 7, 7)))
        ]
        c = self.confusion_counts()
        for i, name in enumerate(names):
            values = (self.accuracy(i), self.f1(i), self.precision(i), self.recall(i))
            ints = (c.tp[i] + c.fp[i] + c.tn[i] + c.fn[i], c.tp[i], c.tn[i], c.fp[i], c.fn[i])
            lines.append(
                f"{name:<{width}}"
                + "".join(f"{v:<12.4f}" for v in values)
                + "".join(f"{int(v):<{w}d}" for v, w in zip(ints, (8, 7, 7, 7, 7)))
            )
        return "\n".join(lines)

    def _get_state(self) -> dict[str, Any]:
        return {"threshold": self._threshold, "label_names": self._label_names, "counts": self._counts}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._threshold = state["threshold"]
        self._label_names = state["label_names"]
        counts = state["counts"]
        self._counts = None if counts is None else np.asarray(counts, dtype=np.int64).copy()
