"""sparkgrad._io without Spark: plain paths and file: URIs are local, other schemes need a Spark session."""

from __future__ import annotations

import pytest

import sparkgrad._io as sio
from sparkgrad.errors import EnvironmentNotReadyError


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Spark session another test module started must not route these paths through Hadoop
    monkeypatch.setattr(sio, "_spark_context", lambda: None)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("model.zip", False),
        ("/data/model.zip", False),
        ("C:\\models\\model.zip", False),
        ("hdfs://namenode:8020/m.zip", True),
        ("s3a://bucket/m.zip", True),
        ("file:///tmp/m.zip", True),
        ("file:/tmp/m.zip", True),
    ],
)
def test_is_uri(path: str, expected: bool) -> None:
    assert sio.is_uri(path) is expected


def test_local_paths_and_file_uris_work_without_spark(tmp_path, monkeypatch) -> None:
    data = b"\x00sparkgrad\xff" * 3
    sio.write_bytes(tmp_path / "a.bin", data)
    assert sio.read_bytes((tmp_path / "a.bin").as_uri()) == data
    sio.write_bytes(f"file:{tmp_path}/b.bin", data)
    assert (tmp_path / "b.bin").read_bytes() == data
    monkeypatch.chdir(tmp_path)
    sio.write_text("c.txt", "héllo")
    assert sio.read_text("c.txt") == "héllo" == (tmp_path / "c.txt").read_text(encoding="utf-8")
    with sio.open_output(tmp_path / "d.bin") as f:
        f.write(data)
    with sio.open_input((tmp_path / "d.bin").as_uri()) as f:
        assert f.read() == data


def test_remote_schemes_need_a_spark_session() -> None:
    with pytest.raises(EnvironmentNotReadyError, match="hdfs://nn/m.zip: .*needs an active SparkSession"):
        sio.read_bytes("hdfs://nn/m.zip")
    with pytest.raises(EnvironmentNotReadyError, match="s3a://b/m.zip"):
        sio.write_bytes("s3a://b/m.zip", b"x")


def test_file_uri_on_another_host_is_rejected() -> None:
    with pytest.raises(ValueError, match="names the host 'otherhost'"):
        sio.read_bytes("file://otherhost/tmp/m.zip")


def test_bad_path_type() -> None:
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike, got int"):
        sio.read_bytes(3)  # type: ignore[arg-type]
