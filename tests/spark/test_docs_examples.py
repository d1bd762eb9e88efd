"""The documentation's examples that need Spark run on the test session's local[2] SparkSession (the
examples' ``SparkSession.builder...getOrCreate()`` returns it). Other pages: tests/python/test_docs.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from doc_examples import pages, run_page
from helpers import residual_graph

SPARK_PAGES = [p for p in pages() if p.needs_spark]


def _check_spark_ml(namespace: dict, output: str) -> None:
    from sparkgrad.ml import SparkgradClassificationModel

    assert namespace["accuracy"] > 0.9  # held-out digits; an untrained network scores about 0.1
    assert f"test accuracy {namespace['accuracy']:.4f}" in output
    saved = namespace["reloaded"].stages[-1]
    assert isinstance(saved, SparkgradClassificationModel)
    np.testing.assert_array_equal(saved.network.params(), namespace["network"].params())
    # tests/spark/test_ml.py's test_graph_classifier_in_a_pipeline_learns_digits trains this configuration
    assert namespace["graph"] == residual_graph(64, 10)
    classifier = namespace["classifier"]
    assert classifier.network_configuration() == namespace["graph"]
    assert (classifier.getEpochs(), classifier.getBatchSize()) == (6, 32)


def _save_under(tmp_path) -> dict[str, str]:
    # a relative Hadoop path resolves against the JVM's directory, not the test's: save under tmp_path
    return {'"digits-pipeline"': repr((tmp_path / "digits-pipeline").as_uri())}


def _data_under(tmp_path) -> dict[str, str]:
    # the page's hdfs:// URI: a file: URI here, through the same Hadoop FileSystem API
    return {'"hdfs://namenode:8020/data/digits"': repr((tmp_path / "digits").as_uri())}


def _check_spark_training(namespace: dict, output: str) -> None:
    from sparkgrad.data import DataSet

    assert namespace["written"] == 46 and "46 minibatches" in output
    data = namespace["data"]
    assert DataSet.load(f"{data}/saved/test-0.bin") == namespace["test"].split(120)[0]
    assert namespace["from_paths"].network.epoch_count == 1
    assert namespace["from_files"].network.epoch_count == 2


# page -> (the text to replace in its examples, given tmp_path; a check of the namespace and the output)
CHECKS = {
    "docs/guides/spark-ml.md": (_save_under, _check_spark_ml),
    "docs/guides/spark-training.md": (_data_under, _check_spark_training),
}


def _forget_global_state() -> None:
    """Undo what an example may switch on for the whole process (MLflow autologging, an active run)."""
    if "sparkgrad.mlflow" in sys.modules:
        import mlflow

        import sparkgrad.mlflow

        sparkgrad.mlflow.autolog(disable=True)
        while mlflow.active_run() is not None:
            mlflow.end_run()


@pytest.mark.parametrize("page", SPARK_PAGES, ids=[p.name for p in SPARK_PAGES])
def test_spark_page_examples_run(page, spark, tmp_path, capsys) -> None:
    replace, check = CHECKS.get(page.name, (lambda _: {}, None))
    tracking_uri = None
    if any("mlflow" in example.code for example in page.examples):
        import mlflow

        tracking_uri = mlflow.get_tracking_uri()  # the page sets its own: restored below
    try:
        namespace = run_page(page, tmp_path, replace(tmp_path))
    finally:
        _forget_global_state()
        if tracking_uri is not None:
            sys.modules["mlflow"].set_tracking_uri(tracking_uri)
    if check is not None:
        check(namespace, capsys.readouterr().out)


def test_every_page_with_a_check_exists() -> None:
    assert sorted(set(CHECKS) - {p.name for p in SPARK_PAGES}) == []
