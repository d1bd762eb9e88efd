"""What early stopping's two ways of scoring cost a fit: validation data on the driver (scored in the
epoch callback, the fit stays one Spark job) against validation data as an RDD (scored by a Spark job
between fits of one epoch each), beside a plain fit of the same epochs.

Data: --copies noisy copies (Gaussian pixel noise, sd 0.1) of the 1437 training digits as DataSets of 32,
two partitions, cached; validation: the 360 held-out digits (one DataSet, or an RDD of 6 DataSets of 64).
Model: MLP 64-256-10, Adam(1e-2). SharedTrainingMaster (batch 32, rng_seed 1) and ParameterAveraging (its
default one job, frequency 5) on local[2]; --epochs epochs (MaxEpochsTerminationCondition, no other
condition, so every contender trains the same epochs). Rounds alternate the three contenders --repeats
times; the table gives median seconds of the whole call and the ratio to the plain fit.

Usage: PYTHONPATH=python python bench/python/bench_early_stopping.py [--copies 10] [--epochs 5]
    [--repeats 3] [--out bench/results/checkpoints/early_stopping.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from local_spark import local_session  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE.parent / "results" / "checkpoints" / "early_stopping.json"))
    args = parser.parse_args()

    import numpy as np

    from sparkgrad.data import DataSet
    from sparkgrad.datasets import load_digits
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import (
        DataSetLossCalculator,
        EarlyStoppingConfiguration,
        MaxEpochsTerminationCondition,
        ParameterAveragingTrainingMaster,
        SharedTrainingMaster,
        SparkEarlyStoppingTrainer,
        SparkMultiLayer,
    )

    spark = local_session("local[2]")
    sc = spark.sparkContext
    train, test = load_digits(shape="flat")
    rng = np.random.default_rng(0)
    copies = [
        train.features + rng.normal(0, 0.1, train.features.shape).astype(np.float32)
        for _ in range(args.copies)
    ]
    rdd = sc.parallelize(DataSet.merge([DataSet(x, train.labels) for x in copies]).split(32), 2).cache()
    rdd.count()
    test_rdd = sc.parallelize(test.split(64), 2).cache()
    test_rdd.count()
    conf = MultiLayerConfiguration(
        [DenseLayer(256, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-2),
        seed=1,
    )
    masters = {
        "SharedTrainingMaster": lambda: SharedTrainingMaster(
            batch_size_per_worker=32, rdd_data_set_num_examples=32, rng_seed=1, progress=False
        ),
        "ParameterAveraging": lambda: ParameterAveragingTrainingMaster(
            batch_size_per_worker=32, rdd_data_set_num_examples=32, rng_seed=1, progress=False
        ),
    }

    def plain(model) -> None:
        model.fit(rdd, epochs=args.epochs)

    def driver_scored(model) -> None:
        config = EarlyStoppingConfiguration(
            DataSetLossCalculator(test), [MaxEpochsTerminationCondition(args.epochs)]
        )
        SparkEarlyStoppingTrainer(model, config, rdd).fit()

    def executor_scored(model) -> None:
        config = EarlyStoppingConfiguration(
            DataSetLossCalculator(test_rdd), [MaxEpochsTerminationCondition(args.epochs)]
        )
        SparkEarlyStoppingTrainer(model, config, rdd).fit()

    contenders = {
        "plain fit": plain,
        "validation on the driver": driver_scored,
        "validation as an RDD": executor_scored,
    }
    seconds: dict[str, dict[str, list[float]]] = {m: {c: [] for c in contenders} for m in masters}
    for repeat in range(args.repeats):
        for master_name, make in masters.items():
            for name, run in contenders.items():
                with SparkMultiLayer(spark, conf, make()) as model:
                    start = time.perf_counter()
                    run(model)
                    seconds[master_name][name].append(time.perf_counter() - start)
                    assert model.network.epoch_count == args.epochs
                print(
                    f"repeat {repeat} {master_name} {name}: {seconds[master_name][name][-1]:.2f} s",
                    flush=True,
                )
    lines = ["| master | contender | median s | / plain fit |", "|---|---|---|---|"]
    for master_name, by_name in seconds.items():
        base = statistics.median(by_name["plain fit"])
        for name, values in by_name.items():
            median = statistics.median(values)
            lines.append(f"| {master_name} | {name} | {median:.2f} | {median / base:.2f}x |")
    print("\n".join(lines))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "seconds": seconds, "table": lines}, indent=1) + "\n"
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
