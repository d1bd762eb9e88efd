"""Time to accuracy and bytes per step on digits: SharedTrainingMaster (default options) and
ParameterAveragingTrainingMaster (its rounds in one Spark job, the default, and DL4J's Spark job per
round) against PySpark's TorchDistributor running dense DDP (gloo, CPU), with the same data, split,
model, optimizer, minibatch and workers.

Model: MLP 64-256-256-10 (ReLU, softmax), Adam(--lr), minibatch 32 per worker, 2 workers on local[2].
Every contender trains until the test accuracy reaches --target (or --max-epochs) and evaluates the
test set after every epoch inside its timed run: sparkgrad through ``fit(rdd, epochs, epoch_callback)``
(the callback evaluates and stops the fit), DDP inside its training function. This is repeated for
every --seeds (model initialisation and data order); the table reports the median over the seeds of
epochs to the target and of wall time, and the mean bytes per step.

SharedTrainingMaster runs with its defaults (nothing tuned for this data): one partition per worker,
every epoch of a fit in one Spark job, default_threshold_algorithm() (a 3e-3 sparsity target, starting at
the first update's target quantile, at most 2e-2), no residual clipping. ``--dl4j`` adds a row with
DL4J's defaults (AdaptiveThresholdAlgorithm(), ResidualClippingPostProcessor(5, 5), one minibatch per
partition).

Bytes per step = bytes on the wire per worker minibatch:
- SharedTrainingMaster: measured UPDATE frames (worker sends + controller relays) / worker steps.
- ParameterAveraging: every round each worker receives parameters + updater state and sends them back:
  2 * (4N + updater bytes) per worker per round, divided by the minibatches per round.
- DDP: ring all-reduce of the float32 gradient: 2 (W-1)/W * 4N per worker per step.

Wall time excludes the SparkSession start-up (reported once; every contender needs it) and includes
everything else: TorchDistributor's process launch, sparkgrad's data preparation and Spark jobs.
TorchDistributor runs in local mode (torchrun on the driver machine): its executor mode needs pandas
and pyarrow, which the benchmark environment does not install.

Usage: PYTHONPATH=python python bench/python/bench_spark_digits.py [--target 0.97] [--seeds 1 2 3]
       [--fixed-start] [--dl4j] [--encoded] [--sqrt] [--sparsity 3e-3 ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from local_spark import local_session

WORKERS = 2
BATCH = 32
HIDDEN = (256, 256)
LR = 3e-3


def sparkgrad_network(lr: float, seed: int):
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
    from sparkgrad.nn.updaters import Adam

    conf = MultiLayerConfiguration(
        [DenseLayer(h, activation="relu") for h in HIDDEN] + [OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(lr),
        seed=seed,
    )
    return MultiLayerNetwork(conf).init()


def run_sparkgrad(spark, master, rdd, test, target, max_epochs, lr, seed):
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer

    accuracies: list[float] = []

    def evaluate(epoch, network):
        accuracies.append(network.evaluate(test).accuracy())
        return accuracies[-1] >= target

    with SparkMultiLayer(spark, sparkgrad_network(lr, seed), master) as model:
        start = time.monotonic()
        model.fit(rdd, epochs=max_epochs, epoch_callback=evaluate)
        wall = time.monotonic() - start
        n = model.network.num_params()
        if isinstance(master, SharedTrainingMaster):
            t = master.last_traffic
            update_bytes = t["worker_update_bytes_sent"] + t["controller_update_bytes_relayed"]
            per_step = update_bytes / max(t["worker_minibatches"], 1)
        else:
            state = model.network.updater_state().nbytes
            per_step = 2 * (4 * n + state) / master.averaging_frequency
    return {"epochs": len(accuracies), "accuracy": accuracies[-1], "wall_s": wall, "bytes_per_step": per_step}


def _torch_train(train_x, train_y, test_x, test_y, target, max_epochs, batch, lr, hidden, seed):
    # runs in each TorchDistributor process (torchrun sets RANK / WORLD_SIZE / MASTER_ADDR)
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    layers, n_in = [], 64
    for h in hidden:
        layers += [torch.nn.Linear(n_in, h), torch.nn.ReLU()]
        n_in = h
    layers.append(torch.nn.Linear(n_in, 10))
    model = DistributedDataParallel(torch.nn.Sequential(*layers))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = torch.tensor(train_x), torch.tensor(train_y)
    tx, ty = torch.tensor(test_x), torch.tensor(test_y)
    start = time.monotonic()
    acc, epoch = 0.0, 0
    for epoch in range(1, max_epochs + 1):
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(len(x), generator=g)[rank::world]
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            acc = float((model(tx).argmax(1) == ty).float().mean())
        flag = torch.tensor([1.0 if acc >= target else 0.0])
        dist.broadcast(flag, 0)
        if flag.item() > 0:
            break
    n = sum(p.numel() for p in model.parameters())
    dist.destroy_process_group()
    return {"epochs": epoch, "accuracy": acc, "train_s": time.monotonic() - start, "params": n}


def run_torch(train, test, target, max_epochs, lr, seed):
    from pyspark.ml.torch.distributor import TorchDistributor

    args = (
        train.features,
        train.labels.argmax(1).astype(np.int64),
        test.features,
        test.labels.argmax(1).astype(np.int64),
        target,
        max_epochs,
        BATCH,
        lr,
        HIDDEN,
        seed,
    )
    start = time.monotonic()
    out = TorchDistributor(num_processes=WORKERS, local_mode=True, use_gpu=False).run(_torch_train, *args)
    wall = time.monotonic() - start
    out.update(wall_s=wall, bytes_per_step=2 * (WORKERS - 1) / WORKERS * 4 * out["params"])
    return out


def _summary(runs: list[dict]) -> dict:
    return {
        "epochs": statistics.median(r["epochs"] for r in runs),
        "reached": sum(r["accuracy"] >= r["target"] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "bytes_per_step": float(np.mean([r["bytes_per_step"] for r in runs])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--port", type=int, default=40151)
    parser.add_argument("--lr", type=float, default=LR, help="Adam learning rate for every contender")
    parser.add_argument("--dl4j", action="store_true", help="add SharedTrainingMaster with DL4J's defaults")
    parser.add_argument(
        "--fixed-start",
        action="store_true",
        help="add SharedTrainingMaster whose threshold starts at 2e-2 (start_at_target=False, DL4J's start)",
    )
    parser.add_argument(
        "--encoded",
        action="store_true",
        help="add SharedTrainingMaster whose workers apply only what their messages carry (DL4J's)",
    )
    parser.add_argument(
        "--sqrt",
        action="store_true",
        help="add SharedTrainingMaster dividing each worker's update by sqrt(N) (default: sums Adam's)",
    )
    parser.add_argument(
        "--sparsity",
        type=float,
        nargs="*",
        default=[],
        help="a SharedTrainingMaster row per value: the default threshold algorithm with this target",
    )
    args = parser.parse_args()

    from sparkgrad.compress import (
        DEFAULT_INITIAL_THRESHOLD,
        DEFAULT_SPARSITY_TARGET,
        AdaptiveThresholdAlgorithm,
        ResidualClippingPostProcessor,
        TargetSparsityThresholdAlgorithm,
    )
    from sparkgrad.datasets import load_digits
    from sparkgrad.spark import (
        DefaultRepartitioner,
        ParameterAveragingTrainingMaster,
        SharedTrainingMaster,
        VoidConfiguration,
    )

    train, test = load_digits(test_fraction=0.2, seed=0, shape="flat")
    t0 = time.monotonic()
    spark = local_session(f"local[{WORKERS}]")
    spark.sparkContext.parallelize(range(WORKERS), WORKERS).map(lambda x: x).collect()  # start Python workers
    startup = time.monotonic() - t0
    void = VoidConfiguration(unicast_port=args.port, controller_address="127.0.0.1")
    contenders = {
        "SharedTrainingMaster (defaults)": lambda seed: SharedTrainingMaster(
            void, batch_size_per_worker=BATCH
        ),
        "ParameterAveragingTrainingMaster": lambda seed: ParameterAveragingTrainingMaster(
            num_workers=WORKERS, batch_size_per_worker=BATCH, averaging_frequency=5, rng_seed=seed
        ),
        "ParameterAveraging (job per round)": lambda seed: ParameterAveragingTrainingMaster(
            num_workers=WORKERS,
            batch_size_per_worker=BATCH,
            averaging_frequency=5,
            rng_seed=seed,
            averaging_jobs="per_round",
        ),
    }
    if args.dl4j:
        contenders["SharedTrainingMaster (DL4J defaults)"] = lambda seed: SharedTrainingMaster(
            void,
            batch_size_per_worker=BATCH,
            threshold_algorithm=AdaptiveThresholdAlgorithm(),
            residual_post_processor=ResidualClippingPostProcessor(),
            repartitioner=DefaultRepartitioner(),
        )
    if args.fixed_start:
        contenders["SharedTrainingMaster (threshold from 2e-2)"] = lambda seed: SharedTrainingMaster(
            void,
            batch_size_per_worker=BATCH,
            threshold_algorithm=TargetSparsityThresholdAlgorithm(
                DEFAULT_INITIAL_THRESHOLD, DEFAULT_SPARSITY_TARGET, start_at_target=False
            ),
        )
    if args.encoded:
        contenders["SharedTrainingMaster (own_update encoded)"] = lambda seed: SharedTrainingMaster(
            void, batch_size_per_worker=BATCH, own_update="encoded"
        )
    if args.sqrt:
        contenders["SharedTrainingMaster (update_combination sqrt)"] = lambda seed: SharedTrainingMaster(
            void, batch_size_per_worker=BATCH, update_combination="sqrt"
        )
    for sparsity in args.sparsity:

        def with_sparsity(seed: int, target: float = sparsity) -> SharedTrainingMaster:
            algorithm = TargetSparsityThresholdAlgorithm(
                DEFAULT_INITIAL_THRESHOLD, target, start_at_target=True
            )
            return SharedTrainingMaster(void, batch_size_per_worker=BATCH, threshold_algorithm=algorithm)

        contenders[f"SharedTrainingMaster (sparsity {sparsity:g})"] = with_sparsity
    runs: dict[str, list[dict]] = {name: [] for name in [*contenders, "TorchDistributor DDP (gloo)"]}
    try:
        rdd = spark.sparkContext.parallelize(train.split(1), WORKERS).cache()
        rdd.count()
        for seed in args.seeds:
            for name, make in contenders.items():
                r = run_sparkgrad(spark, make(seed), rdd, test, args.target, args.max_epochs, args.lr, seed)
                runs[name].append({**r, "target": args.target})
                print(f"seed {seed} {name}: {r}", flush=True)
            r = run_torch(train, test, args.target, args.max_epochs, args.lr, seed)
            runs["TorchDistributor DDP (gloo)"].append({**r, "target": args.target})
            print(f"seed {seed} TorchDistributor: {r}", flush=True)
    finally:
        spark.stop()
    table = {name: _summary(r) for name, r in runs.items()}
    ddp = table["TorchDistributor DDP (gloo)"]
    print(
        f"SparkSession start-up: {startup:.1f} s; target accuracy {args.target}; Adam({args.lr}), "
        f"{WORKERS} workers on local[{WORKERS}], batch {BATCH}; seeds {args.seeds}; medians over the seeds"
    )
    print(
        f"{'contender':38s} {'epochs':>6s} {'reached':>7s} {'wall s':>7s} {'+startup':>8s} {'time/DDP':>8s} "
        f"{'epochs/DDP':>10s} {'bytes/step':>10s} {'DDP/this':>8s}"
    )
    for name, r in table.items():
        print(
            f"{name:38s} {r['epochs']:6.1f} {r['reached']:4d}/{len(args.seeds):<2d} {r['wall_s']:7.2f} "
            f"{r['wall_s'] + startup:8.2f} {r['wall_s'] / ddp['wall_s']:8.2f} "
            f"{r['epochs'] / ddp['epochs']:10.2f} {r['bytes_per_step']:10.0f} "
            f"{ddp['bytes_per_step'] / r['bytes_per_step']:8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
