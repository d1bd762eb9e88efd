"""Evaluation of classifiers and regressors, mergeable across Spark partitions.

All classes derive from :class:`BaseEvaluation`: ``eval(labels, predictions, mask=None)`` accumulates a
batch, ``merge`` adds another partial evaluation exactly, ``stats`` reports, ``to_json``/``from_json``
round-trip the exact state and instances pickle compactly.
"""

from __future__ import annotations

from sparkgrad.eval.base import BaseEvaluation
from sparkgrad.eval.classification import Averaging, ConfusionCounts, Evaluation, EvaluationBinary
from sparkgrad.eval.regression import RegressionEvaluation
from sparkgrad.eval.roc import ROC, PrecisionRecallCurve, ROCBinary, RocCurve, ROCMultiClass

__all__ = [
    "ROC",
    "Averaging",
    "BaseEvaluation",
    "ConfusionCounts",
    "Evaluation",
    "EvaluationBinary",
    "PrecisionRecallCurve",
    "ROCBinary",
    "ROCMultiClass",
    "RegressionEvaluation",
    "RocCurve",
]
