"""What a checkpoint after every epoch costs a fit at the bandwidth benchmark's size (5.8 M parameters).

Model and data are those of bench/cluster/bench_bandwidth.py: MLP 784-2048-2048-10 (5.8 M parameters;
with Adam's two moments 70 MB to save), Adam(3e-4), MNIST-shaped examples made from the bundled digits,
minibatch 64 per worker; SharedTrainingMaster with its defaults on ``local[2]``. Fits of --epochs epochs
alternate, without and with ``checkpoint=`` (every epoch, a local directory), --repeats times each, in
one Spark session. Per fit: the seconds of every epoch after the first (from one epoch end to the next,
as the driver sees them), the seconds the driver spends in the checkpoint call at an epoch end (the
snapshot; the file is written in the background) and the seconds of the background write.

Usage: PYTHONPATH=python python bench/python/bench_checkpoint.py [--examples 12000] [--epochs 3]
    [--repeats 3] [--out bench/results/checkpoints/cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "cluster"))
from bench_bandwidth import HIDDEN, SIDE, make_data  # noqa: E402
from local_spark import local_session  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE.parent / "results" / "checkpoints" / "cost.json"))
    args = parser.parse_args()

    import sparkgrad
    from sparkgrad.data import DataSet
    from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
    from sparkgrad.nn.updaters import Adam
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer
    from sparkgrad.spark import checkpoint as checkpoint_module

    print(f"sparkgrad._core: {sparkgrad._core.__file__}", flush=True)
    spark = local_session("local[2]", {"spark.driver.memory": "4g"})
    x, y = make_data(args.examples, 1, "train")
    labels = (y[:, None] == list(range(10))).astype("float32")
    rdd = spark.sparkContext.parallelize(DataSet(x, labels).split(64), 2).cache()
    rdd.count()
    conf = MultiLayerConfiguration(
        [DenseLayer(h, activation="relu") for h in HIDDEN] + [OutputLayer(10)],
        input_type=InputType.feed_forward(SIDE * SIDE),
        updater=Adam(3e-4),
        seed=1,
    )

    snapshot_s: list[float] = []
    write_s: list[float] = []
    original_write, original_files = (
        checkpoint_module.FitCheckpoints.write,
        checkpoint_module.FitCheckpoints._write_files,
    )

    def timed_write(self, network, record, updater_state):
        start = time.perf_counter()
        original_write(self, network, record, updater_state)
        snapshot_s.append(time.perf_counter() - start)

    def timed_files(self, snapshot, record):
        start = time.perf_counter()
        original_files(self, snapshot, record)
        write_s.append(time.perf_counter() - start)

    checkpoint_module.FitCheckpoints.write = timed_write
    checkpoint_module.FitCheckpoints._write_files = timed_files

    epochs: dict[str, list[float]] = {"plain": [], "checkpointed": []}
    for repeat in range(args.repeats):
        for mode in ("plain", "checkpointed"):
            ends: list[float] = []
            options = (
                {"checkpoint": tempfile.mkdtemp(prefix="sparkgrad-ckpt-")} if mode == "checkpointed" else {}
            )
            master = SharedTrainingMaster(
                batch_size_per_worker=64, rdd_data_set_num_examples=64, rng_seed=repeat + 1, progress=False
            )
            with SparkMultiLayer(spark, conf, master) as model:
                model.fit(
                    rdd,
                    epochs=args.epochs,
                    epoch_callback=lambda e, n, ends=ends: ends.append(time.monotonic()),
                    **options,
                )
            durations = [b - a for a, b in zip(ends, ends[1:])]
            epochs[mode].extend(durations)
            print(f"repeat {repeat} {mode}: epochs {[round(d, 2) for d in durations]} s", flush=True)

    plain, checkpointed = statistics.median(epochs["plain"]), statistics.median(epochs["checkpointed"])
    result = {
        "examples": args.examples,
        "parameters": int(model.network.params().size),
        "epoch_s_plain_median": plain,
        "epoch_s_checkpointed_median": checkpointed,
        "epoch_ratio": checkpointed / plain,
        "snapshot_s_median": statistics.median(snapshot_s),
        "background_write_s_median": statistics.median(write_s),
        "epochs": epochs,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "epochs"}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
