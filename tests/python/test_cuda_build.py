"""The CUDA build links and loads: SPARKGRAD_ENABLE_CUDA=ON builds the wheel (cuBLAS from NVIDIA's PyPI
wheel), and the built module imports on this GPU-less machine, reports itself built with CUDA and sees no
GPU. The same build compiles the C++ benchmarks against the CUDA twins; without a GPU, `bench_nn --device
cuda` must say so. Needs nvcc and `pip install nvidia-cublas`; skips otherwise. One architecture
(CUDAARCHS=80) keeps the compile to a few minutes on 2 cores; the default list is compiled by the same
sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from prerequisites import require_or_skip

ROOT = Path(__file__).resolve().parents[2]


def _wheel_root(library: str) -> str | None:
    """The root of NVIDIA's wheel of ``library`` (cublas, cudnn) in this environment, or None."""
    found = subprocess.run(
        [sys.executable, str(ROOT / "cuda" / "find_nvidia.py"), library], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else None


CUBLAS_ROOT = _wheel_root("cublas")
CUDNN_ROOT = _wheel_root("cudnn")  # optional: the build then compiles and links the cuDNN convolutions
# the unpacked wheel has no site-packages/nvidia beside it: the loader is pointed at the wheels' libraries
NVIDIA_LIBS = ":".join(f"{root}/lib" for root in (CUBLAS_ROOT, CUDNN_ROOT) if root)


@pytest.mark.slow
def test_cuda_build_links_and_loads(tmp_path: Path) -> None:
    require_or_skip("nvcc", shutil.which("nvcc") is not None, "nvcc is not installed (the CUDA toolkit)")
    require_or_skip("nvcc", CUBLAS_ROOT is not None, "cuBLAS is not installed (pip install nvidia-cublas)")
    env = {
        **os.environ,
        "SPARKGRAD_ENABLE_CUDA": "ON",
        "SPARKGRAD_CUBLAS_ROOT": CUBLAS_ROOT,
        **({"SPARKGRAD_CUDNN_ROOT": CUDNN_ROOT} if CUDNN_ROOT else {}),
        "CUDAARCHS": "80",
        "CMAKE_BUILD_PARALLEL_LEVEL": "2",
    }
    cmd = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
        f"--config-settings=build-dir={tmp_path / 'build'}",
        "--config-settings=cmake.define.SPARKGRAD_BUILD_BENCH=ON", str(ROOT),
    ]  # fmt: skip
    built = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    (wheel,) = (tmp_path / "dist").glob("sparkgrad-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "site")
    probe = "from sparkgrad import cuda; print(cuda.built(), len(cuda.devices()), cuda.summary()[0])"
    # -S: no site hooks, so an editable install of sparkgrad cannot shadow the unpacked wheel; the
    # dependencies come from this environment's site-packages after it
    site_packages = Path(np.__file__).resolve().parents[1]
    loaded = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(site_packages)]),
            "LD_LIBRARY_PATH": NVIDIA_LIBS,
        },
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    built_flag, gpus, summary = loaded.stdout.split(" ", 2)
    assert (built_flag, summary.startswith("CUDA: built")) == ("True", True), loaded.stdout
    if int(gpus) == 0:  # with a GPU the benchmark would run for minutes: only the GPU-less answer is checked
        import scipy_openblas32  # a runtime dependency: the build's isolated copy is gone by now

        libs = f"{NVIDIA_LIBS}:{scipy_openblas32.get_lib_dir()}"
        bench = subprocess.run(
            [str(tmp_path / "build" / "bench" / "cpp" / "bench_nn"), "--device", "cuda"],
            env={**os.environ, "LD_LIBRARY_PATH": libs},
            capture_output=True,
            text=True,
        )
        assert (bench.returncode, bench.stdout) == (1, ""), bench.stdout + bench.stderr
        assert "sees no GPU" in bench.stderr, bench.stderr
