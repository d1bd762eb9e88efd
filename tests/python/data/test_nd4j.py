"""read_nd4j_dataset: DataSet files in DL4J's ``DataSet.save`` layout, written here from the specification.

The writer below follows dl4j-reference.md 6.1/6.2 (Java DataOutputStream, big-endian, writeUTF
strings) independently of the reader's tables, so a misreading of the layout on either side shows up
as a value mismatch.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkgrad.data import DataSet, read_nd4j_array, read_nd4j_dataset
from sparkgrad.errors import CorruptDataError

# ND4J data type name -> (big-endian element dtype written by DataOutputStream, dtype read back)
JAVA_TYPES = {
    "FLOAT": (">f4", np.float32),
    "DOUBLE": (">f8", np.float64),
    "HALF": (">f2", np.float16),
    "LONG": (">i8", np.int64),
    "INT": (">i4", np.int32),
    "SHORT": (">i2", np.int16),
    "BYTE": ("i1", np.int8),
    "UBYTE": ("u1", np.uint8),
    "BOOL": ("u1", np.bool_),
}
LEGACY_MODES = ("DIRECT", "HEAP", "JAVACPP")


def utf(text: str) -> bytes:
    raw = text.encode("ascii")
    return struct.pack(">H", len(raw)) + raw


def buffer(mode: str, type_name: str, elements: bytes, count: int) -> bytes:
    """DataBuffer.write: mode, length (int32 in legacy modes, else int64), type, elements."""
    length = struct.pack(">i" if mode in LEGACY_MODES else ">q", count)
    return utf(mode) + length + utf(type_name) + elements


def nd4j_write(
    array: np.ndarray, type_name: str = "FLOAT", order: str = "c", mode: str = "MIXED_DATA_TYPES"
) -> bytes:
    """Nd4j.write: the shape-info buffer [rank, shape, strides, extras, ews, order] then the elements."""
    a = np.asarray(array)
    rank = a.ndim
    itemsize = a.dtype.itemsize
    ordered = np.asfortranarray(a) if order == "f" else np.ascontiguousarray(a)
    strides = [s // itemsize for s in ordered.strides] if rank else []  # asfortranarray makes 0-d 1-d
    info = [rank, *a.shape, *strides, 0, 1, ord(order)]
    info_type, info_dtype = ("INT", ">i4") if mode in LEGACY_MODES else ("LONG", ">i8")
    shape_info = buffer(mode, info_type, np.array(info, dtype=info_dtype).tobytes(), len(info))
    java, _ = JAVA_TYPES[type_name]
    data = a.ravel(order="F" if order == "f" else "C").astype(java).tobytes()
    return shape_info + buffer(mode, type_name, data, a.size)


def dataset_save(
    features: np.ndarray,
    labels: np.ndarray | None = None,
    features_mask: np.ndarray | None = None,
    labels_mask: np.ndarray | None = None,
    *,
    same: bool = False,
    metadata: bytes | None = None,
    **write: str,
) -> bytes:
    """DataSet.save: the flags byte, the present arrays in order, then the Java metadata stream."""
    flags = 0x01 | (0x04 if same else 0x02 if labels is not None else 0)
    flags |= (0x08 if features_mask is not None else 0) | (0x10 if labels_mask is not None else 0)
    flags |= 0x20 if metadata is not None else 0
    out = bytes([flags]) + nd4j_write(features, **write)
    for array in (None if same else labels, features_mask, labels_mask):
        if array is not None:
            out += nd4j_write(array, **write)
    return out + (metadata or b"")


def assert_same(ds: DataSet, expected: dict[str, np.ndarray | None], dtype: type) -> None:
    for name, want in expected.items():
        got = getattr(ds, name)
        if want is None:
            assert got is None, name
            continue
        assert got.dtype == np.dtype(dtype), name
        assert got.flags.c_contiguous, name
        np.testing.assert_array_equal(got, want.astype(dtype), err_msg=name)


def test_reads_features_and_labels_of_a_classification_file(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[[0, 3, 1, 2, 3]]
    path = tmp_path / "ds.bin"
    path.write_bytes(dataset_save(x, y))
    ds = read_nd4j_dataset(path)
    assert_same(ds, {"features": x, "labels": y, "features_mask": None, "labels_mask": None}, np.float32)


@pytest.mark.parametrize("type_name", list(JAVA_TYPES))
@pytest.mark.parametrize("mode", ["MIXED_DATA_TYPES", "LONG_SHAPE", "HEAP", "DIRECT"])
@pytest.mark.parametrize("order", ["c", "f"])
def test_every_type_mode_and_order_reads_back_the_values(type_name: str, mode: str, order: str) -> None:
    rng = np.random.default_rng(1)
    dtype = JAVA_TYPES[type_name][1]
    if dtype == np.bool_:
        x = rng.integers(0, 2, size=(2, 3, 4, 5)).astype(bool)
    elif np.issubdtype(dtype, np.integer):
        x = rng.integers(0, 100, size=(2, 3, 4, 5)).astype(dtype)
    else:  # values exact in every float width, so equality is exact
        x = (rng.integers(-64, 64, size=(2, 3, 4, 5)) / 8).astype(dtype)
    y = rng.integers(0, 2, size=(2, 6)).astype(dtype)
    ds = read_nd4j_dataset(dataset_save(x, y, type_name=type_name, order=order, mode=mode))
    assert_same(ds, {"features": x, "labels": y}, dtype)


def test_recurrent_data_with_both_masks() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 4, 6))
    y = np.eye(2)[rng.integers(0, 2, size=(3, 6))].transpose(0, 2, 1)
    fm = (rng.random((3, 6)) > 0.3).astype(np.float64)
    lm = (rng.random((3, 6)) > 0.5).astype(np.float64)
    ds = read_nd4j_dataset(dataset_save(x, y, fm, lm, type_name="DOUBLE", order="f"))
    assert_same(ds, {"features": x, "labels": y, "features_mask": fm, "labels_mask": lm}, np.float64)


def test_labels_same_as_features_come_back_as_an_independent_copy() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    ds = read_nd4j_dataset(dataset_save(x, x, same=True))
    assert_same(ds, {"features": x, "labels": x}, np.float32)
    assert not np.shares_memory(ds.features, ds.labels)


def test_example_metadata_is_skipped() -> None:
    x = np.ones((2, 2), dtype=np.float32)
    java_stream = b"\xac\xed\x00\x05sr\x00\x13java.util.ArrayList" + bytes(20)
    ds = read_nd4j_dataset(dataset_save(x, x * 2, metadata=java_stream))
    assert_same(ds, {"features": x, "labels": x * 2}, np.float32)


def test_features_only_file_has_no_labels() -> None:
    x = np.ones((2, 2), dtype=np.float32)
    assert_same(read_nd4j_dataset(dataset_save(x)), {"features": x, "labels": None}, np.float32)


def test_sources_path_uri_bytes_pair_and_file_object(tmp_path) -> None:
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    data = dataset_save(x, x)
    path = tmp_path / "a b.bin"
    path.write_bytes(data)
    for source in (
        str(path),
        path,
        path.as_uri(),
        data,
        bytearray(data),
        (str(path), data),
        io.BytesIO(data),
    ):
        assert_same(read_nd4j_dataset(source), {"features": x, "labels": x}, np.float32)
    with pytest.raises(FileNotFoundError):
        read_nd4j_dataset(tmp_path / "missing.bin")
    with pytest.raises(TypeError, match="source"):
        read_nd4j_dataset(3)


def _valid() -> bytes:
    return dataset_save(np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32))


def _replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert old in data
    return data.replace(old, new, 1)


def _with_shape_info(info: list[int]) -> bytes:
    """A file whose features' shape info is ``info`` (6 float elements follow)."""
    shape_info = buffer("MIXED_DATA_TYPES", "LONG", np.array(info, ">i8").tobytes(), len(info))
    data = buffer("MIXED_DATA_TYPES", "FLOAT", np.ones(6, ">f4").tobytes(), 6)
    return b"\x01" + shape_info + data


