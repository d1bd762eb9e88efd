"""A residual's magnitude bounds per block and per group of blocks (``_core.residual_bounds``), the count
that reads only the groups and blocks reaching the threshold (``_core.encode_smaller(..., bounds)``) and
the clip that reads only those reaching its limit (``_core.clip(..., bounds)``): the same messages and
residuals as the whole-vector passes, bounds that still hold afterwards, and the handler keeping them only
while they do."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgrad import _core
from sparkgrad.compress import (
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    ResidualClippingPostProcessor,
    ResidualPostProcessor,
)
from sparkgrad.spark.threads import native_threads

BLOCK = _core.BOUND_BLOCK
GROUP = _core.BOUND_GROUP


def _group_max(blocks: np.ndarray) -> np.ndarray:
    """The largest of each GROUP consecutive values of ``blocks`` (the last group may be short)."""
    padded = np.full(-(-blocks.size // GROUP) * GROUP, -np.inf, blocks.dtype)
    padded[: blocks.size] = blocks
    return padded.reshape(-1, GROUP).max(axis=1)


def _bounds_reference(x: np.ndarray) -> np.ndarray:
    """max |x| of each block of BLOCK elements, NaN left out (0 for a block of NaN only), then the largest
    of each group of GROUP blocks: the layout of ``_core.bounds_length(x.size)`` elements."""
    magnitudes = np.abs(x)
    magnitudes[np.isnan(magnitudes)] = 0
    padded = np.zeros(-(-x.size // BLOCK) * BLOCK, x.dtype)
    padded[: x.size] = magnitudes
    blocks = padded.reshape(-1, BLOCK).max(axis=1)
    return np.concatenate([blocks, _group_max(blocks)])


def _loose(exact: np.ndarray, rng: np.random.Generator, slack: float) -> np.ndarray:
    """Bounds that hold: each block's and each group's exact bound plus its own random slack (so a group's
    bound may be below a loose bound of one of its blocks: it must still hold its elements)."""
    return (exact + rng.random(exact.size) * slack).astype(exact.dtype)


def _blocks_read(loose: np.ndarray, n: int, t) -> np.ndarray:
    """The blocks a bounded pass at threshold ``t`` reads: its bound and its group's reach ``t``."""
    blocks = -(-n // BLOCK)
    group_reached = loose[blocks:] >= t
    return (loose[:blocks] >= t) & group_reached[np.arange(blocks) // GROUP]


def test_bounds_length() -> None:
    for n in (0, 1, BLOCK, BLOCK + 1, BLOCK * GROUP, BLOCK * GROUP + 1, 17_003_236):
        blocks = -(-n // BLOCK)
        assert _core.bounds_length(n) == blocks + -(-blocks // GROUP)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        _core.bounds_length(-1)


def _residual(rng: np.random.Generator, n: int, dtype: str, specials: bool) -> np.ndarray:
    """Mostly small values, some blocks with values around the thresholds used, optionally NaN, +-inf
    and -0.0 in random places."""
    x = rng.normal(0, 0.05, n).astype(dtype)
    hot = rng.random(-(-n // BLOCK)) < 0.2  # a fifth of the blocks hold values that reach 0.5
    for b in np.flatnonzero(hot):
        x[b * BLOCK : (b + 1) * BLOCK] *= 20
    if specials:
        picks = rng.integers(0, n, 4)
        x[picks] = np.array([np.nan, np.inf, -np.inf, -0.0], dtype)
    return x


@given(
    n=st.integers(1, 3000),
    dtype=st.sampled_from(["float32", "float64"]),
    threshold=st.sampled_from([0.05, 0.5, 2.0, 50.0]),
    specials=st.booleans(),
    slack=st.sampled_from([0.0, 0.3, 10.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_bounded_count_encodes_as_the_whole_vector(n, dtype, threshold, specials, slack, seed) -> None:
    """With bounds that hold (exact or loose), the message, the format and the residual are bit-identical
    to the whole-vector encode's; afterwards the bounds still hold: exact for every block the count read
    (an element was encoded from it, or none reached the threshold), untouched elsewhere, each group read
    the largest of its blocks' bounds, and all exact after a bitmap."""
    rng = np.random.default_rng(seed)
    x = _residual(rng, n, dtype, specials)
    whole = x.copy()
    loose = _loose(_bounds_reference(x), rng, slack)  # upper bounds, some well above
    bounds = loose.copy()
    message, bitmap = _core.encode_smaller(x, threshold, bounds)
    expected, expected_bitmap = _core.encode_smaller(whole, threshold)
    assert bitmap == expected_bitmap
    assert message.tobytes() == expected.tobytes()
    assert x.tobytes() == whole.tobytes()
    after = _bounds_reference(x)
    if bitmap:  # encoded whole: every bound recomputed
        assert np.array_equal(bounds, after)
        return
    t = x.dtype.type(np.float32(threshold))
    blocks = -(-n // BLOCK)
    read = _blocks_read(loose, n, t)  # each block the count read is exact now
    assert np.array_equal(bounds[:blocks][read], after[:blocks][read])
    assert np.array_equal(bounds[:blocks][~read], loose[:blocks][~read])  # the others were not touched
    groups_read = loose[blocks:] >= t
    assert np.array_equal(bounds[blocks:][groups_read], _group_max(bounds[:blocks])[groups_read])
    assert np.array_equal(bounds[blocks:][~groups_read], loose[blocks:][~groups_read])
    assert np.all(bounds >= after)


@given(
    n=st.integers(1, 3000),
    dtype=st.sampled_from(["float32", "float64"]),
    limit=st.sampled_from([0.0, 0.05, 0.5, 2.0, 50.0]),
    specials=st.booleans(),
    slack=st.sampled_from([0.0, 0.3, 10.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_bounded_clip_clips_as_the_whole_vector(n, dtype, limit, specials, slack, seed) -> None:
    """With bounds that hold (exact or loose), the clipped residual is bit-identical to the whole-vector
    clip's (NaN stays NaN, +-inf becomes +-limit); the bounds of the blocks it read become the limit, the
    others are untouched, and all still hold."""
    rng = np.random.default_rng(seed)
    x = _residual(rng, n, dtype, specials)
    whole = x.copy()
    loose = _loose(_bounds_reference(x), rng, slack)
    bounds = loose.copy()
    _core.clip(x, limit, bounds)
    _core.clip(whole, limit)
    assert x.tobytes() == whole.tobytes()
    blocks = -(-n // BLOCK)
    read = _blocks_read(loose, n, x.dtype.type(limit))
    assert np.all(bounds[:blocks][read] == x.dtype.type(limit))
    assert np.array_equal(bounds[:blocks][~read], loose[:blocks][~read])
    assert np.all(bounds >= _bounds_reference(x))


@pytest.mark.parametrize("op", ["count", "clip"])
def test_bounded_passes_over_many_chunks_and_threads(op) -> None:
    """Across the parallel units (the count's 32768-element chunks, the clip's 2048 blocks) and with one or
    two threads: the whole-vector pass's messages and residual, step after step, as the bounds are
    refreshed at each step's support."""
    n = 200_003
    rng = np.random.default_rng(7)
    for threads in (1, 2):
        with native_threads(threads):
            x = np.zeros(n, np.float32)
            whole = x.copy()
            bounds = np.zeros(_core.bounds_length(n), np.float32)
            for _ in range(12):
                support = np.unique(rng.integers(0, n, 3000)).astype(np.int64)
                step = rng.normal(0, 0.3, support.size).astype(np.float32)
                x[support] += step
                whole[support] += step
                _core.residual_bounds(x, bounds, support)
                if op == "count":
                    message, _ = _core.encode_smaller(x, 0.4, bounds)
                    expected, _ = _core.encode_smaller(whole, 0.4)
                    assert message.tobytes() == expected.tobytes()
                else:
                    _core.clip(x, 0.4, bounds)
                    _core.clip(whole, 0.4)
                assert x.tobytes() == whole.tobytes()
                assert np.all(bounds >= _bounds_reference(x))
            if op == "clip":
                assert np.count_nonzero(np.abs(x) == np.float32(0.4)) > 100  # it clipped


@pytest.mark.parametrize("op", ["count", "clip"])
def test_groups_below_the_threshold_keep_their_blocks_unread(op) -> None:
    """A group whose bound is below the threshold (or the clip's limit) keeps its blocks unread however
    loose their own bounds: the passes read a block's bound only in a group reaching it."""
    n = 40 * BLOCK * GROUP + 5
    x = np.random.default_rng(11).normal(0, 0.05, n).astype(np.float32)
    hot = [3, 17, 18, 38]  # the groups holding an element that reaches 1.0
    for g in hot:
        x[g * BLOCK * GROUP + 7] = 2.0
    whole = x.copy()
    bounds = _bounds_reference(x)
    blocks = -(-n // BLOCK)
    bounds[:blocks] = 5.0  # every block's bound loose, above the threshold; the groups' exact
    if op == "count":
        message, _ = _core.encode_smaller(x, 1.0, bounds)
        expected, _ = _core.encode_smaller(whole, 1.0)
        assert message.tobytes() == expected.tobytes()
        assert message[0] == len(hot)
    else:
        _core.clip(x, 1.0, bounds)
        _core.clip(whole, 1.0)
    assert x.tobytes() == whole.tobytes()
    group_of_block = np.arange(blocks) // GROUP
    in_hot = np.isin(group_of_block, hot)
    assert np.all(bounds[:blocks][~in_hot] == 5.0)  # never read
    assert np.all(bounds[:blocks][in_hot] <= 1.0)  # read: exact, or clipped to the limit
    assert np.all(bounds >= _bounds_reference(x))


def test_a_bitmap_recomputes_every_bound() -> None:
    x = np.full(1000, 3.0, np.float32)
    bounds = np.full(_core.bounds_length(1000), 7.0, np.float32)  # loose everywhere
    message, bitmap = _core.encode_smaller(x, 1.0, bounds)
    assert bitmap
    assert np.array_equal(bounds, _bounds_reference(x))
    assert np.array_equal(bounds, np.full(bounds.size, 2.0, np.float32))


@given(
    n=st.integers(1, 3000),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_residual_bounds_match_numpy(n, dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    x = _residual(rng, n, dtype, specials=True)
    bounds = np.full(_core.bounds_length(n), -1.0, dtype)
    _core.residual_bounds(x, bounds)
    assert np.array_equal(bounds, _bounds_reference(x))
    at = rng.integers(0, n, rng.integers(0, 50)).astype(np.int64)
    some = np.full(bounds.size, -1.0, dtype)
    _core.residual_bounds(x, some, at)
    blocks = -(-n // BLOCK)
    touched = np.zeros(blocks, bool)
    touched[at // BLOCK] = True
    assert np.array_equal(some[:blocks][touched], bounds[:blocks][touched])
    assert np.all(some[:blocks][~touched] == -1.0)  # only the blocks holding the indices
    # their groups raised to hold them (from -1: the largest touched block of each), the others untouched
    raised = _group_max(np.where(touched, bounds[:blocks], -1.0).astype(dtype))
    assert np.array_equal(some[blocks:], raised)


@given(
    n=st.integers(1, 3000),
    dtype=st.sampled_from(["float32", "float64"]),
    scale=st.sampled_from([1.0, 0.5, 1 / 3]),
    seed=st.integers(0, 2**32 - 1),
)
def test_accumulate_at_matches_numpy(n, dtype, scale, seed) -> None:
    """residual[at] += scale * update[at] (the product rounded to the dtype first), a repeated index
    added once as NumPy does; the whole-vector form the same at every index."""
    rng = np.random.default_rng(seed)
    residual, update = _residual(rng, n, dtype, specials=True), _residual(rng, n, dtype, specials=False)
    at = rng.integers(0, n, rng.integers(0, 2 * n)).astype(np.int64)  # repeats when long
    want = residual.copy()
    want[at] += update[at] * np.dtype(dtype).type(scale)
    got = residual.copy()
    _core.accumulate(got, update, scale, at=at)
    assert got.tobytes() == want.tobytes()
    whole = residual.copy()
    _core.accumulate(whole, update, scale)
    assert whole.tobytes() == (residual + update * np.dtype(dtype).type(scale)).tobytes()


def test_bad_bounds_are_named() -> None:
    n = 2 * BLOCK + 2  # 3 blocks, 1 group
    x = np.zeros(n, np.float32)
    expected = (
        rf"bounds must have 4 elements \(bounds_length: one per {BLOCK} of the residual's {n} and one per "
        rf"{BLOCK * GROUP}\), got 2"
    )
    with pytest.raises(ValueError, match=expected):
        _core.encode_smaller(x, 0.5, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="bounds must have dtype float32"):
        _core.residual_bounds(x, np.zeros(3, np.float64))
    with pytest.raises(ValueError, match=expected):
        _core.clip(x, 0.5, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=rf"at indices must be in \[0, {n}\), got {n}"):
        _core.residual_bounds(x, np.zeros(4, np.float32), np.array([0, n], np.int64))
    untouched = x.copy()
    with pytest.raises(ValueError, match=r"\[accumulate\] at indices must be in \[0, \d+\), got -1"):
        _core.accumulate(x, np.ones(n, np.float32), at=np.array([0, -1], np.int64))
    assert x.tobytes() == untouched.tobytes()  # checked before anything is written
    with pytest.raises(ValueError, match="scale must be finite, got nan"):
        _core.accumulate(x, np.ones(n, np.float32), float("nan"))
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="bounds must be writable"):
        _core.encode_smaller(x, 0.5, frozen)


class _Doubling(ResidualPostProcessor):
    """Grows the residual: after it, bounds taken before would skip elements that now qualify."""

    def process_residual(self, iteration, epoch, last_threshold, residual) -> None:
        residual *= 2

    def clone(self) -> _Doubling:
        return _Doubling()


@pytest.mark.parametrize(
    "post",
    [
        NoOpResidualPostProcessor(),
        ResidualClippingPostProcessor(1.5, 2),
        ResidualClippingPostProcessor(1.0, 1),
        _Doubling(),
    ],
    ids=["noop", "clipping", "clipping-every-step", "growing"],
)
@pytest.mark.parametrize("scale", [1.0, 1 / 3])
def test_handler_with_support_steps_matches_whole_vector_steps(post, scale) -> None:
    """A handler fed a row-sparse step's support (bounds refreshed there, the count reading only the
    blocks reaching the threshold) sends what a handler fed the whole vectors sends, over steps that
    switch between sparse and dense adds and a post-processor that clips the residual or grows it."""
    n = 40_000
    rng = np.random.default_rng(3)
    handlers = [
        EncodingHandler(n, FixedThresholdAlgorithm(0.05), post, dtype="float32", update_scale=scale)
        for _ in range(2)
    ]
    limit = np.float32(0.05 * getattr(post, "threshold_multiple_clip_value", np.inf))
    clipped = 0
    for step in range(16):
        dense = step in (5, 6, 11)
        update = np.zeros(n, np.float32)
        support = np.arange(n) if dense else np.unique(rng.integers(0, n, 400))
        update[support] = rng.normal(0, 0.06 / scale, support.size)  # the same residuals at any scale
        whole = handlers[0].encode(update, step, 0)
        part = handlers[1].encode(update, step, 0, support=None if dense else support)
        assert (whole is None) == (part is None)
        if whole is not None:
            assert whole.tobytes() == part.tobytes()
        assert handlers[0].residual.tobytes() == handlers[1].residual.tobytes()
        clipped += np.count_nonzero(np.abs(handlers[1].residual) == limit)
    if type(post) is ResidualClippingPostProcessor:  # the clip ran where the bounds led it
        assert clipped > 10
