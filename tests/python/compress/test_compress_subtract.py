"""subtract_message (a sparse message subtracted straight from parameters) against the NumPy reference,
and the replica it leaves against the dense path it replaced (decode into a zeroed scratch, then
``apply_update``): bit for bit, for encoder output, repeated and unsorted indices, both dtypes and 1, 2 and
4 threads."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import compress as ref

import sparkgrad
from sparkgrad import compress
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    EmbeddingSequenceLayer,
    GlobalPoolingLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)

THREADS = (1, 2, 4)


def _message(entries: np.ndarray, n: int, threshold: float) -> np.ndarray:
    header = np.array([len(entries), n, ref.threshold_bits(threshold), 0], dtype=np.int32)
    return np.concatenate([header, entries.astype(np.int32)])


@st.composite
def sparse_messages(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(a valid sparse message, a target of its length): the encoder's ascending entries, or entries drawn
    with repeats, ascending or in any order; up to 200k entries, so the OpenMP path runs too. Targets hold
    exact zeros of both signs, infinities and values the threshold rounds against."""
    n = draw(st.one_of(st.integers(1, 40), st.integers(1, 300_000)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threshold = draw(st.floats(1e-4, 10.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    target = (rng.normal(size=n) * draw(st.sampled_from([1e-3, 1.0, 1e4]))).astype(dtype)
    special = rng.random(n) < 0.02
    target[special] = rng.choice([0.0, -0.0, np.inf, -np.inf], int(special.sum()))
    kind = draw(st.sampled_from(["encoded", "repeats_sorted", "repeats_any_order"]))
    if kind == "encoded":
        residual = rng.normal(size=n).astype(dtype) * threshold
        return ref.threshold_encode(residual, threshold)[0], target
    count = draw(st.sampled_from([0, 1, 7, 1000, 200_000]))
    idx = rng.integers(0, min(n, draw(st.sampled_from([3, n]))), count)
    if kind == "repeats_sorted":
        idx = np.sort(idx)
    entries = np.where(rng.random(count) < 0.5, idx + 1, -(idx + 1))
    return _message(entries, n, threshold), target


def _per_thread_count(message: np.ndarray, target: np.ndarray) -> list[np.ndarray]:
    before = sparkgrad.get_num_threads()
    results = []
    try:
        for threads in THREADS:
            sparkgrad.set_num_threads(threads)
            out = target.copy()
            compress.subtract_message(message, out)
            results.append(out)
    finally:
        sparkgrad.set_num_threads(before)
    return results


@given(data=sparse_messages())
def test_subtract_message_matches_reference(data) -> None:
    message, target = data
    expected = ref.subtract(message, target)
    for out in _per_thread_count(message, target):
        assert out.tobytes() == expected.tobytes()


def test_repeated_index_subtracts_its_entries_summed_in_message_order() -> None:
    # float32, t = 1.5 * 2**-24: 1 - t - t - t rounds unlike 1 - (t + t + t), which the dense path computes
    t = float(np.float32(1.5 * 2.0**-24))
    message = _message(np.array([3, -1, 3, 2, 3]), 3, t)
    target = np.array([1.0, 1.0, 1.0], np.float32)
    out = target.copy()
    compress.subtract_message(message, out)
    t32 = np.float32(t)
    assert out.tobytes() == np.array([1 + t32, 1 - t32, 1 - (t32 + t32 + t32)], np.float32).tobytes()
    assert out.tobytes() == ref.subtract(message, target).tobytes()
    assert out[2] != np.float32(np.float32(np.float32(1 - t32) - t32) - t32)  # not one subtraction per entry


def test_only_the_message_indices_are_written() -> None:
    target = np.array([np.nan, -0.0, 5.0, np.inf], np.float64)
    message = _message(np.array([3]), 4, 0.5)
    compress.subtract_message(message, target)
    assert np.isnan(target[0]) and np.signbit(target[1])
    assert target[2] == 4.5 and target[3] == np.inf


@pytest.mark.parametrize(
    "message, error",
    [
        (_message(np.array([1, 5]), 4, 0.5), r"\[subtract_message\] sparse entry 1 is 5, outside"),
        (_message(np.array([1]), 5, 0.5), r"\[subtract_message\] message encodes 5 elements"),
        (ref.bitmap_encode(np.array([1.0, -1.0, 0.0, 2.0]), 0.5)[0], r"message flag \(word 3\) must be 0"),
        (np.array([1, 4], np.int32), r"message must hold at least 4 header words"),
    ],
)
def test_malformed_message_raises_and_leaves_target_untouched(message: np.ndarray, error: str) -> None:
    target = np.arange(4, dtype=np.float32)
    with pytest.raises(ValueError, match=error):
        compress.subtract_message(message, target)
    np.testing.assert_array_equal(target, np.arange(4, dtype=np.float32))


def test_bad_arrays_are_named() -> None:
    message = _message(np.array([1]), 4, 0.5)
    with pytest.raises(ValueError, match=r"\[subtract_message\] target must have dtype float32 or float64"):
        compress.subtract_message(message, np.zeros(4, np.int64))
    with pytest.raises(ValueError, match=r"\[subtract_message\] target"):
        compress.subtract_message(message, np.zeros(4, np.float32)[::-1])
    with pytest.raises(ValueError, match=r"\[subtract_message\] message"):
        compress.subtract_message(message.astype(np.int64), np.zeros(4, np.float32))


# -- the replica: apply_message against the dense path it replaced ----------------------------------------


def _graph(dtype: str) -> ComputationGraph:
    """The click-through model of bench_workloads.py at a small table: row-sparse lazy-Adam embeddings."""
    conf = (
        ComputationGraphConfiguration.builder(seed=1, updater=updaters.Adam(2e-3), dtype=dtype)
        .add_inputs("fields")
        .set_input_types(InputType.recurrent(1, 4))
        .add_layer("deep", EmbeddingSequenceLayer(5000, 4, lazy_updates=True), "fields")
        .add_layer("deep_sum", GlobalPoolingLayer("sum"), "deep")
        .add_layer("hidden", DenseLayer(8, activation="relu"), "deep_sum")
        .add_layer("click", OutputLayer(2), "hidden")
        .set_outputs("click")
        .build()
    )
    return ComputationGraph(conf).init()


def _mlp(dtype: str) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(16, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(5),
        updater=updaters.Adam(1e-2),
        seed=0,
        dtype=dtype,
    )
    return MultiLayerNetwork(conf).init()


def _messages(n: int, dtype: str, rng: np.random.Generator) -> list[np.ndarray]:
    """What peers send: encoder output at several thresholds, a bitmap, repeated and unsorted entries."""
    out = []
    for threshold in (1e-3, 3e-2, 0.5):
        residual = rng.normal(0, 0.05, n).astype(dtype)
        out.append(compress.threshold_encode(residual, threshold))
    out.append(compress.bitmap_encode(rng.normal(0, 0.05, n).astype(dtype), 0.02)[0])
    idx = rng.integers(0, n, 500)
    out.append(_message(np.where(rng.random(500) < 0.5, idx + 1, -(idx + 1)), n, 1e-3))
    out.append(_message(np.sort(idx) + 1, n, 7e-4))
    return out


@pytest.mark.parametrize("make", [_graph, _mlp])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_replica_after_apply_message_is_bit_identical_to_the_dense_path(make, dtype: str) -> None:
    new, old = make(dtype), make(dtype)
    assert new.params().tobytes() == old.params().tobytes()
    n = new.num_params()
    scratch_new, scratch_old = np.zeros(n, dtype), np.zeros(n, dtype)
    messages = _messages(n, dtype, np.random.default_rng(3))
    for message in messages:
        compress.apply_message(message, new, scratch_new)
        compress.decode_message_into(message, scratch_old)  # the former apply_message
        old.apply_update(scratch_old)
        assert new.params().tobytes() == old.params().tobytes()
    expected = old.params().copy()
    assert not np.array_equal(expected, make(dtype).params())  # the messages moved the parameters


def test_apply_message_applies_a_sparse_message_without_the_scratch() -> None:
    net = _mlp("float32")
    start = net.params().copy()
    scratch = np.full(net.num_params(), 9.0, np.float32)
    message = _message(np.array([1, -3]), net.num_params(), 0.5)
    compress.apply_message(message, net, scratch)
    assert (scratch == 9.0).all()  # O(entries): no pass over the scratch
    expected = ref.subtract(message, start)
    assert net.params().tobytes() == expected.tobytes()
    with pytest.raises(ValueError, match="sparse entry 0 is 0"):  # validated by the kernel
        compress.apply_message(_message(np.array([0]), net.num_params(), 0.5), net, scratch)
    assert net.params().tobytes() == expected.tobytes()


def test_apply_message_keeps_the_dense_path_for_a_network_without_apply_sparse_message() -> None:
    message = compress.threshold_encode(np.array([0.0, 1.0, -1.0], np.float32), 0.5)
    scratch = np.full(3, 9.0, np.float32)
    applied: list[np.ndarray] = []
    compress.apply_message(message, SimpleNamespace(apply_update=lambda u: applied.append(u.copy())), scratch)
    np.testing.assert_array_equal(applied[0], [0.0, 0.5, -0.5])


@pytest.mark.parametrize("own_update", compress.OWN_UPDATES)
def test_share_update_without_decode_sparse_leaves_the_replica_as_with_it(own_update: str) -> None:
    """decode_sparse=False skips the own sparse message's decode into the scratch (a pass over the
    parameters' size) and changes nothing else; a bitmap is still decoded there."""
    nets = {flag: _mlp("float32") for flag in (True, False)}
    scratches = {flag: np.full(nets[flag].num_params(), 9.0, np.float32) for flag in (True, False)}
    handlers = {
        flag: compress.EncodingHandler(
            nets[flag].num_params(),
            compress.FixedThresholdAlgorithm(2e-3),
            compress.NoOpResidualPostProcessor(),
        )
        for flag in (True, False)
    }
    rng = np.random.default_rng(5)
    kinds = set()
    for step in range(6):
        # small updates give sparse messages, the large one bitmaps until its residual is sent
        update = rng.normal(0, 1e-3 if step != 3 else 1.0, nets[True].num_params()).astype(np.float32)
        for scratch in scratches.values():
            scratch.fill(9.0)
        messages = {
            flag: compress.share_update(
                handlers[flag], nets[flag], update, step, 0, own_update, scratches[flag], decode_sparse=flag
            )
            for flag in (True, False)
        }
        assert messages[True] is not None and messages[False] is not None
        assert messages[True].tobytes() == messages[False].tobytes()
        assert nets[True].params().tobytes() == nets[False].params().tobytes()
        expected = np.empty_like(scratches[True])
        compress.decode_message_into(messages[True], expected)
        np.testing.assert_array_equal(scratches[True], expected)
        if messages[True][3] == compress.FLAG_BITMAP:
            kinds.add("bitmap")
            np.testing.assert_array_equal(scratches[False], expected)
        else:
            kinds.add("sparse")
            assert (scratches[False] == 9.0).all()
    assert kinds == {"sparse", "bitmap"}


# -- the residual add at a row-sparse step's support --------------------------------------------------


@given(
    n=st.integers(1, 3000),
    dtype=st.sampled_from(["float32", "float64"]),
    scale=st.sampled_from([1.0, 0.5, 1 / 3]),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_with_support_matches_the_whole_vector(n: int, dtype: str, scale: float, seed: int) -> None:
    """Adding only the support of updates that are zero elsewhere leaves the same residuals, thresholds and
    messages as adding the whole vectors, over steps whose supports differ (so untouched elements keep
    residual that later thresholds send)."""
    rng = np.random.default_rng(seed)
    # measured against N (written_cap=False): the whole-vector handler knows no support to cap by
    uncapped = dataclasses.replace(compress.default_threshold_algorithm(), written_cap=False)
    handlers = [compress.EncodingHandler(n, uncapped, dtype=dtype, update_scale=scale) for _ in range(2)]
    for step in range(8):
        support = np.unique(rng.integers(0, n, rng.integers(0, n + 1)))
        update = np.zeros(n, dtype)
        update[support] = rng.normal(0, 1e-2, support.size)
        update[support[: support.size // 5]] = 0.0  # a support may hold zeros too
        whole = handlers[0].encode(update, step, 0)
        part = handlers[1].encode(update, step, 0, support=support)
        assert (whole is None) == (part is None)
        if whole is not None:
            assert whole.tobytes() == part.tobytes()
        assert handlers[0].residual.tobytes() == handlers[1].residual.tobytes()
        assert handlers[0].last_threshold == handlers[1].last_threshold


def test_bad_support_is_named() -> None:
    handler = compress.EncodingHandler(4, dtype="float32")
    update = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"support: indices must be in \[0, 4\), got \[1, 4\]"):
        handler.encode(update, 0, 0, support=np.array([1, 4]))
    with pytest.raises(ValueError, match="support: expected a 1-D integer array"):
        handler.encode(update, 0, 0, support=np.array([1.0]))
    with pytest.raises(ValueError, match="support: expected an integer array on the update's device"):
        handler.encode(update, 0, 0, support=[1])


def _ctr_batch(rng: np.random.Generator, dtype: str) -> DataSet:
    """16 rows of 4 looked-up ids of _graph's 5000-row table and one-hot clicks."""
    ids = rng.integers(0, 5000, (16, 1, 4)).astype(dtype)
    return DataSet(ids, np.eye(2, dtype=dtype)[rng.integers(0, 2, 16)])


def test_update_support_is_where_a_row_sparse_step_wrote() -> None:
    net = _graph("float32")
    rng = np.random.default_rng(2)
    update, _ = net.compute_update(_ctr_batch(rng, "float32"), copy=False)
    support = net.update_support(update)
    assert support is not None and np.unique(support).size == support.size
    outside = np.ones(net.num_params(), bool)
    outside[support] = False
    assert outside.sum() > net.num_params() // 2  # most of the table was not looked up
    assert not update[outside].any()
    assert net.update_support(update.copy()) is None  # only the network's own buffer is known
    mlp = _mlp("float32")
    mlp_update, _ = mlp.compute_update(DataSet(rng.normal(size=(4, 5)), np.eye(3)[[0, 1, 2, 0]]), copy=False)
    assert mlp.update_support(mlp_update) is None  # a dense step


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_share_update_of_a_row_sparse_step_matches_the_whole_vector_encode(dtype: str, scale: float) -> None:
    """share_update encodes a row-sparse step through its support; a handler fed the same updates whole
    (copies, whose support is unknown) ends with the same messages and residual, and both replicas match:
    with an update_scale below 1 the own buffer, scaled in place where the step wrote, is applied as
    update * scale is."""
    nets = [_graph(dtype), _graph(dtype)]
    uncapped = dataclasses.replace(compress.default_threshold_algorithm(), written_cap=False)
    handlers = [
        compress.EncodingHandler(n.num_params(), uncapped, dtype=dtype, update_scale=scale) for n in nets
    ]
    scratch = np.zeros(nets[0].num_params(), dtype)
    rng = np.random.default_rng(4)
    for step in range(10):
        batch = _ctr_batch(rng, dtype)
        own, _ = nets[0].compute_update(batch, copy=False)
        copied, _ = nets[1].compute_update(batch)
        sent = [
            compress.share_update(handlers[0], nets[0], own, step, 0, "full", scratch, decode_sparse=False),
            compress.share_update(handlers[1], nets[1], copied, step, 0, "full", scratch),
        ]
        assert (sent[0] is None) == (sent[1] is None)
        if sent[0] is not None:
            assert sent[0].tobytes() == sent[1].tobytes()
        assert handlers[0].residual.tobytes() == handlers[1].residual.tobytes()
        assert nets[0].params().tobytes() == nets[1].params().tobytes()
