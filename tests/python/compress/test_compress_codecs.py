"""Native codecs against the NumPy reference: sparse/bitmap encode and decode, thread-count invariance,
conservation of residual mass, and DL4J's worked examples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import compress as ref

import sparkgrad
from sparkgrad import compress

THREADS = (1, 2, 4)


@st.composite
def residuals(draw: st.DrawFn) -> tuple[np.ndarray, float]:
    """A residual (float32/float64, 0..100k elements) and a threshold, with a random density of elements
    over the threshold plus exact +-t, +-t/2 and zero values."""
    n = draw(st.one_of(st.integers(0, 40), st.integers(0, 100_000)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    threshold = draw(st.floats(1e-4, 10.0))
    density = draw(st.sampled_from([0.0, 1e-4, 1e-2, 0.1, 0.5, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t = float(ref.wire_threshold(threshold, dtype))
    r = rng.uniform(-t, t, n) * 0.999
    big = rng.random(n) < density
    r[big] = rng.choice([-1.0, 1.0], int(big.sum())) * t * rng.uniform(1.0, 4.0, int(big.sum()))
    special = rng.random(n) < 0.02
    r[special] = rng.choice([t, -t, t / 2, -t / 2, 0.0], int(special.sum()))
    return r.astype(dtype), threshold


def _per_thread_count(fn, residual: np.ndarray):
    """fn(copy of residual) under each OpenMP thread count: [(result, residual after)]."""
    before = sparkgrad.get_num_threads()
    results = []
    try:
        for threads in THREADS:
            sparkgrad.set_num_threads(threads)
            r = residual.copy()
            results.append((fn(r), r))
    finally:
        sparkgrad.set_num_threads(before)
    return results


@given(data=residuals(), boundary=st.one_of(st.none(), st.integers(0, 5000)))
def test_threshold_encode_matches_reference(data, boundary) -> None:
    residual, threshold = data
    expected, expected_residual = ref.threshold_encode(residual, threshold, boundary)
    for message, after in _per_thread_count(
        lambda r: compress.threshold_encode(r, threshold, boundary), residual
    ):
        assert message.dtype == np.int32
        assert message.tobytes() == expected.tobytes()
        assert after.tobytes() == expected_residual.tobytes()


@given(data=residuals())
def test_bitmap_encode_matches_reference(data) -> None:
    residual, threshold = data
    expected, expected_count, expected_residual = ref.bitmap_encode(residual, threshold)
    for (message, count), after in _per_thread_count(
        lambda r: compress.bitmap_encode(r, threshold), residual
    ):
        assert message.tobytes() == expected.tobytes()
        assert count == expected_count
        assert after.tobytes() == expected_residual.tobytes()


@given(data=residuals(), bitmap=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_decode_matches_reference(data, bitmap, seed) -> None:
    residual, threshold = data
    message = (
        ref.bitmap_encode(residual, threshold)[0] if bitmap else ref.threshold_encode(residual, threshold)[0]
    )
    target = np.random.default_rng(seed).normal(size=len(residual)).astype(residual.dtype)
    expected = ref.decode(message, target)
    specific = compress.bitmap_decode if bitmap else compress.threshold_decode
    for fn in (compress.decode, specific):
        for out, _ in _per_thread_count(lambda z, fn=fn: (fn(message, z), z)[1], target):
            np.testing.assert_array_equal(out, expected)


@given(data=residuals(), bitmap=st.booleans())
def test_residual_plus_decoded_message_equals_residual_before(data, bitmap) -> None:
    before, threshold = data
    after = before.copy()
    message = (
        compress.bitmap_encode(after, threshold)[0] if bitmap else compress.threshold_encode(after, threshold)
    )
    restored = after.copy()
    compress.decode(message, restored)
    eps = np.finfo(before.dtype).eps
    t = float(ref.wire_threshold(threshold, before.dtype))
    np.testing.assert_allclose(restored, before, rtol=2 * eps, atol=2 * eps * t)


def test_dl4j_bitmap_encoding3_example() -> None:
    # testBitmapEncoding3 in DL4J's CompressionTests: exact words, count, residual and decoded values.
    residual = np.array([0, -6e-4, 1e-3, -1e-3, 0, 0], dtype=np.float32)
    message, count = compress.bitmap_encode(residual, 1e-3)
    assert message.tolist() == [6, 6, 981668463, 1, 655372]
    assert count == 3
    np.testing.assert_allclose(residual, [0, -1e-4, 0, 0, 0, 0], atol=1e-9)
    decoded = np.zeros(6, dtype=np.float32)
    compress.decode(message, decoded)
    np.testing.assert_allclose(decoded, [0, -5e-4, 1e-3, -1e-3, 0, 0], atol=1e-9)


def test_bitmap_half_code_is_negative_only() -> None:
    residual = np.array([0.6, -0.6, 0.4, -0.4], dtype=np.float64)
    message, count = compress.bitmap_encode(residual, 1.0)
    # only -0.6 gets the -t/2 code: bit 16+1 alone; positive 0.6 has no +t/2 code.
    assert message[4] == 1 << 17
    assert count == 1
    np.testing.assert_allclose(residual, [0.6, -0.1, 0.4, -0.4])


def test_sparse_format_header_and_single_entry() -> None:
    residual = np.array([0.0, 3.5, 0.1, -0.2], dtype=np.float32)
    message = compress.threshold_encode(residual, 0.5)
    # One element qualifies: sparkgrad encodes it (DL4J would drop a 1-entry message); it emits once.
    assert message.tolist() == [1, 4, 1056964608, 0, 2]
    np.testing.assert_allclose(residual, [0.0, 3.0, 0.1, -0.2])
    assert compress.message_threshold(message) == 0.5
    assert compress.message_length(message) == 4


@given(st.lists(st.sampled_from([-2.0, -0.1, 0.0, 0.3, 1.5]), min_size=1, max_size=64))
def test_message_indices_are_what_a_sparse_message_changes_and_none_for_a_bitmap(values) -> None:
    residual = np.array(values, dtype=np.float32)
    sparse = compress.threshold_encode(residual.copy(), 1.0)
    decoded = np.zeros_like(residual)
    compress.decode(sparse, decoded)
    np.testing.assert_array_equal(compress.message_indices(sparse), np.flatnonzero(decoded))
    bitmap, _ = compress.bitmap_encode(residual.copy(), 1.0)
    assert compress.message_indices(bitmap) is None


def test_nothing_qualifies_gives_header_only_and_keeps_residual() -> None:
    residual = np.full(10, 1e-5, dtype=np.float32)
    message = compress.threshold_encode(residual, 1e-3)
    assert message.tolist() == [0, 10, 981668463, 0]
    assert np.all(residual == np.float32(1e-5))


def test_boundary_keeps_lowest_indices() -> None:
    residual = np.array([0, -2, 0, 3, 2, -5], dtype=np.float64)
    message = compress.threshold_encode(residual, 1.0, boundary=2)
    assert message.tolist()[4:] == [-2, 4]
    np.testing.assert_array_equal(residual, [0, -1, 0, 2, 2, -5])


def test_decode_accumulates() -> None:
    # testThresholdCompression6: decoding a 1e-3 message twice adds 2e-3.
    message = compress.threshold_encode(np.array([1e-3, 0, 0], dtype=np.float32), 1e-3)
    target = np.zeros(3, dtype=np.float32)
    compress.threshold_decode(message, target)
    compress.threshold_decode(message, target)
    np.testing.assert_allclose(target, [2e-3, 0, 0], rtol=1e-6)


def test_large_vector_is_ascending_across_chunks() -> None:
    rng = np.random.default_rng(7)
    residual = rng.normal(size=300_000).astype(np.float32)
    messages = _per_thread_count(lambda r: compress.threshold_encode(r, 2.5), residual)
    first = messages[0][0]
    assert np.all(np.diff(np.abs(first[4:])) > 0)
    assert all(m.tobytes() == first.tobytes() for m, _ in messages)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threshold", [0.5, 1e-40])
@pytest.mark.parametrize("n", [15, 16, 37, 70_000])
def test_encoders_match_reference_on_nonfinite_and_subnormal_values(dtype, threshold, n) -> None:
    # The SIMD lanes compare bit patterns: NaN never qualifies, +-inf always does, subnormals compare exactly.
    t = float(ref.wire_threshold(threshold, dtype))
    values = np.array([np.nan, np.inf, -np.inf, 1e-41, -1e-41, 1e-39, -1e-39, t, -t, -t / 2, 0.0, -0.0, 3.0])
    residual = np.random.default_rng(n).choice(values, n).astype(dtype)
    expected, expected_residual = ref.threshold_encode(residual, threshold)
    for message, after in _per_thread_count(lambda r: compress.threshold_encode(r, threshold), residual):
        assert message.tobytes() == expected.tobytes()
        assert after.tobytes() == expected_residual.tobytes()
    expected, expected_count, expected_residual = ref.bitmap_encode(residual, threshold)
    for (message, count), after in _per_thread_count(
        lambda r: compress.bitmap_encode(r, threshold), residual
    ):
        assert message.tobytes() == expected.tobytes()
        assert count == expected_count
        assert after.tobytes() == expected_residual.tobytes()
