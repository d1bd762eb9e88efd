"""Rows/s of SparkgradClassificationModel.transform against the mapInArrow of every column it replaced.

A DataFrame of ``--rows`` rows (a 64-value ml Vector of features, a label, an id and a text column,
cached) goes through three jobs in the same local Spark session, each forced with the "noop" sink:

- ``arrow_only``: ``vector_to_array`` of the features and an identity ``mapInArrow`` of that array
  alone, the floor of any Python inference on these rows;
- ``all_columns``: the previous transform, ``mapInArrow`` over every input column plus the features
  array, the network run per batch, every column sent back to the JVM;
- ``transform``: the model's ``transform`` (a scalar ``arrow_udf`` of the features alone, the
  outputs joined back to the rows in the JVM).

Each line prints rows/s (best of ``--repeats``) and the speed ratio to ``all_columns``.

Usage: PYTHONPATH=python python bench/python/bench_ml_transform.py [--rows 200000] [--master local[2]]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np


def _best_of(repeats: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyarrow as pa
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparkgrad.ml import SparkgradClassificationModel
    from sparkgrad.nn import DenseLayer, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer

    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.rows, 64))
        base = spark.createDataFrame(
            [(i, float(i % 10), f"row-{i}", x[i].tolist()) for i in range(args.rows)],
            "id long, label double, text string, values array<double>",
        )
        df = (
            base.repartition(args.partitions)
            .select("id", "label", "text", array_to_vector("values").alias("features"))
            .cache()
        )
        df.count()
        conf = MultiLayerConfiguration(
            [DenseLayer(32, n_in=64, activation="relu"), OutputLayer(10)], dtype="float32", seed=1
        )
        model = SparkgradClassificationModel(MultiLayerNetwork(conf).init())
        net_getter = model._network_getter(df)

        def identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            yield from batches

        arrays = df.select(vector_to_array("features", "float32").alias("x"))

        def arrow_only() -> None:
            arrays.mapInArrow(identity, arrays.schema).write.format("noop").mode("overwrite").save()

        source = df.withColumn("x", vector_to_array("features", "float32"))
        kept = len(df.columns)
        out_schema = T.StructType(
            df.schema.fields
            + [
                T.StructField("rawPrediction", T.ArrayType(T.DoubleType(), False), False),
                T.StructField("probability", T.ArrayType(T.DoubleType(), False), False),
                T.StructField("prediction", T.DoubleType(), False),
            ]
        )

        def predict_all(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            net = net_getter()
            for batch in batches:
                flat = batch.column(kept).flatten().to_numpy(zero_copy_only=False)
                p = net.output(flat.reshape(-1, 64)).astype(np.float64)
                offsets = pa.array(np.arange(0, p.size + 1, p.shape[1], dtype=np.int32))
                vec = pa.ListArray.from_arrays(offsets, pa.array(p.ravel()))
                cols = [batch.column(i) for i in range(kept)]
                yield pa.RecordBatch.from_arrays(
                    [*cols, vec, vec, pa.array(p.argmax(axis=1).astype(np.float64))],
                    names=[f.name for f in out_schema.fields],
                )

        def all_columns() -> None:
            mapped = source.mapInArrow(predict_all, out_schema)
            mapped.select(
                *df.columns,
                array_to_vector("rawPrediction").alias("rawPrediction"),
                array_to_vector("probability").alias("probability"),
                F.col("prediction"),
            ).write.format("noop").mode("overwrite").save()

        def transform() -> None:
            model.transform(df).write.format("noop").mode("overwrite").save()

        results = {
            name: _best_of(args.repeats, fn)
            for name, fn in (
                ("arrow_only", arrow_only),
                ("all_columns", all_columns),
                ("transform", transform),
            )
        }
        for name, seconds in results.items():
            print(
                f"{name:12s} rows={args.rows} {args.rows / seconds:12,.0f} rows/s  {seconds:6.2f} s  "
                f"speed vs all_columns {results['all_columns'] / seconds:5.2f}x"
            )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
