"""Regression evaluation (DL4J ``RegressionEvaluation``, dl4j-reference.md 7.5) with exact sums.

Per column it keeps the count and exact sums of y, p, y^2, p^2, y*p, (y-p)^2 and |y-p| (see
``_exact``). Every metric is then computed from exact integers and rounded once, so ``merge`` is
exact and associative (sparkgrad decision: all sums are merged, unlike DL4J's ``sumLabels``), and
R^2/Pearson suffer no cancellation.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from sparkgrad.eval import _exact
from sparkgrad.eval.base import BaseEvaluation, check_columns, check_names, flatten_inputs, name_width

_SUMS = ("y", "p", "yy", "pp", "yp", "sse", "sae")
_PRECISION = 5


class RegressionEvaluation(BaseEvaluation):
    """MSE, MAE, RMSE, RSE, Pearson correlation and R^2 per output column.

    Args:
        num_columns: number of columns; inferred at the first ``eval`` when None.
        column_names: optional names (default ``col_0``, ``col_1``...); fixes ``num_columns``.
    """

    def __init__(self, num_columns: int | None = None, column_names: Sequence[str] | None = None) -> None:
        if num_columns is not None and (
            isinstance(num_columns, bool) or not isinstance(num_columns, int) or num_columns < 1
        ):
            raise ValueError(f"num_columns: expected a positive integer, got {num_columns!r}")
        names = check_names(column_names, "column_names")
        if names is not None:
            if num_columns is not None and num_columns != len(names):
                raise ValueError(f"column_names: {len(names)} names given for num_columns={num_columns}")
            num_columns = len(names)
        self._names = names
        self._counts: list[int] | None = None
        self._sums: dict[str, list[int]] | None = None
        if num_columns is not None:
            self._init_columns(num_columns)

    def _init_columns(self, n: int) -> None:
        self._counts = [0] * n
        self._sums = {k: [0] * n for k in _SUMS}

    @property
    def num_columns(self) -> int | None:
        """Number of columns, None before the first ``eval`` when not given."""
        return None if self._counts is None else len(self._counts)

    @property
    def column_names(self) -> list[str]:
        """Column names: the given ones, else ``col_<i>``."""
        return (
            list(self._names)
            if self._names is not None
            else [f"col_{i}" for i in range(self.num_columns or 0)]
        )

    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Accumulate one batch.

        Args:
            labels: targets (batch, columns) or (batch, columns, time); finite.
            predictions: same shape; finite.
            mask: per-example, per-time-step or per-output (the labels' shape); 0 removes the entry.
        """
        lab, pred, out_mask = flatten_inputs(
            labels, predictions, mask, owner="RegressionEvaluation", per_output_mask=True
        )
        y, p = lab.astype(np.float64), pred.astype(np.float64)
        for name, arr in (("labels", y), ("predictions", p)):
            if not np.isfinite(arr).all():
                raise ValueError(f"RegressionEvaluation.eval: {name} contains infinite values")
        ncol = check_columns(self.num_columns, y.shape[1], "RegressionEvaluation")
        if self._names is not None:
            check_columns(len(self._names), ncol, "RegressionEvaluation")
        if out_mask is not None:
            y, p = np.where(out_mask, y, 0.0), np.where(out_mask, p, 0.0)
            counts = np.count_nonzero(out_mask, axis=0)
        else:
            counts = np.full(ncol, y.shape[0])
        d = y - p
        parts = {
            "y": [y],
            "p": [p],
            "yy": list(_exact.two_product(y, y)),
            "pp": list(_exact.two_product(p, p)),
            "yp": list(_exact.two_product(y, p)),
            "sse": list(_exact.two_product(d, d)),
            "sae": [np.abs(d)],
        }
        keys = [k for k in _SUMS for _ in parts[k]]
        totals = _exact.column_sums(np.concatenate([a for k in _SUMS for a in parts[k]], axis=1))
        if self._counts is None:
            self._init_columns(ncol)
        assert self._sums is not None and self._counts is not None
        for i, key in enumerate(keys):
            acc = self._sums[key]
            for c in range(ncol):
                acc[c] += totals[i * ncol + c]
        for c in range(ncol):
            self._counts[c] += int(counts[c])

    def merge(self, other: RegressionEvaluation) -> RegressionEvaluation:
        self._check_mergeable(other)
        if other._counts is not None:
            if self._counts is None:
                self._init_columns(len(other._counts))
            check_columns(self.num_columns, len(other._counts), "RegressionEvaluation", subject="other")
            assert self._sums is not None and other._sums is not None and self._counts is not None
            for key in _SUMS:
                self._sums[key] = [a + b for a, b in zip(self._sums[key], other._sums[key])]
            self._counts = [a + b for a, b in zip(self._counts, other._counts)]
        if self._names is None:
            self._names = other._names
        return self

    def reset(self) -> None:
        if self._counts is not None:
            self._init_columns(len(self._counts))

    # -- metrics -------------------------------------------------------------------------------
    def _column(self, col: int) -> tuple[int, dict[str, int]]:
        if self._counts is None or self._sums is None:
            raise ValueError("RegressionEvaluation: no data has been evaluated")
        n = len(self._counts)
        if isinstance(col, bool) or not isinstance(col, (int, np.integer)) or not 0 <= col < n:
            raise ValueError(f"col: expected a column index in [0, {n}), got {col!r}")
        return self._counts[col], {k: v[col] for k, v in self._sums.items()}

    def _spread(self, n: int, s: dict[str, int], sq: str, lin: str) -> int:
        """n * Sum((x - mean)^2) scaled by 2**(2 * SCALE_BITS), exactly."""
        return (n * s[sq] << _exact.SCALE_BITS) - s[lin] * s[lin]

    def mean_squared_error(self, col: int) -> float:
        """Sum((y - p)^2) / n for column ``col``."""
        n, s = self._column(col)
        return _exact.to_float(s["sse"], n << _exact.SCALE_BITS)

    def mean_absolute_error(self, col: int) -> float:
        """Sum(|y - p|) / n for column ``col``."""
        n, s = self._column(col)
        return _exact.to_float(s["sae"], n << _exact.SCALE_BITS)

    def root_mean_squared_error(self, col: int) -> float:
        """sqrt(MSE) for column ``col``."""
        return math.sqrt(self.mean_squared_error(col)) if self._column(col)[0] else float("nan")

    def relative_squared_error(self, col: int) -> float:
        """Sum((y - p)^2) / Sum((y - mean(y))^2); inf when the labels are constant and SSE > 0."""
        n, s = self._column(col)
        return _exact.to_float(s["sse"] * n << _exact.SCALE_BITS, self._spread(n, s, "yy", "y"))

    def r_squared(self, col: int) -> float:
        """Coefficient of determination 1 - RSE (scikit-learn's ``r2_score`` without its constant-label
        special case)."""
        n, s = self._column(col)
        den = self._spread(n, s, "yy", "y")
        return _exact.to_float(den - (s["sse"] * n << _exact.SCALE_BITS), den)

    def pearson_correlation(self, col: int) -> float:
        """Pearson correlation of labels and predictions; NaN when either is constant."""
        n, s = self._column(col)
        cov = (n * s["yp"] << _exact.SCALE_BITS) - s["y"] * s["p"]
        var = self._spread(n, s, "yy", "y") * self._spread(n, s, "pp", "p")
        if var <= 0:
            return float("nan")
        return math.sqrt(_exact.to_float(cov * cov, var)) * (1.0 if cov >= 0 else -1.0)

    def _average(self, metric: Callable[[int], float]) -> float:
        return float(np.mean([metric(c) for c in range(self._columns())]))

    def _columns(self) -> int:
        if self._counts is None:
            raise ValueError("RegressionEvaluation: no data has been evaluated")
        return len(self._counts)

    def average_mean_squared_error(self) -> float:
        """Unweighted mean over columns of :meth:`mean_squared_error`."""
        return self._average(self.mean_squared_error)

    def average_mean_absolute_error(self) -> float:
        """Unweighted mean over columns of :meth:`mean_absolute_error`."""
        return self._average(self.mean_absolute_error)

    def average_root_mean_squared_error(self) -> float:
        """Unweighted mean over columns of :meth:`root_mean_squared_error`."""
        return self._average(self.root_mean_squared_error)

    def average_relative_squared_error(self) -> float:
        """Unweighted mean over columns of :meth:`relative_squared_error`."""
        return self._average(self.relative_squared_error)

    def average_pearson_correlation(self) -> float:
        """Unweighted mean over columns of :meth:`pearson_correlation`."""
        return self._average(self.pearson_correlation)

    def average_r_squared(self) -> float:
        """Unweighted mean over columns of :meth:`r_squared`."""
        return self._average(self.r_squared)

    def example_count(self, col: int) -> int:
        """Number of (unmasked) values seen in column ``col``."""
        return self._column(col)[0]

    def stats(self) -> str:
        if self._counts is None:
            return "RegressionEvaluation: no data available (no evaluation has been performed)"
        names = self.column_names
        width = name_width(names, minimum=10)
        cell = _PRECISION + 10
        metrics = (
            self.mean_squared_error,
            self.mean_absolute_error,
            self.root_mean_squared_error,
            self.relative_squared_error,
            self.pearson_correlation,
            self.r_squared,
        )
        lines = [
            f"{'Column':<{width}}"
            + "".join(f"{h:<{cell}}" for h in ("MSE", "MAE", "RMSE", "RSE", "PC", "R^2"))
        ]
        for c, name in enumerate(names):
            lines.append(f"{name:<{width}}" + "".join(f"{m(c):<{cell}.{_PRECISION}e}" for m in metrics))
        return "\n".join(lines)

    def _get_state(self) -> dict[str, Any]:
        # Exact sums are arbitrary-size integers; JSON carries them as decimal strings.
        return {
            "names": self._names,
            "counts": self._counts,
            "sums": None
            if self._sums is None
            else {k: [str(v) for v in vals] for k, vals in self._sums.items()},
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._names = state["names"]
        self._counts = None if state["counts"] is None else [int(c) for c in state["counts"]]
        sums = state["sums"]
        self._sums = None if sums is None else {k: [int(v) for v in sums[k]] for k in _SUMS}
        if (
            self._counts is not None
            and self._sums is not None
            and any(len(v) != len(self._counts) for v in self._sums.values())
        ):
            raise ValueError("RegressionEvaluation state: sums and counts have different column counts")
