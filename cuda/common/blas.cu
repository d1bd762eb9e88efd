// CUDA twin of cpp/src/common/blas.cpp: row-major GEMM through cuBLAS. cuBLAS is column-major, and a
// row-major (m, n) matrix is its column-major transpose, so c = op(a) op(b) is computed as
// c^T = op(b)^T op(a)^T with the operands swapped. One handle per host thread and device (cuBLAS handles
// are not meant to be shared between threads, and a handle is bound to the device current when it was
// created), created on first use; each GEMM runs on the calling thread's stream (gpu::set_stream).
//
// A float32 GEMM runs in the calling thread's precision (gpu::set_precision). In bf16 / fp16 mode cuBLAS
// gets float32 buffers and a FAST_16BF / FAST_16F compute type, under which cuBLAS 13 multiplies float32
// operands on the TF32 tensor cores (H200: 1 + 2^-9 kept, 70000 not overflowing float16; 410 TFLOP/s at
// 4096^3, 341 at 1024x4096x4096, 219 at 1024x4096x1024, against 51 in float32). A product that is large
// for its operands (1/m + 1/n <= 1/2048) first rounds both operands to 16 bits in scratch memory (one pass,
// 6 bytes per element) and multiplies those at the 16-bit rate: 522 TFLOP/s at 4096^3; below that size the
// pass costs more than it saves (319 at 1024x4096x4096). Either way the operands lose at most what 16 bits
// lose, accumulation and output are float32, and float16 operands beyond 65504 become inf.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
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

template <typename H>
__device__ H round_to(float v);
template <>
__device__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half round_to<__half>(float v) { return __float2half_rn(v); }

// y: (rows, cols) packed <- x: (rows, cols) with row stride ld, each element rounded to 16 bits. Rows go
// over blockIdx.y, columns over the threads (no division per element).
template <typename H>
__global__ void round_kernel(const float* x, std::int64_t ld, H* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < cols; c += step) {
      y[r * cols + c] = round_to<H>(x[r * ld + c]);
    }
  }
}

// A (rows, cols) float32 operand with row stride ld rounded into `out`, packed (row stride cols).
template <typename H>
void round_operand(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, H* out) {
  if (rows == 0 || cols == 0) return;
  if (ld == cols) {  // contiguous: one long row
    cols *= rows;
    rows = 1;
  }
  constexpr int kBlock = 256;
  const dim3 grid(std::min(compress::cuda::grid_for(cols, kBlock), 8192u),
                  static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
  round_kernel<H><<<grid, kBlock, 0, current_stream()>>>(x, ld, out, rows, cols);
  compress::cuda::check_kernels("gemm");
}

// The float32 GEMM with both operands rounded to H (bfloat16 or float16) first; arguments as cublasSgemm's
// in gemm below (the operands swapped), float32 accumulation and output.
template <typename H>
void gemm_rounded(cublasHandle_t h, cudaDataType_t type, Transpose ta, Transpose tb, int m, int n, int k,
                  const float* alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  const float* beta, float* c, int ldc) {
  // stored a: (m, k), or (k, m) transposed; b: (k, n), or (n, k) transposed
  const std::int64_t a_rows = ta == Transpose::No ? m : k, a_cols = ta == Transpose::No ? k : m;
  const std::int64_t b_rows = tb == Transpose::No ? k : n, b_cols = tb == Transpose::No ? n : k;
  compress::cuda::DeviceBuffer<H> a16("gemm", a_rows * a_cols), b16("gemm", b_rows * b_cols);
  round_operand(a, a_rows, a_cols, lda, a16.get());
  round_operand(b, b_rows, b_cols, ldb, b16.get());
  check_cublas(cublasGemmEx(h, to_cublas(tb), to_cublas(ta), n, m, k, alpha, b16.get(), type,
                            static_cast<int>(std::max<std::int64_t>(b_cols, 1)), a16.get(), type,
                            static_cast<int>(std::max<std::int64_t>(a_cols, 1)), beta, c, CUDA_R_32F, ldc,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

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
    } else if (2048 * (m + n) <= m * n) {  // mixed precision, large for its operands: 16-bit operands
      if (precision == Precision::Bf16) {
        gemm_rounded<__nv_bfloat16>(h, CUDA_R_16BF, ta, tb, im, in, ik, &alpha, a, lda, b, ldb, &beta, c,
                                    static_cast<int>(ldc));
      } else {
        gemm_rounded<__half>(h, CUDA_R_16F, ta, tb, im, in, ik, &alpha, a, lda, b, ldb, &beta, c,
                             static_cast<int>(ldc));
      }
    } else {  // mixed precision: float32 operands on the tensor cores (TF32 or 16 bits, as cuBLAS picks)
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

template <typename T>
void gemm_strided_batched(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                          const T* a, std::int64_t lda, std::int64_t stride_a, const T* b, std::int64_t ldb,
                          std::int64_t stride_b, T beta, T* c, std::int64_t ldc, std::int64_t stride_c,
                          std::int64_t batch) {
  for (std::int64_t v : {m, n, k, lda, ldb, ldc, batch}) {
    if (v < 0 || v > INT_MAX) throw_invalid("gemm", "dimension ", v, " is outside the 32-bit cuBLAS range");
  }
  if (m == 0 || n == 0 || batch == 0) return;
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const int count = static_cast<int>(batch);
  cublasHandle_t h = handle_on_current_stream();
  // c^T = op(b)^T op(a)^T, the operands swapped as in gemm
  if constexpr (std::is_same_v<T, float>) {
    const Precision precision = current_precision();
    if (precision == Precision::Float32) {
      check_cublas(cublasSgemmStridedBatched(h, to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b,
                                             static_cast<int>(ldb), stride_b, a, static_cast<int>(lda), stride_a,
                                             &beta, c, static_cast<int>(ldc), stride_c, count));
    } else {  // mixed precision: float32 operands on the tensor cores, as gemm's small products
      const cublasComputeType_t compute =
          precision == Precision::Bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
      check_cublas(cublasGemmStridedBatchedEx(h, to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b, CUDA_R_32F,
                                              static_cast<int>(ldb), stride_b, a, CUDA_R_32F, static_cast<int>(lda),
                                              stride_a, &beta, c, CUDA_R_32F, static_cast<int>(ldc), stride_c, count,
                                              compute, CUBLAS_GEMM_DEFAULT));
    }
  } else {
    check_cublas(cublasDgemmStridedBatched(h, to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b,
                                           static_cast<int>(ldb), stride_b, a, static_cast<int>(lda), stride_a,
                                           &beta, c, static_cast<int>(ldc), stride_c, count));
  }
}

template void gemm<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

template void gemm_strided_batched<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float,
                                          const float*, std::int64_t, std::int64_t, const float*, std::int64_t,
                                          std::int64_t, float, float*, std::int64_t, std::int64_t, std::int64_t);
template void gemm_strided_batched<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, double,
                                           const double*, std::int64_t, std::int64_t, const double*, std::int64_t,
                                           std::int64_t, double, double*, std::int64_t, std::int64_t, std::int64_t);

}  // namespace sparkgrad::gpu
