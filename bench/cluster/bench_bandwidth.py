"""Time to a target accuracy on a bandwidth-limited 2-worker cluster: SharedTrainingMaster (defaults; with
a checkpoint after every epoch; with the links in clear) and ParameterAveragingTrainingMaster against
PySpark's TorchDistributor running DDP (gloo, executor mode on the same cluster): dense, and with DDP's
compression hooks as a user registers them (bench/python/ddp_hooks.py: fp16_compress_hook; PowerSGD at
ranks 1, 2 and 4 with error feedback and warm start, starting after 10% of the steps; PowerSGD rank 2
inside fp16_compress_wrapper).

Cluster: bench/cluster/cluster.py, two worker namespaces with one core each, every link shaped with tc to
each ``--rates`` value (the cluster is rebuilt per rate). The driver, the Spark master and sparkgrad's
controller run in the root namespace, as on a real cluster's edge node.

Data: MNIST-shaped (28 x 28 = 784 features, 10 classes), made from scikit-learn's bundled digits: each
8 x 8 digit scaled 3x to 24 x 24, placed at a random offset in a 28 x 28 frame, plus Gaussian noise. Train
and test examples come from disjoint source digits; each run draws its own examples from its seed.
Nothing is downloaded.

Workloads (``--workloads``; each with its own target, Adam learning rate and training size, which
``--target``, ``--lr`` and ``--train`` override), the same architecture in sparkgrad and PyTorch:
  mlp:  784-2048-2048-10 (ReLU, softmax; 5.8 M parameters, 23 MB of float32): the friendliest case for
        sparse updates;
  cnn:  a residual CNN (ComputationGraph): three stages of conv 3x3 relu -> [conv 3x3 relu -> conv 3x3 ->
        + the stage input -> relu] with 32, 64 and 128 channels, 2x2 max-pooling after the first two,
        dense 128 relu, softmax (1.3 M parameters, 37% of them convolution kernels);
  lstm: bench_convergence's sequence task at this shape: each image a sequence of its 28 rows, LSTM 256,
        its last step, softmax (0.29 M parameters; PyTorch's LSTM has a second bias vector, 1,024 more).
Every contender trains minibatches of --batch per worker until the test accuracy after an epoch reaches
the target (or --max-epochs, or --max-wall seconds) and evaluates inside its timed run.

Reported per run (appended to OUT/runs.jsonl as it ends, so a long study survives an interruption): epochs
and seconds to the target (from the call that starts training to the end of the epoch that reached it,
start-up of TorchDistributor's processes and sparkgrad's data preparation included; the SparkSession start
is not), the accuracy reached, and the bytes that crossed the worker links (sum over both workers' shaped
links of the bytes in both directions, read from the kernel's counters of the veth devices: every byte of
Spark tasks, broadcasts, gradient-sharing frames and gloo all-reduce traffic; a worker-to-worker byte
crosses two links and counts twice). Then per workload, rate and contender over --repeats runs (seeds
SEED, SEED + 1, ...): the medians (a run that did not reach the target counts as infinitely long) in
OUT/table.txt, and OUT/plot.png, the median time to the target against the link rate.

Needs root, ip netns, Java 17, torch (the ``bench`` extra), pandas and pyarrow (TorchDistributor's
executor mode).

Usage (as root): PYTHONPATH=python python bench/cluster/bench_bandwidth.py [--rates 10gbit 1gbit 100mbit]
    [--workloads mlp cnn lstm] [--repeats 3] [--only CONTENDER ...] --out DIR
  (``--report --out DIR`` prints and plots what DIR/runs.jsonl holds)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pyspark import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import ddp_hooks  # noqa: E402

import cluster as harness  # noqa: E402

# the TorchDistributor processes run _torch_train on the executors, where bench/python is not importable
cloudpickle.register_pickle_by_value(ddp_hooks)

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


@dataclass(frozen=True)
class Workload:
    """A model trained by every contender: sparkgrad's configuration and PyTorch's module of the same
    architecture, the shape one example takes in each, and the settings each run uses unless given."""

    description: str
    sparkgrad_conf: Callable[[float, int], Any]  # (learning rate, seed) -> a network configuration
    torch_model: Callable[[], Any]
    sparkgrad_features: Callable[[np.ndarray], np.ndarray]  # (n, 784) images -> the network's input
    torch_shape: tuple[int, ...]  # one example's shape in the PyTorch module's input
    target: float
    lr: float
    train: int


def _mlp_conf(lr: float, seed: int) -> Any:
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam

    return MultiLayerConfiguration(
        [DenseLayer(h, activation="relu") for h in HIDDEN] + [OutputLayer(10)],
        input_type=InputType.feed_forward(SIDE * SIDE),
        updater=Adam(lr),
        seed=seed,
    )


def _torch_mlp() -> Any:
    import torch

    layers, n_in = [], SIDE * SIDE
    for h in HIDDEN:
        layers += [torch.nn.Linear(n_in, h), torch.nn.ReLU()]
        n_in = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(n_in, 10))


# the residual CNN: (channels of a stage's widening convolution, whether a 2x2 max-pool follows its block)
CNN_STAGES = ((32, True), (64, True), (128, False))
CNN_DENSE = 128


def _cnn_conf(lr: float, seed: int) -> Any:
    """28x28x1 -> per stage: conv 3x3 relu -> [conv 3x3 relu -> conv 3x3 -> + block input -> relu]
    (-> max-pool 2) -> dense 128 relu -> softmax 10; every convolution "same"."""
    from sparkgrad.nn import (
        ActivationLayer,
        ComputationGraphConfiguration,
        ConvolutionLayer,
        DenseLayer,
        ElementWiseVertex,
        InputType,
        OutputLayer,
        SubsamplingLayer,
    )
    from sparkgrad.nn.updaters import Adam

    same = {"kernel_size": (3, 3), "convolution_mode": "same"}
    b = ComputationGraphConfiguration.builder(updater=Adam(lr), weight_init="relu", seed=seed)
    b.add_inputs("image").set_input_types(InputType.convolutional(SIDE, SIDE, 1))
    source = "image"
    for i, (channels, pool) in enumerate(CNN_STAGES):
        b.add_layer(f"widen{i}", ConvolutionLayer(channels, activation="relu", **same), source)
        b.add_layer(f"block{i}a", ConvolutionLayer(channels, activation="relu", **same), f"widen{i}")
        b.add_layer(f"block{i}b", ConvolutionLayer(channels, activation="identity", **same), f"block{i}a")
        b.add_vertex(f"block{i}sum", ElementWiseVertex("add"), f"block{i}b", f"widen{i}")
        b.add_layer(f"block{i}relu", ActivationLayer("relu"), f"block{i}sum")
        source = f"block{i}relu"
        if pool:
            b.add_layer(f"pool{i}", SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)), source)
            source = f"pool{i}"
    b.add_layer("dense", DenseLayer(CNN_DENSE, activation="relu"), source)
    b.add_layer("out", OutputLayer(10), "dense")
    return b.set_outputs("out").build()


def _torch_cnn() -> Any:
    from torch import nn

    class Block(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.a = nn.Conv2d(channels, channels, 3, padding=1)
            self.b = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x):
            return nn.functional.relu(self.b(nn.functional.relu(self.a(x))) + x)

    layers, n_in, side = [], 1, SIDE
    for channels, pool in CNN_STAGES:
        layers += [nn.Conv2d(n_in, channels, 3, padding=1), nn.ReLU(), Block(channels)]
        if pool:
            layers.append(nn.MaxPool2d(2, 2))
            side //= 2
        n_in = channels
    return nn.Sequential(
        *layers, nn.Flatten(), nn.Linear(n_in * side * side, CNN_DENSE), nn.ReLU(), nn.Linear(CNN_DENSE, 10)
    )


LSTM_HIDDEN = 256


def _lstm_conf(lr: float, seed: int) -> Any:
    """bench_convergence's sequence task at MNIST's shape: each image a sequence of 28 rows of 28 pixels,
    LSTM 256, its last step -> softmax 10."""
    from sparkgrad.nn import LSTM, InputType, LastTimeStep, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam

    return MultiLayerConfiguration(
        [LastTimeStep(LSTM(LSTM_HIDDEN)), OutputLayer(10)],
        input_type=InputType.recurrent(SIDE, SIDE),
        updater=Adam(lr),
        seed=seed,
    )


def _torch_lstm() -> Any:
    from torch import nn

    class LastStepLSTM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(SIDE, LSTM_HIDDEN, batch_first=True)
            self.out = nn.Linear(LSTM_HIDDEN, 10)

        def forward(self, x):
            return self.out(self.lstm(x)[0][:, -1])

    return LastStepLSTM()


WORKLOADS = {
    "mlp": Workload(
        "MLP 784-2048-2048-10 (5.8 M parameters)",
        _mlp_conf,
        _torch_mlp,
        lambda x: x,
        (SIDE * SIDE,),
        target=0.92,
        lr=3e-4,
        train=8000,
    ),
    "cnn": Workload(
        "residual CNN, 3 stages of 32/64/128 channels, dense 128 (1.3 M parameters)",
        _cnn_conf,
        _torch_cnn,
        lambda x: x.reshape(-1, 1, SIDE, SIDE),
        (1, SIDE, SIDE),
        target=0.93,
        lr=1e-3,
        train=4000,
    ),
    # one row a time step: sparkgrad's recurrent input is (features, time steps), PyTorch's batch_first
    # LSTM's (time steps, features)
    "lstm": Workload(
        "LSTM 256 over 28 rows of 28 pixels, last step (0.3 M parameters)",
        _lstm_conf,
        _torch_lstm,
        lambda x: x.reshape(-1, SIDE, SIDE).transpose(0, 2, 1).copy(),
        (SIDE, SIDE),
        target=0.9,
        lr=2e-3,
        train=4000,
    ),
}


def link_bytes(info: harness.ClusterInfo) -> int:
    """Bytes through the host ends of every worker link so far, both directions."""
    total = 0
    for host in info.hosts:
        for direction in ("rx_bytes", "tx_bytes"):
            total += int(Path(f"/sys/class/net/{host.host_link}/statistics/{direction}").read_text())
    return total


def run_sparkgrad(spark, master, rdd, test, args, **fit_options) -> dict:
    from sparkgrad.spark import SparkComputationGraph, SparkMultiLayer

    conf = WORKLOADS[args.workload].sparkgrad_conf(args.lr, args.seed)
    spark_network = SparkComputationGraph if hasattr(conf, "outputs") else SparkMultiLayer
    progress: list[tuple[float, float]] = []  # (seconds since start, accuracy) per epoch
    start = time.monotonic()

    def evaluate(epoch, network) -> bool:
        progress.append((time.monotonic() - start, network.evaluate(test).accuracy()))
        print(f"  epoch {epoch + 1}: accuracy {progress[-1][1]:.4f} at {progress[-1][0]:.1f} s", flush=True)
        return progress[-1][1] >= args.target or progress[-1][0] >= args.max_wall

    with spark_network(spark, conf, master) as model:
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
    workload = WORKLOADS[args["workload"]]
    x, y = (torch.from_numpy(a) for a in make_data(args["train"], args["seed"], "train"))
    tx, ty = (torch.from_numpy(a) for a in make_data(args["test"], args["seed"] + 1000, "test"))
    x, tx = x.reshape(-1, *workload.torch_shape), tx.reshape(-1, *workload.torch_shape)
    torch.manual_seed(args["seed"])
    model = DistributedDataParallel(
        workload.torch_model(), bucket_cap_mb=ddp_hooks.bucket_cap_mb(args["hook"])
    )
    steps_per_epoch = -(-args["train"] // (WORKERS * args["batch"]))
    ddp_hooks.register(model, args["hook"], steps_per_epoch * args["max_epochs"])
    opt = torch.optim.Adam(model.parameters(), lr=args["lr"])
    launched = time.time() - args["start"]  # TorchDistributor's launch, process group and data
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
    return {
        "epochs": len(progress),
        "seconds": progress[-1][0],
        "accuracy": progress[-1][1],
        "launch_seconds": launched,
    }


def run_torch(args, hook: str = "dense") -> dict:
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
        "workload": args.workload,
    }
    distributor = TorchDistributor(num_processes=WORKERS, local_mode=False, use_gpu=False)
    return distributor.run(_torch_train, settings)


CONTENDERS = (
    "SharedTrainingMaster (defaults)",
    "SharedTrainingMaster (checkpoints)",
    "SharedTrainingMaster (clear)",
    "ParameterAveraging (freq 5)",
    "TorchDistributor DDP (gloo)",
    "DDP fp16_compress_hook",
    "DDP PowerSGD rank 1",
    "DDP PowerSGD rank 2",
    "DDP PowerSGD rank 4",
    "DDP PowerSGD rank 2 + fp16",
)
DDP = "TorchDistributor DDP (gloo)"


def workload_data(name: str, train: int, test: int, seed: int) -> tuple[Any, Any]:
    """The training and test DataSets of one run: its own draw of the digits (train from seed, test from
    seed + 1000, as the PyTorch processes draw them), in the workload's input layout."""
    from sparkgrad.data import DataSet

    workload, eye = WORKLOADS[name], np.eye(10, dtype=np.float32)
    x, y = make_data(train, seed, "train")
    tx, ty = make_data(test, seed + 1000, "test")
    return (
        DataSet(workload.sparkgrad_features(x), eye[y]),
        DataSet(workload.sparkgrad_features(tx), eye[ty]),
    )


