"""DataSet / MultiDataSet: validation, indexing, split/merge/shuffle, equality, pickling, binary format."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparkgrad.data import DataSet, MultiDataSet
from sparkgrad.data import serialization as fmt
from sparkgrad.errors import CorruptDataError

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8, np.uint16, np.bool_]


@st.composite
def arrays_with_rows(draw: st.DrawFn, n: int, max_rank: int = 4) -> np.ndarray:
    """An array of a storable dtype whose first dimension is ``n``."""
    trailing = draw(hnp.array_shapes(min_dims=0, max_dims=max_rank - 1, min_side=0, max_side=3))
    return draw(hnp.arrays(draw(st.sampled_from(DTYPES)), (n, *trailing)))


@st.composite
def datasets(draw: st.DrawFn, n: int | None = None) -> DataSet:
    n = draw(st.integers(0, 6)) if n is None else n
    optional = st.none() | arrays_with_rows(n)
    labels = draw(optional)
    labels_mask = None if labels is None else draw(optional)
    return DataSet(draw(arrays_with_rows(n)), labels, draw(optional), labels_mask)


@st.composite
def multi_datasets(draw: st.DrawFn, n: int | None = None) -> MultiDataSet:
    n = draw(st.integers(0, 6)) if n is None else n
    features = draw(st.lists(arrays_with_rows(n), min_size=1, max_size=3))
    labels = draw(st.lists(arrays_with_rows(n), max_size=3))

    def masks(count: int) -> st.SearchStrategy:
        return st.none() | st.lists(st.none() | arrays_with_rows(n), min_size=count, max_size=count)

    return MultiDataSet(features, labels, draw(masks(len(features))), draw(masks(len(labels))))


any_dataset = datasets() | multi_datasets()


def small_dataset(n: int = 5) -> DataSet:
    """Features hold example ids so that order and membership can be checked."""
    ids = np.arange(n, dtype=np.float32)
    return DataSet(
        np.stack([ids, ids * 10], axis=1),
        np.eye(3, dtype=np.float32)[np.arange(n) % 3],
        labels_mask=np.ones((n, 1), dtype=np.float32),
    )


# -- construction and validation -------------------------------------------------------------------


def test_dataset_keeps_arrays_without_copy() -> None:
    x = np.zeros((4, 3), dtype=np.float32)
    ds = DataSet(x)
    assert ds.features is x and ds.labels is None and ds.features_mask is None and ds.labels_mask is None
    assert ds.num_examples() == len(ds) == 4


def test_dataset_accepts_array_likes() -> None:
    ds = DataSet([[1.0, 2.0], [3.0, 4.0]], [0, 1])
    assert ds.features.shape == (2, 2) and ds.labels.dtype.kind == "i"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"labels": np.zeros((3, 2))}, "labels"),
        ({"features_mask": np.zeros((5, 2))}, "features_mask"),
        ({"labels": np.zeros((4, 1)), "labels_mask": np.zeros((1,))}, "labels_mask"),
    ],
)
def test_dataset_rejects_mismatched_first_dimension(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: has \d+ examples .* features has 4"):
        DataSet(np.zeros((4, 2)), **kwargs)


def test_multidataset_from_dataset_shares_arrays() -> None:
    ds = small_dataset(4)
    mds = MultiDataSet.from_dataset(ds)
    assert mds.features[0] is ds.features and mds.labels[0] is ds.labels
    assert mds.features_masks is None and mds.labels_masks[0] is ds.labels_mask
    unlabeled = MultiDataSet.from_dataset(DataSet(ds.features, features_mask=ds.labels_mask))
    assert unlabeled.labels == [] and unlabeled.labels_masks is None
    assert unlabeled.features_masks[0] is ds.labels_mask
    with pytest.raises(TypeError, match="dataset: expected a DataSet"):
        MultiDataSet.from_dataset(mds)


def test_dataset_rejects_bad_arrays() -> None:
    with pytest.raises(ValueError, match="labels_mask: given without labels"):
        DataSet(np.zeros((2, 1)), labels_mask=np.ones((2, 1)))
    with pytest.raises(TypeError, match="features"):
        DataSet(None)
    with pytest.raises(ValueError, match="features: expected at least one dimension"):
        DataSet(np.float32(1.0))
    with pytest.raises(TypeError, match="labels: unsupported dtype object"):
        DataSet(np.zeros((2, 1)), np.array([None, "a"], dtype=object))
    with pytest.raises(TypeError, match="features_mask: unsupported dtype complex128"):
        DataSet(np.zeros((2, 1)), features_mask=np.zeros(2, dtype=complex))


def test_multidataset_validation_names_the_array() -> None:
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"^labels\[1\]: has 2 examples"):
        MultiDataSet([x], [x, np.zeros((2, 1))])
    with pytest.raises(ValueError, match="features: expected at least one array"):
        MultiDataSet([], [x])
    with pytest.raises(ValueError, match="features_masks: expected 2 entries"):
        MultiDataSet([x, x], [x], features_masks=[x])
    with pytest.raises(TypeError, match=r"labels\[0\]: expected a numpy array, got None"):
        MultiDataSet([x], [None])
    with pytest.raises(TypeError, match="labels: expected a list"):
        MultiDataSet([x], {"a": x})


def test_multidataset_normalises_lists_and_masks() -> None:
    x = np.zeros((3, 2))
    mds = MultiDataSet(x, None, features_masks=[None], labels_masks=[])
    assert len(mds.features) == 1 and mds.features[0] is x
    assert mds.labels == [] and mds.features_masks is None and mds.labels_masks is None
    masked = MultiDataSet([x, x], [x], features_masks=[None, np.ones((3, 2))])
    assert masked.features_masks[0] is None and masked.features_masks[1].shape == (3, 2)
    masked.features.append(x)  # the returned list is a copy
    assert len(masked.features) == 2


def test_repr_describes_arrays() -> None:
    assert repr(small_dataset(5)) == (
        "DataSet(num_examples=5, features=float32(5, 2), labels=float32(5, 3), features_mask=None, "
        "labels_mask=float32(5, 1))"
    )
    mds = MultiDataSet([np.zeros((2, 1), np.int32)], [], labels_masks=None)
    assert repr(mds) == (
        "MultiDataSet(num_examples=2, features=[int32(2, 1)], labels=[], features_masks=None, "
        "labels_masks=None)"
    )


# -- indexing, split, merge, shuffle ---------------------------------------------------------------


def test_getitem_selects_examples_in_every_array() -> None:
    ds = small_dataset(6)
    assert ds[2].features.tolist() == [[2.0, 20.0]]
    assert ds[-1].features[0, 0] == 5.0
    assert np.shares_memory(ds[1:3].features, ds.features)  # slices are views
    picked = ds[[4, 0]]
    assert picked.features[:, 0].tolist() == [4.0, 0.0] and picked.labels_mask.shape == (2, 1)
    chosen = ds[np.array([True, False] * 3)]
    assert chosen.features[:, 0].tolist() == [0.0, 2.0, 4.0]
    assert ds[[]].num_examples() == 0
    with pytest.raises(IndexError, match="out of range for 6"):
        ds[6]
    with pytest.raises(IndexError, match="boolean array of length 6"):
        ds[np.array([True, False])]
    with pytest.raises(IndexError):
        ds[np.zeros((2, 2), dtype=int)]
    with pytest.raises(TypeError, match="not iterable"):
        iter(ds)


@given(data=any_dataset, batch_size=st.integers(1, 7))
def test_split_then_merge_is_identity(data: DataSet | MultiDataSet, batch_size: int) -> None:
    parts = data.split(batch_size)
    sizes = [p.num_examples() for p in parts]
    assert sum(sizes) == data.num_examples()
    assert all(s == batch_size for s in sizes[:-1]) and all(0 < s <= batch_size for s in sizes)
    if parts:
        assert type(data).merge(parts) == data


def test_split_rejects_bad_batch_size() -> None:
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="batch_size"):
            small_dataset().split(bad)


def test_merge_fills_missing_masks_with_ones() -> None:
    a = DataSet(np.zeros((2, 3)), np.zeros((2, 1)), features_mask=np.zeros((2, 3), np.float32))
    b = DataSet(np.ones((1, 3)), np.ones((1, 1)))
    merged = DataSet.merge([a, b])
    assert merged.features_mask.dtype == np.float32
    np.testing.assert_array_equal(merged.features_mask, [[0, 0, 0], [0, 0, 0], [1, 1, 1]])
    assert merged.labels_mask is None

    ma = MultiDataSet([np.zeros((2, 1))], [np.zeros((2, 1))])
    mb = MultiDataSet([np.zeros((1, 1))], [np.zeros((1, 1))], labels_masks=[np.zeros((1, 4))])
    mm = MultiDataSet.merge([ma, mb])
    assert mm.features_masks is None
    np.testing.assert_array_equal(mm.labels_masks[0], [[1] * 4, [1] * 4, [0] * 4])


def test_merge_errors_name_the_index() -> None:
    a = DataSet(np.zeros((2, 3)), np.zeros((2, 1)))
    with pytest.raises(ValueError, match=r"datasets\[2\]: features has shape \(1, 4\), expected \(n, 3\)"):
        DataSet.merge([a, a, DataSet(np.zeros((1, 4)), np.zeros((1, 1)))])
    with pytest.raises(ValueError, match=r"datasets\[1\]: has no labels but datasets\[0\] has"):
        DataSet.merge([a, DataSet(np.zeros((1, 3)))])
    with pytest.raises(TypeError, match=r"datasets\[1\]: expected a DataSet, got MultiDataSet"):
        DataSet.merge([a, MultiDataSet([np.zeros((1, 3))], [])])
    with pytest.raises(ValueError, match="at least one"):
        DataSet.merge([])
    m = MultiDataSet([np.zeros((1, 3))], [])
    with pytest.raises(ValueError, match=r"datasets\[1\]: has \[2, 0, 2, 0\]"):
        MultiDataSet.merge([m, MultiDataSet([np.zeros((1, 3))] * 2, [])])


@given(data=any_dataset, seed=st.integers(0, 2**32))
def test_shuffle_is_a_seeded_permutation(data: DataSet | MultiDataSet, seed: int) -> None:
    shuffled = data.shuffle(seed)
    assert shuffled == data.shuffle(seed)
    n = data.num_examples()
    order = np.random.default_rng(seed).permutation(n)
    assert shuffled == data[order]  # every array permuted the same way


def test_shuffle_leaves_original_and_keeps_rows_together() -> None:
    ds = small_dataset(50)
    before = ds.features.copy()
    shuffled = ds.shuffle(seed=7)
    np.testing.assert_array_equal(ds.features, before)
    np.testing.assert_array_equal(shuffled.features[:, 1], shuffled.features[:, 0] * 10)
    np.testing.assert_array_equal(np.sort(shuffled.features[:, 0]), before[:, 0])
    assert shuffled != ds and ds.shuffle(seed=8) != shuffled
    assert ds.shuffle().num_examples() == 50
    with pytest.raises(ValueError, match="seed"):
        ds.shuffle(-1)


# -- equality and pickling -------------------------------------------------------------------------


def test_equality_is_exact() -> None:
    x = np.array([[1.0, np.nan]], dtype=np.float32)
    assert DataSet(x) == DataSet(x.copy())
    assert DataSet(x) != DataSet(x.astype(np.float64))  # dtype matters
    assert DataSet(x) != DataSet(x, labels=np.zeros((1, 1), np.float32))
    assert DataSet(x) != DataSet(np.array([[1.0, 2.0]], dtype=np.float32))
    assert DataSet(x) != MultiDataSet([x], [])
    assert MultiDataSet([x], []) == MultiDataSet([x.copy()], None)
    with pytest.raises(TypeError):
        hash(DataSet(x))


@given(data=any_dataset, protocol=st.sampled_from([2, pickle.HIGHEST_PROTOCOL]))
def test_pickle_round_trip(data: DataSet | MultiDataSet, protocol: int) -> None:
    assert pickle.loads(pickle.dumps(data, protocol=protocol)) == data


# -- binary format: round trips --------------------------------------------------------------------


@given(data=any_dataset)
def test_bytes_round_trip(data: DataSet | MultiDataSet) -> None:
    restored = type(data).from_bytes(data.to_bytes())
    assert restored == data
    for array in _all_arrays(restored):
        assert array.flags.writeable and array.flags.c_contiguous and array.flags.owndata


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("round_trip") / "data.bin"


@given(data=any_dataset)
def test_file_object_and_path_round_trip(data: DataSet | MultiDataSet, scratch: Path) -> None:
    buffer = io.BytesIO()
    data.save(buffer)
    assert buffer.getvalue() == data.to_bytes()
    buffer.seek(0)
    assert type(data).load(buffer) == data
    data.save(scratch)
    assert type(data).load(scratch) == data


def test_path_round_trip(tmp_path: Path) -> None:
    ds = small_dataset(7)
    mds = MultiDataSet([ds.features, ds.labels], [ds.labels], labels_masks=[ds.labels_mask])
    for data, target in ((ds, tmp_path / "a.bin"), (mds, str(tmp_path / "b.bin"))):
        data.save(target)
        assert type(data).load(target) == data
        assert Path(target).read_bytes() == data.to_bytes()
    assert DataSet.load("file://" + str(tmp_path / "a.bin")) == ds  # Spark-style URI
    with open(tmp_path / "c.bin", "wb") as f:
        ds.save(f)
    with open(tmp_path / "c.bin", "rb") as f:
        assert DataSet.load(f) == ds


def test_stream_holds_consecutive_records() -> None:
    buffer = io.BytesIO()
    records = [small_dataset(n) for n in (1, 3, 2)]
    for r in records:
        r.save(buffer)
    buffer.seek(0)
    assert list(DataSet.load_records(buffer)) == records
    buffer.seek(0)
    with pytest.raises(CorruptDataError, match=r"^<BytesIO>: unexpected data after the end of the record"):
        DataSet.load(buffer)  # one record, then the stream must end
    buffer.seek(0)
    buffer.truncate(len(buffer.getvalue()) - 1)
    with pytest.raises(CorruptDataError, match=r"^<BytesIO>: truncated: "):
        list(DataSet.load_records(buffer))


class _Unseekable(io.RawIOBase):
    """A pipe-like stream: read only, no seek, short reads."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def readable(self) -> bool:
        return True

    def readinto(self, target: memoryview) -> int:  # type: ignore[override]
        n = min(len(target), 5, len(self._data))
        target[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def test_unseekable_stream_round_trip_and_truncation() -> None:
    data = small_dataset(4).to_bytes()
    assert DataSet.load(_Unseekable(data)) == small_dataset(4)
    with pytest.raises(CorruptDataError, match=r"<_Unseekable>: truncated"):
        DataSet.load(_Unseekable(data[:-3]))


def test_non_native_and_non_contiguous_arrays_round_trip() -> None:
    big_endian = np.arange(6, dtype=">f8").reshape(3, 2)
    strided = np.arange(24, dtype=np.int32).reshape(3, 8)[:, ::3]
    restored = DataSet.from_bytes(DataSet(big_endian, strided).to_bytes())
    assert restored.features.dtype == np.float64 and restored.features.dtype.isnative
    np.testing.assert_array_equal(restored.features, big_endian)
    np.testing.assert_array_equal(restored.labels, strided)


def test_layout_matches_documentation() -> None:
    ds = DataSet(np.array([[1.5, -2.0]], dtype=np.float32), features_mask=np.array([True]))
    expected = (
        b"\x89SGD\r\n\x1a\n"
        + struct.pack("<HBB4I", 2, 1, 0, 1, 1, 1, 1)
        + struct.pack("<BBBBQQ", 1, 1, 2, 0, 1, 2)
        + np.array([1.5, -2.0], dtype="<f4").tobytes()
        + b"\x00"  # labels absent
        + struct.pack("<BBBBQ", 1, 12, 1, 0, 1)
        + b"\x01"
        + b"\x00"  # labels_mask absent
    )
    assert ds.to_bytes() == expected + struct.pack("<I", zlib.crc32(expected))
    mds = MultiDataSet([np.zeros((0, 1), np.int8)], [], features_masks=[np.zeros((0,), np.uint8)])
    body = (
        fmt.MAGIC
        + struct.pack("<HBB4I", 2, 2, 0, 1, 0, 1, 0)
        + struct.pack("<BBBBQQ", 1, 4, 2, 0, 0, 1)
        + struct.pack("<BBBBQ", 1, 8, 1, 0, 0)
    )
    assert mds.to_bytes() == body + struct.pack("<I", zlib.crc32(body))


# -- binary format: rejection of bad input ---------------------------------------------------------


def _all_arrays(data: DataSet | MultiDataSet) -> list[np.ndarray]:
    return [a for group in data._groups for a in group if a is not None]


@pytest.mark.parametrize("kind", [DataSet, MultiDataSet])
def test_every_truncation_is_reported(kind: type, tmp_path: Path) -> None:
    if kind is DataSet:
        data = small_dataset(2)
    else:
        data = MultiDataSet([np.ones((2, 3), np.float32)], [np.ones((2, 1))], labels_masks=[np.ones((2, 4))])
    blob = data.to_bytes()
    path = tmp_path / "cut.bin"
    for cut in range(len(blob)):
        with pytest.raises(CorruptDataError, match=r"^<bytes>: "):
            kind.from_bytes(blob[:cut])
        path.write_bytes(blob[:cut])
        with pytest.raises(CorruptDataError, match=rf"^{path}: "):
            kind.load(path)
        with pytest.raises(CorruptDataError, match=r"^<BytesIO>: "):
            kind.load(io.BytesIO(blob[:cut]))


def test_foreign_version_kind_and_trailing_data_are_rejected(tmp_path: Path) -> None:
    blob = small_dataset(2).to_bytes()
    cases = {
        "foreign.bin": (b"\x89PNG\r\n\x1a\n" + blob[8:], "not a sparkgrad data file"),
        "text.bin": (b"features,labels\n1,2\n3,4\n" * 3, "not a sparkgrad data file"),
        "short_text.bin": (b"1,2\n3,4\n\n", "not a sparkgrad data file"),
        "empty.bin": (b"", r"truncated: magic bytes needs 8 bytes at offset 0, only 0 left"),
        "version.bin": (blob[:8] + struct.pack("<H", 3) + blob[10:], "unsupported format version 3"),
        "kindcode.bin": (blob[:10] + b"\x07" + blob[11:], "corrupt header"),
        "counts.bin": (blob[:12] + struct.pack("<I", 2) + blob[16:], r"corrupt header: array counts"),
        "dtype.bin": (blob[:29] + b"\x63" + blob[30:], "corrupt array header"),
        "trailing.bin": (blob + b"\x00", "unexpected data after the end"),
        "shape.bin": (blob[:32] + struct.pack("<Q", 2**40) + blob[40:], "truncated"),
        "zero_huge.bin": (
            blob[:32] + struct.pack("<QQ", 0, 2**63 + 5) + blob[48:],
            "corrupt shape|inconsistent arrays",
        ),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(CorruptDataError, match=rf"^{path}: .*({message})"):
            DataSet.load(path)
        with pytest.raises(CorruptDataError, match=rf"^s3://x/{name}: .*({message})"):
            DataSet.from_bytes(content, source=f"s3://x/{name}")
    path = tmp_path / "multi.bin"
    MultiDataSet([np.zeros((1, 1))], []).save(path)
    with pytest.raises(CorruptDataError, match=rf"^{path}: holds a MultiDataSet, not a DataSet"):
        DataSet.load(path)
    with pytest.raises(CorruptDataError, match="holds a DataSet, not a MultiDataSet"):
        MultiDataSet.from_bytes(blob)


def test_inconsistent_arrays_in_a_file_are_corrupt() -> None:
    blob = bytearray(DataSet(np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32)).to_bytes())
    labels_rows = 28 + 4 + 16 + 8 + 4  # header, features slot header + shape + data, labels slot header
    blob[labels_rows : labels_rows + 8] = struct.pack("<Q", 1)
    del blob[labels_rows + 16 : labels_rows + 20]  # one float32 of labels data less
    with pytest.raises(
        CorruptDataError, match=r"<bytes>: labels: shape \(1, 1\) has 1 examples but features has 2"
    ):
        DataSet.from_bytes(bytes(blob))


def test_bad_targets_raise_type_or_value_errors(tmp_path: Path) -> None:
    ds = small_dataset(2)
    with pytest.raises(TypeError, match="binary mode"):
        ds.save(io.StringIO())
    with open(tmp_path / "t.txt", "w") as f, pytest.raises(TypeError, match="binary mode"):
        ds.save(f)
    with pytest.raises(TypeError, match="path .* or a binary file object, got int"):
        DataSet.load(3)
    with pytest.raises(TypeError, match="expected bytes"):
        DataSet.from_bytes("text")
    with pytest.raises(FileNotFoundError):
        DataSet.load(tmp_path / "missing.bin")
    ds.save(os.fsencode(tmp_path / "bytes_path.bin").decode())
    assert DataSet.load(tmp_path / "bytes_path.bin") == ds
