#!/usr/bin/env bash
# The GPU checks in one place, for a machine with an NVIDIA GPU, nvcc, CuPy and PyTorch (CUDA), and no
# network: build the CUDA extension, run every test marked `cuda`, run the GPU benchmarks. Each stage is
# a separate command so that a session with a few minutes per command can run them one after another
# (the build stays in build/gpu between them):
#
#   bash bench/gpu/run_checks.sh build    # CUDA build of sparkgrad + bench binaries (a few minutes)
#   bash bench/gpu/run_checks.sh test     # pytest -m cuda over the kernel, device and wrapper tests
#   bash bench/gpu/run_checks.sh bench    # bench_train_step, bench_compress, bench_op_overhead, ...
#   bash bench/gpu/run_checks.sh device   # on the GPU machine with a build made elsewhere: the wheels
#                                         # of .whl/ into build/gpu/site, then test and bench
#
# BEFORE_SITE=<folder with another build's sparkgrad/> makes `bench` also time that build's front door and
# training steps in the same run, for before/after ratios on one machine.
#
# Logs go to $OUT (default build/gpu/logs). Packages the machine lacks (scipy-openblas32, pyzmq,
# cryptography) travel as wheels in .whl/ (bash bench/gpu/fetch_wheels.sh on a machine with the package
# index) and are installed from there into build/gpu/site. CUDAARCHS defaults to the visible GPU's architecture.
#
# The build needs nvcc but no GPU, so it can run beforehand on a development machine with the GPU
# machine's Python version (PYTHON=python3.12 CUDAARCHS=90 ... build, with nvidia-cublas installed in that
# Python); build/gpu/site and build/gpu/build/bench/cpp/bench_nn then travel to the GPU machine, where
# `test` and `bench` run from them. That is how the first GPU run (an H200) was done.
set -euo pipefail
cd "$(dirname "$0")/../.."
stage="${1:?usage: run_checks.sh build|test|bench|device}"
root="$PWD"
work="$root/build/gpu"
site="$work/site"
logs="${OUT:-$work/logs}"
mkdir -p "$work" "$logs"
python="${PYTHON:-python3}"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# the extension finds libcublas (and libcudnn) through an RPATH relative to an installed wheel; under
# --target they are elsewhere, so the loader is told where the nvidia-cublas (and nvidia-cudnn) wheels keep them
cublas="$("$python" cuda/find_nvidia.py cublas)" || { echo "run_checks.sh: no cuBLAS (nvidia-cublas)" >&2; exit 1; }
export LD_LIBRARY_PATH="$cublas/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN is optional: without it the convolutions run the own kernels (say so in the build log)
cudnn="$("$python" cuda/find_nvidia.py cudnn)" || cudnn=""
if [[ -n "$cudnn" ]]; then export LD_LIBRARY_PATH="$cudnn/lib:$LD_LIBRARY_PATH"; fi

# the checks must run the CUDA build in $site, not another sparkgrad (an editable install's import hook
# takes precedence over PYTHONPATH)
check_import() {
    "$python" -c "import sparkgrad, sys; p = sparkgrad.__file__
sys.exit(0 if p.startswith('$site/') else f'run_checks.sh: sparkgrad comes from {p}, not $site: use an '
         'environment without another sparkgrad installed (PYTHON=...)')"
}

case "$stage" in
build)
    command -v nvcc >/dev/null || { echo "run_checks.sh: nvcc is not on PATH" >&2; exit 1; }
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
    fi
    arch="${CUDAARCHS:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}"
    echo "building for sm_$arch with cuBLAS from $cublas and cuDNN from ${cudnn:-nowhere (own convolution kernels)}"
    # the compilers on PATH, not the environment's CXX: the CUDA image sets CXX=/opt/gcc/bin/g++, a wrapper
    # with which every C++ exception thrown from a CUDA translation unit (a malformed message refused on
    # the GPU, say) killed the process with a segmentation fault (H200, 2026-11-27; /usr/bin/g++: 442 passed)
    CXX="${GPU_CXX:-g++}" CC="${GPU_CC:-gcc}" CUDAHOSTCXX="${GPU_CXX:-g++}" \
    SPARKGRAD_ENABLE_CUDA=ON SPARKGRAD_BUILD_BENCH=ON SPARKGRAD_CUBLAS_ROOT="$cublas" SPARKGRAD_CUDNN_ROOT="$cudnn" \
        CUDAARCHS="$arch" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$python" -m pip install -q --no-build-isolation --no-deps --upgrade --target "$site" \
        --config-settings=build-dir="$work/build" . 2>&1 | tee "$logs/build.log"
    check_import
    "$python" -c "import sparkgrad; from sparkgrad import cuda; print(sparkgrad.info(), *cuda.summary())" \
        | tee -a "$logs/build.log"
    ;;
