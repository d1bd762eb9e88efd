"""Input flattening (time series), masks and the pickling/JSON contract shared by all evaluations."""

from __future__ import annotations

import pickle

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

seeds = st.integers(0, 2**32 - 1)


@given(seeds, st.integers(1, 8), st.integers(2, 5), st.integers(1, 6))
def test_time_series_with_step_mask_equals_flattened_rows(seed: int, batch: int, c: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    y = np.eye(c)[rng.integers(0, c, (batch, steps))].transpose(0, 2, 1)  # (batch, classes, time)
    p = rng.random((batch, c, steps))
    mask = (rng.random((batch, steps)) < 0.7).astype(np.float32)
    rows_y = y.transpose(0, 2, 1)[mask != 0]
    rows_p = p.transpose(0, 2, 1)[mask != 0]
    for make in (Evaluation, ROCMultiClass, RegressionEvaluation, EvaluationBinary):
        series, flat = make(), make()
        series.eval(y, p, mask=mask)
        if len(rows_y):
            flat.eval(rows_y, rows_p)
            assert series.to_json() == flat.to_json()


@given(seeds, st.integers(1, 10), st.integers(1, 4))
def test_per_example_mask_on_time_series_removes_every_step(seed: int, batch: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, (batch, 3, steps)).astype(float)
    p = rng.random((batch, 3, steps))
    keep = rng.random(batch) < 0.6
    masked, subset = EvaluationBinary(), EvaluationBinary()
    masked.eval(y, p, mask=keep.astype(int))
    subset.eval(y[keep], p[keep]) if keep.any() else subset.eval(y[:0], p[:0])
    assert masked.to_json() == subset.to_json()


def test_per_output_mask_support() -> None:
    y, p = np.eye(3), np.eye(3) * 0.9
    constant_rows = np.array([[1, 1, 1], [0, 0, 0], [1, 1, 1]])
    ev = Evaluation()
    ev.eval(y, p, mask=constant_rows)  # equivalent to a per-example mask
    assert ev.num_rows() == 2
    with pytest.raises(ValueError, match="mask is per-output, which Evaluation does not support"):
        Evaluation().eval(y, p, mask=np.eye(3))
    with pytest.raises(ValueError, match="mask shape"):
        ROC().eval(np.ones((3, 1, 2)), np.ones((3, 1, 2)), mask=np.ones((3, 3)))


def test_rank1_inputs_and_scalar_rejected() -> None:
    ev = RegressionEvaluation()
    ev.eval([1.0, 2.0, 3.0], [1.0, 2.5, 2.0])
    assert ev.num_columns == 1
    with pytest.raises(ValueError, match="labels must have at least one dimension"):
        ev.eval(1.0, 1.0)
    with pytest.raises(ValueError, match="labels must be a real numeric array"):
        ev.eval(np.array(["a"]), np.array([1.0]))


ALL = [Evaluation, EvaluationBinary, ROC, ROCBinary, ROCMultiClass, RegressionEvaluation]


@pytest.mark.parametrize("cls", ALL)
def test_fresh_instances_serialise_and_report(cls: type[BaseEvaluation]) -> None:
    fresh = cls()
    assert "no data" in fresh.stats()
    restored = BaseEvaluation.from_json(fresh.to_json())
    assert type(restored) is cls and restored.to_json() == fresh.to_json()
    assert pickle.loads(pickle.dumps(fresh)).to_json() == fresh.to_json()


def test_from_json_rejects_foreign_or_damaged_text() -> None:
    text = Evaluation().to_json()
    with pytest.raises(ValueError, match="holds a 'Evaluation', not a ROC"):
        ROC.from_json(text)
    with pytest.raises(ValueError, match="not valid JSON"):
        Evaluation.from_json("{oops")
    with pytest.raises(ValueError, match="not a serialised evaluation"):
        Evaluation.from_json("[1, 2]")
    roc = ROC()
    roc.eval([1, 0], [0.5, 0.25])
    with pytest.raises(ValueError, match="damaged array"):
        ROC.from_json(roc.to_json().replace('"data": "', '"data": "!'))


@given(seeds, st.integers(1, 6), st.integers(1, 3), st.integers(1, 5))
def test_time_series_per_output_mask(seed: int, batch: int, size: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, (batch, size, steps)).astype(float)
    p = np.round(rng.random((batch, size, steps)), 1)
    mask = (rng.random((batch, size, steps)) < 0.6).astype(float)
    for make in (EvaluationBinary, ROCBinary, RegressionEvaluation):
        series = make()
        series.eval(y, p, mask=mask)
        rows_y, rows_p, rows_m = (a.transpose(0, 2, 1).reshape(-1, size) for a in (y, p, mask))
        flat = make()
        flat.eval(rows_y, rows_p, mask=rows_m)
        assert series.to_json() == flat.to_json()
