"""sparkgrad.mlflow against a real MLflow tracking store (SQLite under a temporary directory): autologged
and listener-logged fits of both masters and both network types, the model flavor through pyfunc,
spark_udf and the model registry, and an autologged CrossValidator with nested runs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import mlp_conf, port, subset

mlflow = pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402
from pyspark.ml import Pipeline  # noqa: E402
from pyspark.ml.evaluation import BinaryClassificationEvaluator  # noqa: E402
from pyspark.ml.feature import VectorAssembler  # noqa: E402
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder  # noqa: E402

import sparkgrad.mlflow as sgm  # noqa: E402
from sparkgrad.ml import SparkgradClassifier  # noqa: E402
from sparkgrad.nn import (  # noqa: E402
    ComputationGraphConfiguration,
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)
from sparkgrad.nn.updaters import Adam  # noqa: E402
from sparkgrad.spark import (  # noqa: E402
    DefaultRepartitioner,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
    VoidConfiguration,
)
from sparkgrad.spark.tracking import fit_listeners  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite tracking store and model registry with its own artifact directory; restored after."""
    root = tmp_path_factory.mktemp("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    experiment = mlflow.create_experiment("sparkgrad-tests", artifact_location=(root / "artifacts").as_uri())
    mlflow.set_experiment(experiment_id=experiment)
    yield MlflowClient(), experiment
    mlflow.set_tracking_uri(previous)


@pytest.fixture
def autologged(store):
    sgm.autolog(log_models=True)
    yield store
    sgm.autolog(disable=True)
    assert fit_listeners() == []
    while mlflow.active_run() is not None:  # a failed test must not leave its run to the next
        mlflow.end_run("FAILED")


@pytest.fixture(scope="module")
def small_rdd(spark, digits):
    return spark.sparkContext.parallelize(subset(digits[0], 256).split(16), 2)


def _history(client, run_id: str, name: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, name)]


def _artifacts(client, run_id: str) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id)}


def _models(experiment: str, run_id: str) -> list[str]:
    """Names of the models logged from the run (MLflow 3 keeps them apart from the run's artifacts)."""
    found = mlflow.search_logged_models(
        experiment_ids=[experiment], filter_string=f"source_run_id = '{run_id}'", output_format="list"
    )
    return [m.name for m in found]


def test_autolog_parameter_averaging_fit_logs_params_metrics_stats_and_model(
    autologged, spark, digits, small_rdd
) -> None:
    client, experiment = autologged
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, averaging_frequency=100, repartition="never", rng_seed=1
    )
    net = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    test = subset(digits[1], 64)
    returned: list[float] = []

    def accuracy(epoch, network):
        returned.append(float(network.evaluate(test).accuracy()))
        return {"test_accuracy": returned[-1]}

    net.fit(small_rdd, epochs=2, epoch_callback=accuracy)
    assert mlflow.active_run() is None  # the run autolog started is ended with the fit
    (run,) = client.search_runs([experiment], "params.network_type = 'MultiLayerNetwork'")
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["epochs"] == "2"
    assert p["num_params"] == str(net.network.num_params()) == str(64 * 16 + 16 + 16 * 10 + 10)
    assert (p["network.layers.0.type"], p["network.layers.0.n_out"]) == ("DenseLayer", "16")
    assert (p["network.layers.1.activation"], p["network.updater.learning_rate"]) == ("softmax", "0.01")
    assert (p["master.type"], p["master.batch_size_per_worker"]) == ("ParameterAveragingTrainingMaster", "16")
    assert (p["master.averaging_frequency"], p["master.collect_training_stats"]) == ("100", "False")
    assert "master.rng_seed" in p and "master.export_directory" not in p  # None values are left out
    # one averaging round per epoch: the epoch's loss is that round's average score in the stats
    scores = net.training_stats.scores()["average of the workers"]
    assert _history(client, run.info.run_id, "loss") == [(0, scores[0][1]), (1, scores[1][1])]
    assert _history(client, run.info.run_id, "test_accuracy") == [(0, returned[0]), (1, returned[1])]
    speed = _history(client, run.info.run_id, "examples_per_second")
    assert [s for s, _ in speed] == [0, 1] and all(v > 0 for _, v in speed)
    # one job for the fit: the workers average over the transport, whose bytes are logged
    assert run.data.metrics["bytes_on_wire"] > 0 and "update_density" not in run.data.metrics
    # stats were switched on for the fit only, and their report logged
    assert master.collect_training_stats is False
    assert "training_stats.html" in _artifacts(client, run.info.run_id)
    assert _models(experiment, run.info.run_id) == ["model"]
    html = mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/training_stats.html")
    assert html.startswith("<!DOCTYPE html>") and "ParameterAveragingMasterFitTimesMs" in html
    loaded = sgm.load_model(f"runs:/{run.info.run_id}/model")
    np.testing.assert_array_equal(loaded.params(), net.network.params())
    assert loaded.epoch_count == 2


