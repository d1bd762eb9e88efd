"""Recurrent training step against PyTorch (CPU) over a grid of shapes: the corners and a middle shape.

For one cell type (LSTM, GRU or SimpleRnn with tanh, as in bench_lstm.py, whose step builders and timer
this reuses) and each thread count, runs the corner grid input {16, 256} x hidden {64, 512} x batch
{16, 128} plus the middle shape in=64 hidden=256 batch=64, 50 time steps. Each shape alternates timed
rounds of the two frameworks in this process; the steps per round are chosen from a warm-up step so a
round takes about ``--round-s`` seconds (one step for the big shapes), so a sweep of one cell type stays
near ten minutes on an idle 2-core machine. Prints one line per shape: ms/step of both, the ratio
sparkgrad / PyTorch (target <= 0.8) and the 1-minute load average at the end of the line.

    PYTHONPATH=python python bench/python/bench_recurrent_shapes.py --cell lstm [--threads 1 2] \
        [--rounds 3] [--round-s 0.4] [--only 16,512,128]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lstm import CLASSES, _sparkgrad_step, _time, _torch_step  # noqa: E402

import sparkgrad  # noqa: E402

SEQ = 50
MIDDLE = (64, 256, 64)


def grid() -> list[tuple[int, int, int]]:
    """(n_in, hidden, batch): the eight corners, then the middle shape."""
    return [*itertools.product((16, 256), (64, 512), (16, 128)), MIDDLE]


def measure(
    cell: str, n_in: int, hidden: int, batch: int, rounds: int, round_s: float
) -> tuple[float, float, int]:
    """Median ms/step of sparkgrad and PyTorch over ``rounds`` alternated rounds, and the steps per round."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, n_in, SEQ), dtype=np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, batch)]
    steps = {"sparkgrad": _sparkgrad_step(cell, hidden, x, y), "torch": _torch_step(cell, hidden, x, y)}
    _time(steps["sparkgrad"], 1)  # buffer allocation, BLAS / oneDNN initialisation
    slowest = max(_time(step, 1) for step in steps.values())  # ms of one warm step
    per_round = max(1, min(50, round(round_s * 1e3 / slowest)))
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            times[key].append(_time(step, per_round))
    return statistics.median(times["sparkgrad"]), statistics.median(times["torch"]), per_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", choices=["lstm", "gru", "simplernn"], default="lstm")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated timed rounds; the median is reported"
    )
    parser.add_argument("--round-s", type=float, default=0.4, help="target seconds of one timed round")
    parser.add_argument(
        "--only", action="append", default=[], help="run only this shape, 'n_in,hidden,batch' (repeatable)"
    )
    args = parser.parse_args()

    import torch

    shapes = grid()
    if args.only:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.only]  # type: ignore[misc]
    print(
        f"torch={torch.__version__} sparkgrad={sparkgrad.__version__} cell={args.cell} seq={SEQ}", flush=True
    )
    start = time.perf_counter()
    for threads in args.threads:
        sparkgrad.set_num_threads(threads)
        torch.set_num_threads(threads)
        for n_in, hidden, batch in shapes:
            sg, pt, per_round = measure(args.cell, n_in, hidden, batch, args.rounds, args.round_s)
            print(
                f"threads={threads} {args.cell} in={n_in:<3} hidden={hidden:<3} batch={batch:<3} "
                f"sparkgrad {sg:8.2f} ms/step  torch {pt:8.2f} ms/step  ratio {sg / pt:5.2f}x  "
                f"steps={per_round} load={os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print(f"sweep took {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
