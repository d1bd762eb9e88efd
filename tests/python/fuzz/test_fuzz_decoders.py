"""Fuzz: the threshold/bitmap decoders on random and mutated int32 messages.

The contract (sparkgrad.compress.decode): a malformed message raises ValueError and leaves the
target untouched; a message that decodes adds exactly what the pure-NumPy reference adds.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import compress as ref

from sparkgrad import compress

INT32 = np.iinfo(np.int32)
# header words worth trying: counts/lengths at and around the limits, float32 bit patterns of the
# thresholds the decoder must reject (0, negative, NaN, inf, subnormal) and of ordinary ones
SPECIAL_WORDS = [0, 1, -1, 2, 15, 16, 17, INT32.max, INT32.min, 0x7FC00000, 0x7F800000, -0x00800000, 1]
SPECIAL_WORDS += [0x3F000000, 0x00000001, 0x3A83126F]


def _run(test: Callable, fuzz_examples: int) -> None:
    settings(max_examples=fuzz_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])(test)()


@st.composite
def valid_message(draw: st.DrawFn, n: int) -> np.ndarray:
    """A well-formed sparse or bitmap message for a length-``n`` vector, from the reference encoders."""
    values = draw(st.lists(st.sampled_from([0.0, 0.3, -0.3, 0.6, -0.6, 1.2, -2.0]), min_size=n, max_size=n))
    residual = np.array(values, dtype=np.float32)
    threshold = draw(st.sampled_from([0.25, 0.5, 1.0]))
    if draw(st.booleans()):
        message, _ = ref.threshold_encode(residual, threshold)
    else:
        message, _, _ = ref.bitmap_encode(residual, threshold)
    return message


@st.composite
def mutated(draw: st.DrawFn, message: np.ndarray) -> np.ndarray:
    words = list(message.astype(np.int64))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["set", "flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(words) - 1, 0)))
        word = draw(st.sampled_from(SPECIAL_WORDS) | st.integers(INT32.min, INT32.max))
        if op == "set" and words:
            words[at] = word
        elif op == "flip" and words:
            words[at] = int(
                np.int32(
                    np.uint32(np.int64(words[at]) & 0xFFFFFFFF) ^ np.uint32(1 << draw(st.integers(0, 31)))
                )
            )
        elif op == "insert":
            words.insert(at, word)
        elif op == "delete" and words:
            del words[at]
        elif op == "truncate":
            del words[at:]
    return np.array(words, dtype=np.int64).astype(np.int32)


@st.composite
def case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 40))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    target = np.array(draw(st.lists(st.floats(-4, 4, width=32), min_size=n, max_size=n)), dtype=dtype)
    if draw(st.integers(0, 4)) == 0:  # random words, sometimes with a plausible header
        words = draw(st.lists(st.integers(INT32.min, INT32.max), max_size=12))
        message = np.array(words, dtype=np.int64).astype(np.int32)
    else:
        message = draw(mutated(draw(valid_message(n))))
    return message, target


def test_decoders_reject_or_match_the_reference(fuzz_examples: int) -> None:
    @given(c=case())
    def inner(c: tuple[np.ndarray, np.ndarray]) -> None:
        message, target = c
        decoders = [compress.decode]
        if len(message) > 3:
            decoders.append(compress.bitmap_decode if message[3] == 1 else compress.threshold_decode)
        for decode in decoders:
            before = target.copy()
            try:
                decode(message, target)
            except ValueError:
                assert target.tobytes() == before.tobytes(), "a rejected message modified the target"
                continue
            expected = ref.decode(message, before)
            assert target.dtype == expected.dtype
            assert target.tobytes() == expected.tobytes(), f"decoded {message.tolist()} differently"
            target[...] = before

    _run(inner, fuzz_examples)
