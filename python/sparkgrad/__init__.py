"""sparkgrad: neural-network training on Apache Spark with threshold-encoded gradient sharing."""

from __future__ import annotations

from sparkgrad._native import _core
from sparkgrad._version import __version__
from sparkgrad.errors import SparkgradError


def cuda_available() -> bool:
    """True when this build has the CUDA kernels and a GPU is visible."""
    return bool(_core.cuda_available())


def set_num_threads(n: int) -> None:
    """Set the number of OpenMP and OpenBLAS threads the native kernels use in this process.

    Args:
        n: thread count, at least 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    _core.set_num_threads(n)


def get_num_threads() -> int:
    """Number of OpenMP threads the native kernels use."""
    return int(_core.max_threads())


def info() -> dict[str, object]:
    """Build and runtime facts: version, OpenMP threads, BLAS, CUDA availability."""
    return {
        "version": __version__,
        "openmp_threads": get_num_threads(),
        "openmp_version": int(_core.openmp_version()),
        "blas": _core.blas_info(),
        "cuda_available": cuda_available(),
    }


__all__ = ["SparkgradError", "__version__", "cuda_available", "get_num_threads", "info", "set_num_threads"]
