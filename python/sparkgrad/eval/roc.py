"""ROC and precision-recall analysis: ``ROC`` (one binary output), ``ROCBinary`` (independent binary
outputs) and ``ROCMultiClass`` (one-vs-all per class), after DL4J's classes (dl4j-reference.md 7.2-7.3).

Exact mode (``threshold_steps=0``) keeps every (score, label) pair in two compact growing arrays and
builds curves with one sort and cumulative sums; tied scores form one curve point, so the AUC equals
scikit-learn's ``roc_auc_score``. Thresholded mode (``threshold_steps=S``) keeps cumulative counts at
the thresholds i/S; an example is predicted positive at threshold t iff p >= t, and nothing is
positive at t = 1.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from sparkgrad.eval.base import BaseEvaluation, check_columns, check_names, flatten_inputs, name_width
from sparkgrad.eval.classification import ConfusionCounts

_MIN_CAPACITY = 2048


def _trapezoid(x: np.ndarray, y: np.ndarray) -> float:
    """sum |x[i+1]-x[i]| * (y[i]+y[i+1]) / 2 (DL4J BaseCurve.calculateArea)."""
    return float(np.sum(np.abs(np.diff(x)) * (y[1:] + y[:-1]) / 2.0))


def _drop_redundant(*columns: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    """Drop repeated points, then middle points whose x or y equals both neighbours' (the area is
    unchanged; without repeats, every dropped point lies inside a straight segment)."""
    distinct = np.ones(len(x), dtype=bool)
    distinct[1:] = (x[1:] != x[:-1]) | (y[1:] != y[:-1])
    columns, x, y = tuple(c[distinct] for c in columns), x[distinct], y[distinct]
    keep = np.ones(len(x), dtype=bool)
    if len(x) > 2:
        same_x = (x[1:-1] == x[:-2]) & (x[1:-1] == x[2:])
        same_y = (y[1:-1] == y[:-2]) & (y[1:-1] == y[2:])
        keep[1:-1] = ~(same_x | same_y)
    return tuple(c[keep] for c in columns)


class RocCurve(NamedTuple):
    """ROC points in increasing false-positive-rate (decreasing threshold) order."""

    thresholds: np.ndarray
    fpr: np.ndarray
    tpr: np.ndarray

    def area(self) -> float:
        """Area under the curve by the trapezoid rule."""
        return _trapezoid(self.fpr, self.tpr)


class PrecisionRecallCurve(NamedTuple):
    """Precision-recall points in increasing threshold order, with the counts at each threshold."""

    thresholds: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray

    def area(self) -> float:
        """Area under the curve (x = recall) by the trapezoid rule."""
        return _trapezoid(self.recall, self.precision)


def _check_steps(threshold_steps: int) -> int:
    if isinstance(threshold_steps, bool) or not isinstance(threshold_steps, int) or threshold_steps < 0:
        raise ValueError(f"threshold_steps: expected an integer >= 0 (0 = exact), got {threshold_steps!r}")
    return threshold_steps


class ROC(BaseEvaluation):
    """ROC/AUC for a single binary output.

    Args:
        threshold_steps: 0 for exact mode, else the number of equal threshold steps in [0, 1].
    """

    # exact mode keeps the scores and labels, thresholded mode the tp/fp counts; the other pair is empty
    _steps: int
    _scores: np.ndarray
    _labels: np.ndarray
    _n: int
    _tp: np.ndarray
    _fp: np.ndarray
    _pos: int
    _neg: int
    _areas: dict[str, float]  # cached AUC/AUPRC, cleared by eval and merge

    def __init__(self, threshold_steps: int = 0) -> None:
        self._steps = _check_steps(threshold_steps)
        self._set_state(
            {
                "steps": self._steps,
                "scores": np.empty(0, np.float32) if self._steps == 0 else None,
                "labels": np.empty(0, bool) if self._steps == 0 else None,
                "tp": None if self._steps == 0 else np.zeros(self._steps + 1, np.int64),
                "fp": None if self._steps == 0 else np.zeros(self._steps + 1, np.int64),
                "pos": 0,
                "neg": 0,
            }
        )

    @property
    def threshold_steps(self) -> int:
        """0 in exact mode, else the number of threshold steps."""
        return self._steps

    # -- accumulation --------------------------------------------------------------------------
    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Accumulate one batch.

        Args:
            labels: (batch, 1) 0/1, or (batch, 2) one-hot with column 1 the positive class; rank 3 with
                a time axis is flattened.
            predictions: same shape; the positive-class probability is the last column.
            mask: optional (batch,) or (batch, time); 0 removes the example or time step.
        """
        lab, pred, _ = flatten_inputs(labels, predictions, mask, owner="ROC", per_output_mask=False)
        if lab.shape[1] > 2:
            raise ValueError(
                f"ROC.eval: labels must have 1 or 2 columns, got {lab.shape[1]} (use ROCMultiClass)"
            )
        self._add(pred[:, -1], lab[:, -1] > 0.5)

    def _add(self, scores: np.ndarray, positive: np.ndarray) -> None:
        """Add rows: ``scores`` (n,) probabilities, ``positive`` (n,) bool actual labels."""
        n_pos = int(np.count_nonzero(positive))
        if self._steps == 0:
            self._append(scores, positive)
        else:
            grid = np.arange(self._steps + 1) / self._steps
            # k = how many grid thresholds are <= p: the example is positive at thresholds 0..k-1.
            k = np.searchsorted(grid, scores, side="right")
            hist_pos = np.bincount(k[positive], minlength=self._steps + 2)
            hist_all = np.bincount(k, minlength=self._steps + 2)
            tp = n_pos - np.cumsum(hist_pos)[:-1]
            fp = (len(scores) - n_pos) - np.cumsum(hist_all - hist_pos)[:-1]
            tp[-1] = fp[-1] = 0  # nothing is predicted positive at threshold 1.0
            self._tp += tp
            self._fp += fp
        self._pos += n_pos
        self._neg += len(scores) - n_pos
        self._areas.clear()

    def _append(self, scores: np.ndarray, positive: np.ndarray) -> None:
        """Exact mode storage: scores keep float32 until a wider dtype arrives; capacity doubles."""
        dtype = np.result_type(self._scores.dtype, scores.dtype if scores.dtype.kind == "f" else np.float64)
        need = self._n + len(scores)
        if need > len(self._scores) or dtype != self._scores.dtype:
            capacity = max(need, 2 * len(self._scores), _MIN_CAPACITY)
            grown = np.empty(capacity, dtype)
            grown[: self._n] = self._scores[: self._n]
            labels = np.empty(capacity, bool)
            labels[: self._n] = self._labels[: self._n]
            self._scores, self._labels = grown, labels
        self._scores[self._n : need] = scores
        self._labels[self._n : need] = positive
        self._n = need

    def merge(self, other: ROC) -> ROC:
        self._check_mergeable(other)
        if other._steps != self._steps:
            raise ValueError(f"other: threshold_steps {other._steps} differs from this ROC's {self._steps}")
        if self._steps == 0:
            self._append(other._scores[: other._n], other._labels[: other._n])
        else:
            self._tp += other._tp
            self._fp += other._fp
        self._pos += other._pos
        self._neg += other._neg
        self._areas.clear()
        return self

    def reset(self) -> None:
        self.__init__(self._steps)  # type: ignore[misc]

    # -- curves --------------------------------------------------------------------------------
    def _points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(thresholds, tp, fp) in decreasing threshold order, starting at the empty prediction.

        Not cached: on millions of rows the points cost 24 bytes per distinct score, so only the
        areas are kept (``_areas``)."""
        if self._steps:
            grid = np.arange(self._steps + 1) / self._steps
            return grid[::-1], self._tp[::-1].copy(), self._fp[::-1].copy()  # curves must not alias state
        # Two value sorts (much faster than an argsort): all scores give the distinct thresholds and
        # how many scores reach each; the positives' sorted scores give the true positives.
        scores = self._scores[: self._n]
        s = np.sort(scores)
        positives = np.sort(scores[self._labels[: self._n]])
        starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        thr = s[starts]
        # Ascending queries keep searchsorted cache-friendly; reverse afterwards.
        tp = (self._pos - np.searchsorted(positives, thr, side="left"))[::-1]
        thr, starts = thr[::-1], starts[::-1]
        return (
            np.concatenate([[np.inf], thr.astype(np.float64)]),
            np.concatenate([[0], tp]),
            np.concatenate([[0], self._n - starts - tp]),
        )

    @property
    def has_data(self) -> bool:
        """Whether any example has been evaluated."""
        return self._pos + self._neg > 0

    def _require_data(self) -> None:
        if not self.has_data:
            raise ValueError("ROC: no data has been evaluated")

    def roc_curve(self, remove_redundant: bool = True) -> RocCurve:
        """The ROC curve; NaN rates when a class is absent.

        Args:
            remove_redundant: drop repeated points and points inside straight segments (the area is
                unchanged; DL4J's ``rocRemoveRedundantPts``).

        Returns:
            The curve in increasing false-positive-rate order.
        """
        self._require_data()
        thr, tp, fp = self._points()
        with np.errstate(invalid="ignore", divide="ignore"):
            fpr, tpr = fp / self._neg, tp / self._pos
        if remove_redundant:
            return RocCurve(*_drop_redundant(thr, fpr, tpr, x=fpr, y=tpr))
        return RocCurve(thr, fpr, tpr)

    def precision_recall_curve(self, remove_redundant: bool = True) -> PrecisionRecallCurve:
        """Precision (1 where nothing is predicted positive) against recall (1 when there are no
        positives).

        Args:
            remove_redundant: drop repeated points and points inside straight segments.

        Returns:
            The curve in increasing threshold order.
        """
        self._require_data()
        thr, tp, fp = (a[::-1] for a in self._points())
        precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), 1.0)
        recall = tp / self._pos if self._pos else np.ones(len(tp))
        columns = (thr, precision, recall, tp, fp, self._pos - tp)
        if remove_redundant:
            return PrecisionRecallCurve(*_drop_redundant(*columns, x=recall, y=precision))
        return PrecisionRecallCurve(*columns)

    def calculate_auc(self) -> float:
        """Area under the ROC curve (trapezoid rule); NaN when only one class has been seen."""
        if self._pos == 0 or self._neg == 0:
            self._require_data()
            return float("nan")
        if "auc" not in self._areas:
            self._areas["auc"] = self.roc_curve(remove_redundant=False).area()
        return self._areas["auc"]

    def calculate_auprc(self) -> float:
        """Area under the precision-recall curve (trapezoid rule, x = recall)."""
        if "auprc" not in self._areas:
            self._areas["auprc"] = self.precision_recall_curve(remove_redundant=False).area()
        return self._areas["auprc"]

    def confusion_at_threshold(self, threshold: float) -> ConfusionCounts:
        """Counts when predicting positive iff p >= ``threshold``.

        Args:
            threshold: decision threshold. In thresholded mode the largest grid threshold i/S that is
                <= ``threshold`` is used.

        Returns:
            ConfusionCounts of Python ints.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or np.isnan(threshold):
            raise ValueError(f"threshold: expected a number, got {threshold!r}")
        thr, tp, fp = self._points()
        if self._steps == 0:
            # thr is decreasing: use the last point whose threshold is >= the request.
            idx = len(thr) - int(np.searchsorted(thr[::-1], threshold, side="left")) - 1
        else:
            grid = thr[::-1]
            idx = self._steps - max(int(np.searchsorted(grid, threshold, side="right")) - 1, 0)
        t, f = int(tp[idx]), int(fp[idx])
        return ConfusionCounts(t, f, self._neg - f, self._pos - t)

    def count_actual_positive(self) -> int:
        """Number of positive examples seen."""
        return self._pos

    def count_actual_negative(self) -> int:
        """Number of negative examples seen."""
        return self._neg

    def stats(self) -> str:
        if not self.has_data:
            return "ROC: no data available (no evaluation has been performed)"
        text = (
            f"AUC (Area under ROC Curve):                {self.calculate_auc()}\n"
            f"AUPRC (Area under Precision/Recall Curve): {self.calculate_auprc()}"
        )
        if self._steps:
            text += (
                f"\n[Note: Thresholded AUC/AUPRC calculation used with {self._steps} steps); "
                "accuracy may reduced compared to exact mode]"
            )
        return text

    # -- state ---------------------------------------------------------------------------------
    def _get_state(self) -> dict[str, Any]:
        exact = self._steps == 0
        return {
            "steps": self._steps,
            "scores": self._scores[: self._n].copy() if exact else None,
            "labels": self._labels[: self._n].copy() if exact else None,
            "tp": None if exact else self._tp.copy(),
            "fp": None if exact else self._fp.copy(),
            "pos": self._pos,
            "neg": self._neg,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._steps = _check_steps(int(state["steps"]))
        self._areas = {}
        self._pos, self._neg = int(state["pos"]), int(state["neg"])
        if self._steps == 0:
            self._scores = np.array(state["scores"])
            self._labels = np.array(state["labels"], dtype=bool)
            if self._scores.dtype.kind != "f" or self._scores.shape != self._labels.shape:
                raise ValueError("ROC state: scores and labels must be float and bool arrays of one length")
            self._n = len(self._scores)
            self._tp = self._fp = np.zeros(0, np.int64)
        else:
            self._tp = np.array(state["tp"], dtype=np.int64)
            self._fp = np.array(state["fp"], dtype=np.int64)
            self._scores, self._labels = np.empty(0, np.float32), np.empty(0, bool)
            self._n = 0


class _PerColumnROC(BaseEvaluation):
    """One :class:`ROC` per output column; shared by ROCBinary and ROCMultiClass."""

    _min_columns = 1
    _show_auprc = True

    def __init__(self, threshold_steps: int = 0, labels: Sequence[str] | None = None) -> None:
        self._steps = _check_steps(threshold_steps)
        self._label_names = check_names(labels, "labels")
        self._rocs: list[ROC] | None = None

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Accumulate one batch.

        Args:
            labels: 0/1 array (batch, columns) or (batch, columns, time).
            predictions: probabilities, same shape; must not contain NaN.
            mask: per-example, per-time-step or per-output (the labels' shape); 0 removes the entry.
        """
        owner = type(self).__name__
        lab, pred, out_mask = flatten_inputs(labels, predictions, mask, owner=owner, per_output_mask=True)
        ncol = lab.shape[1]
        if ncol < self._min_columns:
            raise ValueError(f"{owner}.eval: labels need at least {self._min_columns} columns, got {ncol}")
        if self._label_names is not None:
            check_columns(len(self._label_names), ncol, owner)
        check_columns(None if self._rocs is None else len(self._rocs), ncol, owner)
        if self._rocs is None:
            self._rocs = [ROC(self._steps) for _ in range(ncol)]
        positive = lab > 0.5
        for c, roc in enumerate(self._rocs):
            if out_mask is None:
                roc._add(pred[:, c], positive[:, c])
            else:
                keep = out_mask[:, c]
                roc._add(pred[keep, c], positive[keep, c])

    def merge(self, other: _PerColumnROC) -> _PerColumnROC:
        self._check_mergeable(other)
        if other._steps != self._steps:
            raise ValueError(f"other: threshold_steps {other._steps} differs from {self._steps}")
        if other._rocs is not None:
            if self._rocs is None:
                self._rocs = [ROC(self._steps) for _ in other._rocs]
            check_columns(len(self._rocs), len(other._rocs), type(self).__name__, subject="other")
            for mine, theirs in zip(self._rocs, other._rocs):
                mine.merge(theirs)
        if self._label_names is None:
            self._label_names = other._label_names
        return self

    def reset(self) -> None:
        self._rocs = None

    @property
    def num_columns(self) -> int | None:
        """Number of output columns, None before the first ``eval``."""
        return None if self._rocs is None else len(self._rocs)

    def _columns(self) -> int:
        if self._rocs is None:
            raise ValueError(f"{type(self).__name__}: no data has been evaluated")
        return len(self._rocs)

    def roc(self, cls: int) -> ROC:
        """The single-output ROC of column ``cls`` (curves, confusion counts at a threshold).

        Args:
            cls: column index.

        Returns:
            The ROC object (live, not a copy).
        """
        n = self._columns()
        if isinstance(cls, bool) or not isinstance(cls, (int, np.integer)) or not 0 <= cls < n:
            raise ValueError(f"cls: expected a column index in [0, {n}), got {cls!r}")
        return self._rocs[cls]  # type: ignore[index]

    def calculate_auc(self, cls: int) -> float:
        """AUC of column ``cls``."""
        return self.roc(cls).calculate_auc()

    def calculate_auprc(self, cls: int) -> float:
        """AUPRC of column ``cls``."""
        return self.roc(cls).calculate_auprc()

    def _seen(self) -> list[ROC]:
        """Columns with at least one unmasked example."""
        rocs = [r for r in self._rocs or [] if r.has_data]
        if not rocs:
            raise ValueError(f"{type(self).__name__}: no data has been evaluated")
        return rocs

    def calculate_average_auc(self) -> float:
        """Unweighted mean of the AUCs of the columns that have data (fully masked ones are skipped)."""
        return float(np.mean([r.calculate_auc() for r in self._seen()]))

    def calculate_average_auprc(self) -> float:
        """Unweighted mean of the AUPRCs of the columns that have data."""
        return float(np.mean([r.calculate_auprc() for r in self._seen()]))

    def stats(self) -> str:
        if self._rocs is None:
            return f"{type(self).__name__}: no data available (no evaluation has been performed)"
        names = self._label_names or [str(i) for i in range(len(self._rocs))]
        width = name_width(names)
        head = ["Label", "AUC", *(["AUPRC"] if self._show_auprc else []), "# Pos", "# Neg"]
        lines = [
            f"{head[0]:<{width}}" + "".join(f"{h:<12}" for h in head[1:-2]) + f"{'# Pos':<10}{'# Neg':<10}"
        ]
        for name, roc in zip(names, self._rocs):
            metrics = (roc.calculate_auc, *((roc.calculate_auprc,) if self._show_auprc else ()))
            values = [m() if roc.has_data else float("nan") for m in metrics]
            lines.append(
                f"{name:<{width}}"
                + "".join(f"{v:<12.4f}" for v in values)
                + f"{roc.count_actual_positive():<10d}{roc.count_actual_negative():<10d}"
            )
        if any(r.has_data for r in self._rocs):
            lines.append(f"Average AUC: {self.calculate_average_auc():.4f}")
        if self._steps:
            lines.append(f"[Note: Thresholded AUC/AUPRC calculation used with {self._steps} steps]")
        return "\n".join(lines)

    def _get_state(self) -> dict[str, Any]:
        return {
            "steps": self._steps,
            "label_names": self._label_names,
            "rocs": None if self._rocs is None else [r._get_state() for r in self._rocs],
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._steps = _check_steps(int(state["steps"]))
        self._label_names = state["label_names"]
        self._rocs = None
        if state["rocs"] is not None:
            self._rocs = []
            for s in state["rocs"]:
                roc = ROC.__new__(ROC)
                roc._set_state(s)
                self._rocs.append(roc)


class ROCBinary(_PerColumnROC):
    """ROC for several independent binary outputs (multi-label), one column each; supports
    per-output masks.

    Args:
        threshold_steps: 0 for exact mode, else the number of threshold steps.
        labels: optional output names.
    """


class ROCMultiClass(_PerColumnROC):
    """One-vs-all ROC per class of a softmax output (labels one-hot, at least 2 columns).

    Args:
        threshold_steps: 0 for exact mode, else the number of threshold steps.
        labels: optional class names.
    """

    _min_columns = 2
    _show_auprc = False
