"""ROC, ROCBinary and ROCMultiClass against scikit-learn, including tied scores."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn import metrics

from sparkgrad.eval import ROC, ROCBinary, ROCMultiClass

seeds = st.integers(0, 2**32 - 1)


def _binary(seed: int, n: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores; ``levels`` > 0 quantises the scores so that many of them tie."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    s = np.clip(rng.random(n) * 0.8 + 0.2 * y, 0, 1)
    if levels:
        s = np.floor(s * levels) / levels
    return y, s


@given(seeds, st.integers(1, 200), st.sampled_from([0, 3, 10]))
def test_exact_auc_matches_sklearn_with_ties(seed: int, n: int, levels: int) -> None:
    y, s = _binary(seed, n, levels)
    roc = ROC()
    roc.eval(y[:, None], s[:, None])
    if len(set(y)) < 2:
        assert np.isnan(roc.calculate_auc())
        return
    assert roc.calculate_auc() == pytest.approx(metrics.roc_auc_score(y, s), abs=1e-12)
    # sklearn's PR curve has the same points (one per distinct score, plus precision 1 at recall 0).
    precision, recall, _ = metrics.precision_recall_curve(y, s)
    assert roc.calculate_auprc() == pytest.approx(metrics.auc(recall, precision), abs=1e-12)
    fpr, tpr, _ = metrics.roc_curve(y, s, drop_intermediate=False)
    curve = roc.roc_curve()
    assert curve.area() == pytest.approx(metrics.auc(fpr, tpr), abs=1e-12)
    assert np.all(np.diff(curve.fpr) >= 0) and curve.fpr[0] == 0 and curve.tpr[-1] == 1


@given(seeds, st.integers(1, 200), st.integers(1, 12))
def test_thresholded_equals_exact_on_grid_scores(seed: int, n: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    s = rng.integers(0, steps, n) / steps  # grid values below 1: both modes see the same points
    exact, thresholded = ROC(), ROC(threshold_steps=steps)
    for roc in (exact, thresholded):
        roc.eval(np.stack([1 - y, y], axis=1), np.stack([1 - s, s], axis=1))
    # Same points, but the thresholded curve repeats some: its zero-width trapezoids change np.sum's
    # pairwise grouping. Each side sums at most steps + 1 terms in [0, 1], each off by <= 3 ulp.
    tolerance = 2 * (steps + 1 + 3) * np.finfo(np.float64).eps
    auc = exact.calculate_auc()  # NaN when y holds one class
    assert thresholded.calculate_auc() == pytest.approx(auc, rel=0, abs=tolerance, nan_ok=True)
    assert thresholded.calculate_auprc() == pytest.approx(exact.calculate_auprc(), rel=0, abs=tolerance)
    t = float(rng.integers(0, steps + 1) / steps)
    expected = exact.confusion_at_threshold(t) if t < 1 else (0, 0, int((y == 0).sum()), int(y.sum()))
    assert tuple(thresholded.confusion_at_threshold(t)) == tuple(expected)
    assert "Thresholded AUC/AUPRC calculation used with" in thresholded.stats()


@given(seeds, st.integers(1, 150), st.floats(-0.5, 1.5))
def test_confusion_at_threshold_counts(seed: int, n: int, threshold: float) -> None:
    y, s = _binary(seed, n, 5)
    roc = ROC()
    roc.eval(y, s)
    predicted = s >= threshold
    tp, fp, tn, fn = roc.confusion_at_threshold(threshold)
    assert (tp, fp) == (int(np.sum(predicted & (y == 1))), int(np.sum(predicted & (y == 0))))
    assert (tn, fn) == (int(np.sum(~predicted & (y == 0))), int(np.sum(~predicted & (y == 1))))


def test_thresholded_rule_at_one_and_pr_edges() -> None:
    roc = ROC(threshold_steps=4)
    roc.eval(np.array([1, 1, 0, 0]), np.array([1.0, 0.6, 0.3, 0.0]))
    # At t = 1.0 nothing is positive even though p = 1.0 exists.
    assert tuple(roc.confusion_at_threshold(1.0)) == (0, 0, 2, 2)
    assert tuple(roc.confusion_at_threshold(0.5)) == (2, 0, 2, 0)
    pr = roc.precision_recall_curve()
    assert pr.precision[-1] == 1.0 and pr.recall[-1] == 0.0
    assert roc.calculate_auc() == 1.0


@given(seeds, st.integers(2, 150), st.integers(2, 6), st.sampled_from([0, 4]))
def test_multiclass_one_vs_rest_auc_matches_sklearn(seed: int, n: int, c: int, levels: int) -> None:
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.arange(c), rng.integers(0, c, n)])  # every class present
    probs = rng.random((len(y), c)) + np.eye(c)[y] * 0.5
    if levels:
        probs = np.floor(probs * levels) / levels
    roc = ROCMultiClass(labels=[f"class{k}" for k in range(c)])
    roc.eval(np.eye(c)[y], probs)
    per_class = [metrics.roc_auc_score(y == k, probs[:, k]) for k in range(c)]
    for k in range(c):
        assert roc.calculate_auc(k) == pytest.approx(per_class[k], abs=1e-12)
    # sklearn's 'ovr' expects rows summing to one; its per-class macro mean is what we compare.
    assert roc.calculate_average_auc() == pytest.approx(np.mean(per_class), abs=1e-12)
    normed = probs / probs.sum(axis=1, keepdims=True)
    if not levels and c > 2:  # sklearn treats 2 columns as a binary problem
        roc2 = ROCMultiClass()
        roc2.eval(np.eye(c)[y], normed)
        expected = metrics.roc_auc_score(y, normed, multi_class="ovr", labels=list(range(c)))
        assert roc2.calculate_average_auc() == pytest.approx(expected, abs=1e-12)
    text = roc.stats()
    assert "class0" in text and "Average AUC" in text


@given(seeds, st.integers(2, 150), st.integers(1, 4), st.sampled_from([0, 8]))
def test_roc_binary_per_output_mask(seed: int, n: int, size: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, (n, size))
    s = np.round(rng.random((n, size)), 1)
    mask = (rng.random((n, size)) < 0.7).astype(np.float32)
    roc = ROCBinary(threshold_steps=steps)
    roc.eval(y, s, mask=mask)
    for j in range(size):
        keep = mask[:, j] != 0
        single = ROC(steps)
        if keep.any():
            single.eval(y[keep, j], s[keep, j])
            np.testing.assert_equal(roc.calculate_auc(j), single.calculate_auc())
            np.testing.assert_equal(roc.calculate_auprc(j), single.calculate_auprc())
        assert roc.roc(j).count_actual_positive() == int(y[keep, j].sum())
    assert "AUPRC" in roc.stats()


def test_roc_errors() -> None:
    roc = ROC()
    with pytest.raises(ValueError, match="no data"):
        roc.calculate_auc()
    with pytest.raises(ValueError, match="1 or 2 columns"):
        roc.eval(np.eye(3), np.eye(3))
    with pytest.raises(ValueError, match="predictions contains NaN"):
        roc.eval(np.ones(2), np.array([0.5, np.nan]))
    with pytest.raises(ValueError, match="threshold_steps"):
        ROC(threshold_steps=-1)
    with pytest.raises(ValueError, match="other: threshold_steps"):
        ROC().merge(ROC(5))
    with pytest.raises(TypeError, match="other"):
        ROC().merge(ROCBinary())  # type: ignore[arg-type]
    multi = ROCMultiClass()
    with pytest.raises(ValueError, match="at least 2 columns"):
        multi.eval(np.ones((3, 1)), np.ones((3, 1)))
    multi.eval(np.eye(3), np.eye(3))
    with pytest.raises(ValueError, match="labels has 4 columns"):
        multi.eval(np.eye(4), np.eye(4))
    with pytest.raises(ValueError, match="cls"):
        multi.calculate_auc(3)


def test_exact_storage_is_compact_and_grows_geometrically() -> None:
    import pickle

    roc = ROC()
    rng = np.random.default_rng(0)
    for _ in range(50):
        roc.eval(rng.integers(0, 2, 1000), rng.random(1000).astype(np.float32))
    assert roc._scores.dtype == np.float32  # float32 input stays float32
    assert len(roc._scores) < 2 * 50_000
    assert len(pickle.dumps(roc)) < 50_000 * 5 + 2_000  # 4 bytes score + 1 byte label per row
    roc.eval(np.array([1]), np.array([0.25]))  # float64 input widens the storage losslessly
    assert (
        roc._scores.dtype == np.float64
        and roc.count_actual_positive() + roc.count_actual_negative() == 50_001
    )
