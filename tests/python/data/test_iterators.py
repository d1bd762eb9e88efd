"""ListDataSetIterator batching/shuffling and AsyncDataSetIterator prefetching, errors and shutdown."""

from __future__ import annotations

import gc
import threading
import time
from typing import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgrad.data import AsyncDataSetIterator, DataSet, ListDataSetIterator, MultiDataSet, rebatch


def ids_dataset(n: int, start: int = 0) -> DataSet:
    """Feature column 0 is the example id; labels repeat it so rows can be checked for consistency."""
    ids = np.arange(start, start + n, dtype=np.float64)
    return DataSet(np.stack([ids, -ids], axis=1), ids[:, None].copy())


def batch_ids(batches: list[DataSet]) -> list[int]:
    out = []
    for b in batches:
        np.testing.assert_array_equal(b.features[:, 0], b.labels[:, 0])
        out.extend(int(i) for i in b.features[:, 0])
    return out


# -- ListDataSetIterator ---------------------------------------------------------------------------


@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    batch_size=st.integers(1, 12),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_batches_are_exact_and_lose_nothing(
    sizes: list[int], batch_size: int, shuffle: bool, seed: int
) -> None:
    parts = [ids_dataset(n, start=sum(sizes[:i])) for i, n in enumerate(sizes)]
    it = ListDataSetIterator(parts, batch_size, shuffle=shuffle, seed=seed)
    total = sum(sizes)
    for _ in range(2):  # re-iterable: each pass is a full epoch
        batches = list(it)
        counts = [b.num_examples() for b in batches]
        assert len(batches) == len(it) == -(-total // batch_size)
        assert all(c == batch_size for c in counts[:-1]) and 0 < counts[-1] <= batch_size
        ids = batch_ids(batches)
        assert sorted(ids) == list(range(total))
        if not shuffle:
            assert ids == list(range(total))


def test_seeded_shuffle_is_reproducible_and_differs_per_epoch() -> None:
    data = ids_dataset(40)

    def epochs(it: ListDataSetIterator, count: int) -> list[list[int]]:
        return [batch_ids(list(it)) for _ in range(count)]

    first = epochs(ListDataSetIterator(data, 8, shuffle=True, seed=5), 3)
    assert first == epochs(ListDataSetIterator(data, 8, shuffle=True, seed=5), 3)
    assert first[0] != first[1] != first[2]
    assert first[0] != epochs(ListDataSetIterator(data, 8, shuffle=True, seed=6), 1)[0]
    it = ListDataSetIterator(data, 8, shuffle=True, seed=5)
    epochs(it, 2)
    assert it.epoch == 2
    it.reset()
    assert epochs(it, 3) == first
    unseeded = ListDataSetIterator(data, 8, shuffle=True)
    assert sorted(batch_ids(list(unseeded))) == list(range(40))


def test_iterator_handles_multidatasets_and_metadata() -> None:
    x = np.arange(10, dtype=np.float32)[:, None]
    mds = MultiDataSet([x, x * 2], [x], labels_masks=[np.ones((10, 3))])
    it = ListDataSetIterator([mds[:4], mds[4:]], batch_size=3, shuffle=True, seed=1)
    batches = list(it)
    assert all(isinstance(b, MultiDataSet) for b in batches)
    assert [b.num_examples() for b in batches] == [3, 3, 3, 1]
    merged = MultiDataSet.merge(batches)
    np.testing.assert_array_equal(merged.features[1], merged.features[0] * 2)
    assert sorted(merged.features[0][:, 0].tolist()) == list(range(10))
    assert it.batch_size == 3 and it.num_examples() == 10
    assert "batch_size=3" in repr(it)


def test_list_iterator_rejects_bad_arguments() -> None:
    ds = ids_dataset(3)
    with pytest.raises(ValueError, match="batch_size"):
        ListDataSetIterator(ds, 0)
    with pytest.raises(ValueError, match="seed"):
        ListDataSetIterator(ds, 1, shuffle=True, seed=-3)
    with pytest.raises(ValueError, match="empty list"):
        ListDataSetIterator([], 1)
    with pytest.raises(TypeError, match="data: expected a DataSet"):
        ListDataSetIterator(np.zeros((3, 1)), 1)
    with pytest.raises(TypeError, match=r"datasets\[1\]"):
        ListDataSetIterator([ds, "x"], 1)


# -- AsyncDataSetIterator --------------------------------------------------------------------------


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    before = threading.active_count()
    yield
    gc.collect()
    assert threading.active_count() == before


def _wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


@pytest.mark.usefixtures("no_thread_leak")
def test_async_yields_source_items_in_order_every_epoch() -> None:
    source = ListDataSetIterator(ids_dataset(23), 4, shuffle=True, seed=2)
    reference = ListDataSetIterator(ids_dataset(23), 4, shuffle=True, seed=2)
    with AsyncDataSetIterator(source, prefetch=3) as it:
        for _ in range(3):
            assert batch_ids(list(it)) == batch_ids(list(reference))
    assert list(AsyncDataSetIterator(range(100), prefetch=1)) == list(range(100))
    assert list(AsyncDataSetIterator([])) == []


@pytest.mark.usefixtures("no_thread_leak")
def test_async_reraises_producer_exception_where_it_occurred() -> None:
    failure = KeyError("disk gone")

    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise failure

    it = AsyncDataSetIterator(source())
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(KeyError) as info:
        next(it)
    assert info.value is failure
    assert any(frame.name == "source" for frame in __import__("traceback").extract_tb(info.tb))
    with pytest.raises(StopIteration):  # the epoch is over
        next(it)


@pytest.mark.usefixtures("no_thread_leak")
def test_async_early_stop_joins_thread_and_closes_its_generator() -> None:
    finished = threading.Event()

    class Endless:
        """Re-iterable: every iter() is a new generator, owned (and closed) by the async iterator."""

        def __iter__(self) -> Iterator[int]:
            try:
                i = 0
                while True:
                    yield i
                    i += 1
            finally:
                finished.set()

    it = AsyncDataSetIterator(Endless(), prefetch=2)
    for item in it:
        if item == 3:
            break
    it.close()
    assert finished.is_set()
    with pytest.raises(StopIteration):
        next(it)

    user_generator = iter(Endless())
    with AsyncDataSetIterator(user_generator) as it2:
        assert next(it2) == 0
    assert next(user_generator) > 0  # a generator passed in by the caller is left open

    it3 = AsyncDataSetIterator(Endless())
    next(it3)
    del it3  # collected without close(): the finalizer stops and joins the thread


@pytest.mark.usefixtures("no_thread_leak")
def test_async_prefetch_is_bounded() -> None:
    pulled = []

    def counting() -> Iterator[int]:
        for i in range(50):
            pulled.append(i)
            yield i

    with AsyncDataSetIterator(counting(), prefetch=3) as it:
        assert next(it) == 0
        # 1 consumed + 3 queued + 1 held by the producer in its blocked put: the producer reaches 5 ...
        assert _wait_for(lambda: len(pulled) >= 5)
        time.sleep(0.05)
        # ... and, having run that far, goes no further while nothing is consumed
        assert len(pulled) == 5


@pytest.mark.usefixtures("no_thread_leak")
def test_async_reset_and_new_iteration_restart_reiterable_sources() -> None:
    it = AsyncDataSetIterator([1, 2, 3])
    assert next(it) == 1
    assert list(it) == [1, 2, 3]  # iter() starts a new epoch
    assert next(it, None) is None
    it.reset()
    assert next(it) == 1
    it.close()


def test_async_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="iterator: expected an iterable"):
        AsyncDataSetIterator(5)
    with pytest.raises(ValueError, match="prefetch"):
        AsyncDataSetIterator([], prefetch=0)


