"""SerializedDataSetLoader / SerializedMultiDataSetLoader: paths, bytes, Spark (path, bytes) pairs."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest

from sparkgrad.data import DataSet, MultiDataSet, SerializedDataSetLoader, SerializedMultiDataSetLoader
from sparkgrad.errors import CorruptDataError


@pytest.fixture
def saved(tmp_path: Path) -> tuple[DataSet, MultiDataSet, Path, Path]:
    ds = DataSet(np.arange(6, dtype=np.float32).reshape(3, 2), np.eye(3, dtype=np.float32))
    mds = MultiDataSet([ds.features, ds.labels], [ds.labels], features_masks=[None, np.ones((3, 1))])
    directory = tmp_path / "exported batches"  # a space: Spark's file: URIs percent-encode it
    directory.mkdir()
    ds.save(directory / "dataset_0.bin")
    mds.save(directory / "mds_0.bin")
    return ds, mds, directory / "dataset_0.bin", directory / "mds_0.bin"


def test_loaders_accept_paths_files_bytes_and_spark_pairs(saved: tuple) -> None:
    ds, mds, ds_path, mds_path = saved
    for loader, expected, path in (
        (SerializedDataSetLoader(), ds, ds_path),
        (SerializedMultiDataSetLoader(), mds, mds_path),
    ):
        blob = path.read_bytes()
        assert loader(path) == expected
        assert loader(str(path)) == expected
        assert loader(path.as_uri()) == expected  # file:///.../exported%20batches/...
        assert loader("file:" + str(path)) == expected  # Spark's form: file:/...
        assert loader(io.BytesIO(blob)) == expected
        assert loader(blob) == expected
        assert loader(memoryview(blob)) == expected
        assert loader((path.as_uri(), blob)) == expected
        assert loader.load_bytes(bytearray(blob), source=str(path)) == expected


def test_loader_errors_name_the_source(saved: tuple) -> None:
    _, _, ds_path, mds_path = saved
    blob = ds_path.read_bytes()
    loader = SerializedDataSetLoader()
    with pytest.raises(CorruptDataError, match=r"^hdfs://nn/part-3\.bin: truncated"):
        loader(("hdfs://nn/part-3.bin", blob[:-1]))
    with pytest.raises(CorruptDataError, match=r"^s3://b/k\.bin: truncated"):
        loader.load_bytes(blob[:40], source="s3://b/k.bin")
    with pytest.raises(CorruptDataError, match=rf"^{mds_path}: holds a MultiDataSet, not a DataSet"):
        loader(mds_path)
    with pytest.raises(CorruptDataError, match=r"^<bytes>: holds a DataSet, not a MultiDataSet"):
        SerializedMultiDataSetLoader()(blob)


def test_loaders_pickle_and_compare() -> None:
    for loader in (SerializedDataSetLoader(), SerializedMultiDataSetLoader()):
        clone = pickle.loads(pickle.dumps(loader))
        assert clone == loader and hash(clone) == hash(loader) and type(clone) is type(loader)
        assert repr(clone) == f"{type(loader).__name__}()"
    assert SerializedDataSetLoader() != SerializedMultiDataSetLoader()
