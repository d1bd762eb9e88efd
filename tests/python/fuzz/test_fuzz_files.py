"""Fuzz: damaged DataSet / MultiDataSet records and model zips never load wrong.

Every damaged input either raises CorruptDataError or loads content bit-identical to what was saved
(same classes, dtypes, shapes and bytes); no other exception type escapes.
"""

from __future__ import annotations

import io
import struct
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import given as hgiven
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn import (
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int64, np.uint16, np.bool_]
_CODES = {
    np.dtype(t): c
    for c, t in enumerate(
        [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64]
        + [np.uint8, np.uint16, np.uint32, np.uint64, np.bool_],
        start=1,
    )
}


def _run(test: Callable, fuzz_examples: int) -> None:
    settings(
        max_examples=fuzz_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )(test)()


# -- strategies -----------------------------------------------------------------------------------


def _array(n: int) -> st.SearchStrategy[np.ndarray]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3).map(lambda s: (n, *s))
    return st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, shapes))


@st.composite
def records(draw: st.DrawFn) -> DataSet | MultiDataSet:
    n = draw(st.integers(0, 4))
    optional = st.none() | _array(n)
    if draw(st.booleans()):
        labels = draw(optional)
        return DataSet(draw(_array(n)), labels, draw(optional), None if labels is None else draw(optional))
    features = draw(st.lists(_array(n), min_size=1, max_size=2))
    labels = draw(st.lists(_array(n), max_size=2))

    def masks(count: int) -> st.SearchStrategy:
        return st.none() | st.lists(optional, min_size=count, max_size=count)

    return MultiDataSet(features, labels, draw(masks(len(features))), draw(masks(len(labels))))


@st.composite
def damaged(draw: st.DrawFn, blob: bytes) -> bytes:
    """One to three edits: bit flips, byte overwrites, truncation, insertion, deletion, appending."""
    data = bytearray(blob)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "append"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=9))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 9))]
        else:
            data += draw(st.binary(min_size=1, max_size=9))
    return bytes(data)


def identical(a: DataSet | MultiDataSet, b: DataSet | MultiDataSet) -> bool:
    """Same class, same slots present, same dtypes, shapes and bytes (NaN payloads included)."""
    if type(a) is not type(b) or [len(g) for g in a._groups] != [len(g) for g in b._groups]:
        return False
    for x, y in zip((v for g in a._groups for v in g), (v for g in b._groups for v in g)):
        if (x is None) != (y is None):
            return False
        if x is not None and (x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes()):
            return False
    return True


class _Pipe(io.RawIOBase):
    """Unseekable and short reads: exercises the reader's unknown-length path."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def readable(self) -> bool:
        return True

    def readinto(self, target: memoryview) -> int:  # type: ignore[override]
        n = min(len(target), 7, len(self._data))
        target[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def _read(kind: type, blob: bytes, how: str) -> DataSet | MultiDataSet:
    if how == "bytes":
        return kind.from_bytes(blob)
    if how == "file":
        return kind.load(io.BytesIO(blob))
    return kind.load(_Pipe(blob))


# -- DataSet / MultiDataSet records ---------------------------------------------------------------


def test_damaged_records_raise_or_load_identically(fuzz_examples: int) -> None:
    @hgiven(data=st.data(), record=records(), how=st.sampled_from(["bytes", "file", "pipe"]))
    def inner(data: st.DataObject, record: DataSet | MultiDataSet, how: str) -> None:
        blob = record.to_bytes()
        assert identical(_read(type(record), blob, how), record)
        bad = data.draw(damaged(blob))
        try:
            loaded = _read(type(record), bad, how)
        except CorruptDataError:
            return
        assert identical(loaded, record), f"damaged input loaded different content: {loaded!r}"

    _run(inner, fuzz_examples)


def version_1_bytes(record: DataSet | MultiDataSet) -> bytes:
    """The version-1 layout, written from the format table independently of the library's writer."""
    kind = 1 if isinstance(record, DataSet) else 2
    groups = record._groups
    out = [b"\x89SGD\r\n\x1a\n" + struct.pack("<HBB4I", 1, kind, 0, *(len(g) for g in groups))]
    for array in (a for g in groups for a in g):
        if array is None:
            out.append(b"\x00")
            continue
        out.append(struct.pack("<BBBB", 1, _CODES[array.dtype], array.ndim, 0))
        out.append(struct.pack(f"<{array.ndim}Q", *array.shape))
        out.append(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    return b"".join(out)


def test_version_1_records_load_and_damaged_ones_fail_cleanly(fuzz_examples: int) -> None:
    # version 1 has no checksum: a flipped element bit loads a wrong value, which is why version 2
    # exists; the reader still never crashes, over-allocates or raises anything but CorruptDataError
    @hgiven(data=st.data(), record=records(), how=st.sampled_from(["bytes", "file", "pipe"]))
    def inner(data: st.DataObject, record: DataSet | MultiDataSet, how: str) -> None:
        blob = version_1_bytes(record)
        assert identical(_read(type(record), blob, how), record)
        bad = data.draw(damaged(blob))
        try:
            _read(type(record), bad, how)
        except CorruptDataError:
            pass

    _run(inner, max(fuzz_examples // 2, 1))


# -- model zips -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> tuple[MultiLayerNetwork, bytes]:
    conf = MultiLayerConfiguration(
        [DenseLayer(3, activation="tanh"), OutputLayer(2)],
        input_type=InputType.feed_forward(3),
        updater=updaters.Adam(0.01),
        seed=1,
    )
    net = MultiLayerNetwork(conf).init()
    x = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    net.fit(DataSet(x, np.eye(2, dtype=np.float32)[[0, 1, 1, 0]]), epochs=2)
    buffer = io.BytesIO()
    net.save(buffer)
    return net, buffer.getvalue()


def _same_model(loaded: MultiLayerNetwork, net: MultiLayerNetwork) -> bool:
    return (
        loaded.conf == net.conf
        and loaded.params().dtype == net.params().dtype
        and loaded.params().tobytes() == net.params().tobytes()
        and loaded.updater_state().tobytes() == net.updater_state().tobytes()
        and (loaded.iteration_count, loaded.epoch_count) == (net.iteration_count, net.epoch_count)
    )


@st.composite
def damaged_zip(draw: st.DrawFn, blob: bytes) -> bytes:
    """Byte damage, or an edit of one character of a member name (local header, directory, or both)."""
    if draw(st.booleans()):
        return draw(damaged(blob))
    name = draw(
        st.sampled_from(
            [b"sparkgrad-format.json", b"configuration.json", b"coefficients.bin"] + [b"updaterState.bin"]
        )
    )
    places = [i for i in range(len(blob)) if blob.startswith(name, i)]
    chosen = draw(st.lists(st.sampled_from(places), min_size=1, unique=True))
    data = bytearray(blob)
    char = draw(st.integers(0, len(name) - 1))
    new = draw(st.integers(0, 255))
    for at in chosen:
        data[at + char] = new
    return bytes(data)


def test_damaged_model_zips_raise_or_load_identically(
    fuzz_examples: int, model: tuple[MultiLayerNetwork, bytes]
) -> None:
    net, blob = model
    assert _same_model(MultiLayerNetwork.load(io.BytesIO(blob)), net)

    @hgiven(bad=damaged_zip(blob))
    def inner(bad: bytes) -> None:
        try:
            loaded = MultiLayerNetwork.load(io.BytesIO(bad))
        except CorruptDataError:
            return
        assert _same_model(loaded, net)

    _run(inner, fuzz_examples)
