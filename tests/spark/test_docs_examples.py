"""The documentation's examples that need Spark run on the test session's local[2] SparkSession (the
examples' ``SparkSession.builder...getOrCreate()`` returns it). Other pages: tests/python/test_docs.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from doc_examples import pages, run_page
from helpers import ambiguous_argmax, dense_logit_error_bound, residual_graph

SPARK_PAGES = [p for p in pages() if p.needs_spark]


# Accuracy bounds: each example run with its network seed replaced by 4-5 others (and, on Spark, the
# workers' timing varying run to run); each bound sits below the lowest by about the measured spread.


def _check_spark_ml(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.ml import SparkgradClassificationModel

    # held-out digits, seeds 42, 1-4: 0.950-0.961 (an untrained network scores about 0.1)
    assert namespace["accuracy"] > 0.93
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


def _check_spark_training(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.data import DataSet

    test, network = namespace["test"], namespace["model"].network
    # the callback stops the fit at 0.97 test accuracy, else it runs 20 epochs; one line per epoch
    reported = [m["accuracy"] for _, m in sorted(namespace["model"].training_stats.epoch_metrics().items())]
    assert len(reported) == network.epoch_count == output.count(": test accuracy ")
    assert all(a < 0.97 for a in reported[:-1])
    assert network.epoch_count == 20 or reported[-1] >= 0.97
    # seeds 42, 1-4: all ran 20 epochs (best epoch 0.964-0.969), final 0.961-0.967, macro AUC
    # 0.9986-0.9988; ParameterAveraging's 2 epochs 0.894-0.908 (batch 16) and 0.877-0.891 (from files)
    evaluation = namespace["evaluation"]
    assert evaluation.accuracy() > 0.94
    assert network.evaluate_roc_multi_class(test).calculate_average_auc() > 0.995
    assert namespace["averaged"].network.evaluate(test).accuracy() > 0.87
    assert namespace["from_files"].network.evaluate(test).accuracy() > 0.85
    assert namespace["averaging"].last_retries == {"retried_tasks": 0, "retrained_minibatches": 0}
    # the distributed evaluation counts what a local one counts, but for argmax ties float32 may flip
    local = network.evaluate(test)
    z, z_err = dense_logit_error_bound(network, test.features)
    flippable = int(ambiguous_argmax(z, z_err).sum())
    assert evaluation.confusion_matrix().sum() == local.confusion_matrix().sum() == len(test)
    assert np.abs(evaluation.confusion_matrix() - local.confusion_matrix()).sum() <= 2 * flippable
    assert "(10,)\n" in output and len(namespace["per_example"]) == 3  # probabilities; a score per example
    # the DataFrame forms: the same evaluation (up to the flippable ties), a score and an output per row
    frame_accuracy = float(output.split("(10,)\n", 1)[1].splitlines()[0])
    assert abs(frame_accuracy - local.accuracy()) <= flippable / len(test) + 1e-12
    assert namespace["scored"].count() == len(test) and "score" in namespace["scored"].columns
    assert len(namespace["outputs"].first()["output"]) == 10
    assert (tmp_path / "training-stats.html").stat().st_size > 0
    np.testing.assert_array_equal(namespace["restored"].params(), network.params())
    assert namespace["written"] == 46 and "46 minibatches" in output
    data = namespace["data"]
    assert DataSet.load(f"{data}/saved/test-0.bin") == namespace["test"].split(120)[0]
    assert namespace["from_paths"].network.epoch_count == 1
    assert namespace["from_files"].network.epoch_count == 2


def _check_getting_started(namespace: dict, output: str, tmp_path) -> None:
    train, test = namespace["train"], namespace["test"]
    # "DataSets: features (N, 64), one-hot labels (N, 10)"
    assert train.features.shape == (len(train), 64) and train.labels.shape == (len(train), 10)
    np.testing.assert_array_equal(train.labels.sum(axis=1), 1)
    # seeds 42, 1-4: local 0.953-0.964 after 10 epochs, Spark 0.919-0.942 after 5
    local, distributed = namespace["net"].evaluate(test).accuracy(), namespace["model"].network
    assert local > 0.93
    assert distributed.evaluate(test).accuracy() > 0.89
    assert distributed.epoch_count == 5  # all epochs in one fit
    assert f"{local}\n" in output


def _check_readme(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.nn import MultiLayerNetwork

    network = namespace["model"].network
    accuracy = network.evaluate(namespace["test"]).accuracy()
    assert accuracy > 0.91  # seeds 42, 1-4: 0.939-0.953 after 10 epochs
    assert "Accuracy:" in output  # the printed stats()
    np.testing.assert_array_equal(
        MultiLayerNetwork.load(tmp_path / "digits-mlp.zip").params(), network.params()
    )


def _check_graphs(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.data import MultiDataSet

    images = namespace["images"]
    # seeds 1-5: the residual graph 0.911-0.939 on the test digits after 3 epochs
    accuracy = namespace["graph"].evaluate(namespace["test_batches"], output_index=0).accuracy()
    assert accuracy > 0.88 and f"{accuracy}\n" in output
    assert namespace["digit_probabilities"].shape == (len(images), 10)
    assert namespace["size"].shape == (len(images), 1)
    # on Spark: one score per example, one output array per graph output, the regression on output 1
    x = namespace["x"]
    assert namespace["scores"].count() == len(x)
    key, outputs = namespace["outputs"].collect()[0]
    assert key == "a" and [o.shape for o in outputs] == [(10,), (1,)]
    regression = namespace["regression"]
    assert regression.num_columns == 1 and regression.example_count(0) == len(x)
    # seeds 1-5: 0.933-0.950 of the test digits after 5 epochs of two workers
    _, flat_test = namespace["load_digits"]()
    features = flat_test.features
    held_out = MultiDataSet(
        [features[:, :32], features[:, 32:]], [flat_test.labels, features.mean(axis=1)[:, None]]
    )
    assert namespace["model"].network.evaluate(held_out, output_index=0).accuracy() > 0.91


def _check_mlflow(namespace: dict, output: str, tmp_path) -> None:
    import sparkgrad.mlflow

    client, run_id = namespace["client"], namespace["run"].info.run_id
    history = client.get_metric_history(run_id, "test_accuracy")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4]  # one per epoch, step = its number
    # seeds 1-5: 0.944-0.958 after the 5th epoch
    assert max(history, key=lambda m: m.step).value > 0.92
    for metric in ("loss", "bytes_on_wire", "update_density", "threshold"):
        assert len(client.get_metric_history(run_id, metric)) == 5, metric
    assert client.get_run(run_id).data.params["master.batch_size_per_worker"] == "16"
    assert "training_stats.html" in {a.path for a in client.list_artifacts(run_id)}
    assert client.get_model_version("digits-mlp", "1").run_id == run_id
    # the registered model serves what the trained network computes: probabilities per example
    trained = namespace["net"].network
    frame = namespace["frame"]
    served = namespace["model"].predict(frame)
    assert served.shape == (5, 10)
    # the same kernels on the same float32 inputs; rows of 64 -> 64 -> 10 reductions
    expected = trained.output(namespace["test"].features[:5])
    np.testing.assert_allclose(served, expected, rtol=0, atol=2 * 64 * float(np.finfo(np.float32).eps))
    # log_model / load_model and save_model keep the parameters exactly
    np.testing.assert_array_equal(namespace["network"].params(), trained.params())
    saved = sparkgrad.mlflow.load_model(str(tmp_path / "digits-model"))
    np.testing.assert_array_equal(saved.params(), trained.params())


def _check_checkpoints(namespace: dict, output: str, tmp_path) -> None:
    from sparkgrad.nn import MultiLayerNetwork

    test, network = namespace["test"], namespace["network"]
    # the first fit stopped after 2 epochs, the resumed call trained the 4 left
    assert network.epoch_count == 6
    directory = tmp_path / "checkpoints" / "digits"
    assert sorted(p.name for p in directory.glob("*.json")) == [
        f"checkpoint-0000000{e}.json" for e in (4, 5, 6)
    ]  # keep_last=3
    saved = MultiLayerNetwork.load(directory / "checkpoint-00000006.model")
    np.testing.assert_array_equal(saved.params(), network.params())
    accuracy = network.evaluate(test).accuracy()
    # three runs (no seed on the page): 0.933-0.939; the bound sits three standard errors of an accuracy
    # on the 359 test digits (0.013 each) below the lowest
    assert accuracy > 0.89 and f"epochs 6, test accuracy {accuracy:.4f}" in output
    result = namespace["result"]
    scores = result.score_vs_epoch
    assert sorted(scores) == list(range(result.total_epochs)) and result.total_epochs <= 20
    assert result.best_model_epoch == min(scores, key=scores.get)
    assert result.best_model.score(test) == pytest.approx(result.best_model_score, rel=1e-6)
    assert f"best epoch {result.best_model_epoch} of {result.total_epochs}" in output


# page -> (the text to replace in its examples, given tmp_path; a check of the namespace, the output and
# the directory the examples ran in)
CHECKS = {
    "README.md": (lambda _: {}, _check_readme),
    "docs/getting-started.md": (lambda _: {}, _check_getting_started),
    "docs/guides/checkpoints.md": (lambda _: {}, _check_checkpoints),
    "docs/guides/graphs.md": (lambda _: {}, _check_graphs),
    "docs/guides/mlflow.md": (lambda _: {}, _check_mlflow),
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
def test_spark_page_examples_run(page, spark, tmp_path, capsys, monkeypatch) -> None:
    replace, check = CHECKS[page.name]
    tracking_uri = None
    if any("mlflow" in example.code for example in page.examples):
        import mlflow

        tracking_uri = mlflow.get_tracking_uri()  # the page sets its own: restored below
    try:
        namespace = run_page(page, tmp_path, replace(tmp_path))
        monkeypatch.chdir(tmp_path)  # where the examples ran: relative paths (sqlite:///mlflow.db) hold
        check(namespace, capsys.readouterr().out, tmp_path)
    finally:
        _forget_global_state()
        if tracking_uri is not None:
            sys.modules["mlflow"].set_tracking_uri(tracking_uri)


def test_every_spark_page_has_a_check() -> None:
    assert sorted(set(CHECKS) ^ {p.name for p in SPARK_PAGES}) == []
