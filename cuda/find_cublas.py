"""Prints the root (holding include/cublas_v2.h and lib/) of the cuBLAS that NVIDIA's PyPI wheels install.

``nvidia-cublas`` (CUDA 13) installs into ``site-packages/nvidia/cu13``, ``nvidia-cublas-cu12`` into
``site-packages/nvidia/cublas``. Used by cuda/CMakeLists.txt (with the build's Python) and by the tests
that compile the CUDA sources. Exit status 1 and nothing printed when neither is installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SUBDIRS = ("cu13", "cublas")  # nvidia-cublas (CUDA 13), nvidia-cublas-cu12


def cublas_root() -> Path | None:
    """The first wheel-installed cuBLAS root on ``sys.path``, or None."""
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in SUBDIRS:
            root = Path(base) / sub
            if (root / "include" / "cublas_v2.h").is_file() and (root / "lib").is_dir():
                return root
    return None


if __name__ == "__main__":
    found = cublas_root()
    if found is None:
        sys.exit(1)
    print(found)