# -- rebatch ---------------------------------------------------------------------------------------


@given(sizes=st.lists(st.integers(0, 9), max_size=6), batch_size=st.integers(1, 8))
def test_rebatch_emits_exact_batches_in_order(sizes: list[int], batch_size: int) -> None:
    parts = [ids_dataset(n, start=sum(sizes[:i])) for i, n in enumerate(sizes)]
    batches = list(rebatch(iter(parts), batch_size))
    total = sum(sizes)
    assert [b.num_examples() for b in batches] == [batch_size] * (total // batch_size) + (
        [total % batch_size] if total % batch_size else []
    )
    assert batch_ids(batches) == list(range(total))


def test_rebatch_is_lazy_and_checks_types() -> None:
    pulled = []

    def source() -> Iterator[DataSet]:
        for i in range(100):
            pulled.append(i)
            yield ids_dataset(3, start=3 * i)

    first = next(rebatch(source(), 4))
    assert first.num_examples() == 4 and len(pulled) == 2
    exact = ids_dataset(4)
    assert next(rebatch([exact], 4)) == exact
    x = np.zeros((2, 1))
    with pytest.raises(TypeError, match=r"datasets\[1\]: expected a DataSet, got MultiDataSet"):
        list(rebatch([DataSet(x), MultiDataSet([x], [])], 3))
    with pytest.raises(TypeError, match=r"datasets\[0\]: expected a DataSet or a MultiDataSet, got str"):
        list(rebatch(["a/path"], 3))
    with pytest.raises(ValueError, match="batch_size"):
        rebatch([], 0)
