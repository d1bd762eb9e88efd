"""Time-to-accuracy and bytes per step on digits: SharedTrainingMaster and ParameterAveragingTrainingMaster
against PySpark's TorchDistributor running dense DDP (gloo, CPU), same data, split, model and workers.

Model: MLP 64-256-256-10 (ReLU, softmax), Adam(--lr), minibatch 32 per worker, 2 workers on local[2].
Each contender trains epoch by epoch until the test accuracy reaches --target (or --max-epochs); every
contender evaluates the test set after every epoch, inside its timed loop.

SharedTrainingMaster configuration (options a user with 2 workers would pick): DefaultRepartitioner(
max_partitions=2), i.e. one partition (one Spark task) per worker per epoch; rng_seed=1 (a new
reproducible shuffle every epoch, like DDP's per-epoch randperm); threshold algorithm
TargetSparsityThresholdAlgorithm(--threshold, --sparsity) or, with --sparsity-range LO HI,
AdaptiveThresholdAlgorithm(--threshold, LO, HI); residual post-processor --residual ("clip": the
default ResidualClippingPostProcessor(5, 5); "none": NoOpResidualPostProcessor).

Bytes per step = bytes on the wire per worker minibatch:
- SharedTrainingMaster: measured UPDATE frames (worker sends + controller relays) / worker steps.
- ParameterAveraging: every round each worker receives parameters + updater state and sends them back:
  2 * (4N + updater bytes) per worker per round, divided by the minibatches per round.
- DDP: ring all-reduce of the float32 gradient: 2 (W-1)/W * 4N per worker per step.

TorchDistributor runs in local mode (torchrun on the driver machine): its executor mode needs pandas
and pyarrow, which the benchmark environment does not install.

Usage: PYTHONPATH=python python bench/python/bench_spark_digits.py [--target 0.97] [--max-epochs 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

WORKERS = 2
BATCH = 32
HIDDEN = (256, 256)
# defaults of the command line (see the module docstring)
LR = 3e-3
THRESHOLD = 1e-2
SPARSITY = 1.5e-3
RESIDUAL = "none"


def sparkgrad_network(lr: float):
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
    from sparkgrad.nn.updaters import Adam

    conf = MultiLayerConfiguration(
        [DenseLayer(h, activation="relu") for h in HIDDEN] + [OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(lr),
        seed=1,
    )
    return MultiLayerNetwork(conf).init()


def run_sparkgrad(spark, master, train, test, target, max_epochs, lr):
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer

    rdd = spark.sparkContext.parallelize(train.split(1), WORKERS).cache()
    rdd.count()
    model = SparkMultiLayer(spark, sparkgrad_network(lr), master)
    start = time.monotonic()
    steps = update_bytes = 0
    acc = 0.0
    epochs = 0
    while epochs < max_epochs:
        epochs += 1
        model.fit(rdd)
        if isinstance(master, SharedTrainingMaster):
            t = master.last_traffic
            steps += int(t["worker_minibatches"])
            update_bytes += int(t["worker_update_bytes_sent"] + t["controller_update_bytes_relayed"])
        acc = model.network.evaluate(test).accuracy()
        if acc >= target:
            break
    wall = time.monotonic() - start
    master.delete_temp_files(spark)
    n = model.network.num_params()
    if isinstance(master, SharedTrainingMaster):
        per_step = update_bytes / max(steps, 1)
    else:
        state = model.network.updater_state().nbytes
        per_step = 2 * (4 * n + state) / master.averaging_frequency
    rdd.unpersist()
    return {"epochs": epochs, "accuracy": acc, "wall_s": wall, "bytes_per_step": per_step, "params": n}


def _torch_train(train_x, train_y, test_x, test_y, target, max_epochs, batch, lr, hidden):
    # runs in each TorchDistributor process (torchrun sets RANK / WORLD_SIZE / MASTER_ADDR)
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
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
        g = torch.Generator().manual_seed(epoch)
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


def run_torch(train, test, target, max_epochs, lr):
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
    )
    start = time.monotonic()
    out = TorchDistributor(num_processes=WORKERS, local_mode=True, use_gpu=False).run(_torch_train, *args)
    wall = time.monotonic() - start
    n = out["params"]
    out.update(wall_s=wall, bytes_per_step=2 * (WORKERS - 1) / WORKERS * 4 * n)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--port", type=int, default=40151)
    parser.add_argument("--lr", type=float, default=LR, help="Adam learning rate for every contender")
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help="initial encoding threshold")
    parser.add_argument("--sparsity", type=float, default=SPARSITY, help="target message density")
    parser.add_argument(
        "--sparsity-range", type=float, nargs=2, metavar=("LO", "HI"), help="adaptive density bounds instead"
    )
    parser.add_argument("--residual", choices=("clip", "none"), default=RESIDUAL)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    from sparkgrad.compress import (
        AdaptiveThresholdAlgorithm,
        NoOpResidualPostProcessor,
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

    if args.sparsity_range:
        algorithm = AdaptiveThresholdAlgorithm(args.threshold, *args.sparsity_range)
    else:
        algorithm = TargetSparsityThresholdAlgorithm(args.threshold, args.sparsity)
    residual = NoOpResidualPostProcessor() if args.residual == "none" else ResidualClippingPostProcessor()
    train, test = load_digits(test_fraction=0.2, seed=0, shape="flat")
    t0 = time.monotonic()
    spark = (
        SparkSession.builder.master(f"local[{WORKERS}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.parallelize(range(WORKERS), WORKERS).map(lambda x: x).collect()  # start Python workers
    startup = time.monotonic() - t0
    results = {}
    try:
        results["SharedTrainingMaster"] = shared = run_sparkgrad(
            spark,
            SharedTrainingMaster(
                VoidConfiguration(unicast_port=args.port, controller_address="127.0.0.1"),
                batch_size_per_worker=BATCH,
                threshold_algorithm=algorithm,
                residual_post_processor=residual,
                repartitioner=DefaultRepartitioner(max_partitions=WORKERS),
                rng_seed=1,
            ),
            train,
            test,
            args.target,
            args.max_epochs,
            args.lr,
        )
        print("SharedTrainingMaster:", shared, flush=True)
        results["ParameterAveragingTrainingMaster"] = run_sparkgrad(
            spark,
            ParameterAveragingTrainingMaster(
                num_workers=WORKERS, batch_size_per_worker=BATCH, averaging_frequency=5, rng_seed=1
            ),
            train,
            test,
            args.target,
            args.max_epochs,
            args.lr,
        )
        print("ParameterAveragingTrainingMaster:", results["ParameterAveragingTrainingMaster"], flush=True)
        results["TorchDistributor DDP (gloo)"] = run_torch(train, test, args.target, args.max_epochs, args.lr)
    finally:
        spark.stop()
    ddp = results["TorchDistributor DDP (gloo)"]
    print(
        f"SparkSession start-up: {startup:.1f} s; target accuracy {args.target}; "
        f"Adam({args.lr}), {WORKERS} workers on local[{WORKERS}]"
    )
    print(f"SharedTrainingMaster: {algorithm}, residual {residual}, one partition per worker, rng_seed=1")
    print(
        f"{'contender':34s} {'epochs':>6s} {'acc':>7s} {'wall s':>8s} {'+startup s':>10s} {'vs DDP':>7s} "
        f"{'bytes/step':>11s} {'DDP/this':>9s}"
    )
    for name, r in results.items():
        reached = "" if r["accuracy"] >= args.target else " (target not reached)"
        print(
            f"{name:34s} {r['epochs']:6d} {r['accuracy']:7.4f} {r['wall_s']:8.1f} "
            f"{r['wall_s'] + startup:10.1f} "
            f"{r['wall_s'] / ddp['wall_s']:7.2f} {r['bytes_per_step']:11.0f} "
            f"{ddp['bytes_per_step'] / r['bytes_per_step']:9.1f}{reached}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
