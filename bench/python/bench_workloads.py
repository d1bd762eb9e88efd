"""The three workloads of issue 39, each trained on a local Spark from a DataFrame with gradient sharing.

- ``ctr``: a click-through-style tabular model. Each row has FIELDS categorical columns, hashed into one
  table of ``--vocab`` rows (an array column of FIELDS indices per row); a wide and deep graph reads it:
  ``wide`` = EmbeddingSequenceLayer(vocab, 1) summed over the fields (a linear model of the one-hot
  columns), ``deep`` = EmbeddingSequenceLayer(vocab, 16) summed -> Dense 64 -> Dense 32; both merged into
  a softmax. Labels come from a hidden logistic model of the fields' values (a few fields interact).
- ``text``: a text classifier: token sequences of 5-40 ids (an array column of any length) ->
  EmbeddingSequenceLayer(2000, 32) -> GRU 32 -> global average pooling -> softmax over 4 topics, each
  topic drawing its tokens from its own slice of the vocabulary half the time.
- ``conv1d``: a 1-D convolutional time-series classifier: series of 3 channels x 64 steps (an array
  column of time steps, each an array of 3 values) -> Convolution1D 16 (k 5) -> Subsampling1D max 2 ->
  Convolution1D 32 (k 5) -> global max pooling -> softmax over 3 shapes (sine, square, sawtooth
  bursts at random positions and frequencies, in noise).

Prints per workload: parameters, epochs, fit wall time, held-out accuracy, the workers' bytes sent per
minibatch (SharedTrainingMaster's counters: the update frames, and everything they sent, which adds the
syncs, the loss reports and the updater state the workers average at the fit's end) and, for
comparison, what a ring all-reduce of the dense gradient (DDP) sends per worker and step for the same
model, 2 (W - 1) / W x 4 bytes x parameters, with the ratios. Two times per minibatch: the fit's wall
time over the minibatches per worker (Spark's job start, the model's transfer to the tasks and back and
the first epoch's warm-up included), and the steady step: from the end of the first epoch to the end of
the last over the minibatches per worker in those epochs (needs ``--epochs`` >= 2). For ``ctr`` their
ratios to the first ``--vocab``'s say whether the step's cost depends on the table's size (the steady
one) and what the fit's fixed costs for a larger model add (the other).

    PYTHONPATH=python python bench/python/bench_workloads.py [--workload ctr,text,conv1d] \
        [--vocab 1000,1000000] [--rows 20000] [--epochs 3] [--seed 0] [--master local[2]]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from local_spark import local_session

from sparkgrad.nn import (
    GRU,
    ComputationGraphConfiguration,
    Convolution1DLayer,
    DenseLayer,
    EmbeddingSequenceLayer,
    GlobalPoolingLayer,
    InputType,
    MergeVertex,
    MultiLayerConfiguration,
    OutputLayer,
    Subsampling1DLayer,
)
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import SharedTrainingMaster, SparkComputationGraph, SparkMultiLayer
from sparkgrad.transport import ZmqTransportConfiguration

FIELDS = 8


def ctr_data(rng: np.random.Generator, rows: int, vocab: int) -> tuple[list, np.ndarray]:
    """Rows of FIELDS hashed category ids and their 0/1 click labels."""
    cardinality = np.array([5, 10, 20, 50, 100, 1000, 10000, 100000])
    values = rng.integers(0, cardinality, (rows, FIELDS)) % cardinality
    # a hidden logistic model: per-field value effects plus one interaction of the first two fields
    effects = [rng.normal(0, 1.0, c) for c in cardinality]
    logit = sum(effects[f][values[:, f]] for f in range(FIELDS)) / 2 + 1.5 * (
        values[:, 0] == values[:, 1] % 5
    )
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(float)
    # the hashing trick: field f's value v at row (f * 1,000,003 + v * 7,919) mod vocab
    ids = (np.arange(FIELDS) * 1_000_003 + values * 7_919) % vocab
    return ids.tolist(), labels


def ctr_conf(vocab: int) -> ComputationGraphConfiguration:
    return (
        ComputationGraphConfiguration.builder(seed=1, updater=Adam(2e-3))
        .add_inputs("fields")
        .set_input_types(InputType.recurrent(1, FIELDS))
        .add_layer("wide", EmbeddingSequenceLayer(vocab, 1, lazy_updates=True), "fields")
        .add_layer("wide_sum", GlobalPoolingLayer("sum"), "wide")
        .add_layer("deep", EmbeddingSequenceLayer(vocab, 16, lazy_updates=True), "fields")
        .add_layer("deep_sum", GlobalPoolingLayer("sum"), "deep")
        .add_layer("hidden1", DenseLayer(64, activation="relu"), "deep_sum")
        .add_layer("hidden2", DenseLayer(32, activation="relu"), "hidden1")
        .add_vertex("both", MergeVertex(), "wide_sum", "hidden2")
        .add_layer("click", OutputLayer(2), "both")
        .set_outputs("click")
        .build()
    )


def text_data(rng: np.random.Generator, rows: int) -> tuple[list, np.ndarray]:
    vocab, topics = 2000, 4
    labels = rng.integers(0, topics, rows)
    seqs = []
    for topic in labels:
        length = int(rng.integers(5, 41))
        own = rng.integers(topic * vocab // topics, (topic + 1) * vocab // topics, length)
        noise = rng.integers(0, vocab, length)
        seqs.append(np.where(rng.random(length) < 0.5, own, noise).tolist())
    return seqs, labels.astype(float)


def text_conf() -> MultiLayerConfiguration:
    layers = [
        EmbeddingSequenceLayer(2000, 32),
        GRU(32, activation="tanh"),
        GlobalPoolingLayer("avg"),
        OutputLayer(4),
    ]
    return MultiLayerConfiguration(layers, input_type=InputType.recurrent(1), updater=Adam(5e-3), seed=1)


def conv_data(rng: np.random.Generator, rows: int) -> tuple[list, np.ndarray]:
    steps, channels = 64, 3
    labels = rng.integers(0, 3, rows)
    t = np.arange(steps)
    series = rng.normal(0, 0.3, (rows, steps, channels))
    for i, shape in enumerate(labels):
        start, length = int(rng.integers(0, steps - 24)), int(rng.integers(16, 25))
        phase = 2 * np.pi * t[start : start + length] / rng.uniform(6, 12)
        wave = (np.sin(phase), np.sign(np.sin(phase)), (phase / np.pi) % 2 - 1)[shape]
        series[i, start : start + length, int(rng.integers(0, channels))] += wave
    return series.tolist(), labels.astype(float)


def conv_conf() -> MultiLayerConfiguration:
    layers = [
        Convolution1DLayer(16, kernel_size=5, activation="relu"),
        Subsampling1DLayer("max", kernel_size=2, stride=2),
        Convolution1DLayer(32, kernel_size=5, activation="relu"),
        GlobalPoolingLayer("max"),
        OutputLayer(3),
    ]
    return MultiLayerConfiguration(layers, input_type=InputType.recurrent(3), updater=Adam(3e-3), seed=1)


def run(
    spark,
    name: str,
    conf,
    rows: list,
    labels: np.ndarray,
    epochs: int,
    workers: int,
    queued_mib: int,
    seed: int = 0,
) -> dict:
    """Fit on the first 80% of the rows, evaluate on the rest; the counters of the fit."""
    split = int(0.8 * len(rows))
    schema = "features array<{}>, label double".format("array<double>" if name == "conv1d" else "int")
    frame = spark.createDataFrame(list(zip(rows, labels.tolist())), schema)
    train = frame.limit(split).repartition(workers).cache()
    test = spark.createDataFrame(list(zip(rows[split:], labels[split:].tolist())), schema)
    train.count()
    transport = None if queued_mib is None else ZmqTransportConfiguration(max_queued_bytes=queued_mib << 20)
    master = SharedTrainingMaster(
        batch_size_per_worker=64, rng_seed=seed + 1, progress=False, transport=transport
    )
    kind = SparkComputationGraph if isinstance(conf, ComputationGraphConfiguration) else SparkMultiLayer
    epoch_ends: list[float] = []
    with kind(spark, conf, master) as model:
        start = time.perf_counter()
        model.fit(
            train, epochs=epochs, epoch_callback=lambda epoch, net: epoch_ends.append(time.perf_counter())
        )
        wall = time.perf_counter() - start
        accuracy = model.evaluate(test).accuracy()
        params = model.network.num_params()
    traffic = master.last_traffic
    steps = max(int(traffic["worker_minibatches"]), 1)
    sent = traffic["worker_bytes_sent"] / steps
    updates = traffic["worker_update_bytes_sent"] / steps
    ddp = 2 * (workers - 1) / workers * 4 * params
    # the epochs after the first, end to end: each worker's steps without the fit's fixed costs (the job's
    # start, the model's transfer to the tasks and back, the first epoch's warm-up and state report)
    steady = epoch_ends[-1] - epoch_ends[0] if len(epoch_ends) > 1 else float("nan")
    return {
        "params": params,
        "wall_s": wall,
        "ms_per_step": 1000 * wall / (steps / workers),
        "steady_ms_per_step": 1000 * steady / (steps / workers * (len(epoch_ends) - 1) / len(epoch_ends)),
        "accuracy": accuracy,
        "bytes_per_step": sent,
        "update_bytes_per_step": updates,
        "ddp_bytes_per_step": ddp,
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="ctr,text,conv1d")
    parser.add_argument("--vocab", default="1000,1000000", help="ctr: table sizes, the first is the base")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--seed", type=int, default=0, help="the data's seed; the master's rng_seed is seed + 1"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--driver-memory",
        default="6g",
        help="spark.driver.memory (local mode: the executors' JVM too); a fit returns the 1M-row model's "
        "parameters and Adam state (384 MB) as task results through it",
    )
    parser.add_argument(
        "--max-queued-mib",
        type=int,
        default=None,
        help="ZmqTransportConfiguration.max_queued_bytes in MiB (default: the transport's 256)",
    )
    args = parser.parse_args()
    workers = int(args.master.split("[")[1].rstrip("]"))
    spark = local_session(args.master, {"spark.driver.memory": args.driver_memory})
    rng = np.random.default_rng(args.seed)
    for name in args.workload.split(","):
        # (label, configuration, rows, labels) of each fit of the workload
        if name == "ctr":
            fits = [
                (
                    f"ctr vocab {vocab}",
                    ctr_conf(vocab),
                    *ctr_data(np.random.default_rng(args.seed), args.rows, vocab),
                )
                for vocab in map(int, args.vocab.split(","))
            ]
        elif name == "text":
            fits = [("text", text_conf(), *text_data(rng, args.rows))]
        elif name == "conv1d":
            fits = [("conv1d", conv_conf(), *conv_data(rng, args.rows))]
        else:
            raise SystemExit(f"--workload: unknown {name!r} (ctr, text, conv1d)")
        results = [
            (
                label,
                run(spark, name, conf, rows, labels, args.epochs, workers, args.max_queued_mib, args.seed),
            )
            for label, conf, rows, labels in fits
        ]
        base, steady_base = results[0][1]["ms_per_step"], results[0][1]["steady_ms_per_step"]
        for label, r in results:
            ddp, updates, sent = r["ddp_bytes_per_step"], r["update_bytes_per_step"], r["bytes_per_step"]
            steady = r["steady_ms_per_step"]
            print(
                f"{label:>22}: params {r['params']:>10,}  {args.epochs} epochs {r['wall_s']:7.1f} s  "
                f"{r['ms_per_step']:7.2f} ms/step (x{r['ms_per_step'] / base:.2f})  "
                f"steady {steady:6.2f} ms/step (x{steady / steady_base:.2f})  "
                f"accuracy {r['accuracy']:.4f}  updates {updates:>9,.0f} B/step (all sent {sent:>10,.0f})  "
                f"DDP {ddp:>12,.0f} B/step  (DDP / updates x{ddp / max(updates, 1):,.0f}, "
                f"DDP / all sent x{ddp / max(sent, 1):,.0f})",
                flush=True,
            )
    spark.stop()


if __name__ == "__main__":
    main()
