"""Spark ML fit time on a large DataFrame: SparkgradClassifier with ParameterAveragingTrainingMaster, its
rounds in one Spark job (averaging_jobs="one", the default) against DL4J's Spark job per round
("per_round"), with SharedTrainingMaster (the estimators' default) as a reference, and with ``--local`` the
same network trained on one machine over the same rows (batch --batch, and DDP's 2 x --batch) for the
accuracy the hyperparameters give without Spark.

Data: a DataFrame of --rows rows, 64 features (digits with Gaussian pixel noise, sd --noise, around the
1437 training digits) and a label column; the test set is the 360 held-out digits. Model: MLP
64-128-10 (ReLU, softmax), Adam(1e-2), --epochs epochs, batchSize --batch per worker, 2 workers on
local[2]; ParameterAveraging averages every 5 minibatches (its default): rows / (2 x batch x 5) rounds an
epoch. The contenders run alternately for --repeats rounds; the table gives the median fit time (the
DataFrame is cached and counted before any fit) and the median test accuracy, and each contender's time
as a ratio to ParameterAveraging's job per round measured in the same run.

Usage: PYTHONPATH=python python bench/python/bench_spark_ml_fit.py [--rows 200000] [--repeats 2] [--local]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from local_spark import local_session


def _frame(spark, rows: int, noise: float, seed: int):
    from pyspark.ml.linalg import Vectors

    from sparkgrad.data import DataSet
    from sparkgrad.datasets import load_digits

    train, test = load_digits(test_fraction=0.2, seed=0, shape="flat")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, train.num_examples(), rows)
    x = train.features[pick] + rng.normal(0, noise, (rows, 64)).astype(np.float32)
    y = train.labels.argmax(1)[pick]
    data = [(Vectors.dense(row), float(label)) for row, label in zip(x.tolist(), y.tolist())]
    df = spark.createDataFrame(data, ["features", "label"]).repartition(2).cache()
    df.count()
    return df, test, DataSet(x, np.eye(10, dtype=np.float32)[y])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-shared", action="store_true", help="leave out SharedTrainingMaster")
    parser.add_argument("--local", action="store_true", help="also train on one machine, no Spark")
    args = parser.parse_args()

    from sparkgrad.data import ListDataSetIterator
    from sparkgrad.ml import SparkgradClassifier
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

    spark = local_session("local[2]")
    conf = MultiLayerConfiguration(
        [DenseLayer(128, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-2),
        seed=1,
    )
    masters = {
        "ParameterAveraging, job per round": lambda: ParameterAveragingTrainingMaster(
            averaging_jobs="per_round", rng_seed=1, progress=False
        ),
        "ParameterAveraging, one job": lambda: ParameterAveragingTrainingMaster(rng_seed=1, progress=False),
    }
    if not args.skip_shared:
        masters["SharedTrainingMaster (default)"] = lambda: SharedTrainingMaster(progress=False)
    try:
        df, test, rows = _frame(spark, args.rows, args.noise, seed=0)

        def on_spark(make):  # a fit through the estimator with this master
            def fit(repeat: int):
                classifier = SparkgradClassifier(
                    networkConf=conf, trainingMaster=make(), epochs=args.epochs, batchSize=args.batch
                )
                return classifier.fit(df).network

            return fit

        def on_one_machine(batch: int):  # the same rows, shuffled by the repeat's number
            def fit(repeat: int):
                net = MultiLayerNetwork(conf).init()
                data = ListDataSetIterator(rows, batch_size=batch, shuffle=True, seed=repeat)
                net.fit(data, epochs=args.epochs)
                return net

            return fit

        contenders = {name: on_spark(make) for name, make in masters.items()}
        if args.local:
            contenders[f"one machine, batch {args.batch}"] = on_one_machine(args.batch)
            contenders[f"one machine, batch {2 * args.batch} (DDP's)"] = on_one_machine(2 * args.batch)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        accuracies: dict[str, list[float]] = {name: [] for name in contenders}
        for repeat in range(args.repeats):
            for name, fit in contenders.items():
                start = time.monotonic()
                network = fit(repeat)
                times[name].append(time.monotonic() - start)
                accuracies[name].append(network.evaluate(test).accuracy())
                print(
                    f"repeat {repeat} {name}: {times[name][-1]:.1f} s, accuracy {accuracies[name][-1]:.4f}",
                    flush=True,
                )
    finally:
        spark.stop()
    base = statistics.median(times["ParameterAveraging, job per round"])
    rounds = -(-args.rows // (2 * args.batch * 5))
    print(
        f"{args.rows} rows, {args.epochs} epochs, batch {args.batch}, 2 workers on local[2], about {rounds} "
        f"averaging rounds an epoch; medians of {args.repeats} alternating runs"
    )
    print(f"{'contender':36s} {'fit s':>7s} {'accuracy':>8s} {'time / per-round':>16s}")
    for name in contenders:
        median = statistics.median(times[name])
        print(f"{name:36s} {median:7.1f} {statistics.median(accuracies[name]):8.4f} {median / base:16.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
