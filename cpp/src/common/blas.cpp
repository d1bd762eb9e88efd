// GEMM and library information through the scipy-openblas32 build of OpenBLAS (scipy_-prefixed symbols).
#include <omp.h>

#include <algorithm>
#include <climits>
#include <string>
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

namespace {

constexpr std::int64_t kSmallGemm = 1000000;  // OpenBLAS's bound (multiply-adds) for its small-matrix kernels

// Whether OpenBLAS picked a core with small-matrix GEMM kernels (SMALL_MATRIX_OPT: SkylakeX and the
// AVX-512 cores after it, reported under their own names).
bool blas_has_small_kernels() {
  static const bool has = [] {
    const std::string core = scipy_openblas_get_corename();
    for (const char* name : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
      if (core.find(name) != std::string::npos) return true;
    }
    return false;
  }();
  return has;
}

// Equal pieces of `length`, each at most `fit` long: their length, or 0 when they would be thinner
// than kMinPiece.
std::int64_t piece_length(std::int64_t length, std::int64_t fit) {
  constexpr std::int64_t kMinPiece = 48;
  if (fit < kMinPiece) return 0;
  const std::int64_t pieces = (length + fit - 1) / fit;
  return (length + pieces - 1) / pieces;
}

}  // namespace

template <typename T>
void gemm_in_small_pieces(Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                          std::int64_t ldc) {
  if (!blas_has_small_kernels() || m == 0 || n == 0 || k == 0 || m * n * k <= kSmallGemm) {
    gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (const std::int64_t piece = piece_length(n, kSmallGemm / (m * k)); piece > 0) {
    for (std::int64_t j = 0; j < n; j += piece) {  // columns j.. of op(b) and c
      const T* b_piece = tb == Transpose::No ? b + j : b + j * ldb;
      gemm<T>(ta, tb, m, std::min(piece, n - j), k, alpha, a, lda, b_piece, ldb, beta, c + j, ldc);
    }
    return;
  }
  gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
FixedOperandGemm<T>::FixedOperandGemm(Transpose trans_b, std::int64_t m, std::int64_t k, std::int64_t n,
                                      const T* b, std::int64_t ldb)
    : m_(m), k_(k), n_(n), panel_(n), chunk_(k) {
  constexpr std::int64_t kLanes = 64 / sizeof(T);  // one AVX-512 register
  if (blas_has_small_kernels() && m > 0 && k > 0 && m * k * n > kSmallGemm) {
    // even one register's width is too much with all of k: cut k into equal chunks that fit
    if (const std::int64_t fit = kSmallGemm / (m * kLanes); m * k * kLanes > kSmallGemm && fit > 0) {
      const std::int64_t chunks = (k + fit - 1) / fit;
      chunk_ = (k + chunks - 1) / chunks;
    }
    const std::int64_t widest = kSmallGemm / (m * chunk_) / kLanes * kLanes;
    if (widest > 0) {
      // an even number of panels as equal as whole registers allow, so two or four threads share them evenly
      const std::int64_t count = ((n + widest - 1) / widest + 1) / 2 * 2;
      panel_ = ((n + count - 1) / count + kLanes - 1) / kLanes * kLanes;
    } else {
      chunk_ = k;
    }
  }
  layout(trans_b, b, ldb, k, nullptr, 0);
}

template <typename T>
FixedOperandGemm<T>::FixedOperandGemm(std::int64_t m, std::int64_t k1, std::int64_t k2, std::int64_t n, const T* b1,
                                      std::int64_t ldb1, const T* b2, std::int64_t ldb2)
    : FixedOperandGemm(Transpose::No, m, k1 + k2, n, nullptr, 0) {
  layout(Transpose::No, b1, ldb1, k1, b2, ldb2);
}

// Copies op(b) into the panels: rows r < k1 of b1, the rest from b2 (untransposed only); b1 null: nothing yet.
template <typename T>
void FixedOperandGemm<T>::layout(Transpose trans_b, const T* b1, std::int64_t ldb1, std::int64_t k1, const T* b2,
                                 std::int64_t ldb2) {
  if (b1 == nullptr) return;
  const std::int64_t k = k_, n = n_;
  const T* b = b1;
  const std::int64_t ldb = ldb1;
  panels_.resize(static_cast<std::size_t>(k * n));
  constexpr std::int64_t kTile = 16;  // rows of op(b) transposed at a time, so the reads stay in cache
  for (std::int64_t j0 = 0; j0 < n; j0 += panel_) {
    const std::int64_t w = std::min(panel_, n - j0);
    T* dst = panels_.data() + j0 * k;
    if (trans_b == Transpose::No) {
      for (std::int64_t r = 0; r < k; ++r) {
        const T* row = r < k1 ? b1 + r * ldb1 : b2 + (r - k1) * ldb2;
        std::copy(row + j0, row + j0 + w, dst + r * w);
      }
      continue;
    }
    for (std::int64_t r0 = 0; r0 < k; r0 += kTile) {
      const std::int64_t r1 = std::min(r0 + kTile, k);
      for (std::int64_t j = 0; j < w; ++j) {
        for (std::int64_t r = r0; r < r1; ++r) dst[r * w + j] = b[(j0 + j) * ldb + r];
      }
    }
  }
}

template <typename T>
void FixedOperandGemm<T>::multiply(const T* a, std::int64_t lda, T beta, T* c, std::int64_t ldc) const {
  if (panel_ >= n_ && chunk_ >= k_) {  // one call, which OpenBLAS may thread itself: not inside a parallel region
    gemm<T>(Transpose::No, Transpose::No, m_, n_, k_, T(1), a, lda, panels_.data(), n_, beta, c, ldc);
    return;
  }
  const std::int64_t count = (n_ + panel_ - 1) / panel_;
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < count; ++p) {
    const std::int64_t j0 = p * panel_, w = std::min(panel_, n_ - j0);
    const T* panel = panels_.data() + j0 * k_;
    for (std::int64_t r0 = 0; r0 < k_; r0 += chunk_) {  // the chunks of k in order, each adding to c
      gemm<T>(Transpose::No, Transpose::No, m_, w, std::min(chunk_, k_ - r0), T(1), a + r0, lda, panel + r0 * w, w,
              r0 == 0 ? beta : T(1), c + j0, ldc);
    }
  }
}

template class FixedOperandGemm<float>;
template class FixedOperandGemm<double>;

template void gemm_in_small_pieces<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float,
                                          const float*, std::int64_t, const float*, std::int64_t, float, float*,
                                          std::int64_t);
template void gemm_in_small_pieces<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t,
                                           double, const double*, std::int64_t, const double*, std::int64_t,
                                           double, double*, std::int64_t);

}  // namespace sparkgrad
