"""The demo's fit repeated: how often its last epoch falls, and its bytes ratio, with the demo's learning
rate (Adam at 5e-3, annealed to 1e-3 for the last epoch) and optionally a constant Adam(5e-3)
(``--constant``), the rate under an epoch ExponentialSchedule (``--decay``), the workers applying only what
their messages carry (``--encoded``: ``own_update="encoded"``, DL4J's), or their updates scaled by
1/sqrt(workers) (``--sqrt``: ``update_combination="sqrt"``, where the default sums Adam's), alternating in one
Spark session. ``--local`` also trains each learning rate on one machine, without Spark: at the demo's batch
of 16 (``local``) and at DDP's batch of 2 x 16 (``ddp``), shuffled by the repeat's number, so a fall can be
told apart from gradient sharing.

Each Spark run is ``sparkgrad demo``'s training (sparkgrad.spark.demo: its network, data, master options and
6 epochs) with the test accuracy evaluated after every epoch. Per variant: final accuracy (mean, standard
deviation, minimum), how many runs ended below their fifth epoch and the largest such fall, and for Spark
the dense/sent bytes ratio as the demo reports it (every worker step's N float32 values, relayed to the
other worker, against the bytes on the wire).

Usage: PYTHONPATH=python python bench/python/bench_demo.py [--repeats 20] [--constant] [--decay 0.75]
    [--encoded] [--sqrt] [--local]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from local_spark import local_session

BATCH = 16  # the demo's batch_size_per_worker
WORKERS = 2  # the demo's local[2]


@dataclasses.dataclass(frozen=True)
class Variant:
    rate: str  # "annealed" (the demo's), "constant" (Adam(5e-3)) or "decay G" (ExponentialSchedule)
    trainer: str = "spark"  # or "local" (one network, batch 16), "ddp" (one network, batch 2 x 16)
    own_update: str = "full"
    combination: str = "auto"

    def name(self) -> str:
        rate = {"annealed": "Adam 5e-3, 1e-3 last epoch", "constant": "constant Adam(5e-3)"}.get(
            self.rate, f"ExponentialSchedule(epoch, 5e-3, {self.rate.split()[-1]})"
        )
        if self.trainer != "spark":
            return f"{rate}, {self.trainer}"
        return f"{rate}, own_update {self.own_update}, {self.combination}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--constant", action="store_true", help="also with a constant Adam(5e-3)")
    parser.add_argument("--decay", type=float, default=None, help="also with this epoch decay")
    parser.add_argument("--encoded", action="store_true", help="also with own_update='encoded'")
    parser.add_argument("--sqrt", action="store_true", help="also with update_combination='sqrt'")
    parser.add_argument("--local", action="store_true", help="also local and DDP-batch training")
    args = parser.parse_args()
    from sparkgrad.data import ListDataSetIterator
    from sparkgrad.datasets import load_digits
    from sparkgrad.nn import MultiLayerNetwork
    from sparkgrad.nn.schedules import ExponentialSchedule
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration
    from sparkgrad.spark.demo import demo_network

    def network(rate: str) -> MultiLayerNetwork:
        net = demo_network(args.epochs)
        if rate == "annealed":
            return net
        first = net.conf.updater.learning_rate.values[0]  # the demo's rate before it anneals
        updater = (
            Adam(first)
            if rate == "constant"
            else Adam(ExponentialSchedule("epoch", first, float(rate.split()[-1])))
        )
        return MultiLayerNetwork(dataclasses.replace(net.conf, updater=updater)).init()

    rates = ["annealed"] + ["constant"] * args.constant
    if args.decay is not None:
        rates.append(f"decay {args.decay:g}")
    variants = [Variant(rate) for rate in rates]
    variants += [Variant("annealed", own_update="encoded")] * args.encoded
    variants += [Variant("annealed", combination="sqrt")] * args.sqrt
    variants += [Variant(rate, trainer) for rate in rates for trainer in ("local", "ddp")] * args.local

    spark = local_session(f"local[{WORKERS}]")
    train, test = load_digits(test_fraction=0.2, seed=0, shape="image")
    rdd = spark.sparkContext.parallelize(train.split(1), WORKERS).cache()
    rdd.count()
    runs: dict[Variant, list[dict]] = {v: [] for v in variants}
    try:
        for rep in range(args.repeats):
            for variant in variants:
                curve: list[float] = []
                start = time.monotonic()
                run: dict = {**dataclasses.asdict(variant), "rep": rep, "accuracy": curve}
                if variant.trainer == "spark":
                    master = SharedTrainingMaster(
                        VoidConfiguration(unicast_port=0, controller_address="127.0.0.1"),
                        batch_size_per_worker=BATCH,
                        rng_seed=7,
                        own_update=variant.own_update,
                        update_combination=variant.combination,
                    )

                    def evaluate(epoch: int, net: MultiLayerNetwork, curve: list[float] = curve) -> None:
                        curve.append(float(net.evaluate(test).accuracy()))

                    with SparkMultiLayer(spark, network(variant.rate), master) as model:
                        model.fit(rdd, epochs=args.epochs, epoch_callback=evaluate)
                        traffic = master.last_traffic
                    steps = int(traffic["worker_minibatches"])
                    sent = int(traffic["worker_bytes_sent"] + traffic["controller_bytes_sent"])
                    run["ratio"] = steps * model.network.num_params() * 4 * 2 / sent
                else:
                    net = network(variant.rate)
                    size = BATCH * (WORKERS if variant.trainer == "ddp" else 1)
                    data = ListDataSetIterator(train, batch_size=size, shuffle=True, seed=rep)
                    for _ in range(args.epochs):
                        net.fit(data)
                        data.reset()
                        curve.append(float(net.evaluate(test).accuracy()))
                runs[variant].append(run)
                print(json.dumps({**run, "seconds": round(time.monotonic() - start, 2)}), flush=True)
    finally:
        spark.stop()
    for variant, results in runs.items():
        finals = [r["accuracy"][-1] for r in results]
        falls = [r["accuracy"][-2] - r["accuracy"][-1] for r in results]
        ratios = [r["ratio"] for r in results if "ratio" in r]
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        print(
            f"{variant.name():55s} runs {len(results)}  final {statistics.mean(finals):.4f} +- {spread:.4f} "
            f"(min {min(finals):.4f})  last epoch fell in {sum(f > 0 for f in falls)} "
            f"(max {max(falls):.4f})"
            + (f"  bytes ratio {min(ratios):.1f}-{max(ratios):.1f}x" if ratios else "")
        )


if __name__ == "__main__":
    main()
