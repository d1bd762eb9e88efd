"""DataSet / MultiDataSet files without Spark: atomic replacement, URIs that need a Spark session, and the
driver-side pieces of sparkgrad.spark.storage (path lists, SequenceFile headers, the export manifest)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import sparkgrad._io as sio
from sparkgrad.data import (
    DataSet,
    MultiDataSet,
    SerializedDataSetLoader,
    SerializedMultiDataSetLoader,
    read_nd4j_dataset,
)
from sparkgrad.data import serialization as fmt
from sparkgrad.errors import CorruptDataError, EnvironmentNotReadyError
from sparkgrad.spark import storage


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Spark session another test module started must not route these paths through Hadoop
    monkeypatch.setattr(sio, "_spark_context", lambda: None)


def _dataset(n: int, offset: float = 0.0) -> DataSet:
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + offset
    return DataSet(x, np.eye(2, dtype=np.float32)[np.arange(n) % 2])


def _multi(n: int) -> MultiDataSet:
    ds = _dataset(n)
    return MultiDataSet([ds.features, ds.features * 2], [ds.labels], features_masks=[None, np.ones((n, 1))])


def _fail_half_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record write stops with an OSError after writing half of the record's bytes."""

    def write_record(stream, kind, groups) -> None:
        data = b"".join(bytes(p) for p in fmt._pieces(kind, groups))
        stream.write(data[: len(data) // 2])
        raise OSError("No space left on device (simulated)")

    monkeypatch.setattr(fmt, "write_record", write_record)


def test_save_replaces_the_file_and_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "batch.bin"
    _dataset(4).save(path)
    os.chmod(path, 0o640)
    _dataset(6, offset=100.0).save(str(path))
    assert DataSet.load(path) == _dataset(6, offset=100.0)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.bin"]  # no temporary file left


@pytest.mark.parametrize("make", [_dataset, _multi], ids=["DataSet", "MultiDataSet"])
def test_a_failed_save_keeps_the_previous_file(tmp_path: Path, monkeypatch, make) -> None:
    path = tmp_path / "batch.bin"
    make(4).save(path)
    before = path.read_bytes()
    _fail_half_way(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        make(9).save(path)
    assert path.read_bytes() == before
    assert type(make(4)).load(path) == make(4)
    with pytest.raises(OSError, match="simulated"):
        make(9).save(tmp_path / "new.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.bin"]  # no partial or temporary file


def test_save_errors_name_the_path(tmp_path: Path) -> None:
    (tmp_path / "a directory").mkdir()
    with pytest.raises(IsADirectoryError, match="a directory: is a directory"):
        _dataset(2).save(tmp_path / "a directory")
    with pytest.raises(FileNotFoundError, match=r"missing/x\.bin: the directory .*missing does not exist"):
        _dataset(2).save(tmp_path / "missing" / "x.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a directory"]
    assert list((tmp_path / "a directory").iterdir()) == []


def test_save_through_a_symbolic_link_replaces_the_linked_file(tmp_path: Path) -> None:
    (tmp_path / "real.bin").write_bytes(b"old")
    (tmp_path / "link.bin").symlink_to(tmp_path / "real.bin")
    _dataset(3).save(tmp_path / "link.bin")
    assert (tmp_path / "link.bin").is_symlink()
    assert DataSet.load(tmp_path / "real.bin") == _dataset(3)


def test_file_uris_work_without_spark_and_other_schemes_say_what_to_use(tmp_path: Path) -> None:
    _dataset(3).save((tmp_path / "a.bin").as_uri())
    assert DataSet.load(f"file:{tmp_path}/a.bin") == _dataset(3)
    _multi(2).save(f"file:{tmp_path}/m.bin")
    assert SerializedMultiDataSetLoader()((tmp_path / "m.bin").as_uri()) == _multi(2)
    hint = ".*needs an active SparkSession.*In a Spark task.*fit\\(directory\\).*export_minibatches"
    with pytest.raises(EnvironmentNotReadyError, match="hdfs://nn/x.bin: " + hint):
        _dataset(2).save("hdfs://nn/x.bin")
    with pytest.raises(EnvironmentNotReadyError, match="s3a://bucket/x.bin: " + hint):
        DataSet.load("s3a://bucket/x.bin")
    with pytest.raises(EnvironmentNotReadyError, match="abfs://c@a.dfs.core.windows.net/x.bin"):
        SerializedDataSetLoader()("abfs://c@a.dfs.core.windows.net/x.bin")
    with pytest.raises(EnvironmentNotReadyError, match="gs://bucket/x.bin"):
        list(MultiDataSet.load_records("gs://bucket/x.bin"))
    with pytest.raises(EnvironmentNotReadyError, match="hdfs://nn/dl4j.bin"):
        read_nd4j_dataset("hdfs://nn/dl4j.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "m.bin"]


# -- hadoop_replace: the rename protocol, on a file system that can refuse ---------------------------------
class _Path:
    def __init__(self, parent: str, name: str | None = None) -> None:
        self.text = parent if name is None else f"{parent}/{name}"

    def getParent(self) -> str:  # noqa: N802 - the Java method's name
        return self.text.rsplit("/", 1)[0]

    def getName(self) -> str:  # noqa: N802
        return self.text.rsplit("/", 1)[1]

    def toString(self) -> str:  # noqa: N802
        return self.text


class _FileSystem:
    """Files as a dict; ``refuse`` names renames (by source) that return False, ``fail`` ones that raise."""

    def __init__(self, files: dict[str, bytes], refuse=(), fail=()) -> None:
        self.files, self.refuse, self.fail = files, set(refuse), set(fail)

    def exists(self, p: _Path) -> bool:
        return p.text in self.files

    def rename(self, src: _Path, dst: _Path) -> bool:
        if src.text in self.fail:
            raise RuntimeError(f"rename of {src.text} failed")
        if src.text in self.refuse or src.text not in self.files or dst.text in self.files:
            return False
        self.files[dst.text] = self.files.pop(src.text)
        return True

    def delete(self, p: _Path, recursive: bool) -> bool:
        return self.files.pop(p.text, None) is not None


_SC = SimpleNamespace(_jvm=SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(
    hadoop=SimpleNamespace(fs=SimpleNamespace(Path=_Path))))))  # fmt: skip


def test_hadoop_replace_moves_the_new_file_in_and_the_previous_one_away() -> None:
    fs = _FileSystem({"d/new": b"new"})
    sio.hadoop_replace(_SC, fs, _Path("d/new"), _Path("d/t"), "d/t")
    assert fs.files == {"d/t": b"new"}
    fs = _FileSystem({"d/new": b"new", "d/t": b"old"})
    sio.hadoop_replace(_SC, fs, _Path("d/new"), _Path("d/t"), "d/t")
    assert fs.files == {"d/t": b"new"}  # the backup was deleted once the new file had the name


def test_hadoop_replace_never_loses_the_previous_file() -> None:
    fs = _FileSystem({"d/new": b"new", "d/t": b"old"}, refuse={"d/new"})
    with pytest.raises(OSError, match="d/t: .*refused.*previous file is unchanged"):
        sio.hadoop_replace(_SC, fs, _Path("d/new"), _Path("d/t"), "d/t")
    assert fs.files["d/t"] == b"old" and fs.files["d/new"] == b"new" and len(fs.files) == 2
    fs = _FileSystem({"d/new": b"new", "d/t": b"old"}, fail={"d/new"})
    with pytest.raises(RuntimeError, match="rename of d/new failed"):
        sio.hadoop_replace(_SC, fs, _Path("d/new"), _Path("d/t"), "d/t")
    assert fs.files["d/t"] == b"old" and len(fs.files) == 2

    class NoWayBack(_FileSystem):
        def rename(self, src: _Path, dst: _Path) -> bool:
            return False if src.text.endswith(".old") else super().rename(src, dst)

    # neither the new file nor the backup can take the name: the backup is kept, and named
    fs = NoWayBack({"d/new": b"new", "d/t": b"old"}, refuse={"d/new"})
    with pytest.raises(OSError, match=r"previous file back from d/\.t\.sparkgrad-[0-9a-f]{32}\.old, where"):
        sio.hadoop_replace(_SC, fs, _Path("d/new"), _Path("d/t"), "d/t")
    (backup,) = [name for name in fs.files if name.endswith(".old")]
    assert fs.files[backup] == b"old"


# -- storage: driver-side parsing -----------------------------------------------------------------------
def test_path_lists_split_like_hadoop() -> None:
    assert storage._split_paths("hdfs://nn/a,s3a://b/c") == ["hdfs://nn/a", "s3a://b/c"]
    assert storage._split_paths("/data/{train,test}/part-*") == ["/data/{train,test}/part-*"]
    assert storage._split_paths("/a/{x,{y,z}},/b") == ["/a/{x,{y,z}}", "/b"]
    with pytest.raises(ValueError, match="'/a,,/b' holds an empty path"):
        storage._split_paths("/a,,/b")
    assert storage._escape_glob("/d/b[1]{x}*?.bin") == "/d/b\\[1\\]\\{x\\}\\*\\?.bin"
    assert storage._escape_glob("/d/plain, name.bin") == "/d/plain, name.bin"


def _sequence_header(key: str, value: str) -> bytes:
    def text(s: str) -> bytes:
        data = s.encode()
        return bytes([len(data)]) + data

    return b"SEQ\x06" + text(key) + text(value) + b"\x00\x00"


def test_sequence_file_headers_are_checked() -> None:
    storage._check_record_classes(_sequence_header(*storage._RECORD_CLASSES), "x/part-00000")
    with pytest.raises(ValueError, match=r"x/part-00000: a SequenceFile of \(org.apache.hadoop.io.Text, "):
        storage._check_record_classes(
            _sequence_header("org.apache.hadoop.io.Text", "org.apache.hadoop.io.Text"), "x/part-00000"
        )
    with pytest.raises(CorruptDataError, match="x/part-00000: a damaged SequenceFile header"):
        storage._check_record_classes(_sequence_header(*storage._RECORD_CLASSES)[:20], "x/part-00000")
    # WritableUtils.writeVInt: one byte from -112 to 127, else a length byte and big-endian bytes
    assert storage._read_vint(bytes([0x7F]), 0) == (127, 1)
    assert storage._read_vint(bytes([0x8E, 0x01, 0x2C]), 0) == (300, 3)  # -114: 2 bytes follow
    assert storage._read_vint(bytes([0x86, 0x01, 0x2B]), 0) == (-300, 3)  # -122: negative, 2 bytes
    with pytest.raises(IndexError):
        storage._read_vint(bytes([0x8E, 0x01]), 0)


def test_manifest_is_validated() -> None:
    good = {"format": storage.FORMAT, "version": 1, "batch_size": 4, "minibatches": 2, "examples": 7}
    good["files"] = {"part-00000": 120}
    assert storage._manifest(json.dumps(good).encode(), "m.json") == good
    for damaged, message in [
        (b"\xff{", "m.json: not valid JSON"),
        (b"[1]", "m.json: not a manifest of export_minibatches"),
        (
            json.dumps({**good, "version": 2}).encode(),
            "m.json: manifest version 2, this sparkgrad reads version 1",
        ),
        (json.dumps({**good, "files": {"part-00000": -1}}).encode(), "m.json: a damaged manifest"),
        (json.dumps({**good, "minibatches": "2"}).encode(), "m.json: a damaged manifest"),
    ]:
        with pytest.raises(CorruptDataError, match=message.replace("(", r"\(")):
            storage._manifest(damaged, "m.json")
