"""Convergence of gradient sharing against local training and DDP with the same hyperparameters.

For each model x updater x worker count x seed, on the digits (a new stratified train/test split per seed,
so nothing is tuned on one split), every contender trains for ``--epochs`` and records the test accuracy
after every epoch:

- ``local``: one network, minibatch ``--batch`` (the hyperparameters a user tunes on one machine);
- ``ddp``: one network with minibatch ``workers x batch``, which is exactly what DDP's averaged gradient
  computes (N workers of ``batch`` examples each, gradients averaged, one step), without a process group;
- ``pa``: ParallelWrapper's ``averaging`` mode, parameters averaged every 5 minibatches per worker
  (ParameterAveragingTrainingMaster's algorithm);
- ``auto`` / ``sqrt`` / ``mean`` / ``sum``: ParallelWrapper's ``shared_gradients`` mode with ``workers``
  threads (the in-process transport of SharedTrainingMaster's worker step: threshold-encoded messages,
  delivered asynchronously) and the default threshold algorithm at ``--sparsity``, combining the workers'
  updates as sparkgrad's default chooses for the updater (``auto``: their sum for the Adam family and
  RmsProp, scaled by 1/sqrt(N) otherwise), scaled by 1/sqrt(N), by their mean, or by their sum (DL4J,
  Strom);
- ``masked``: ``sqrt`` with momentum factor masking (a worker's Nesterov velocity zeroed where its message
  sent; for updaters without a velocity the same algorithm as ``sqrt``, so the two show the run-to-run
  noise of the asynchronous delivery);
- ``ddp-dense``, ``ddp-fp16``, ``ddp-powersgd1``, ``ddp-powersgd2``, ``ddp-powersgd4``,
  ``ddp-powersgd2-fp16``: PyTorch's DistributedDataParallel itself, ``workers`` processes (gloo on loopback,
  one thread each) of ``batch`` examples per step, the same model (PyTorch's default LSTM initialisation,
  He-normal elsewhere as sparkgrad's ``relu`` initialisation) and updater (torch.optim with DL4J's
  hyperparameters: RMSprop's decay 0.95, AdaGrad's epsilon 1e-6), dense or with one of DDP's
  communication hooks as bench/python/ddp_hooks.py registers them (fp16_compress_hook; PowerSGD at rank
  1, 2 or 4 with error feedback and warm start, from 10% of the steps on; PowerSGD inside
  fp16_compress_wrapper). Their bytes are each worker's ring all-reduce of what it reduced;
- ``spark``: SharedTrainingMaster with its defaults (but the threshold algorithm at ``--sparsity``) on a
  local Spark with ``workers`` task slots (``local[N]``, one partition per worker), through
  ``SparkMultiLayer.fit(rdd, epochs, epoch_callback)``: the real transport, controller and staleness bound
  instead of the in-process one. Meant for worker counts up to the machine's cores.

A gradient-sharing contender followed by ``@`` and a number uses that sparsity target instead of
``--sparsity`` (``--contenders ddp,sqrt,sqrt@3e-3,sqrt@1e-2`` compares message sizes). One followed by
``+warmup`` ramps each worker's learning rate linearly over its first epoch of steps (``RampSchedule``: the
gradual warm-up of Goyal et al. 2017 for large effective batches; ``sum+warmup`` is their linear scaling
rule with warm-up, since DL4J's sum takes N workers' steps at once). One followed by ``+clip`` clips each
worker's residual as DL4J's default does (``ResidualClippingPostProcessor(5.0, 5)``: to 5 thresholds every
5 iterations), instead of keeping all of it; any contender followed by ``+gclip`` clips each layer's gradient
to an L2 norm of 1 before the updater (``gradient_normalization="clip_l2_per_layer"``: the local gradient
clipping of Deep Gradient Compression, Lin et al. 2018, in DL4J's per-layer form). A gradient-sharing
contender followed by ``+encoded`` has each worker apply to its own replica only what its message carries,
as DL4J's workers do (``own_update="encoded"``), instead of its whole update (the default ``"full"``).
``spark`` followed by ``+sqrt``, ``+mean`` or ``+sum`` combines the workers' updates that way instead of
SharedTrainingMaster's default.

Models: ``mlp`` (64-128-128-10, relu), ``cnn`` (the 8x8 digit images: conv 16 3x3 same relu, max-pool 2,
dense 64 relu, softmax), ``lstm`` (each image as a sequence of 8 rows of 8 pixels: LSTM 32, last step,
softmax). Updaters and learning rates: ``sgd`` Sgd(0.1), ``nesterovs`` Nesterovs(0.05, 0.9), ``adam``
Adam(1e-3), ``rmsprop`` RmsProp(1e-3), ``adagrad`` AdaGrad(0.05).

Reported per (model, updater, workers, contender), over the seeds: the median accuracy after the first
epoch, the median and standard deviation of the epochs to ``--target`` accuracy (runs that never reach it
count as ``epochs + 1``), the median and standard deviation of the final accuracy, the worst fall after
first reaching ``target - 1%`` (the target is that no epoch falls more than 1% below that), and for
gradient sharing the bytes each worker sent per epoch against DDP's ring all-reduce (2 (N - 1) / N of the
parameters' bytes per worker and step). Writes
``convergence.json`` (every curve) and ``convergence.png`` (median curves) into ``--out``.

    PYTHONPATH=python python bench/python/bench_convergence.py [--models mlp,cnn,lstm] \\
        [--updaters sgd,nesterovs,adam,rmsprop,adagrad] [--workers 2,4,8,16] [--seeds 5] [--epochs 15] \\
        [--batch 16] [--target 0.97] [--sparsity 3e-3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import ddp_hooks
import numpy as np

import sparkgrad
from sparkgrad.compress import (
    DEFAULT_OWN_UPDATE,
    DEFAULT_SPARSITY_TARGET,
    DEFAULT_UPDATE_COMBINATION,
    UPDATE_COMBINATIONS,
    ResidualClippingPostProcessor,
    default_threshold_algorithm,
)
from sparkgrad.data import DataSet, ListDataSetIterator
from sparkgrad.datasets import load_digits
from sparkgrad.nn import (
    LSTM,
    ConvolutionLayer,
    DenseLayer,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SubsamplingLayer,
    TrainingListener,
    updaters,
)
from sparkgrad.nn.schedules import RampSchedule
from sparkgrad.parallel import ParallelWrapper

UPDATERS: dict[str, Callable[[], Any]] = {
    "sgd": lambda: updaters.Sgd(0.1),
    "nesterovs": lambda: updaters.Nesterovs(0.05, 0.9),
    "adam": lambda: updaters.Adam(1e-3),
    "rmsprop": lambda: updaters.RmsProp(1e-3),
    "adagrad": lambda: updaters.AdaGrad(0.05),
}


# gradient-sharing contenders: (update_combination, momentum_masking)
SHARED = {**{c: (c, False) for c in UPDATE_COMBINATIONS}, "masked": ("sqrt", True)}
PA_FREQUENCY = 5  # the "pa" contender averages every 5 minibatches per worker (DL4J's example setting)


def _network(
    model: str, updater: str, seed: int, warmup_steps: int = 0, clip_gradients: bool = False
) -> MultiLayerNetwork:
    if model == "mlp":
        layers = [DenseLayer(128, activation="relu"), DenseLayer(128, activation="relu"), OutputLayer(10)]
        input_type = InputType.feed_forward(64)
    elif model == "cnn":
        layers = [
            ConvolutionLayer(16, kernel_size=(3, 3), activation="relu", convolution_mode="same"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            DenseLayer(64, activation="relu"),
            OutputLayer(10),
        ]
        input_type = InputType.convolutional(8, 8, 1)
    else:
        layers = [LastTimeStep(LSTM(32)), OutputLayer(10)]
        input_type = InputType.recurrent(8)
    rule = UPDATERS[updater]()
    if warmup_steps:
        rule = dataclasses.replace(rule, learning_rate=RampSchedule(rule.learning_rate, warmup_steps))
    conf = MultiLayerConfiguration(
        layers,
        input_type=input_type,
        updater=rule,
        weight_init="relu",
        seed=seed,
        gradient_normalization="clip_l2_per_layer" if clip_gradients else "none",
    )
    return MultiLayerNetwork(conf).init()


def _data(model: str, seed: int) -> tuple[Any, Any]:
    train, test = load_digits(seed=seed, shape="flat" if model == "mlp" else "image")
    if model == "lstm":  # (N, 1, 8, 8) images -> (N, 8 features, 8 time steps): one row per step
        return tuple(  # type: ignore[return-value]
            DataSet(np.ascontiguousarray(ds.features[:, 0].transpose(0, 2, 1)), ds.labels)
            for ds in (train, test)
        )
    return train, test


_SPARK: dict[str, Any] = {}  # the local SparkSession of the ``spark`` contender and its task slots


def _spark_session(workers: int) -> Any:
    """A ``local[workers]`` SparkSession, replacing one with another slot count."""
    from local_spark import local_session

    if _SPARK.get("workers") != workers:
        if "session" in _SPARK:
            _SPARK["session"].stop()
        _SPARK.update(session=local_session(f"local[{workers}]"), workers=workers)
    return _SPARK["session"]


def _run_spark(net: MultiLayerNetwork, train: Any, test: Any, workers: int, epochs: int, batch: int,
               seed: int, sparsity: float, post: Any, own_update: str, combination: str) -> dict:  # fmt: skip
    """The ``spark`` contender: SharedTrainingMaster on a local Spark, accuracy after every epoch."""
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer

    spark = _spark_session(workers)
    algorithm = dataclasses.replace(default_threshold_algorithm(), sparsity_target=sparsity)
    master = SharedTrainingMaster(
        batch_size_per_worker=batch,
        threshold_algorithm=algorithm,
        residual_post_processor=post,
        rng_seed=seed,
        progress=False,
        own_update=own_update,
        update_combination=combination,
    )
    rdd = spark.sparkContext.parallelize(train.split(1), workers)
    history: list[float] = []
    start = time.perf_counter()
    with SparkMultiLayer(spark, net, master) as model:
        model.fit(
            rdd,
            epochs=epochs,
            epoch_callback=lambda epoch, network: history.append(float(network.evaluate(test).accuracy())),
        )
    return {
        "accuracy": history,
        "seconds": time.perf_counter() - start,
        "bytes_per_worker_epoch": master.last_traffic["worker_update_bytes_sent"] / workers / epochs,
        "params": int(net.num_params()),
        "steps_per_epoch": math.ceil(train.num_examples() / batch),
    }


class _Accuracy(TrainingListener):
    def __init__(self, test: Any) -> None:
        self.test, self.history = test, []

    def on_epoch_end(self, model: Any) -> None:
        self.history.append(float(model.evaluate(self.test).accuracy()))


def run(
    model: str,
    updater: str,
    contender: str,
    workers: int,
    seed: int,
    epochs: int,
    batch: int,
    sparsity: float,
) -> dict:
    """One training run: its accuracy after every epoch, wall time and bytes each worker sent. A
    gradient-sharing contender may name its own sparsity target (``sqrt@1e-2``), a warm-up
    (``sum+warmup``) and residual clipping (``sqrt+clip``)."""
    if contender in TORCH_CONTENDERS:
        return _run_torch(model, updater, TORCH_CONTENDERS[contender], workers, seed, epochs, batch)
    name, _, own_sparsity = contender.partition("@")
    sparsity = float(own_sparsity) if own_sparsity else sparsity
    name, *modifiers = name.split("+")
    combinations = [m for m in modifiers if m in UPDATE_COMBINATIONS]
    if not set(modifiers) - set(combinations) <= {"warmup", "clip", "gclip", "encoded"} or (
        combinations and (name != "spark" or len(combinations) > 1)
    ):
        raise ValueError(
            f"contender {contender!r}: expected NAME[+warmup][+clip][+gclip][+encoded][@SPARSITY], "
            f"spark also [+COMBINATION]"
        )
    combination = combinations[0] if combinations else DEFAULT_UPDATE_COMBINATION
    warmup = "warmup" in modifiers
    post = ResidualClippingPostProcessor() if "clip" in modifiers else None
    own_update = "encoded" if "encoded" in modifiers else DEFAULT_OWN_UPDATE
    shared = name in SHARED
    train, test = _data(model, seed)
    warmup_steps = math.ceil(train.num_examples() / (batch * workers)) if warmup else 0
    net = _network(model, updater, seed, warmup_steps, clip_gradients="gclip" in modifiers)
    if name == "spark":
        return _run_spark(
            net, train, test, workers, epochs, batch, seed, sparsity, post, own_update, combination
        )
    listener = _Accuracy(test)
    net.set_listeners(listener)
    size = batch * workers if name == "ddp" else batch
    data = ListDataSetIterator(train, batch_size=size, shuffle=True, seed=seed)
    trainer: Any = net
    if name == "pa":
        trainer = ParallelWrapper(
            net, workers=workers, training_mode="averaging", averaging_frequency=PA_FREQUENCY
        )
    elif shared:
        combination, masking = SHARED[name]
        algorithm = dataclasses.replace(default_threshold_algorithm(), sparsity_target=sparsity)
        trainer = ParallelWrapper(
            net,
            workers=workers,
            update_combination=combination,
            threshold_algorithm=algorithm,
            residual_post_processor=post,
            momentum_masking=masking,
            own_update=own_update,
        )
    start = time.perf_counter()
    trainer.fit(data, epochs=epochs)
    sent = trainer.bytes_sent / workers / epochs if shared else None
    return {
        "accuracy": listener.history,
        "seconds": time.perf_counter() - start,
        "bytes_per_worker_epoch": sent,
        "params": int(net.num_params()),
        "steps_per_epoch": math.ceil(train.num_examples() / size),
    }


# PyTorch DDP contenders: their names here -> the hook bench/python/ddp_hooks.py registers
TORCH_CONTENDERS = {"ddp-" + hook.replace(":", "", 1).replace(":", "-"): hook for hook in ddp_hooks.HOOKS}
# sparkgrad's updaters as torch.optim spells them, with DL4J's hyperparameters
TORCH_UPDATERS: dict[str, Callable[[Any], Any]] = {
    "sgd": lambda params: torch_optim().SGD(params, lr=0.1),
    "nesterovs": lambda params: torch_optim().SGD(params, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda params: torch_optim().Adam(params, lr=1e-3),
    "rmsprop": lambda params: torch_optim().RMSprop(params, lr=1e-3, alpha=0.95, eps=1e-8),
    "adagrad": lambda params: torch_optim().Adagrad(params, lr=0.05, eps=1e-6),
}


def torch_optim() -> Any:
    import torch

    return torch.optim


def _torch_network(model: str) -> Any:
    """``_network``'s architectures as PyTorch modules (batch-first sequences for the LSTM)."""
    from torch import nn

    class LastStepLSTM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.out = nn.LSTM(8, 32, batch_first=True), nn.Linear(32, 10)

        def forward(self, x):
            return self.out(self.lstm(x)[0][:, -1])

    if model == "mlp":
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    elif model == "cnn":
        net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
            nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
        )  # fmt: skip
    else:
        net = LastStepLSTM()
    for layer in net.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
    return net


