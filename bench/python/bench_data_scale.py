"""Training from Parquet frames of 1x, 4x and 16x a base size on local[2]: time per epoch, examples/s, peak
Python worker RSS and peak JVM heap, for each training approach, with MLlib's MultilayerPerceptronClassifier
on the same frames as the anchor.

Data: --base-rows rows of 64 float32 features (an array column) and a class label from a fixed random
linear teacher (10 classes), written once with pyarrow under --data-dir in row groups (the driver never
holds a frame). Model: MLP 64-128-10 (ReLU, softmax), Adam(1e-3), one epoch, batch 256 per worker,
``SparkgradClassifier`` with SharedTrainingMaster (``rdd_training_approach`` "direct": the converted
DataFrame persisted at the master's storage level; "export": written once as minibatch files, trained from
them). Every run is a fresh Spark (``spark.driver.memory`` --driver-memory) in a child process; it reads
the frame, then fits. Measured: the fit's wall time (conversion, counting, export and training: what a
user waits for) and examples/s over it; the peak RSS of every Python worker process (the largest VmHWM
seen, sampled every 0.2 s) and the JVM heap in use (sampled every 0.2 s through py4j). MLlib: one L-BFGS
iteration (``maxIter=1``, a pass over the data plus its line search), blockSize 128, on the same frame,
its features assembled into a Vector.

Usage: PYTHONPATH=python python bench/python/bench_data_scale.py [--base-rows 1050000] [--scales 1,4,16]
    [--approaches direct,export] [--mllib] [--data-dir /tmp/sparkgrad-data-scale]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = 64
CLASSES = 10
ROWS_PER_GROUP = 131_072


def write_frame(path: Path, rows: int, seed: int = 0) -> None:
    """A Parquet file of ``rows`` rows: ``features`` (64 float32) and ``label`` from a linear teacher."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists():
        return
    teacher = np.random.default_rng(12345).normal(size=(FEATURES, CLASSES)).astype(np.float32)
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    schema = pa.schema([("features", pa.list_(pa.float32())), ("label", pa.int32())])
    with pq.ParquetWriter(tmp, schema) as writer:
        for start in range(0, rows, ROWS_PER_GROUP):
            n = min(ROWS_PER_GROUP, rows - start)
            x = rng.normal(size=(n, FEATURES)).astype(np.float32)
            y = (x @ teacher).argmax(1).astype(np.int32)
            features = pa.ListArray.from_arrays(
                pa.array(np.arange(0, (n + 1) * FEATURES, FEATURES, dtype=np.int32)), pa.array(x.ravel())
            )
            writer.write_table(pa.table({"features": features, "label": y}, schema=schema))
    tmp.rename(path)


