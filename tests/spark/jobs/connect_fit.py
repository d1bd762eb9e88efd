"""Fits, inference and model persistence from a Spark Connect session, both masters and network types.

    python connect_fit.py DIRECTORY

Starts a local Spark Connect server (``SparkSession.builder.remote("local[2]")``, pyspark[connect]) and
trains on a DataFrame of the digits; prints one ``RESULT {json}`` line for
tests/spark/test_connect.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the local server's Python workers

import numpy as np  # noqa: E402
from pyspark.ml.evaluation import MulticlassClassificationEvaluator  # noqa: E402
from pyspark.ml.linalg import Vectors, VectorUDT  # noqa: E402
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/spark: the shared helpers
from helpers import mlp_conf, residual_graph  # noqa: E402

from sparkgrad.datasets import load_digits  # noqa: E402
from sparkgrad.errors import EnvironmentNotReadyError  # noqa: E402
from sparkgrad.ml import SparkgradClassificationModel, SparkgradClassifier  # noqa: E402
from sparkgrad.nn import (  # noqa: E402
    LSTM,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)
from sparkgrad.spark import (  # noqa: E402
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
)

EPOCHS = 3


def main() -> None:
    directory = Path(sys.argv[1])
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    train, test = load_digits(shape="flat")
    rows = [(x.tolist(), int(y)) for x, y in zip(train.features, train.labels.argmax(1))]
    frame = spark.createDataFrame(rows, "features array<float>, label int")
    result: dict[str, object] = {"session": type(spark).__module__}
    for name, master in (
        ("shared", SharedTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)),
        ("averaging", ParameterAveragingTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)),
    ):
        with SparkMultiLayer(spark, mlp_conf(hidden=64), master) as model:
            model.fit(frame, epochs=EPOCHS)
            result[name] = {
                "accuracy": model.network.evaluate(test).accuracy(),
                "epochs": model.network.epoch_count,
                "iterations": model.network.iteration_count,
                "traffic": master.last_traffic,
            }
    test_rows = [(x.tolist(), int(y)) for x, y in zip(test.features, test.labels.argmax(1))]
    test_frame = spark.createDataFrame(test_rows, "features array<float>, label int")
    with SparkMultiLayer(spark, mlp_conf(hidden=64), SharedTrainingMaster(progress=False)) as model:
        model.fit(frame, epochs=EPOCHS)
        local = model.network
        scores = [r["score"] for r in model.score_examples(test_frame.coalesce(1)).collect()]
        outputs = [r["output"].toArray().tolist() for r in model.output(test_frame.coalesce(1)).collect()]
        result["inference"] = {
            "evaluate_accuracy": model.evaluate(test_frame).accuracy(),
            "local_accuracy": local.evaluate(test).accuracy(),
            "scores": scores,
            "local_scores": local.score_examples(test).tolist(),
            "outputs": outputs,
            "local_outputs": local.output(test.features).tolist(),
        }
    graph_master = SharedTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    with SparkComputationGraph(spark, residual_graph(64, 10), graph_master) as model:
        model.fit(frame, epochs=EPOCHS)
        result["graph"] = {"accuracy": model.network.evaluate(test).accuracy()}
    try:
        with SparkMultiLayer(spark, mlp_conf(hidden=64)) as model:
            model.fit(frame, epoch_callback=lambda epoch, network: False)
    except EnvironmentNotReadyError as exc:
        result["callback_refused"] = str(exc)
    classifier = SparkgradClassifier(networkConf=mlp_conf(hidden=64), epochs=EPOCHS, batchSize=32)
    fitted = classifier.fit(frame)
    predicted = fitted.transform(test_frame).select("label", "prediction").collect()
    path = str(directory / "classifier")
    fitted.write().save(path)
    loaded = SparkgradClassificationModel.load(path)
    reloaded = loaded.transform(test_frame).select("prediction").collect()
    result["classifier"] = {
        "accuracy": fitted.network.evaluate(test).accuracy(),
        "transform_accuracy": sum(r["label"] == r["prediction"] for r in predicted) / len(predicted),
        "rows": len(predicted),
        "same_after_load": [r["prediction"] for r in reloaded] == [r["prediction"] for r in predicted],
    }
    result["sequences"] = _sequence_outputs(spark)
    grid = ParamGridBuilder().addGrid(classifier.epochs, [1, 2]).build()
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    validator = CrossValidator(estimator=classifier, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2)
    cross = validator.fit(frame)
    result["cross_validation"] = {
        "metrics": list(cross.avgMetrics),
        "best_accuracy": cross.bestModel.network.evaluate(test).accuracy(),
    }
    print("RESULT " + json.dumps(result, default=float), flush=True)
    spark.stop()


def _sequence_outputs(spark: SparkSession) -> dict[str, object]:
    """A sequence network's transform of a column of Vector time steps (the conversion's transform of
    vector_to_array runs in the Connect plan) against each sequence's output alone, locally."""
    conf = MultiLayerConfiguration(
        [LastTimeStep(LSTM(4)), OutputLayer(2)], input_type=InputType.recurrent(2), seed=3
    )
    network = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(0)
    seqs = [rng.normal(size=(int(rng.integers(2, 6)), 2)) for _ in range(20)]
    schema = T.StructType([T.StructField("series", T.ArrayType(VectorUDT()))])
    frame = spark.createDataFrame([([Vectors.dense(step) for step in s],) for s in seqs], schema)
    model = SparkgradClassificationModel(network).setFeaturesCol("series")
    got = np.array([r["probability"].toArray() for r in model.transform(frame.coalesce(1)).collect()])
    alone = np.concatenate([network.output(s.T[None].astype(np.float32)) for s in seqs])
    return {"rows": len(got), "max_difference": float(np.abs(got - alone).max())}


if __name__ == "__main__":
    main()