def _torch_rank(rank: int, port: int, job: dict, results: Any) -> None:
    """One DDP process: trains ``job``'s model on its share of every global minibatch; rank 0 puts the
    test accuracy after every epoch and the bytes it all-reduced on ``results``."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    workers, batch, hook = job["workers"], job["batch"], job["hook"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=workers)
    torch.manual_seed(job["seed"])
    net = _torch_network(job["model"])
    model = DistributedDataParallel(net, bucket_cap_mb=ddp_hooks.bucket_cap_mb(hook))
    steps_per_epoch = math.ceil(len(job["y"]) / (workers * batch))
    ddp_hooks.register(model, hook, steps_per_epoch * job["epochs"])
    counted = ddp_hooks.count_all_reduce_bytes()
    optimizer = TORCH_UPDATERS[job["updater"]](model.parameters())
    x, y = torch.from_numpy(job["x"]), torch.from_numpy(job["y"])
    tx, ty = torch.from_numpy(job["tx"]), torch.from_numpy(job["ty"])
    history = []
    start = time.perf_counter()
    for epoch in range(job["epochs"]):
        order = torch.from_numpy(np.random.default_rng(job["seed"] * 1000 + epoch).permutation(len(y)))
        for step in range(steps_per_epoch):
            # the last global minibatch may be short: split it as evenly as the others
            mine = order[step * workers * batch : (step + 1) * workers * batch].tensor_split(workers)[rank]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[mine]), y[mine]).backward()
            optimizer.step()
        with torch.no_grad():
            history.append(float((net(tx).argmax(1) == ty).float().mean()))
    seconds = time.perf_counter() - start
    reduced = (
        counted[0]
        if hook != "dense"
        else ddp_hooks.dense_bytes_per_step(net) * steps_per_epoch * job["epochs"]
    )
    if rank == 0:
        results.put(
            {
                "accuracy": history,
                "seconds": seconds,
                "reduced": reduced,
                "params": sum(p.numel() for p in net.parameters()),
            }
        )
    dist.destroy_process_group()
    # gloo's and PowerSGD's threads abort the interpreter's normal exit now and then ("terminate called
    # without an active exception"): the result is out, so leave without running any destructor
    results.close()
    results.join_thread()
    os._exit(0)


def _run_torch(model: str, updater: str, hook: str, workers: int, seed: int, epochs: int, batch: int) -> dict:
    """A PyTorch DDP contender: ``workers`` processes, accuracy after every epoch."""
    import multiprocessing
    import socket

    train, test = _data(model, seed)
    features = (lambda f: np.ascontiguousarray(f.transpose(0, 2, 1))) if model == "lstm" else (lambda f: f)
    job = {
        "model": model, "updater": updater, "hook": hook, "workers": workers, "seed": seed, "epochs": epochs,
        "batch": batch, "x": features(train.features), "y": train.labels.argmax(1),
        "tx": features(test.features), "ty": test.labels.argmax(1),
    }  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_torch_rank, args=(r, port, job, results)) for r in range(workers)]
    for process in ranks:
        process.start()
    result = results.get(timeout=3600)
    for process in ranks:
        process.join()
        if process.exitcode:
            raise RuntimeError(f"{hook} DDP rank {ranks.index(process)} exited with {process.exitcode}")
    steps = math.ceil(len(job["y"]) / (workers * batch))
    return {
        "accuracy": result["accuracy"],
        "seconds": result["seconds"],
        "bytes_per_worker_epoch": ddp_hooks.ring_bytes_per_worker(result["reduced"] / epochs, workers),
        "params": result["params"],
        "steps_per_epoch": steps * workers,  # in batches of one worker's size, as the other contenders count
    }


def epochs_to(curve: list[float], target: float) -> int:
    """1-based epoch of the first accuracy >= target; len(curve) + 1 when never."""
    return next((i + 1 for i, a in enumerate(curve) if a >= target), len(curve) + 1)


def worst_fall(curve: list[float], target: float) -> float:
    """How far the accuracy fell below ``target - 1%`` after first reaching it (0: never below)."""
    floor = target - 0.01
    first = next((i for i, a in enumerate(curve) if a >= floor), None)
    return 0.0 if first is None else max(0.0, floor - min(curve[first:]))


def _spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(runs: list[dict], target: float) -> dict:
    curves = [r["accuracy"] for r in runs]
    hits = [epochs_to(c, target) for c in curves]
    finals = [c[-1] for c in curves]
    summary = {
        "epochs_to_target_median": statistics.median(hits),
        "epochs_to_target_sd": _spread(hits),
        "epoch1_median": statistics.median(c[0] for c in curves),
        "final_median": statistics.median(finals),
        "final_sd": _spread(finals),
        "worst_fall": max(worst_fall(c, target) for c in curves),
        "seconds_median": statistics.median(r["seconds"] for r in runs),
    }
    sent = [r["bytes_per_worker_epoch"] for r in runs if r["bytes_per_worker_epoch"] is not None]
    if sent:
        summary["bytes_per_worker_epoch"] = statistics.median(sent)
    return summary


def ddp_bytes_per_worker_epoch(params: int, steps: int, workers: int) -> float:
    """Ring all-reduce of float32 gradients: 2 (N - 1) / N of the parameters' bytes per worker and step."""
    return 2 * (workers - 1) / workers * params * 4 * steps