BAD_FILES = {
    "unknown flag": (lambda: b"\x41" + _valid()[1:], "flags"),
    "no features": (lambda: b"\x02" + _valid()[1:], "flags"),
    "labels twice": (lambda: b"\x07" + _valid()[1:], "flags"),
    "empty": (lambda: b"", "flags"),
    "mode": (
        lambda: _replace_once(_valid(), utf("MIXED_DATA_TYPES"), utf("MIXED_DATA_TYPEZ")),
        "features shape info mode",
    ),
    "type": (lambda: _valid().replace(utf("FLOAT"), utf("UTF8"), 1), "features data type"),
    "shape type": (lambda: _valid().replace(utf("LONG"), utf("DOUBLE"), 1), "features shape info"),
    "negative length": (
        lambda: _replace_once(
            _valid(),
            utf("MIXED_DATA_TYPES") + struct.pack(">q", 8),
            utf("MIXED_DATA_TYPES") + struct.pack(">q", -8),
        ),
        "features shape info length",
    ),
    "info length": (lambda: _with_shape_info([2, 2, 3, 3, 1, 0, 1, 99, 0, 0]), "features shape info"),
    "rank": (lambda: _with_shape_info([3, 2, 3, 3, 1, 0, 1, 99]), "features shape info"),
    "rank 0": (lambda: _with_shape_info([0, 0, 1, 99]), "features shape info"),
    "order": (lambda: _with_shape_info([2, 2, 3, 3, 1, 0, 1, 100]), "features shape info"),
    "strides": (lambda: _with_shape_info([2, 2, 3, 1, 2, 0, 1, 99]), "features shape info"),
    "negative dim": (lambda: _with_shape_info([2, -2, -3, 3, 1, 0, 1, 99]), "features shape info"),
    "count": (lambda: _with_shape_info([2, 2, 4, 4, 1, 0, 1, 99]), "features data"),
    "truncated": (lambda: _valid()[:-3], "labels data"),
    "trailing": (lambda: _valid() + b"\x00", "end"),
    "metadata": (lambda: b"\x23" + _valid()[1:] + b"junk", "metadata"),
    "examples": (
        lambda: dataset_save(np.ones((2, 3), np.float32), np.zeros((3, 2), np.float32)),
        "labels",
    ),
    "mask without labels": (
        lambda: b"\x11" + nd4j_write(np.ones((2, 3), np.float32)) + nd4j_write(np.ones((2, 3), np.float32)),
        "labels_mask",
    ),
    "bool": (
        lambda: dataset_save(np.full((1, 2), 2, np.uint8), type_name="UBYTE").replace(
            utf("UBYTE"), utf("BOOL")
        ),
        "features data",
    ),
    "not ascii": (
        lambda: _replace_once(_valid(), utf("FLOAT"), struct.pack(">H", 5) + b"FL\xffAT"),
        "features data type",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_damaged_or_foreign_files_name_the_file_and_field(case: str) -> None:
    make, field = BAD_FILES[case]
    with pytest.raises(CorruptDataError) as info:
        read_nd4j_dataset(make(), name="hdfs://data/part-7.bin")
    message = str(info.value)
    assert message.startswith(f"hdfs://data/part-7.bin: {field}"), message


@st.composite
def nd4j_file(draw: st.DrawFn) -> tuple[bytes, dict[str, np.ndarray | None], type]:
    """A valid file, the arrays it was written from (what reading it must give back) and their dtype."""
    type_name = draw(st.sampled_from(["FLOAT", "DOUBLE", "INT", "LONG", "HALF", "BOOL"]))
    dtype = JAVA_TYPES[type_name][1]
    n = draw(st.integers(0, 3))
    shape = (n, *draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    x = np.arange(np.prod(shape)).reshape(shape).astype(dtype)

    def mask() -> np.ndarray | None:
        if not draw(st.booleans()):
            return None
        bits = draw(st.lists(st.booleans(), min_size=2 * n, max_size=2 * n))
        return np.array(bits, dtype=bool).reshape(n, 2).astype(dtype)

    same = draw(st.booleans())
    labels = x[:, :1] if draw(st.booleans()) else None
    features_mask = mask()
    labels_mask = mask() if same or labels is not None else None  # a labels mask needs labels
    data = dataset_save(
        x,
        labels,
        features_mask,
        labels_mask,
        same=same,
        type_name=type_name,
        order=draw(st.sampled_from(["c", "f"])),
        mode=draw(st.sampled_from(["MIXED_DATA_TYPES", "LONG_SHAPE", "HEAP", "DIRECT"])),
    )
    expected = {
        "features": x,
        "labels": x if same else labels,
        "features_mask": features_mask,
        "labels_mask": labels_mask,
    }
    return data, expected, dtype


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(nd4j_file())[0])
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=9))
        elif op == "delete" and data:
            del data[at : at + draw(st.integers(1, 9))]
    return bytes(data)


