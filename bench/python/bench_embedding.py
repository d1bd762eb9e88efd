"""Training-step time of an embedding model with a small and a huge table, same batch (issue 39).

Model: EmbeddingSequenceLayer(vocab, 32) over sequences of 20 indices -> LSTM 32 -> RnnOutputLayer 10
(softmax), batch 32, float32; or ``--model flat``: EmbeddingLayer(vocab, 32) -> Dense 64 relu -> softmax
10, batch 128. The step is ``fit`` on one minibatch (gradient, updater, parameter update). With Sgd the
table's gradient and update touch only the rows the batch looked up, so the step should cost about the
same for 1K and 1M rows (target: ratio <= 1.2); ``--updater adam`` shows the dense cost a stateful
updater pays (DL4J's semantics: every row's moments move every step), ``--updater adam --lazy`` the
table's ``lazy_updates`` (only the looked-up rows and their moments step).

Prints, per vocabulary size, the median and minimum wall ms/step over the rounds and the minimum process
CPU ms/step (all threads; on a shared machine it does not count time spent descheduled), each with its
ratio to the smallest vocabulary's; rounds alternate between the sizes so that machine load hits all.

    PYTHONPATH=python python bench/python/bench_embedding.py [--vocab 1000,1000000] [--model seq|flat] \
        [--updater sgd|adam] [--lazy] [--steps 50] [--rounds 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import sparkgrad
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    LSTM,
    DenseLayer,
    EmbeddingLayer,
    EmbeddingSequenceLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
)
from sparkgrad.nn.updaters import Adam, Sgd

DIM, CLASSES = 32, 10


def build(model: str, vocab: int, updater: str, lazy: bool = False) -> MultiLayerNetwork:
    upd = Sgd(0.1) if updater == "sgd" else Adam(1e-3)
    if model == "seq":
        layers = [EmbeddingSequenceLayer(vocab, DIM, lazy_updates=lazy), LSTM(32), RnnOutputLayer(CLASSES)]
        conf = MultiLayerConfiguration(layers, input_type=InputType.recurrent(1), updater=upd, seed=1)
    else:
        layers = [
            EmbeddingLayer(vocab, DIM, lazy_updates=lazy),
            DenseLayer(64, activation="relu"),
            OutputLayer(CLASSES),
        ]
        conf = MultiLayerConfiguration(layers, updater=upd, seed=1)
    return MultiLayerNetwork(conf).init()


def batches(model: str, vocab: int, steps: int, rng: np.random.Generator) -> list[DataSet]:
    out = []
    for _ in range(steps):
        if model == "seq":
            x = rng.integers(0, vocab, (32, 1, 20))
            y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, (32, 20))].transpose(0, 2, 1)
        else:
            x = rng.integers(0, vocab, (128, 1))
            y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, 128)]
        out.append(DataSet(x, np.ascontiguousarray(y)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", default="1000,1000000")
    parser.add_argument("--model", choices=["seq", "flat"], default="seq")
    parser.add_argument("--updater", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--lazy", action="store_true", help="the table's lazy_updates")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        sparkgrad.set_num_threads(args.threads)
    vocabs = [int(v) for v in args.vocab.split(",")]
    rng = np.random.default_rng(0)
    nets = {v: build(args.model, v, args.updater, args.lazy) for v in vocabs}
    data = {v: batches(args.model, v, args.steps, rng) for v in vocabs}
    for v in vocabs:  # warm-up: buffers allocated, the first (whole-table) zeroing done
        nets[v].fit(data[v][:2])
    wall: dict[int, list[float]] = {v: [] for v in vocabs}
    cpu: dict[int, list[float]] = {v: [] for v in vocabs}
    for _ in range(args.rounds):
        for v in vocabs:
            start, start_cpu = time.perf_counter(), time.process_time()
            nets[v].fit(data[v])
            cpu[v].append((time.process_time() - start_cpu) / args.steps * 1e3)
            wall[v].append((time.perf_counter() - start) / args.steps * 1e3)
    base, base_cpu = min(wall[vocabs[0]]), min(cpu[vocabs[0]])
    lazy = ", lazy_updates" if args.lazy else ""
    print(f"model {args.model}, updater {args.updater}{lazy}, threads {sparkgrad.get_num_threads()}")
    for v in vocabs:
        t, c = wall[v], cpu[v]
        print(
            f"vocab {v:>9}: params {nets[v].num_params():>10}  wall median {statistics.median(t):7.3f} "
            f"min {min(t):7.3f} ms/step (x{min(t) / base:4.2f})  cpu min {min(c):7.3f} ms/step "
            f"(x{min(c) / base_cpu:4.2f})"
        )


if __name__ == "__main__":
    main()
