"""DataSet format version 2 (checksum) and the structural rules checked for versions 1 and 2."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgrad.data import DataSet, MultiDataSet, SerializedDataSetLoader
from sparkgrad.data import serialization as fmt
from sparkgrad.errors import CorruptDataError

MAGIC = b"\x89SGD\r\n\x1a\n"


def slot(code: int, shape: tuple[int, ...], data: bytes) -> bytes:
    return struct.pack("<BBBB", 1, code, len(shape), 0) + struct.pack(f"<{len(shape)}Q", *shape) + data


def record(version: int, kind: int, counts: tuple[int, ...], *slots: bytes) -> bytes:
    """A record written from the format table (the trailer is added for version 2)."""
    body = MAGIC + struct.pack("<HBB4I", version, kind, 0, *counts) + b"".join(slots)
    return body + struct.pack("<I", zlib.crc32(body)) if version == 2 else body


FEATURES = slot(1, (2, 1), np.array([1.5, -2.0], "<f4").tobytes())
LABELS = slot(7, (2,), np.array([3, 4], "<i8").tobytes())
EXPECTED = DataSet(np.array([[1.5], [-2.0]], np.float32), np.array([3, 4], np.int64))


@pytest.mark.parametrize("version", [1, 2])
def test_both_versions_load(version: int, tmp_path: Path) -> None:
    blob = record(version, 1, (1, 1, 1, 1), FEATURES, LABELS, b"\x00", b"\x00")
    assert DataSet.from_bytes(blob) == EXPECTED
    (tmp_path / "v.bin").write_bytes(blob)
    assert DataSet.load(tmp_path / "v.bin") == EXPECTED
    assert SerializedDataSetLoader()(blob) == EXPECTED


def test_checksum_catches_what_structure_cannot() -> None:
    blob = bytearray(EXPECTED.to_bytes())
    blob[28 + 4 + 16] ^= 0x01  # the lowest mantissa bit of features[0, 0]: structurally fine
    with pytest.raises(
        CorruptDataError, match=r"^s3://b/x\.bin: checksum mismatch in the record at offset 0"
    ):
        DataSet.from_bytes(bytes(blob), source="s3://b/x.bin")
    v1 = bytearray(record(1, 1, (1, 1, 1, 1), FEATURES, LABELS, b"\x00", b"\x00"))
    v1[28 + 4 + 16] ^= 0x01
    assert DataSet.from_bytes(bytes(v1)).features[0, 0] != 1.5  # why version 2 has a checksum


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    ("slots", "counts", "kind", "message"),
    [
        ((FEATURES, LABELS, b"\x02", b"\x00"), (1, 1, 1, 1), 1, "features_mask: corrupt presence byte 2"),
        ((b"\x00", LABELS, b"\x00", b"\x00"), (1, 1, 1, 1), 1, "features: absent, but the format requires"),
        (
            (FEATURES, b"\x00", b"\x00", slot(12, (2,), b"\x01\x00")),
            (1, 1, 1, 1),
            1,
            "labels_mask: present without",
        ),
        (
            (FEATURES, LABELS, slot(12, (2,), b"\x01\x02"), b"\x00"),
            (1, 1, 1, 1),
            1,
            "bytes other than 0 and 1",
        ),
        (
            (FEATURES, slot(7, (3,), b"\x00" * 24), b"\x00", b"\x00"),
            (1, 1, 1, 1),
            1,
            "labels: shape (3,) has 3",
        ),
        ((FEATURES, LABELS[:3] + b"\x07" + LABELS[4:], b"\x00", b"\x00"), (1, 1, 1, 1), 1, "reserved byte 7"),
        ((FEATURES, slot(0, (2,), b""), b"\x00", b"\x00"), (1, 1, 1, 1), 1, "labels: corrupt array header"),
        ((FEATURES, slot(1, (2,) * 33, b""), b"\x00", b"\x00"), (1, 1, 1, 1), 1, "rank 33"),
        ((FEATURES, b"\x00", b"\x00"), (1, 0, 2, 0), 2, "array counts (1, 0, 2, 0)"),
        ((FEATURES, b"\x00"), (1, 0, 1, 0), 2, "features_masks: 1 slots stored, all absent"),
        ((FEATURES, b"\x00"), (1, 1, 0, 0), 2, "labels[0]: absent, but the format requires"),
        (
            (FEATURES, slot(1, (2, 64), b"")),
            (1, 1, 0, 0),
            2,
            "truncated: labels[0] (float32 array of shape (2, 64))",
        ),
    ],
)
def test_structure_rules(version: int, slots: tuple, counts: tuple, kind: int, message: str) -> None:
    cls = DataSet if kind == 1 else MultiDataSet
    blob = record(version, kind, counts, *slots)
    with pytest.raises(CorruptDataError, match=r"^<bytes>: ") as info:
        cls.from_bytes(blob)
    assert message in str(info.value)
    with pytest.raises(CorruptDataError, match=r"^<BytesIO>: "):
        cls.load(io.BytesIO(blob))


def test_every_truncation_names_what_it_cut_alike_from_bytes_and_from_a_stream() -> None:
    """A buffer's reads are slices and their error texts are built only on error: each prefix of a
    record names the field it cut, as the stream reader does, offsets included."""
    blob = DataSet(np.arange(6, dtype=np.float32).reshape(2, 3), np.eye(2, dtype=np.float32)).to_bytes()
    whats = set()
    for cut in range(len(blob)):
        with pytest.raises(CorruptDataError) as from_bytes:
            DataSet.from_bytes(blob[:cut])
        with pytest.raises(CorruptDataError) as from_stream:
            DataSet.load(io.BytesIO(blob[:cut]))
        text = str(from_bytes.value).removeprefix("<bytes>: ")
        assert text == str(from_stream.value).removeprefix("<BytesIO>: ")
        if text.startswith("truncated: "):
            whats.add(text.removeprefix("truncated: ").split(" needs ")[0])
    assert {
        "magic bytes",
        "header",
        "features shape",  # (a cut before it fails the header's count check: the length is known)
        "features (float32 array of shape (2, 3))",
        "labels (float32 array of shape (2, 2))",
        "checksum trailer",
    } <= whats


def test_shape_edit_cannot_drop_arrays() -> None:
    """The issue's example: features (16, 64) edited to (16, 0) once dropped the labels silently."""
    ds = DataSet(np.ones((16, 64), np.float32), np.ones((16, 3), np.float32))
    for blob in (ds.to_bytes(), record(1, 1, (1, 1, 1, 1), *_v1_slots(ds))):
        edited = bytearray(blob)
        edited[28 + 4 + 8 : 28 + 4 + 16] = struct.pack("<Q", 0)
        with pytest.raises(CorruptDataError, match="^<bytes>: "):
            DataSet.from_bytes(bytes(edited))