def test_fuzz_valid_files_read_back_and_damaged_ones_raise_corrupt_data_error(fuzz_examples: int) -> None:
    @given(valid=nd4j_file(), bad=damaged())
    def run(valid: tuple[bytes, dict[str, np.ndarray | None], type], bad: bytes) -> None:
        data, expected, dtype = valid
        ds = read_nd4j_dataset(data)
        assert isinstance(ds, DataSet)
        assert_same(ds, expected, dtype)  # every array value by value, masks included, or None
        try:
            read_nd4j_dataset(bad, name="fuzzed.bin")
        except CorruptDataError as exc:
            assert str(exc).startswith("fuzzed.bin: ")

    settings(max_examples=fuzz_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])(run)()


@pytest.mark.parametrize("order", ["c", "f"])
@pytest.mark.parametrize("shape", [(), (5,), (1, 7), (2, 3, 4)])
def test_read_nd4j_array_reads_one_record_of_any_rank(order: str, shape: tuple) -> None:
    values = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 0.5 - 1.0
    got = read_nd4j_array(nd4j_write(values, "DOUBLE", order), "x.bin")
    assert got.dtype == np.float64 and got.shape == shape
    np.testing.assert_array_equal(got, values)


def test_read_nd4j_array_refuses_bytes_after_the_record() -> None:
    with pytest.raises(CorruptDataError, match=r"x\.bin: end: 3 bytes after the array \(ND4J array file"):
        read_nd4j_array(nd4j_write(np.ones((2, 2), np.float32)) + b"abc", "x.bin")
