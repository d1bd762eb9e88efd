"""Models, stats reports and evaluations on Hadoop file systems, through the driver JVM's FileSystem."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from helpers import local_network, subset

import sparkgrad._io as sio
from sparkgrad.errors import CorruptDataError
from sparkgrad.eval import Evaluation, RegressionEvaluation
from sparkgrad.nn import MultiLayerNetwork
from sparkgrad.spark.stats import SparkTrainingStats, event, now_ms


@pytest.fixture
def net(digits) -> MultiLayerNetwork:
    return local_network(subset(digits[0], 256), epochs=1)


def test_model_round_trips_through_a_file_uri(spark, net, tmp_path) -> None:
    uri = (tmp_path / "model.zip").as_uri()  # file:///...
    net.save(uri)
    # Hadoop's LocalFileSystem wrote it: the file is there, with the checksum file Hadoop keeps beside it
    assert (tmp_path / "model.zip").is_file() and (tmp_path / ".model.zip.crc").is_file()
    loaded = MultiLayerNetwork.load(uri)
    np.testing.assert_array_equal(loaded.params(), net.params())
    np.testing.assert_array_equal(loaded.updater_state(), net.updater_state())
    assert (loaded.iteration_count, loaded.epoch_count) == (net.iteration_count, net.epoch_count)
    # the bytes equal those of a plain local save
    net.save(tmp_path / "plain.zip")
    assert (tmp_path / "model.zip").read_bytes() == (tmp_path / "plain.zip").read_bytes()


def test_large_files_cross_py4j_in_many_chunks(spark, net, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sio, "CHUNK_BYTES", 4096)
    uri = f"file:{tmp_path}/chunked.zip"  # Hadoop's own spelling of a local path
    net.save(uri)
    size = (tmp_path / "chunked.zip").stat().st_size
    assert size > 10 * 4096
    np.testing.assert_array_equal(MultiLayerNetwork.load(uri).params(), net.params())
    data = bytes(range(256)) * 100 + b"tail"  # not a multiple of the chunk size
    sio.write_bytes(f"file:{tmp_path}/raw.bin", data)
    assert sio.read_bytes(f"file:{tmp_path}/raw.bin") == data == (tmp_path / "raw.bin").read_bytes()


def test_relative_paths_stay_local(spark, net, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    net.save("relative.zip")
    assert (tmp_path / "relative.zip").is_file() and not (tmp_path / ".relative.zip.crc").exists()
    np.testing.assert_array_equal(MultiLayerNetwork.load("relative.zip").params(), net.params())


def test_damaged_remote_model_raises_corrupt_data_error(spark, net, tmp_path) -> None:
    buffer = io.BytesIO()
    net.save(buffer)
    good = buffer.getvalue()
    uri = (tmp_path / "damaged.zip").as_uri()
    sio.write_bytes(uri, good[: len(good) // 2])  # written through Hadoop: its checksum is consistent
    with pytest.raises(CorruptDataError, match="damaged.zip"):
        MultiLayerNetwork.load(uri)
    # a byte flipped behind Hadoop's back: its checksum catches it before the zip layer sees the bytes
    uri = (tmp_path / "flipped.zip").as_uri()
    sio.write_bytes(uri, good)
    raw = bytearray((tmp_path / "flipped.zip").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "flipped.zip").write_bytes(bytes(raw))
    with pytest.raises(CorruptDataError, match="flipped.zip.*Checksum"):
        MultiLayerNetwork.load(uri)
    with zipfile.ZipFile(io.BytesIO(good)) as zf:  # the saved model itself was a valid archive
        assert zf.testzip() is None


def test_missing_and_unsupported_uris_name_the_path(spark, tmp_path) -> None:
    missing = (tmp_path / "missing.zip").as_uri()
    with pytest.raises(FileNotFoundError, match="missing.zip"):
        MultiLayerNetwork.load(missing)
    with pytest.raises(OSError, match="nosuchfs://host/m.zip"):
        MultiLayerNetwork.load("nosuchfs://host/m.zip")


def test_stats_report_and_evaluations_on_file_uris(spark, net, digits, tmp_path) -> None:
    stats = SparkTrainingStats()
    stats.add("fit_ms", event(now_ms() - 12.5))
    uri = (tmp_path / "report.html").as_uri()
    stats.export_html(uri)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html>") and "fit_ms" in page

    test = subset(digits[1], 200)
    ev = net.evaluate(test)
    ev.save((tmp_path / "eval.json").as_uri())
    back = Evaluation.load((tmp_path / "eval.json").as_uri())
    np.testing.assert_array_equal(back.confusion_matrix(), ev.confusion_matrix())
    assert back.accuracy() == ev.accuracy()
    with pytest.raises(CorruptDataError, match="eval.json: not a saved RegressionEvaluation"):
        RegressionEvaluation.load((tmp_path / "eval.json").as_uri())
