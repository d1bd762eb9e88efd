"""Accuracy curves of asynchronous gradient sharing with and without SharedTrainingMaster's staleness bound,
on the 2-worker namespace cluster (bench/cluster/cluster.py, links shaped to 1 Gbit/s).

Model and data as tests/cluster: scikit-learn's bundled digits (80/20 split), MLP 64-128-10 (ReLU,
softmax), Adam(3e-3), minibatch 16 per worker, one partition per worker, 20 epochs in one barrier job.
Minibatches take about a millisecond, so a controller that relays updates a few tens of milliseconds late
leaves a worker training dozens of minibatches without its peer's updates.

For every --bounds value and every --seeds value (model initialisation and data order) it prints the test
accuracy after each epoch, then a table per bound: the mean over seeds of the lowest accuracy of the last
8 epochs, the mean of the final accuracy, the worst drop of any epoch below the best accuracy reached
before it, and the workers' waits for the bound (count, total ms) and the fit's wall time.

Needs root, ip netns and Java 17. Usage (as root):
    PYTHONPATH=python python bench/cluster/bench_staleness.py [--bounds 0 4] [--seeds 1 2 3 4 5 6]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster as harness  # noqa: E402

WORKERS = 2
HIDDEN = 128
LR = 3e-3
BATCH = 16


def network_conf(seed: int):
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam

    return MultiLayerConfiguration(
        [DenseLayer(HIDDEN, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(LR),
        seed=seed,
    )


def accuracy(network, test) -> float:
    return float(np.mean(network.output(test.features).argmax(1) == test.labels.argmax(1)))


def worst_drop(curve: list[float]) -> float:
    """The largest fall of an epoch's accuracy below the best accuracy of the epochs before it."""
    best = np.maximum.accumulate(curve)
    return float(max(0.0, np.max(best[:-1] - np.asarray(curve[1:])))) if len(curve) > 1 else 0.0


def fit_curve(spark, info, rdd, test, bound: int, seed: int, epochs: int) -> dict:
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration

    with socket.socket() as s:
        s.bind((info.driver_host, 0))
        port = int(s.getsockname()[1])
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port, network_mask="198.18.0.0/24"),
        batch_size_per_worker=BATCH,
        rng_seed=seed,
        staleness_bound=bound,
        progress=False,
    )
    model = SparkMultiLayer(spark, network_conf(seed), master)
    curve: list[float] = []
    start = time.perf_counter()
    model.fit(rdd, epochs=epochs, epoch_callback=lambda epoch, net: curve.append(accuracy(net, test)))
    seconds = time.perf_counter() - start
    traffic = model.training_master.last_traffic
    return {
        "curve": curve,
        "seconds": seconds,
        "waits": traffic.get("worker_paced_waits", 0.0),
        "wait_ms": traffic.get("worker_paced_wait_ms", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bounds", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    reason = harness.unavailable_reason()
    if reason:
        sys.exit(f"bench_staleness: {reason}")
    from sparkgrad.datasets import load_digits

    train, test = load_digits(test_fraction=0.2, seed=0, shape="flat")
    with tempfile.TemporaryDirectory(prefix="sparkgrad-staleness-") as tmp:
        state = os.path.join(tmp, "cluster")
        info = harness.up(WORKERS, rate="1gbit", delay=None, state_dir=state)
        try:
            spark = harness.spark_session(info, "sparkgrad-bench-staleness", os.path.join(tmp, "driver"))
            spark.sparkContext.setLogLevel("ERROR")
            harness.wait_for_executors(spark, WORKERS)
            rdd = spark.sparkContext.parallelize(train.split(1), WORKERS).cache()
            results: dict[int, list[dict]] = {}
            for bound in args.bounds:
                for seed in args.seeds:
                    r = fit_curve(spark, info, rdd, test, bound, seed, args.epochs)
                    results.setdefault(bound, []).append(r)
                    print(
                        f"staleness_bound={bound} seed {seed}: " + " ".join(f"{a:.3f}" for a in r["curve"]),
                        flush=True,
                    )
            spark.stop()
        finally:
            harness.down(state)
    print()
    print("| staleness_bound | min of last 8 epochs | final | worst drop | waits per fit | wait ms | fit s |")
    print("|---|---|---|---|---|---|---|")
    for bound, runs in results.items():
        print(
            f"| {bound} | {statistics.mean(min(r['curve'][-8:]) for r in runs):.3f} "
            f"| {statistics.mean(r['curve'][-1] for r in runs):.3f} "
            f"| {max(worst_drop(r['curve']) for r in runs):.3f} "
            f"| {statistics.mean(r['waits'] for r in runs):.0f} "
            f"| {statistics.mean(r['wait_ms'] for r in runs):.0f} "
            f"| {statistics.median(r['seconds'] for r in runs):.1f} |"
        )


if __name__ == "__main__":
    main()
