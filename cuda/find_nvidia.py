"""Prints the root (holding include/ and lib/) of an NVIDIA library that NVIDIA's PyPI wheels install.

    python cuda/find_nvidia.py cublas   # nvidia-cublas (CUDA 13): site-packages/nvidia/cu13,
                                        # nvidia-cublas-cu12: site-packages/nvidia/cublas
    python cuda/find_nvidia.py cudnn    # nvidia-cudnn-cu13 / -cu12: site-packages/nvidia/cudnn

Used by cuda/CMakeLists.txt (with the build's Python), bench/gpu/run_checks.sh and the tests that compile
the CUDA sources. Exit status 1 and nothing printed when the library is not installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# library -> (subdirectories of site-packages/nvidia to try in order, a header that marks the root)
LIBRARIES = {
    "cublas": (("cu13", "cublas"), "cublas_v2.h"),
    "cudnn": (("cudnn",), "cudnn.h"),
}


def wheel_root(library: str) -> Path | None:
    """The first wheel-installed root of ``library`` (a key of LIBRARIES) on ``sys.path``, or None."""
    subdirs, header = LIBRARIES[library]
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in subdirs:
            root = Path(base) / sub
            if (root / "include" / header).is_file() and (root / "lib").is_dir():
                return root
    return None


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in LIBRARIES:
        sys.exit(f"usage: find_nvidia.py {'|'.join(LIBRARIES)}")
    found = wheel_root(sys.argv[1])
    if found is None:
        sys.exit(1)
    print(found)
