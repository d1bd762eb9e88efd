#!/usr/bin/env bash
# Wheels of the packages a GPU machine without network lacks for bench/gpu/run_checks.sh (its image has
# CuPy, PyTorch, nvidia-cublas, scikit-build-core, pybind11, pytest and hypothesis, but not sparkgrad's
# BLAS, ZeroMQ or the cryptography the transport signs with): downloaded into .whl/ (ignored by git) for
# CPython 3.12 on x86-64 Linux. Run it where the package index is reachable, then carry .whl/ to the GPU
# machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$tag")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "scipy-openblas32>=0.3.27" "pyzmq>=25" "cryptography>=42" "cffi>=1.14" pycparser
ls -l .whl
