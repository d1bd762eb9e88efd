// CUDA twin of cpp/src/common/blas.cpp: row-major GEMM through cuBLAS. cuBLAS is column-major, and a
// row-major (m, n) matrix is its column-major transpose, so c = op(a) op(b) is computed as
// c^T = op(b)^T op(a)^T with the operands swapped. One handle per host thread and device (cuBLAS handles
// are not meant to be shared between threads, and a handle is bound to the device current when it was
// created), created on first use; each GEMM runs on the calling thread's stream (gpu::set_stream). A
// float32 GEMM runs in the calling thread's precision (gpu::set_precision): bf16 or fp16 go through
// cublasGemmEx with float32 A, B, C and a FAST_16BF / FAST_16F compute type (16-bit operands on the tensor
// cores, float32 accumulation).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../compress/cuda_util.cuh"
#include "sparkgrad/common.h"

namespace sparkgrad::gpu {

namespace {

void check_cublas(cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_runtime("gemm", "cuBLAS error ", static_cast<int>(status));
}

// The calling thread's handle for the current device: a handle made on another device would run the
// GEMM there (or fail) when a thread works on several GPUs (networks on cuda:0 and cuda:1, reused pool
// threads).
cublasHandle_t handle() {
  struct Destroy {
    void operator()(cublasContext* h) const { cublasDestroy(h); }
  };
  thread_local std::vector<std::unique_ptr<cublasContext, Destroy>> owned;  // indexed by device ordinal
  int device = 0;
  const cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) throw_runtime("gemm", "CUDA error: ", cudaGetErrorString(status));
  if (owned.size() <= static_cast<std::size_t>(device)) owned.resize(static_cast<std::size_t>(device) + 1);
  auto& slot = owned[static_cast<std::size_t>(device)];
  if (!slot) {
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h));
    slot.reset(h);
  }
  return slot.get();
}

// The calling thread's handle, bound to its current stream. cublasSetStream also resets the handle's
// workspace, so it is called only when the stream changed.
cublasHandle_t handle_on_current_stream() {
  cublasHandle_t h = handle();
  const cudaStream_t stream = current_stream();
  cudaStream_t bound = nullptr;
  check_cublas(cublasGetStream(h, &bound));
  if (bound != stream) check_cublas(cublasSetStream(h, stream));
  return h;
}

cublasOperation_t to_cublas(Transpose t) { return t == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

template <typename T>
void gemm(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  for (std::int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) throw_invalid("gemm", "dimension ", v, " is outside the 32-bit cuBLAS range");
  }
  if (m == 0 || n == 0) return;
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  cublasHandle_t h = handle_on_current_stream();
  if constexpr (std::is_same_v<T, float>) {
    const Precision precision = current_precision();
    if (precision == Precision::Float32) {
      check_cublas(cublasSgemm(h, to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b, static_cast<int>(ldb),
                               a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
    } else {  // mixed precision: float32 buffers, operands rounded to 16 bits on the tensor cores
      const cublasComputeType_t compute =
          precision == Precision::Bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
      check_cublas(cublasGemmEx(h, to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b, CUDA_R_32F,
                                static_cast<int>(ldb), a, CUDA_R_32F, static_cast<int>(lda), &beta, c, CUDA_R_32F,
                                static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
    }
  } else {
    check_cublas(cublasDgemm(h, to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b, static_cast<int>(ldb),
                             a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
  }
}

template void gemm<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace sparkgrad::gpu
