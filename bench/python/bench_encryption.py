"""What CURVE encryption of every link costs (``ZmqTransportConfiguration.encrypt``, on by default),
measured in one run against the same thing in the clear.

Usage: PYTHONPATH=python:tests/distributed python bench/python/bench_encryption.py
       [--params 1048576 10485760] [--reps 5] [--fit-epochs 3] [--fit-reps 3]

1. PARAMS broadcast: a live controller on 127.0.0.1 holds ``--params`` floats; a worker connects, says
   HELLO and receives them (one signed PARAMS frame of 4 x params bytes), ``--reps`` times per mode,
   the modes alternating. Reported: the best time per transfer, MB/s, and encrypted/clear.
2. Per-step time of a small distributed fit: SharedTrainingMaster on local[2] (2 workers), MLP
   64-256-256-10 on digits, minibatch 32 per worker, ``--fit-epochs`` epochs, ``--fit-reps`` fits per
   mode alternating; per step = the fit's wall time / the workers' minibatches (each worker's step
   includes sending its update, applying its peer's and the epoch barriers). Reported: the median per
   step and encrypted/clear. ``--fit-epochs 0`` skips it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
from wire_helpers import FAST, REFERENCE, SECRET, controller

from sparkgrad.transport import WorkerConnection

HIDDEN = (256, 256)
BATCH = 32


def params_transfer(port: int, job: int, n: int, encrypt: bool) -> float:
    """Seconds for one worker's HELLO to bring back the controller's n parameters."""
    config = dataclasses.replace(FAST, encrypt=encrypt, connect_timeout_ms=120_000, sync_timeout_ms=120_000)
    with controller(np.full(n, 0.5, np.float32), job, port, config=config) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            port,
            job,
            1,
            SECRET,
            n,
            config,
            controller_key=ctl.controller_key,
            curve_key=ctl.curve_key,
            threshold_reference=REFERENCE,
        )
        try:
            start = time.perf_counter()
            params, _, _ = conn.hello({})
            elapsed = time.perf_counter() - start
        finally:
            conn.close()
    assert params is not None and params.size == n
    return elapsed


def fit_step_ms(spark, rdd, port: int, epochs: int, encrypt: bool) -> float:
    """Milliseconds of fit wall time per worker minibatch."""
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration
    from sparkgrad.transport import ZmqTransportConfiguration

    conf = MultiLayerConfiguration(
        [DenseLayer(h, activation="relu") for h in HIDDEN] + [OutputLayer(10)],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-3),
        seed=1,
    )
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port, controller_address="127.0.0.1"),
        batch_size_per_worker=BATCH,
        rdd_data_set_num_examples=BATCH,  # the RDD holds minibatches of BATCH
    )
    master.transport = ZmqTransportConfiguration(encrypt=encrypt)
    with SparkMultiLayer(spark, MultiLayerNetwork(conf).init(), master) as model:
        start = time.monotonic()
        model.fit(rdd, epochs=epochs)
        wall = time.monotonic() - start
    return 1000 * wall / max(master.last_traffic["worker_minibatches"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, nargs="+", default=[1 << 20, 10 << 20])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--fit-epochs", type=int, default=3)
    parser.add_argument("--fit-reps", type=int, default=3)
    parser.add_argument("--port", type=int, default=47_374)
    args = parser.parse_args()
    job = 0
    for n in args.params:
        best = {False: float("inf"), True: float("inf")}
        for _ in range(args.reps):
            for encrypt in (False, True):
                job += 1
                best[encrypt] = min(best[encrypt], params_transfer(args.port, job, n, encrypt))
        for encrypt in (False, True):
            t = best[encrypt]
            ratio = f", {t / best[False]:.2f}x the clear time" if encrypt else ""
            print(
                f"PARAMS {n:>9} floats {'encrypted' if encrypt else 'clear':>9}: {1000 * t:8.1f} ms, "
                f"{4 * n / t / 1e6:7.1f} MB/s"
                + (f", {t / best[False]:.2f}x the clear time" if encrypt else ""),
                flush=True,
            )
    if args.fit_epochs <= 0:
        return
    from local_spark import local_session

    from sparkgrad.datasets import load_digits

    train, _ = load_digits(test_fraction=0.2, seed=0, shape="flat")
    spark = local_session("local[2]")
    rdd = spark.sparkContext.parallelize(train.split(BATCH), 2).cache()
    rdd.count()
    fit_step_ms(spark, rdd, args.port + 1, 1, True)  # warm-up: Python workers, imports
    steps: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.fit_reps):
        for encrypt in (False, True):
            steps[encrypt].append(fit_step_ms(spark, rdd, args.port + 1, args.fit_epochs, encrypt))
    for encrypt in (False, True):
        median = statistics.median(steps[encrypt])
        ratio = median / statistics.median(steps[False])
        print(
            f"fit step {'encrypted' if encrypt else 'clear':>9}: {median:6.2f} ms per minibatch (median of "
            f"{args.fit_reps}: {', '.join(f'{s:.2f}' for s in steps[encrypt])})"
            + (f", {ratio:.3f}x the clear step" if encrypt else ""),
            flush=True,
        )
    spark.stop()


if __name__ == "__main__":
    main()
