"""Fits with Spark's dynamic allocation on, every master and network type with default options.

    spark-submit --master local[2] --conf spark.dynamicAllocation.enabled=true \\
        --conf spark.dynamicAllocation.testing=true \\
        --conf spark.dynamicAllocation.shuffleTracking.enabled=true dynamic_allocation.py

Spark refuses barrier stages with dynamic allocation (SPARK-24942); the masters fall back to a Spark
job per epoch (SharedTrainingMaster) or per round (ParameterAveragingTrainingMaster). Prints one
``RESULT {json}`` line; tests/spark/test_dynamic_allocation.py runs it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/spark: the shared helpers
from helpers import mlp_conf, residual_graph  # noqa: E402

from sparkgrad.datasets import load_digits  # noqa: E402
from sparkgrad.ml import SparkgradClassifier  # noqa: E402
from sparkgrad.spark import (  # noqa: E402
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
)
from sparkgrad.spark.controller_fit import dynamic_allocation  # noqa: E402

EPOCHS = 3


def main() -> None:
    spark = SparkSession.builder.appName("sparkgrad-dynamic-allocation").getOrCreate()
    sc = spark.sparkContext
    train, test = load_digits(shape="flat")
    rdd = sc.parallelize(train.split(32), 2)
    result: dict[str, object] = {"dynamic_allocation": dynamic_allocation(sc)}
    shared = SharedTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    with SparkMultiLayer(spark, mlp_conf(hidden=64), shared) as model:
        model.fit(rdd, epochs=EPOCHS)
        result["shared"] = {
            "accuracy": model.network.evaluate(test).accuracy(),
            "spark_jobs": shared.last_traffic["spark_jobs"],
            "epochs": model.network.epoch_count,
        }
    averaging = ParameterAveragingTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    with SparkMultiLayer(spark, mlp_conf(hidden=64), averaging) as model:
        model.fit(rdd, epochs=EPOCHS)
        result["averaging"] = {
            "accuracy": model.network.evaluate(test).accuracy(),
            "epochs": model.network.epoch_count,
        }
    graph_master = SharedTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    with SparkComputationGraph(spark, residual_graph(64, 10), graph_master) as model:
        model.fit(rdd, epochs=EPOCHS)
        result["graph"] = {
            "accuracy": model.network.evaluate(test).accuracy(),
            "spark_jobs": graph_master.last_traffic["spark_jobs"],
        }
    rows = [(x.tolist(), int(y)) for x, y in zip(train.features, train.labels.argmax(1))]
    frame = spark.createDataFrame(rows, ["features", "label"]).repartition(2)
    classifier = SparkgradClassifier(networkConf=mlp_conf(hidden=64), epochs=EPOCHS, batchSize=32)
    result["classifier"] = {"accuracy": classifier.fit(frame).network.evaluate(test).accuracy()}
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
