"""The fit modes dynamic allocation forces, against the barrier job on the same data: SharedTrainingMaster's
Spark job per epoch and ParameterAveraging's job per round, timed beside their one-job barrier fits.

Every run is a fresh ``local[2]`` Spark in a child process, with dynamic allocation on (Spark's testing
switch, shuffle tracking) or off, alternating for --repeats rounds. Data: --rows digits with Gaussian
pixel noise (sd 0.1) around the 1437 training digits, as DataSets of 32; model: MLP 64-128-10, Adam(1e-2),
--epochs epochs, batch 32 per worker, rng_seed 1; the held-out 360 digits give the accuracy. Seconds are
the whole ``fit`` call. The table gives medians and the ratio of each mode to the barrier fit.

Usage: PYTHONPATH=python python bench/python/bench_dynamic_allocation.py [--rows 100000] [--epochs 3]
    [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DYNAMIC = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.testing": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
}


def child(rows: int, epochs: int, dynamic: bool) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).parent))
    from local_spark import local_session

    from sparkgrad.data import DataSet
    from sparkgrad.datasets import load_digits
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkMultiLayer

    spark = local_session("local[2]", DYNAMIC if dynamic else {})
    train, test = load_digits(test_fraction=0.2, seed=0, shape="flat")
    rng = np.random.default_rng(0)
    pick = rng.integers(0, train.num_examples(), rows)
    x = train.features[pick] + rng.normal(0, 0.1, (rows, 64)).astype(np.float32)
    data = spark.sparkContext.parallelize(DataSet(x, train.labels[pick]).split(32), 2).cache()
    data.count()
    conf = MultiLayerConfiguration(
        [DenseLayer(128, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-2),
        seed=1,
    )
    out: dict[str, float] = {}
    masters = {
        "shared": lambda: SharedTrainingMaster(
            batch_size_per_worker=32, rdd_data_set_num_examples=32, rng_seed=1, progress=False
        ),
        "averaging": lambda: ParameterAveragingTrainingMaster(
            batch_size_per_worker=32, rdd_data_set_num_examples=32, rng_seed=1, progress=False
        ),
    }
    try:
        for name, make in masters.items():
            with SparkMultiLayer(spark, conf, make()) as model:
                start = time.monotonic()
                model.fit(data, epochs=epochs)
                out[f"{name}_s"] = time.monotonic() - start
                out[f"{name}_accuracy"] = model.network.evaluate(test).accuracy()
    finally:
        spark.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["barrier", "dynamic"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.rows, args.epochs, args.child == "dynamic")), flush=True)
        return 0
    runs: dict[str, list[dict[str, float]]] = {"barrier": [], "dynamic": []}
    for repeat in range(args.repeats):
        for mode in runs:
            size = [f"--rows={args.rows}", f"--epochs={args.epochs}"]
            command = [sys.executable, __file__, f"--child={mode}", *size]
            done = subprocess.run(command, capture_output=True, text=True)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if done.returncode or not lines:
                print(f"{mode} failed:\n{done.stderr[-3000:]}")
                return 1
            runs[mode].append(json.loads(lines[-1][len("RESULT ") :]))
            print(f"repeat {repeat} {mode}: {runs[mode][-1]}", flush=True)
    print(f"\n{args.rows} rows, {args.epochs} epochs, batch 32, local[2], medians of {args.repeats} runs")
    print(f"{'master':10s} {'barrier s':>9s} {'dynamic s':>9s} {'dynamic / barrier':>17s} {'accuracy':>15s}")
    for name in ("shared", "averaging"):
        b = statistics.median(r[f"{name}_s"] for r in runs["barrier"])
        d = statistics.median(r[f"{name}_s"] for r in runs["dynamic"])
        ab = statistics.median(r[f"{name}_accuracy"] for r in runs["barrier"])
        ad = statistics.median(r[f"{name}_accuracy"] for r in runs["dynamic"])
        print(f"{name:10s} {b:9.1f} {d:9.1f} {d / b:17.2f} {ab:7.3f}/{ad:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
