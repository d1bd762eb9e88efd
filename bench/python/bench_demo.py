"""The demo's fit repeated: how often its last epoch falls, and its bytes ratio, with the demo's constant
Adam(5e-3) and optionally the same rate under an epoch ExponentialSchedule, the workers applying only what
their messages carry (``--encoded``: ``own_update="encoded"``, DL4J's), or their updates scaled by
1/sqrt(workers) (``--sqrt``: ``update_combination="sqrt"``, where the default sums Adam's), alternating in one
Spark session.

Each run is ``sparkgrad demo``'s training (sparkgrad.spark.demo: its network, data, master options and 6
epochs) with the test accuracy evaluated after every epoch. Per variant: final accuracy (mean, standard
deviation, minimum), how many runs ended below their fifth epoch and the largest such fall, and the
dense/sent bytes ratio as the demo reports it (every worker step's N float32 values, relayed to the other
worker, against the bytes on the wire).

Usage: PYTHONPATH=python python bench/python/bench_demo.py [--repeats 20] [--decay 0.75] [--encoded] [--sqrt]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from local_spark import local_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--decay", type=float, default=None, help="also with this epoch decay")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--encoded", action="store_true", help="also with own_update='encoded'")
    parser.add_argument("--sqrt", action="store_true", help="also with update_combination='sqrt'")
    args = parser.parse_args()
    from sparkgrad.datasets import load_digits
    from sparkgrad.nn import MultiLayerNetwork
    from sparkgrad.nn.schedules import ExponentialSchedule
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration
    from sparkgrad.spark.demo import demo_network

    def network(decay: float | None) -> MultiLayerNetwork:
        net = demo_network()
        if decay is None:
            return net
        rule = net.conf.updater
        rate = ExponentialSchedule("epoch", rule.learning_rate, decay)
        scheduled = dataclasses.replace(rule, learning_rate=rate)
        return MultiLayerNetwork(dataclasses.replace(net.conf, updater=scheduled)).init()

    spark = local_session("local[2]")
    train, test = load_digits(test_fraction=0.2, seed=0, shape="image")
    rdd = spark.sparkContext.parallelize(train.split(1), 2).cache()
    rdd.count()
    # (epoch decay or None, own_update, update_combination)
    variants: list[tuple[float | None, str, str]] = [(None, "full", "auto")]
    if args.decay is not None:
        variants.append((args.decay, "full", "auto"))
    if args.encoded:
        variants.append((None, "encoded", "auto"))
    if args.sqrt:
        variants.append((None, "full", "sqrt"))
    runs: dict[tuple[float | None, str, str], list[dict]] = {v: [] for v in variants}
    try:
        for rep in range(args.repeats):
            for decay, own_update, combination in variants:
                master = SharedTrainingMaster(
                    VoidConfiguration(unicast_port=0, controller_address="127.0.0.1"),
                    batch_size_per_worker=16,
                    rng_seed=7,
                    own_update=own_update,
                    update_combination=combination,
                )
                curve: list[float] = []

                def evaluate(epoch: int, net: MultiLayerNetwork, curve: list[float] = curve) -> None:
                    curve.append(float(net.evaluate(test).accuracy()))

                start = time.monotonic()
                with SparkMultiLayer(spark, network(decay), master) as model:
                    model.fit(rdd, epochs=args.epochs, epoch_callback=evaluate)
                    traffic = master.last_traffic
                steps = int(traffic["worker_minibatches"])
                sent = int(traffic["worker_bytes_sent"] + traffic["controller_bytes_sent"])
                ratio = steps * model.network.num_params() * 4 * 2 / sent
                run = {
                    "decay": decay,
                    "own_update": own_update,
                    "update_combination": combination,
                    "rep": rep,
                    "accuracy": curve,
                    "ratio": ratio,
                }
                runs[decay, own_update, combination].append(run)
                print(json.dumps({**run, "seconds": round(time.monotonic() - start, 2)}), flush=True)
    finally:
        spark.stop()
    for (decay, own_update, combination), results in runs.items():
        finals = [r["accuracy"][-1] for r in results]
        falls = [r["accuracy"][-2] - r["accuracy"][-1] for r in results]
        ratios = [r["ratio"] for r in results]
        name = "constant Adam(5e-3)" if decay is None else f"ExponentialSchedule(epoch, 5e-3, {decay:g})"
        name += f", own_update {own_update}, {combination}"
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        print(
            f"{name:55s} runs {len(results)}  final {statistics.mean(finals):.4f} +- {spread:.4f} "
            f"(min {min(finals):.4f})  last epoch fell in {sum(f > 0 for f in falls)} "
            f"(max {max(falls):.4f})  bytes ratio {min(ratios):.1f}-{max(ratios):.1f}x"
        )


if __name__ == "__main__":
    main()
