"""A checkpointed fit for tests/spark/test_checkpoints.py, run as a Spark driver of its own (killed by
the test with SIGKILL mid-epoch, then run again to resume).

    spark-submit checkpointed_fit.py MASTER DIRECTORY train
    spark-submit checkpointed_fit.py MASTER DIRECTORY resume

``train`` fits ``EPOCHS`` epochs with a checkpoint after every epoch and prints ``EPOCH n`` (flushed)
at every epoch end, so that the test can kill it once a checkpoint is on disk. ``resume`` runs the same
fit with ``resume=True``, then the same fit uninterrupted in a fresh directory, and prints one
``RESULT {json}`` line: for each, the epochs the call trained, the final epoch count, the accuracy on the
held-out digits and the parameters' SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/spark: the shared helpers
from helpers import mlp_conf  # noqa: E402

from sparkgrad.data import DataSet  # noqa: E402
from sparkgrad.datasets import load_digits  # noqa: E402
from sparkgrad.spark import (  # noqa: E402
    CheckpointConfig,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
)

EPOCHS = 6
HIDDEN = 256
COPIES = 40


def _master(kind: str):
    if kind == "shared":
        return SharedTrainingMaster(batch_size_per_worker=16, rng_seed=3, progress=False)
    return ParameterAveragingTrainingMaster(batch_size_per_worker=16, rng_seed=3, progress=False)


def _fit(spark, rdd, test: DataSet, kind: str, directory: str, resume: bool) -> dict[str, object]:
    trained: list[int] = []

    def report(epoch: int, network) -> bool:
        trained.append(epoch)
        print(f"EPOCH {epoch}", flush=True)
        return False

    with SparkMultiLayer(spark, mlp_conf(hidden=HIDDEN), _master(kind)) as model:
        model.fit(
            rdd, epochs=EPOCHS, epoch_callback=report, checkpoint=CheckpointConfig(directory), resume=resume
        )
        net = model.network
        return {
            "trained": trained,
            "epoch_count": int(net.epoch_count),
            "accuracy": float(net.evaluate(test).accuracy()),
            "params_sha256": hashlib.sha256(net.params().tobytes()).hexdigest(),
        }


def main() -> None:
    kind, directory, mode = sys.argv[1:4]
    spark = SparkSession.builder.appName("sparkgrad-checkpointed-fit").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    train, test = load_digits(shape="flat")
    # noisy copies of the digits: epochs long enough (a second or more) for a kill to land inside one
    rng = np.random.default_rng(0)
    copies = [
        train.features + rng.normal(0.0, 0.1, train.features.shape).astype(np.float32) for _ in range(COPIES)
    ]
    data = DataSet.merge([DataSet(x, train.labels) for x in copies])
    rdd = spark.sparkContext.parallelize(data.split(16), 2)
    if mode == "train":
        _fit(spark, rdd, test, kind, directory, resume=False)
        return
    resumed = _fit(spark, rdd, test, kind, directory, resume=True)
    uninterrupted = _fit(spark, rdd, test, kind, tempfile.mkdtemp(prefix="uninterrupted-"), resume=False)
    print("RESULT " + json.dumps({"resumed": resumed, "uninterrupted": uninterrupted}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
