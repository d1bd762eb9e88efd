"""A worker's data path over one-row records: a spilled partition of one-example DataSets (what a DataFrame
fit with the default ``rdd_data_set_num_examples=1`` stores) read in a shuffled order and re-batched to 64
examples (``worker_batches`` without prefetch), microseconds per record. Two readers side by side, in
alternating rounds of the same process: the whole-buffer path that reads a record at its offsets with one
checksum (``serialization._parse_whole``, what ``from_bytes`` takes) and the stream reader it falls back
to (``_Reader``, a dozen small reads per one-row record), as the ratio offsets / reader.

    PYTHONPATH=python python bench/python/bench_partition_read.py [--records 8000] [--rounds 5]
        [--shape 1,8] [--directory /tmp]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sparkgrad.data import DataSet
from sparkgrad.data import serialization as fmt
from sparkgrad.spark.common import worker_batches
from sparkgrad.spark.partition_store import PartitionStore


def epoch_seconds(store: PartitionStore, rng: np.random.Generator) -> float:
    order = rng.permutation(len(store))
    start = time.perf_counter()
    for _ in worker_batches((store[i] for i in order), "dataset", None, 64, 0):
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", default="1,8", help="features shape of one example (the ctr model's 1,8)")
    parser.add_argument("--directory", default=None, help="where the partition spills (Spark's local dir)")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    rng = np.random.default_rng(0)
    records = [
        DataSet(rng.integers(0, 1000, (1, *shape)).astype(np.float32), np.eye(2, dtype=np.float32)[[i % 2]])
        for i in range(args.records)
    ]
    offsets = fmt._parse_whole
    times: dict[str, list[float]] = {"offsets": [], "reader": []}
    with PartitionStore(records, "dataset", directory=args.directory) as store:
        epoch_seconds(store, rng)  # page cache and imports warm
        for _ in range(args.rounds):
            for mode in times:
                fmt._parse_whole = offsets if mode == "offsets" else (lambda view, kind: None)
                times[mode].append(epoch_seconds(store, rng))
    fmt._parse_whole = offsets
    size = len(records[0].to_bytes())
    print(f"{args.records} one-row records of features {shape} ({size} bytes each), ", end="")
    print(f"batches of 64, {args.rounds} rounds")
    per = {mode: 1e6 * np.median(t) / args.records for mode, t in times.items()}
    for mode, t in times.items():
        print(
            f"  {mode:8s} median {per[mode]:6.1f} us/record  min {1e6 * min(t) / args.records:6.1f}  "
            f"({64 * per[mode] / 1000:.2f} ms per 64-example batch)"
        )
    print(f"  ratio offsets / reader: {per['offsets'] / per['reader']:.2f}x")


if __name__ == "__main__":
    main()
