"""One local[2] Spark session for the whole test session, plus shared data and network fixtures."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from prerequisites import require_java

# tests/spark/helpers.py: `from helpers import ...` in the test modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).resolve().parent:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """local[2] SparkSession: UI off, temp dirs, this interpreter for the Python workers."""
    require_java()
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="sparkgrad-spark-tests-")
    here = Path(__file__).resolve().parent
    import sparkgrad

    # Executors unpickle test helpers (hooks, loaders) by module name, and must import the very
    # sparkgrad the driver imported (the installed package in CI, the source tree in development).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(Path(sparkgrad.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkgrad-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.local.dir", tmp)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.hadoop.hadoop.tmp.dir", os.path.join(tmp, "hadoop"))
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def digits():
    """(train, test) DataSets of scikit-learn's digits, flat features."""
    from sparkgrad.datasets import load_digits

    return load_digits(test_fraction=0.2, seed=0, shape="flat")


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
