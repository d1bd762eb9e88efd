"""The spread of a gradient-sharing fit's accuracy, uninterrupted and resumed from a checkpoint, over seeds:
where tests/spark/test_checkpoints.py's accuracy floor for a resumed fit comes from.

The fit of tests/spark/jobs/checkpointed_fit.py (MLP 64-256-10, Adam(1e-2), 40 noisy copies of the 1437
training digits, batch 16 per worker, 6 epochs, SharedTrainingMaster on local[2]) for rng seeds 1-N: once
uninterrupted, once stopped after epoch 2 and resumed with ``resume=True`` in a new SparkMultiLayer and
master (what a driver restarted after a failure does). Accuracy on the 359 held-out digits.

Usage: PYTHONPATH=python python bench/python/bench_resume_spread.py [--seeds 8]
    [--out bench/results/checkpoints/spread.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests" / "spark"))
from local_spark import local_session  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--out", default=str(HERE.parent / "results" / "checkpoints" / "spread.json"))
    args = parser.parse_args()

    import numpy as np
    from helpers import mlp_conf

    from sparkgrad.data import DataSet
    from sparkgrad.datasets import load_digits
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer

    spark = local_session("local[2]")
    train, test = load_digits(shape="flat")
    rng = np.random.default_rng(0)  # the data of checkpointed_fit.py
    copies = [
        train.features + rng.normal(0.0, 0.1, train.features.shape).astype(np.float32) for _ in range(40)
    ]
    data = DataSet.merge([DataSet(x, train.labels) for x in copies])
    rdd = spark.sparkContext.parallelize(data.split(16), 2).cache()
    out: dict[str, list[float]] = {"full": [], "resumed": []}
    for seed in range(1, args.seeds + 1):

        def master(seed: int = seed) -> SharedTrainingMaster:
            return SharedTrainingMaster(batch_size_per_worker=16, rng_seed=seed, progress=False)

        with SparkMultiLayer(spark, mlp_conf(hidden=256), master()) as model:
            model.fit(rdd, epochs=6)
            out["full"].append(model.network.evaluate(test).accuracy())
        directory = tempfile.mkdtemp(prefix="sparkgrad-resume-")
        with SparkMultiLayer(spark, mlp_conf(hidden=256), master()) as model:
            model.fit(rdd, epochs=6, checkpoint=directory, epoch_callback=lambda e, n: e == 1)
        with SparkMultiLayer(spark, mlp_conf(hidden=256), master()) as model:
            model.fit(rdd, epochs=6, checkpoint=directory, resume=True)
            out["resumed"].append(model.network.evaluate(test).accuracy())
        print(
            f"seed {seed}: uninterrupted {out['full'][-1]:.4f}, resumed {out['resumed'][-1]:.4f}", flush=True
        )
    summary = {**out, "min_max": {k: [min(v), max(v)] for k, v in out.items()}}
    print(json.dumps(summary["min_max"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
