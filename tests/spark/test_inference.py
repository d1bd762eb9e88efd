"""Distributed evaluation, scoring and keyed inference equal their local counterparts."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    ambiguous_argmax,
    auc_bound,
    dense_logit_error_bound,
    gamma,
    local_network,
    mlp_conf,
    softmax_output_bound,
    softmax_xent_score_bound,
)

from sparkgrad.data import DataSet
from sparkgrad.eval import ROC, Evaluation, RegressionEvaluation, ROCMultiClass
from sparkgrad.nn import MultiLayerNetwork
from sparkgrad.spark import SparkMultiLayer


@pytest.fixture(scope="module")
def model(spark, digits):
    net = local_network(digits[0])
    return SparkMultiLayer(spark, net)


@pytest.fixture(scope="module")
def test_rdd(spark, digits):
    return spark.sparkContext.parallelize(digits[1].split(7), 3)


def _assert_same_classification(dist: Evaluation, local: Evaluation, net, data: DataSet) -> None:
    """Equal confusion matrices, except for examples whose argmax float32 rounding may flip."""
    z, z_err = dense_logit_error_bound(net, data.features)
    flippable = int(ambiguous_argmax(z, z_err).sum())
    assert dist.confusion_matrix().sum() == local.confusion_matrix().sum() == data.num_examples()
    assert np.abs(dist.confusion_matrix() - local.confusion_matrix()).sum() <= 2 * flippable
    assert abs(dist.accuracy() - local.accuracy()) <= flippable / data.num_examples()


def test_distributed_evaluation_equals_local(model, digits, test_rdd) -> None:
    local = model.network.evaluate(digits[1])
    dist = model.evaluate(test_rdd, eval_num_workers=2, eval_batch_size=13)
    _assert_same_classification(dist, local, model.network, digits[1])
    named = model.evaluate(test_rdd, labels_list=[str(i) for i in range(10)])
    _assert_same_classification(named, local, model.network, digits[1])


def _mse_bound(p: np.ndarray, p_err: np.ndarray, y: np.ndarray) -> float:
    """|change of the mean squared error over all columns| when outputs move by <= p_err:
    |(p + d - y)^2 - (p - y)^2| <= (2 |p - y| + p_err) p_err per element."""
    return float(((2 * np.abs(p - y) + p_err) * p_err).mean())


def test_do_evaluation_several_in_one_pass(model, digits, test_rdd) -> None:
    test = digits[1]
    net = model.network
    model.default_evaluation_workers = 3
    ev, roc, reg = model.do_evaluation(
        test_rdd, None, 5, Evaluation(), ROCMultiClass(), RegressionEvaluation()
    )
    local_ev, local_roc, local_reg = net.do_evaluation(
        test, Evaluation(), ROCMultiClass(), RegressionEvaluation()
    )
    # other batch shapes than the local pass: compare within the float32 rounding bounds (helpers)
    z, z_err = dense_logit_error_bound(net, test.features)
    p, p_err = net.output(test.features).astype(np.float64), softmax_output_bound(z, z_err)
    labels = test.labels.astype(bool)
    auc_tol = np.mean([auc_bound(p[:, k], p_err[:, k], labels[:, k]) for k in range(labels.shape[1])])
    mse_tol = _mse_bound(p, p_err, test.labels)
    _assert_same_classification(ev, local_ev, net, test)
    assert abs(roc.calculate_average_auc() - local_roc.calculate_average_auc()) <= auc_tol
    assert abs(reg.average_mean_squared_error() - local_reg.average_mean_squared_error()) <= mse_tol
    roc2 = model.evaluate_roc_multi_class(test_rdd)
    assert abs(roc2.calculate_average_auc() - local_roc.calculate_average_auc()) <= auc_tol
    reg2 = model.evaluate_regression(test_rdd)
    assert abs(reg2.average_mean_squared_error() - local_reg.average_mean_squared_error()) <= mse_tol


def test_binary_roc_equals_local(spark, digits) -> None:
    net = MultiLayerNetwork(mlp_conf(hidden=8, n_out=2)).init()
    test = digits[1]
    labels = np.eye(2, dtype=np.float32)[(test.labels.argmax(1) % 2)]
    data = DataSet(test.features, labels)
    sm = SparkMultiLayer(spark, net)
    dist = sm.evaluate_roc(spark.sparkContext.parallelize(data.split(9), 2), eval_batch_size=4)
    local = net.evaluate_roc(data)
    z, z_err = dense_logit_error_bound(net, data.features)
    p_err = softmax_output_bound(z, z_err)[:, 1]
    p = net.output(data.features)[:, 1].astype(np.float64)
    assert abs(dist.calculate_auc() - local.calculate_auc()) <= auc_bound(p, p_err, labels[:, 1] == 1)
    assert isinstance(dist, ROC)


def test_evaluate_path_with_loader(model, digits, tmp_path) -> None:
    for i, part in enumerate(digits[1].split(100)):
        part.save(str(tmp_path / f"part{i}.bin"))
    dist = model.evaluate(str(tmp_path))
    _assert_same_classification(dist, model.network.evaluate(digits[1]), model.network, digits[1])


def test_calculate_score_and_score_examples_match_local(model, digits, spark) -> None:
    test = digits[1]
    rdd = spark.sparkContext.parallelize(test.split(11), 3)
    net = model.network
    # Spark scores batches of other shapes than the local call, so BLAS sums in another order: compare
    # against the float32 rounding bound of each example's score (see helpers.dense_logit_error_bound).
    z, z_err = dense_logit_error_bound(net, test.features)
    bound = softmax_xent_score_bound(z, z_err, test.labels.astype(np.float64))
    local = net.score_examples(test)
    assert net._penalty() == 0.0  # mlp_conf has no l1/l2: regularized scores equal the plain ones

    scores = np.array(model.score_examples(rdd, batch_size=10).collect())
    assert np.all(np.abs(scores - local) <= bound)
    reg = np.array(model.score_examples(rdd, include_regularization_terms=True).collect())
    assert np.all(np.abs(reg - net.score_examples(test, True)) <= bound)
    pairs = spark.sparkContext.parallelize(
        [(f"k{i}", test[i : i + 1]) for i in range(test.num_examples())], 4
    )
    keyed = dict(model.score_examples_with_key(pairs, batch_size=9).collect())
    assert len(keyed) == test.num_examples()
    keyed_scores = np.array([keyed[f"k{i}"] for i in range(test.num_examples())])
    assert np.all(np.abs(keyed_scores - local) <= bound)

    # Means and sums of the per-example scores: the example errors add up; the float64 sums on top
    # (n roundings each, on both sides) cost gamma64(n) * sum|s| twice.
    n = test.num_examples()
    sum_bound = bound.sum() + 2 * gamma(n, float(np.finfo(np.float64).eps) / 2) * np.abs(local).sum()
    mean = model.calculate_score(rdd, minibatch_size=17)
    assert abs(mean - net.score(test)) <= sum_bound / n
    total = model.calculate_score(rdd, average=False)
    assert abs(total - net.score(test) * n) <= sum_bound


def test_feed_forward_with_key_keeps_every_key(model, digits, spark) -> None:
    x = digits[1].features
    net = model.network
    expected = net.output(x)
    # softmax outputs of other batch shapes: within the float32 rounding bound of each output
    z, z_err = dense_logit_error_bound(net, x)
    bound = softmax_output_bound(z, z_err)
    values = []
    for i in range(60):  # masked (features, mask) values: tests/spark/test_recurrent.py
        if i % 2 == 0:
            values.append((("single", i), x[i]))
        else:
            values.append((("batch", i), x[i : i + 4]))
    out = dict(model.feed_forward_with_key(spark.sparkContext.parallelize(values, 3), batch_size=8).collect())
    assert set(out) == {k for k, _ in values}
    for (kind, i), y in out.items():
        rows = slice(i, i + 4) if kind == "batch" else i
        assert y.shape == expected[rows].shape
        assert np.all(np.abs(y - expected[rows]) <= bound[rows])


def test_inference_input_errors_are_clear(model, spark) -> None:
    bad = spark.sparkContext.parallelize([("a", np.zeros((2, 3, 4), np.float32))], 1)

    with pytest.raises(Exception, match="pair_rdd"):
        model.feed_forward_with_key(bad).collect()
    with pytest.raises(TypeError, match="RDD"):
        model.evaluate([1, 2, 3])
    with pytest.raises(ValueError, match="eval_num_workers"):
        model.do_evaluation(spark.sparkContext.parallelize([], 1), 0, None, Evaluation())
    with pytest.raises(ValueError, match="empty"):
        model.do_evaluation(spark.sparkContext.parallelize([], 1), 1, None, Evaluation())
