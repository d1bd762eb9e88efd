"""Every CUDA source compiles (compile only), so the GPU twins cannot rot on machines without a GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_SOURCES = sorted((ROOT / "cuda").rglob("*.cu"))
# cuBLAS headers come from NVIDIA's wheel (pip install nvidia-cublas), as the CUDA build takes them
_FOUND = subprocess.run(
    [sys.executable, str(ROOT / "cuda" / "find_cublas.py")], capture_output=True, text=True
)
CUBLAS_INCLUDE = Path(_FOUND.stdout.strip()) / "include" if _FOUND.returncode == 0 else None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=[str(p.relative_to(ROOT)) for p in CUDA_SOURCES])
def test_cuda_source_compiles(source: Path, tmp_path: Path) -> None:
    if CUBLAS_INCLUDE is None and "cublas_v2.h" in source.read_text():
        pytest.skip("cuBLAS headers are not installed (pip install nvidia-cublas)")
    # CUDA sources see only the public C++ headers (no pybind11, no Python): the same flags CMake uses.
    # sm_90 here and sm_80 in test_cuda_build.py: both architectures of the default list are compiled.
    cmd = [
        "nvcc",
        "-std=c++17",
        "-arch=sm_90",
        "-c",
        str(source),
        "-o",
        str(tmp_path / "out.o"),
        "-I",
        str(ROOT / "cpp" / "include"),
        "-DSPARKGRAD_HAS_CUDA",
        "-Xcompiler",
        "-fopenmp",
        *(["-I", str(CUBLAS_INCLUDE)] if CUBLAS_INCLUDE else []),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed on {source.name}:\n{result.stderr}"
