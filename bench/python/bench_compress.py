"""Native threshold-encoding codecs vs the pure-NumPy reference, measured in the same run.

Usage: PYTHONPATH=python:tests/python python bench/python/bench_compress.py [--n 4194304] [--reps 5]

Prints one line per configuration: native and reference times (minimum over repetitions), ns/param,
and the speed-up of native over the reference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from reference import compress as ref  # noqa: E402

import sparkgrad  # noqa: E402
from sparkgrad import compress  # noqa: E402


def best_seconds(fn: Callable[[np.ndarray], object], source: np.ndarray, reps: int) -> float:
    """Minimum time of fn(copy of source) over reps (the copy is not timed)."""
    best = float("inf")
    for _ in range(reps):
        work = source.copy()
        start = time.perf_counter()
        fn(work)
        best = min(best, time.perf_counter() - start)
    return best


def residual(n: int, density: float, dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = rng.uniform(-0.99, 0.99, n)
    big = rng.random(n) < density
    r[big] = np.where(rng.random(int(big.sum())) < 0.5, -2.0, 2.0)
    return r.astype(dtype)


def native_sparse(r: np.ndarray) -> object:
    return compress.threshold_encode(r, 1.0)


def ref_sparse(r: np.ndarray) -> object:
    return ref.threshold_encode(r, 1.0)


def native_bitmap(r: np.ndarray) -> object:
    return compress.bitmap_encode(r, 1.0)


def ref_bitmap(r: np.ndarray) -> object:
    return ref.bitmap_encode(r, 1.0)


def decoders(message: np.ndarray) -> tuple[Callable[[np.ndarray], object], Callable[[np.ndarray], object]]:
    """(native, reference) decoders of one message into a target."""
    return (lambda z: compress.decode(message, z)), (lambda z: ref.decode(message, z))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n, reps = args.n, args.reps
    print(f"bench_compress.py: n={n}, repetitions={reps} (min), OpenMP threads={sparkgrad.get_num_threads()}")
    for dtype in (np.float32, np.float64):
        for density in (1e-4, 1e-3, 1e-2, 1e-1):
            src = residual(n, density, dtype)
            message = compress.threshold_encode(src.copy(), 1.0)
            bitmap, _ = compress.bitmap_encode(src.copy(), 1.0)
            cases = [
                ("sparse encode", native_sparse, ref_sparse),
                ("sparse decode", decoders(message)[0], decoders(message)[1]),
                ("bitmap encode", native_bitmap, ref_bitmap),
                ("bitmap decode", decoders(bitmap)[0], decoders(bitmap)[1]),
            ]
            for name, native, reference in cases:
                t_native = best_seconds(native, src, reps)
                t_ref = best_seconds(reference, src, reps)
                print(
                    f"{name:14s} {np.dtype(dtype).name:8s} density={density:<7g} "
                    f"native {t_native * 1e3:8.2f} ms "
                    f"({t_native * 1e9 / n:6.2f} ns/param)  reference {t_ref * 1e3:8.2f} ms  "
                    f"speed-up {t_ref / t_native:6.1f}x"
                )


if __name__ == "__main__":
    main()
