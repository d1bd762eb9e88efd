"""Throughput of sparkgrad.eval on a large classification output, against scikit-learn in the same run.

Rows x classes softmax-like predictions go through Evaluation (vs sklearn confusion_matrix on the
argmax) and ROCMultiClass in exact and thresholded mode (vs sklearn roc_auc_score, multi_class="ovr").
Each sparkgrad measurement covers eval in batches (as Spark partitions feed it) plus the metric; each
line prints rows/s and the speed ratio to scikit-learn (> 1 means sparkgrad is faster).

Usage: PYTHONPATH=python python bench/python/bench_eval.py [--rows 1000000] [--classes 10]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
from sklearn import metrics

from sparkgrad.eval import Evaluation, ROCMultiClass


def _best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=65_536, help="rows per eval call")
    parser.add_argument("--steps", type=int, default=32, help="threshold steps for the thresholded ROC")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    n, c = args.rows, args.classes
    y = rng.integers(0, c, n)
    logits = rng.normal(size=(n, c)).astype(np.float32)
    logits[np.arange(n), y] += 1.5
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    onehot = np.eye(c, dtype=np.float32)[y]
    batches = [slice(i, i + args.batch) for i in range(0, n, args.batch)]

    def run(make: Callable[[], object], metric: Callable[[object], object]) -> Callable[[], object]:
        def go() -> object:
            ev = make()
            for b in batches:
                ev.eval(onehot[b], probs[b])  # type: ignore[attr-defined]
            return metric(ev)

        return go

    cases = [
        (
            "Evaluation (confusion matrix + accuracy)",
            run(Evaluation, lambda e: e.confusion_matrix()),  # type: ignore[attr-defined]
            "confusion_matrix",
            lambda: metrics.confusion_matrix(y, probs.argmax(axis=1), labels=np.arange(c)),
            lambda a, b: bool(np.array_equal(a, b)),
        ),
        (
            "ROCMultiClass exact (average AUC)",
            run(ROCMultiClass, lambda r: r.calculate_average_auc()),  # type: ignore[attr-defined]
            "roc_auc_score ovr",
            lambda: metrics.roc_auc_score(y, probs, multi_class="ovr", average="macro"),
            lambda a, b: abs(a - b) < 1e-9,
        ),
        (
            f"ROCMultiClass thresholded {args.steps} steps",
            run(lambda: ROCMultiClass(args.steps), lambda r: r.calculate_average_auc()),  # type: ignore[attr-defined]
            "roc_auc_score ovr",
            lambda: metrics.roc_auc_score(y, probs, multi_class="ovr", average="macro"),
            lambda a, b: abs(a - b) < 1e-2,
        ),
    ]
    print(f"rows={n} classes={c} batch={args.batch} (best of {args.repeats})")
    for name, ours, ref_name, ref, agree in cases:
        t_ours, r_ours = _best_of(args.repeats, ours)
        t_ref, r_ref = _best_of(args.repeats, ref)
        print(
            f"{name:<42} {n / t_ours:>12,.0f} rows/s ({t_ours:.3f} s) | sklearn {ref_name:<18} "
            f"{n / t_ref:>12,.0f} rows/s ({t_ref:.3f} s) | ratio {t_ref / t_ours:5.2f}x | "
            f"agree={agree(r_ours, r_ref)}"
        )


if __name__ == "__main__":
    main()
