"""Fits whose training task fails once mid-epoch, on ``local[2,2]`` (Spark retries a failed task once
there), for tests/spark/test_task_retries.py:

    spark-submit --master local[2,2] task_retry.py DIRECTORY

The digits are saved as one file per 32-example DataSet and trained through ``fit_paths`` with a loader
that Spark calls on the executors for every file in every epoch, and that logs each call, by partition
and task attempt, to ``DIRECTORY/calls/``. For each master the job fits the data clean, then with the
loader raising once, at a chosen call of partition 0's task (in its second epoch for gradient sharing).
Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from pyspark import TaskContext
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/spark: the shared helpers
from helpers import mlp_conf  # noqa: E402

from sparkgrad.data import DataSet  # noqa: E402
from sparkgrad.datasets import load_digits  # noqa: E402
from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkMultiLayer  # noqa: E402

EPOCHS = 3


class LoggingLoader:
    """Loads a saved DataSet and logs the call as ``partition attempt`` in ``log``; raises once, when
    partition 0's calls (every attempt and task so far) reach ``fail_at``."""

    def __init__(self, log: str, fail_at: int | None = None) -> None:
        self.log, self.fail_at = log, fail_at

    def __call__(self, path: str) -> DataSet:
        context = TaskContext.get()
        if context is None:  # the driver's check of the first file
            return DataSet.load(path)
        partition, attempt = context.partitionId(), context.attemptNumber()
        name = os.path.join(self.log, f"{partition}-{attempt}")
        with open(name, "a") as f:
            f.write(f"{path}\n")
        if self.fail_at is not None and partition == 0:
            calls = sum(_lines(os.path.join(self.log, n)) for n in os.listdir(self.log) if n.startswith("0-"))
            if calls == self.fail_at:
                raise RuntimeError(f"injected failure at call {calls} of partition 0")
        return DataSet.load(path)


def _lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def _calls(log: Path) -> dict[str, int]:
    return {p.name: _lines(str(p)) for p in sorted(log.iterdir())}


def _fit(spark, paths, test, master, log: Path, fail_at: int | None) -> dict[str, object]:
    log.mkdir(parents=True)
    with SparkMultiLayer(spark, mlp_conf(hidden=64), master) as model:
        model.fit_paths(paths, LoggingLoader(str(log), fail_at), epochs=EPOCHS)
        net = model.network
        traffic = dict(getattr(master, "last_traffic", {}))
        return {
            "epoch_count": int(net.epoch_count),
            "accuracy": float(net.evaluate(test).accuracy()),
            "params_sha256": hashlib.sha256(net.params().tobytes()).hexdigest(),
            "retries": dict(getattr(master, "last_retries", {})),
            "traffic": {k: traffic[k] for k in ("retrained_minibatches", "epochs") if k in traffic},
            "calls": _calls(log),
        }


def main() -> None:
    root = Path(sys.argv[1])
    spark = SparkSession.builder.appName("sparkgrad-task-retry").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    train, test = load_digits(shape="flat")
    files = []
    for i, part in enumerate(train.split(32)):
        files.append(str(root / "data" / f"{i:03d}.bin"))
        os.makedirs(root / "data", exist_ok=True)
        part.save(files[-1])
    paths = spark.sparkContext.parallelize(files, 2)

    def averaging():
        return ParameterAveragingTrainingMaster(
            batch_size_per_worker=32,
            averaging_frequency=3,
            rng_seed=1,
            progress=False,
            averaging_jobs="per_round",
        )

    def sharing():
        return SharedTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)

    result: dict[str, object] = {}
    clean = _fit(spark, paths, test, averaging(), root / "averaging-clean", None)
    partition0 = clean["calls"]["0-0"]
    result["averaging"] = {
        "clean": clean,
        "faulty": _fit(spark, paths, test, averaging(), root / "averaging-faulty", partition0 // 2),
    }
    clean = _fit(spark, paths, test, sharing(), root / "sharing-clean", None)
    per_epoch = clean["calls"]["0-0"] // EPOCHS  # partition 0's files, loaded once per epoch
    result["sharing"] = {
        "clean": clean,
        "per_epoch": per_epoch,
        "faulty": _fit(spark, paths, test, sharing(), root / "sharing-faulty", per_epoch + 3),
    }
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
