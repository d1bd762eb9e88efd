// GEMM and library information through the scipy-openblas32 build of OpenBLAS (scipy_-prefixed symbols).
#include <omp.h>

#include <climits>
#include <thread>
#include <vector>

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

// OpenBLAS runs its worker jobs on our OpenMP pool instead of its own pthreads pool: two pools that
// spin-wait on the same cores starve each other (2-thread training steps ran ~2x slower than 1-thread).
// The jobs of one level-3 call wait on each other, so they must run concurrently: when a full OpenMP
// team cannot be had (nested inside an active region, or thread limits), they get threads of their own.
void run_blas_jobs(int /*sync*/, openblas_dojob_callback dojob, int numjobs, size_t elsize, void* jobdata,
                   int dojob_data) {
  auto job = [&](int i) { dojob(i, static_cast<char*>(jobdata) + static_cast<size_t>(i) * elsize, dojob_data); };
  bool full_team = false;
  if (omp_get_active_level() < omp_get_max_active_levels()) {
#pragma omp parallel num_threads(numjobs)
    {
#pragma omp single
      full_team = omp_get_num_threads() == numjobs;
      if (full_team) job(omp_get_thread_num());
    }
  }
  if (full_team) return;
  std::vector<std::thread> extra;
  for (int i = 1; i < numjobs; ++i) extra.emplace_back(job, i);
  job(0);
  for (auto& t : extra) t.join();
}

const bool blas_uses_openmp = [] {
  scipy_openblas_set_threads_callback_function(run_blas_jobs);
  return true;
}();

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
