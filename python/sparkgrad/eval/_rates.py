"""Vectorised confusion-count formulas shared by Evaluation and EvaluationBinary (DL4J EvaluationUtils).

Every function takes count arrays of equal shape (one entry per class or output) and returns float64
arrays. ``edge`` is the value used where the denominator is zero (DL4J's ``edgeCase``); pass NaN to get
EvaluationBinary's unguarded division.
"""

from __future__ import annotations

import numpy as np


def ratio(num: np.ndarray, den: np.ndarray, edge: float) -> np.ndarray:
    """num / den, ``edge`` where den == 0."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, edge, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def f_beta(beta: float, precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    """(1+b^2) P R / (b^2 P + R); 0 where P or R is 0; NaN where P or R is NaN (undefined)."""
    b2 = beta * beta
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (1.0 + b2) * precision * recall / (b2 * precision + recall)
    out = np.where((precision == 0) | (recall == 0), 0.0, out)
    return np.where(np.isnan(precision) | np.isnan(recall), np.nan, out)


def g_measure(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    """sqrt(P R)."""
    return np.sqrt(precision * recall)


def matthews(tp: np.ndarray, fp: np.ndarray, tn: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """(tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); NaN where a factor is 0."""
    tp, fp, tn, fn = (np.asarray(a, dtype=np.float64) for a in (tp, fp, tn, fn))
    den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return ratio(tp * tn - fp * fn, den, np.nan)


def check_beta(beta: float) -> float:
    """beta must be a positive finite number."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not np.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a positive number, got {beta!r}")
    return float(beta)
