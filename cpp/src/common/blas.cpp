// GEMM and library information through the scipy-openblas32 build of OpenBLAS (scipy_-prefixed symbols).
#include <omp.h>

#include <climits>

#include "cblas.h"
#include "sparkgrad/common.h"

namespace sparkgrad {

int max_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n < 1) throw_invalid("set_num_threads", "n must be >= 1, got ", n);
  omp_set_num_threads(n);
  scipy_openblas_set_num_threads(n);
}

std::string blas_info() {
  std::string config = scipy_openblas_get_config();
  return config + " (" + std::to_string(scipy_openblas_get_num_threads()) + " threads)";
}

namespace {

CBLAS_TRANSPOSE to_cblas(Transpose t) { return t == Transpose::Yes ? CblasTrans : CblasNoTrans; }

void check_gemm_dims(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                     std::int64_t ldc) {
  // scipy-openblas32 uses 32-bit BLAS integers.
  for (std::int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) throw_invalid("gemm", "dimension ", v, " is outside the 32-bit BLAS range");
  }
}

}  // namespace

template <>
void gemm<float>(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  scipy_cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), static_cast<blasint>(m),
                    static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
                    static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

template <>
void gemm<double>(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                  const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c,
                  std::int64_t ldc) {
  check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  scipy_cblas_dgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), static_cast<blasint>(m),
                    static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
                    static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace sparkgrad