def test_listener_logs_a_shared_graph_fit_into_the_active_run(store, spark, digits, small_rdd) -> None:
    client, experiment = store
    conf = (
        ComputationGraphConfiguration.builder(seed=3, updater=Adam(1e-2))
        .add_inputs("in")
        .set_input_types(InputType.feed_forward(64))
        .add_layer("hidden", DenseLayer(16, activation="relu"), "in")
        .add_layer("out", OutputLayer(10, activation="softmax", loss="mcxent"), "hidden")
        .set_outputs("out")
        .build()
    )
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        repartitioner=DefaultRepartitioner(max_partitions=2),
        collect_training_stats=True,
        rng_seed=2,
    )
    net = SparkComputationGraph(spark, conf, master)
    net.add_fit_listener(sgm.MlflowLogger(log_models=False))
    with mlflow.start_run() as run:
        net.fit(small_rdd, epochs=2)
        assert mlflow.active_run().info.run_id == run.info.run_id  # the user's run stays open
        net.fit(small_rdd, epochs=1)  # a second fit logs into the same run, continuing the steps
    got = client.get_run(run.info.run_id)
    assert got.data.params["network_type"] == "ComputationGraph"
    assert (
        got.data.params["network.vertices.0.name"],
        got.data.params["network.vertices.0.vertex.n_out"],
    ) == (
        "hidden",
        "16",
    )
    assert got.data.params["master.type"] == "SharedTrainingMaster"
    assert got.data.params["epochs"] == "2"  # the first fit's value is kept
    wire = _history(client, run.info.run_id, "bytes_on_wire")
    assert [s for s, _ in wire] == [0, 1, 2]
    assert 0 < wire[0][1] <= wire[1][1]  # counted from each fit's start, growing within a fit
    density = _history(client, run.info.run_id, "update_density")
    assert all(0 < v <= 1 for _, v in density)
    threshold = _history(client, run.info.run_id, "threshold")
    assert all(v > 0 for _, v in threshold)
    losses = _history(client, run.info.run_id, "loss")
    assert [s for s, _ in losses] == [0, 1, 2] and all(np.isfinite(v) and v > 0 for _, v in losses)
    assert "training_stats.html" in _artifacts(client, run.info.run_id)
    assert _models(experiment, run.info.run_id) == []


def test_a_failing_fit_leaves_no_run_open(autologged, spark, small_rdd) -> None:
    client, experiment = autologged
    net = SparkMultiLayer(
        spark, mlp_conf(hidden=8, seed=5), ParameterAveragingTrainingMaster(batch_size_per_worker=16)
    )

    def fail(epoch, network):
        raise RuntimeError("evaluation broke")

    with pytest.raises(RuntimeError, match="evaluation broke"):
        net.fit(small_rdd, epochs=3, epoch_callback=fail)
    assert mlflow.active_run() is None
    (run,) = client.search_runs([experiment], "params.`network.seed` = '5'")
    assert run.info.status == "FAILED"
    assert [s for s, _ in _history(client, run.info.run_id, "loss")] == [0]  # the epoch that ended
    assert _models(experiment, run.info.run_id) == []


def test_model_flavor_pyfunc_spark_udf_and_registry(store, spark, digits) -> None:
    import pandas as pd
    from pyspark.sql import functions as F

    train, test = digits
    net = MultiLayerNetwork(mlp_conf(hidden=16, seed=4)).init()
    net.fit(subset(train, 256).split(32))
    x = test.features[:40].astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"pixel{i}" for i in range(64)])
    with mlflow.start_run():
        info = sgm.log_model(
            net, "digits", input_example=frame.head(3), registered_model_name="sparkgrad-digits"
        )
    assert info.registered_model_version == 1
    uri = "models:/sparkgrad-digits/1"
    expected = net.output(x)
    signature = info.signature
    assert (signature.inputs.inputs[0].shape, str(signature.inputs.inputs[0].type)) == ((-1, 64), "float32")
    assert str(signature.outputs.inputs[0].type) == "Array(float)"

    pyfunc = mlflow.pyfunc.load_model(uri)
    np.testing.assert_array_equal(pyfunc.predict(frame), expected)  # 64 numeric columns
    by_array = pd.DataFrame({"features": list(x)})
    np.testing.assert_array_equal(pyfunc.predict(by_array), expected)  # one array column
    np.testing.assert_array_equal(sgm.load_model(uri).params(), net.params())

    df = spark.createDataFrame([(i, [float(v) for v in row]) for i, row in enumerate(x)], ["id", "features"])
    udf = mlflow.pyfunc.spark_udf(spark, uri, env_manager="local")
    rows = df.repartition(3).withColumn("out", udf(F.col("features"))).collect()
    scored = np.array([r["out"] for r in sorted(rows, key=lambda r: r["id"])], dtype=np.float32)
    # the UDF's tasks run other batch shapes with one native thread: where OpenBLAS's bits depend on those
    # (docs/development.md) the probabilities (<= 1) differ by float32 rounding over the layers' products
    np.testing.assert_allclose(scored, expected, rtol=0, atol=16 * np.finfo(np.float32).eps)


