"""Evaluation and EvaluationBinary against scikit-learn on random data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics

from sparkgrad.eval import Evaluation, EvaluationBinary

seeds = st.integers(0, 2**32 - 1)


def _multiclass(seed: int, n: int, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    probs = rng.random((n, c))
    probs[np.arange(n), y] += rng.random(n)  # better than chance, still with errors
    return y, np.eye(c)[y], probs, np.argmax(probs, axis=1)


@settings(max_examples=30)  # each example makes dozens of sklearn calls
@given(seeds, st.integers(1, 120), st.integers(2, 6))
def test_evaluation_matches_sklearn(seed: int, n: int, c: int) -> None:
    y, onehot, probs, pred = _multiclass(seed, n, c)
    ev = Evaluation()
    ev.eval(onehot, probs)
    labels = list(range(c))
    np.testing.assert_array_equal(ev.confusion_matrix(), metrics.confusion_matrix(y, pred, labels=labels))
    assert ev.accuracy() == pytest.approx(metrics.accuracy_score(y, pred), abs=1e-15)
    p, r, f, _ = metrics.precision_recall_fscore_support(y, pred, labels=labels, zero_division=0)
    mcm = metrics.multilabel_confusion_matrix(y, pred, labels=labels)  # [[tn, fp], [fn, tp]]
    for k in range(c):
        assert ev.precision(k) == pytest.approx(p[k], abs=1e-12)
        assert ev.recall(k) == pytest.approx(r[k], abs=1e-12)
        assert ev.f1(k) == pytest.approx(f[k], abs=1e-12)
        (tn, fp), (fn, tp) = mcm[k]
        assert ev.false_positive_rate(k) == pytest.approx(fp / (fp + tn) if fp + tn else 0.0, abs=1e-12)
        assert ev.false_negative_rate(k) == pytest.approx(fn / (fn + tp) if fn + tp else 0.0, abs=1e-12)
        mcc = ev.matthews_correlation(k)
        defined = min(tp + fp, tp + fn, tn + fp, tn + fn) > 0
        assert np.isnan(mcc) != defined
        if defined:
            assert mcc == pytest.approx(metrics.matthews_corrcoef(y == k, pred == k), abs=1e-12)
    # Macro precision/recall leave out the classes where they are undefined (sklearn: zero_division=nan).
    for ours, theirs in ((ev.precision, metrics.precision_score), (ev.recall, metrics.recall_score)):
        expected = theirs(y, pred, labels=labels, average="macro", zero_division=np.nan)
        assert ours() == pytest.approx(expected, abs=1e-12, nan_ok=True)
        micro = theirs(y, pred, labels=labels, average="micro", zero_division=0)
        assert ours(averaging="micro") == pytest.approx(micro, abs=1e-12)
    # Macro F1 averages the classes whose precision and recall are both defined (DL4J rule).
    tp, fp, fn = mcm[:, 1, 1], mcm[:, 0, 1], mcm[:, 1, 0]
    defined = (tp + fp > 0) & (tp + fn > 0)
    expected_f1 = f[defined].mean() if defined.any() else np.nan
    assert ev.f1() == pytest.approx(expected_f1, abs=1e-12, nan_ok=True)
    assert ev.f1(averaging="micro") == pytest.approx(
        metrics.f1_score(y, pred, labels=labels, average="micro"), abs=1e-12
    )


@given(seeds, st.integers(2, 80), st.integers(3, 7), st.integers(0, 10))
def test_top_n_accuracy_matches_sklearn(seed: int, n: int, c: int, pick: int) -> None:
    top_n = 2 + pick % (c - 2)  # 2 .. c-1: k >= c is trivially perfect
    y, onehot, probs, _ = _multiclass(seed, n, c)
    ev = Evaluation(top_n=top_n)
    ev.eval(onehot, probs)
    expected = metrics.top_k_accuracy_score(y, probs, k=top_n, labels=list(range(c)))
    assert ev.top_n_accuracy() == pytest.approx(expected, abs=1e-12)
    assert "Top" in ev.stats()


@settings(max_examples=30)  # each example makes dozens of sklearn calls
@given(seeds, st.integers(2, 100), st.floats(0.05, 0.95))
def test_single_column_binary_with_threshold(seed: int, n: int, threshold: float) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = rng.random(n)
    pred = (p > threshold).astype(int)
    ev = Evaluation(binary_decision_threshold=threshold, binary_positive_class=1)
    ev.eval(y[:, None].astype(float), p[:, None])
    assert ev.num_classes == 2
    np.testing.assert_array_equal(ev.confusion_matrix(), metrics.confusion_matrix(y, pred, labels=[0, 1]))
    assert ev.precision() == pytest.approx(metrics.precision_score(y, pred, zero_division=0), abs=1e-12)
    assert ev.recall() == pytest.approx(metrics.recall_score(y, pred, zero_division=0), abs=1e-12)
    if len(set(y)) == 2 and len(set(pred)) == 2:
        assert ev.matthews_correlation() == pytest.approx(metrics.matthews_corrcoef(y, pred), abs=1e-12)
    # The same data as two one-hot columns with the threshold applied to column 1.
    two = Evaluation(binary_decision_threshold=threshold)
    two.eval(np.eye(2)[y], np.stack([1 - p, p], axis=1))
    np.testing.assert_array_equal(two.confusion_matrix(), ev.confusion_matrix())


def test_micro_false_negative_rate_uses_fn_and_tp() -> None:
    ev = Evaluation()
    ev.eval(np.eye(3)[[0, 0, 1, 2, 2, 2]], np.eye(3)[[0, 1, 1, 2, 0, 0]])
    # Micro: fn = tp-misses summed over classes = 3, tp = 3.
    assert ev.false_negative_rate(averaging="micro") == pytest.approx(3 / 6)
    assert ev.false_alarm_rate(averaging="micro") == pytest.approx(
        (ev.false_positive_rate(averaging="micro") + 0.5) / 2
    )
    assert ev.g_measure(0) == pytest.approx(np.sqrt(1 / 3 * 1 / 2))
    assert ev.f_beta(2.0, 0) == pytest.approx(5 * (1 / 3) * 0.5 / (4 * (1 / 3) + 0.5))


def test_stats_layout_and_confusion_matrix_limit() -> None:
    ev = Evaluation(labels=["cat", "dog", "eel"])
    ev.eval(np.eye(3)[[0, 1, 2, 2]], np.eye(3)[[0, 1, 1, 2]])
    text = ev.stats()
    assert "========================Evaluation Metrics========================" in text
    assert " # of classes:    3" in text
    assert " Accuracy:        0.7500" in text
    assert "| 2 = eel" in text
    assert "Confusion matrix format: Actual (rowClass) predicted as (columnClass) N times" in text
    big = Evaluation(num_classes=21)
    big.eval(np.eye(21), np.eye(21))
    assert "Confusion Matrix" not in big.stats()
    undefined = Evaluation(num_classes=3)
    undefined.eval(np.eye(3)[[0, 1]], np.eye(3)[[0, 0]])
    assert "(1 class excluded from average)" in undefined.stats()


def test_evaluation_errors_name_the_argument() -> None:
    ev = Evaluation()
    with pytest.raises(ValueError, match="predictions shape"):
        ev.eval(np.eye(3), np.eye(3)[:2])
    with pytest.raises(ValueError, match="predictions contains NaN"):
        ev.eval(np.eye(3), np.full((3, 3), np.nan))
    ev.eval(np.eye(3), np.eye(3))
    with pytest.raises(ValueError, match="labels has 4 classes"):
        ev.eval(np.eye(4), np.eye(4))
    with pytest.raises(ValueError, match="cls"):
        ev.precision(3)
    with pytest.raises(ValueError, match="averaging"):
        ev.precision(averaging="weighted")
    with pytest.raises(ValueError, match="beta"):
        ev.f_beta(0.0)
    with pytest.raises(ValueError, match="num_classes"):
        Evaluation(num_classes=1)
    with pytest.raises(ValueError, match="labels"):
        Evaluation(num_classes=3, labels=["a", "b"])
    with pytest.raises(ValueError, match="mask"):
        ev.eval(np.eye(3), np.eye(3), mask=np.ones(4))
    assert ev.confusion_matrix().sum() == 3  # failed calls left the state alone


@settings(max_examples=30)  # each example makes dozens of sklearn calls
@given(seeds, st.integers(1, 100), st.integers(1, 5))
def test_evaluation_binary_matches_sklearn(seed: int, n: int, size: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, (n, size))
    p = rng.random((n, size))
    thresholds = rng.uniform(0.2, 0.8, size)
    mask = rng.random((n, size)) < 0.8
    ev = EvaluationBinary(decision_threshold=thresholds)
    ev.eval(y, p, mask=mask.astype(float))
    counts = ev.confusion_counts()
    for j in range(size):
        keep = mask[:, j]
        yt, yp = y[keep, j], (p[keep, j] > thresholds[j]).astype(int)
        (tn, fp), (fn, tp) = (
            metrics.confusion_matrix(yt, yp, labels=[0, 1]) if keep.any() else np.zeros((2, 2))
        )
        assert (counts.tp[j], counts.fp[j], counts.tn[j], counts.fn[j]) == (tp, fp, tn, fn)
        if keep.any():
            assert ev.accuracy(j) == pytest.approx(metrics.accuracy_score(yt, yp), abs=1e-12)
        prec = ev.precision(j)
        assert np.isnan(prec) == (tp + fp == 0)
        if tp + fp:
            assert prec == pytest.approx(metrics.precision_score(yt, yp), abs=1e-12)
        if tp + fn:
            assert ev.recall(j) == pytest.approx(metrics.recall_score(yt, yp), abs=1e-12)
    assert ev.false_positive_rate() == pytest.approx(
        np.mean([ev.false_positive_rate(j) for j in range(size)]), abs=1e-15
    )


def test_evaluation_binary_stats_and_errors() -> None:
    ev = EvaluationBinary(labels=["a", "b"])
    ev.eval(np.array([[1, 0], [0, 1]]), np.array([[0.9, 0.2], [0.4, 0.7]]))
    text = ev.stats()
    assert text.splitlines()[0].startswith("Label")
    assert "1.0000" in text
    with pytest.raises(ValueError, match="labels has 3 outputs"):
        ev.eval(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="decision_threshold"):
        EvaluationBinary(size=2, decision_threshold=[0.5])
    with pytest.raises(ValueError, match="output"):
        ev.precision(2)
