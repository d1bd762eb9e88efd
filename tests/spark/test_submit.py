"""The cluster job of docs/guides/cluster.md under spark-submit (local[2]), with the interpreter named on
its command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sparkgrad
from sparkgrad.nn import MultiLayerNetwork

JOB = Path(__file__).resolve().parent / "jobs" / "train_digits.py"


def _spark_submit() -> str | None:
    here = Path(sys.executable).parent / "spark-submit"  # pip's pyspark installs it beside the interpreter
    return str(here) if here.exists() else shutil.which("spark-submit")


def test_spark_submit_runs_the_cluster_job(tmp_path) -> None:
    pytest.importorskip("pyspark")
    submit = _spark_submit()
    if submit is None or not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("spark-submit and Java are needed")
    env = dict(os.environ)
    # the source tree in development (the installed package in CI): what the driver imports here
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(sparkgrad.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    )
    import pyspark

    env["SPARK_HOME"] = str(Path(pyspark.__file__).resolve().parent)  # pip's pyspark is a Spark home
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    model = tmp_path / "digits-mlp.zip"
    result = subprocess.run(
        [
            submit,
            "--master",
            "local[2]",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.local.dir={tmp_path}",
            str(JOB),
            model.as_uri(),
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("test accuracy")]
    assert len(line) == 1 and line[0].endswith(f"model saved to {model.as_uri()}")
    assert float(line[0].split()[2].rstrip(";")) > 0.5  # 10 classes: chance is 0.1
    assert "Traceback" not in result.stderr
    net = MultiLayerNetwork.load(model)
    assert net.num_params() == 64 * 64 + 64 + 64 * 10 + 10 and net.epoch_count == 2
    assert np.isfinite(net.params()).all()
