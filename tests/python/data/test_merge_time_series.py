"""DataSet / MultiDataSet merge of time series of different lengths: end padding with zeros and masks
marking the padded steps absent (DL4J's DataSet.merge), through rebatch, and invisible to a network."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgrad.data import DataSet, MultiDataSet, rebatch
from sparkgrad.nn import (
    LSTM,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
)

F32 = np.float32


def _seq(*rows: list[float]) -> np.ndarray:
    """(n, 1, time) float32 features, one row per example."""
    return np.array(rows, F32)[:, None, :]


def test_merge_pads_at_the_end_and_masks_the_padding() -> None:
    # a: length 2 with a features mask and no labels mask; b: length 4 with a labels mask only;
    # c: length 3 with no mask at all
    a = DataSet(_seq([1, 2], [3, 4]), _seq([1, 1], [2, 2]), features_mask=np.array([[1, 0], [1, 1]], F32))
    b = DataSet(_seq([5, 6, 7, 8]), _seq([3, 3, 3, 3]), labels_mask=np.array([[1, 1, 0, 1]], F32))
    c = DataSet(_seq([9, 10, 11]), _seq([4, 4, 4]))
    merged = DataSet.merge([a, b, c])
    np.testing.assert_array_equal(
        merged.features, _seq([1, 2, 0, 0], [3, 4, 0, 0], [5, 6, 7, 8], [9, 10, 11, 0])
    )
    np.testing.assert_array_equal(merged.labels, _seq([1, 1, 0, 0], [2, 2, 0, 0], [3, 3, 3, 3], [4, 4, 4, 0]))
    np.testing.assert_array_equal(
        merged.features_mask, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    )
    # a had no labels mask: its loss was masked by its features mask, which it keeps
    np.testing.assert_array_equal(
        merged.labels_mask, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 1], [1, 1, 1, 0]]
    )
    assert merged.features.dtype == merged.labels.dtype == F32
    assert merged.features_mask.dtype == merged.labels_mask.dtype == F32


def test_merge_pads_per_output_labels_masks_along_time() -> None:
    labels_a = np.arange(4, dtype=F32).reshape(1, 2, 2) + 1
    per_output = np.array([[[1, 0], [0, 1]]], F32)  # (n, size, time) like the labels
    a = DataSet(_seq([1, 2]), labels_a, labels_mask=per_output)
    b = DataSet(_seq([3, 4, 5]), np.full((1, 2, 3), 7, F32))
    merged = DataSet.merge([a, b])
    np.testing.assert_array_equal(merged.labels, [[[1, 2, 0], [3, 4, 0]], [[7, 7, 7], [7, 7, 7]]])
    np.testing.assert_array_equal(merged.labels_mask, [[[1, 0, 0], [0, 1, 0]], [[1, 1, 1], [1, 1, 1]]])
    np.testing.assert_array_equal(merged.features_mask, [[1, 1, 0], [1, 1, 1]])
    # a features mask fills a missing per-output labels mask on every output
    c = DataSet(_seq([6, 6, 6, 6]), np.ones((1, 2, 4), F32), features_mask=np.array([[1, 0, 1, 0]], F32))
    np.testing.assert_array_equal(
        DataSet.merge([a, c]).labels_mask, [[[1, 0, 0, 0], [0, 1, 0, 0]], [[1, 0, 1, 0], [1, 0, 1, 0]]]
    )


@pytest.mark.parametrize(
    ("dtype", "mask_dtype"), [(np.float64, np.float64), (np.float16, np.float16), (np.int32, F32)]
)
def test_created_masks_take_the_data_float_dtype(dtype, mask_dtype) -> None:
    a = DataSet(np.ones((1, 2, 1), dtype))
    b = DataSet(np.ones((2, 2, 3), dtype))
    merged = DataSet.merge([a, b])
    assert merged.features.dtype == dtype and merged.features_mask.dtype == mask_dtype
    np.testing.assert_array_equal(merged.features_mask, [[1, 0, 0], [1, 1, 1], [1, 1, 1]])
    assert merged.labels is None and merged.labels_mask is None
    # a given mask fixes the dtype, as when merge fills missing masks with ones
    c = DataSet(np.ones((1, 2, 2), dtype), features_mask=np.ones((1, 2), np.uint8))
    assert DataSet.merge([a, c]).features_mask.dtype == np.uint8


def test_multi_dataset_pads_each_slot_separately() -> None:
    a = MultiDataSet(
        [_seq([1, 2]), _seq([1, 1, 1, 1])],
        [np.array([[1.0]], F32)],
        features_masks=[None, np.array([[1, 1, 1, 0]], F32)],
    )
    b = MultiDataSet([_seq([3, 4, 5]), _seq([2, 2, 2, 2])], [np.array([[2.0]], F32)])
    merged = MultiDataSet.merge([a, b])
    x0, x1 = merged.features
    np.testing.assert_array_equal(x0, _seq([1, 2, 0], [3, 4, 5]))
    np.testing.assert_array_equal(x1, _seq([1, 1, 1, 1], [2, 2, 2, 2]))  # equal lengths: no padding
    m0, m1 = merged.features_masks
    np.testing.assert_array_equal(m0, [[1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(m1, [[1, 1, 1, 0], [1, 1, 1, 1]])  # filled with ones as before
    np.testing.assert_array_equal(merged.labels[0], [[1], [2]])
    assert merged.labels_masks is None


def test_equal_lengths_merge_exactly_as_concatenation() -> None:
    rng = np.random.default_rng(0)
    parts = [DataSet(rng.normal(size=(n, 2, 4)).astype(F32), rng.normal(size=(n, 3, 4))) for n in (1, 3)]
    merged = DataSet.merge(parts)
    assert merged == DataSet(
        np.concatenate([p.features for p in parts]), np.concatenate([p.labels for p in parts])
    )
    assert merged.features_mask is None and merged.labels_mask is None
    multi = MultiDataSet.merge([MultiDataSet.from_dataset(p) for p in parts])
    assert multi.features_masks is None and multi.labels_masks is None


def test_other_shape_mismatches_still_name_the_index() -> None:
    a = DataSet(np.zeros((2, 3, 4), F32))
    with pytest.raises(
        ValueError, match=r"datasets\[1\]: features has shape \(1, 2, 5\), expected \(n, 3, 4\)"
    ):
        DataSet.merge([a, DataSet(np.zeros((1, 2, 5), F32))])  # size axis differs
    with pytest.raises(ValueError, match=r"datasets\[2\]: features has shape \(1, 3\), expected \(n, 3, 4\)"):
        DataSet.merge([a, a, DataSet(np.zeros((1, 3), F32))])  # rank differs
    with pytest.raises(ValueError, match=r"datasets\[1\]: features has shape \(1, 5\), expected \(n, 4\)"):
        DataSet.merge([DataSet(np.zeros((1, 4))), DataSet(np.zeros((1, 5)))])  # rank 2 trailing shape
    m = MultiDataSet([np.zeros((1, 3, 4)), np.zeros((1, 2, 4))], [])
    with pytest.raises(ValueError, match=r"datasets\[1\]: features\[1\] has shape \(1, 1, 6\)"):
        MultiDataSet.merge([m, MultiDataSet([np.zeros((1, 3, 6)), np.zeros((1, 1, 6))], [])])
    # a mask whose time axis disagrees with its (padded) array's
    bad = DataSet(np.zeros((1, 3, 6), F32), features_mask=np.ones((1, 5), F32))
    with pytest.raises(
        ValueError, match=r"datasets\[1\]: features_mask has shape \(1, 5\), expected \(n, 6\) for features"
    ):
        DataSet.merge([a, bad])


@st.composite
def variable_length_parts(draw: st.DrawFn) -> list[DataSet]:
    size, n_out = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        n, t = draw(st.integers(0, 3)), draw(st.integers(1, 6))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))

        def mask(rng=rng, n=n, t=t) -> np.ndarray | None:
            return (rng.random((n, t)) < 0.7).astype(F32) if draw(st.booleans()) else None

        parts.append(
            DataSet(
                rng.normal(size=(n, size, t)).astype(F32) + 3,  # nonzero, so padding zeros stand out
                rng.normal(size=(n, n_out, t)).astype(F32) + 3,
                mask(),
                mask(),
            )
        )
    return parts


@settings(max_examples=60, deadline=None)
@given(parts=variable_length_parts())
def test_merged_steps_of_each_input_equal_the_input(parts: list[DataSet]) -> None:
    merged = DataSet.merge(parts)
    t_max = max(p.features.shape[2] for p in parts)
    start = 0
    for p in parts:
        n, t = len(p), p.features.shape[2]
        rows = slice(start, start + n)
        start += n
        np.testing.assert_array_equal(merged.features[rows, :, :t], p.features)
        np.testing.assert_array_equal(merged.labels[rows, :, :t], p.labels)
        if merged.features_mask is None:  # only when nothing was masked or padded
            assert t == t_max and all(q.features_mask is None for q in parts)
            continue
        want_fm = np.ones((n, t)) if p.features_mask is None else p.features_mask
        np.testing.assert_array_equal(merged.features_mask[rows, :t], want_fm)
        np.testing.assert_array_equal(merged.features_mask[rows, t:], 0)
        np.testing.assert_array_equal(merged.features[rows, :, t:], 0)
        np.testing.assert_array_equal(merged.labels[rows, :, t:], 0)
        if t < t_max:  # padded: the labels mask is the one the loss used, and 0 after
            own = p.labels_mask if p.labels_mask is not None else p.features_mask
            want_lm = np.ones((n, t)) if own is None else own
            np.testing.assert_array_equal(merged.labels_mask[rows, :t], want_lm)
            np.testing.assert_array_equal(merged.labels_mask[rows, t:], 0)
    assert start == len(merged)


def test_rebatch_of_variable_length_sequences_masks_exactly_the_real_steps() -> None:
    lengths = [3, 7, 2, 5, 5, 1, 6]
    parts = [DataSet(np.full((1, 2, t), i + 1, F32), np.ones((1, 1, t), F32)) for i, t in enumerate(lengths)]
    batches = list(rebatch(iter(parts), 3))
    assert [len(b) for b in batches] == [3, 3, 1]
    ids = 0
    for b in batches:
        for row in range(len(b)):
            t = lengths[ids]
            ids += 1
            if len(b) > 1:  # a batch of one is passed through unpadded and unmasked
                np.testing.assert_array_equal(b.features_mask[row], np.arange(b.features.shape[2]) < t)
                np.testing.assert_array_equal(b.labels_mask[row], np.arange(b.features.shape[2]) < t)
            np.testing.assert_array_equal(b.features[row, :, :t], ids)
            np.testing.assert_array_equal(b.features[row, :, t:], 0)
    assert [b.features.shape[2] for b in batches] == [7, 5, 6]


# -- a network sees the same sequences, merged or alone --------------------------------------------

U32 = float(np.finfo(F32).eps) / 2


def _gamma(n: int) -> float:
    """Higham's gamma_n: relative error bound of n chained float32 roundings."""
    return n * U32 / (1 - n * U32)


