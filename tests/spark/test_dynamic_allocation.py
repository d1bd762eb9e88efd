"""With Spark's dynamic allocation on (local mode with Spark's testing switch), every master, both network
types and the estimators train with default options: no barrier stage, which Spark refuses then. A Spark
Connect session, which has no SparkContext, is refused with what to use instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import spark_submit, submit_output

JOB = Path(__file__).resolve().parent / "jobs" / "dynamic_allocation.py"


@pytest.mark.slow
def test_fits_run_with_dynamic_allocation(tmp_path) -> None:
    import subprocess

    submit, env = spark_submit()
    conf = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.testing": "true",  # local mode honours it only with this switch
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.local.dir": str(tmp_path),
    }
    options = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    result = subprocess.run(
        [*submit, *options, str(JOB)], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, submit_output(result)
    assert "SPARK-24942" not in result.stderr.replace("(SPARK-24942)", "")  # logged, never raised
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["dynamic_allocation"] is True
    # a Spark job per epoch instead of one barrier job
    assert got["shared"]["spark_jobs"] == got["graph"]["spark_jobs"] == 3
    assert got["shared"]["epochs"] == got["averaging"]["epochs"] == 3
    # 3 epochs on the digits, 3 runs: shared 0.919-0.928, averaging 0.905, graph 0.939-0.953, classifier
    # 0.922-0.933; chance is 0.1
    for name in ("shared", "averaging", "graph", "classifier"):
        assert got[name]["accuracy"] > 0.85, (name, got)


def test_a_connect_session_is_refused_with_what_to_use_instead() -> None:
    from sparkgrad.errors import EnvironmentNotReadyError
    from sparkgrad.spark.common import spark_context

    # a stand-in from Connect's module (no Connect server here): its sparkContext attribute would raise
    connect_session = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    expected = r"spark: a Spark Connect session .* classic SparkSession"
    with pytest.raises(EnvironmentNotReadyError, match=expected):
        spark_context(connect_session)
    with pytest.raises(TypeError, match="expected a SparkSession or SparkContext, got int"):
        spark_context(3)
