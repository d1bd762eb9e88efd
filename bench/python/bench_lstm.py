"""LSTM training-step time of sparkgrad vs PyTorch (CPU) on the same thread count, in the same process.

Configuration: one LSTM layer (input 64, hidden 256) over sequences of 50 steps, batch 64, a softmax
output at the last time step (10 classes, cross-entropy), Adam; random data. Each step is forward,
backward and the Adam update. Rounds alternate between the two frameworks so that machine load hits both.
Prints ms/step for both and the ratio sparkgrad / PyTorch (target <= 1.0).

    PYTHONPATH=python python bench/python/bench_lstm.py [--threads N] [--steps 10] [--rounds 5]
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
    LSTM,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)
from sparkgrad.nn.updaters import Adam

N_IN, HIDDEN, STEPS, BATCH, CLASSES = 64, 256, 50, 64, 10


def _sparkgrad_step(x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    conf = MultiLayerConfiguration(
        [LastTimeStep(LSTM(HIDDEN)), OutputLayer(CLASSES)],
        input_type=InputType.recurrent(N_IN),
        updater=Adam(1e-3),
        seed=0,
    )
    net = MultiLayerNetwork(conf).init()
    ds = DataSet(x, y)  # (batch, size, time): DL4J's layout
    return lambda: net.fit(ds)


def _torch_step(x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    lstm, head = nn.LSTM(N_IN, HIDDEN, batch_first=True), nn.Linear(HIDDEN, CLASSES)
    opt = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1)))  # (batch, time, size)
    yt = torch.from_numpy(y.argmax(axis=1))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out, _ = lstm(xt)
        loss_fn(head(out[:, -1]), yt).backward()
        opt.step()

    return step


def _time(step: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=sparkgrad.get_num_threads())
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating timed rounds; the median is reported"
    )
    args = parser.parse_args()

    import torch

    sparkgrad.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} torch={torch.__version__} sparkgrad={sparkgrad.__version__}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, N_IN, STEPS), dtype=np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, BATCH)]
    steps = {"sparkgrad": _sparkgrad_step(x, y), "torch": _torch_step(x, y)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for step in steps.values():  # warm-up: buffer allocation, BLAS/oneDNN initialisation
        _time(step, 2)
    for _ in range(args.rounds):
        for key, step in steps.items():
            times[key].append(_time(step, args.steps))
    sg, pt = statistics.median(times["sparkgrad"]), statistics.median(times["torch"])
    line = f"lstm in={N_IN} hidden={HIDDEN} seq={STEPS} batch={BATCH} sparkgrad {sg:8.2f} ms/step"
    print(f"{line}  torch {pt:8.2f} ms/step  ratio {sg / pt:5.2f}x")


if __name__ == "__main__":
    main()
