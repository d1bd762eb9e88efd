"""The cluster job of docs/guides/cluster.md under spark-submit (local[2]), with the interpreter named on
its command line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from helpers import spark_submit, submit_output

from sparkgrad.nn import MultiLayerNetwork

JOB = Path(__file__).resolve().parent / "jobs" / "train_digits.py"


def test_spark_submit_runs_the_cluster_job(tmp_path) -> None:
    submit, env = spark_submit()
    model = tmp_path / "digits-mlp.zip"
    result = subprocess.run(
        [
            *submit,
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
    assert result.returncode == 0, submit_output(result)
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("test accuracy")]
    assert len(line) == 1 and line[0].endswith(f"model saved to {model.as_uri()}")
    assert float(line[0].split()[2].rstrip(";")) > 0.5  # 10 classes: chance is 0.1
    assert "Traceback" not in result.stderr
    net = MultiLayerNetwork.load(model)
    assert net.num_params() == 64 * 64 + 64 + 64 * 10 + 10 and net.epoch_count == 2
    assert np.isfinite(net.params()).all()
