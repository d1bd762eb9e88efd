"""The local SparkSession of the Spark benchmarks: no UI, no console progress bar, the driver on the loopback
interface (nothing leaves 127.0.0.1), Spark's own log at ERROR."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(master: str, conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on ``master`` (``local[N]``) whose Python workers run this interpreter, with the
    settings ``conf`` (e.g. ``spark.driver.memory``, which takes effect only in a fresh process)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config(map=conf or {})
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
