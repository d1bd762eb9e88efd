"""Evaluation, per-example scores and network outputs of DataFrames from a classic session (the same
code serves Spark Connect sessions: tests/spark/test_connect.py): each against the local network on the
same rows."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import mlp_conf, residual_graph, subset
from pyspark.sql import functions as F

from sparkgrad.nn import ComputationGraph, MultiLayerNetwork
from sparkgrad.spark import SparkComputationGraph, SparkMultiLayer

# float32 results of the same network on the same rows in batches of other sizes: a reduction over 64
# inputs and 128 hidden units, then the loss's log
TOL = 256 * float(np.finfo(np.float32).eps)


def _rows(spark, ds, partitions: int = 1, regression: bool = False):
    labels = ds.labels.tolist() if regression else [int(c) for c in ds.labels.argmax(1)]
    label_type = "array<float>" if regression else "int"
    rows = [(x.tolist(), y) for x, y in zip(ds.features, labels)]
    return spark.createDataFrame(rows, f"features array<float>, label {label_type}").coalesce(partitions)


@pytest.fixture(scope="module")
def trained(digits):
    net = MultiLayerNetwork(mlp_conf(hidden=32)).init()
    net.fit(digits[0].split(32), epochs=3)  # 0.93 test accuracy
    return net


def test_evaluate_of_a_dataframe_is_the_local_evaluation(spark, digits, trained) -> None:
    test = digits[1]
    with SparkMultiLayer(spark, trained) as model:
        got = model.evaluate(_rows(spark, test, partitions=2))
    local = trained.evaluate(test)
    assert got.num_rows() == test.num_examples() == 359
    # the same predictions, up to one near tie that another batch size could round the other way
    assert np.abs(got.confusion_matrix() - local.confusion_matrix()).sum() <= 2
    assert got.accuracy() > 0.5  # trained to 0.93: a label mix-up (chance is 0.1) would show


def test_evaluate_regression_of_a_dataframe_reads_value_labels(spark, digits) -> None:
    net = MultiLayerNetwork(mlp_conf(hidden=32, n_out=10, loss="mse", activation="identity")).init()
    test = subset(digits[1], 100)
    with SparkMultiLayer(spark, net) as model:
        got = model.evaluate_regression(_rows(spark, test, regression=True))
    local = net.evaluate_regression(test)
    for column in range(10):
        assert got.mean_squared_error(column) == pytest.approx(local.mean_squared_error(column), rel=TOL)


def test_score_examples_adds_each_rows_score_in_place(spark, digits, trained) -> None:
    test = subset(digits[1], 150)
    frame = _rows(spark, test).withColumn("row", F.monotonically_increasing_id())
    with SparkMultiLayer(spark, trained) as model:
        scored = model.score_examples(frame, batch_size=32, score_col="loss").collect()
        with pytest.raises(ValueError, match="score_col: column 'label' already exists"):
            model.score_examples(frame, score_col="label")
    assert [r["row"] for r in scored] == list(range(150))  # every other column kept, rows in order
    expected = trained.score_examples(test)
    np.testing.assert_allclose([r["loss"] for r in scored], expected, rtol=TOL, atol=TOL)


def test_output_adds_the_networks_output_vector(spark, digits, trained) -> None:
    test = subset(digits[1], 120)
    with SparkMultiLayer(spark, trained) as model:
        rows = model.output(_rows(spark, test), output_col="probabilities").collect()
    got = np.array([r["probabilities"].toArray() for r in rows])
    np.testing.assert_allclose(got, trained.output(test.features), rtol=TOL, atol=TOL)


def test_a_graph_evaluates_a_dataframe(spark, digits) -> None:
    graph = ComputationGraph(residual_graph(64, 10)).init()
    test = digits[1]
    with SparkComputationGraph(spark, graph) as model:
        got = model.evaluate(_rows(spark, test, partitions=2))
    assert np.abs(got.confusion_matrix() - graph.evaluate(test).confusion_matrix()).sum() <= 2
