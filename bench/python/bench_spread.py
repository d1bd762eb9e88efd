"""How sure is a spread ratio? Reads a ``bench_convergence.py`` result and, for every contender against DDP
(same model, updater and workers) and for local training against each DDP, gives the ratio of the
standard deviations of the final accuracy and of the epochs to ``--target`` over all seeds, a 90%
bootstrap interval of each (the seeds resampled with replacement, the same seeds for both: each seed is
one data split), and how often ``--subset`` seeds drawn at random (without replacement) meet ``--bound``,
which shows what a verdict on that many seeds is worth.

No training: ``convergence.json`` holds every curve.

    PYTHONPATH=python python bench/python/bench_spread.py bench/results/spread30/convergence.json \\
        [--target 0.96] [--bound 1.5] [--subset 5] [--draws 4000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from bench_convergence import epochs_to


def _sd_ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise sd(a) / sd(b) (ddof 1); inf where b has no spread and a has, 1 where neither has."""
    sa, sb = a.std(axis=-1, ddof=1), b.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sb > 0, sa / np.where(sb > 0, sb, 1), np.where(sa > 0, np.inf, 1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("result", type=Path, help="a convergence.json")
    parser.add_argument("--target", type=float, default=0.96, help="the study's --target")
    parser.add_argument("--bound", type=float, default=1.5, help="the target on the sd ratio")
    parser.add_argument("--subset", type=int, default=5, help="seeds per random subset")
    parser.add_argument("--draws", type=int, default=4000)
    args = parser.parse_args()
    results = json.loads(args.result.read_text())
    rng = np.random.default_rng(0)
    print(
        f"{'model/updater/N':20s} {'contender':11s} {'seeds':>5s} "
        f"{'final sd ratio [90%]':>22s} {f'{args.subset} seeds <= {args.bound:g}x':>15s} "
        f"{'epochs sd ratio [90%]':>22s} {f'{args.subset} seeds <= {args.bound:g}x':>15s}"
    )
    pairs = []  # (cell, contender, its entry, DDP's entry): local training against DDP of every cell too
    for key, ddp in results.items():
        cell, contender = key.rsplit("/", 1)
        if contender != "ddp":
            continue
        model, updater, _ = cell.split("/")
        local = results.get(f"{model}/{updater}/1/local")
        pairs += [(cell, "local", local, ddp)] if local else []
        pairs += [
            (cell, name.rsplit("/", 1)[1], entry, ddp)
            for name, entry in results.items()
            if name.startswith(f"{cell}/") and name != key
        ]
    for cell, contender, entry, ddp in pairs:
        curves, ddp_curves = entry["runs"], ddp["runs"]
        seeds = min(len(curves), len(ddp_curves))
        columns = []
        for measure in (lambda c: c[-1], lambda c: epochs_to(c, args.target)):
            mine = np.array([measure(r["accuracy"]) for r in curves[:seeds]], dtype=float)
            theirs = np.array([measure(r["accuracy"]) for r in ddp_curves[:seeds]], dtype=float)
            resampled = rng.integers(0, seeds, size=(args.draws, seeds))
            low, high = np.percentile(_sd_ratio(mine[resampled], theirs[resampled]), [5, 95])
            subsets = np.argsort(rng.random((args.draws, seeds)), axis=1)[:, : args.subset]
            met = np.mean(_sd_ratio(mine[subsets], theirs[subsets]) <= args.bound)
            ratio = float(_sd_ratio(mine, theirs))
            columns += [f"{ratio:.2f}x [{low:.2f}-{high:.2f}]", f"{met:.0%}"]
        print(
            f"{cell:20s} {contender:11s} {seeds:5d} {columns[0]:>22s} {columns[1]:>15s} "
            f"{columns[2]:>22s} {columns[3]:>15s}"
        )


if __name__ == "__main__":
    main()
