"""A fit whose data is larger than the JVM heap, with the masters' default options (spark-submit job).

    spark-submit --master local[2] --driver-memory 512m fit_past_heap.py ROWS EXPORT_DIR

The DataSets (256 examples of 64 float32 features and 10 one-hot labels each) are made on the executors, so
the driver never holds them. Prints one ``RESULT {json}`` line; tests/spark/test_data_scale.py runs it.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from pyspark.sql import SparkSession

from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer

EXAMPLES = 256


def make(index: int) -> DataSet:
    rng = np.random.default_rng(index)
    x = rng.normal(size=(EXAMPLES, 64)).astype(np.float32)
    return DataSet(x, np.eye(10, dtype=np.float32)[(x[:, :10]).argmax(1)])


def main(rows: int, export_dir: str) -> None:
    spark = SparkSession.builder.appName("sparkgrad-past-heap").getOrCreate()
    sc = spark.sparkContext
    conf = MultiLayerConfiguration(
        [DenseLayer(16, activation="relu"), OutputLayer(10, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-3),
        seed=1,
    )
    master = SharedTrainingMaster(
        batch_size_per_worker=EXAMPLES,
        export_directory=export_dir,
        collect_training_stats=True,
        progress=False,
    )
    data = sc.parallelize(range(rows // EXAMPLES), 4).map(make)
    with SparkMultiLayer(spark, conf, master) as model:
        model.fit(data)
        stats = model.training_stats
        test = make(-1 % 2**31)
        result = {
            "heap_max": int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory()),
            "data_bytes": rows * (64 + 10) * 4,
            "exported": stats.counters["training_approach_export"],
            "minibatches": stats.counters["worker_minibatches"],
            "iterations": int(model.network.iteration_count),
            "score": model.network.score(test),
        }
        master.delete_temp_files(spark)
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
