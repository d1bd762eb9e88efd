"""What a user's console shows, in a fresh process as a user runs it: the demo prints no traceback
(the issue saw two BrokenPipeError tracebacks from PySpark's worker daemon on every successful run),
and a failure inside a task prints its one-line Python cause, not Spark's Java stack traces."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import sparkgrad
from prerequisites import require_java

# a Java stack frame as log4j / Py4J print them ("\tat org.apache.spark...")
_JAVA_FRAME = re.compile(r"^\s+at [\w$.]+\(", re.MULTILINE)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    require_java()
    env = dict(os.environ)
    # the source tree in development (the installed package in CI), as the driver imports it here
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(sparkgrad.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    )
    env.pop("PYSPARK_PYTHON", None)  # sparkgrad picks the driver's interpreter for a local master
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_prints_no_traceback(tmp_path) -> None:
    pytest.importorskip("sklearn")
    result = _run(
        ["-m", "sparkgrad.cli", "demo", "--epochs", "1", "--port", str(_free_port()), "--output", "out"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert re.search(r"^test accuracy\s+\d\.\d{4} after 1 epochs", result.stdout, re.MULTILINE)
    assert (tmp_path / "out" / "model.zip").stat().st_size > 0
    # sparkgrad's own progress line reported the epoch while the job ran
    assert re.search(r"sparkgrad INFO epoch 1/1 \| \d+/\d+ minibatches", result.stderr)


_FAILING_JOB = """
import numpy as np
from pyspark.sql import SparkSession
from helpers import mlp_conf
from sparkgrad.data import DataSet
from sparkgrad.spark import ParameterAveragingTrainingMaster, SparkMultiLayer

def loader(path):  # the first file is fine (the driver reads it to check shapes), the second is not
    if path == "part-1.bin":
        raise ValueError(f"cannot parse {path}: bad magic")
    return DataSet(np.zeros((4, 64), np.float32), np.eye(10, dtype=np.float32)[[0, 1, 2, 3]])

spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
master = ParameterAveragingTrainingMaster(batch_size_per_worker=4, num_workers=2)
paths = spark.sparkContext.parallelize(["part-0.bin", "part-1.bin"], 2)
with SparkMultiLayer(spark, mlp_conf(hidden=4), master) as model:
    model.fit_paths(paths, loader=loader)
"""


def test_a_failing_task_prints_its_python_cause_and_no_java_trace(tmp_path) -> None:
    job = tmp_path / "job.py"
    job.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n" + _FAILING_JOB,
        encoding="utf-8",
    )
    result = _run([str(job)], tmp_path)
    assert result.returncode == 1
    err = result.stderr
    cause = "ValueError: cannot parse part-1.bin: bad magic"
    # the script's traceback ends in the TrainingError whose first line is the executor's cause
    assert re.search(r"^sparkgrad\.errors\.TrainingError: " + cause, err, re.MULTILINE), err[-4000:]
    assert _JAVA_FRAME.search(err) is None, err[-4000:]
    assert "Py4JJavaError" not in err and "BrokenPipeError" not in err
    # nothing but the driver's own traceback: no task's Python trace logged by Spark before it
    assert err.count("Traceback (most recent call last)") == 1, err[-4000:]
