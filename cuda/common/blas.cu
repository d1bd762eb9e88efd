// CUDA twin of cpp/src/common/blas.cpp: row-major GEMM through cuBLAS. cuBLAS is column-major, and a
// row-major (m, n) matrix is its column-major transpose, so c = op(a) op(b) is computed as
// c^T = op(b)^T op(a)^T with the operands swapped. One handle per host thread (cuBLAS handles are not
// meant to be shared between threads), created on first use.
#include <cublas_v2.h>

#include <climits>
#include <memory>
#include <type_traits>

#include "sparkgrad/common.h"

namespace sparkgrad::gpu {

namespace {

void check_cublas(cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_runtime("gemm", "cuBLAS error ", static_cast<int>(status));
}

cublasHandle_t handle() {
  struct Destroy {
    void operator()(cublasContext* h) const { cublasDestroy(h); }
  };
  thread_local std::unique_ptr<cublasContext, Destroy> owned;
  if (!owned) {
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h));
    owned.reset(h);
  }
  return owned.get();
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
  if constexpr (std::is_same_v<T, float>) {
    check_cublas(cublasSgemm(handle(), to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b, static_cast<int>(ldb),
                             a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
  } else {
    check_cublas(cublasDgemm(handle(), to_cublas(tb), to_cublas(ta), in, im, ik, &alpha, b, static_cast<int>(ldb),
                             a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
  }
}

template void gemm<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace sparkgrad::gpu