def _plot(results: dict, path: Path, models: list[str], updater_names: list[str], workers: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(models), len(updater_names), figsize=(3.2 * len(updater_names), 2.6 * len(models)), squeeze=False
    )
    styles = {
        "local": ("black", "-"),
        "ddp": ("tab:blue", "--"),
        "pa": ("tab:orange", "--"),
        "sqrt": ("tab:purple", "-"),
        "mean": ("tab:green", "-."),
        "sum": ("tab:red", ":"),
        "masked": ("tab:gray", "-"),
        "spark": ("tab:brown", "-"),
        "spark+sqrt": ("tab:purple", "-."),
        "spark+mean": ("tab:green", "-."),
        "spark+sum": ("tab:red", "-."),
        "auto": ("tab:purple", "-"),
        # PyTorch DDP itself: dotted
        "ddp-dense": ("tab:blue", ":"),
        "ddp-fp16": ("tab:cyan", ":"),
        "ddp-powersgd1": ("tab:red", ":"),
        "ddp-powersgd2": ("tab:orange", ":"),
        "ddp-powersgd4": ("tab:olive", ":"),
        "ddp-powersgd2-fp16": ("tab:pink", ":"),
    }
    n = max(workers)
    for row, model in enumerate(models):
        for col, updater in enumerate(updater_names):
            ax = axes[row][col]
            shown = [f"{model}/{updater}/1/local"] + [
                key for key in results if key.startswith(f"{model}/{updater}/{n}/")
            ]
            for key in (key for key in shown if key in results):
                contender = key.rsplit("/", 1)[1]
                # e.g. sqrt@1e-2: the next color; X+encoded (DL4J's own update): X's color, dotted
                color, style = styles.get(contender.removesuffix("+encoded"), (None, "-."))
                if contender.endswith("+encoded"):
                    style = ":"
                curves = np.array([r["accuracy"] for r in results[key]["runs"]])
                x = np.arange(1, curves.shape[1] + 1)
                (line,) = ax.plot(x, np.median(curves, axis=0), color=color, linestyle=style, label=contender)
                ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.12)
            ax.set_title(f"{model} {updater}, {n} workers", fontsize=9)
            ax.set_ylim(0.8, 1.0)
            ax.grid(alpha=0.3)
            if row == len(models) - 1:
                ax.set_xlabel("epoch")
            if col == 0:
                ax.set_ylabel("test accuracy")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,cnn,lstm")
    parser.add_argument("--updaters", default=",".join(UPDATERS))
    parser.add_argument("--workers", default="2,4,8,16")
    parser.add_argument("--contenders", default="ddp,pa,sqrt,mean,sum")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument(
        "--sparsity", type=float, default=DEFAULT_SPARSITY_TARGET, help="the threshold algorithm's target"
    )
    parser.add_argument("--out", default="bench/results")
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw convergence.png from convergence.json"
    )
    args = parser.parse_args()
    models, names = args.models.split(","), args.updaters.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    contenders = args.contenders.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        _plot(
            json.loads((out / "convergence.json").read_text()),
            out / "convergence.png",
            models,
            names,
            workers,
        )
        return
    print(
        f"sparkgrad {sparkgrad.__version__}, threads={sparkgrad.get_num_threads()}, seeds={args.seeds}, "
        f"epochs={args.epochs}, batch={args.batch}, target={args.target}, sparsity target={args.sparsity}"
    )
    results: dict[str, dict] = {}
    header = (
        f"{'model':5s} {'updater':9s} {'N':>2s} {'contender':18s} {'epoch 1':>7s} {'epochs to target':>17s} "
        f"{'final acc':>14s} {'worst fall':>10s} {'bytes/worker/epoch':>19s} {'vs DDP':>8s}"
    )
    print(header)
    for model in models:
        for updater in names:
            plan = [("local", 1)] + [(c, n) for n in workers for c in contenders]
            for contender, n in plan:
                runs = [
                    run(model, updater, contender, n, seed, args.epochs, args.batch, args.sparsity)
                    for seed in range(args.seeds)
                ]
                summary = summarise(runs, args.target)
                results[f"{model}/{updater}/{n}/{contender}"] = {"summary": summary, "runs": runs}
                ratio = ""
                if "bytes_per_worker_epoch" in summary:
                    ddp = ddp_bytes_per_worker_epoch(
                        runs[0]["params"], math.ceil(runs[0]["steps_per_epoch"] / n), n
                    )
                    summary["ddp_bytes_per_worker_epoch"] = ddp
                    ratio = f"{ddp / max(summary['bytes_per_worker_epoch'], 1):7.0f}x"
                sent = summary.get("bytes_per_worker_epoch")
                hit, final = summary["epochs_to_target_median"], summary["final_median"]
                print(
                    f"{model:5s} {updater:9s} {n:2d} {contender:18s} {summary['epoch1_median']:7.4f} "
                    f"{hit:9.1f} +-{summary['epochs_to_target_sd']:4.1f} "
                    f"{final:7.4f} +-{summary['final_sd']:.4f} {summary['worst_fall']:10.4f} "
                    f"{'' if sent is None else f'{sent:19,.0f}'} {ratio}",
                    flush=True,
                )
    (out / "convergence.json").write_text(json.dumps(results))
    _plot(results, out / "convergence.png", models, names, workers)
    print(f"wrote {out / 'convergence.json'} and {out / 'convergence.png'}")


if __name__ == "__main__":
    main()
