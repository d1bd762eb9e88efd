"""A complete sparkgrad job for spark-submit: train on the digits data, save the model to any Hadoop URI.

    spark-submit --master local[2] train_digits.py file:///tmp/digits-mlp.zip
    spark-submit --master yarn --archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python \\
        train_digits.py hdfs:///models/digits-mlp.zip

docs/guides/cluster.md ("Shipping the environment") shows it; tests/spark/test_submit.py runs it.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from sparkgrad.datasets import load_digits
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import ParameterAveragingTrainingMaster, SparkMultiLayer


def main(model_uri: str, epochs: int = 3) -> None:
    spark = SparkSession.builder.appName("sparkgrad-digits").getOrCreate()
    train, test = load_digits(shape="flat")
    conf = MultiLayerConfiguration(
        [DenseLayer(64, activation="relu"), OutputLayer(10, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(64),
        updater=Adam(5e-3),
        seed=1,
    )
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=32, averaging_frequency=5, rng_seed=1)
    rdd = spark.sparkContext.parallelize(train.split(32), 2)
    with SparkMultiLayer(spark, conf, master) as model:
        model.fit(rdd, epochs=epochs)
        accuracy = model.evaluate(spark.sparkContext.parallelize(test.split(64), 2)).accuracy()
        model.network.save(model_uri)  # hdfs://, s3a://, file:// or a local path
    print(f"test accuracy {accuracy:.4f}; model saved to {model_uri}")
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
