"""Time to a target accuracy on a bandwidth-limited 2-worker cluster: SharedTrainingMaster (defaults, and
with a checkpoint after every epoch) and ParameterAveragingTrainingMaster against PySpark's
TorchDistributor running DDP (gloo, executor mode on the same cluster): dense, and with DDP's compression
hooks as a user registers them (fp16_compress_hook; PowerSGD at ranks 1, 2 and 4 with error feedback,
starting after 10% of the steps; PowerSGD rank 2 inside fp16_compress_wrapper), for a communication-bound
model.

Cluster: bench/cluster/cluster.py, two worker namespaces with one core each, every link shaped with tc to
each ``--rates`` value (the cluster is rebuilt per rate). The driver, the Spark master and sparkgrad's
controller run in the root namespace, as on a real cluster's edge node.

Data: MNIST-shaped (28 x 28 = 784 features, 10 classes), made from scikit-learn's bundled digits: each
8 x 8 digit scaled 3x to 24 x 24, placed at a random offset in a 28 x 28 frame, plus Gaussian noise. Train
and test examples come from disjoint source digits. Nothing is downloaded.

Model: MLP 784-2048-2048-10 (ReLU, softmax; 5.8 M parameters, 23 MB of float32), Adam(--lr), minibatch
--batch per worker. Every contender trains until the test accuracy after an epoch reaches --target (or
--max-epochs, or --max-wall seconds) and evaluates inside its timed run.

Reported per contender: epochs and seconds to the target (from the call that starts training to the end
of the epoch that reached it, start-up of TorchDistributor's processes and sparkgrad's data preparation
included; the SparkSession start is not), the accuracy reached, and the bytes that crossed the worker
links (sum over both workers' shaped links of the bytes in both directions, read from the kernel's
counters of the veth devices: every byte of Spark tasks, broadcasts, gradient-sharing frames and gloo
all-reduce traffic; a worker-to-worker byte crosses two links and counts twice).

Needs root, ip netns, Java 17, torch (the ``bench`` extra), pandas and pyarrow (TorchDistributor's
executor mode).

Usage (as root): PYTHONPATH=python python bench/cluster/bench_bandwidth.py [--rates 1gbit 100mbit]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster as harness  # noqa: E402

WORKERS = 2
HIDDEN = (2048, 2048)
SIDE, DIGIT_SIDE = 28, 24


def make_data(n: int, seed: int, part: str, noise: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MNIST-shaped examples (features (n, 784) float32, class indices (n,)) from the digits' train or
    test part (a fixed 80/20 split of the 1797 source digits)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    cut = int(0.8 * len(order))
    source = order[:cut] if part == "train" else order[cut:]
    rng = np.random.default_rng(seed)
    pick = source[rng.integers(0, len(source), n)]
    big = np.kron(digits.images[pick] / 16.0, np.ones((3, 3))).astype(np.float32)
    frames = np.zeros((n, SIDE, SIDE), np.float32)
    shift = SIDE - DIGIT_SIDE + 1
    dy, dx = rng.integers(0, shift, n), rng.integers(0, shift, n)
    for y in range(shift):
        for x in range(shift):
            at = (dy == y) & (dx == x)
            frames[at, y : y + DIGIT_SIDE, x : x + DIGIT_SIDE] = big[at]
    frames += noise * rng.standard_normal(frames.shape, dtype=np.float32)
    return frames.reshape(n, SIDE * SIDE), digits.target[pick].astype(np.int64)


def link_bytes(info: harness.ClusterInfo) -> int:
    """Bytes through the host ends of every worker link so far, both directions."""
    total = 0
    for host in info.hosts:
        for direction in ("rx_bytes", "tx_bytes"):
            total += int(Path(f"/sys/class/net/{host.host_link}/statistics/{direction}").read_text())
    return total


def run_sparkgrad(spark, master, rdd, test, args, **fit_options) -> dict:
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import SparkMultiLayer

    conf = MultiLayerConfiguration(
        [DenseLayer(h, activation="relu") for h in HIDDEN] + [OutputLayer(10)],
        input_type=InputType.feed_forward(SIDE * SIDE),
        updater=Adam(args.lr),
        seed=args.seed,
    )
    progress: list[tuple[float, float]] = []  # (seconds since start, accuracy) per epoch
    start = time.monotonic()

    def evaluate(epoch, network) -> bool:
        progress.append((time.monotonic() - start, network.evaluate(test).accuracy()))
        print(f"  epoch {epoch + 1}: accuracy {progress[-1][1]:.4f} at {progress[-1][0]:.1f} s", flush=True)
        return progress[-1][1] >= args.target or progress[-1][0] >= args.max_wall

    with SparkMultiLayer(spark, conf, master) as model:
        model.fit(rdd, epochs=args.max_epochs, epoch_callback=evaluate, **fit_options)
    ends = [t for t, _ in progress]
    return {
        "epochs": len(progress),
        "seconds": progress[-1][0],
        "accuracy": progress[-1][1],
        "epoch_seconds": [round(b - a, 3) for a, b in zip(ends, ends[1:])],  # from the second epoch on
    }


def _torch_train(args: dict) -> dict:
    # runs in each TorchDistributor process on an executor (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR)
    import socket
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # gloo must use the namespace's link: its only interface besides loopback
    os.environ["GLOO_SOCKET_IFNAME"] = next(n for _, n in socket.if_nameindex() if n != "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = (torch.from_numpy(a) for a in make_data(args["train"], 1, "train"))
    tx, ty = (torch.from_numpy(a) for a in make_data(args["test"], 2, "test"))
    torch.manual_seed(args["seed"])
    layers, n_in = [], SIDE * SIDE
    for h in HIDDEN:
        layers += [torch.nn.Linear(n_in, h), torch.nn.ReLU()]
        n_in = h
    layers.append(torch.nn.Linear(n_in, 10))
    # PowerSGD's hook issues its all-reduces from the callbacks of earlier ones, and with several gradient
    # buckets the two ranks issue them in different orders: gloo then aborts one rank ("Received data
    # size doesn't match expected size") and the other waits forever (the stall of the first runs). One
    # bucket for the whole model keeps the order; the dense and fp16 contenders keep DDP's default.
    one_bucket = (args.get("hook") or "").startswith("powersgd")
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=1024 if one_bucket else 25)
    _register_hook(model, args)
    opt = torch.optim.Adam(model.parameters(), lr=args["lr"])
    progress = []
    for epoch in range(1, args["max_epochs"] + 1):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args["seed"] * 1000 + epoch))
        mine = order[rank::world]
        for i in range(0, len(mine), args["batch"]):
            idx = mine[i : i + args["batch"]]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            acc = float((model(tx).argmax(1) == ty).float().mean())
        progress.append((time.time() - args["start"], acc))
        stop = torch.tensor([1.0 if acc >= args["target"] or progress[-1][0] >= args["max_wall"] else 0.0])
        dist.broadcast(stop, 0)
        if stop.item() > 0:
            break
    dist.destroy_process_group()
    return {"epochs": len(progress), "seconds": progress[-1][0], "accuracy": progress[-1][1]}


def _register_hook(model, args: dict) -> None:
    """DDP's gradient compression (a communication hook), as a user of TorchDistributor registers it:
    ``args["hook"]`` is None (dense all-reduce), ``"fp16"`` or ``"powersgd:RANK"``, ``"powersgd:RANK:fp16"``
    (PowerSGD with error feedback and warm start, starting after about 10% of the steps as PyTorch's
    documentation advises, wrapped in fp16 compression for the last)."""
    hook = args.get("hook")
    if hook is None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    _, rank, *wrap = hook.split(":")
    steps_per_epoch = -(-args["train"] // (2 * args["batch"]))  # two workers
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=int(rank),
        start_powerSGD_iter=max(2, steps_per_epoch * args["max_epochs"] // 10),
        use_error_feedback=True,
        warm_start=True,
    )
    compress = powerSGD_hook.powerSGD_hook
    model.register_comm_hook(state, default_hooks.fp16_compress_wrapper(compress) if wrap else compress)


def run_torch(args, hook: str | None = None) -> dict:
    from pyspark.ml.torch.distributor import TorchDistributor

    settings = {
        "train": args.train,
        "test": args.test,
        "seed": args.seed,
        "lr": args.lr,
        "batch": args.batch,
        "target": args.target,
        "max_epochs": args.max_epochs,
        "max_wall": args.max_wall,
        "start": time.time(),
        "hook": hook,
    }
    distributor = TorchDistributor(num_processes=WORKERS, local_mode=False, use_gpu=False)
    return distributor.run(_torch_train, settings)


def bench_rate(rate: str, args, train, test) -> list[tuple[str, dict]]:
    from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, VoidConfiguration
    from sparkgrad.transport import ZmqTransportConfiguration

    rows = []
    state = tempfile.mkdtemp(prefix="sgc-bench-")
    with harness.cluster(WORKERS, rate=rate, delay=None, state_dir=f"{state}/cluster") as info:
        spark = harness.spark_session(info, "sparkgrad-bench-bandwidth", f"{state}/driver")
        try:
            spark.sparkContext.setLogLevel("ERROR")
            harness.wait_for_executors(spark, WORKERS)
            rdd = spark.sparkContext.parallelize(train.split(args.batch), WORKERS).cache()
            rdd.count()
            with socket.socket() as s:
                s.bind((info.driver_host, 0))
                port = int(s.getsockname()[1])

            def sharing(encrypt: bool = True, **fit_options) -> dict:
                master = SharedTrainingMaster(
                    VoidConfiguration(unicast_port=port, network_mask="198.18.0.0/24"),
                    batch_size_per_worker=args.batch,
                    transport=ZmqTransportConfiguration(encrypt=encrypt),
                )
                return run_sparkgrad(spark, master, rdd, test, args, **fit_options)

            contenders = {
                "SharedTrainingMaster (defaults)": sharing,
                # the same with a checkpoint after every epoch (bench/results/checkpoints/bandwidth.txt)
                "SharedTrainingMaster (checkpoints)": lambda: sharing(
                    checkpoint=tempfile.mkdtemp(prefix="sgc-checkpoints-")
                ),
                # the links in clear: what the default CURVE encryption costs (docs/guides/security.md)
                "SharedTrainingMaster (clear)": lambda: sharing(encrypt=False),
                "ParameterAveraging (freq 5)": lambda: run_sparkgrad(
                    spark,
                    ParameterAveragingTrainingMaster(
                        num_workers=WORKERS, batch_size_per_worker=args.batch, averaging_frequency=5
                    ),
                    rdd,
                    test,
                    args,
                ),
                "TorchDistributor DDP (gloo)": lambda: run_torch(args),
                "DDP fp16_compress_hook": lambda: run_torch(args, "fp16"),
                "DDP PowerSGD rank 1": lambda: run_torch(args, "powersgd:1"),
                "DDP PowerSGD rank 2": lambda: run_torch(args, "powersgd:2"),
                "DDP PowerSGD rank 4": lambda: run_torch(args, "powersgd:4"),
                "DDP PowerSGD rank 2 + fp16": lambda: run_torch(args, "powersgd:2:fp16"),
            }
            for name in args.only or contenders:
                print(f"{rate} {name}:", flush=True)
                before = link_bytes(info)
                result = contenders[name]()
                result["link_bytes"] = link_bytes(info) - before
                print(f"  {result}", flush=True)
                rows.append((name, result))
        finally:
            spark.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"], help="e.g. 10gbit 1gbit 100mbit")
    parser.add_argument("--target", type=float, default=0.93)
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--max-wall", type=float, default=900.0, help="stop a contender after this long")
    parser.add_argument("--train", type=int, default=8000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64, help="minibatch per worker")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", nargs="+", help="contenders to run (names as printed)")
    args = parser.parse_args()
    reason = harness.unavailable_reason()
    if reason:
        print(f"cannot build the cluster here: {reason}", file=sys.stderr)
        return 2

    from sparkgrad.data import DataSet

    x, y = make_data(args.train, 1, "train")
    tx, ty = make_data(args.test, 2, "test")
    eye = np.eye(10, dtype=np.float32)
    train, test = DataSet(x, eye[y]), DataSet(tx, eye[ty])
    table = {rate: bench_rate(rate, args, train, test) for rate in args.rates}
    print(
        f"\ntarget {args.target}; MLP 784-2048-2048-10 (5.8 M params), Adam({args.lr}), batch {args.batch} "
        f"per worker, {WORKERS} workers x 1 core, {args.train} training examples"
    )
    print(
        f"{'rate':8s} {'contender':32s} {'epochs':>6s} {'seconds':>8s} {'accuracy':>8s} {'link MB':>9s} "
        f"{'DDP time/this':>13s}"
    )
    for rate, rows in table.items():
        ddp = dict(rows).get("TorchDistributor DDP (gloo)")
        for name, r in rows:
            ratio = f"{ddp['seconds'] / r['seconds']:13.2f}" if ddp else f"{'-':>13s}"
            print(
                f"{rate:8s} {name:32s} {r['epochs']:6d} {r['seconds']:8.1f} {r['accuracy']:8.4f} "
                f"{r['link_bytes'] / 1e6:9.1f} {ratio}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