def run_settings(args, workload: str, seed: int) -> argparse.Namespace:
    """The command line's settings for one run: the workload's own target, learning rate and training
    size unless given."""
    defaults = WORKLOADS[workload]
    return argparse.Namespace(
        **{
            **vars(args),
            "workload": workload,
            "seed": seed,
            "target": args.target if args.target is not None else defaults.target,
            "lr": args.lr if args.lr is not None else defaults.lr,
            "train": args.train if args.train is not None else defaults.train,
        }
    )


def bench_rate(rate: str, args, record: Callable[[dict], None]) -> None:
    """Every workload x repeat x contender at one link rate, on a cluster built for that rate; each run's
    result goes to ``record`` as it ends."""
    from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, VoidConfiguration
    from sparkgrad.transport import ZmqTransportConfiguration

    state = tempfile.mkdtemp(prefix="sgc-bench-")
    with harness.cluster(WORKERS, rate=rate, delay=None, state_dir=f"{state}/cluster") as info:
        spark = harness.spark_session(info, "sparkgrad-bench-bandwidth", f"{state}/driver")
        try:
            spark.sparkContext.setLogLevel("ERROR")
            harness.wait_for_executors(spark, WORKERS)
            with socket.socket() as s:
                s.bind((info.driver_host, 0))
                port = int(s.getsockname()[1])
            for workload in args.workloads:
                for repeat in range(args.repeats):
                    run = run_settings(args, workload, args.seed + repeat)
                    train, test = workload_data(workload, run.train, run.test, run.seed)
                    # one DataSet per minibatch: both masters are told so (rdd_data_set_num_examples), without
                    # which they size partitions and averaging rounds as if each held one example
                    rdd = spark.sparkContext.parallelize(train.split(run.batch), WORKERS).cache()
                    rdd.count()

                    def sharing(encrypt: bool = True, run=run, rdd=rdd, test=test, **fit_options) -> dict:
                        master = SharedTrainingMaster(
                            VoidConfiguration(unicast_port=port, network_mask="198.18.0.0/24"),
                            batch_size_per_worker=run.batch,
                            rdd_data_set_num_examples=run.batch,
                            transport=ZmqTransportConfiguration(encrypt=encrypt),
                        )
                        return run_sparkgrad(spark, master, rdd, test, run, **fit_options)

                    def averaging(run=run, rdd=rdd, test=test) -> dict:
                        master = ParameterAveragingTrainingMaster(
                            num_workers=WORKERS,
                            batch_size_per_worker=run.batch,
                            rdd_data_set_num_examples=run.batch,
                            averaging_frequency=5,
                        )
                        return run_sparkgrad(spark, master, rdd, test, run)

                    contenders = {
                        "SharedTrainingMaster (defaults)": sharing,
                        # with a checkpoint after every epoch (bench/results/checkpoints/bandwidth.txt)
                        "SharedTrainingMaster (checkpoints)": lambda sharing=sharing: sharing(
                            checkpoint=tempfile.mkdtemp(prefix="sgc-checkpoints-")
                        ),
                        # the links in clear: what the default CURVE encryption costs (security.md)
                        "SharedTrainingMaster (clear)": lambda sharing=sharing: sharing(encrypt=False),
                        "ParameterAveraging (freq 5)": averaging,
                        DDP: lambda run=run: run_torch(run),
                        "DDP fp16_compress_hook": lambda run=run: run_torch(run, "fp16"),
                        "DDP PowerSGD rank 1": lambda run=run: run_torch(run, "powersgd:1"),
                        "DDP PowerSGD rank 2": lambda run=run: run_torch(run, "powersgd:2"),
                        "DDP PowerSGD rank 4": lambda run=run: run_torch(run, "powersgd:4"),
                        "DDP PowerSGD rank 2 + fp16": lambda run=run: run_torch(run, "powersgd:2:fp16"),
                    }
                    for name in args.only:
                        print(f"{rate} {workload} seed {run.seed} {name}:", flush=True)
                        before = link_bytes(info)
                        result = contenders[name]()
                        result["link_bytes"] = link_bytes(info) - before
                        print(f"  {result}", flush=True)
                        record(
                            {
                                "rate": rate,
                                "workload": workload,
                                "contender": name,
                                "seed": run.seed,
                                "target": run.target,
                                "reached": result["accuracy"] >= run.target,
                                **result,
                            }
                        )
                    rdd.unpersist()
        finally:
            spark.stop()


