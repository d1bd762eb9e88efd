"""EncodingHandler: format choice against the reference, conservation across format switches, state
properties, threads, bad input."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import compress as ref

from sparkgrad import compress
from sparkgrad.compress import (
    AdaptiveThresholdAlgorithm,
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualClippingPostProcessor,
)


def _updates(seed: int, n: int, steps: int, dtype) -> list[np.ndarray]:
    """Updates whose scale swings by orders of magnitude, so both formats and empty steps occur."""
    rng = np.random.default_rng(seed)
    scales = rng.choice([1e-6, 1e-3, 1e-2, 0.3, 3.0], steps)
    return [(rng.normal(size=n) * s).astype(dtype) for s in scales]


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 3000),
    dtype=st.sampled_from([np.float32, np.float64]),
    adaptive=st.booleans(),
)
def test_handler_matches_reference_step_by_step(seed, n, dtype, adaptive) -> None:
    algorithm = AdaptiveThresholdAlgorithm(1e-2) if adaptive else FixedThresholdAlgorithm(0.5)
    handler = EncodingHandler(n, algorithm, NoOpResidualPostProcessor(), dtype=np.dtype(dtype).name)
    mirror = AdaptiveThresholdAlgorithm(1e-2) if adaptive else FixedThresholdAlgorithm(0.5)
    residual = np.zeros(n, dtype=dtype)
    last = (None, None, None)  # threshold, was_dense, sparsity
    for it, update in enumerate(_updates(seed, n, 6, dtype)):
        residual = residual + update
        thr = mirror.calculate_threshold(it, 0, last[0], last[1], None if last[1] else last[2], residual)
        expected, dense, residual = ref.encode_smaller(residual, thr)
        message = handler.encode(update, it, 0)
        if expected is None:
            assert message is None
        else:
            assert message.tobytes() == expected.tobytes()
        assert handler.residual.tobytes() == residual.tobytes()
        sparsity = None if dense else (0.0 if expected is None else len(expected) / n)
        last = (thr, dense, sparsity)
        assert (handler.last_threshold, handler.last_was_dense, handler.last_sparsity) == last


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_handler_conserves_mass_across_format_switches(dtype) -> None:
    n = 4096
    rng = np.random.default_rng(3)
    handler = EncodingHandler(n, FixedThresholdAlgorithm(0.5), NoOpResidualPostProcessor(), dtype=dtype)
    total = np.zeros(n)
    sent = np.zeros(n, dtype=dtype)
    formats = set()
    for it, kind in enumerate(rng.choice(["dense", "sparse", "empty"], 40)):
        if kind == "dense":
            update = rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 1.0, n)
        elif kind == "sparse":
            update = np.zeros(n)
            update[rng.choice(n, 20, replace=False)] = rng.choice([-1.0, 1.0], 20)
        else:
            update = rng.normal(size=n) * 1e-4
        update = update.astype(dtype)
        total += update
        message = handler.encode(update, it, 0)
        formats.add(None if message is None else int(message[3]))
        if message is not None:
            compress.decode(message, sent)
    assert formats == {None, 0, 1}
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(
        sent.astype(np.float64) + handler.residual, total, atol=400 * eps * np.abs(total).max()
    )


def test_first_message_is_not_forced_to_bitmap() -> None:
    handler = EncodingHandler(1000, FixedThresholdAlgorithm(1.0))
    update = np.zeros(1000, dtype=np.float32)
    update[[3, 500]] = [1.5, -1.5]
    message = handler.encode(update, 0, 0)
    assert message.tolist() == [2, 1000, 1065353216, 0, 4, -501]
    assert handler.last_was_dense is False
    assert handler.last_sparsity == 6 / 1000
    assert handler.encode(np.zeros(1000, dtype=np.float32), 1, 0) is None
    assert handler.last_sparsity == 0.0


def test_default_post_processor_clips_every_fifth_iteration() -> None:
    handler = EncodingHandler(64, FixedThresholdAlgorithm(0.1))
    assert handler.threshold_algorithm == FixedThresholdAlgorithm(0.1)
    assert handler.residual_post_processor == ResidualClippingPostProcessor(5.0, 5)
    assert EncodingHandler(8).threshold_algorithm == AdaptiveThresholdAlgorithm()
    big = np.full(64, 10.0, dtype=np.float32)
    handler.encode(big, 4, 0)
    assert handler.residual.max() == pytest.approx(9.9)
    handler.encode(np.zeros(64, dtype=np.float32), 5, 0)
    assert handler.residual.max() == pytest.approx(0.5)


def test_handler_state_feeds_the_reducer() -> None:
    handlers = [EncodingHandler(100, AdaptiveThresholdAlgorithm(1e-3)) for _ in range(2)]
    for h, scale in zip(handlers, (1.0, 1e-6)):
        for it in range(3):
            h.encode(np.full(100, scale, dtype=np.float32), it, 0)
    reducer = handlers[0].threshold_algorithm.new_reducer()
    for h in handlers:
        reducer.add(h.threshold_algorithm)
    result = reducer.final_result()
    expected = np.mean([h.threshold_algorithm.last_threshold for h in handlers])
    assert result.last_threshold == pytest.approx(expected)


def test_one_handler_per_thread_gives_sequential_results() -> None:
    n, steps = 50_000, 6
    updates = _updates(11, n, steps, np.float32)

    def run() -> list:
        h = EncodingHandler(n, AdaptiveThresholdAlgorithm(1e-2))
        return [h.encode(u, it, 0) for it, u in enumerate(updates)]

    expected = run()
    results: list = [None] * 4

    def worker(k: int) -> None:
        results[k] = run()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        assert [None if m is None else m.tobytes() for m in got] == [
            None if m is None else m.tobytes() for m in expected
        ]


def test_bad_arguments_raise_and_keep_the_residual() -> None:
    with pytest.raises(ValueError, match="num_params"):
        EncodingHandler(0)
    with pytest.raises(ValueError, match="dtype"):
        EncodingHandler(4, dtype="int32")
    with pytest.raises(TypeError, match="threshold_algorithm"):
        EncodingHandler(4, threshold_algorithm=ResidualClippingPostProcessor())
    handler = EncodingHandler(4, FixedThresholdAlgorithm(1.0), dtype="float64")
    handler.encode(np.array([0.5, 0, 0, 0]), 0, 0)
    before = handler.residual.copy()
    for bad in (np.zeros(4, dtype=np.float32), np.zeros(5), np.zeros((2, 2)), [0.0] * 4):
        with pytest.raises(ValueError, match="update"):
            handler.encode(bad, 1, 0)
    with pytest.raises(ValueError, match="iteration"):
        handler.encode(np.zeros(4), -1, 0)
    np.testing.assert_array_equal(handler.residual, before)
    with pytest.raises(ValueError):
        handler.residual[0] = 1.0


def test_the_residual_before_the_first_update_is_zeros_of_the_handlers_dtype() -> None:
    # the residual is allocated where the first update lives; until then it reads as zeros
    handler = EncodingHandler(5, FixedThresholdAlgorithm(1.0), dtype="float32")
    assert handler.device is None
    before = handler.residual
    assert before.dtype == np.float32 and before.shape == (5,) and not before.any()
    assert not before.flags.writeable
    assert handler.encode(np.full(5, 0.25, np.float32), 0, 0) is None
    assert handler.device == "cpu"
    np.testing.assert_array_equal(handler.residual, np.full(5, 0.25, np.float32))


def test_update_scale_encodes_the_scaled_update() -> None:
    """A handler with update_scale s sends, and keeps in its residual, exactly what a plain handler does
    for s * update (the combination of the workers' updates, sparkgrad.compress.update_scale)."""
    rng = np.random.default_rng(3)
    scaled = EncodingHandler(
        500, FixedThresholdAlgorithm(0.05), NoOpResidualPostProcessor(), update_scale=0.5
    )
    plain = EncodingHandler(500, FixedThresholdAlgorithm(0.05), NoOpResidualPostProcessor())
    for step in range(4):
        update = rng.normal(size=500).astype(np.float32) * 0.1
        got = scaled.encode(update, step, 0)
        want = plain.encode(update * np.float32(0.5), step, 0)
        assert (got is None and want is None) or np.array_equal(got, want)
    np.testing.assert_array_equal(scaled.residual, plain.residual)
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="update_scale"):
            EncodingHandler(10, update_scale=bad)