def test_save_model_round_trips_a_graph_with_its_updater(store, tmp_path, digits) -> None:
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation="tanh"), OutputLayer(10, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-2),
        seed=9,
    )
    net = MultiLayerNetwork(conf).init()
    net.fit(subset(digits[0], 64).split(32))
    sgm.save_model(net, tmp_path / "m", save_updater=True)
    loaded = sgm.load_model(str(tmp_path / "m"))
    np.testing.assert_array_equal(loaded.updater_state(), net.updater_state())
    assert (loaded.iteration_count, loaded.epoch_count) == (net.iteration_count, net.epoch_count)
    reqs = (tmp_path / "m" / "requirements.txt").read_text().split()
    import sparkgrad

    assert f"sparkgrad=={sparkgrad.__version__}" in reqs
    with pytest.raises(TypeError, match="expected a MultiLayerNetwork"):
        sgm.save_model(object(), tmp_path / "other")


def _blobs(spark, n: int, seed: int):
    rng = np.random.default_rng(seed)
    label = np.arange(n) % 2
    x = rng.normal(size=(2, 4))[label] * 3 + rng.normal(size=(n, 4)) * 0.5
    return spark.createDataFrame([(*map(float, r), float(c)) for r, c in zip(x, label)], [*"abcd", "label"])


def test_autologged_cross_validator_nests_a_run_per_fit(autologged, spark) -> None:
    client, experiment = autologged
    classifier = SparkgradClassifier(
        networkConf=MultiLayerConfiguration(
            [OutputLayer(1, activation="sigmoid", loss="xent")],
            input_type=InputType.feed_forward(4),
            updater=Adam(0.2),
            seed=7,
        ),
        trainingMaster=ParameterAveragingTrainingMaster(averaging_frequency=10, repartition="never"),
        epochs=2,
    )
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=list("abcd"), outputCol="features"), classifier])
    grid = ParamGridBuilder().addGrid(classifier.batchSize, [8, 32]).build()
    cv = CrossValidator(
        estimator=pipeline,
        estimatorParamMaps=grid,
        evaluator=BinaryClassificationEvaluator(),
        numFolds=2,
        seed=5,
    )
    with mlflow.start_run() as outer:
        model = cv.fit(_blobs(spark, 96, seed=1))
    assert mlflow.active_run() is None
    (parent,) = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{outer.info.run_id}'")
    assert parent.info.status == "FINISHED"
    best = int(np.argmax(model.avgMetrics))
    p = parent.data.params
    assert (p["tuner"], p["estimator"], p["numFolds"], p["num_param_maps"]) == (
        "CrossValidator",
        "Pipeline",
        "2",
        "2",
    )
    assert p["best.SparkgradClassifier.batchSize"] == str(grid[best][classifier.batchSize])
    assert parent.data.metrics["best_areaUnderROC"] == model.avgMetrics[best]
    results = mlflow.artifacts.load_text(f"runs:/{parent.info.run_id}/search_results.csv").splitlines()
    assert results[0] == "SparkgradClassifier.batchSize,areaUnderROC,std_areaUnderROC"
    assert [float(r.split(",")[1]) for r in results[1:]] == model.avgMetrics
    # 2 folds x 2 param maps, and the refit of the best on all the data
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 5 and {c.info.status for c in children} == {"FINISHED"}
    sizes = sorted(c.data.params["master.batch_size_per_worker"] for c in children)
    expected = sorted(["8", "8", "32", "32", str(grid[best][classifier.batchSize])])
    assert sizes == expected
    for child in children:
        assert [s for s, _ in _history(client, child.info.run_id, "loss")] == [0, 1]
        assert _models(experiment, child.info.run_id) == []
    assert _models(experiment, parent.info.run_id) == ["model"]
    logged = sgm.load_model(f"runs:/{parent.info.run_id}/model")
    np.testing.assert_array_equal(logged.params(), model.bestModel.stages[-1].network.params())