RATE_BITS = {"100mbit": 1e8, "1gbit": 1e9, "10gbit": 1e10}


def summarise(runs: list[dict]) -> dict[tuple[str, str, str], dict]:
    """Per (workload, rate, contender): the medians over its runs of the seconds and epochs to the target
    (a run that did not reach it counts as infinitely long), of the link bytes and of the final accuracy."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["workload"], r["rate"], r["contender"]), []).append(r)
    table = {}
    for key, rows in groups.items():
        table[key] = {
            "runs": len(rows),
            "reached": sum(r["reached"] for r in rows),
            "seconds": float(np.median([r["seconds"] if r["reached"] else np.inf for r in rows])),
            "epochs": float(np.median([r["epochs"] if r["reached"] else np.inf for r in rows])),
            "link_bytes": float(np.median([r["link_bytes"] for r in rows])),
            "accuracy": float(np.median([r["accuracy"] for r in rows])),
            "longest": max(r["seconds"] for r in rows),
        }
    return table


def format_table(table: dict[tuple[str, str, str], dict]) -> str:
    lines = [
        f"{'workload':8s} {'rate':8s} {'contender':32s} {'reached':>7s} {'epochs':>6s} {'seconds':>8s} "
        f"{'accuracy':>8s} {'link MB':>9s} {'DDP time/this':>13s}"
    ]
    for (workload, rate, name), r in sorted(
        table.items(), key=lambda kv: (kv[0][0], -RATE_BITS.get(kv[0][1], 0), CONTENDERS.index(kv[0][2]))
    ):
        ddp = table.get((workload, rate, DDP))
        seconds = (
            f"{r['seconds']:8.1f}"
            if np.isfinite(r["seconds"])
            else f"{'>' + format(r['longest'], '.0f'):>8s}"
        )
        epochs = f"{r['epochs']:6.1f}" if np.isfinite(r["epochs"]) else f"{'-':>6s}"
        ratio = "-"
        if ddp and np.isfinite(r["seconds"]):
            ratio = (
                f"{ddp['seconds'] / r['seconds']:.2f}"
                if np.isfinite(ddp["seconds"])
                else f">{ddp['longest'] / r['seconds']:.2f}"
            )
        lines.append(
            f"{workload:8s} {rate:8s} {name:32s} {r['reached']:>3d} of {r['runs']:<1d} {epochs} {seconds} "
            f"{r['accuracy']:8.4f} {r['link_bytes'] / 1e6:9.1f} {ratio:>13s}"
        )
    return "\n".join(lines)


def plot(table: dict[tuple[str, str, str], dict], path: Path) -> None:
    """Median seconds to the target against the link rate, one line per contender, one panel per
    workload; a run that never reached the target is drawn at its longest time with an open marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({w for w, _, _ in table})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for name in CONTENDERS:
            points = sorted(
                (RATE_BITS[rate], r) for (w, rate, n), r in table.items() if w == workload and n == name
            )
            if not points:
                continue
            rates = [bits / 1e6 for bits, _ in points]
            seconds = [r["seconds"] if np.isfinite(r["seconds"]) else r["longest"] for _, r in points]
            (line,) = ax.plot(rates, seconds, marker="o", label=name)
            missed = [(x, y) for x, y, (_, r) in zip(rates, seconds, points) if not np.isfinite(r["seconds"])]
            if missed:
                ax.plot(
                    *zip(*missed),
                    linestyle="none",
                    marker="o",
                    markerfacecolor="white",
                    color=line.get_color(),
                )
        ax.set(xscale="log", yscale="log", xlabel="link rate (Mbit/s)", ylabel="seconds to target (median)")
        ax.set_title(f"{workload}: {WORKLOADS[workload].description}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["10gbit", "1gbit", "100mbit"], choices=list(RATE_BITS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (seeds SEED, SEED+1, ...)")
    parser.add_argument("--target", type=float, help="test accuracy to reach (default: the workload's)")
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--max-wall", type=float, default=900.0, help="stop a contender after this long")
    parser.add_argument("--train", type=int, help="training examples (default: the workload's)")
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64, help="minibatch per worker")
    parser.add_argument("--lr", type=float, help="Adam's learning rate (default: the workload's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only", nargs="+", default=list(CONTENDERS), choices=CONTENDERS, metavar="CONTENDER"
    )
    parser.add_argument(
        "--out", type=Path, help="append every run to OUT/runs.jsonl; write table.txt, plot.png"
    )
    parser.add_argument("--report", action="store_true", help="only summarise OUT/runs.jsonl")
    args = parser.parse_args()
    runs_file = args.out / "runs.jsonl" if args.out else None
    if not args.report:
        reason = harness.unavailable_reason()
        if reason:
            print(f"cannot build the cluster here: {reason}", file=sys.stderr)
            return 2
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)

        def record(run: dict) -> None:
            if runs_file:
                with runs_file.open("a") as f:
                    f.write(json.dumps(run) + "\n")

        runs = []
        for rate in args.rates:
            bench_rate(rate, args, lambda run: (runs.append(run), record(run)))
    elif runs_file is None or not runs_file.exists():
        parser.error("--report needs --out holding runs.jsonl")
    if runs_file and runs_file.exists():
        runs = [json.loads(line) for line in runs_file.read_text().splitlines() if line.strip()]
    table = summarise(runs)
    text = format_table(table)
    print(text)
    if args.out:
        (args.out / "table.txt").write_text(text + "\n")
        plot(table, args.out / "plot.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
