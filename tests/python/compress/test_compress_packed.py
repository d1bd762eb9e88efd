"""The packed wire form of sparse messages (compress.pack_message / unpack_message) against the NumPy
reference, and every way a hostile packed payload can be wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import compress as ref

from sparkgrad import compress


def _message(indices: np.ndarray, negative: np.ndarray, n: int, threshold: float = 0.5) -> np.ndarray:
    bits = np.frombuffer(np.float32(threshold).tobytes(), dtype=np.int32)[0]
    entries = np.where(negative, -(indices + 1), indices + 1)
    return np.array([len(entries), n, bits, 0, *entries], dtype=np.int32)


@st.composite
def sparse_messages(draw: st.DrawFn) -> np.ndarray:
    """Sparse messages with strictly ascending entries: from threshold_encode at a random density, or with
    gaps up to the int32 limit (every varint length, 1 to 5 bytes)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        n = draw(st.integers(0, 50_000))
        density = draw(st.sampled_from([0.0, 1e-3, 1e-2, 0.05, 0.5, 1.0]))
        residual = np.where(rng.random(n) < density, rng.choice([-2.0, 2.0], n), 0.1).astype(np.float32)
        return compress.threshold_encode(residual, 1.0)
    n = draw(st.integers(1, 2**31 - 1))
    count = draw(st.integers(0, min(n, 64)))
    indices = (
        np.sort(rng.choice(n, count, replace=False)) if n <= 10**6 else np.unique(rng.integers(0, n, count))
    )
    return _message(indices.astype(np.int64), rng.random(indices.size) < 0.5, n)


@given(sparse_messages())
def test_pack_matches_the_reference_and_unpacks_to_the_message(message: np.ndarray) -> None:
    packed = compress.pack_message(message)
    assert packed == ref.pack_message(message)
    if packed is None:  # the reference agrees: not a byte saved (no entries, or 5-byte gaps)
        return
    assert len(packed) < message.nbytes
    np.testing.assert_array_equal(compress.unpack_message(packed), message)
    np.testing.assert_array_equal(ref.unpack_message(packed), message)


def test_a_packed_entry_takes_one_or_two_bytes_at_gradient_sharing_densities() -> None:
    rng = np.random.default_rng(3)
    for density, at_most in ((1e-3, 2.2), (1e-2, 1.6), (0.05, 1.2)):
        residual = np.where(rng.random(1_000_000) < density, rng.choice([-2.0, 2.0], 1_000_000), 0.0)
        message = compress.threshold_encode(residual.astype(np.float32), 1.0)
        entries = message.size - 4
        packed = compress.pack_message(message)
        assert packed is not None and (len(packed) - 16) / entries <= at_most


@pytest.mark.parametrize(
    "message",
    [
        np.array([3, 16, 0x3F000000, 1, 7, 8, 9, 10, 11], np.int32),  # a bitmap header
        _message(np.array([5, 3]), np.array([False, True]), 16),  # descending
        _message(np.array([5, 5]), np.array([False, False]), 16),  # a repeated index
        _message(np.array([16]), np.array([False]), 16),  # beyond the length
        np.array([1, 16, 0x3F000000, 0, 0], np.int32),  # entry 0 addresses nothing
        np.array([2, 16, 0x3F000000, 0, 1], np.int32),  # word 0 says 2 entries, it has 1
        _message(np.array([2**30]), np.array([False]), 2**31 - 1),  # a 5-byte gap: 22 bytes > 20
    ],
)
def test_what_does_not_pack_travels_as_it_is(message: np.ndarray) -> None:
    assert compress.pack_message(message) is None


def _packed(count: int, n: int, body: bytes, flag: int = 0) -> bytes:
    return np.array([count, n, 0x3F000000, flag], "<i4").tobytes() + body


@pytest.mark.parametrize(
    ("packed", "error"),
    [
        (b"\x01\x00", "must hold the 16 header bytes, got 2"),
        (_packed(1, 16, b"\x00\x01", flag=1), r"flag \(word 3\) must be 0 \(sparse\), got 1"),
        (_packed(-1, 16, b""), "declares -1 entries of 16 elements"),
        (_packed(2, -5, b"\x00\x01\x01"), "declares 2 entries of -5 elements"),
        (_packed(2**31 - 1, 2**31 - 1, b"\x00\x01"), "declares 2147483647 entries but has only 18 bytes"),
        (_packed(3, 16, b"\x00\x01\x01"), "declares 3 entries but has only 19 bytes"),
        (_packed(2, 16, b"\x04\x01\x01"), "sets sign bits beyond its 2 entries"),
        (_packed(2, 16, b"\x00\x01\x81"), "ends inside entry 1 of 2"),
        (_packed(1, 2**31 - 1, b"\x00" + b"\xff" * 5 + b"\x01"), "entry 0 has a varint over 5 bytes"),
        (_packed(1, 16, b"\x00\x81\x00"), "entry 0 has an overlong varint"),
        (_packed(2, 16, b"\x00\x0f\x00"), "entry 1 addresses element 16 of a vector of 16"),
        (_packed(1, 2**31 - 1, b"\x00\xff\xff\xff\xff\x0f"), "addresses element 4294967295"),
        (_packed(1, 16, b"\x00\x01\x00"), "has 1 bytes after its 1 entries"),
    ],
)
def test_a_hostile_packed_message_is_refused_naming_what_is_wrong(packed: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        compress.unpack_message(packed)


@given(st.binary(min_size=16, max_size=80), st.integers(0, 12), st.integers(0, 200))
def test_any_bytes_unpack_to_a_valid_message_that_packs_back_the_same_or_are_refused(
    body: bytes, count: int, n: int
) -> None:
    packed = _packed(count, n, body[16:]) if body[0] % 2 else body
    try:
        message = compress.unpack_message(memoryview(packed))
    except ValueError:
        return
    target = np.zeros(max(int(message[1]), 0), np.float32)
    if np.isfinite(compress.message_threshold(message)) and compress.message_threshold(message) > 0:
        compress.threshold_decode(message, target)  # every entry addresses an element
    assert compress.pack_message(message) in (packed, None)  # the packed form is canonical
