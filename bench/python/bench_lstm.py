"""Recurrent training-step time of sparkgrad vs PyTorch (CPU) on the same thread count, in the same process.

Configuration: one recurrent layer (LSTM by default, GRU against torch.nn.GRU, or SimpleRnn with tanh against
torch.nn.RNN; input 64,
hidden 256) over sequences of 50 steps, batch 64, a softmax output at the last time step (10 classes,
cross-entropy), Adam; random data. Each step is forward, backward and the Adam update. Rounds alternate
between the two frameworks so that machine load hits both. Prints ms/step for both and the ratio
sparkgrad / PyTorch (target <= 0.8). Small recurrent GEMMs show per-step overheads: try
``--hidden 128 --seq 40 --batch 32``. sparkgrad's GRU applies the reset gate before the candidate's
recurrent product (DL4J's cell), PyTorch's after it: the same work, two recurrent products per step
against PyTorch's one wider one.

    PYTHONPATH=python python bench/python/bench_lstm.py [--cell lstm|gru|simplernn] [--threads N] \
        [--steps 10] [--rounds 5] [--n-in 64] [--hidden 256] [--seq 50] [--batch 64]
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
    GRU,
    LSTM,
    InputType,
    LastTimeStep,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SimpleRnn,
)
from sparkgrad.nn.updaters import Adam

CLASSES = 10


def _sparkgrad_step(cell: str, hidden: int, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    cells = {"lstm": LSTM, "gru": GRU, "simplernn": lambda h: SimpleRnn(h, activation="tanh")}
    layer = cells[cell](hidden)
    conf = MultiLayerConfiguration(
        [LastTimeStep(layer), OutputLayer(CLASSES)],
        input_type=InputType.recurrent(x.shape[1]),
        updater=Adam(1e-3),
        seed=0,
    )
    net = MultiLayerNetwork(conf).init()
    ds = DataSet(x, y)  # (batch, size, time): DL4J's layout
    return lambda: net.fit(ds)


def _torch_step(cell: str, hidden: int, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    n_in = x.shape[1]
    rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "simplernn": nn.RNN}[cell](n_in, hidden, batch_first=True)
    head = nn.Linear(hidden, CLASSES)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1)))  # (batch, time, size)
    yt = torch.from_numpy(y.argmax(axis=1))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out, _ = rnn(xt)
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
    parser.add_argument("--cell", choices=["lstm", "gru", "simplernn"], default="lstm")
    parser.add_argument("--n-in", type=int, default=64, help="input size")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=50, help="time steps per sequence")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    import torch

    sparkgrad.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} torch={torch.__version__} sparkgrad={sparkgrad.__version__}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.n_in, args.seq), dtype=np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, args.batch)]
    steps = {
        "sparkgrad": _sparkgrad_step(args.cell, args.hidden, x, y),
        "torch": _torch_step(args.cell, args.hidden, x, y),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    for step in steps.values():  # warm-up: buffer allocation, BLAS/oneDNN initialisation
        _time(step, 2)
    for _ in range(args.rounds):
        for key, step in steps.items():
            times[key].append(_time(step, args.steps))
    sg, pt = statistics.median(times["sparkgrad"]), statistics.median(times["torch"])
    shape = f"in={args.n_in} hidden={args.hidden} seq={args.seq} batch={args.batch}"
    line = f"{args.cell} {shape} sparkgrad {sg:8.2f} ms/step"
    print(f"{line}  torch {pt:8.2f} ms/step  ratio {sg / pt:5.2f}x")


if __name__ == "__main__":
    main()
