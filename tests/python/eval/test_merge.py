"""merge: random splits reduced in random tree shapes equal the single pass, for every class; JSON and
pickle round trips keep the exact state (as Spark's treeAggregate needs)."""

from __future__ import annotations

import pickle
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgrad.eval import (
    ROC,
    BaseEvaluation,
    Evaluation,
    EvaluationBinary,
    RegressionEvaluation,
    ROCBinary,
    ROCMultiClass,
)


def _classes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    y = np.eye(4)[rng.integers(0, 4, n)]
    return y, np.round(rng.random((n, 4)), 2), (rng.random(n) < 0.8).astype(float)


def _binary(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return rng.integers(0, 2, (n, 3)), np.round(rng.random((n, 3)), 1), (rng.random((n, 3)) < 0.8) * 1.0


def _single(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return rng.integers(0, 2, (n, 1)), np.round(rng.random((n, 1)), 1), None


def _regression(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    y = 100 + rng.normal(size=(n, 2)) * 10.0 ** rng.integers(-3, 3)
    return y, y + rng.normal(size=(n, 2)), (rng.random((n, 2)) < 0.9) * 1.0


def _sig_eval(e: Evaluation) -> list[Any]:
    return [e.confusion_matrix(), e.accuracy(), e.top_n_accuracy()] + [
        m(averaging=a)
        for a in ("macro", "micro")
        for m in (e.precision, e.recall, e.f1, e.matthews_correlation, e.g_measure, e.false_alarm_rate)
    ]


def _sig_binary(e: EvaluationBinary) -> list[Any]:
    return [*e.confusion_counts(), e.f1(), e.matthews_correlation(), e.accuracy()]


def _sig_roc(r: ROC) -> list[Any]:
    return [r.calculate_auc(), r.calculate_auprc(), *r.roc_curve(), *r.precision_recall_curve()]


def _sig_columns(r: ROCBinary) -> list[Any]:
    return [r.calculate_average_auc(), r.calculate_average_auprc(), *(_sig_roc(r.roc(c)) for c in range(3))]


def _sig_regression(r: RegressionEvaluation) -> list[Any]:
    return [
        m(c)
        for c in range(2)
        for m in (
            r.mean_squared_error,
            r.mean_absolute_error,
            r.root_mean_squared_error,
            r.relative_squared_error,
            r.pearson_correlation,
            r.r_squared,
        )
    ]


CASES: dict[str, tuple[Callable[[], BaseEvaluation], Callable[..., Any], Callable[..., list[Any]]]] = {
    "evaluation": (lambda: Evaluation(top_n=2), _classes, _sig_eval),
    "evaluation_binary": (lambda: EvaluationBinary(decision_threshold=[0.3, 0.5, 0.7]), _binary, _sig_binary),
    "roc_exact": (ROC, _single, _sig_roc),
    "roc_thresholded": (lambda: ROC(threshold_steps=7), _single, _sig_roc),
    "roc_binary": (ROCBinary, _binary, _sig_columns),
    "roc_multiclass": (lambda: ROCMultiClass(threshold_steps=5), _classes, _sig_columns),
    "roc_multiclass_exact": (ROCMultiClass, _classes, _sig_columns),
    "regression": (RegressionEvaluation, _regression, _sig_regression),
}


def _tree_reduce(parts: list[BaseEvaluation], rng: np.random.Generator) -> BaseEvaluation:
    """Merge neighbours in a random tree shape (order-preserving), like treeAggregate."""
    parts = list(parts)
    while len(parts) > 1:
        i = int(rng.integers(0, len(parts) - 1))
        parts[i : i + 2] = [parts[i].merge(parts[i + 1])]
    return parts[0]


@pytest.mark.parametrize("case", sorted(CASES))
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(8, 120), pieces=st.integers(1, 6))
def test_merge_of_random_splits_equals_single_pass(case: str, seed: int, n: int, pieces: int) -> None:
    make, data, signature = CASES[case]
    rng = np.random.default_rng(seed)
    y, p, mask = data(rng, n)
    single = make()
    single.eval(y, p, mask=mask)
    cuts = np.sort(rng.integers(0, n + 1, pieces - 1))
    bounds = [0, *cuts.tolist(), n]
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = make()
        if b > a:
            part.eval(y[a:b], p[a:b], mask=None if mask is None else mask[a:b])
        # Partitions cross process boundaries pickled or as JSON; fresh ones stay in.
        parts.append(
            pickle.loads(pickle.dumps(part)) if rng.random() < 0.5 else type(part).from_json(part.to_json())
        )
    merged = _tree_reduce(parts, rng)
    np.testing.assert_equal(signature(merged), signature(single))
    assert merged.to_json() == single.to_json()  # order-preserving merge: identical state
    # Merging after a JSON round trip of the single pass equals the single pass itself.
    empty_then_full = make().merge(type(single).from_json(single.to_json()))
    np.testing.assert_equal(signature(empty_then_full), signature(single))
    full_then_empty = type(single).from_json(single.to_json()).merge(make())
    assert full_then_empty.to_json() == single.to_json()


@pytest.mark.parametrize("case", sorted(CASES))
def test_merge_in_any_order_gives_identical_metrics(case: str) -> None:
    make, data, signature = CASES[case]
    rng = np.random.default_rng(7)
    y, p, mask = data(rng, 300)
    single = make()
    single.eval(y, p, mask=mask)
    parts = []
    for idx in np.array_split(rng.permutation(300), 5):
        part = make()
        part.eval(y[idx], p[idx], mask=None if mask is None else mask[idx])
        parts.append(part)
    merged = make()
    for part in reversed(parts):
        merged.merge(part)
    np.testing.assert_equal(signature(merged), signature(single))
    text = merged.stats()
    assert isinstance(text, str) and text


def test_merge_rejects_incompatible_partials() -> None:
    a, b = Evaluation(), Evaluation()
    a.eval(np.eye(3), np.eye(3))
    b.eval(np.eye(4), np.eye(4))
    with pytest.raises(ValueError, match="other has 4 classes"):
        a.merge(b)
    with pytest.raises(ValueError, match="other: top_n"):
        Evaluation(top_n=2).merge(Evaluation(top_n=3))
    with pytest.raises(TypeError, match="other"):
        a.merge(RegressionEvaluation())  # type: ignore[arg-type]
    r1, r2 = RegressionEvaluation(), RegressionEvaluation()
    r1.eval(np.ones((2, 1)), np.ones((2, 1)))
    r2.eval(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="other has 2 columns"):
        r1.merge(r2)
    assert a.confusion_matrix().sum() == 3