def _v1_slots(ds: DataSet) -> list[bytes]:
    return [slot(1, a.shape, a.astype("<f4").tobytes()) for a in (ds.features, ds.labels)] + [b"\x00"] * 2


def test_trailing_data_after_a_file_object_record_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "two.bin"
    with open(path, "wb") as f:
        EXPECTED.save(f)
        f.write(b"junk")
    with open(path, "rb") as f, pytest.raises(CorruptDataError, match=rf"^{path}: unexpected data after"):
        DataSet.load(f)
    with open(path, "rb") as f, pytest.raises(CorruptDataError, match=rf"^{path}: truncated: magic bytes"):
        list(DataSet.load_records(f))
    with open(path, "wb") as f:
        for _ in range(3):
            EXPECTED.save(f)
    assert list(DataSet.load_records(path)) == [EXPECTED] * 3
    assert list(DataSet.load_records(io.BytesIO())) == []


def test_bool_arrays_viewing_other_bytes_are_written_as_0_and_1() -> None:
    odd = np.array([0, 1, 2, 255], np.uint8).view(np.bool_)
    restored = DataSet.from_bytes(DataSet(np.zeros((4, 1)), odd).to_bytes())
    assert restored.labels.view(np.uint8).tolist() == [0, 1, 1, 1]


_DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint16", "bool"]


def _arrays(draw, n: int, dtype: str) -> np.ndarray:
    shape = (n, *draw(st.lists(st.integers(0, 3), max_size=3)))
    values = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(-5, 6, shape)
    return (values > 0) if dtype == "bool" else values.astype(dtype)


@st.composite
def _records(draw) -> DataSet | MultiDataSet:
    n = draw(st.integers(0, 3))
    dtype = st.sampled_from(_DTYPES)
    if draw(st.booleans()):
        labels = _arrays(draw, n, draw(dtype)) if draw(st.booleans()) else None
        return DataSet(
            _arrays(draw, n, draw(dtype)),
            labels,
            _arrays(draw, n, draw(dtype)) if draw(st.booleans()) else None,
            _arrays(draw, n, draw(dtype)) if labels is not None and draw(st.booleans()) else None,
        )
    features = [_arrays(draw, n, draw(dtype)) for _ in range(draw(st.integers(1, 3)))]
    labels = [_arrays(draw, n, draw(dtype)) for _ in range(draw(st.integers(0, 2)))]
    masks = [None if draw(st.booleans()) else _arrays(draw, n, draw(dtype)) for _ in features]
    return MultiDataSet(features, labels, masks if any(m is not None for m in masks) else None)


def _same(a: DataSet | MultiDataSet, b: DataSet | MultiDataSet) -> None:
    for group_a, group_b in zip(a._groups, b._groups, strict=True):
        for x, y in zip(group_a, group_b, strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@given(data=_records())
def test_a_whole_buffer_reads_as_the_stream_reader_reads_it(data) -> None:
    """A buffer holding one record is read at its offsets with one checksum (the path every spilled
    partition element takes): the stream reader's arrays, owned and writable, not views of the buffer."""
    cls = type(data)
    buffer = bytearray(data.to_bytes())
    assert fmt._parse_whole(memoryview(buffer), cls._KIND) is not None  # the offsets path read it
    parsed = cls.from_bytes(buffer)
    _same(parsed, cls.load(io.BytesIO(bytes(buffer))))
    _same(parsed, data)
    buffer[:] = bytes(len(buffer))  # the caller reuses its buffer
    _same(parsed, data)
    assert all(a.flags.writeable and a.flags.owndata for g in parsed._groups for a in g if a is not None)


@pytest.mark.parametrize(
    "data",
    [
        DataSet(np.arange(6, dtype=np.float32).reshape(2, 3), np.eye(2), np.ones((2, 3), bool)),
        MultiDataSet(
            [np.ones((2, 3), np.float16), np.arange(2, dtype=np.int32)],
            [np.eye(2)],
            [np.ones((2, 3)), None],
            [np.ones((2, 1), np.uint8)],
        ),
    ],
    ids=["DataSet", "MultiDataSet"],
)
def test_every_changed_byte_is_refused_as_the_stream_reader_refuses_it(data) -> None:
    """Every byte of a record changed (two ways): from bytes the error of the stream reader, which reads
    again each buffer the offsets path declined."""
    cls, blob = type(data), data.to_bytes()
    for at in range(len(blob)):
        for changed in (blob[at] ^ 0xFF, (blob[at] + 1) % 256):
            bad = blob[:at] + bytes([changed]) + blob[at + 1 :]
            with pytest.raises(CorruptDataError) as from_bytes:
                cls.from_bytes(bad)
            with pytest.raises(CorruptDataError) as from_stream:
                cls.load(io.BytesIO(bad))
            assert str(from_bytes.value).removeprefix("<bytes>: ") == str(from_stream.value).removeprefix(
                "<BytesIO>: "
            )