def _score_bound(scores: np.ndarray, steps: np.ndarray, size: int, hidden: int, classes: int) -> np.ndarray:
    """Per-example bound on |score computed in one batch - in another|, in float32.

    BLAS may sum the dot products in another order for another batch shape. A step's loss comes from a
    chain of at most steps * (size + hidden + 1) roundings (the recurrence's dot products through the
    contractive sigmoid/tanh), then hidden + 1 for the output layer and ``classes`` for the softmax
    sum; each of the ``steps`` present losses is of order max(1, |score|), and each side may be off by
    that relative bound, hence twice it."""
    chain = steps * (size + hidden + 1) + hidden + 1 + classes
    return 2 * np.array([_gamma(int(k)) for k in chain]) * steps * np.maximum(1.0, np.abs(scores))


def _sign_sequences(rng: np.random.Generator, n: int, t: int, masked: bool) -> DataSet:
    x = rng.normal(size=(n, 1, t)).astype(F32)
    y = np.eye(2, dtype=F32)[rng.integers(0, 2, (n, t))].transpose(0, 2, 1)
    mask = (rng.random((n, t)) < 0.7).astype(F32) if masked else None
    if mask is not None:
        mask[:, 0] = 1
    return DataSet(x, y, features_mask=mask)


def test_lstm_scores_a_sequence_the_same_merged_or_alone() -> None:
    """RnnOutputLayer: per-step losses of a short sequence are unchanged by merging it with longer ones
    (padded steps masked), including its own features mask taking the labels mask's place."""
    conf = MultiLayerConfiguration([LSTM(6), RnnOutputLayer(2)], input_type=InputType.recurrent(1), seed=3)
    net = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(1)
    short = _sign_sequences(rng, 3, 4, masked=True)
    longer = _sign_sequences(rng, 2, 9, masked=False)
    merged = DataSet.merge([short, longer])
    alone = np.concatenate([net.score_examples(short), net.score_examples(longer)])
    together = net.score_examples(merged)
    steps = merged.labels_mask.sum(axis=1)
    np.testing.assert_array_less(np.abs(together - alone), _score_bound(alone, steps, 1, 6, 2))
    # outputs are probabilities (at most 1) at the end of the same chain of roundings
    out_bound = 2 * _gamma(4 * (1 + 6 + 1) + 6 + 1 + 2)
    np.testing.assert_allclose(net.output(merged)[:3, :, :4], net.output(short), rtol=0, atol=out_bound)
    # the masks change the answer: without them the padded steps (and a's masked steps) count
    unmasked = net.score_examples(DataSet(merged.features, merged.labels))
    assert np.all(np.abs(unmasked[:3] - alone[:3]) > 100 * _score_bound(alone, steps, 1, 6, 2)[:3])


def test_last_time_step_outputs_the_same_merged_or_alone() -> None:
    conf = MultiLayerConfiguration(
        [LastTimeStep(LSTM(6)), OutputLayer(2)], input_type=InputType.recurrent(1), seed=4
    )
    net = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(2)
    parts = [DataSet(rng.normal(size=(2, 1, t)).astype(F32), np.eye(2, dtype=F32)[[0, 1]]) for t in (3, 8, 5)]
    merged = DataSet.merge(parts)
    alone = np.concatenate([net.score_examples(p) for p in parts])
    together = net.score_examples(merged)
    steps = np.repeat([3, 8, 5], 2)
    bound = _score_bound(alone, steps, 1, 6, 2)
    np.testing.assert_array_less(np.abs(together - alone), bound)
    # without the features mask the last step is a padded zero step and the answer changes
    unmasked = net.score_examples(DataSet(merged.features, merged.labels))
    assert np.all(np.abs(unmasked[[0, 1, 4, 5]] - alone[[0, 1, 4, 5]]) > 100 * bound[[0, 1, 4, 5]])
