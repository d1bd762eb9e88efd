"""Every CUDA source compiles (compile only), so the GPU twins cannot rot on machines without a GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prerequisites import require_or_skip

ROOT = Path(__file__).resolve().parents[2]
CUDA_SOURCES = sorted((ROOT / "cuda").rglob("*.cu"))


def _wheel_include(library: str) -> Path | None:
    """include/ of NVIDIA's wheel of ``library`` (cublas, cudnn), as the CUDA build takes its headers."""
    found = subprocess.run(
        [sys.executable, str(ROOT / "cuda" / "find_nvidia.py"), library], capture_output=True, text=True
    )
    return Path(found.stdout.strip()) / "include" if found.returncode == 0 else None


CUBLAS_INCLUDE = _wheel_include("cublas")  # pip install nvidia-cublas
CUDNN_INCLUDE = _wheel_include("cudnn")  # pip install nvidia-cudnn-cu13


@pytest.mark.parametrize("source", CUDA_SOURCES, ids=[str(p.relative_to(ROOT)) for p in CUDA_SOURCES])
def test_cuda_source_compiles(source: Path, tmp_path: Path) -> None:
    require_or_skip("nvcc", shutil.which("nvcc") is not None, "nvcc is not installed (the CUDA toolkit)")
    text = source.read_text()
    if "cublas_v2.h" in text:
        require_or_skip(
            "nvcc", CUBLAS_INCLUDE is not None, "cuBLAS headers are not installed (pip install nvidia-cublas)"
        )
    if "cudnn.h" in text:
        require_or_skip(
            "nvcc", CUDNN_INCLUDE is not None, "cuDNN headers are missing (pip install nvidia-cudnn-cu13)"
        )
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
        # conv2d.cu takes the cuDNN path where the build found cuDNN, its own kernels only otherwise
        *(["-I", str(CUDNN_INCLUDE), "-DSPARKGRAD_HAS_CUDNN"] if CUDNN_INCLUDE else []),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed on {source.name}:\n{result.stderr}"