test)
    check_import
    # the modules holding `cuda` cases; the Spark ones need Java and pyspark, which a GPU machine may lack
    modules=(
        tests/python/compress/test_cuda_threshold.py
        tests/python/nn/test_cuda_kernels.py
        tests/python/nn/test_cuda_conv.py
        tests/python/nn/test_precision.py
        tests/python/nn/test_device.py
        tests/python/nn/test_gradient_normalization.py
        tests/python/nn/test_inference_fold.py
        tests/python/compress/test_compress_device.py
        tests/python/compress/test_encoding_device.py
        tests/python/test_momentum_masking.py
        tests/python/test_parallel.py
        tests/distributed/test_mixed_device_fit.py
    )
    if "$python" -c "import pyspark" 2>/dev/null && command -v java >/dev/null; then
        modules+=(tests/spark/test_worker_device_cuda.py)
    fi
    set -o pipefail
    # -n: pytest-xdist's processes share the GPU (the cases are small); PYTEST_WORKERS=0 runs them in one
    "$python" -m pytest -p no:cacheprovider -m cuda -n "${PYTEST_WORKERS:-8}" -rs "${modules[@]}" 2>&1 |
        tee "$logs/cuda_tests.log"
    ;;
bench)
    check_import
    openblas="$("$python" -c "import scipy_openblas32; print(scipy_openblas32.get_lib_dir())")"
    failed=()
    # each benchmark runs whatever the others do, within BENCH_TIMEOUT seconds (default 600), most
    # telling first; the stage fails at the end if any did
    run_bench() {  # run_bench NAME COMMAND...
        local name="$1"
        shift
        echo "== $name: $*" | tee -a "$logs/gpu_bench.log"
        timeout "${BENCH_TIMEOUT:-600}" "$@" 2>&1 | tee -a "$logs/gpu_bench.log" || failed+=("$name")
    }
    : >"$logs/gpu_bench.log"
    set -o pipefail
    step="bench/python/bench_train_step.py --device cuda"
    models="mlp,lenet,resnet,lstm,mlp_large,vgg,lstm_large"
    before=(env PYTHONPATH="${BEFORE_SITE:-}:$PYTHONPATH")  # BEFORE_SITE's sparkgrad first
    run_bench train_step "$python" $step --rounds 5 --models "$models"
    if [[ -n "${BEFORE_SITE:-}" ]]; then
        # the same steps on the other build (float32, which every build has)
        run_bench train_step_before "${before[@]}" "$python" $step --rounds 5 --models "$models"
    fi
    run_bench encode_sizes "$python" bench/python/bench_compress.py --device cuda --sizes-only --reps 10
    run_bench op_overhead "$python" bench/python/bench_op_overhead.py --device cuda
    if [[ -n "${BEFORE_SITE:-}" ]]; then
        run_bench op_overhead_before "${before[@]}" "$python" bench/python/bench_op_overhead.py --device cuda
    fi
    run_bench train_step_bf16 "$python" $step --rounds 5 --models lenet,resnet,mlp_large,vgg,lstm_large --precision bf16
    run_bench train_step_fp16 "$python" $step --rounds 3 --models mlp_large,vgg,lstm_large --precision fp16
    bench_nn="$work/build/bench/cpp/bench_nn"  # absent where only build/gpu/site travelled
    if [[ -x "$bench_nn" ]]; then
        run_bench bench_nn env LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$openblas" "$bench_nn" --device cuda
    fi
    run_bench compress "$python" bench/python/bench_compress.py --device cuda
    run_bench parallel_gpu_gpu "$python" bench/python/bench_parallel.py --devices cuda:0,cuda:0 --batches 64 --rounds 3
    run_bench parallel_gpu_cpu "$python" bench/python/bench_parallel.py --devices cuda:0,cpu --batches 64 --rounds 3
    if ((${#failed[@]})); then
        echo "run_checks.sh: failed: ${failed[*]} (see $logs/gpu_bench.log)" >&2
        exit 1
    fi
    ;;
device)
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
    fi
    status=0
    bash "$0" test || status=1
    bash "$0" bench || status=1
    exit "$status"
    ;;
*)
    echo "run_checks.sh: unknown stage '$stage' (build, test, bench or device)" >&2
    exit 2
    ;;
esac
