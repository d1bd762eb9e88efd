"""sparkgrad.ml: the estimators in Pipelines and CrossValidator, the evaluators, transform and persistence."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from helpers import residual_graph
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import (
    BinaryClassificationEvaluator,
    MulticlassClassificationEvaluator,
    RegressionEvaluator,
)
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.linalg import Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from sparkgrad.errors import CorruptDataError
from sparkgrad.ml import (
    SparkgradClassificationModel,
    SparkgradClassifier,
    SparkgradRegressionModel,
    SparkgradRegressor,
)
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    ConvolutionLayer,
    DenseLayer,
    InputType,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import ParameterAveragingTrainingMaster

# float32 network outputs compared after a different batching: a few ulps per accumulated term
OUTPUT_TOL = 64 * float(np.finfo(np.float32).eps)
COLUMNS = ["a", "b", "c", "d"]


def _blobs(spark, n: int, classes: int, seed: int):
    """Separated Gaussian blobs in 4 columns of very different scales, labels 0..classes-1."""
    rng = np.random.default_rng(seed)
    label = np.arange(n) % classes
    centres = rng.normal(size=(classes, 4)) * 3
    x = (centres[label] + rng.normal(size=(n, 4)) * 0.5) * [1, 10, 100, 0.1]
    rows = [(*map(float, r), float(c)) for r, c in zip(x, label)]
    return spark.createDataFrame(rows, [*COLUMNS, "label"])


def _conf(
    n_in: int,
    n_out: int,
    activation: str = "softmax",
    loss: str = "mcxent",
    hidden: int = 16,
    lr: float = 5e-2,
):
    layers = [OutputLayer(n_out, activation=activation, loss=loss)]
    if hidden:
        layers.insert(0, DenseLayer(hidden, activation="tanh"))
    return MultiLayerConfiguration(layers, input_type=InputType.feed_forward(n_in), updater=Adam(lr), seed=7)


def _master() -> ParameterAveragingTrainingMaster:
    # one averaging round per epoch and no repartitioning: fewer Spark jobs per fit
    return ParameterAveragingTrainingMaster(averaging_frequency=10, repartition="never", rng_seed=3)


def _rows(frame, *cols: str) -> list[np.ndarray]:
    rows = frame.select(*cols).collect()
    return [np.array([_value(r[i]) for r in rows], dtype=np.float64) for i in range(len(cols))]


def _value(v):
    return v.toArray() if hasattr(v, "toArray") else v


@pytest.fixture(scope="module")
def fitted(spark):
    """A Pipeline (VectorAssembler, StandardScaler, SparkgradClassifier) fitted on 3 blobs."""
    df = _blobs(spark, 240, 3, seed=0)
    classifier = SparkgradClassifier(
        networkConf=_conf(4, 3), trainingMaster=_master(), epochs=2, batchSize=16
    )
    pipeline = Pipeline(
        stages=[
            VectorAssembler(inputCols=COLUMNS, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="features", withMean=True),
            classifier,
        ]
    )
    return pipeline.fit(df), df


def test_pipeline_classifier_columns_match_the_network_and_multiclass_evaluator(fitted) -> None:
    model, df = fitted
    out = model.transform(df).cache()
    x, label, prediction, probability, raw = _rows(
        out, "features", "label", "prediction", "probability", "rawPrediction"
    )
    classifier = model.stages[-1]
    assert isinstance(classifier, SparkgradClassificationModel)
    assert (classifier.numClasses, classifier.numFeatures) == (3, 4)
    expected = classifier.network.output(x.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(probability, expected, rtol=0, atol=OUTPUT_TOL)
    np.testing.assert_array_equal(raw, probability)
    np.testing.assert_array_equal(prediction, probability.argmax(1))
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    assert accuracy == pytest.approx(np.mean(prediction == label), abs=1e-12)
    assert accuracy > 0.9  # separated blobs: training worked
    # logLoss reads probabilityCol (Spark clips probabilities at 1e-15)
    log_loss = MulticlassClassificationEvaluator(metricName="logLoss").evaluate(out)
    picked = np.clip(probability[np.arange(len(label)), label.astype(int)], 1e-15, 1 - 1e-15)
    assert log_loss == pytest.approx(-np.mean(np.log(picked)), rel=1e-9)
    one = Vectors.dense(x[0])
    np.testing.assert_allclose(
        classifier.predictProbability(one).toArray(), probability[0], rtol=0, atol=OUTPUT_TOL
    )
    assert classifier.predict(one) == prediction[0]
    out.unpersist()


def test_thresholds_and_disabled_columns(fitted) -> None:
    model, df = fitted
    features = model.stages[1].transform(model.stages[0].transform(df))
    thresholds = [0.5, 0.3, 0.2]
    classifier = model.stages[-1].copy().setThresholds(thresholds).setRawPredictionCol("")
    out = classifier.transform(features)
    assert "rawPrediction" not in out.columns
    prediction, probability = _rows(out, "prediction", "probability")
    np.testing.assert_array_equal(prediction, (probability / thresholds).argmax(1))
    with pytest.raises(ValueError, match="thresholds: expected 3 finite values"):
        classifier.setThresholds([0.5, 0.5]).transform(features)
    with pytest.raises(ValueError, match="output column 'probability' already exists"):
        model.stages[-1].transform(model.transform(df).drop("prediction", "rawPrediction"))


def test_cross_validator_binary_sigmoid_classifier(spark) -> None:
    df = _blobs(spark, 160, 2, seed=1)
    classifier = SparkgradClassifier(
        networkConf=_conf(4, 1, activation="sigmoid", loss="xent", hidden=0, lr=0.2),
        trainingMaster=_master(),
        batchSize=32,
    )
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=COLUMNS, outputCol="features"), classifier])
    grid = ParamGridBuilder().addGrid(classifier.batchSize, [16, 32]).build()
    evaluator = BinaryClassificationEvaluator()  # areaUnderROC of rawPrediction[1]
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=5)
    cv_model = cv.fit(df)
    assert len(cv_model.avgMetrics) == 2
    best = int(np.argmax(cv_model.avgMetrics))
    best_classifier = cv_model.bestModel.stages[-1]
    assert best_classifier.getBatchSize() == grid[best][classifier.batchSize]
    out = cv_model.transform(df)
    x, label, probability, prediction = _rows(out, "features", "label", "probability", "prediction")
    p = best_classifier.network.output(x.astype(np.float32))[:, 0].astype(np.float64)
    np.testing.assert_allclose(probability, np.stack([1 - p, p], axis=1), rtol=0, atol=OUTPUT_TOL)
    np.testing.assert_array_equal(prediction, (probability[:, 1] > probability[:, 0]).astype(float))
    # the evaluator's AUC is the Mann-Whitney statistic (ties count half)
    pos, neg = probability[label == 1, 1], probability[label == 0, 1]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert evaluator.evaluate(out) == pytest.approx(wins / (pos.size * neg.size), abs=1e-12)


def test_regressor_with_regression_evaluator(spark) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(192, 3))
    y = x @ [2.0, -1.0, 0.5] + 0.5 + rng.normal(size=192) * 0.05
    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(x, y)], ["features", "label"])
    regressor = SparkgradRegressor(
        networkConf=_conf(3, 1, activation="identity", loss="mse", hidden=0, lr=0.1),
        trainingMaster=_master(),
        epochs=4,
        batchSize=16,
    )
    model = regressor.fit(df)
    assert isinstance(model, SparkgradRegressionModel)
    out = model.transform(df)
    label, prediction = _rows(out, "label", "prediction")
    expected = model.network.output(x.astype(np.float32))[:, 0].astype(np.float64)
    np.testing.assert_allclose(prediction, expected, rtol=0, atol=OUTPUT_TOL * np.abs(expected).max())
    assert model.predict(Vectors.dense(x[0])) == pytest.approx(prediction[0], rel=OUTPUT_TOL)
    rmse = RegressionEvaluator(metricName="rmse").evaluate(out)
    assert rmse == pytest.approx(np.sqrt(np.mean((prediction - label) ** 2)), rel=1e-9)
    r2 = RegressionEvaluator(metricName="r2").evaluate(out)
    assert r2 > 0.9  # a linear target: training worked


def _cross_validate(estimator, evaluator, df, grid):
    """CrossValidator over ``grid`` (2 folds); checks the choice and the metrics, returns the model."""
    cv = CrossValidator(estimator=estimator, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=4)
    cv_model = cv.fit(df)
    metrics = np.array(cv_model.avgMetrics)
    assert metrics.shape == (len(grid),) and np.all(np.isfinite(metrics))
    assert len(set(metrics.tolist())) == len(grid)  # the grid's settings train different networks
    best = int(np.argmax(metrics) if evaluator.isLargerBetter() else np.argmin(metrics))
    for param, value in grid[best].items():
        assert cv_model.bestModel.getOrDefault(param.name) == value
    return cv_model


def test_cross_validator_multiclass_classifier_log_loss(spark) -> None:
    df = VectorAssembler(inputCols=COLUMNS, outputCol="features").transform(_blobs(spark, 160, 3, seed=6))
    classifier = SparkgradClassifier(networkConf=_conf(4, 3, hidden=0), trainingMaster=_master(), epochs=1)
    grid = ParamGridBuilder().addGrid(classifier.batchSize, [8, 32]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="logLoss")  # smaller is better
    cv_model = _cross_validate(classifier, evaluator, df, grid)
    best = cv_model.bestModel
    assert isinstance(best, SparkgradClassificationModel)
    out = best.transform(df)
    x, label, probability = _rows(out, "features", "label", "probability")
    expected = best.network.output(x.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(probability, expected, rtol=0, atol=OUTPUT_TOL)
    picked = np.clip(probability[np.arange(len(label)), label.astype(int)], 1e-15, 1 - 1e-15)
    assert evaluator.evaluate(out) == pytest.approx(-np.mean(np.log(picked)), rel=1e-9)
    assert evaluator.evaluate(cv_model.transform(df)) == evaluator.evaluate(out)


def test_cross_validator_regressor_rmse(spark) -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(128, 3))
    y = x @ [1.0, -2.0, 0.5] + 0.25
    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(x, y)], ["features", "label"])
    regressor = SparkgradRegressor(
        networkConf=_conf(3, 1, activation="identity", loss="mse", hidden=0, lr=0.1),
        trainingMaster=_master(),
        epochs=1,
    )
    grid = ParamGridBuilder().addGrid(regressor.batchSize, [8, 32]).build()
    evaluator = RegressionEvaluator(metricName="rmse")  # smaller is better
    cv_model = _cross_validate(regressor, evaluator, df, grid)
    best = cv_model.bestModel
    assert isinstance(best, SparkgradRegressionModel)
    out = best.transform(df)
    label, prediction = _rows(out, "label", "prediction")
    expected = best.network.output(x.astype(np.float32))[:, 0].astype(np.float64)
    np.testing.assert_allclose(prediction, expected, rtol=0, atol=OUTPUT_TOL * np.abs(expected).max())
    assert evaluator.evaluate(out) == pytest.approx(np.sqrt(np.mean((prediction - label) ** 2)), rel=1e-9)
    assert evaluator.evaluate(cv_model.transform(df)) == evaluator.evaluate(out)


def test_models_and_estimators_save_and_load_on_hadoop_paths(spark, fitted, tmp_path) -> None:
    # a PipelineModel holding a sparkgrad model saves and loads in docs/guides/spark-ml.md's example
    # (tests/spark/test_docs_examples.py)
    model, df = fitted
    classifier = model.stages[-1]
    path = f"{tmp_path.as_uri()}/classifier"
    classifier.write().save(path)
    loaded = SparkgradClassificationModel.load(path)
    assert loaded.uid == classifier.uid
    assert {p.name: v for p, v in loaded.extractParamMap().items()} == {
        p.name: v for p, v in classifier.extractParamMap().items()
    }
    np.testing.assert_array_equal(loaded.network.params(), classifier.network.params())
    with pytest.raises(FileExistsError, match="overwrite"):
        classifier.write().save(path)
    classifier.write().overwrite().save(path)

    features = model.stages[1].transform(model.stages[0].transform(df))
    (a,) = _rows(classifier.transform(features), "probability")
    (b,) = _rows(loaded.transform(features), "probability")
    np.testing.assert_array_equal(a, b)

    estimator_path = str(tmp_path / "estimator")
    estimator = SparkgradClassifier(networkConf=_conf(4, 3), trainingMaster=_master(), epochs=3)
    estimator.save(estimator_path)
    again = SparkgradClassifier.load(estimator_path)
    assert {p.name: v for p, v in again.extractParamMap().items()} == {
        p.name: v for p, v in estimator.extractParamMap().items()
    }


def test_loaded_model_transform_runs_workers_with_the_driver_interpreter(
    spark, fitted, tmp_path, monkeypatch
) -> None:
    # a fresh session of a driver started as venv/bin/python without PYSPARK_PYTHON: python3 from PATH
    model, df = fitted
    classifier = model.stages[-1]
    path = str(tmp_path / "classifier")
    classifier.write().save(path)
    sc = spark.sparkContext
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(sc, "pythonExec", "python3")
    loaded = SparkgradClassificationModel.load(path)
    features = model.stages[1].transform(model.stages[0].transform(df))
    out = loaded.transform(features)
    assert sc.pythonExec == sys.executable
    x, probability = _rows(out, "features", "probability")
    expected = classifier.network.output(x.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(probability, expected, rtol=0, atol=OUTPUT_TOL)


def test_damaged_or_foreign_saved_models_raise_corrupt_data_error(spark, fitted, tmp_path) -> None:
    classifier = fitted[0].stages[-1]
    path = str(tmp_path / "m")
    classifier.write().save(path)
    with pytest.raises(
        CorruptDataError, match=r"/m/metadata: class 'sparkgrad.ml.estimators.SparkgradClassificationModel'"
    ):
        SparkgradRegressionModel.load(path)
    with pytest.raises(FileNotFoundError):
        SparkgradClassificationModel.load(str(tmp_path / "missing"))

    # network bytes with one byte flipped: the zip's checks name the data directory
    row = spark.read.parquet(f"{path}/data").collect()[0]
    blob = bytearray(row.network)
    blob[len(blob) // 2] ^= 0xFF
    spark.createDataFrame([(row.format, blob)], "format string, network binary").write.mode(
        "overwrite"
    ).parquet(f"{path}/data")
    with pytest.raises(CorruptDataError, match="/m/data"):
        SparkgradClassificationModel.load(path)
    spark.createDataFrame([("x", 1)], "format string, other int").write.mode("overwrite").parquet(
        f"{path}/data"
    )
    with pytest.raises(CorruptDataError, match=r"/m/data: expected one row of \(format, network\)"):
        SparkgradClassificationModel.load(path)
    # many rows: refused after reading two of them (limit(2)), not after collecting the frame
    spark.createDataFrame([(row.format, b"x")] * 50, "format string, network binary").write.mode(
        "overwrite"
    ).parquet(f"{path}/data")
    with pytest.raises(CorruptDataError, match=r"/m/data: expected one row .*, found more than one"):
        SparkgradClassificationModel.load(path)

    # metadata naming another network than the saved one
    other = classifier.copy()
    other.set(other.networkConf, _conf(4, 3, hidden=5).to_json())
    other.write().overwrite().save(path)
    with pytest.raises(CorruptDataError, match="differs from networkConf"):
        SparkgradClassificationModel.load(path)


def test_estimator_params_fail_early_with_their_names(spark) -> None:
    df = _blobs(spark, 8, 2, seed=3)
    with pytest.raises(TypeError, match='param "networkConf"'):
        SparkgradClassifier(networkConf=42)
    with pytest.raises(TypeError, match='param "trainingMaster"'):
        SparkgradClassifier(trainingMaster="{}")
    with pytest.raises(ValueError, match="networkConf: not set"):
        SparkgradClassifier().fit(df)
    identity = _conf(4, 3, activation="identity", loss="mse")
    with pytest.raises(ValueError, match="networkConf: a classifier's output layer must be softmax"):
        SparkgradClassifier(networkConf=identity).fit(df)
    with pytest.raises(ValueError, match="epochs"):
        SparkgradClassifier(networkConf=_conf(4, 3), epochs=0).fit(df)
    with pytest.raises(ValueError, match="featuresCol: no column 'features'"):
        SparkgradClassifier(networkConf=_conf(4, 3)).fit(df)
    with pytest.raises(ValueError, match="no network"):
        SparkgradClassificationModel().transform(df)


def test_image_columns_are_reshaped_by_the_input_type(spark, digits) -> None:
    conf = MultiLayerConfiguration(
        [ConvolutionLayer(3, kernel_size=(3, 3), activation="relu"), OutputLayer(10)],
        input_type=InputType.convolutional(8, 8, 1),
        seed=4,
    )
    network = MultiLayerNetwork(conf).init()
    x = digits[1].features[:30]
    df = spark.createDataFrame([(r.tolist(),) for r in x], ["pixels"])
    model = SparkgradClassificationModel(network).setFeaturesCol("pixels")
    (probability,) = _rows(model.transform(df), "probability")
    expected = network.output(x.reshape(-1, 1, 8, 8)).astype(np.float64)
    np.testing.assert_allclose(probability, expected, rtol=0, atol=OUTPUT_TOL)
    # a network changed in place is broadcast again, never served stale
    network.set_params(network.params() * 0.5)
    (probability,) = _rows(model.transform(df), "probability")
    expected = network.output(x.reshape(-1, 1, 8, 8)).astype(np.float64)
    np.testing.assert_allclose(probability, expected, rtol=0, atol=OUTPUT_TOL)


# -- ComputationGraph networks (one input, one output) ----------------------------------------------------
def _digits_frame(spark, ds):
    rows = [(Vectors.dense(x), float(y.argmax())) for x, y in zip(ds.features, ds.labels)]
    return spark.createDataFrame(rows, ["pixels", "label"])


def _metadata(spark, path: str) -> dict:
    return json.loads(spark.read.text(f"{path}/metadata").first()[0])


def _rewrite_metadata(spark, path: str, metadata: dict) -> None:
    frame = spark.createDataFrame([(json.dumps(metadata),)], "value string")
    frame.coalesce(1).write.mode("overwrite").text(f"{path}/metadata")


@pytest.fixture(scope="module")
def graph_fitted(spark, digits):
    """A Pipeline (StandardScaler, SparkgradClassifier of a residual graph) fitted on digits, and the
    scaled test frame."""
    train, test = digits
    classifier = SparkgradClassifier(
        networkConf=residual_graph(64, 10), trainingMaster=_master(), epochs=6, batchSize=32
    )
    scaler = StandardScaler(inputCol="pixels", outputCol="features")
    model = Pipeline(stages=[scaler, classifier]).fit(_digits_frame(spark, train))
    return model, model.stages[0].transform(_digits_frame(spark, test))


def test_graph_classifier_in_a_pipeline_learns_digits(graph_fitted) -> None:
    model, test = graph_fitted
    classifier = model.stages[-1]
    assert isinstance(classifier.network, ComputationGraph)
    assert (classifier.numClasses, classifier.numFeatures) == (10, 64)
    out = classifier.transform(test).cache()
    x, label, probability, raw, prediction = _rows(
        out, "features", "label", "probability", "rawPrediction", "prediction"
    )
    (expected,) = classifier.network.output(x.astype(np.float32))
    np.testing.assert_allclose(probability, expected.astype(np.float64), rtol=0, atol=OUTPUT_TOL)
    np.testing.assert_array_equal(raw, probability)
    np.testing.assert_array_equal(prediction, probability.argmax(1))
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(out)
    assert accuracy == pytest.approx(np.mean(prediction == label), abs=1e-12)
    assert accuracy > 0.9  # held-out digits (0.94 here; an untrained network scores about 0.1)
    one = Vectors.dense(x[0])
    np.testing.assert_allclose(
        classifier.predictProbability(one).toArray(), probability[0], rtol=0, atol=OUTPUT_TOL
    )
    assert classifier.predict(one) == prediction[0]
    out.unpersist()


def test_graph_model_saves_and_loads_with_identical_predictions(spark, graph_fitted, tmp_path) -> None:
    model, test = graph_fitted
    path = f"{tmp_path.as_uri()}/graph-pipeline"
    model.write().save(path)
    assert (
        _metadata(spark, f"{path}/stages/1_{model.stages[-1].uid}")["sparkgradNetwork"] == "ComputationGraph"
    )
    loaded = PipelineModel.load(path).stages[-1]
    assert isinstance(loaded, SparkgradClassificationModel)
    assert isinstance(loaded.network, ComputationGraph)
    assert loaded.network.conf == model.stages[-1].network.conf
    np.testing.assert_array_equal(loaded.network.params(), model.stages[-1].network.params())
    (a,) = _rows(model.stages[-1].transform(test), "probability")
    (b,) = _rows(loaded.transform(test), "probability")
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(a).all() and a.shape == (test.count(), 10)
    # an estimator holding a graph configuration saves and loads as any other
    estimator = SparkgradRegressor(networkConf=residual_graph(4, 1, "identity", "mse"), epochs=2)
    estimator.save(str(tmp_path / "graph-estimator"))
    again = SparkgradRegressor.load(str(tmp_path / "graph-estimator"))
    assert again.network_configuration() == estimator.network_configuration()
    assert isinstance(again.network_configuration(), ComputationGraphConfiguration)


def test_graph_regressor(spark) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(192, 3))
    y = x @ [1.5, -1.0, 0.5] + 0.25 + rng.normal(size=192) * 0.05
    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(x, y)], ["features", "label"])
    # a linear path around a nonlinear one: the output layer sees the inputs and a tanh layer
    conf = (
        ComputationGraphConfiguration.builder(seed=3, updater=Adam(0.1))
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(3))
        .add_layer("h", DenseLayer(4, activation="tanh"), "x")
        .add_vertex("both", MergeVertex(), "x", "h")
        .add_layer("y", OutputLayer(1, activation="identity", loss="mse"), "both")
        .set_outputs("y")
        .build()
    )
    model = SparkgradRegressor(networkConf=conf, trainingMaster=_master(), epochs=4, batchSize=16).fit(df)
    assert isinstance(model, SparkgradRegressionModel) and isinstance(model.network, ComputationGraph)
    assert model.numFeatures == 3
    out = model.transform(df)
    label, prediction = _rows(out, "label", "prediction")
    expected = model.network.output(x.astype(np.float32))[0][:, 0].astype(np.float64)
    np.testing.assert_allclose(prediction, expected, rtol=0, atol=OUTPUT_TOL * np.abs(expected).max())
    assert model.predict(Vectors.dense(x[0])) == pytest.approx(prediction[0], rel=OUTPUT_TOL)
    assert RegressionEvaluator(metricName="r2").evaluate(out) > 0.9  # a linear target: training worked


def test_graphs_with_several_inputs_or_outputs_are_rejected_naming_network_conf(spark) -> None:
    two_inputs = (
        ComputationGraphConfiguration.builder(seed=1)
        .add_inputs("left", "right")
        .set_input_types(InputType.feed_forward(2), InputType.feed_forward(2))
        .add_vertex("merge", MergeVertex(), "left", "right")
        .add_layer("out", OutputLayer(3), "merge")
        .set_outputs("out")
        .build()
    )
    two_outputs = (
        ComputationGraphConfiguration.builder(seed=1)
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(4))
        .add_layer("a", OutputLayer(3), "x")
        .add_layer("b", OutputLayer(1, activation="identity", loss="mse"), "x")
        .set_outputs("a", "b")
        .build()
    )
    inputs = r"networkConf: the graph has inputs \['left', 'right'\] and outputs \['out'\].*one input"
    with pytest.raises(ValueError, match=inputs):
        SparkgradClassifier(networkConf=two_inputs)
    with pytest.raises(ValueError, match=inputs):
        SparkgradRegressor().setNetworkConf(two_inputs.to_json())
    with pytest.raises(
        ValueError, match=r"networkConf: the graph has inputs \['x'\] and outputs \['a', 'b'\]"
    ):
        SparkgradRegressor(networkConf=two_outputs)
    with pytest.raises(ValueError, match="networkConf: the graph has inputs"):
        SparkgradClassificationModel(ComputationGraph(two_inputs).init())
    # the classifier's output check reads the graph's output layer
    identity = residual_graph(4, 3, activation="identity", loss="mse")
    with pytest.raises(ValueError, match="networkConf: a classifier's output layer must be softmax"):
        SparkgradClassifier(networkConf=identity).fit(_blobs(spark, 8, 3, seed=3))


def test_version_1_model_directories_still_load(spark, fitted, graph_fitted, tmp_path) -> None:
    # version 1 (MultiLayerNetwork only) wrote sparkgradFormat 1 and no sparkgradNetwork
    model, df = fitted
    classifier = model.stages[-1]
    path = str(tmp_path / "v1")
    classifier.write().save(path)
    metadata = _metadata(spark, path)
    assert (metadata["sparkgradFormat"], metadata["sparkgradNetwork"]) == (2, "MultiLayerNetwork")
    del metadata["sparkgradNetwork"]
    _rewrite_metadata(spark, path, {**metadata, "sparkgradFormat": 1})
    loaded = SparkgradClassificationModel.load(path)
    assert isinstance(loaded.network, MultiLayerNetwork)
    np.testing.assert_array_equal(loaded.network.params(), classifier.network.params())
    features = model.stages[1].transform(model.stages[0].transform(df))
    (a,) = _rows(classifier.transform(features), "probability")
    (b,) = _rows(loaded.transform(features), "probability")
    np.testing.assert_array_equal(a, b)

    # the recorded type builds the network: a graph read as version 1 (a MultiLayerNetwork) fails
    graph_path = str(tmp_path / "graph")
    graph_fitted[0].stages[-1].write().save(graph_path)
    metadata = _metadata(spark, graph_path)
    for changed, message in [
        ({"sparkgradFormat": 1}, r"/graph/data: .*holds a 'ComputationGraph', not a 'MultiLayerNetwork'"),
        ({"sparkgradNetwork": "Perceptron"}, "sparkgradNetwork 'Perceptron', expected"),
        ({"sparkgradFormat": 3}, "sparkgradFormat 3, this release reads 1 and 2"),
    ]:
        _rewrite_metadata(spark, graph_path, {**metadata, **changed})
        with pytest.raises(CorruptDataError, match=message):
            SparkgradClassificationModel.load(graph_path)
