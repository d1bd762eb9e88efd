"""ParallelWrapper scaling: examples/s of 1 vs N worker threads on this machine, in the same run.

Model: MLP 784-1024-512-10 (relu, Adam, softmax + cross-entropy), batch 128 per worker step, random data.
Each worker thread runs its native kernels single-threaded (``set_num_threads(1)``), so N workers use N
cores; the baseline is one worker (the same code path) and plain ``MultiLayerNetwork.fit`` on one thread.
Rounds alternate between the configurations so that machine load hits all of them; the median is
printed, one line per configuration, with the speed-up over one worker.

With ``--devices cuda:0,cuda:1`` (or a mix such as ``cuda:0,cpu``) the parallel runs put one worker on each
listed device, the one-worker runs use the first device and the plain fit runs there too; the wrapped
network stays on the CPU (the authoritative copy every message is applied to).

    PYTHONPATH=python python bench/python/bench_parallel.py [--workers 2 | --devices D1,D2] [--batches 64]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

import sparkgrad
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)
from sparkgrad.parallel import ParallelWrapper


def _network() -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(1024, activation="relu"), DenseLayer(512, activation="relu"), OutputLayer(10)],
        input_type=InputType.feed_forward(784),
        updater=updaters.Adam(1e-3),
        seed=0,
    )
    return MultiLayerNetwork(conf).init()


def _data(batches: int, batch_size: int) -> list[DataSet]:
    rng = np.random.default_rng(0)
    return [
        DataSet(
            rng.random((batch_size, 784), dtype=np.float32),
            np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch_size)],
        )
        for _ in range(batches)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker threads of the parallel runs")
    parser.add_argument("--devices", help="comma-separated devices, one worker each (e.g. cuda:0,cuda:1)")
    parser.add_argument("--batches", type=int, default=64, help="minibatches per timed epoch")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sparkgrad.set_num_threads(1)
    data = _data(args.batches, args.batch_size)
    examples = args.batches * args.batch_size

    devices = args.devices.split(",") if args.devices else ["cpu"] * args.workers
    plain_net = _network().to(devices[0])
    runs: dict[str, Callable[[], object]] = {f"plain fit, {devices[0]}": lambda: plain_net.fit(data)}
    for mode in ("shared_gradients", "averaging"):
        for on in (devices[:1], devices):
            wrapper = ParallelWrapper(_network(), training_mode=mode, averaging_frequency=4, devices=on)
            n = len(on)
            runs[f"{mode}, {n} worker{'s' if n > 1 else ''}"] = lambda w=wrapper, d=data: w.fit(d)
    print(f"workers on {', '.join(devices)}")
    for run in runs.values():  # warm-up: page in buffers, build worker replicas
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    rate = {name: examples / statistics.median(t) for name, t in times.items()}
    for name in runs:
        mode = name.split(",")[0]
        base = rate.get(f"{mode}, 1 worker", rate[name])
        print(f"{name:32s} {rate[name]:9.0f} examples/s  {rate[name] / base:5.2f}x one worker")


if __name__ == "__main__":
    main()
