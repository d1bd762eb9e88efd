"""Native threshold-encoding codecs vs the pure-NumPy reference, measured in the same run; or, with
``--device cuda``, the CUDA codecs in GB/s against the GPU's memory bandwidth.

Usage: PYTHONPATH=python:tests/python python bench/python/bench_compress.py [--n 4194304] [--reps 5]
       [--device cpu|cuda] [--sizes-only]

Prints one line per configuration. CPU: native and reference times (minimum over repetitions),
ns/param, and the speed-up of native over the reference. CUDA: GPU time (CUDA events, minimum over
repetitions), the dense vector's bytes per second (``n * itemsize / time``: one pass over the vector,
the least any codec must move) and its ratio to the device's peak memory bandwidth (from its memory
clock and bus width), plus the CPU native time and the GPU's speed-up over it. The ``handler step`` line
is a GPU worker's whole encoding step (EncodingHandler.encode: accumulate, count, encode, message to the
host) and ``host message decode`` applies a host message to a GPU vector (decode_host_message). A last
table repeats the float32 sparse encode over vector sizes from 2**20 to 2**27: ``encode`` is
threshold_encode (one kernel, then one wait for the header to learn the message's size), ``no wait`` is
threshold_encode_into into a buffer allocated beforehand (the kernel and its launch: what a caller that
takes the count later pays), and ``cupy max`` one read of the vector by CuPy. Below a few million
elements the fixed costs (Python, the launch, the wait) dominate, above them the one pass over the vector.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from reference import compress as ref  # noqa: E402

import sparkgrad  # noqa: E402
from sparkgrad import compress, cuda  # noqa: E402
from sparkgrad.compress import (  # noqa: E402
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
)


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


def run_cpu(n: int, reps: int) -> None:
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


def gpu_or_exit() -> Any:
    """CuPy, or exit with a message saying what is missing for the GPU mode."""
    if not cuda.built():
        sys.exit(
            "bench_compress.py --device cuda: sparkgrad was built without CUDA "
            "(SPARKGRAD_ENABLE_CUDA=ON pip install . builds it)"
        )
    try:
        import cupy
    except ImportError:
        sys.exit("bench_compress.py --device cuda: CuPy is not installed (pip install cupy-cuda13x)")
    if not cuda.devices():
        sys.exit("bench_compress.py --device cuda: sparkgrad is built with CUDA but no GPU is visible")
    return cupy


def peak_bandwidth(cupy: Any) -> float:
    """Peak memory bandwidth of the current GPU in bytes/s: 2 transfers per memory clock (kHz) times the
    bus width (bits) / 8."""
    attrs = cupy.cuda.Device().attributes
    return 2.0 * attrs["MemoryClockRate"] * 1e3 * attrs["GlobalMemoryBusWidth"] / 8.0


def best_gpu_seconds(cupy: Any, fn: Callable[[Any], object], source: Any, reps: int) -> float:
    """Minimum GPU time of fn(copy of source) over reps, by CUDA events (the copy is not timed)."""
    best = float("inf")
    for _ in range(reps):
        work = source.copy()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        cupy.cuda.Device().synchronize()
        start.record()
        fn(work)
        end.record()
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return best


def gpu_decoders(cupy: Any, message: np.ndarray) -> tuple[Callable[[Any], object], Callable[[Any], object]]:
    """Decoders of one message into a GPU target: (message already on the GPU, host message)."""
    on_gpu = cupy.asarray(message)
    return (lambda z: compress.decode(on_gpu, z)), (lambda z: compress.decode_host_message(message, z))


def handler_step(dtype: type) -> Callable[[Any], object]:
    """One EncodingHandler step on a GPU vector: a fresh handler, so the time includes binding it to the
    GPU (allocating and zeroing its residual) before the accumulate, count, encode and copy to host."""

    def step(update: Any) -> object:
        handler = EncodingHandler(
            update.shape[0], FixedThresholdAlgorithm(1.0), NoOpResidualPostProcessor(), np.dtype(dtype).name
        )
        return handler.encode(update, 1, 0)

    return step


def run_cuda(n: int, reps: int, sizes_only: bool) -> None:
    cupy = gpu_or_exit()
    gpu = cuda.devices()[cupy.cuda.Device().id]
    peak = peak_bandwidth(cupy)
    print(
        f"bench_compress.py --device cuda: n={n}, repetitions={reps} (min), {gpu.name} "
        f"(compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]}), "
        f"peak memory bandwidth {peak / 1e9:.0f} GB/s; CPU: OpenMP threads={sparkgrad.get_num_threads()}"
    )
    for dtype in () if sizes_only else (np.float32, np.float64):
        for density in (1e-4, 1e-3, 1e-2, 1e-1):
            host = residual(n, density, dtype)
            dev = cupy.asarray(host)
            message = compress.threshold_encode(host.copy(), 1.0)
            bitmap, _ = compress.bitmap_encode(host.copy(), 1.0)
            cases = [
                ("sparse encode", native_sparse, native_sparse),
                ("sparse decode", gpu_decoders(cupy, message)[0], decoders(message)[0]),
                ("bitmap encode", native_bitmap, native_bitmap),
                ("bitmap decode", gpu_decoders(cupy, bitmap)[0], decoders(bitmap)[0]),
                ("handler step", handler_step(dtype), handler_step(dtype)),
                ("host message decode", gpu_decoders(cupy, message)[1], decoders(message)[0]),
            ]
            for name, on_gpu, on_cpu in cases:
                t_gpu = best_gpu_seconds(cupy, on_gpu, dev, reps)
                t_cpu = best_seconds(on_cpu, host, reps)
                rate = n * np.dtype(dtype).itemsize / t_gpu
                print(
                    f"{name:19s} {np.dtype(dtype).name:8s} density={density:<7g} "
                    f"gpu {t_gpu * 1e3:8.3f} ms {rate / 1e9:8.1f} GB/s ({rate / peak:6.1%} of peak)  "
                    f"cpu native {t_cpu * 1e3:8.2f} ms  speed-up {t_cpu / t_gpu:7.1f}x"
                )
    print(
        "sparse encode by vector size (float32, density 1e-3): the whole encode (threshold_encode), the "
        "encode into a buffer without waiting for the count (threshold_encode_into), and CuPy's max of the "
        "same vector (one read: the least any encoder does)"
    )
    for size in (1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 27):
        dev = cupy.asarray(residual(size, 1e-3, np.float32))
        out = cupy.empty(compress.HEADER_WORDS + size, dtype=np.int32)

        def no_wait(r: Any, out: Any = out) -> object:
            return compress.threshold_encode_into(r, 1.0, out)

        cells = []
        for fn in (native_sparse, no_wait, lambda r: r.max()):
            t_gpu = best_gpu_seconds(cupy, fn, dev, reps)
            rate = size * 4 / t_gpu
            cells.append(f"{t_gpu * 1e3:7.3f} ms {rate / 1e9:7.1f} GB/s ({rate / peak:6.1%})")
        print(f"n={size:>10d}  encode {cells[0]}  no wait {cells[1]}  cupy max {cells[2]}")
        del dev, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--sizes-only", action="store_true", help="cuda: only the table by vector size")
    args = parser.parse_args()
    if args.device == "cuda":
        run_cuda(args.n, args.reps, args.sizes_only)
    else:
        run_cpu(args.n, args.reps)


if __name__ == "__main__":
    main()