class Sampler:
    """Peak RSS of every Python worker process and the JVM heap in use, sampled every 0.2 s."""

    def __init__(self, sc: Any) -> None:
        self._runtime = sc._jvm.java.lang.Runtime.getRuntime()
        self.heap_max = int(self._runtime.maxMemory())
        self.worker_peak: dict[int, int] = {}
        self.heap_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        used = int(self._runtime.totalMemory()) - int(self._runtime.freeMemory())
        self.heap_peak = max(self.heap_peak, used)
        for pid, hwm in _python_workers():
            self.worker_peak[pid] = max(self.worker_peak.get(pid, 0), hwm)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _python_workers() -> list[tuple[int, int]]:
    """(pid, VmHWM bytes) of this machine's PySpark daemon and worker processes."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            if b"pyspark.daemon" not in cmdline and b"pyspark.worker" not in cmdline:
                continue
            for line in Path(entry.path, "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    found.append((int(entry.name), int(line.split()[1]) * 1024))
        except OSError:
            continue
    return found


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this (fresh) process: a sparkgrad fit or MLlib's, on one frame."""
    sys.path.insert(0, str(Path(__file__).parent))
    from local_spark import local_session

    spark = local_session("local[2]", {"spark.driver.memory": args.driver_memory})
    sampler = Sampler(spark.sparkContext)
    try:
        df = spark.read.parquet(args.frame)
        rows = int(args.rows)
        start = time.monotonic()
        if args.approach == "mllib":
            from pyspark.ml.classification import MultilayerPerceptronClassifier
            from pyspark.ml.functions import array_to_vector

            frame = df.select(array_to_vector("features").alias("features"), df.label.cast("double"))
            MultilayerPerceptronClassifier(
                layers=[FEATURES, 128, CLASSES], maxIter=1, blockSize=128, seed=1
            ).fit(frame)
            examples = rows
        else:
            from sparkgrad.ml import SparkgradClassifier
            from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, OutputLayer
            from sparkgrad.nn.updaters import Adam
            from sparkgrad.spark import SharedTrainingMaster

            conf = MultiLayerConfiguration(
                [DenseLayer(128, activation="relu"), OutputLayer(CLASSES)],
                input_type=InputType.feed_forward(FEATURES),
                updater=Adam(1e-3),
                seed=1,
            )
            options = {"storage_level": args.storage_level} if args.storage_level else {}
            master = SharedTrainingMaster(
                rdd_training_approach=args.approach, rng_seed=1, progress=False, **options
            )
            SparkgradClassifier(networkConf=conf, trainingMaster=master, epochs=1, batchSize=256).fit(df)
            master.delete_temp_files(spark)
            examples = rows
        seconds = time.monotonic() - start
    finally:
        sampler.stop()
        spark.stop()
    workers = sorted(sampler.worker_peak.values(), reverse=True)
    return {
        "seconds": seconds,
        "examples_per_s": examples / seconds,
        "worker_peak_rss": workers[0] if workers else 0,
        "worker_peaks_mib": [w >> 20 for w in workers],
        "heap_peak": sampler.heap_peak,
        "heap_max": sampler.heap_max,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-rows", type=int, default=1_050_000)
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--approaches", default="direct,export")
    parser.add_argument("--mllib", action="store_true", help="also MLlib's MultilayerPerceptronClassifier")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--storage-level", help="the master's storage_level (default: its default)")
    parser.add_argument("--data-dir", default="/tmp/sparkgrad-data-scale")
    parser.add_argument("--plot", help="write a PNG of examples/s and peak memory per scale here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--frame", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--approach", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    approaches = args.approaches.split(",") + (["mllib"] if args.mllib else [])
    table = []
    for scale in (int(s) for s in args.scales.split(",")):
        rows = args.base_rows * scale
        frame = data / f"frame-{rows}.parquet"
        write_frame(frame, rows)
        gib = rows * (FEATURES * 4 + 4) / 2**30
        for approach in approaches:
            command = [
                sys.executable,
                __file__,
                "--child",
                f"--frame={frame}",
                f"--rows={rows}",
                f"--approach={approach}",
                f"--driver-memory={args.driver_memory}",
                *([f"--storage-level={args.storage_level}"] if args.storage_level else []),
            ]
            run = subprocess.run(command, capture_output=True, text=True)
            lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if run.returncode or not lines:
                print(f"{scale}x {approach}: failed ({run.returncode})\n{run.stderr[-3000:]}", flush=True)
                table.append((scale, rows, gib, approach, None))
                continue
            result = json.loads(lines[-1][len("RESULT ") :])
            table.append((scale, rows, gib, approach, result))
            print(f"{scale}x {approach}: {json.dumps(result)}", flush=True)

    print(
        f"\nlocal[2], spark.driver.memory={args.driver_memory}, MLP 64-128-10, one epoch, batch 256; "
        f"64 float32 features + a label per row"
    )
    print(
        f"{'scale':>5s} {'rows':>10s} {'GiB':>5s} {'approach':>8s} {'epoch s':>8s} {'examples/s':>10s} "
        f"{'worker RSS MiB':>14s} {'JVM heap MiB':>12s}"
    )
    for scale, rows, gib, approach, r in table:
        if r is None:
            print(f"{scale:>4d}x {rows:>10d} {gib:5.2f} {approach:>8s} {'failed':>8s}")
            continue
        print(
            f"{scale:>4d}x {rows:>10d} {gib:5.2f} {approach:>8s} {r['seconds']:8.1f} "
            f"{r['examples_per_s']:10.0f} {r['worker_peak_rss'] / 2**20:14.0f} "
            f"{r['heap_peak'] / 2**20:7.0f}/{r['heap_max'] / 2**20:.0f}"
        )
    if args.plot:
        plot(table, args.plot)
    return 0


def plot(table: list[tuple[int, int, float, str, dict[str, Any] | None]], path: str) -> None:
    """Examples/s (left) and peak Python worker RSS and JVM heap (right) per frame size and approach."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = sorted({gib for _, _, gib, _, r in table if r is not None})
    for color, approach in enumerate(dict.fromkeys(a for _, _, _, a, _ in table)):
        done = [(gib, r) for _, _, gib, a, r in table if a == approach and r is not None]
        gib = [g for g, _ in done]
        style = {"color": f"C{color}"}
        speed.plot(gib, [r["examples_per_s"] / 1e3 for _, r in done], "o-", label=approach, **style)
        if approach != "mllib":  # MLlib runs no Python worker
            rss = [r["worker_peak_rss"] / 2**20 for _, r in done]
            memory.plot(gib, rss, "o-", label=f"{approach}: Python worker RSS", **style)
        heap = [r["heap_peak"] / 2**20 for _, r in done]
        memory.plot(gib, heap, "s--", label=f"{approach}: JVM heap in use", **style)
    speed.set(xlabel="features (GiB)", ylabel="thousand examples/s", title="one epoch, local[2]")
    memory.set(xlabel="features (GiB)", ylabel="MiB", title="peak memory (heap: 2 GiB)", ylim=(0, None))
    for ax in (speed, memory):
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{g:.2g}" for g in sizes])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
